"""The CUDA-core path of the NVFP4 decode GEMVs (the non-``MMA`` configurations of ``nvfp4_gate_up`` /
``nvfp4_down``): its loads, the block dot product and its one K loop, ``cuda_core_row_sums``.

Block dot product (the grouping of rule "Accumulation": sum inside a 16-element block, then the scale)
----------------------------------------------------------------------------------------------------------
``block_partials(codes, xw)``: ``codes`` uint8 [R, B] (B code bytes = 2B elements of each of R rows),
``xw`` int32 [B] (the activation as bf16 pairs: word i holds elements 2i (low half) and 2i+1 (high half)).
Returns fp32 [R, B / 8]: for each 16-element block, ``sum_{q=0..15} E2M1(code_q) * x_q`` summed sequentially
in element order (``s = c_0 x_0; s = s + c_q x_q`` for q = 1..15; every product of an E2M1 value and a bf16
value is exact in fp32, so it does not matter whether the compiler fuses a product into the add). The K loop
multiplies each block partial by its E4M3 scale with one ``fma`` into its accumulator.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET
from flint_moe.kernels.nvfp4.decode_ptx import decode_e2m1
from flint_moe.kernels.nvfp4.scales import e4m3_to_f32, swizzled_scale_offsets

__all__ = ["load_words", "load_bytes", "block_partials", "cuda_core_row_sums"]

_INTERPRET = tl.constexpr(INTERPRET)


@triton.jit
def load_words(ptrs, mask):
    """int32 loads of ``ptrs`` (int32 pointers), ``0`` where ``mask`` is False.

    GPU: inline ``ld.global.nc.v4.b32`` on groups of 4 consecutive elements of a thread (``pack=4``; the
    caller guarantees each group is 4 consecutive, 16-byte aligned words whose mask is uniform, and passes
    in-bounds pointers: masked groups are read from a clamped address and zeroed). Unlike ``tl.load``, an
    inline load keeps the layout of its pointer tensor, so the activation words land in the weight tile's
    layout with no shared-memory round trip. Interpreter: ``tl.load``.
    """
    if not _INTERPRET:
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
def load_bytes(ptrs, mask):
    """uint8 loads (as int32 0..255), ``0`` where ``mask`` is False (pointers must be in bounds).

    GPU: inline ``ld.global.nc.u8`` per element (keeps the pointer tensor's layout, see ``load_words``).
    Interpreter: ``tl.load``.
    """
    if not _INTERPRET:
        v = tl.inline_asm_elementwise("ld.global.nc.u8 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=True, pack=1)
        return tl.where(mask, v, 0)
    else:
        return tl.load(ptrs, mask=mask, other=0).to(tl.int32)


@triton.jit
def block_partials(codes, xw, R: tl.constexpr, B: tl.constexpr):
    """fp32 [R, B // 8]: per 16-element block, sum of E2M1(code) * x in element order (module docstring)."""
    lo, hi = decode_e2m1(codes)
    xe = (xw << 16).to(tl.float32, bitcast=True)
    xo = (xw & -65536).to(tl.float32, bitcast=True)
    prod = tl.join(lo * xe[None, :], hi * xo[None, :])  # [R, B, 2]: element 2i, 2i + 1
    prod = tl.reshape(prod, [R, B // 8, 16])
    return tl.sum(prod, axis=2)


@triton.jit
def cuda_core_row_sums(
    w_row,
    s_row,
    srow,
    x_row,
    row_ok,
    K: tl.constexpr,
    KP: tl.constexpr,
    R: tl.constexpr,
    BKB: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """fp32 [R]: the dot products of R weight rows with one activation row, in the CUDA-core summation order.

    ``w_row`` uint8 pointers [R] to each row's codes (K code bytes = 2K elements per row), ``s_row`` uint8
    pointer to the expert's 128x4-swizzled scales (KP = roundup(K / 8, 4) scale columns), ``srow`` int32 [R]
    the rows' physical indices in that swizzle (in range also where ``row_ok`` is False), ``x_row`` int32
    pointer to the activation row (bf16 pairs), ``row_ok`` bool [R] (False: the row adds zeros and is never
    read). ``PREFETCH``: load step s + 1's codes and scales before step s's arithmetic (register double
    buffer; scheduling only, the same order).

    Summation order (one row; element i, block b = i // 16, byte i // 2): the tile covers ``BKB`` bytes
    (``BKB / 8`` blocks) of the row per K step; a thread holds 16 consecutive bytes (blocks 2L, 2L + 1 of the
    step, lane L = 0..BKB/16 - 1 of the row's warp-slice) and keeps one fp32 accumulator per block slot. For
    each block: ``s = sum_{q=0..15} E2M1(code) * x`` sequentially in element order (exact products), then
    ``acc[slot] = fma(s, scale_b, acc[slot])`` (starting from +0), for the K steps in increasing order. The
    last step may be partial (K not a multiple of ``BKB``): its missing blocks add exact zeros. Then
    ``tl.sum`` over the step's ``BKB / 8`` slots: each thread adds its two slots (slot 2L + 1 to slot 2L), then
    a butterfly across the ``BKB / 16`` lanes (xor 16, 8, 4, 2, 1, as many as the lanes span; every lane ends
    with the same bits). Bound: block model (B = 16) of ``flint_moe.reference.exact`` (the fma makes the scale
    multiply and the outer add one rounding).
    """
    NB: tl.constexpr = BKB // 8  # blocks per K step
    FULL: tl.constexpr = K // BKB * BKB  # bytes covered by full K steps
    s_off = swizzled_scale_offsets(srow[:, None], tl.arange(0, NB)[None, :], KP)  # scale offsets of step 0
    acc = tl.full([R, NB], 0.0, tl.float32)
    ar = tl.arange(0, BKB)
    if PREFETCH and FULL > 0:
        codes = tl.load(w_row[:, None] + ar[None, :], mask=row_ok[:, None], other=0)
        sb = load_bytes(s_row + s_off + 0, row_ok[:, None])
        for k0 in tl.range(BKB, FULL, BKB):
            codes_n = tl.load(w_row[:, None] + (k0 + ar)[None, :], mask=row_ok[:, None], other=0)
            sb_n = load_bytes(s_row + s_off + (k0 // 32) * 512, row_ok[:, None])
            xw = load_words(x_row + (k0 - BKB) + ar, ar >= 0)
            part = block_partials(codes, xw, R, BKB)
            acc = tl.fma(part, e4m3_to_f32(sb), acc)
            codes = codes_n
            sb = sb_n
        xw = load_words(x_row + (FULL - BKB) + ar, ar >= 0)
        part = block_partials(codes, xw, R, BKB)
        acc = tl.fma(part, e4m3_to_f32(sb), acc)
    else:
        for k0 in tl.range(0, FULL, BKB):
            codes = tl.load(w_row[:, None] + (k0 + ar)[None, :], mask=row_ok[:, None], other=0)
            sb = load_bytes(s_row + s_off + (k0 // 32) * 512, row_ok[:, None])
            xw = load_words(x_row + k0 + ar, ar >= 0)
            part = block_partials(codes, xw, R, BKB)
            acc = tl.fma(part, e4m3_to_f32(sb), acc)
    if FULL < K:  # partial last step: masked groups read clamped (in-bounds) addresses and are zeroed
        kb = FULL + ar
        cb = FULL // 8 + tl.arange(0, NB)
        k_ok = kb < K
        c_ok = cb < K // 8
        codes = tl.load(w_row[:, None] + kb[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0)
        xw = load_words(x_row + kb % K, k_ok)
        sb = load_bytes(
            s_row + swizzled_scale_offsets(srow[:, None], (cb % (K // 8))[None, :], KP),
            row_ok[:, None] & c_ok[None, :],
        )
        part = block_partials(codes, xw, R, BKB)
        acc = tl.fma(part, e4m3_to_f32(sb), acc)
    return tl.sum(acc, axis=1)
