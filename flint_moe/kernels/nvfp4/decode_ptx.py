"""The E2M1 decode of the NVFP4 kernels: every inline-PTX body that turns packed E2M1 codes into numbers.

sm_90 has no FP4 conversion instruction (it came with sm_100), so the kernels decode with integer and packed
16-bit float instructions. Bodies (each exact: every E2M1 value and every product they form is representable):

- ``DECODE_F16_PTX`` (the decode GEMVs: ``decode_e2m1``; ``decode_e2m1_words`` with DECODE 2): 4 code bytes ->
  8 fp32, through fp16x2 fields.
- ``DECODE_BF16_PTX`` (``decode_e2m1_words`` with DECODE 1, an option of the grouped path): the same values
  through bf16x2 fields.
- ``DEQUANT_BF16_PTX`` (the grouped gate/up, DECODE 3): one code word and its block scale -> 8 bf16 weights
  ``E2M1 * E4M3`` in element order.
- The tensor-core body of the decode GEMVs (``nvfp4.mma.mma_ptx``) is generated per launch shape and inlines
  the bf16x2 decode step of ``DECODE_BF16_PTX`` with the scale multiply.

E2M1 decode with bf16 fields (``DECODE_BF16_PTX``; ``pack=4``: one 32-bit register holds 4 code bytes = 8
nibbles n0..n7, n_i at bits 4i..4i+3). For each i in 0..3 the pair (n_i, n_{i+4}) is 16 bits apart, so one
shift places both into the two bf16 fields of a bf16x2 word:

1. ``a = w << (6 - 4i)`` (a right shift for i >= 2): the nibble's 3 magnitude bits land on bf16 bits 6..8
   (exponent bits 0-1 and the top mantissa bit), its sign bit on bit 9 (16 bits higher for the second field).
2. ``v = a & 0x03C003C0`` (magnitude + sign), ``s = a & 0x02000200`` (sign alone),
   ``p = s * 63 + v`` (``mad.lo.u32``): adding ``63 * 2^9`` to a set bit 9 carries it to bit 15 exactly
   (``2^9 + 63 * 2^9 = 2^15``), so ``p`` is the bf16x2 pair ``E2M1 * 2^-126`` with the right signs. Codes
   with exponent field 0 become bf16 subnormals (``0.5 = 2^-1`` -> ``2^-127``), which is why one multiply
   by ``2^126`` (``mul.rn.bf16x2`` with ``0x7E807E80``; exact, bf16 arithmetic keeps subnormals) restores
   every code, the subnormal 0 / 0.5 ones included.
3. The two bf16 fields become fp32 by placing them in the upper half of a word (``shl 16`` / ``and
   0xFFFF0000``): exact.

Per 8 codes: 3 shifts, 8 ``and``, 4 ``mad``, 4 ``mul.bf16x2``, 8 unpacks (27 instructions, 3.4 per code).
The fp16 body does the same with fp16 fields (see its comment) and widens with ``cvt.f32.f16``.

Interpreter path (CPU CI; Triton's interpreter cannot run inline PTX): the same values from plain Triton
integer ops: fp32 bits ``(n & 7) << 22 | (n & 8) << 28`` = ``E2M1 * 2^-126`` (exponent field 0 -> fp32
subnormal), times ``2^126`` in fp32 (exact). Both paths return identical bits (tests/kernels).
"""

from __future__ import annotations

import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET

__all__ = [
    "DECODE_BF16_PTX",
    "DECODE_F16_PTX",
    "DEQUANT_BF16_PTX",
    "decode_e2m1",
    "decode_e2m1_words",
    "e2m1_nibble_f32",
    "asm8",
    "join4",
    "decode_probe",
]

_INTERPRET = tl.constexpr(INTERPRET)

def _asm(*parts: str) -> str:
    """One inline-PTX body: ``{``, the parts (lines joined by newlines), ``}``."""
    return "\n".join(["", "{", *parts, "}", ""])


def _field_pairs(shifts: tuple[int, ...], mask: str, sign: str, carry: int) -> str:
    """The pair extraction of every body: for i = 0..3, ``a = $8 << shifts[i]`` (``shr`` by ``-shifts[i]``
    when negative), ``v = a & mask``, ``s = a & sign``, ``p_i = s * carry + v`` (``mad.lo.u32``, which carries
    each field's sign bit to bit 15 of its 16-bit half)."""
    lines = []
    for i, sh in enumerate(shifts):
        lines += [
            f"{'shl' if sh >= 0 else 'shr'}.b32 a, $8, {abs(sh)};",
            f"and.b32 v, a, {mask};",
            f"and.b32 s, a, {sign};",
            f"mad.lo.u32 p{i}, s, {carry}, v;",
        ]
    return "\n".join(lines)


def _scale_pairs(op: str, factor: str) -> str:
    """``p_i = op(p_i, factor)`` for i = 0..3 (one packed two-field multiply each)."""
    return "\n".join(f"{op} p{i}, p{i}, {factor};" for i in range(4))


#: The bf16-field pairs p_i = (n_i, n_{i+4}) times 2^-126, shared by ``DECODE_BF16_PTX`` and ``DEQUANT_BF16_PTX``.
_BF16_PAIRS = _field_pairs((6, 2, -2, -6), "0x03C003C0", "0x02000200", 63)

# bf16 fields (see module docstring). Operand $8 = 4 packed code bytes, $9 = 0x7E807E80 (2^126 twice);
# $0..$3 = even elements of bytes 0..3 (n0, n2, n4, n6), $4..$7 = odd elements (n1, n3, n5, n7).
DECODE_BF16_PTX = tl.constexpr(
    _asm(
        ".reg .b32 a, v, s, p0, p1, p2, p3;",
        _BF16_PAIRS,
        _scale_pairs("mul.rn.bf16x2", "$9"),
        *(
            f"shl.b32 ${o}, p{i}, 16;\nshl.b32 ${o + 1}, p{i + 2}, 16;\n"
            f"and.b32 ${o + 2}, p{i}, 0xFFFF0000;\nand.b32 ${o + 3}, p{i + 2}, 0xFFFF0000;"
            for o, i in ((0, 0), (4, 1))
        ),
    )
)

# fp16 fields (DECODE 2): magnitude bits on fp16 bits 9..11, sign carried from bit 12 to bit 15
# (``p = s * 7 + v``), ``E2M1 * 2^-14`` fixed by ``mul.rn.f16x2`` with 2^14 ($9 = 0x74007400), then
# ``cvt.f32.f16`` (runs on the FMA pipe, where the bf16 body's unpacks use the integer pipe). Outputs as above.
DECODE_F16_PTX = tl.constexpr(
    _asm(
        ".reg .b32 a, v, s, p0, p1, p2, p3;\n.reg .b16 h0, h1;",
        _field_pairs((9, 5, 1, -3), "0x1E001E00", "0x10001000", 7),
        _scale_pairs("mul.rn.f16x2", "$9"),
        *(
            f"mov.b32 {{h0, h1}}, p{i};\ncvt.f32.f16 ${o}, h0;\ncvt.f32.f16 ${o + 2}, h1;"
            for i, o in ((0, 0), (2, 1), (1, 4), (3, 5))
        ),
    )
)

# DECODE = 3 (GPU): one asm call per code word (8 codes) -> 8 bf16 weights ``E2M1 * scale`` in element order.
# $8 = code word, $9 = the block's E4M3 scale as a bf16x2 pair (both halves equal). The pairs p_i = (n_i,
# n_{i+4}) are built as in ``DECODE_BF16_PTX`` (shift, mask, carry the sign with ``mad``, one exact
# ``mul.rn.bf16x2`` by 2^126), multiplied by the scale (``mul.rn.bf16x2``: the product has <= 6 significant
# bits and lies in [2^-10, 2688], exact), then regrouped into (n_{2j}, n_{2j+1}) with ``prmt`` and returned
# as 16-bit halves $0..$7 = elements 0..7.
DEQUANT_BF16_PTX = tl.constexpr(
    _asm(
        ".reg .b32 a, v, s, c, p0, p1, p2, p3, q0, q1, q2, q3;\nmov.b32 c, 0x7E807E80;",
        _BF16_PAIRS,
        _scale_pairs("mul.rn.bf16x2", "c"),
        _scale_pairs("mul.rn.bf16x2", "$9"),
        "prmt.b32 q0, p0, p1, 0x5410;\nprmt.b32 q1, p2, p3, 0x5410;",
        "prmt.b32 q2, p0, p1, 0x7632;\nprmt.b32 q3, p2, p3, 0x7632;",
        "\n".join(f"mov.b32 {{${2 * j}, ${2 * j + 1}}}, q{j};" for j in range(4)),
    )
)


@triton.jit
def e2m1_nibble_f32(n):
    """Exact fp32 of E2M1 nibbles ``n`` (int32, 0..15; bit 3 the sign, so code 8 is -0) with plain integer ops: the
    interpreter path of the decodes here, and the per-token quantizer's operand values (no flush-to-zero multiply:
    the nibble's bits are an fp32 subnormal times 2^126)."""
    bits = ((n & 7) << 22) | ((n & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37  # 2^126, exact


@triton.jit
def decode_e2m1(codes):
    """uint8 code bytes (any shape) -> (lo, hi) fp32 of the same shape: E2M1 of the low / high nibble.

    GPU: ``DECODE_F16_PTX`` (``pack=4``); interpreter: plain Triton integer ops. Identical values.
    """
    if not _INTERPRET:
        lo, hi = tl.inline_asm_elementwise(
            DECODE_F16_PTX,
            "=f,=f,=f,=f,=f,=f,=f,=f,r,r,r,r,r",
            [codes, tl.full(codes.shape, 0x74007400, tl.int32)],
            dtype=(tl.float32, tl.float32),
            is_pure=True,
            pack=4,
        )
        return lo, hi
    else:
        c = codes.to(tl.int32)
        return e2m1_nibble_f32(c & 15), e2m1_nibble_f32(c >> 4)


@triton.jit
def asm8(word, operand, ASM: tl.constexpr, CONSTRAINTS: tl.constexpr, DT: tl.constexpr):
    """The 8 outputs, each of dtype ``DT``, of the pure inline-PTX body ``ASM`` ($0..$7 by ``CONSTRAINTS``) on
    the 32-bit ``word`` ($8) and ``operand`` ($9), elementwise (``pack=1``). GPU only."""
    return tl.inline_asm_elementwise(
        ASM, CONSTRAINTS, [word, operand], dtype=(DT.value,) * 8, is_pure=True, pack=1
    )


@triton.jit
def decode_e2m1_words(words, DECODE: tl.constexpr):
    """int32 code words (any shape; word = 4 code bytes, byte j at bits 8j..8j+7) -> 8 fp32 tensors of the
    same shape: ``(lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3)``, E2M1 of the low / high nibble of byte j.

    ``DECODE`` (GPU; the interpreter always takes the plain path): 2 = ``DECODE_F16_PTX``, 1 =
    ``DECODE_BF16_PTX``, 0 = plain Triton integer ops; ``pack=1``: the asm takes the 32-bit word as loaded,
    so no byte is unpacked into its own register and re-packed (``prmt``) before the decode. Identical values.
    """
    if DECODE == 2 and not _INTERPRET:
        f16_scale = tl.full(words.shape, 0x74007400, tl.int32)
        return asm8(words, f16_scale, DECODE_F16_PTX, "=f,=f,=f,=f,=f,=f,=f,=f,r,r", tl.float32)
    elif DECODE == 1 and not _INTERPRET:
        bf16_scale = tl.full(words.shape, 0x7E807E80, tl.int32)
        bits = asm8(words, bf16_scale, DECODE_BF16_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", tl.int32)
        o0, o1, o2, o3, o4, o5, o6, o7 = bits
        return (
            o0.to(tl.float32, bitcast=True),
            o1.to(tl.float32, bitcast=True),
            o2.to(tl.float32, bitcast=True),
            o3.to(tl.float32, bitcast=True),
            o4.to(tl.float32, bitcast=True),
            o5.to(tl.float32, bitcast=True),
            o6.to(tl.float32, bitcast=True),
            o7.to(tl.float32, bitcast=True),
        )
    else:
        return (
            e2m1_nibble_f32(words & 15),
            e2m1_nibble_f32((words >> 8) & 15),
            e2m1_nibble_f32((words >> 16) & 15),
            e2m1_nibble_f32((words >> 24) & 15),
            e2m1_nibble_f32((words >> 4) & 15),
            e2m1_nibble_f32((words >> 12) & 15),
            e2m1_nibble_f32((words >> 20) & 15),
            e2m1_nibble_f32((words >> 28) & 15),
        )


@triton.jit
def join4(a, b, c, d):
    """[..., 4] with [..., j] = (a, b, c, d)[j] (tl.join appends the new axis last, hence the pairing)."""
    return tl.join(tl.join(a, c), tl.join(b, d))


@triton.jit
def _decode_probe_kernel(codes_ptr, lo_ptr, hi_ptr, n, BLOCK: tl.constexpr):
    """lo[i], hi[i] = E2M1 of the low / high nibble of codes[i] through ``decode_e2m1`` (tests)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    c = tl.load(codes_ptr + offs, mask=m, other=0)
    lo, hi = decode_e2m1(c)
    tl.store(lo_ptr + offs, lo, mask=m)
    tl.store(hi_ptr + offs, hi, mask=m)


def decode_probe(codes):
    """(lo, hi) fp32 tensors: ``decode_e2m1`` applied to uint8 ``codes`` (1-D, length a multiple of 4)."""
    import torch

    lo = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
    hi = torch.empty_like(lo)
    n = codes.numel()
    _decode_probe_kernel[(triton.cdiv(n, 256),)](codes, lo, hi, n, BLOCK=256, num_warps=1)
    return lo, hi
