"""Device helpers shared by the NVFP4 decode GEMVs (``nvfp4_gate_up``, ``nvfp4_down``).

E2M1 decode on sm_90 (no FP4 conversion instruction before sm_100)
-------------------------------------------------------------------
``decode_e2m1(codes)`` turns a tile of packed code bytes (uint8, two E2M1 codes per byte, low nibble = even
element) into two fp32 tiles of the same shape: ``lo`` (the even elements) and ``hi`` (the odd ones). The
values are exact (rule step 5 without the block scale: 0, +-0.5, +-1, +-1.5, +-2, +-3, +-4, +-6).

GPU path (inline PTX, ``pack=4``: one 32-bit register holds 4 code bytes = 8 nibbles n0..n7, n_i at bits
4i..4i+3). For each i in 0..3 the pair (n_i, n_{i+4}) is 16 bits apart, so one shift places both into the
two bf16 fields of a bf16x2 word:

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

Interpreter path (CPU CI; Triton's interpreter cannot run inline PTX): the same values from plain Triton
integer ops: fp32 bits ``(n & 7) << 22 | (n & 8) << 28`` = ``E2M1 * 2^-126`` (exponent field 0 -> fp32
subnormal), times ``2^126`` in fp32 (exact). Both paths return identical bits (tests/kernels).

Block dot product (the grouping of rule "Accumulation": sum inside a 16-element block, then the scale)
----------------------------------------------------------------------------------------------------------
``block_partials(codes, xw)``: ``codes`` uint8 [R, B] (B code bytes = 2B elements of each of R rows),
``xw`` int32 [B] (the activation as bf16 pairs: word i holds elements 2i (low half) and 2i+1 (high half)).
Returns fp32 [R, B / 8]: for each 16-element block, ``sum_{q=0..15} E2M1(code_q) * x_q`` summed sequentially
in element order (``s = c_0 x_0; s = s + c_q x_q`` for q = 1..15; every product of an E2M1 value and a bf16
value is exact in fp32, so it does not matter whether the compiler fuses a product into the add). The caller
multiplies each block partial by its E4M3 scale with one ``fma`` into its accumulator.

Tensor-core path (``MMA`` option of both kernels; ``mma_ptx``, ``mma_rows``, ``mma_gemv``)
---------------------------------------------------------------------------------------
A program's rows form a [R, 4] tile whose default Triton layout puts 8 x 4 threads in a warp (lane = 4 g + c):
thread (g, c) holds chunk c (16 consecutive code bytes of each 64-byte K step) of RT rows. One inline-PTX
call per K step (or S steps) loads the chunks, dequantises every weight exactly to bf16 as
``E2M1 * E4M3 * 2^-8`` (``mad.lo`` sign carry, two ``mul.rn.bf16x2``; rule step 5 up to a power of two) and
feeds ``mma.sync.m16n8k16`` (bf16, fp32 accumulate): A = the weights of two of the thread's rows (MMA rows g,
g + 8), k-slots of the 4 chunk threads = 16 elements of the 4 chunks, B = the activations re-paired to match
(every column equal), C = D = the running row sum. So a row's accumulator is the chain of MMAs over its K
steps in increasing order, 8 per 16-byte chunk, each adding 16 exact products in the hardware's internal order
with truncating alignment; the result times 2^8 is g_acc / y_acc. No block regrouping: bound
``FP32_TRUNCATE`` (u = 2^-23, d = K), the rule's tensor-core model. ``SK`` > 1 splits K into parts summed by
different warps, added in a fixed order (``mma_sum_parts``). Under the interpreter ``_mma_shim`` does the same
loads and sums the exact products in fp32 (round to nearest). Not yet tested on this path: inf / NaN
activations (the tensor cores' handling of special values is not checked against the golden model).
"""

from __future__ import annotations

import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET, gdc_launch_dependents, gdc_wait

__all__ = [
    "decode_e2m1",
    "decode_e2m1_words",
    "block_partials_words",
    "load_codes",
    "code_partials",
    "block_partials",
    "swizzled_scale_offsets",
    "e4m3_to_f32",
    "load_words",
    "load_bytes",
    "mma_ptx",
    "mma_rows",
    "mma_row_sums",
    "MMA_SHAPES",
    "opaque_zero",
    "mma_tile_rows",
    "mma_gemv",
    "mma_sum_parts",
    "mma_part_bytes",
    "l2_prefetch",
    "l2_prefetch_ptx",
]

_INTERPRET = tl.constexpr(INTERPRET)

# PTX of decode_e2m1 (see module docstring). Operand $8 = 4 packed code bytes; $0..$3 = even elements of
# bytes 0..3 (n0, n2, n4, n6), $4..$7 = odd elements (n1, n3, n5, n7).
_DECODE_PTX = """
{
.reg .b32 a, v, s, p0, p1, p2, p3;
shl.b32 a, $8, 6;
and.b32 v, a, 0x03C003C0;
and.b32 s, a, 0x02000200;
mad.lo.u32 p0, s, 63, v;
shl.b32 a, $8, 2;
and.b32 v, a, 0x03C003C0;
and.b32 s, a, 0x02000200;
mad.lo.u32 p1, s, 63, v;
shr.b32 a, $8, 2;
and.b32 v, a, 0x03C003C0;
and.b32 s, a, 0x02000200;
mad.lo.u32 p2, s, 63, v;
shr.b32 a, $8, 6;
and.b32 v, a, 0x03C003C0;
and.b32 s, a, 0x02000200;
mad.lo.u32 p3, s, 63, v;
mul.rn.bf16x2 p0, p0, $9;
mul.rn.bf16x2 p1, p1, $9;
mul.rn.bf16x2 p2, p2, $9;
mul.rn.bf16x2 p3, p3, $9;
shl.b32 $0, p0, 16;
shl.b32 $1, p2, 16;
and.b32 $2, p0, 0xFFFF0000;
and.b32 $3, p2, 0xFFFF0000;
shl.b32 $4, p1, 16;
shl.b32 $5, p3, 16;
and.b32 $6, p1, 0xFFFF0000;
and.b32 $7, p3, 0xFFFF0000;
}
"""
_DECODE_BF16 = tl.constexpr(_DECODE_PTX)

# Variant with fp16 fields (DECODE=2): magnitude bits on fp16 bits 9..11, sign carried from bit 12 to bit 15
# (``p = s * 7 + v``), ``E2M1 * 2^-14`` fixed by ``mul.rn.f16x2`` with 2^14 (0x7400), then ``cvt.f32.f16``
# (runs on the FMA pipe, where the bf16 variant's unpacks use the integer pipe).
_DECODE_F16 = tl.constexpr("""
{
.reg .b32 a, v, s, p0, p1, p2, p3;
.reg .b16 h0, h1;
shl.b32 a, $8, 9;
and.b32 v, a, 0x1E001E00;
and.b32 s, a, 0x10001000;
mad.lo.u32 p0, s, 7, v;
shl.b32 a, $8, 5;
and.b32 v, a, 0x1E001E00;
and.b32 s, a, 0x10001000;
mad.lo.u32 p1, s, 7, v;
shl.b32 a, $8, 1;
and.b32 v, a, 0x1E001E00;
and.b32 s, a, 0x10001000;
mad.lo.u32 p2, s, 7, v;
shr.b32 a, $8, 3;
and.b32 v, a, 0x1E001E00;
and.b32 s, a, 0x10001000;
mad.lo.u32 p3, s, 7, v;
mul.rn.f16x2 p0, p0, $9;
mul.rn.f16x2 p1, p1, $9;
mul.rn.f16x2 p2, p2, $9;
mul.rn.f16x2 p3, p3, $9;
mov.b32 {h0, h1}, p0;
cvt.f32.f16 $0, h0;
cvt.f32.f16 $2, h1;
mov.b32 {h0, h1}, p2;
cvt.f32.f16 $1, h0;
cvt.f32.f16 $3, h1;
mov.b32 {h0, h1}, p1;
cvt.f32.f16 $4, h0;
cvt.f32.f16 $6, h1;
mov.b32 {h0, h1}, p3;
cvt.f32.f16 $5, h0;
cvt.f32.f16 $7, h1;
}
""")


@triton.jit
def _e2m1_nibble_f32(n):
    """Exact fp32 of E2M1 nibbles ``n`` (int32, 0..15) with plain integer ops (interpreter path)."""
    bits = ((n & 7) << 22) | ((n & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37  # 2^126, exact


@triton.jit
def decode_e2m1(codes, DECODE: tl.constexpr):
    """uint8 code bytes (any shape) -> (lo, hi) fp32 of the same shape: E2M1 of the low / high nibble.

    ``DECODE`` (GPU only; the interpreter always takes the plain path): 1 = packed bf16x2 inline PTX,
    2 = packed fp16x2 inline PTX, 0 = plain Triton integer ops. All give identical values.
    """
    if DECODE == 2 and not _INTERPRET:
        lo, hi = tl.inline_asm_elementwise(
            _DECODE_F16,
            "=f,=f,=f,=f,=f,=f,=f,=f,r,r,r,r,r",
            [codes, tl.full(codes.shape, 0x74007400, tl.int32)],
            dtype=(tl.float32, tl.float32),
            is_pure=True,
            pack=4,
        )
        return lo, hi
    elif DECODE == 1 and not _INTERPRET:
        lo, hi = tl.inline_asm_elementwise(
            _DECODE_BF16,
            "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r",
            [codes, tl.full(codes.shape, 0x7E807E80, tl.int32)],
            dtype=(tl.int32, tl.int32),
            is_pure=True,
            pack=4,
        )
        return lo.to(tl.float32, bitcast=True), hi.to(tl.float32, bitcast=True)
    else:
        c = codes.to(tl.int32)
        return _e2m1_nibble_f32(c & 15), _e2m1_nibble_f32(c >> 4)


@triton.jit
def decode_e2m1_words(words, DECODE: tl.constexpr):
    """int32 code words (any shape; word = 4 code bytes, byte j at bits 8j..8j+7) -> 8 fp32 tensors of the
    same shape: ``(lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3)``, E2M1 of the low / high nibble of byte j.

    Same PTX as ``decode_e2m1`` (``DECODE`` 2 / 1) with ``pack=1``: the asm takes the 32-bit word as loaded,
    so no byte is unpacked into its own register and re-packed (``prmt``) before the decode. Identical values.
    """
    if DECODE == 2 and not _INTERPRET:
        return tl.inline_asm_elementwise(
            _DECODE_F16,
            "=f,=f,=f,=f,=f,=f,=f,=f,r,r",
            [words, tl.full(words.shape, 0x74007400, tl.int32)],
            dtype=(tl.float32,) * 8,
            is_pure=True,
            pack=1,
        )
    elif DECODE == 1 and not _INTERPRET:
        o0, o1, o2, o3, o4, o5, o6, o7 = tl.inline_asm_elementwise(
            _DECODE_BF16,
            "=r,=r,=r,=r,=r,=r,=r,=r,r,r",
            [words, tl.full(words.shape, 0x7E807E80, tl.int32)],
            dtype=(tl.int32,) * 8,
            is_pure=True,
            pack=1,
        )
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
            _e2m1_nibble_f32(words & 15),
            _e2m1_nibble_f32((words >> 8) & 15),
            _e2m1_nibble_f32((words >> 16) & 15),
            _e2m1_nibble_f32((words >> 24) & 15),
            _e2m1_nibble_f32((words >> 4) & 15),
            _e2m1_nibble_f32((words >> 12) & 15),
            _e2m1_nibble_f32((words >> 20) & 15),
            _e2m1_nibble_f32((words >> 28) & 15),
        )


@triton.jit
def _join4(a, b, c, d):
    """[..., 4] with [..., j] = (a, b, c, d)[j] (tl.join appends the new axis last, hence the pairing)."""
    return tl.join(tl.join(a, c), tl.join(b, d))


@triton.jit
def block_partials_words(words, xw, R: tl.constexpr, B: tl.constexpr, DECODE: tl.constexpr):
    """``block_partials`` with the codes as int32 words [R, B // 4] (word i = code bytes 4i..4i+3 of the row).

    Same values and the same order: the words are decoded to the [R, B] lo / hi tiles of ``block_partials``
    (byte 4i + j = byte j of word i) and the rest is that function's code.
    """
    l0, l1, l2, l3, h0, h1, h2, h3 = decode_e2m1_words(words, DECODE)
    lo = tl.reshape(_join4(l0, l1, l2, l3), [R, B])
    hi = tl.reshape(_join4(h0, h1, h2, h3), [R, B])
    xe = (xw << 16).to(tl.float32, bitcast=True)
    xo = (xw & -65536).to(tl.float32, bitcast=True)
    prod = tl.join(lo * xe[None, :], hi * xo[None, :])  # [R, B, 2]: element 2i, 2i + 1
    prod = tl.reshape(prod, [R, B // 8, 16])
    return tl.sum(prod, axis=2)


@triton.jit
def block_partials(codes, xw, R: tl.constexpr, B: tl.constexpr, DECODE: tl.constexpr):
    """fp32 [R, B // 8]: per 16-element block, sum of E2M1(code) * x in element order (module docstring)."""
    lo, hi = decode_e2m1(codes, DECODE)
    xe = (xw << 16).to(tl.float32, bitcast=True)
    xo = (xw & -65536).to(tl.float32, bitcast=True)
    prod = tl.join(lo * xe[None, :], hi * xo[None, :])  # [R, B, 2]: element 2i, 2i + 1
    prod = tl.reshape(prod, [R, B // 8, 16])
    return tl.sum(prod, axis=2)


@triton.jit
def load_codes(w_row, k0, row_ok, BKB: tl.constexpr, WORDS: tl.constexpr):
    """Codes of bytes [k0, k0 + BKB) of each row: uint8 [R, BKB], or int32 words [R, BKB / 4] with WORDS
    (``w_row`` then int32 pointers)."""
    if WORDS:
        aw = tl.arange(0, BKB // 4)
        return tl.load(w_row[:, None] + tl.multiple_of(k0 // 4 + aw, 4)[None, :], mask=row_ok[:, None], other=0)
    else:
        ar = tl.arange(0, BKB)
        return tl.load(w_row[:, None] + (k0 + ar)[None, :], mask=row_ok[:, None], other=0)


@triton.jit
def code_partials(codes, xw, R: tl.constexpr, BKB: tl.constexpr, DECODE: tl.constexpr, WORDS: tl.constexpr):
    """``block_partials_words`` (WORDS) or ``block_partials`` of a ``load_codes`` tile (identical values)."""
    if WORDS:
        return block_partials_words(codes, xw, R, BKB, DECODE)
    else:
        return block_partials(codes, xw, R, BKB, DECODE)


@triton.jit
def swizzled_scale_offsets(rows, cols, KP: tl.constexpr):
    """Byte offsets inside one expert's 128x4-swizzled scale block of (row, scale column) pairs.

    ``(r // 128) * (KP / 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``
    (docs/layouts.md); ``rows`` [R, 1] or [R], ``cols`` broadcastable; KP = roundup(K / 16, 4).
    """
    return (rows // 128) * (KP // 4 * 512) + (cols // 4) * 512 + (rows % 32) * 16 + ((rows % 128) // 32) * 4 + cols % 4


@triton.jit
def e4m3_to_f32(b):
    """E4M3 bytes (int32 0..255) -> exact fp32 (negative and -0 bytes decode as such; NaN bytes are rejected
    by the loaders). Bit arithmetic: exponent field 0 -> subnormal ``m * 2^-9``, else ``(8 + m) * 2^(e-10)``,
    built as fp32 bits ``((b & 0x7F) << 20) * 2^120`` (exact), with the sign moved to bit 31."""
    bits = ((b & 0x7F) << 20) | ((b & 0x80) << 24)
    return bits.to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2^120


@triton.jit
def load_words(ptrs, mask, ASM: tl.constexpr):
    """int32 loads of ``ptrs`` (int32 pointers), ``0`` where ``mask`` is False.

    GPU with ``ASM``: inline ``ld.global.nc.v4.b32`` on groups of 4 consecutive elements of a thread
    (``pack=4``; the caller guarantees each group is 4 consecutive, 16-byte aligned words whose mask is
    uniform, and passes in-bounds pointers: masked groups are read from a clamped address and zeroed).
    Unlike ``tl.load``, an inline load keeps the layout of its pointer tensor, so the activation words land in
    the weight tile's layout with no shared-memory round trip. Otherwise ``tl.load``.
    """
    if ASM and not _INTERPRET:
        v = tl.inline_asm_elementwise(
            "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];",
            "=r,=r,=r,=r,l,l,l,l",
            [ptrs],
            dtype=tl.int32,
            is_pure=True,
            pack=4,
        )
        return tl.where(mask, v, 0)
    else:
        return tl.load(ptrs, mask=mask, other=0)


@triton.jit
def load_bytes(ptrs, mask, ASM: tl.constexpr):
    """uint8 loads (as int32 0..255), ``0`` where ``mask`` is False (pointers must be in bounds).

    GPU with ``ASM``: inline ``ld.global.nc.u8`` per element (keeps the pointer tensor's layout, see
    ``load_words``). Otherwise ``tl.load``.
    """
    if ASM and not _INTERPRET:
        v = tl.inline_asm_elementwise("ld.global.nc.u8 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=True, pack=1)
        return tl.where(mask, v, 0)
    else:
        return tl.load(ptrs, mask=mask, other=0).to(tl.int32)


# ----------------------------------------------------------------------------------------------------------
# Tensor-core path (``MMA`` option of both decode kernels)
# ----------------------------------------------------------------------------------------------------------
#: (RT, S) pairs with a generated PTX body: RT rows per thread (2 or 4), S sub-steps of 64 bytes per call.
MMA_SHAPES = ((2, 1), (2, 2), (2, 4), (4, 1), (4, 2))


def mma_ptx(RT: int, S: int, PRED: bool, MODE: str = "full", FENCE: bool = False) -> str:
    """PTX body of one ``mma_rows`` call (see ``mma_rows``): RT rows of this thread, S sub-steps.

    ``MODE`` (cross-step prefetch, ``mma_rows_pf``): "full" loads and computes one step; "load" only loads a
    step's codes and scales and returns them (4 S code-word outputs and S scale outputs, RT each); "pf"
    computes the step whose codes and scales come in as inputs (after acc) while loading the next step's
    from the pointers into its outputs (after acc); "drain" computes the carried step without loading codes.

    Operands: ``$0..$RT-1`` accumulators out (f32); inputs: RT code pointers (u8, 16-byte aligned), RT scale
    pointers (u8, 2-byte aligned: the two E4M3 bytes of the chunk's blocks are adjacent in the 128x4 swizzle),
    RT activation pointers (int32 words; only the first is used), RT accumulators in, and with ``PRED`` RT
    validity flags (only the first is used: 1 = the whole chunk, 2 = its first block only, 0 = nothing; what is
    not valid is not loaded and adds exact zeros). ``FENCE`` (MODE "full", no PRED): one more input, RT int32
    zeros that the compiler cannot see as constants (only the first is used); every code and scale word of the
    call is xor-ed together, ``and``-ed with that zero and ``or``-ed into the scale multiplier constant, so that
    ptxas must issue all of the call's code and scale loads before the first decode (without it, ptxas
    interleaves them with the arithmetic to save registers and only ~2 loads per thread are in flight). The
    values are unchanged (the or adds 0), hence the same bits.
    Per sub-step s (code bytes +64 s, scales +1024 s, activation words +64 s): 16 code bytes of each row
    (4 words = 32 E2M1 codes = 2 blocks), 16 activation words (32 bf16), 2 scale bytes per row.
    Decode of word w (nibbles n0..n7 at bits 4i, element i of the word): pair i = (n_i, n_{i+4}) is placed as
    a bf16x2 ``E2M1 * 2^-126`` (shift, and, and, ``mad.lo`` carries the sign to bit 15; the code 0.5 is a bf16
    subnormal), then ``mul.rn.bf16x2`` by the block multiplier ``Q = E4M3 * 2^118`` (built exactly from the
    scale byte: fields placed as ``E4M3 * 2^-120`` then two ``mul.rn.bf16x2`` by 2^119) gives the dequantised
    weight ``E2M1 * E4M3 * 2^-8`` exactly (at most 6 significant bits, magnitude in [2^-18, 10.5]).
    The activation words are re-paired with ``prmt`` as (x_i, x_{i+4}) to match. Two ``mma.sync.m16n8k16``
    (bf16 in, fp32 accumulate) per word and row pair: A = the pairs of the thread's two rows (MMA rows
    groupID and groupID + 8), B = the activation pairs (all 8 columns equal), C = D = the running sum.
    """
    assert RT % 2 == 0 and S >= 1 and MODE in ("full", "load", "pf", "drain")
    assert not PRED or MODE == "full"
    assert not FENCE or (MODE == "full" and not PRED)
    nc = 4 * S + S  # carried tensors: code words (s, w) at 4 s + w, then scales at 4 S + s
    n_out = {"full": 1, "load": nc, "pf": 1 + nc, "drain": 1}[MODE] * RT
    ins = {"full": ["c", "s", "x", "a"], "load": ["c", "s"], "pf": ["c", "s", "x", "a"], "drain": ["x", "a"]}[MODE]
    if FENCE:
        ins = ins + ["z"]
    op = {name: [f"${n_out + k * RT + j}" for j in range(RT)] for k, name in enumerate(ins)}
    base_in = n_out + len(ins) * RT
    cp, sp = op.get("c"), op.get("s")
    xp = op["x"][0] if "x" in op else None
    ai = op.get("a")
    flag = f"${n_out + len(ins) * RT}"
    pre = "@pv " if PRED else ""
    L = ["{"]
    L.append(f".reg .b32 cw<{RT * S * 4}>, su<{RT * S}>, xw<16>, xq<16>, pp<32>, q0, q1, t, v, m, s, a, k119;")
    L.append(f".reg .b32 ncw<{RT * S * 4}>, nsu<{RT * S}>, fz;")
    L.append(f".reg .f32 d<{2 * RT}>;")
    if PRED:  # flag 0: nothing, 1: the whole chunk, 2: its first 8 bytes (one block) only
        L.append(".reg .pred pv, ph;")
        L.append(f"setp.ne.b32 pv, {flag}, 0;")
        L.append(f"setp.eq.b32 ph, {flag}, 1;")
    L.append("mov.b32 k119, 0x7B007B00;")
    if MODE in ("pf", "drain"):  # the carried step: input tensor 4 s + w (code words), 4 S + s (scales)
        base_c = base_in
        for s_ in range(S):
            for j in range(RT):
                for w in range(4):
                    L.append(f"mov.b32 cw{(j * S + s_) * 4 + w}, ${base_c + (4 * s_ + w) * RT + j};")
                L.append(f"mov.b32 su{j * S + s_}, ${base_c + (4 * S + s_) * RT + j};")
    if MODE in ("full", "pf", "drain"):
        for j in range(RT):  # D columns 2 tig and 2 tig + 1 of the thread's row j (equal: all B columns are x)
            L.append(f"mov.f32 d{2 * j}, {ai[j]};")
            L.append(f"mov.f32 d{2 * j + 1}, {ai[j]};")
    lc, ls = ("cw", "su") if MODE == "full" else ("ncw", "nsu")  # where this call's loads go
    for s in range(S if MODE != "drain" else 0):
        for j in range(RT):
            b = (j * S + s) * 4
            regs = f"{lc}{b}, {lc}{b + 1}, {lc}{b + 2}, {lc}{b + 3}"
            if PRED:
                L.append(f"mov.b32 cw{b}, 0; mov.b32 cw{b + 1}, 0; mov.b32 cw{b + 2}, 0; mov.b32 cw{b + 3}, 0;")
            L.append(f"{pre}ld.global.nc.L1::no_allocate.v4.b32 {{{regs}}}, [{cp[j]}+{64 * s}];")
            if PRED:
                L.append(f"@!ph mov.b32 cw{b + 2}, 0; @!ph mov.b32 cw{b + 3}, 0;")
    for s in range(S if MODE != "drain" else 0):
        for j in range(RT):
            if PRED:
                L.append(f"mov.b32 su{j * S + s}, 0;")
            L.append(f"{pre}ld.global.nc.u16 {ls}{j * S + s}, [{sp[j]}+{1024 * s}];")
            if PRED:
                L.append(f"@!ph and.b32 su{j * S + s}, su{j * S + s}, 255;")
    if FENCE:  # every code / scale word feeds k119 through an opaque zero: all loads issued before any decode
        words = [f"cw{i}" for i in range(RT * S * 4)] + [f"su{i}" for i in range(RT * S)]
        L.append(f"xor.b32 fz, {words[0]}, {words[1]};")
        L.extend(f"xor.b32 fz, fz, {wd};" for wd in words[2:])
        L.append(f"and.b32 fz, fz, {op['z'][0]};")
        L.append("or.b32 k119, k119, fz;")
    for s in range(S if MODE != "load" else 0):
        for h in range(4):
            regs = f"xw{4 * h}, xw{4 * h + 1}, xw{4 * h + 2}, xw{4 * h + 3}"
            if PRED:
                L.append(
                    f"mov.b32 xw{4 * h}, 0; mov.b32 xw{4 * h + 1}, 0; mov.b32 xw{4 * h + 2}, 0; "
                    f"mov.b32 xw{4 * h + 3}, 0;"
                )
            xpre = pre if h < 2 or not PRED else "@ph "
            L.append(f"{xpre}ld.global.nc.v4.b32 {{{regs}}}, [{xp}+{256 * s + 16 * h}];")
        for w in range(4):
            x0, x1, x2, x3 = (f"xw{4 * w + i}" for i in range(4))
            L.append(f"prmt.b32 xq{4 * w}, {x0}, {x2}, 0x5410;")
            L.append(f"prmt.b32 xq{4 * w + 1}, {x0}, {x2}, 0x7632;")
            L.append(f"prmt.b32 xq{4 * w + 2}, {x1}, {x3}, 0x5410;")
            L.append(f"prmt.b32 xq{4 * w + 3}, {x1}, {x3}, 0x7632;")
        for g in range(RT // 2):
            for rr in range(2):
                r = 2 * g + rr
                u = f"su{r * S + s}"
                L.append(f"prmt.b32 v, {u}, 0, 0x4140;")
                L.append("and.b32 m, v, 0x007F007F;")
                L.append("and.b32 s, v, 0x00800080;")
                L.append("shl.b32 m, m, 4;")
                L.append("mad.lo.u32 t, s, 256, m;")
                L.append("mul.rn.bf16x2 t, t, k119;")
                L.append("mul.rn.bf16x2 t, t, k119;")
                L.append("prmt.b32 q0, t, t, 0x1010;")
                L.append("prmt.b32 q1, t, t, 0x3232;")
                for w in range(4):
                    cw = f"cw{(r * S + s) * 4 + w}"
                    qq = "q0" if w < 2 else "q1"
                    for i, op in enumerate(
                        ("shl.b32 a, {}, 6;", "shl.b32 a, {}, 2;", "shr.b32 a, {}, 2;", "shr.b32 a, {}, 6;")
                    ):
                        dst = f"pp{rr * 16 + w * 4 + i}"
                        L.append(op.format(cw))
                        L.append("and.b32 v, a, 0x03C003C0;")
                        L.append("and.b32 s, a, 0x02000200;")
                        L.append(f"mad.lo.u32 {dst}, s, 63, v;")
                        L.append(f"mul.rn.bf16x2 {dst}, {dst}, {qq};")
            dd = f"d{4 * g}, d{4 * g + 1}, d{4 * g + 2}, d{4 * g + 3}"
            for w in range(4):
                for half in range(2):
                    i0, i1 = 2 * half, 2 * half + 1
                    a = (f"pp{w * 4 + i0}", f"pp{16 + w * 4 + i0}", f"pp{w * 4 + i1}", f"pp{16 + w * 4 + i1}")
                    L.append(
                        f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{dd}}}, "
                        f"{{{a[0]}, {a[1]}, {a[2]}, {a[3]}}}, {{xq{4 * w + i0}, xq{4 * w + i1}}}, {{{dd}}};"
                    )
    if MODE != "load":
        for j in range(RT):
            L.append(f"mov.f32 ${j}, d{2 * j};")
    if MODE in ("load", "pf"):
        o = RT if MODE == "pf" else 0
        for s_ in range(S):
            for j in range(RT):
                for w in range(4):
                    L.append(f"mov.b32 ${o + (4 * s_ + w) * RT + j}, ncw{(j * S + s_) * 4 + w};")
                L.append(f"mov.b32 ${o + (4 * S + s_) * RT + j}, nsu{j * S + s_};")
    L.append("}")
    return "\n".join(L)


_MMA_2_1 = tl.constexpr(mma_ptx(2, 1, False))
_MMA_2_2 = tl.constexpr(mma_ptx(2, 2, False))
_MMA_2_4 = tl.constexpr(mma_ptx(2, 4, False))
_MMA_4_1 = tl.constexpr(mma_ptx(4, 1, False))
_MMA_4_2 = tl.constexpr(mma_ptx(4, 2, False))
_MMA_2_2F = tl.constexpr(mma_ptx(2, 2, False, FENCE=True))
_MMA_2_4F = tl.constexpr(mma_ptx(2, 4, False, FENCE=True))
_MMA_2_P = tl.constexpr(mma_ptx(2, 1, True))
_MMA_4_P = tl.constexpr(mma_ptx(4, 1, True))


@triton.jit
def _mma_shim(cptr, sptr, xptr, acc, flag, S: tl.constexpr):
    """INTERPRETER path of ``mma_rows``: the same loads through ``tl.load``; per (row, chunk) the exact
    dequantised products ``E2M1 * E4M3 * 2^-8 * x`` summed in fp32 (round to nearest, numpy order) into that
    chunk's column of ``acc`` (the GPU path puts the whole row sum in every column; ``mma_row_sums`` adds the
    columns here and takes column 0 there)."""
    for s in tl.static_range(S):
        b16 = tl.arange(0, 16)
        ok = (flag[:, :, None] == 1) | ((flag[:, :, None] == 2) & (b16[None, None, :] < 8))  # [R, 4, 16] bytes
        codes = tl.load(cptr[:, :, None] + (64 * s + b16)[None, None, :], mask=ok, other=0)
        lo, hi = decode_e2m1(codes, 0)
        xw = tl.load(xptr[:, :, None] + (64 * s + b16)[None, None, :], mask=ok, other=0)
        xe = (xw << 16).to(tl.float32, bitcast=True)
        xo = (xw & -65536).to(tl.float32, bitcast=True)
        b2 = tl.arange(0, 2)
        s_ok = (flag[:, :, None] == 1) | ((flag[:, :, None] == 2) & (b2[None, None, :] < 1))
        sb = tl.load(sptr[:, :, None] + (1024 * s + b2)[None, None, :], mask=s_ok, other=0)
        sc = e4m3_to_f32(sb.to(tl.int32)) * 0.00390625  # 2^-8, exact
        # byte b of the chunk belongs to block b // 8
        sc16 = tl.reshape(tl.broadcast_to(sc[:, :, :, None], [sc.shape[0], sc.shape[1], 2, 8]), lo.shape)
        prod = lo * sc16 * xe + hi * sc16 * xo
        acc = acc + tl.sum(prod, axis=2)
    return acc


_CONS_2 = tl.constexpr(",".join(["=f"] * 2 + ["l"] * 6 + ["f"] * 2))
_CONS_4 = tl.constexpr(",".join(["=f"] * 4 + ["l"] * 12 + ["f"] * 4))
_CONS_2P = tl.constexpr(",".join(["=f"] * 2 + ["l"] * 6 + ["f"] * 2 + ["r"] * 2))
_CONS_4P = tl.constexpr(",".join(["=f"] * 4 + ["l"] * 12 + ["f"] * 4 + ["r"] * 4))
_CONS_2F = _CONS_2P


@triton.jit
def _asm4f(asm: tl.constexpr, cptr, sptr, xptr, acc, zero):
    return tl.inline_asm_elementwise(
        asm,
        _CONS_2F,
        [cptr.to(tl.int64), sptr.to(tl.int64), xptr.to(tl.int64), acc, zero],
        dtype=tl.float32,
        is_pure=False,
        pack=2,
    )


@triton.jit
def _asm4(asm: tl.constexpr, cons: tl.constexpr, cptr, sptr, xptr, acc, RT: tl.constexpr):
    return tl.inline_asm_elementwise(
        asm,
        cons,
        [cptr.to(tl.int64), sptr.to(tl.int64), xptr.to(tl.int64), acc],
        dtype=tl.float32,
        is_pure=False,
        pack=RT,
    )


@triton.jit
def mma_rows(cptr, sptr, xptr, acc, RT: tl.constexpr, S: tl.constexpr, FENCE: tl.constexpr = False, zero=0):
    """One call of the tensor-core GEMV step for a [R, 4] tile of (row, chunk) pointers (module section
    "Tensor-core path"; PTX in ``mma_ptx``): returns ``acc`` plus ``S`` sub-steps of 64 code bytes per row.

    ``cptr`` uint8 pointers to the 16-byte chunk ``c`` (column) of each row, ``sptr`` uint8 pointers to the
    chunk's two E4M3 scale bytes, ``xptr`` int32 pointers to the chunk's 16 activation words, ``acc`` fp32
    [R, 4]. GPU: requires the default blocked layout of a [R, 4] tensor (threads [8, 4] per warp, warps along
    the rows, RT = R / (8 * num_warps) rows per thread; checked on the TTGIR by tests/kernels), where every
    column then holds the row's running sum. ``FENCE`` (RT = 2, S = 2 or 4; ``zero``: int32 [R, 4] zeros the
    compiler cannot fold): all code and scale loads of the call before its first decode (``mma_ptx``); same
    values.
    """
    if _INTERPRET:
        return _mma_shim(cptr, sptr, xptr, acc, tl.full(acc.shape, 1, tl.int32), S)
    elif FENCE:
        tl.static_assert(RT == 2 and (S == 2 or S == 4), "mma_rows: FENCE needs RT = 2 and S = 2 or 4")
        if S == 2:
            return _asm4f(_MMA_2_2F, cptr, sptr, xptr, acc, zero)
        else:
            return _asm4f(_MMA_2_4F, cptr, sptr, xptr, acc, zero)
    elif RT == 2 and S == 1:
        return _asm4(_MMA_2_1, _CONS_2, cptr, sptr, xptr, acc, 2)
    elif RT == 2 and S == 2:
        return _asm4(_MMA_2_2, _CONS_2, cptr, sptr, xptr, acc, 2)
    elif RT == 2 and S == 4:
        return _asm4(_MMA_2_4, _CONS_2, cptr, sptr, xptr, acc, 2)
    elif RT == 4 and S == 1:
        return _asm4(_MMA_4_1, _CONS_4, cptr, sptr, xptr, acc, 4)
    else:
        tl.static_assert(RT == 4 and S == 2, "mma_rows: (RT, S) must be one of MMA_SHAPES")
        return _asm4(_MMA_4_2, _CONS_4, cptr, sptr, xptr, acc, 4)


# Cross-step prefetch (``PF``): RT = 2, S = 2 or 4; generated bodies, see ``mma_ptx`` MODE.

_PF_LOAD_2 = tl.constexpr(mma_ptx(2, 2, False, "load"))
_PF_STEP_2 = tl.constexpr(mma_ptx(2, 2, False, "pf"))
_PF_DRAIN_2 = tl.constexpr(mma_ptx(2, 2, False, "drain"))


@triton.jit
def _pf_load_2(cptr, sptr):
    return tl.inline_asm_elementwise(
        _PF_LOAD_2,
        "=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,l,l,l,l",
        [cptr.to(tl.int64), sptr.to(tl.int64)],
        dtype=(
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
        ),
        is_pure=False,
        pack=2,
    )


@triton.jit
def _pf_step_2(cptr, sptr, xptr, acc, carried):
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 = carried
    acc, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 = tl.inline_asm_elementwise(
        _PF_STEP_2,
        "=f,=f,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,l,l,l,l,l,l,f,f,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
        [cptr.to(tl.int64), sptr.to(tl.int64), xptr.to(tl.int64), acc, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9],
        dtype=(
            tl.float32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
        ),
        is_pure=False,
        pack=2,
    )
    return acc, (c0, c1, c2, c3, c4, c5, c6, c7, c8, c9)


@triton.jit
def _pf_drain_2(xptr, acc, carried):
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 = carried
    return tl.inline_asm_elementwise(
        _PF_DRAIN_2,
        "=f,=f,l,l,f,f,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
        [xptr.to(tl.int64), acc, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9],
        dtype=tl.float32,
        is_pure=False,
        pack=2,
    )


_PF_LOAD_4 = tl.constexpr(mma_ptx(2, 4, False, "load"))
_PF_STEP_4 = tl.constexpr(mma_ptx(2, 4, False, "pf"))
_PF_DRAIN_4 = tl.constexpr(mma_ptx(2, 4, False, "drain"))


@triton.jit
def _pf_load_4(cptr, sptr):
    return tl.inline_asm_elementwise(
        _PF_LOAD_4,
        "=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,l,l,l,l",
        [cptr.to(tl.int64), sptr.to(tl.int64)],
        dtype=(
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
            tl.int32,
        ),
        is_pure=False,
        pack=2,
    )


@triton.jit
def _pf_step_4(cptr, sptr, xptr, acc, carried):
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19 = carried
    acc, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19 = (
        tl.inline_asm_elementwise(
            _PF_STEP_4,
            "=f,=f,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,=r,l,l,l,l,l,l,f,f,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
            [
                cptr.to(tl.int64),
                sptr.to(tl.int64),
                xptr.to(tl.int64),
                acc,
                c0,
                c1,
                c2,
                c3,
                c4,
                c5,
                c6,
                c7,
                c8,
                c9,
                c10,
                c11,
                c12,
                c13,
                c14,
                c15,
                c16,
                c17,
                c18,
                c19,
            ],
            dtype=(
                tl.float32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
                tl.int32,
            ),
            is_pure=False,
            pack=2,
        )
    )
    return acc, (c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19)


@triton.jit
def _pf_drain_4(xptr, acc, carried):
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19 = carried
    return tl.inline_asm_elementwise(
        _PF_DRAIN_4,
        "=f,=f,l,l,f,f,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
        [
            xptr.to(tl.int64),
            acc,
            c0,
            c1,
            c2,
            c3,
            c4,
            c5,
            c6,
            c7,
            c8,
            c9,
            c10,
            c11,
            c12,
            c13,
            c14,
            c15,
            c16,
            c17,
            c18,
            c19,
        ],
        dtype=tl.float32,
        is_pure=False,
        pack=2,
    )


def early_wait_ptx(n: int) -> str:
    """PTX of ``_early_wait_2`` / ``_early_wait_4`` (``EARLY`` 1 of ``mma_gemv``), pack 2: outputs ``$0, $1``
    (int32 0), inputs ``n`` carried tensors then the opaque zero tensor (2 registers each). Every carried word is
    xor-ed together, ``and``-ed with the zero and compared with 0; ``griddepcontrol.wait`` runs under the negation
    of that (always true) predicate, so ptxas cannot sink the weight loads below the wait (without it, it does)."""
    ins = [f"${2 + i}" for i in range(2 * n)]
    z = f"${2 + 2 * n}"
    L = ["{", ".reg .b32 fz;", ".reg .pred pw;", f"xor.b32 fz, {ins[0]}, {ins[1]};"]
    L += [f"xor.b32 fz, fz, {r};" for r in ins[2:]]
    L += [f"and.b32 fz, fz, {z};", "setp.ne.b32 pw, fz, 0;", "@!pw griddepcontrol.wait;"]
    L += ["mov.b32 $0, 0;", "mov.b32 $1, 0;", "}"]
    return "\n".join(L)


_EARLY_WAIT_2 = tl.constexpr(early_wait_ptx(10))
_EARLY_WAIT_4 = tl.constexpr(early_wait_ptx(20))
_EARLY_CONS_2 = tl.constexpr(",".join(["=r"] * 2 + ["r"] * 22))
_EARLY_CONS_4 = tl.constexpr(",".join(["=r"] * 2 + ["r"] * 42))


@triton.jit
def _early_wait_2(carried, zero):
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 = carried
    return tl.inline_asm_elementwise(
        _EARLY_WAIT_2, _EARLY_CONS_2, [c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, zero],
        dtype=tl.int32, is_pure=False, pack=2,
    )  # fmt: skip


@triton.jit
def _early_wait_4(carried, zero):
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19 = carried
    return tl.inline_asm_elementwise(
        _EARLY_WAIT_4, _EARLY_CONS_4,
        [c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, zero],
        dtype=tl.int32, is_pure=False, pack=2,
    )  # fmt: skip


@triton.jit
def mma_rows_tail(cptr, sptr, xptr, acc, flag, RT: tl.constexpr):
    """``mma_rows`` with S = 1 for a partial last step: ``flag`` (int32 [R, 4]) 1 = the whole chunk, 2 = its
    first 8 bytes (one block) only, 0 = nothing; the missing part loads nothing (codes, activations, scales)
    and adds exact zeros."""
    if _INTERPRET:
        return _mma_shim(cptr, sptr, xptr, acc, flag, 1)
    elif RT == 2:
        return tl.inline_asm_elementwise(
            _MMA_2_P,
            _CONS_2P,
            [cptr.to(tl.int64), sptr.to(tl.int64), xptr.to(tl.int64), acc, flag],
            dtype=tl.float32,
            is_pure=False,
            pack=2,
        )
    else:
        return tl.inline_asm_elementwise(
            _MMA_4_P,
            _CONS_4P,
            [cptr.to(tl.int64), sptr.to(tl.int64), xptr.to(tl.int64), acc, flag],
            dtype=tl.float32,
            is_pure=False,
            pack=4,
        )


def mma_part_bytes(K: int, SK: int) -> int:
    """Code bytes of each of the first SK - 1 K-parts of ``mma_gemv`` (the last has the rest): K / SK when K is a
    multiple of 64 SK, else K / SK rounded up to a multiple of 64 (the parts start on 64-byte steps)."""
    return K // SK if K % (64 * SK) == 0 else -(-K // (64 * SK)) * 64


def l2_prefetch_ptx(S: int) -> str:
    """PTX of ``l2_prefetch``: ``prefetch.global.L2`` of each 128-byte line of the ``64 S`` bytes from the
    pointer (the 4 chunk threads of a row give the same lines), then ``$0 = 0``."""
    lines = max(1, 64 * S // 128)
    return " ".join(f"prefetch.global.L2 [$1+{128 * i}];" for i in range(lines)) + " mov.b32 $0, 0;"


_L2PF_1 = tl.constexpr(l2_prefetch_ptx(1))
_L2PF_2 = tl.constexpr(l2_prefetch_ptx(2))
_L2PF_4 = tl.constexpr(l2_prefetch_ptx(4))


@triton.jit
def l2_prefetch(ptr, S: tl.constexpr):
    """GPU: L2 prefetch of the ``64 S`` code bytes at each pointer of ``ptr`` (uint8 [R, 4]); returns int32 0
    of the same shape, opaque to the compiler (adding it to the next loads' pointers keeps the prefetch ahead of
    them). Interpreter: no prefetch, 0."""
    if _INTERPRET:
        return tl.zeros(ptr.shape, dtype=tl.int32)
    elif S == 1:
        return tl.inline_asm_elementwise(_L2PF_1, "=r,l", [ptr.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1)
    elif S == 2:
        return tl.inline_asm_elementwise(_L2PF_2, "=r,l", [ptr.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.static_assert(S == 4, "l2_prefetch: S must be 1, 2 or 4")
        return tl.inline_asm_elementwise(_L2PF_4, "=r,l", [ptr.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def opaque_zero(v):
    """int32 0 that the compiler cannot fold (``mov.b32 $0, 0`` on the GPU): a loop starting at it has a run-time
    trip count, which keeps LLVM from unrolling a long constant-trip loop completely (code size). ``v``: any
    int32 scalar (a data dependency only)."""
    if _INTERPRET:
        return 0
    else:
        return tl.inline_asm_elementwise("mov.b32 $0, 0;", "=r,r", [v], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def mma_row_sums(acc):
    """[R] row sums of an ``mma_rows`` accumulator [R, 4], times 2^8 (undoes the weights' 2^-8; exact): GPU
    column 0 (every column holds the row sum), interpreter the sum of the 4 chunk columns."""
    if _INTERPRET:
        tot = tl.sum(acc, axis=1)
    else:
        col = tl.arange(0, 4)[None, :]
        tot = tl.sum(tl.where(col == 0, acc, 0.0), axis=1)
    return tot * 256.0


@triton.jit
def mma_tile_rows(R: tl.constexpr, NW: tl.constexpr, SK: tl.constexpr):
    """(i, h) int32 [R] of the tile rows of an ``mma_gemv`` tile with ``NW`` warps and ``SK`` K-parts: tile row
    r (warp w = (r // 8) % NW, lane group g = r % 8, repetition j = r // (8 NW)) computes K-part
    ``h = w // (NW / SK)`` of local row ``i = 8 (NW / SK) j + 8 (w % (NW / SK)) + g`` (R / SK local rows; all
    rows of one warp work on the same K-part, as the MMA needs)."""
    WR: tl.constexpr = NW // SK
    r = tl.arange(0, R)
    w = (r // 8) % NW
    h = w // WR
    i = 8 * WR * (r // (8 * NW)) + 8 * (w % WR) + r % 8
    return i, h


@triton.jit
def mma_gemv(
    c_base,
    row_off,
    s_base,
    srow,
    x_base,
    h,
    K: tl.constexpr,
    KP: tl.constexpr,
    R: tl.constexpr,
    RT: tl.constexpr,
    S: tl.constexpr,
    SK: tl.constexpr,
    SEED,
    PF: tl.constexpr = False,
    L2PF: tl.constexpr = 0,
    FENCE: tl.constexpr = False,
    ZERO=0,
    EARLY: tl.constexpr = 0,
    ORDER_PTR=None,
    TRIGGER: tl.constexpr = False,
):
    """Tensor-core row sums of one tile (module section "Tensor-core path"): fp32 [R], times 2^8 (exact).

    ``c_base`` uint8 pointer to the expert's codes, ``row_off`` int64 [R] byte offset of each tile row's
    physical row, ``s_base`` uint8 pointer to the expert's swizzled scales, ``srow`` int32 [R] physical row
    (for the swizzle), ``x_base`` int32 pointer to the activation row (bf16 pairs), ``h`` int32 [R] K-part of
    each tile row (``mma_tile_rows``), K code bytes per row (a multiple of 8). Part h covers bytes
    [h KS, min((h + 1) KS, K)) with ``KS = mma_part_bytes(K, SK)`` (K / SK when K is a multiple of 64 SK,
    else K / SK rounded up to a multiple of 64, so that only the last part is shorter; the launchers make sure
    it is not empty). Every part runs the full ``64 S``-byte calls that fit in the shortest (last) part, then
    64-byte calls up to its own end, the partial ones masked per chunk and per block (flag 1 = whole chunk,
    2 = its first block only, 0 = none): the same sequence of MMAs over the part's bytes in increasing order.
    ``SEED``: any int32 scalar (keeps the K loop's trip count opaque to LLVM, see ``opaque_zero``).
    ``PF`` (GPU, RT = 2, S = 2 or 4): the codes and scales of step s + 1 are loaded (``mma_ptx`` MODE "pf")
    while step s computes, carried between calls in registers; same MMA sequence, same bits.
    ``L2PF`` = D > 0 (GPU, without PF): before each full call, ``prefetch.global.L2`` of the code lines that the
    call D calls later reads (clamped to the part's last full call; no data changes, so the same bits).
    ``FENCE`` (GPU, RT = 2, S = 2 or 4, without PF; ``ZERO`` an int32 scalar 0 that the compiler cannot fold,
    e.g. ``min(expert id, 0)``): each full call issues all its code and scale loads before its first decode
    (``mma_ptx``); same values, same bits.
    ``EARLY`` (the caller has not yet passed ``griddepcontrol.wait``; this function does it, ``gdc_wait``):
    1 (GPU, RT = 2, S = 2 or 4, without PF / L2PF): the codes and scales of the first full call are loaded into
    registers (``mma_ptx`` MODE "load") before the wait, that call computed after it (MODE "drain"), the
    remaining calls as usual: the same MMA sequence, so the same bits; 2 (GPU): ``prefetch.global.L2`` of every
    full call's code lines before the wait (no data changes). Only the weights (codes, scales) are touched
    before the wait; the activation row is read after it: ``ORDER_PTR`` (int32 pointer to a value >= 0, e.g.
    the expert id) is read with a volatile load after the wait and ``min(value, 0)`` (= 0) added to every
    activation pointer, so that ptxas cannot hoist an activation load (``ld.global.nc``, which it treats as
    read-only data) above ``griddepcontrol.wait``; ``TRIGGER``: ``griddepcontrol.launch_dependents`` right after
    the wait (as the kernels without EARLY do at their start). Interpreter: the wait (a no-op) first.
    """
    KS: tl.constexpr = K // SK if K % (64 * SK) == 0 else (K + 64 * SK - 1) // (64 * SK) * 64
    LAST: tl.constexpr = K - (SK - 1) * KS  # bytes of the last part (the others have KS)
    tl.static_assert(LAST > 0, "mma_gemv: the last K-part is empty (the launcher must lower SK)")
    STEP: tl.constexpr = 64 * S
    FULLM: tl.constexpr = LAST // STEP * STEP
    tig = tl.arange(0, 4)
    k_part = h * KS  # [R] first byte of each tile row's part
    k_len = tl.where(h == SK - 1, LAST, KS)  # [R] bytes of each tile row's part
    cptr = c_base + (row_off + k_part)[:, None] + (16 * tig)[None, :]
    sptr = s_base + swizzled_scale_offsets(srow[:, None], (2 * tig)[None, :] + (k_part // 8)[:, None], KP)
    xptr = x_base + k_part[:, None] + (16 * tig)[None, :]
    acc = tl.zeros([R, 4], dtype=tl.float32)
    zt = tl.zeros([R, 4], dtype=tl.int32) + ZERO  # the FENCE operand (unused otherwise)
    EARLY_REGS: tl.constexpr = EARLY == 1 and FULLM > 0 and not _INTERPRET
    K0: tl.constexpr = STEP if EARLY_REGS else 0  # first byte of the regular loop
    if EARLY_REGS:  # first full call's codes / scales before the wait, computed after it
        tl.static_assert(RT == 2 and (S == 2 or S == 4) and not PF and L2PF == 0, "mma_gemv: EARLY 1 needs RT 2, S 2/4")
        if S == 2:  # the wait depends on the loaded words (``early_wait_ptx``): loads issued before it
            carried = _pf_load_2(cptr, sptr)
            _early_wait_2(carried, zt)
        else:
            carried = _pf_load_4(cptr, sptr)
            _early_wait_4(carried, zt)
    elif EARLY > 0:
        if EARLY == 2 and not _INTERPRET:  # L2 prefetch of the part's full calls' code lines before the wait
            for k0 in tl.static_range(0, FULLM, STEP):
                l2_prefetch(cptr + k0, S)
        gdc_wait()
    if EARLY > 0:  # activation addresses depend on a coherent load issued after the wait
        if TRIGGER:
            gdc_launch_dependents()
        xptr = xptr + tl.minimum(tl.load(ORDER_PTR, volatile=True), 0)
    if EARLY_REGS:  # the first call, from the registers loaded before the wait
        if S == 2:
            acc = _pf_drain_2(xptr, acc, carried)
        else:
            acc = _pf_drain_4(xptr, acc, carried)
    if PF and FULLM > 0 and not _INTERPRET:  # cross-step prefetch: step s + 1 loads while step s computes
        tl.static_assert(RT == 2 and (S == 2 or S == 4), "mma_gemv: PF needs RT = 2 and S = 2 or 4")
        if S == 2:
            carried = _pf_load_2(cptr, sptr)
            for k0 in tl.range(opaque_zero(SEED) + STEP, FULLM, STEP):
                acc, carried = _pf_step_2(cptr + k0, sptr + (k0 // 64) * 1024, xptr + (k0 - STEP), acc, carried)
            acc = _pf_drain_2(xptr + (FULLM - STEP), acc, carried)
        else:
            carried = _pf_load_4(cptr, sptr)
            for k0 in tl.range(opaque_zero(SEED) + STEP, FULLM, STEP):
                acc, carried = _pf_step_4(cptr + k0, sptr + (k0 // 64) * 1024, xptr + (k0 - STEP), acc, carried)
            acc = _pf_drain_4(xptr + (FULLM - STEP), acc, carried)
    elif L2PF > 0 and FULLM > 0 and not _INTERPRET:  # L2 prefetch of the codes L2PF calls ahead
        for k0 in tl.range(opaque_zero(SEED), FULLM, STEP):
            ahead = tl.minimum(k0 + L2PF * STEP, FULLM - STEP)
            z = l2_prefetch(cptr + ahead, S)  # 0, opaque: orders the prefetch before this call's loads
            acc = mma_rows(cptr + (k0 + z), sptr + (k0 // 64) * 1024, xptr + k0, acc, RT, S, FENCE, zt)
    else:
        for k0 in tl.range(opaque_zero(SEED) + K0, FULLM, STEP):
            acc = mma_rows(cptr + k0, sptr + (k0 // 64) * 1024, xptr + k0, acc, RT, S, FENCE, zt)
    for k0 in tl.range(FULLM, KS, 64):
        left = k_len[:, None] - k0 - 16 * tig[None, :] + 0 * srow[:, None]  # valid bytes from this chunk on
        flag = tl.where(left >= 16, 1, tl.where(left > 0, 2, 0))
        acc = mma_rows_tail(cptr + k0, sptr + (k0 // 64) * 1024, xptr + k0, acc, flag, RT)
    return mma_row_sums(acc)


@triton.jit
def mma_sum_parts(tot, R: tl.constexpr, NW: tl.constexpr, SK: tl.constexpr):
    """[R / SK] sums over the K-parts of ``mma_gemv`` tile-row sums ``tot`` [R], indexed by local row i
    (``mma_tile_rows``), in a fixed order that does not depend on the layout: SK = 2: ``p0 + p1``; SK = 4:
    ``(p0 + p1) + (p2 + p3)`` (elementwise adds after ``tl.split``; SK = 1 returns ``tot``)."""
    if SK == 1:
        return tot
    else:
        tl.static_assert(SK == 2 or SK == 4, "mma_sum_parts: SK must be 1, 2 or 4")
        WR: tl.constexpr = NW // SK
        t3 = tl.permute(tl.reshape(tot, [R // (8 * NW), SK, 8 * WR]), (0, 2, 1))  # [.., 8 WR, SK]
        if SK == 2:
            a, b = tl.split(t3)
            s = a + b
        else:
            even, odd = tl.split(tl.reshape(t3, [R // (8 * NW), 8 * WR, 2, 2]))  # part h = 2 h1 + h0
            pair = even + odd  # [.., 2]: (p0 + p1, p2 + p3)
            lo, hi = tl.split(pair)
            s = lo + hi
        return tl.reshape(s, [R // SK])


@triton.jit
def _decode_probe_kernel(codes_ptr, lo_ptr, hi_ptr, n, BLOCK: tl.constexpr, DECODE: tl.constexpr):
    """lo[i], hi[i] = E2M1 of the low / high nibble of codes[i] through ``decode_e2m1(DECODE)`` (tests)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    c = tl.load(codes_ptr + offs, mask=m, other=0)
    lo, hi = decode_e2m1(c, DECODE)
    tl.store(lo_ptr + offs, lo, mask=m)
    tl.store(hi_ptr + offs, hi, mask=m)


def decode_probe(codes, decode: int):
    """(lo, hi) fp32 tensors: ``decode_e2m1`` applied to uint8 ``codes`` (1-D, length a multiple of 4)."""
    import torch

    lo = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
    hi = torch.empty_like(lo)
    n = codes.numel()
    _decode_probe_kernel[(triton.cdiv(n, 256),)](codes, lo, hi, n, BLOCK=256, DECODE=decode, num_warps=1)
    return lo, hi
