"""NVFP4 weight quantizer: NVIDIA ModelOpt's recipe, bit-identical to ``nvidia-modelopt`` 0.47.0 on CPU.

Source: ``modelopt.torch.quantization.qtensor.NVFP4QTensor.quantize(w, 16)`` (with
``get_weights_scaling_factor_2``, ``get_weights_scaling_factor``, ``_cast_per_block_scale_to_fp8`` and
``_cast_fp4``). Per trailing matrix W [N, K] and 16-element block b of a row, every step one fp32 rounding:

1. ``gs = RN(amax|W| / 2688)`` (2688 = 6 x 448; amax exact), unless a global scale is given.
2. ``s_b = RN(amax|b| / RN(6 * gs))``; ``s_b == 0`` (all-zero block) -> 1.0; clamp to [2^-9, 448];
   E4M3 byte = round-to-nearest-even of ``s_b``.
3. ``q = RN(w / RN(E4M3(s_b) * gs))`` per element (bf16 inputs widened exactly to fp32 first).
4. code = E2M1 of |q| (round to nearest, ties to even, saturating at 6; inf and NaN -> 6), sign code bit
   set iff ``q < 0`` (so -0.0 gives code 0 but -0.1 gives code 8, exactly as ModelOpt); packed two a byte,
   low nibble = even element.

The only deviation: an all-zero matrix, where ModelOpt returns ``gs = 0`` and NaN scale bytes (which the
loaders reject), gets ``gs = 1.0``, block scales 1.0 (0x38) and codes 0. Divisions are true IEEE divisions
on every device (ModelOpt on CUDA divides by the constant 2688 through a reciprocal; on CPU it divides).
"""

from __future__ import annotations

import torch

from ._checks import check_multiple, check_same_device, check_tensor
from .formats import (
    E2M1_MAX,
    E4M3_MAX,
    E4M3_MIN_SUBNORMAL,
    _e2m1_magnitude_code,
    _first_index,
    e2m1_to_float,
    e4m3_bytes,
    e4m3_to_float,
    float_to_e4m3,
    pack_e2m1,
    unpack_e2m1,
)
from .weights import BLOCK, BF16Experts, NVFP4Experts, check_scale_bytes

__all__ = ["quantize_nvfp4", "dequantize_nvfp4", "quantize_experts", "global_scale_of"]


def _check_weight(name: str, w: object) -> torch.Tensor:
    check_tensor(name, w, dtype=(torch.bfloat16, torch.float32))
    if w.dim() < 2:
        raise ValueError(f"{name}: expected [..., N, K] (at least 2 dimensions), got shape {tuple(w.shape)}")
    if any(d == 0 for d in w.shape):
        raise ValueError(f"{name}: empty dimension in shape {tuple(w.shape)}")
    check_multiple(name, w.shape[-1], BLOCK, "row length K (last dimension)")
    bad = ~torch.isfinite(w)
    if bool(bad.any()):
        idx = _first_index(bad)
        raise ValueError(f"{name}: non-finite value {float(w[idx])} at index {idx} cannot be quantized")
    return w


def global_scale_of(w: torch.Tensor, *, name: str = "w") -> torch.Tensor:
    """ModelOpt's per-tensor scale of each trailing matrix: ``RN(amax|W| / 2688)`` (``weight_scale_2``).

    Args:
        w: bf16 or fp32 [..., N, K], K a multiple of 16, finite.
    Returns:
        fp32 [...] on ``w``'s device. An all-zero matrix gets 1.0 (ModelOpt: 0, which yields NaN scales).
    Raises:
        TypeError / ValueError naming ``name`` for a bad tensor, or when a non-zero matrix is so small that
        its scale underflows to 0 (amax < about 2^-138; ModelOpt then yields NaN scales).
    Source: ``NVFP4QTensor.get_weights_scaling_factor_2``.
    """
    _check_weight(name, w)
    return _global_scale(name, w)


def _global_scale(name: str, w: torch.Tensor) -> torch.Tensor:
    amax = w.abs().flatten(-2).amax(-1).float()  # exact in any order
    gs = amax / torch.full_like(amax, E2M1_MAX * E4M3_MAX)  # a true division, also on CUDA
    underflow = (gs == 0) & (amax != 0)
    if bool(underflow.any()):
        idx = _first_index(underflow) if underflow.dim() else ()
        raise ValueError(
            f"{name}: matrix {idx} has amax {float(amax[idx])}, too small for an fp32 global scale "
            f"(amax / 2688 underflows to 0)"
        )
    return torch.where(amax == 0, torch.ones_like(gs), gs)


def _check_global_scale(
    gs: object, lead: tuple[int, ...], device: torch.device, other: str = "w"
) -> torch.Tensor:
    if isinstance(gs, float):
        gs = torch.tensor(gs, dtype=torch.float32, device=device)
    check_tensor("global_scale", gs, dtype=torch.float32)
    if tuple(gs.shape) not in ((), lead):
        raise ValueError(f"global_scale: shape must be () or {lead}, got {tuple(gs.shape)}")
    if gs.device != device:
        raise ValueError(f"global_scale: on {gs.device}, but {other} is on {device}")
    bad = ~(torch.isfinite(gs) & (gs > 0))
    if bool(bad.any()):
        idx = _first_index(bad) if bad.dim() else ()
        raise ValueError(f"global_scale: must be finite and > 0, got {float(gs[idx])} at index {idx}")
    return gs.expand(lead).clone()


def _quantize(name: str, w: torch.Tensor, global_scale: object) -> tuple[torch.Tensor, ...]:
    _check_weight(name, w)
    *lead, n, k = w.shape
    lead = tuple(lead)
    if global_scale is None:
        gs = _global_scale(name, w)
    else:
        gs = _check_global_scale(global_scale, lead, w.device)
    blocks = w.float().reshape(*lead, n, k // BLOCK, BLOCK)
    gs_m = gs.reshape(*lead, 1, 1)  # broadcast over [N, K/16]
    # step 2: block scale, rounded to E4M3 (the clamp keeps it finite and >= the smallest subnormal)
    per_block = blocks.abs().amax(-1) / (gs_m * E2M1_MAX)
    per_block = torch.where(per_block == 0, torch.ones_like(per_block), per_block)
    scale = float_to_e4m3(per_block.clamp(E4M3_MIN_SUBNORMAL, E4M3_MAX))
    # step 3: divide by the decoded block scale times the global scale (rounded once, then divided)
    q = blocks / (e4m3_to_float(scale) * gs_m).unsqueeze(-1)
    # step 4: E2M1 code; NaN (0/0 where scale x gs underflowed to 0) -> 6 like ModelOpt's searchsorted
    mag = _e2m1_magnitude_code(q.abs())
    mag = torch.where(torch.isnan(q), torch.full_like(mag, 7), mag)
    codes = mag | ((q < 0).to(torch.uint8) << 3)
    return pack_e2m1(codes.reshape(*lead, n, k)), scale.view(torch.float8_e4m3fn), gs


def quantize_nvfp4(
    w: torch.Tensor, *, global_scale: torch.Tensor | float | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize each trailing matrix of ``w`` to NVFP4 with ModelOpt's recipe (module docstring).

    Args:
        w: bf16 or fp32 [..., N, K], K a positive multiple of 16, all values finite. Not modified.
        global_scale: None (ModelOpt's ``amax / 2688`` per trailing matrix, see :func:`global_scale_of`), or
            the fp32 scale(s) to use: a Python float or an fp32 tensor of shape () or [...], finite, > 0.
    Returns:
        ``(codes, block_scale, global_scale)``: uint8 [..., N, K/2] packed E2M1 codes (low nibble = even
        element), float8_e4m3fn [..., N, K/16], fp32 [...] -- all on ``w``'s device, equal bit for bit to
        ``NVFP4QTensor.quantize(W, 16)``'s ``(_quantized_data, block_scale, scale_2)`` for each matrix W
        (with ``weights_scaling_factor_2`` = the given scale, if any), except for all-zero matrices.
    Raises:
        TypeError (dtype) or ValueError (rank, empty, K not a multiple of 16, non-finite value, bad
        ``global_scale``) naming ``w`` or ``global_scale``.
    """
    return _quantize("w", w, global_scale)


def dequantize_nvfp4(
    codes: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor | None
) -> torch.Tensor:
    """Decode NVFP4 weights to fp32 [..., N, K].

    ``E2M1(code) * E4M3(scale)`` is exact (Flint rule step 5). With ``global_scale`` the result is that
    product times the global scale, rounded once (``RN(E2M1 * E4M3 * gs)``); ModelOpt's ``dequantize``
    instead rounds ``E4M3 * gs`` first, which can differ by one ulp.

    Args:
        codes: uint8 [..., N, K/2] packed E2M1 codes (low nibble = even element).
        block_scale: uint8 or float8_e4m3fn [..., N, K/16], no NaN bytes (0x7F/0xFF).
        global_scale: None (return the exact W of rule step 5) or fp32 of shape () or [...].
    Raises:
        TypeError / ValueError naming ``codes``, ``block_scale`` or ``global_scale``.
    """
    check_tensor("codes", codes, dtype=torch.uint8)
    if codes.dim() < 2:
        raise ValueError(f"codes: expected [..., N, K/2], got shape {tuple(codes.shape)}")
    *lead, n, half_k = codes.shape
    k = 2 * half_k
    check_multiple("codes", k, BLOCK, "unpacked row length (2 x last dimension)")
    check_tensor("block_scale", block_scale, dtype=(torch.uint8, torch.float8_e4m3fn),
                 shape=(*lead, n, k // BLOCK))
    check_same_device(codes=codes, block_scale=block_scale)
    check_scale_bytes("block_scale", block_scale)
    vals = e2m1_to_float(unpack_e2m1(codes)).reshape(*lead, n, k // BLOCK, BLOCK)
    w = (vals * e4m3_to_float(e4m3_bytes("block_scale", block_scale)).unsqueeze(-1))  # exact
    if global_scale is not None:
        gs = _check_global_scale(global_scale, tuple(lead), codes.device, "codes")
        # the exact product has at most 4 + 4 + 24 significant bits: fp64 holds it, one rounding to fp32
        w = (w.double() * gs.double().reshape(*lead, 1, 1, 1)).float()
    return w.reshape(*lead, n, k)


def quantize_experts(w13: torch.Tensor, w2: torch.Tensor) -> NVFP4Experts:
    """Quantize bf16 routed experts to :class:`NVFP4Experts`, ModelOpt's recipe, vectorised over experts.

    Gate and up of one expert share one global scale, ``RN(amax|[gate; up]| / 2688)`` of the whole
    [2I, H] matrix (what ModelOpt gives when it quantizes the fused matrix, and what checkpoints carry when
    gate and up ``weight_scale_2`` agree).

    Args:
        w13: bf16 [E, 2I, H] rows [gate; up]; w2: bf16 [E, H, I]; H and I positive multiples of 16.
    Raises:
        TypeError / ValueError naming ``w13`` or ``w2`` (see :class:`BF16Experts` and :func:`quantize_nvfp4`).
    """
    BF16Experts(w13, w2)  # dtype / shape / device validation
    check_multiple("w13", w13.shape[2], BLOCK, "hidden size H")
    check_multiple("w2", w2.shape[2], BLOCK, "intermediate size I")
    c13, s13, g13 = _quantize("w13", w13, None)
    c2, s2, g2 = _quantize("w2", w2, None)
    return NVFP4Experts(w13=c13, w13_scale=s13, w13_gs=g13, w2=c2, w2_scale=s2, w2_gs=g2)
