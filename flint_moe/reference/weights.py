"""Containers for expert weights in logical (checkpoint) layout, validated on construction.

Layouts follow the Flint rule "Inputs" and ModelOpt's NVFP4 checkpoints: E2M1 codes packed two a byte (low
nibble = even element, uint8 [..., K/2]); E4M3 block scales, one per 16 consecutive elements of a row
(row-major, not swizzled), given as uint8 bytes or ``torch.float8_e4m3fn`` and stored as given; one fp32
global scale (ModelOpt ``weight_scale_2``) per matrix. Rows of ``w13`` are ``[gate; up]``.

The containers never copy or modify the tensors they are given. Construction raises ``TypeError`` (not a
tensor, wrong dtype) or ``ValueError`` (rank, inconsistent sizes, sizes not multiples of 16, tensors on
different devices, E4M3 NaN scale bytes 0x7F/0xFF), with a message naming the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import check_multiple, check_same_device, check_tensor
from .formats import _first_index, e4m3_bytes, e4m3_nan_mask

__all__ = ["NVFP4Linear", "NVFP4Experts", "BF16Experts", "scale_bytes", "check_scale_bytes"]

_SCALE_DTYPES = (torch.uint8, torch.float8_e4m3fn)
BLOCK = 16  # NVFP4 block size (elements per E4M3 scale)


def scale_bytes(scale: torch.Tensor) -> torch.Tensor:
    """E4M3 scales (uint8 or float8_e4m3fn) as a uint8 view of their bytes (no copy). ``TypeError``."""
    return e4m3_bytes("scale", scale)


def check_scale_bytes(name: str, scale: torch.Tensor) -> None:
    """Raise ``ValueError`` naming ``name`` and the first (row-major) index of an E4M3 NaN byte 0x7F/0xFF.

    Flint rule "Special values": NaN scale bytes in a checkpoint are rejected.
    """
    nan = e4m3_nan_mask(e4m3_bytes(name, scale))
    if bool(nan.any()):
        idx = _first_index(nan)
        byte = int(e4m3_bytes(name, scale)[idx])
        raise ValueError(f"{name}: E4M3 NaN scale byte 0x{byte:02X} at index {idx} (NaN scales are rejected)")


def _check_codes(name: str, codes, lead: tuple[int | None, ...]) -> tuple[int, int]:
    """Check packed codes uint8 [*lead, N, K/2] (N >= 1, K a multiple of 16); return (N, K)."""
    check_tensor(name, codes, dtype=torch.uint8, shape=(*lead, None, None))
    n, k = codes.shape[-2], 2 * codes.shape[-1]
    check_multiple(name, n, 1, "rows")
    check_multiple(name, k, BLOCK, "unpacked row length (2 x last dimension)")
    return n, k


def _dim(field: str, axis: int, *, mul: int = 1, div: int = 1, doc: str | None = None) -> property:
    """A read-only size property of a weight container: ``mul * self.<field>.shape[axis] // div``."""
    return property(lambda self: mul * getattr(self, field).shape[axis] // div, doc=doc)


def _check_scale(name: str, scale, codes: torch.Tensor) -> None:
    """Check E4M3 scales [..., N, K/16] matching ``codes`` [..., N, K/2], without NaN bytes."""
    k = 2 * codes.shape[-1]
    check_tensor(name, scale, dtype=_SCALE_DTYPES, shape=(*codes.shape[:-1], k // BLOCK))
    check_scale_bytes(name, scale)


@dataclass(frozen=True)
class NVFP4Linear:
    """One NVFP4 weight matrix [N, K] (the shared expert's w13 or w2).

    Fields:
        codes: uint8 [N, K/2], packed E2M1 codes (low nibble = even element); K a multiple of 16.
        block_scale: uint8 or float8_e4m3fn [N, K/16], E4M3 scale of each 16-element block (no NaN bytes).
        global_scale: fp32 0-d tensor (ModelOpt ``weight_scale_2``; applied to the fp32 accumulator, rule 6/8).
    """

    codes: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor

    def __post_init__(self) -> None:
        _check_codes("codes", self.codes, ())
        _check_scale("block_scale", self.block_scale, self.codes)
        check_tensor("global_scale", self.global_scale, dtype=torch.float32, shape=())
        check_same_device(codes=self.codes, block_scale=self.block_scale, global_scale=self.global_scale)

    out_features = _dim("codes", 0, doc="N (rows).")
    in_features = _dim("codes", 1, mul=2, doc="K (unpacked row length).")

    def scale_bytes(self) -> torch.Tensor:
        """``block_scale`` as uint8 bytes (a view)."""
        return scale_bytes(self.block_scale)


class _StackedExperts:
    """The sizes both expert containers read from ``w13`` [E, 2I, ...] (rows [gate; up] of each expert)."""

    w13: torch.Tensor
    num_experts = _dim("w13", 0, doc="E.")
    intermediate = _dim("w13", 1, div=2, doc="I.")


@dataclass(frozen=True)
class NVFP4Experts(_StackedExperts):
    """E routed experts in NVFP4, logical layout. H and I must be positive multiples of 16.

    Fields:
        w13: uint8 [E, 2I, H/2], packed E2M1 codes of [gate; up].
        w13_scale: uint8 or float8_e4m3fn [E, 2I, H/16].
        w13_gs: fp32 [E], global scale shared by gate and up of each expert.
        w2: uint8 [E, H, I/2], packed E2M1 codes of down.
        w2_scale: uint8 or float8_e4m3fn [E, H, I/16].
        w2_gs: fp32 [E].
    """

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_gs: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_gs: torch.Tensor

    def __post_init__(self) -> None:
        two_i, h = _check_codes("w13", self.w13, (None,))
        e = self.w13.shape[0]
        check_multiple("w13", e, 1, "number of experts")
        if two_i % 2:
            raise ValueError(f"w13: dimension 1 holds [gate; up] and must be even (2I), got {two_i}")
        i = two_i // 2
        check_multiple("w13", i, BLOCK, "intermediate size I (half of dimension 1)")
        check_tensor("w2", self.w2, dtype=torch.uint8, shape=(e, h, i // 2))
        _check_scale("w13_scale", self.w13_scale, self.w13)
        _check_scale("w2_scale", self.w2_scale, self.w2)
        check_tensor("w13_gs", self.w13_gs, dtype=torch.float32, shape=(e,))
        check_tensor("w2_gs", self.w2_gs, dtype=torch.float32, shape=(e,))
        check_same_device(
            w13=self.w13, w13_scale=self.w13_scale, w13_gs=self.w13_gs,
            w2=self.w2, w2_scale=self.w2_scale, w2_gs=self.w2_gs,
        )  # fmt: skip

    hidden = _dim("w13", 2, mul=2, doc="H.")

    def w13_scale_bytes(self) -> torch.Tensor:
        """``w13_scale`` as uint8 bytes (a view)."""
        return scale_bytes(self.w13_scale)

    def w2_scale_bytes(self) -> torch.Tensor:
        """``w2_scale`` as uint8 bytes (a view)."""
        return scale_bytes(self.w2_scale)


@dataclass(frozen=True)
class BF16Experts(_StackedExperts):
    """E routed experts in bf16 (TRT-LLM BF16 rule; no scales).

    Fields:
        w13: bf16 [E, 2I, H], rows [gate; up].
        w2: bf16 [E, H, I].
    """

    w13: torch.Tensor
    w2: torch.Tensor

    def __post_init__(self) -> None:
        check_tensor("w13", self.w13, dtype=torch.bfloat16, ndim=3)
        e, two_i, h = self.w13.shape
        check_multiple("w13", e, 1, "number of experts")
        check_multiple("w13", h, 1, "hidden size H")
        if two_i <= 0 or two_i % 2:
            raise ValueError(f"w13: dimension 1 holds [gate; up] and must be even and positive, got {two_i}")
        check_tensor("w2", self.w2, dtype=torch.bfloat16, shape=(e, h, two_i // 2))
        check_same_device(w13=self.w13, w2=self.w2)

    hidden = _dim("w13", 2, doc="H.")
