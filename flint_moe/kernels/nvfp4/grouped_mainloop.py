"""The main loop of the NVFP4 grouped GEMMs: the Triton device functions that ``nvfp4_grouped_gate_up``,
``nvfp4_grouped_down`` and the per-token FC1 / FC2 GEMMs share.

- ``row_block`` / ``tail_rows``: a row block of ``moe_permute``'s schedule (and the tail of an expert-wide one);
- ``dequant_tile``: NVFP4 code words and E4M3 scale bytes -> the exact dequantised weights ``E2M1 x E4M3``;
- ``scale_words``: a K step's swizzled scales loaded as one int32 word per row per 64 K (``SCALE_WORD``);
- ``mma``: ``acc + w . xt`` with fp32 accumulation (wgmma on sm_90; under the interpreter an exact-product sum
  in increasing k order, ``_kdot*``);
- ``k_loop`` / ``k_loop_tail``: K steps of ``BK`` in increasing order, each ``mma(dequant_tile(...), act^T)``
  into one fp32 accumulator (two, for an expert-wide row block, from one weight tile per step).

The summation order each kernel declares is that of ``k_loop`` (docs/kernels/nvfp4-grouped.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET
from flint_moe.kernels.nvfp4.decode_ptx import DEQUANT_BF16_PTX, asm8, decode_e2m1_words, join4
from flint_moe.kernels.nvfp4.scales import e4m3_to_f32, swizzled_scale_offsets

__all__ = ["dequant_tile", "mma", "row_block", "tail_rows", "scale_words", "k_loop", "k_loop_tail"]

_INTERPRET = tl.constexpr(INTERPRET)


# DECODE = 3 (GPU): ``decode_ptx.DEQUANT_BF16_PTX``, one asm call per code word (8 codes) -> 8 bf16 weights.


@triton.jit
def _join8(o0, o1, o2, o3, o4, o5, o6, o7):
    """[..., 8] with [..., t] = o_t (``tl.join`` interleaves: join(P, Q)[2i + s] = (P, Q)[s][i])."""
    return tl.join(tl.join(tl.join(o0, o4), tl.join(o2, o6)), tl.join(tl.join(o1, o5), tl.join(o3, o7)))


@triton.jit
def dequant_tile(words, sb, R: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr):
    """NVFP4 codes as int32 words [R, BK/8] (word i = code bytes 4i..4i+3 of the row, low nibble = even
    element) and E4M3 scale bytes [R, BK/16] (int32) -> the exact dequantised weights ``E2M1 * E4M3`` [R, BK]:
    fp32 under the interpreter, bf16 on the GPU (every value and product is exact in both)."""
    if DECODE == 3 and not _INTERPRET:
        sc16 = e4m3_to_f32(sb).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        sc2 = tl.reshape(tl.join(sc16, sc16), [R, BK // 8]) * 0x10001  # word 2c, 2c + 1: block c's scale
        o0, o1, o2, o3, o4, o5, o6, o7 = asm8(words, sc2, DEQUANT_BF16_PTX, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", tl.bfloat16)
        return tl.reshape(_join8(o0, o1, o2, o3, o4, o5, o6, o7), [R, BK])
    l0, l1, l2, l3, h0, h1, h2, h3 = decode_e2m1_words(words, 2 if DECODE == 3 else DECODE)
    lo = tl.reshape(join4(l0, l1, l2, l3), [R, BK // 2])
    hi = tl.reshape(join4(h0, h1, h2, h3), [R, BK // 2])
    sc = e4m3_to_f32(sb)
    if _INTERPRET:
        w = tl.reshape(tl.join(lo, hi), [R, BK // 16, 16]) * sc[:, :, None]
    else:  # bf16 operands and product: every value and the product are exact in bf16 (halves the registers)
        w = tl.reshape(tl.join(lo.to(tl.bfloat16), hi.to(tl.bfloat16)), [R, BK // 16, 16])
        w = w * sc.to(tl.bfloat16)[:, :, None]
    return tl.reshape(w, [R, BK])


@triton.jit
def mma(w, xt, acc):
    """``acc + w . xt`` with fp32 accumulation: GPU ``tl.dot`` on bf16 (wgmma); interpreter (INTERPRETER SHIM:
    Triton 3.6's interpreter multiplies bf16 bit patterns as integers, and numpy's fp32 matmul sums an element
    in an order that depends on the matrix shape and the element's column): the exact fp32 products summed
    in increasing k order in fp32 (round-to-nearest; a sum over the outermost axis, one [R, N] slice after
    the other), then added to ``acc``: each element's arithmetic is independent of the tile's shape, as the
    hardware's k16 chain is on the GPU."""
    if _INTERPRET:
        return acc + _kdot_rows4(w, xt.to(tl.float32))
    else:
        return tl.dot(w, xt, acc)


@triton.jit
def _kdot(w, xt):
    """Interpreter: fp32 [R, BK] . [BK, N] -> [R, N], each element's exact products summed in increasing k
    (numpy's sum over the outermost axis adds one [R, N] slice after the other)."""
    return tl.sum(tl.trans(w)[:, :, None] * xt[:, None, :], axis=0)


@triton.jit
def _join_rows(a, b):
    """[R, N] and [R, N] -> [2R, N]: the rows of ``a``, then those of ``b`` (no arithmetic)."""
    return tl.reshape(tl.permute(tl.join(a, b), (2, 0, 1)), [2 * a.shape[0], a.shape[1]])


@triton.jit
def _kdot_rows2(w, xt):
    """:func:`_kdot`, the rows in two halves where the [BK, R, N] products would exceed Triton's 2^20 elements
    per tensor (a row split leaves every element's arithmetic as it is)."""
    if w.shape[0] * w.shape[1] * xt.shape[1] > 1048576:
        lo, hi = tl.split(tl.permute(tl.reshape(w, [2, w.shape[0] // 2, w.shape[1]]), (1, 2, 0)))
        return _join_rows(_kdot(lo, xt), _kdot(hi, xt))
    else:
        return _kdot(w, xt)


@triton.jit
def _kdot_rows4(w, xt):
    """:func:`_kdot_rows2` of each half of the rows where one split is not enough (up to 2^22 products)."""
    if w.shape[0] * w.shape[1] * xt.shape[1] > 2097152:
        lo, hi = tl.split(tl.permute(tl.reshape(w, [2, w.shape[0] // 2, w.shape[1]]), (1, 2, 0)))
        return _join_rows(_kdot_rows2(lo, xt), _kdot_rows2(hi, xt))
    else:
        return _kdot_rows2(w, xt)


@triton.jit
def row_block(bexp_ptr, bstart_ptr, bend_ptr, b, BM: tl.constexpr):
    """Row block ``b`` of the schedule (``moe_permute``): (its expert, int64; start and end positions in
    ``order``; the BM positions from start; the mask of those below end)."""
    e = tl.load(bexp_ptr + b).to(tl.int64)
    start = tl.load(bstart_ptr + b)
    end = tl.load(bend_ptr + b)
    pos = start + tl.arange(0, BM)
    return e, start, end, pos, pos < end


@triton.jit
def scale_words(s_base, srow, w_ok, k0, K: tl.constexpr, KP: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr):
    """The E4M3 scale bytes [ROWS, BK/16] (int32 0..255) of the K step at ``k0`` (a multiple of ``BK``, itself a
    multiple of 64), loaded as one int32 word per row per 64 K: the 128x4 swizzle keeps a row's scale columns
    4g..4g+3 in 4 contiguous, 4-byte-aligned bytes (``swizzled_scale_offsets`` with c % 4 = 0; byte c % 4 of the
    little-endian word is column c). Columns >= K / 16 (a partial last step, the padding to KP) read as 0."""
    kg = k0 // 64 + tl.arange(0, BK // 64)
    off = swizzled_scale_offsets(srow[:, None], kg[None, :] * 4, KP) // 4
    if K % BK == 0:
        wmask = w_ok[:, None]
    else:
        wmask = w_ok[:, None] & (kg < KP // 4)[None, :]
    words = tl.load(s_base.to(tl.pointer_type(tl.int32)) + off, mask=wmask, other=0)
    sb = tl.reshape(words[:, :, None] >> (8 * tl.arange(0, 4))[None, None, :], [ROWS, BK // 16]) & 0xFF
    if K % BK != 0:
        kc = k0 // 16 + tl.arange(0, BK // 16)
        sb = tl.where((kc < K // 16)[None, :], sb, 0)
    return sb


@triton.jit
def k_loop(acc, w_row, s_base, a_row, srow, w_ok, r_ok, K: tl.constexpr, KP: tl.constexpr, ROWS: tl.constexpr,
           BK: tl.constexpr, DECODE: tl.constexpr, SW: tl.constexpr = False):  # fmt: skip
    """The main loop of both grouped GEMMs: ``acc`` fp32 [ROWS, BM] plus, for K steps of ``BK`` in increasing
    order, ``mma(dequant_tile(codes, scales), activations^T)`` (module docstrings: the summation order).

    ``w_row`` int32 pointers [ROWS] to each weight row's code words, ``s_base`` the expert's swizzled scales,
    ``srow`` [ROWS] the rows' scale rows, ``a_row`` pointers [BM] to each pair's activation row (length K);
    ``w_ok`` [ROWS] / ``r_ok`` [BM] mask weight rows / pairs. Masks along K only when ``K % BK`` != 0. ``SW``:
    the scales as one int32 word per row per 64 K (:func:`scale_words`; ``BK`` a multiple of 64), else byte by
    byte; the same scale values either way."""
    for k0 in tl.range(0, K, BK):
        kw = k0 // 8 + tl.arange(0, BK // 8)
        kc = k0 // 16 + tl.arange(0, BK // 16)
        kx = k0 + tl.arange(0, BK)
        if K % BK == 0:  # masks constant along K: vector loads
            wmask = w_ok[:, None]
            amask = r_ok[:, None]
        else:
            wmask = w_ok[:, None] & (kw < K // 8)[None, :]
            amask = r_ok[:, None] & (kx < K)[None, :]
        words = tl.load(w_row[:, None] + kw[None, :], mask=wmask, other=0)
        if SW:
            sb = scale_words(s_base, srow, w_ok, k0, K, KP, ROWS, BK)
        else:
            sb = tl.load(
                s_base + swizzled_scale_offsets(srow[:, None], kc[None, :], KP),
                mask=w_ok[:, None] & (kc < K // 16)[None, :],
                other=0,
            )
        at = tl.load(a_row[:, None] + kx[None, :], mask=amask, other=0.0)
        acc = mma(dequant_tile(words, sb.to(tl.int32), ROWS, BK, DECODE), tl.trans(at), acc)
    return acc


@triton.jit
def k_loop_tail(acc, acc_t, w_row, s_base, a_row, a_row_t, srow, w_ok, r_ok, t_ok, K: tl.constexpr,
                KP: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr,
                SW: tl.constexpr = False):  # fmt: skip
    """:func:`k_loop` for an expert-wide row block: ``acc`` fp32 [ROWS, BM] over the pairs ``a_row`` / ``r_ok``
    and ``acc_t`` fp32 [ROWS, TAIL] over the tail pairs ``a_row_t`` / ``t_ok``; each K step's dequantised
    weight tile is computed once and multiplied into both (two ``tl.dot``, the same k16 chain per element as
    :func:`k_loop`: per output element, K steps of ``BK`` in increasing order into its own accumulator)."""
    for k0 in tl.range(0, K, BK):
        kw = k0 // 8 + tl.arange(0, BK // 8)
        kc = k0 // 16 + tl.arange(0, BK // 16)
        kx = k0 + tl.arange(0, BK)
        if K % BK == 0:  # masks constant along K: vector loads
            wmask = w_ok[:, None]
            amask = r_ok[:, None]
            tmask = t_ok[:, None]
        else:
            wmask = w_ok[:, None] & (kw < K // 8)[None, :]
            amask = r_ok[:, None] & (kx < K)[None, :]
            tmask = t_ok[:, None] & (kx < K)[None, :]
        words = tl.load(w_row[:, None] + kw[None, :], mask=wmask, other=0)
        if SW:
            sb = scale_words(s_base, srow, w_ok, k0, K, KP, ROWS, BK)
        else:
            sb = tl.load(
                s_base + swizzled_scale_offsets(srow[:, None], kc[None, :], KP),
                mask=w_ok[:, None] & (kc < K // 16)[None, :],
                other=0,
            )
        at = tl.load(a_row[:, None] + kx[None, :], mask=amask, other=0.0)
        att = tl.load(a_row_t[:, None] + kx[None, :], mask=tmask, other=0.0)
        w = dequant_tile(words, sb.to(tl.int32), ROWS, BK, DECODE)
        acc = mma(w, tl.trans(at), acc)
        acc_t = mma(w, tl.trans(att), acc_t)
    return acc, acc_t


@triton.jit
def tail_rows(order_ptr, start, end, BM: tl.constexpr, TAIL: tl.constexpr):
    """The tail of an expert-wide row block (``moe_permute(..., tail=TAIL)``): pair ids [TAIL] of positions
    ``start + BM + i`` (0 where masked), their mask (positions below ``end``), and whether any is used."""
    pos_t = start + BM + tl.arange(0, TAIL)
    t_ok = pos_t < end
    pair_t = tl.load(order_ptr + pos_t, mask=t_ok, other=0)
    return pair_t, t_ok, end - start > BM
