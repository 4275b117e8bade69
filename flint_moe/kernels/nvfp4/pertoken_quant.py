"""The per-token NVFP4 input quantizer (docs/numerics.md "Per-token NVFP4 experts", steps P1-P5) as a Triton
kernel: bf16 rows -> packed E2M1 codes, E4M3 block-scale bytes and one fp32 decode scale per row, padded.

``launch_pertoken_quant(x, padded_hidden_size, codes, block_scale, token_scale)`` fills the three outputs;
``flint_moe.ops.quantize_routed_nvfp4_input`` checks the inputs and allocates them. Golden twin:
``flint_moe.reference.pertoken.quantize_nvfp4_pertoken`` (bit for bit on the unpadded columns).

Program r of the grid ``(M,)`` owns row r (Hp columns in chunks of ``CHUNK``, a power of two: the whole
padded row in one chunk up to 8192 columns, loaded once and kept in registers; a longer row is read twice, once
per pass):

- pass 1, P1-P2: ``amax = max |x|`` over the chunks (a max is exact: order-free); ``g = 1`` if ``amax == 0``,
  else ``min(div_rn(2688, amax), FLT_MAX)``; ``d = div_rn(1, g)`` (``div.rn.f32``).
- pass 2, per chunk as a ``[CHUNK / 16, 16]`` tile of blocks (contiguous loads; columns past H loaded as +0,
  past Hp neither computed nor stored):
  P3 ``pre = RN(bamax * RN(g * C6))`` (``mul.f32``, ``C6 = RN32(1/6)``), the E4M3 byte by integer arithmetic
  on ``min(pre, 448)``'s bits (round to nearest even, saturating; no conversion instruction: the same integer
  code runs on the GPU and in the interpreter); P4 ``e = min(div_rn(1, RN(S * d)), FLT_MAX)``; P5
  ``q = RN(x * e)`` and its E2M1 code by the seven round-to-nearest-even thresholds (0.25, 0.75, 1.25, 1.75,
  2.5, 3.5, 5; a tie goes to the even code), saturating at 6, sign bit iff ``q < 0``; two codes a byte, low
  nibble = even column (the tile's columns split into even / odd by a reshape, no strided load).
- with ``values``: the row's exact NVFP4 values ``E2M1(code) * S`` as bf16 [M, H] (every such product is a
  bf16 value: at most 5 significant bits; the sign of a zero code kept), the grouped GEMMs' operand, so no
  separate decode pass reads the codes back (``pertoken_fc1.launch_decode_rows`` gives the same bits).

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
from flint_moe.kernels.nvfp4.decode_ptx import e2m1_nibble_f32

__all__ = ["PERTOKEN_QUANT_CONFIG", "PERTOKEN_ALIGNMENT", "launch_pertoken_quant", "quantize_rows", "audit_specs"]

#: Largest chunk (columns per pass-2 tile, a power of two >= 16; a row of Hp <= ``CHUNK`` columns is one chunk
#: of the next power of two) and warps per program. Neither changes a bit: the amax is a max, every other step
#: is per block of 16. Measured on the H200 (reports/gpu/nvfp4-pertoken/quantizer/quant_sweep.json, CUDA graphs,
#: chunks 512-8192 x 4 / 8 / 16 warps, bits equal across all): 4 warps fastest at every width; one chunk per
#: row from 2048 columns on within 1-6% of the best (gpt-oss-120b FC2 input, 16384 fp32 rows of 3072: 103 us
#: against 133 us with 8 warps, 105 us with three 1024-column chunks; DeepSeek-V3 tokens, 4096 rows of 7168:
#: 70 us in one 8192-column chunk against 78 us in two of 4096 with 8 warps).
PERTOKEN_QUANT_CONFIG = {"CHUNK": 8192, "num_warps": 4}
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
def _row_scales(am):
    """P1-P2 of a row amax ``am``: ``(g, d)`` (module docstring)."""
    zero = am == 0.0
    g = div_rn(tl.zeros_like(am) + _GLOBAL_NUM, tl.where(zero, 1.0, am))
    g = tl.where(zero, 1.0, tl.minimum(g, _FLT_MAX))
    return g, div_rn(tl.zeros_like(g) + 1.0, g)


@triton.jit
def _quantize_chunk(xv, c, c0, row, g, d, codes_ptr, scale_ptr, values_ptr, H: tl.constexpr, HP: tl.constexpr,
                    NB: tl.constexpr, VALUES: tl.constexpr):  # fmt: skip
    """P3-P5 of one chunk ``xv`` fp32 [NB, 16] (columns ``c`` = ``c0`` + [NB, 16] offsets) of row ``row``:
    stores its codes, scale bytes (blocks below HP) and with ``VALUES`` its exact values (columns below H)."""
    blk = tl.arange(0, NB)
    pair = tl.arange(0, 8)
    bamax = tl.max(tl.abs(xv), axis=1)  # [NB]
    sb = e4m3_satfinite_rn(bamax * (g * _INV6))
    s = e4m3_byte_to_f32(sb)
    e = tl.minimum(div_rn(tl.zeros_like(s) + 1.0, s * d), _FLT_MAX)
    code = e2m1_code_rn(xv * e[:, None])  # [NB, 16]
    lo, hi = tl.split(tl.reshape(code, [NB, 8, 2]))
    byte = (lo | (hi << 4)).to(tl.uint8)
    b_ok = c0 + blk * 16 < HP
    tl.store(codes_ptr + row * (HP // 2) + (c0 // 2) + blk[:, None] * 8 + pair[None, :], byte, mask=b_ok[:, None])
    tl.store(scale_ptr + row * (HP // 16) + (c0 // 16) + blk, sb.to(tl.uint8), mask=b_ok)
    if VALUES:
        v = e2m1_nibble_f32(code) * s[:, None]
        tl.store(values_ptr + row * H + c, v.to(tl.bfloat16), mask=c < H)


@triton.jit
def _pertoken_quant_kernel(
    x_ptr,  # bf16 or fp32 [M, H]
    codes_ptr,  # uint8 [M, HP/2] (out)
    scale_ptr,  # uint8 [M, HP/16] (out)
    token_scale_ptr,  # fp32 [M] (out)
    values_ptr,  # bf16 [M, H] (out, VALUES only)
    H: tl.constexpr,
    HP: tl.constexpr,
    CHUNK: tl.constexpr,
    VALUES: tl.constexpr,
):
    """One row per program (module docstring): a row of one chunk is loaded once and kept in registers through
    P1-P5; a longer row runs P1-P2 over its chunks (pass 1), then P3-P5 per chunk (pass 2)."""
    gdc_wait()
    gdc_launch_dependents()
    NB: tl.constexpr = CHUNK // 16
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * H
    col = tl.arange(0, NB)[:, None] * 16 + tl.arange(0, 16)[None, :]  # [NB, 16] columns of one chunk
    if HP <= CHUNK:
        xv = tl.load(x_row + col, mask=col < H, other=0.0).to(tl.float32)
        g, d = _row_scales(tl.max(tl.max(tl.abs(xv), axis=1), axis=0))
        tl.store(token_scale_ptr + row, d)
        _quantize_chunk(xv, col, 0, row, g, d, codes_ptr, scale_ptr, values_ptr, H, HP, NB, VALUES)
    else:
        amax = tl.zeros([NB, 16], dtype=tl.float32)
        for c0 in range(0, HP, CHUNK):
            c = c0 + col
            amax = tl.maximum(amax, tl.abs(tl.load(x_row + c, mask=c < H, other=0.0).to(tl.float32)))
        g, d = _row_scales(tl.max(tl.max(amax, axis=1), axis=0))
        tl.store(token_scale_ptr + row, d)
        for c0 in range(0, HP, CHUNK):
            c = c0 + col
            xv = tl.load(x_row + c, mask=c < H, other=0.0).to(tl.float32)
            _quantize_chunk(xv, c, c0, row, g, d, codes_ptr, scale_ptr, values_ptr, H, HP, NB, VALUES)


def chunk_and_warps(hp: int, config: dict | None = None) -> tuple[int, int]:
    """``(CHUNK, num_warps)`` of a row of ``hp`` padded columns under :data:`PERTOKEN_QUANT_CONFIG` overridden
    by ``config``: the next power of two >= ``hp`` capped at the config's ``CHUNK``, and the config's warps."""
    cfg = {**PERTOKEN_QUANT_CONFIG, **(config or {})}
    return min(triton.next_power_of_2(hp), int(cfg["CHUNK"])), int(cfg["num_warps"])


def launch_pertoken_quant(
    x: torch.Tensor,
    padded_hidden_size: int,
    codes: torch.Tensor,
    block_scale: torch.Tensor,
    token_scale: torch.Tensor,
    config: dict | None = None,
    values: torch.Tensor | None = None,
) -> None:
    """Quantize x bf16 or fp32 [M, H] (contiguous, M >= 1, H a multiple of 16) into ``codes`` uint8 [M, Hp/2],
    ``block_scale`` uint8 [M, Hp/16] and ``token_scale`` fp32 [M] (contiguous, x's device; Hp =
    ``padded_hidden_size``, a multiple of 16 >= H), and with ``values`` (bf16 [M, H] contiguous) the exact
    values of the quantized rows without the row scale. Inputs are assumed valid (the op checks them); ``x`` is
    not modified. ``config``: overrides of :data:`PERTOKEN_QUANT_CONFIG`."""
    m, h = x.shape
    chunk, warps = chunk_and_warps(padded_hidden_size, config)
    _pertoken_quant_kernel[(m,)](
        x, codes, block_scale, token_scale, token_scale if values is None else values,
        H=h, HP=padded_hidden_size, CHUNK=chunk, VALUES=values is not None, num_warps=warps, **launch_options(),
    )  # fmt: skip


def quantize_rows(
    x: torch.Tensor, padded_hidden_size: int, *, values: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`launch_pertoken_quant` into new tensors on ``x``'s device: ``(codes, block_scale, token_scale,
    values)`` of the shapes there (``values`` None unless asked for); no launch for M = 0."""
    m, h = x.shape
    hp, dev = padded_hidden_size, x.device
    codes = torch.empty((m, hp // 2), dtype=torch.uint8, device=dev)
    scale = torch.empty((m, hp // 16), dtype=torch.uint8, device=dev)
    token_scale = torch.empty((m,), dtype=torch.float32, device=dev)
    vals = torch.empty((m, h), dtype=torch.bfloat16, device=dev) if values else None
    if m > 0:
        launch_pertoken_quant(x, hp, codes, scale, token_scale, values=vals)
    return codes, scale, token_scale, vals


#: (name, H, Hp) audited: DeepSeek-V3 / Kimi-K2 (H 7168, already a multiple of 256), gpt-oss (H 2880 padded to
#: 3072: the masked tail).
AUDIT_SHAPES = (("H7168", 7168, 7168), ("H2880", 2880, 3072))


def audit_specs() -> None:
    """Register the quantizer specialisations of AUDIT_SHAPES (the routed input's build, and the same with the
    bf16 values written): ``div.rn.f32`` present (P1, P2, P4), the PDL wait, no approximate division or
    reciprocal, no fp64, no flush-to-zero multiply or fused multiply-add."""
    forbid = (*DEFAULT_FORBID, "rcp.approx", "div.approx", "mul.ftz", "fma.rn", "cvt.rn.satfinite.e4m3x2")
    for name, h, hp in AUDIT_SHAPES:
        chunk, warps = chunk_and_warps(hp)
        for values in (False, True):
            register_audit(
                f"pertoken_quant.{name}" + (".values" if values else ""),
                _pertoken_quant_kernel,
                {"x_ptr": "*bf16", "codes_ptr": "*u8", "scale_ptr": "*u8", "token_scale_ptr": "*fp32",
                 "values_ptr": "*bf16" if values else "*fp32"},
                {"H": h, "HP": hp, "CHUNK": chunk, "VALUES": values},
                ["div.rn.f32", "griddepcontrol.wait"],
                forbid,
                options={"num_warps": warps},
            )  # fmt: skip


audit_specs()
