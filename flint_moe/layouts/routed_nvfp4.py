"""Per-token NVFP4 routed experts -> the CuTe-DSL block-scaled grouped-GEMM layout of the Megatron seed.

Input: quantized expert stacks in the logical MCore layout (numerics.md "Per-token NVFP4 experts", P6): FC1
codes uint8 [E, N1, H/2] with N1 = 2I rows [gate; up] (SwiGLU) or I rows (squared ReLU), FC1 E4M3 block scales
[E, N1, H/16], FC2 codes [E, H, I/2] and scales [E, H, I/16], per-expert fp32 alphas [E] (the decode scales
``div_rn(1, g_e)``). Output (:class:`RoutedNVFP4Weights`):

- H and I are padded to ``Hp = roundup(H, 256)`` and ``Ip = roundup(I, 256)`` with zero codes and zero
  (0x00) scale bytes; a gated FC1 pads each half on its own.
- ``fc1_data`` uint8 [E, N1p, Hp/2], N1p = 2Ip (gated) or Ip: gated rows are [up; gate] interleaved by 64
  rows (physical row r: block b = r // 128, w = r % 128; w < 64 holds up row 64b + w, else gate row
  64b + w - 64; rows past I in either half are padding), non-gated rows are in order.
- ``fc1_scale_swizzled`` float8_e4m3fn [E, N1p, Hp/16]: the same rows, 128x4 swizzle (``swizzle``);
  ``fc1_scale`` its 6-D MMA view (same storage).
- ``fc2_data`` uint8 [E, Hp, Ip/2], ``fc2_scale_swizzled`` [E, Hp, Ip/16] (rows past H and columns past I are
  padding), ``fc2_scale`` its MMA view. ``fc1_alpha``, ``fc2_alpha`` fp32 [E].

``out=`` refreshes an existing :class:`RoutedNVFP4Weights` in place (every tensor keeps its address, so
CUDA graphs captured on it stay valid); its sizes and ``gated`` must match. Decoder (independent, in the
golden model): ``flint_moe.reference.layouts.decode_routed_nvfp4``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint_moe.layouts._core import check_no_nan_e4m3, gather_rows, round_up
from flint_moe.layouts.padding import pad_columns
from flint_moe.layouts.rows import w13_rows_cutedsl
from flint_moe.layouts.swizzle import mma_view, swizzle_block_scales
from flint_moe.reference._checks import check_same_device, check_tensor

__all__ = ["ROUTED_ALIGNMENT", "GLU_INTERLEAVE_ROWS", "RoutedNVFP4Weights", "to_routed_nvfp4"]

#: Hidden and intermediate sizes are padded to a multiple of this.
ROUTED_ALIGNMENT = 256
#: Rows per up / gate group of the gated FC1 interleave.
GLU_INTERLEAVE_ROWS = 64

_SCALE_DTYPES = (torch.uint8, torch.float8_e4m3fn)


@dataclass(frozen=True)
class RoutedNVFP4Weights:
    """FC1 / FC2 stacks in the CuTe-DSL block-scaled grouped-GEMM layout (module docstring for every field)."""

    hidden_size: int
    intermediate_size: int
    padded_hidden_size: int
    padded_intermediate_size: int
    gated: bool
    fc1_data: torch.Tensor
    fc1_scale_swizzled: torch.Tensor
    fc1_scale: torch.Tensor
    fc1_alpha: torch.Tensor
    fc2_data: torch.Tensor
    fc2_scale_swizzled: torch.Tensor
    fc2_scale: torch.Tensor
    fc2_alpha: torch.Tensor

    @property
    def num_local_experts(self) -> int:
        """Number of experts in each stack."""
        return self.fc1_data.shape[0]


def _fc1_rows(inter: int, ip: int, gated: bool, device: torch.device) -> torch.Tensor:
    if gated:
        return w13_rows_cutedsl(inter, ip, GLU_INTERLEAVE_ROWS, device)
    r = torch.arange(ip, dtype=torch.long, device=device)
    return torch.where(r < inter, r, torch.full_like(r, -1))


def _check_inputs(fc1, fc1_scale, fc1_alpha, fc2, fc2_scale, fc2_alpha, gated) -> tuple[int, int, int]:
    if not isinstance(gated, bool):
        raise TypeError(f"gated: expected bool, got {type(gated).__name__}")
    check_tensor("fc2", fc2, dtype=torch.uint8, ndim=3)
    e, h, half_i = fc2.shape
    inter = 2 * half_i
    if e == 0 or h == 0 or inter == 0:
        raise ValueError(f"fc2: empty dimension in shape {tuple(fc2.shape)}")
    if h % 16 or inter % 16:
        raise ValueError(f"fc2: hidden size {h} and intermediate size {inter} must be multiples of 16")
    n1 = 2 * inter if gated else inter
    check_tensor("fc1", fc1, dtype=torch.uint8, shape=(e, n1, h // 2))
    check_tensor("fc1_scale", fc1_scale, dtype=_SCALE_DTYPES, shape=(e, n1, h // 16))
    check_tensor("fc2_scale", fc2_scale, dtype=_SCALE_DTYPES, shape=(e, h, inter // 16))
    for name, a in (("fc1_alpha", fc1_alpha), ("fc2_alpha", fc2_alpha)):
        check_tensor(name, a, dtype=torch.float32, shape=(e,))
        bad = ~(torch.isfinite(a) & (a > 0))
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(f"{name}: must be finite and > 0, got {float(a[i])} for expert {i}")
    check_same_device(
        fc1=fc1, fc1_scale=fc1_scale, fc1_alpha=fc1_alpha, fc2=fc2, fc2_scale=fc2_scale, fc2_alpha=fc2_alpha
    )
    check_no_nan_e4m3("fc1_scale", fc1_scale)
    check_no_nan_e4m3("fc2_scale", fc2_scale)
    return e, h, inter


def _check_out(out: object, new: RoutedNVFP4Weights) -> RoutedNVFP4Weights:
    if not isinstance(out, RoutedNVFP4Weights):
        raise TypeError(f"out: expected RoutedNVFP4Weights, got {type(out).__name__}")
    meta = ("hidden_size", "intermediate_size", "padded_hidden_size", "padded_intermediate_size", "gated")
    for name in meta:
        if getattr(out, name) != getattr(new, name):
            raise ValueError(f"out: {name} is {getattr(out, name)}, the new weights have {getattr(new, name)}")
    for name in ("fc1_data", "fc1_scale_swizzled", "fc1_alpha", "fc2_data", "fc2_scale_swizzled", "fc2_alpha"):
        a, b = getattr(out, name), getattr(new, name)
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            raise ValueError(
                f"out: {name} is {a.dtype} {tuple(a.shape)} on {a.device}, the new weights need "
                f"{b.dtype} {tuple(b.shape)} on {b.device}"
            )
    return out


def to_routed_nvfp4(
    fc1: torch.Tensor,
    fc1_scale: torch.Tensor,
    fc1_alpha: torch.Tensor,
    fc2: torch.Tensor,
    fc2_scale: torch.Tensor,
    fc2_alpha: torch.Tensor,
    *,
    gated: bool,
    out: RoutedNVFP4Weights | None = None,
) -> RoutedNVFP4Weights:
    """Lay out quantized per-token NVFP4 experts for the grouped GEMMs (module docstring).

    Args:
        fc1: uint8 [E, N1, H/2] (N1 = 2I rows [gate; up] when ``gated``, else I); fc1_scale: uint8 or
            float8_e4m3fn [E, N1, H/16] without NaN bytes; fc1_alpha: fp32 [E], finite, > 0; fc2: uint8
            [E, H, I/2]; fc2_scale: [E, H, I/16]; fc2_alpha: fp32 [E]. H, I multiples of 16. Not modified.
        gated: SwiGLU ([gate; up] FC1) or squared ReLU.
        out: None, or weights of the same sizes to refresh in place (returned, addresses kept).
    Returns:
        :class:`RoutedNVFP4Weights` on the inputs' device (scales as float8_e4m3fn).
    Raises:
        TypeError / ValueError naming the tensor (dtype, shape, NaN scale byte, bad alpha, device) or ``out``.
    """
    e, h, inter = _check_inputs(fc1, fc1_scale, fc1_alpha, fc2, fc2_scale, fc2_alpha, gated)
    hp, ip = round_up(h, ROUTED_ALIGNMENT), round_up(inter, ROUTED_ALIGNMENT)
    dev = fc1.device
    rows1 = _fc1_rows(inter, ip, gated, dev)
    rows2 = torch.arange(hp, dtype=torch.long, device=dev)
    rows2 = torch.where(rows2 < h, rows2, torch.full_like(rows2, -1))
    fc1_data = pad_columns(gather_rows(fc1, rows1), hp // 2)
    fc2_data = gather_rows(pad_columns(fc2, ip // 2), rows2)
    s1 = swizzle_block_scales(fc1_scale.view(torch.uint8), rows=rows1, cols=hp // 16, name="fc1_scale")
    s2 = swizzle_block_scales(fc2_scale.view(torch.uint8), rows=rows2, cols=ip // 16, name="fc2_scale")
    s1, s2 = s1.view(torch.float8_e4m3fn), s2.view(torch.float8_e4m3fn)
    new = RoutedNVFP4Weights(
        h, inter, hp, ip, gated, fc1_data, s1, mma_view(s1, name="fc1_scale_swizzled"), fc1_alpha.clone(),
        fc2_data, s2, mma_view(s2, name="fc2_scale_swizzled"), fc2_alpha.clone(),
    )  # fmt: skip
    if out is None:
        return new
    _check_out(out, new)
    for name in ("fc1_data", "fc1_scale_swizzled", "fc1_alpha", "fc2_data", "fc2_scale_swizzled", "fc2_alpha"):
        getattr(out, name).copy_(getattr(new, name))
    return out
