"""The grouped NVFP4 GEMMs in Gluon (Triton's layout-explicit dialect) for sm_90: the weights dequantised
straight into the wgmma A-operand registers.

The Triton kernels (``grouped_gate_up`` / ``grouped_down``) dequantise a K step's weight tile in a blocked
layout and let the compiler move it into the wgmma A-fragment layout through shared memory (``st.shared`` +
``ldmatrix`` per step). Here the layouts are chosen so that no data moves between threads:

- The A fragment of ``wgmma.m64nNk16`` (bf16, registers) gives lane ``l`` of a warp the rows ``l / 4`` and
  ``l / 4 + 8`` of its 16-row slice and, per k16 group, the k slots ``2c, 2c + 1, 2c + 8, 2c + 9`` (c = l % 4).
  In NVFP4 those four codes are the two nibbles of byte ``c`` of the group's first code word (k 0..7) and of
  its second (k 8..15). So each thread loads the whole code words of its rows from shared memory (``P3``: a
  [rows, words, 4] layout whose last axis, the lane's ``c``, is not stored: the four lanes of a quad read the
  same words, a shared-memory broadcast) and keeps byte ``c`` of each: one ``prmt`` and the decode give the
  bf16 pair of slots (2c, 2c + 1) of that word, which is one A-fragment register as it stands.
- The scale of a k16 group is one E4M3 byte per row (``SCALE_WORD`` layout: a row's 4 block scales of 64 K in
  one aligned int32 word of the 128x4 swizzle); one asm call per word gives the 4 bf16 scales, each the broadcast
  operand (s, s) of its multiplies (``HMUL2 ... R.H0_H0``).
- Codes, scale words and the gathered token rows go through a ``cp.async`` ring of ``STAGES`` buffers; the
  token tile is the wgmma B operand in a 128-byte-swizzled (NVMMA) layout. Two CTA barriers per K step: the
  step's (its copies landed, the previous step done everywhere) and the compiler's between the refill's copies and
  the reads of the step's slot.

Values and order: the same weights (``E2M1 x E4M3``, exact in bf16, the decode kernels' shift / mask / ``mad``
sign trick and two exact ``mul.rn.bf16x2``) in the same A slots as the Triton kernels, the same
``wgmma.mma_async.m64nNk16.f32.bf16.bf16`` chain of k16 steps in increasing k from +0 per output element
(``orders.nvfp4_grouped_order``): bitwise the Triton kernels' accumulators (GPU test). Each step's wgmma is
waited for before the next step's dequantisation overwrites the A registers (a register operand may not change
while its wgmma is in flight). The epilogues are the Triton kernels' (``_rule``: rule steps 6-8).

Scope: sm_90 only (Gluon kernels do not run under the interpreter), row blocks of 16..128 pairs with or without
a tail (``moe_permute(..., tail)``: a second accumulator on the same A registers), reduction lengths that are
multiples of 64. Docs: docs/kernels/nvfp4-grouped.md, "Gluon main loop".
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from flint_moe.kernels._rule import bf16_rn, global_scale, swiglu
from flint_moe.kernels.audit.registry import BF16_CVT, register_audit

__all__ = ["GLUON_ROWS", "GLUON_WARPS", "EPILOGUE_SCRATCH", "gluon_bk", "gluon_stages", "gluon_layouts",
           "gluon_refusal", "check_gluon_launch", "launch_gluon_gate_up", "launch_gluon_down", "compile_gluon_sm90",
           "layout_constexprs", "audit_specs"]  # fmt: skip

#: Weight rows per program (one warpgroup, one m64 wgmma per k16 step) and warps: two such CTAs fit one SM
#: (<= 112 KiB of shared memory, <= 208 registers), so one's dequantisation overlaps the other's MMAs.
GLUON_ROWS = 64
GLUON_WARPS = 4
#: The gate/up epilogue's fp32 scratch [rows, pairs]: column-major, 8-element vectors, the swizzle phase moving every
#: 2 columns over 4 groups, so the wgmma-layout store and the one-lane-per-column loads (``ldmatrix.x4``) take one
#: wavefront per phase (``python -m benchmarks.smem_banks``; row-major: 18 x the ideal at 128 x 128, 32-way loads).
EPILOGUE_SCRATCH = gl.constexpr(gl.SwizzledSharedLayout(8, 2, 4, [0, 1]))

# One code word (8 codes, byte c = the lane's pair) and its block's scale -> the bf16x2 A register (E2M1 * scale)
# of slots (2c, 2c + 1): $2 word, $3 prmt selector 0x4440 | c, $4 the bf16 scale s (the pair (s, s) is an operand
# swizzle of the multiply, ``HMUL2 ... R.H0_H0``, not an instruction).
# t = byte c; t * 0x40040 puts its low nibble at bits 0..3 and its high nibble at bits 22..25 (the two copies
# do not overlap); the field masks, the sign carry (``mad`` by 63: bit 9 -> 15) and the 2^126 multiply are
# those of decode_ptx.DEQUANT_BF16_PTX.
_DEQUANT_PAIR = gl.constexpr("""
{
.reg .b32 t, v, s, p, k, q;
mov.b32 k, 0x7E807E80;
prmt.b32 t, $2, 0, $3;
mul.lo.u32 t, t, 0x40040;
and.b32 v, t, 0x03C003C0;
and.b32 s, t, 0x02000200;
mad.lo.u32 p, s, 63, v;
mul.rn.bf16x2 p, p, k;
mov.b32 q, {$4, $4};
mul.rn.bf16x2 p, p, q;
mov.b32 {$0, $1}, p;
}
""")

# One scale word (E4M3 bytes b0..b3, block scales of 4 consecutive k16 groups) -> the 4 bf16 scales b0..b3 (the
# halves of the two converted words: no instruction duplicates them into pairs).
# bf16 bits of an E4M3 byte: magnitude (b & 0x7F) << 4 and sign (b & 0x80) << 8 give E4M3 * 2^-120 exactly
# (E4M3 subnormals become bf16 subnormals), then one exact multiply by 2^120 (0x7B80). Bytes 0 and 2 are done
# in the two halves of one word (shift 4 / 8), bytes 1 and 3 in another (shift -4 / 0); lop3 0xE4 = z ? x : y.
_SCALE_PAIRS = gl.constexpr("""
{
.reg .b32 a, b, t, u, k;
mov.b32 k, 0x7B807B80;
shl.b32 a, $4, 4;
shl.b32 b, $4, 8;
lop3.b32 t, a, b, 0x7FFF7FFF, 0xE4;
and.b32 t, t, 0x87F087F0;
shr.b32 a, $4, 4;
lop3.b32 u, a, $4, 0x7FFF7FFF, 0xE4;
and.b32 u, u, 0x87F087F0;
mul.rn.bf16x2 t, t, k;
mul.rn.bf16x2 u, u, k;
mov.b32 {$0, $2}, t;
mov.b32 {$1, $3}, u;
}
""")


def gluon_bk(k: int) -> int:
    """K step: 128 where the reduction length ``k`` is a multiple of 128, else 64 (``k`` must be a multiple of
    64: :func:`check_gluon_launch`)."""
    return 128 if k % 128 == 0 else 64


def gluon_stages(block_m: int, bk: int) -> int:
    """``cp.async`` ring depth: as many K steps (2..4) as fit 110 KiB of shared memory (two CTAs per SM)."""
    per_stage = GLUON_ROWS * bk // 2 + GLUON_ROWS * bk // 16 + block_m * bk * 2
    return max(2, min(4, (110 * 1024) // per_stage))


def gluon_layouts(block_m: int, bk: int):
    """(P3, MMA, SW) layouts of a program of ``GLUON_ROWS`` weight rows, ``block_m`` pairs and K step ``bk``:
    P3 [rows, bk / 8 words, 4 lanes c] (module docstring; registers: row + 8, then the words; lanes: c, then the
    rows 0..7; warps: rows 16, 32), MMA the wgmma accumulator layout, SW [rows, bk / 64] for the scale words
    (the rows of P3, the lanes of a quad reading the same words)."""
    words = bk // 8
    reg = [[8, 0, 0]] + [[0, 1 << i, 0] for i in range(words.bit_length() - 1)]
    lanes = [[0, 0, 1], [0, 0, 2], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warps = [[16, 0, 0], [32, 0, 0]]
    p3 = gl.DistributedLinearLayout(reg_bases=reg, lane_bases=lanes, warp_bases=warps, block_bases=[],
                                    shape=[GLUON_ROWS, words, 4])  # fmt: skip
    mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[GLUON_WARPS, 1], instr_shape=[16, block_m, 16])
    sw = gl.DistributedLinearLayout(
        reg_bases=[[8, 0]] + [[0, 1 << i] for i in range((bk // 64).bit_length() - 1)],
        lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]], warp_bases=[[16, 0], [32, 0]], block_bases=[],
        shape=[GLUON_ROWS, bk // 64],
    )
    return p3, mma, sw


@gluon.jit
def _dequant(words, sw, csel, R: gl.constexpr, BK: gl.constexpr, P3: gl.constexpr, DOT: gl.constexpr):
    """Code words [R, BK/8] (layout slice 2 of P3) and scale words [R, BK/64] -> the bf16 A operand [R, BK] in
    the wgmma A-fragment layout ``DOT`` (register-only conversions)."""
    s0, s1, s2, s3 = gl.inline_asm_elementwise(_SCALE_PAIRS, "=h,=h,=h,=h,r", [sw],
                                               dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16),
                                               is_pure=True, pack=1)  # fmt: skip
    sg = gl.reshape(gl.join(gl.join(s0, s2), gl.join(s1, s3)), [R, BK // 16])  # group g's scale
    sc = gl.convert_layout(gl.reshape(gl.join(sg, sg), [R, BK // 8]), gl.SliceLayout(2, P3))  # word w: w // 2
    lo, hi = gl.inline_asm_elementwise(_DEQUANT_PAIR, "=h,=h,r,r,h", [words[:, :, None], csel, sc[:, :, None]],
                                       dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)  # fmt: skip
    return gl.convert_layout(gl.reshape(gl.join(lo, hi), [R, BK]), DOT)


@gluon.jit
def _half_mma(codes_s, scl_s, x_s, xt_s, acc, acc_t, csel, j: gl.constexpr, WITH_TAIL: gl.constexpr,
              P3: gl.constexpr, SW: gl.constexpr, DOT: gl.constexpr, DOT_T: gl.constexpr):  # fmt: skip
    """Sub-step ``j`` (64 K) of a K step in ring buffers ``codes_s`` [R, BK/8] / ``scl_s`` [R, BK/64] / ``x_s``
    [BM, BK] / ``xt_s``: dequantise its codes into the A fragment and issue (not wait for) its wgmma into
    ``acc`` and, WITH_TAIL, the tail rows' into ``acc_t``. Returns (a, acc, acc_t): the A registers stay live
    until the caller's wait."""
    R: gl.constexpr = codes_s.shape[0]
    a = _dequant(codes_s.slice(j * 8, 8, dim=1).load(gl.SliceLayout(2, P3)), scl_s.slice(j, 1, dim=1).load(SW),
                 csel, R, 64, P3, DOT)  # fmt: skip
    acc = hopper.warpgroup_mma(a, x_s.slice(j * 64, 64, dim=1).permute((1, 0)), acc, is_async=True)
    if WITH_TAIL:
        acc_t = hopper.warpgroup_mma(gl.convert_layout(a, DOT_T), xt_s.slice(j * 64, 64, dim=1).permute((1, 0)),
                                     acc_t, is_async=True)  # fmt: skip
    return a, acc, acc_t


@gluon.jit
def _mma_step(codes_s, scl_s, x_s, xt_s, acc, acc_t, csel, NSUB: gl.constexpr, WITH_TAIL: gl.constexpr,
              P3: gl.constexpr, SW: gl.constexpr, DOT: gl.constexpr, DOT_T: gl.constexpr):  # fmt: skip
    """One K step of ``NSUB`` (1 or 2) sub-steps of 64 K: sub-step 1 is dequantised while sub-step 0's wgmma
    runs; both are waited for at the end (their A registers are kept alive by the wait's dependencies, all in
    this step: none is in flight across the loop's back edge). Returns (acc, acc_t)."""
    a0, acc, acc_t = _half_mma(codes_s, scl_s, x_s, xt_s, acc, acc_t, csel, 0, WITH_TAIL, P3, SW, DOT, DOT_T)
    if NSUB == 2:
        a1, acc, acc_t = _half_mma(codes_s, scl_s, x_s, xt_s, acc, acc_t, csel, 1, WITH_TAIL, P3, SW, DOT, DOT_T)
        if WITH_TAIL:
            acc_t, a0, a1 = hopper.warpgroup_mma_wait(0, deps=[acc_t, a0, a1])
        acc, a0, a1 = hopper.warpgroup_mma_wait(0, deps=[acc, a0, a1])
    else:
        if WITH_TAIL:
            acc_t, a0 = hopper.warpgroup_mma_wait(0, deps=[acc_t, a0])
        acc, a0 = hopper.warpgroup_mma_wait(0, deps=[acc, a0])
    return acc, acc_t


@gluon.jit
def _issue_step(codes_s, scl_s, x_s, xt_s, w_ptrs, s_ptrs, x_ptrs, x_mask, xt_ptrs, xt_mask, TAIL: gl.constexpr):
    """Start the ``cp.async`` copies of one K step (code words, scale words, gathered operand rows, tail rows)
    into one ring slot (no commit)."""
    async_copy.async_copy_global_to_shared(codes_s, w_ptrs)
    async_copy.async_copy_global_to_shared(scl_s, s_ptrs)
    async_copy.async_copy_global_to_shared(x_s, x_ptrs, mask=x_mask)
    if TAIL > 0:
        async_copy.async_copy_global_to_shared(xt_s, xt_ptrs, mask=xt_mask)


@gluon.jit
def _k_steps(codes_s, scl_s, x_s, xt_s, w_ptrs, s_ptrs, x_ptrs, x_mask, xt_ptrs, xt_mask, acc, acc_t, csel,
             NK: gl.constexpr, NW: gl.constexpr, NS: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
             TAIL: gl.constexpr, WITH_TAIL: gl.constexpr, P3: gl.constexpr, SW: gl.constexpr, DOT: gl.constexpr,
             DOT_T: gl.constexpr):  # fmt: skip
    """The K loop of :func:`_k_loop` after its prologue: per step, wait for the step's copies, refill the slot
    of the previous step, then :func:`_mma_step`. Returns (acc, acc_t)."""
    for kk in range(NK):
        st = kk % STAGES
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()  # step kk landed for every thread; every thread is done with step kk - 1
        nk = kk + STAGES - 1
        if nk < NK:  # refill the slot of step kk - 1 (its wgmma was waited for before the barrier)
            ns = nk % STAGES
            _issue_step(codes_s.index(ns), scl_s.index(ns), x_s.index(ns), xt_s.index(ns), w_ptrs + nk * NW,
                        s_ptrs + nk * (NS * 128), x_ptrs + nk * BK, x_mask, xt_ptrs + nk * BK, xt_mask,
                        TAIL)  # fmt: skip
        async_copy.commit_group()
        acc, acc_t = _mma_step(codes_s.index(st), scl_s.index(st), x_s.index(st), xt_s.index(st), acc, acc_t, csel,
                               NS, WITH_TAIL, P3, SW, DOT, DOT_T)  # fmt: skip
    return acc, acc_t


@gluon.jit
def _k_loop(w_ptrs, s_ptrs, x_ptrs, x_mask, xt_ptrs, xt_mask, has_tail, K: gl.constexpr, BM: gl.constexpr,
            TAIL: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, P3: gl.constexpr, MMA: gl.constexpr,
            MMA_T: gl.constexpr, SW: gl.constexpr):  # fmt: skip
    """(acc fp32 [R, BM] (layout MMA), acc_t fp32 [R, max(TAIL, 16)] (layout MMA_T)): over K steps of ``BK`` in
    increasing order, wgmma(dequant(codes, scales), x^T) into ``acc`` and, where ``has_tail`` (TAIL > 0), the
    same dequantised tile times the tail rows' x^T into ``acc_t``. ``w_ptrs`` int32 [R, BK/8] code words of
    step 0, ``s_ptrs`` int32 [R, BK/64] scale words, ``x_ptrs`` bf16 [BM, BK] / ``xt_ptrs`` [TAIL, BK] gathered
    operand rows (masked rows read as 0). P3 / SW are the layouts of one 64-K sub-step (``gluon_layouts(BM,
    64)``)."""
    R: gl.constexpr = w_ptrs.shape[0]
    NW: gl.constexpr = BK // 8
    NS: gl.constexpr = BK // 64
    NK: gl.constexpr = K // BK
    codes_s = gl.allocate_shared_memory(gl.int32, [STAGES, R, NW], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    scl_s = gl.allocate_shared_memory(gl.int32, [STAGES, R, NS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], x_sl)
    TN: gl.constexpr = 16 if TAIL == 0 else TAIL
    if TAIL > 0:
        xt_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, TAIL, BK],
                                         gl.NVMMASharedLayout.get_default_for([TAIL, BK], gl.bfloat16))  # fmt: skip
    else:
        xt_s = x_s  # never read (no tail)
    DOT: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_T: gl.constexpr = gl.DotOperandLayout(0, MMA_T, 2)
    cidx = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, P3)))
    csel = (cidx | 0x4440)[None, None, :]
    for i in gl.static_range(STAGES - 1):
        if i < NK:  # a loop shorter than the ring reads nothing past its last step (an empty group keeps the count)
            _issue_step(codes_s.index(i), scl_s.index(i), x_s.index(i), xt_s.index(i), w_ptrs + i * NW,
                        s_ptrs + i * (NS * 128), x_ptrs + i * BK, x_mask, xt_ptrs + i * BK, xt_mask, TAIL)  # fmt: skip
        async_copy.commit_group()
    acc = gl.zeros([R, BM], gl.float32, layout=MMA)
    acc_t = gl.zeros([R, TN], gl.float32, layout=MMA_T)
    if TAIL > 0:
        if has_tail:  # one K loop per kind of block (uniform per program): the tail's wgmma on the same A
            acc, acc_t = _k_steps(codes_s, scl_s, x_s, xt_s, w_ptrs, s_ptrs, x_ptrs, x_mask, xt_ptrs, xt_mask, acc,
                                  acc_t, csel, NK, NW, NS, BK, STAGES, TAIL, True, P3, SW, DOT, DOT_T)  # fmt: skip
        else:
            acc, acc_t = _k_steps(codes_s, scl_s, x_s, xt_s, w_ptrs, s_ptrs, x_ptrs, x_mask, xt_ptrs, xt_mask, acc,
                                  acc_t, csel, NK, NW, NS, BK, STAGES, TAIL, False, P3, SW, DOT, DOT_T)  # fmt: skip
    else:
        acc, acc_t = _k_steps(codes_s, scl_s, x_s, xt_s, w_ptrs, s_ptrs, x_ptrs, x_mask, xt_ptrs, xt_mask, acc,
                              acc_t, csel, NK, NW, NS, BK, STAGES, TAIL, False, P3, SW, DOT, DOT_T)  # fmt: skip
    gl.thread_barrier()  # the epilogue's scratch may reuse the ring
    return acc, acc_t


@gluon.jit
def _tile_rows(q, n_rows, R: gl.constexpr, GATE_UP: gl.constexpr, layout: gl.constexpr):
    """Physical weight rows [R] (in ``layout``) of program column ``q``. Gate/up: the R / 2 up rows of
    intermediate columns ``q * R / 2 ..`` then their R / 2 gate rows (w1's 64-row [up; gate] interleave). Down:
    hidden rows ``q * R ..``, those at or past ``n_rows`` (H) clamped to row 0 (read, never stored)."""
    r = gl.arange(0, R, layout=layout)
    if GATE_UP:
        col = q * (R // 2) + r % (R // 2)
        return (col // 64) * 128 + col % 64 + (r // (R // 2)) * 64
    else:
        h = q * R + r
        return gl.where(h < n_rows, h, 0)


@gluon.jit
def _weight_ptrs(w_base, s_base, q, n_rows, ROW_WORDS: gl.constexpr, KP: gl.constexpr, R: gl.constexpr,
                 BK: gl.constexpr, GATE_UP: gl.constexpr):  # fmt: skip
    """Step-0 pointers of :func:`_k_loop` for program column ``q``: int32 code words [R, BK/8] (``w_base`` the
    expert's codes as int32 words, ``ROW_WORDS`` per row) and swizzled scale words [R, BK/64] (``s_base`` the
    expert's scales as int32 words; KP = the padded scale columns per row, a multiple of 4)."""
    NW: gl.constexpr = BK // 8
    NS: gl.constexpr = BK // 64
    NUM_W: gl.constexpr = gl.num_warps()
    cw_l: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (NW // 4), NW // 4], [NUM_W, 1], [1, 0])
    sw_l: gl.constexpr = gl.BlockedLayout([1, 1], [32 // NS, NS], [NUM_W, 1], [1, 0])
    r_c = _tile_rows(q, n_rows, R, GATE_UP, gl.SliceLayout(1, cw_l))
    w_ptrs = w_base + r_c.to(gl.int64)[:, None] * ROW_WORDS + gl.arange(0, NW, layout=gl.SliceLayout(0, cw_l))[None, :]
    r_s = _tile_rows(q, n_rows, R, GATE_UP, gl.SliceLayout(1, sw_l))
    s_off = ((r_s // 128) * (KP // 4 * 512) + (r_s % 32) * 16 + ((r_s % 128) // 32) * 4) // 4
    s_ptrs = s_base + s_off[:, None] + gl.arange(0, NS, layout=gl.SliceLayout(0, sw_l))[None, :] * 128
    return w_ptrs, s_ptrs


@gluon.jit
def _token_ptrs(src_ptr, order_ptr, pos0, end, TOPK: gl.constexpr, K: gl.constexpr, N: gl.constexpr,
                BK: gl.constexpr):  # fmt: skip
    """Step-0 pointers [N, BK] of the operand rows of positions ``pos0 ..`` of ``order`` and their mask
    (positions below ``end``): row ``order[pos]`` of ``src_ptr`` (TOPK > 0: token ``pair // TOPK`` of x;
    TOPK = 0: the pair's own row of act), K elements each."""
    NUM_W: gl.constexpr = gl.num_warps()
    # consecutive lanes copy consecutive 16-byte chunks of a row (coalesced); measured on the H200: one row per
    # thread (a single 64-bit row address, chunks at immediate offsets, 32 rows per warp instruction) made the
    # GEMMs 2.3x slower
    x_l: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BK // 8), BK // 8], [NUM_W, 1], [1, 0])
    pos = pos0 + gl.arange(0, N, layout=gl.SliceLayout(1, x_l))
    ok = pos < end
    pair = gl.load(order_ptr + pos, mask=ok, other=0)
    if TOPK > 0:
        row = (pair // TOPK).to(gl.int64)
    else:
        row = pair.to(gl.int64)
    return src_ptr + row[:, None] * K + gl.arange(0, BK, layout=gl.SliceLayout(0, x_l))[None, :], ok[:, None]


@gluon.jit
def _block_pairs(order_ptr, pos0, end, N: gl.constexpr, layout: gl.constexpr):
    """Pair ids (int64) [N] of positions ``pos0 ..`` of ``order`` in ``layout`` and their mask (< ``end``)."""
    pos = pos0 + gl.arange(0, N, layout=layout)
    ok = pos < end
    return gl.load(order_ptr + pos, mask=ok, other=0).to(gl.int64), ok


@gluon.jit
def _gate_up_store(acc, order_ptr, pos0, end, q, gs, act_ptr, gacc_ptr, uacc_ptr, INTER: gl.constexpr,
                   TAP: gl.constexpr):  # fmt: skip
    """Rule steps 6-7 on an accumulator [R, N] (R / 2 up rows, then their gate rows) of the pairs at positions
    ``pos0 ..``: ``act = swiglu(RN(g * gs), RN(u * gs))`` stored per (pair, column); TAP: g_acc / u_acc too. The
    accumulator goes through a shared scratch in :data:`EPILOGUE_SCRATCH` to one lane per intermediate column."""
    R: gl.constexpr = acc.shape[0]
    N: gl.constexpr = acc.shape[1]
    BC: gl.constexpr = R // 2
    epi_l: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, gl.num_warps()], [0, 1])
    epi_s = gl.allocate_shared_memory(gl.float32, [R, N], EPILOGUE_SCRATCH)
    epi_s.store(acc)
    gl.thread_barrier()
    acc_u = epi_s.slice(0, BC).load(epi_l)
    acc_g = epi_s.slice(BC, BC).load(epi_l)
    gl.thread_barrier()  # the scratch is reused by the next store
    pair, r_ok = _block_pairs(order_ptr, pos0, end, N, gl.SliceLayout(0, epi_l))
    cols = q * BC + gl.arange(0, BC, layout=gl.SliceLayout(1, epi_l))
    act = swiglu(global_scale(acc_g, gs), global_scale(acc_u, gs))
    off = pair[None, :] * INTER + cols[:, None]
    ok = (cols < INTER)[:, None] & r_ok[None, :]
    gl.store(act_ptr + off, act, mask=ok)
    if TAP:
        gl.store(gacc_ptr + off, acc_g, mask=ok)
        gl.store(uacc_ptr + off, acc_u, mask=ok)


@gluon.jit
def _down_store(acc, order_ptr, pos0, end, q, gs, y_ptr, dacc_ptr, H: gl.constexpr, TAP: gl.constexpr):
    """Rule step 8 on an accumulator [R, N] (hidden rows ``q * R ..``) of the pairs at positions ``pos0 ..``:
    ``y = bf16(RN(acc * gs))`` stored per (pair, row); TAP: the accumulator too."""
    R: gl.constexpr = acc.shape[0]
    N: gl.constexpr = acc.shape[1]
    epi_l: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, gl.num_warps()], [0, 1])
    acc = gl.convert_layout(acc, epi_l)
    pair, r_ok = _block_pairs(order_ptr, pos0, end, N, gl.SliceLayout(0, epi_l))
    h = q * R + gl.arange(0, R, layout=gl.SliceLayout(1, epi_l))
    y = bf16_rn(global_scale(acc, gs))
    off = pair[None, :] * H + h[:, None]
    ok = (h < H)[:, None] & r_ok[None, :]
    gl.store(y_ptr + off, y, mask=ok)
    if TAP:
        gl.store(dacc_ptr + off, acc, mask=ok)


@gluon.jit
def _gluon_gate_up_kernel(x_ptr, order_ptr, bexp_ptr, bstart_ptr, bend_ptr, w_ptr, s_ptr, alpha_ptr, act_ptr,
                          gacc_ptr, uacc_ptr, H: gl.constexpr, IP: gl.constexpr, INTER: gl.constexpr,
                          TOPK: gl.constexpr, BM: gl.constexpr, TAIL: gl.constexpr, BK: gl.constexpr,
                          STAGES: gl.constexpr, TAP: gl.constexpr, P3: gl.constexpr, MMA: gl.constexpr,
                          MMA_T: gl.constexpr, SW: gl.constexpr):  # fmt: skip
    """``_grouped_gate_up_kernel`` / ``_grouped_gate_up_rows_kernel``'s contract (arguments, grid
    ``(cdiv(I, R / 2), NB)``, rule steps 5-7, taps) with R = ``GLUON_ROWS`` weight rows (R / 2 intermediate
    columns) per program; row blocks of up to BM + TAIL pairs; H a multiple of BK."""
    R: gl.constexpr = P3.shape[0]
    KP: gl.constexpr = (H // 16 + 3) // 4 * 4
    MP: gl.constexpr = (2 * IP + 127) // 128 * 128
    q = gl.program_id(0)
    b = gl.program_id(1)
    e = gl.load(bexp_ptr + b).to(gl.int64)
    start = gl.load(bstart_ptr + b)
    end = gl.load(bend_ptr + b)
    if end > start:
        w_base = w_ptr.to(gl.pointer_type(gl.int32)) + e * (2 * IP * H // 8)
        s_base = (s_ptr + e * (MP * KP)).to(gl.pointer_type(gl.int32))
        w_ptrs, s_ptrs = _weight_ptrs(w_base, s_base, q, 0, H // 8, KP, R, BK, True)
        x_ptrs, x_ok = _token_ptrs(x_ptr, order_ptr, start, end, TOPK, H, BM, BK)
        xt_ptrs, xt_ok = _token_ptrs(x_ptr, order_ptr, start + BM, end, TOPK, H, max(TAIL, 16), BK)
        has_tail = end - start > BM
        acc, acc_t = _k_loop(w_ptrs, s_ptrs, x_ptrs, x_ok, xt_ptrs, xt_ok, has_tail, H, BM, TAIL, BK, STAGES, P3,
                             MMA, MMA_T, SW)  # fmt: skip
        gs = gl.load(alpha_ptr + e)
        _gate_up_store(acc, order_ptr, start, end, q, gs, act_ptr, gacc_ptr, uacc_ptr, INTER, TAP)
        if TAIL > 0:
            if has_tail:
                _gate_up_store(acc_t, order_ptr, start + BM, end, q, gs, act_ptr, gacc_ptr, uacc_ptr, INTER, TAP)


@gluon.jit
def _gluon_down_kernel(act_ptr, order_ptr, bexp_ptr, bstart_ptr, bend_ptr, w_ptr, s_ptr, alpha_ptr, y_ptr,
                       dacc_ptr, H: gl.constexpr, IP: gl.constexpr, INTER: gl.constexpr, BM: gl.constexpr,
                       TAIL: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, TAP: gl.constexpr,
                       P3: gl.constexpr, MMA: gl.constexpr, MMA_T: gl.constexpr, SW: gl.constexpr):  # fmt: skip
    """``_grouped_down_kernel`` / ``_grouped_down_rows_kernel``'s contract (grid ``(cdiv(H, R), NB)``, rule step
    8, y per pair, tap ``down_acc``) with R = ``GLUON_ROWS`` hidden rows per program; INTER a multiple of BK."""
    R: gl.constexpr = P3.shape[0]
    KP: gl.constexpr = (IP // 16 + 3) // 4 * 4
    MP: gl.constexpr = (H + 127) // 128 * 128
    q = gl.program_id(0)
    b = gl.program_id(1)
    e = gl.load(bexp_ptr + b).to(gl.int64)
    start = gl.load(bstart_ptr + b)
    end = gl.load(bend_ptr + b)
    if end > start:
        w_base = w_ptr.to(gl.pointer_type(gl.int32)) + e * (H * IP // 8)
        s_base = (s_ptr + e * (MP * KP)).to(gl.pointer_type(gl.int32))
        w_ptrs, s_ptrs = _weight_ptrs(w_base, s_base, q, H, IP // 8, KP, R, BK, False)
        a_ptrs, a_ok = _token_ptrs(act_ptr, order_ptr, start, end, 0, INTER, BM, BK)
        at_ptrs, at_ok = _token_ptrs(act_ptr, order_ptr, start + BM, end, 0, INTER, max(TAIL, 16), BK)
        has_tail = end - start > BM
        acc, acc_t = _k_loop(w_ptrs, s_ptrs, a_ptrs, a_ok, at_ptrs, at_ok, has_tail, INTER, BM, TAIL, BK, STAGES,
                             P3, MMA, MMA_T, SW)  # fmt: skip
        gs = gl.load(alpha_ptr + e)
        _down_store(acc, order_ptr, start, end, q, gs, y_ptr, dacc_ptr, H, TAP)
        if TAIL > 0:
            if has_tail:
                _down_store(acc_t, order_ptr, start + BM, end, q, gs, y_ptr, dacc_ptr, H, TAP)


def gluon_refusal(perm, k: int) -> str | None:
    """Why the Gluon GEMMs cannot serve this launch, or None: they need a CUDA device of compute capability 9.x
    (no interpreter path), row blocks of 16..128 pairs and a reduction length ``k`` that is a multiple of 64 and at
    least two K steps (``gluon_bk``) long."""
    from flint_moe.kernels._launch import INTERPRET

    dev = perm.order.device
    if INTERPRET or dev.type != "cuda" or torch.cuda.get_device_capability(dev)[0] != 9:
        return "needs an sm_90 GPU (no interpreter path)"
    if perm.block_m not in (16, 32, 64, 128):
        return f"needs row blocks of 16..128 pairs (BM <= 128), got BM {perm.block_m}"
    if k % 64:
        return f"needs a reduction length that is a multiple of 64, got {k}"
    if k < 2 * gluon_bk(k):  # a one-step K loop does not compile (Triton 3.6, ConvertTritonGPUToLLVM)
        return f"needs at least two K steps of {gluon_bk(k)} (a reduction length >= {2 * gluon_bk(k)}), got {k}"
    return None


def check_gluon_launch(name: str, perm, k: int) -> None:
    """ValueError naming the constraint unless the Gluon GEMMs serve this launch (:func:`gluon_refusal`)."""
    why = gluon_refusal(perm, k)
    if why is not None:
        raise ValueError(f"{name}: config ENGINE 'gluon' {why}")


def _meta(block_m: int, tail: int, k: int, stages: int | None = None) -> dict:
    bk = gluon_bk(k)
    p3, mma, sw = gluon_layouts(block_m, 64)
    mma_t = gluon_layouts(max(tail, 16), bk)[1]
    stages = stages or gluon_stages(block_m + tail, bk)
    return {"BM": block_m, "TAIL": tail, "BK": bk, "STAGES": stages, "P3": p3,
            "MMA": mma, "MMA_T": mma_t, "SW": sw, "num_warps": GLUON_WARPS}  # fmt: skip


def launch_gluon_gate_up(x, perm, w1, w1_scales, w1_alpha, act, gacc, uacc, *, H, IP, INTER, TOPK, TAP,
                         stages=None) -> None:  # fmt: skip
    """Launch :func:`_gluon_gate_up_kernel` on checked operands (``nvfp4_grouped_gate_up`` with ENGINE 'gluon',
    after :func:`check_gluon_launch`); ``stages`` None: :func:`gluon_stages`."""
    grid = (triton.cdiv(INTER, GLUON_ROWS // 2), perm.num_blocks)
    _gluon_gate_up_kernel[grid](x, perm.order, perm.block_expert, perm.block_start, perm.block_end, w1, w1_scales,
                                w1_alpha, act, gacc, uacc, H=H, IP=IP, INTER=INTER, TOPK=TOPK, TAP=TAP,
                                **_meta(perm.block_m, perm.tail, H, stages))  # fmt: skip


def launch_gluon_down(act, perm, w2, w2_scales, w2_alpha, y, dacc, *, H, IP, INTER, TAP, stages=None) -> None:
    """Launch :func:`_gluon_down_kernel` on checked operands (``nvfp4_grouped_down`` with ENGINE 'gluon')."""
    grid = (triton.cdiv(H, GLUON_ROWS), perm.num_blocks)
    _gluon_down_kernel[grid](act, perm.order, perm.block_expert, perm.block_start, perm.block_end, w2, w2_scales,
                             w2_alpha, y, dacc, H=H, IP=IP, INTER=INTER, TAP=TAP,
                             **_meta(perm.block_m, perm.tail, INTER, stages))  # fmt: skip


def _build_args(kind: str, H: int, I: int, k: int, block_m: int, tap: bool = False, tail: int = 0):  # noqa: N803, E741
    """(kernel, signature, constexprs, num_warps) of the launchers' build of ``kind`` ("gate_up" / "down") at shapes
    (H, I, top_k), row block ``block_m`` + ``tail`` (pointer arguments typed as a launch on torch tensors types
    them; the block arrays int32)."""
    ip = (I + 63) // 64 * 64
    tap_t = "*fp32" if tap else "*bf16"  # an untapped launch passes its bf16 output for the (unused) tap pointers
    if kind == "gate_up":
        kern = _gluon_gate_up_kernel
        ptrs = {"x_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32", "act_ptr": "*bf16",
                "gacc_ptr": tap_t, "uacc_ptr": tap_t}  # fmt: skip
        consts = {"H": H, "IP": ip, "INTER": I, "TOPK": k, "TAP": tap, **_meta(block_m, tail, H)}
    elif kind == "down":
        kern = _gluon_down_kernel
        ptrs = {"act_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32", "y_ptr": "*bf16",
                "dacc_ptr": tap_t}  # fmt: skip
        consts = {"H": H, "IP": ip, "INTER": I, "TAP": tap, **_meta(block_m, tail, I)}
    else:
        raise ValueError(f"compile_gluon_sm90: kind must be 'gate_up' or 'down', got {kind!r}")
    num_warps = consts.pop("num_warps")
    sig = {a: ptrs.get(a, "*i32") for a in kern.arg_names if a not in consts}
    return kern, sig, consts, num_warps


def compile_gluon_sm90(kind: str, H: int, I: int, k: int, block_m: int, tap: bool = False, tail: int = 0):  # noqa: N803, E741
    """The ``triton.compile`` result of the gate/up (``kind`` "gate_up") or down ("down") Gluon kernel for sm_90a,
    on any machine (no GPU needed): shapes (H, I, top_k), row block ``block_m``, the launchers' meta-parameters,
    pointer arguments 16-byte aligned as a launch on torch tensors specialises them."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kern, ptr_sig, consts, num_warps = _build_args(kind, H, I, k, block_m, tap, tail)
    sig = {a: ("constexpr" if a in consts else ptr_sig[a]) for a in kern.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kern.arg_names) if sig[a].startswith("*")}
    src = GluonASTSource(fn=kern, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def layout_constexprs(consts: dict) -> dict:
    """The layout constexprs (P3, MMA, MMA_T, SW) of a launch whose other constexprs are ``consts`` (BM, TAIL, BK),
    as the launchers make them: the sm_90 audit rebuilds a recorded launch's layouts from them."""
    p3, mma, sw = gluon_layouts(consts["BM"], 64)
    return {"P3": p3, "MMA": mma, "MMA_T": gluon_layouts(max(consts["TAIL"], 16), consts["BK"])[1], "SW": sw}


#: (H, I, k, BM, TAIL) builds audited for sm_90 (the default engine at row blocks of 16 pairs, DeepSeek-V3); the
#: conformance matrix's other launches are audited with these instruction lists (``flint_moe.conformance.audit``).
GLUON_AUDIT_CASES = [(7168, 2048, 8, 16, 0), (7168, 2048, 8, 16, 16)]
#: Instructions the audit requires: the rule's (bf16 conversion, SwiGLU's rcp / ex2 in gate/up), the exact
#: ``mul.rn.bf16x2`` dequantisation and the tensor cores (wgmma).
GLUON_AUDIT_REQUIRE = {"gate_up": [BF16_CVT, "rcp.approx.ftz.f32", "ex2.approx.ftz.f32", "mul.rn.bf16x2",
                                   "wgmma.mma_async"],
                       "down": [BF16_CVT, "mul.rn.bf16x2", "wgmma.mma_async"]}  # fmt: skip


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of both Gluon GEMMs at ``GLUON_AUDIT_CASES`` (production builds)."""
    names = []
    for kind in ("gate_up", "down"):
        for h, i, k, bm, tail in GLUON_AUDIT_CASES:
            kern, sig, consts, warps = _build_args(kind, h, i, k, bm, False, tail)
            names.append(register_audit(f"nvfp4_gluon_{kind}.H{h}.I{i}.BM{bm}+{tail}", kern, sig, consts,
                                        GLUON_AUDIT_REQUIRE[kind], options={"num_warps": warps}).name)  # fmt: skip
    return names


audit_specs()
