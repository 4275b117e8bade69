"""Per-token NVFP4 quantizer (numerics.md "Per-token NVFP4 experts", steps P1-P5): one fp32 scale per row.

Every row r of ``x`` [M, K] (a token's hidden state, or one (token, expert) pair's FC2 input) is quantized with
its own fp32 global encode scale; every value below is binary32 and every operation one IEEE rounding
(``div_rn`` a correctly rounded division, ``RN`` the rounding of a product):

- P1 ``amax_r = max |x[r, :]|`` (exact). ``g_r = 1`` if ``amax_r == 0``, else ``min(div_rn(2688, amax_r),
  FLT_MAX)`` (2688 = 448 x 6; a subnormal amax overflows the quotient, hence the clamp).
- P2 the per-token decode scale ``d_r = div_rn(1, g_r)`` (the row scale the GEMM epilogue applies).
- P3 block decode scale, per 16-element block b: ``S_b = E4M3_satfinite(RN(bamax_b * RN(g_r * C6)))`` with
  ``C6 = RN32(1/6)`` (0x3E2AAAAB) and E4M3 round-to-nearest-even saturating at 448.
- P4 encode scale ``e_b = min(div_rn(1, RN(S_b * d_r)), FLT_MAX)`` (``S_b == 0`` gives ``FLT_MAX``: the
  block decodes to zero whatever its codes, and its non-zero elements saturate to +-6).
- P5 ``q = RN(x * e_b)``; E2M1 code of ``q``: round to nearest, ties to even (0.25 -> 0, 0.75 -> 1,
  1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturating at 6; sign bit set iff ``q < 0`` (so
  -0.0 gives code 0 and -0.1 code 8); two codes a byte, low nibble = even element.

Decoding: ``E2M1(code) * E4M3(S_b)`` is exact and fits bf16 (at most 6 significant bits, magnitudes in
[2^-10, 2688]); the value the recipe stands for is that times ``d_r``.

Sources (facts only): FlashInfer ``NVFP4QuantizePerTokenKernel`` with ``FLASHINFER_DISABLE_FP4_QUANT_FAST_MATH``
(P1-P4; its default build uses ``rcp.approx.ftz`` instead of the divisions), TransformerEngine 2.20.2
``NVFP4QuantizerRef(row_scaled_nvfp4=True)`` (P1-P5 except a zero row's scale; the CPU oracle), FlashInfer's
test reference ``ref_fp4_quant`` (P5's table). numerics.md lists where the sources disagree and why the rule
picks what it picks. Errors: ``TypeError`` for a wrong dtype, ``ValueError``
for a bad shape or a non-finite value, each naming the tensor.
"""

from __future__ import annotations

import torch

from ._checks import check_multiple, check_tensor
from .formats import (
    E2M1_MAX,
    E4M3_MAX,
    _e2m1_magnitude_code,
    _first_index,
    bits_to_f32,
    e4m3_to_float,
    float_to_e4m3,
    pack_e2m1,
)
from .quantize import dequantize_nvfp4

__all__ = [
    "PERTOKEN_BLOCK",
    "PERTOKEN_GLOBAL_NUMERATOR",
    "PERTOKEN_INV6",
    "pertoken_global_scale",
    "quantize_nvfp4_rows",
    "quantize_nvfp4_pertoken",
    "dequantize_nvfp4_rows",
]

#: Elements per block scale.
PERTOKEN_BLOCK = 16
#: 448 x 6, the numerator of the row's global encode scale (P1).
PERTOKEN_GLOBAL_NUMERATOR = E4M3_MAX * E2M1_MAX
#: ``RN32(1/6)``, bits 0x3E2AAAAB (P3).
PERTOKEN_INV6 = float(bits_to_f32(torch.tensor(0x3E2AAAAB, dtype=torch.int32)))
_FLT_MAX = float(torch.finfo(torch.float32).max)


def _check_rows(name: str, x: object) -> torch.Tensor:
    check_tensor(name, x, dtype=(torch.bfloat16, torch.float32), ndim=2)
    if x.shape[0] == 0:
        raise ValueError(f"{name}: no rows (shape {tuple(x.shape)})")
    check_multiple(name, x.shape[1], PERTOKEN_BLOCK, "row length K (last dimension)")
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        idx = _first_index(bad)
        raise ValueError(f"{name}: non-finite value {float(x[idx])} at index {idx} cannot be quantized")
    return x


def pertoken_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """P1: the global encode scale ``g`` of each row from its amax.

    Args:
        amax: fp32 [...], finite and >= 0 (a row's exact max |x|).
    Returns:
        fp32 [...]: 1 where ``amax == 0``, else ``min(div_rn(2688, amax), FLT_MAX)``.
    Raises:
        TypeError unless fp32; ValueError for a negative or non-finite amax (naming ``amax``).
    """
    check_tensor("amax", amax, dtype=torch.float32)
    bad = ~(torch.isfinite(amax) & (amax >= 0))
    if bool(bad.any()):
        idx = _first_index(bad) if bad.dim() else ()
        raise ValueError(f"amax: must be finite and >= 0, got {float(amax[idx])} at index {idx}")
    num = torch.full_like(amax, PERTOKEN_GLOBAL_NUMERATOR)
    g = torch.minimum(num / torch.where(amax == 0, torch.ones_like(amax), amax), torch.full_like(amax, _FLT_MAX))
    return torch.where(amax == 0, torch.ones_like(g), g)


def quantize_nvfp4_rows(x: torch.Tensor, g: torch.Tensor, *, name: str = "x") -> tuple[torch.Tensor, torch.Tensor]:
    """P3-P5 with given global encode scales: quantize each row of ``x`` with its ``g`` (module docstring).

    Args:
        x: bf16 or fp32 [M, K], K a positive multiple of 16, finite. Not modified.
        g: fp32 [M], finite and > 0 (P1's value, or one per-expert weight scale repeated over the rows).
        name: the name ``x`` goes by in errors.
    Returns:
        ``(codes, block_scale)``: uint8 [M, K/2] packed E2M1 (low nibble = even element) and
        float8_e4m3fn [M, K/16], on ``x``'s device.
    Raises:
        TypeError / ValueError naming ``name`` or ``g``.
    """
    _check_rows(name, x)
    m, k = x.shape
    check_tensor("g", g, dtype=torch.float32, shape=(m,))
    if g.device != x.device:
        raise ValueError(f"g: on {g.device}, but {name} is on {x.device}")
    bad = ~(torch.isfinite(g) & (g > 0))
    if bool(bad.any()):
        idx = _first_index(bad)
        raise ValueError(f"g: must be finite and > 0, got {float(g[idx])} at index {idx}")
    blocks = x.float().reshape(m, k // PERTOKEN_BLOCK, PERTOKEN_BLOCK)
    g_col = g.reshape(m, 1)
    d_col = torch.ones_like(g_col) / g_col  # P2 (a true division, one rounding)
    # P3: RN(bamax * RN(g * C6)), then E4M3 RNE saturating at 448 (inf from an overflowing product too)
    pre = blocks.abs().amax(-1) * (g_col * PERTOKEN_INV6)
    s_bytes = float_to_e4m3(pre, saturate=True)
    s = e4m3_to_float(s_bytes)
    # P4: min(div_rn(1, RN(S * d)), FLT_MAX); a zero decode scale gives 1/0 = inf -> FLT_MAX
    enc = torch.minimum(torch.ones_like(s) / (s * d_col), torch.full_like(s, _FLT_MAX))
    # P5: one rounding of the product, E2M1 RNE saturating at 6 (an infinite q saturates too)
    q = blocks * enc.unsqueeze(-1)
    codes = _e2m1_magnitude_code(q.abs()) | ((q < 0).to(torch.uint8) << 3)
    return pack_e2m1(codes.reshape(m, k)), s_bytes.view(torch.float8_e4m3fn)


def quantize_nvfp4_pertoken(x: torch.Tensor, *, name: str = "x") -> tuple[torch.Tensor, ...]:
    """The per-token quantizer, P1-P5: the golden twin of ``quantize_routed_nvfp4_input`` (unpadded rows).

    Args:
        x: bf16 or fp32 [M, K], K a positive multiple of 16, finite. Not modified. (Zero columns appended to
            reach a padded K change nothing but append code-0 bytes and 0x00 scale bytes.)
        name: the name ``x`` goes by in errors.
    Returns:
        ``(codes, block_scale, token_scale, global_scale)``: uint8 [M, K/2], float8_e4m3fn [M, K/16],
        fp32 [M] the decode scales ``d`` (P2), fp32 [M] the encode scales ``g`` (P1); on ``x``'s device.
    Raises:
        TypeError (dtype) / ValueError (rank, no rows, K, non-finite value) naming ``name``.
    """
    _check_rows(name, x)
    g = pertoken_global_scale(x.float().abs().amax(-1))
    codes, scale = quantize_nvfp4_rows(x, g, name=name)
    return codes, scale, torch.ones_like(g) / g, g


def dequantize_nvfp4_rows(codes: torch.Tensor, block_scale: torch.Tensor) -> torch.Tensor:
    """``E2M1(code) * E4M3(S_b)`` of each element, exact, as bf16 [M, K] (the GEMM operand, no row scale).

    The rows case of :func:`.quantize.dequantize_nvfp4` without a global scale (its exact product), in bf16.

    Args:
        codes: uint8 [M, K/2] packed E2M1 (low nibble = even element); block_scale: uint8 or
            float8_e4m3fn [M, K/16] with no NaN byte.
    Returns:
        torch.bfloat16 [M, K] (every such product is a bf16 value: at most 6 significant bits).
    Raises:
        TypeError / ValueError naming ``codes`` or ``block_scale``.
    """
    check_tensor("codes", codes, dtype=torch.uint8, ndim=2)
    return dequantize_nvfp4(codes, block_scale, None).to(torch.bfloat16)  # exact (representable)
