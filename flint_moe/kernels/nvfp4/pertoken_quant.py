"""The per-token NVFP4 input quantizer (docs/numerics.md "Per-token NVFP4 experts", steps P1-P5) as a Triton
kernel: bf16 rows -> packed E2M1 codes, E4M3 block-scale bytes and one fp32 decode scale per row, padded.

``launch_pertoken_quant(x, padded_hidden_size, codes, block_scale, token_scale)`` fills the three outputs;
``flint_moe.ops.quantize_routed_nvfp4_input`` checks the inputs and allocates them. Golden twin:
``flint_moe.reference.pertoken.quantize_nvfp4_pertoken`` (bit for bit on the unpadded columns).

Program r of the grid ``(M,)`` owns row r (H bf16 values, read twice):

- pass 1, P1-P2: ``amax = max |x|`` over chunks of ``CHUNK`` columns (a max is exact: order-free);
  ``g = 1`` if ``amax == 0``, else ``min(div_rn(2688, amax), FLT_MAX)``; ``d = div_rn(1, g)`` (``div.rn.f32``).
- pass 2, per chunk of ``CHUNK`` columns = ``CHUNK / 16`` blocks, columns past H loaded as +0:
  P3 ``pre = RN(bamax * RN(g * C6))`` (``mul.f32``, ``C6 = RN32(1/6)``), the E4M3 byte by integer arithmetic
  on ``min(pre, 448)``'s bits (round to nearest even, saturating; no conversion instruction: the same integer
  code runs on the GPU and in the interpreter); P4 ``e = min(div_rn(1, RN(S * d)), FLT_MAX)``; P5
  ``q = RN(x * e)`` and its E2M1 code by the seven round-to-nearest-even thresholds (0.25, 0.75, 1.25, 1.75,
  2.5, 3.5, 5; a tie goes to the even code), saturating at 6, sign bit iff ``q < 0``; two codes a byte, low
  nibble = even column.

The padded columns ``[H, Hp)`` are +0, so they add code-0 bytes and 0x00 scale bytes and move no amax. No
step adds, so ``enable_fp_fusion`` forms no ``fma``: every fp32 operation is one IEEE rounding (``mul.f32``,
``div.rn.f32``, ``min.f32``). Non-finite inputs are not checked (a check would synchronise); their codes are
unspecified.

Interpreter (``TRITON_INTERPRET=1``): ``div_rn`` is numpy's IEEE fp32 division (``_rule.div_rn``'s shim), the
multiplies numpy fp32, the bf16 widening exact (``_launch`` installs it), so every output compares bitwise with
the golden model on the CPU. On the GPU ``div.rn.f32`` and ``mul.f32`` are IEEE too; that claim is the PTX
audit's until an H200 run compares the bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels._rule import div_rn
from flint_moe.kernels.audit.registry import DEFAULT_FORBID, register_audit

__all__ = ["PERTOKEN_QUANT_CONFIG", "PERTOKEN_ALIGNMENT", "launch_pertoken_quant", "audit_specs"]

#: Columns per chunk (a multiple of 16 dividing the padded width 256) and warps per program. Neither changes a
#: bit: the amax is a max, every other step is per block of 16.
PERTOKEN_QUANT_CONFIG = {"CHUNK": 256, "num_warps": 4}
#: The padded hidden size must be a multiple of this (``flint_moe.layouts.routed_nvfp4.ROUTED_ALIGNMENT``).
PERTOKEN_ALIGNMENT = 256

_GLOBAL_NUM = tl.constexpr(2688.0)  # 448 x 6
_INV6 = tl.constexpr(0.16666667163372040)  # RN32(1/6), bits 0x3E2AAAAB
_FLT_MAX = tl.constexpr(3.4028234663852886e38)
_E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def e4m3_satfinite_rn(v):
    """fp32 ``v`` >= +0 (or +inf) -> int32 E4M3 byte of ``min(v, 448)`` rounded to nearest, ties to even.

    Normal range (``v >= 2^-6``, fp32 exponent field >= 121): round the fp32 mantissa to 3 bits in integers,
    ``r = bits + 0x7FFFF + ((bits >> 20) & 1)``, byte ``(r >> 20) - (120 << 3)`` (a carry moves the exponent;
    448 is the largest result since 448 is on the grid). Subnormal range: ``round_half_even(v * 2^9)`` from the
    24-bit significand shifted right by ``s = 141 - exponent field`` (clamped to 30: everything below
    ``2^-11`` gives 0), which may round up to 8 = the byte of 2^-6."""
    bits = tl.minimum(v, _E4M3_MAX).to(tl.int32, bitcast=True)
    expf = bits >> 23
    r = bits + 0x7FFFF + ((bits >> 20) & 1)
    normal = (r >> 20) - 960
    mant = (bits & 0x7FFFFF) | tl.where(expf > 0, 0x800000, 0)
    s = tl.minimum(141 - expf, 30)
    s = tl.maximum(s, 1)
    q = mant >> s
    rem = mant - (q << s)
    half = 1 << (s - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    sub = q + up.to(tl.int32)
    return tl.where(expf >= 121, normal, sub)


@triton.jit
def e4m3_byte_to_f32(b):
    """int32 E4M3 byte 0..0x7E -> its exact fp32 value: bits ``(b << 20) * 2^120`` (exact for every byte)."""
    return (b << 20).to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120


@triton.jit
def e2m1_code_rn(q):
    """fp32 ``q`` (finite or infinite, not NaN) -> int32 E2M1 code: magnitude by round-to-nearest-even,
    saturating at 6 (thresholds 0.25 < , 0.75 <=, 1.25 <, 1.75 <=, 2.5 <, 3.5 <=, 5 <), sign bit 8 iff q < 0."""
    a = tl.abs(q)
    m = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32) + (a >= 1.75).to(tl.int32)
    m += (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32)
    return m | tl.where(q < 0.0, 8, 0)


@triton.jit
def _pertoken_quant_kernel(
    x_ptr,  # bf16 [M, H]
    codes_ptr,  # uint8 [M, HP/2] (out)
    scale_ptr,  # uint8 [M, HP/16] (out)
    token_scale_ptr,  # fp32 [M] (out)
    H: tl.constexpr,
    HP: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """One row per program: P1-P2 in pass 1, P3-P5 per chunk in pass 2 (module docstring)."""
    gdc_wait()
    gdc_launch_dependents()
    NB: tl.constexpr = CHUNK // 16
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * H
    cols = tl.arange(0, CHUNK)
    amax = tl.zeros([CHUNK], dtype=tl.float32)
    for c0 in range(0, HP, CHUNK):
        c = c0 + cols
        xv = tl.load(x_row + c, mask=c < H, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(xv))
    am = tl.max(amax, axis=0)
    zero = am == 0.0
    g = div_rn(tl.zeros_like(am) + _GLOBAL_NUM, tl.where(zero, 1.0, am))
    g = tl.where(zero, 1.0, tl.minimum(g, _FLT_MAX))
    d = div_rn(tl.zeros_like(g) + 1.0, g)
    tl.store(token_scale_ptr + row, d)
    gc6 = g * _INV6
    blk = tl.arange(0, NB)
    pair = tl.arange(0, 8)
    for c0 in range(0, HP, CHUNK):
        ce = c0 + blk[:, None] * 16 + 2 * pair[None, :]  # even columns [NB, 8]
        xe = tl.load(x_row + ce, mask=ce < H, other=0.0).to(tl.float32)
        xo = tl.load(x_row + ce + 1, mask=ce + 1 < H, other=0.0).to(tl.float32)
        bamax = tl.max(tl.maximum(tl.abs(xe), tl.abs(xo)), axis=1)  # [NB]
        sb = e4m3_satfinite_rn(bamax * gc6)
        s = e4m3_byte_to_f32(sb)
        e = tl.minimum(div_rn(tl.zeros_like(s) + 1.0, s * d), _FLT_MAX)
        lo = e2m1_code_rn(xe * e[:, None])
        hi = e2m1_code_rn(xo * e[:, None])
        byte = (lo | (hi << 4)).to(tl.uint8)
        tl.store(codes_ptr + row * (HP // 2) + (c0 // 2) + blk[:, None] * 8 + pair[None, :], byte)
        tl.store(scale_ptr + row * (HP // 16) + (c0 // 16) + blk, sb.to(tl.uint8))


def launch_pertoken_quant(
    x: torch.Tensor,
    padded_hidden_size: int,
    codes: torch.Tensor,
    block_scale: torch.Tensor,
    token_scale: torch.Tensor,
    config: dict | None = None,
) -> None:
    """Quantize x bf16 [M, H] (contiguous, M >= 1, H a multiple of 16) into ``codes`` uint8 [M, Hp/2],
    ``block_scale`` uint8 [M, Hp/16] and ``token_scale`` fp32 [M] (contiguous, x's device; Hp =
    ``padded_hidden_size``, a multiple of ``CHUNK`` >= H). Inputs are assumed valid (the op checks them); ``x``
    is not modified. ``config``: overrides of :data:`PERTOKEN_QUANT_CONFIG`."""
    cfg = {**PERTOKEN_QUANT_CONFIG, **(config or {})}
    m, h = x.shape
    _pertoken_quant_kernel[(m,)](
        x, codes, block_scale, token_scale,
        H=h, HP=padded_hidden_size, CHUNK=cfg["CHUNK"], num_warps=cfg["num_warps"], **launch_options(),
    )  # fmt: skip


#: (name, H, Hp) audited: DeepSeek-V3 / Kimi-K2 (H 7168, already a multiple of 256), gpt-oss (H 2880 padded to
#: 3072: the masked tail).
AUDIT_SHAPES = (("H7168", 7168, 7168), ("H2880", 2880, 3072))


def audit_specs() -> None:
    """Register the quantizer specialisations of AUDIT_SHAPES: ``div.rn.f32`` present (P1, P2, P4), the PDL
    wait, no approximate division or reciprocal, no fp64, no flush-to-zero multiply or fused multiply-add."""
    cfg = PERTOKEN_QUANT_CONFIG
    forbid = (*DEFAULT_FORBID, "rcp.approx", "div.approx", "mul.ftz", "fma.rn", "cvt.rn.satfinite.e4m3x2")
    for name, h, hp in AUDIT_SHAPES:
        register_audit(
            f"pertoken_quant.{name}",
            _pertoken_quant_kernel,
            {"x_ptr": "*bf16", "codes_ptr": "*u8", "scale_ptr": "*u8", "token_scale_ptr": "*fp32"},
            {"H": h, "HP": hp, "CHUNK": cfg["CHUNK"]},
            ["div.rn.f32", "griddepcontrol.wait"],
            forbid,
            options={"num_warps": cfg["num_warps"]},
        )


audit_specs()
