"""The grouped NVFP4 GEMMs (gate/up and down) in Gluon for sm_90, warp-specialised: a producer partition feeds
an mbarrier ring, two consumer warpgroups dequantise into the wgmma A registers and multiply.

Structure (docs/kernels/nvfp4-grouped.md, "Warp-specialised Gluon GEMMs"): programs of 128 weight rows (gate/up: one w1
interleave group, 64 up rows then their 64 gate rows; down: 128 hidden rows) and BM pairs. A producer partition of 4
warps issues every ``cp.async`` of a K step (code words, scale words, the gathered token rows) into a ring of ``STAGES``
slots and signals the slot's ``full`` mbarrier when its copies land (``cp.async.mbarrier.arrive.noinc``: 128 arrivals);
the default partition, two consumer warpgroups of 64 rows each, waits for ``full``, dequantises its rows straight into
the wgmma A registers (``grouped_gluon._half_mma``: two 64-K halves, the second dequantised under the first's wgmma) and
issues the wgmma against the token tile both warpgroups share (half the token traffic per multiply-add of the 64-row
programs of ``grouped_gluon``); in bodies of two K steps every half but a body's first is dequantised under the previous
half's wgmma (:func:`_consumer_steps`), and a slot is released through its ``empty`` mbarrier once its wgmma are done
(one arrival after a barrier of the partition's 256 threads). The loads run up to ``STAGES`` steps ahead of the
multiplies.

Values and order: the weights of ``grouped_gluon`` (``E2M1 x E4M3``, exact in bf16) in the same A slots, the same
``wgmma.mma_async.m64nNk16.f32.bf16.bf16`` chain of k16 steps in increasing k from +0 per output element
(``orders.nvfp4_grouped_order``), the same epilogues (rule steps 6-8): bitwise the Triton and ``grouped_gluon``
kernels (GPU test tests/kernels/test_nvfp4_grouped_gluon_gpu.py).

Scope: sm_90 only (no interpreter path), row blocks of 16..128 pairs with or without a tail of up to 64 pairs
(``moe_permute(..., tail)``: the tail rows' wgmma on the same A registers, one K loop per kind of block), reduction
lengths that are multiples of 128 (:func:`ws_refusal`).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from flint_moe.kernels.audit.registry import register_audit
from flint_moe.kernels.nvfp4.grouped_gluon import (
    GLUON_AUDIT_REQUIRE,
    _down_store,
    _gate_up_store,
    _half_mma,
    _token_ptrs,
    _weight_ptrs,
)

__all__ = ["WS_ROWS", "WS_WARPS", "WS_UNROLL", "ws_stage_bytes", "ws_stages", "ws_layouts", "ws_refusal",
           "check_ws_launch", "launch_ws_gate_up", "launch_ws_down", "compile_ws_sm90", "layout_constexprs",
           "audit_specs"]  # fmt: skip

#: Weight rows per tile (two consumer warpgroups), consumer and producer warps, producer registers (``setmaxnreg``:
#: at 88 the producer's per-tile pointer tensors spill; 96 leave the consumers 200 (PTX ``setmaxnreg``), no spill).
WS_ROWS, WS_WARPS = 128, 8
WS_PRODUCER_WARPS, WS_PRODUCER_REGS = gl.constexpr(4), gl.constexpr(96)
#: K steps per consumer loop body (:func:`_consumer_steps`): on the H200 at M = 4096, 2 is 1-3% faster per GEMM than
#: one step at a time and 4 no better overall (docs/kernels/nvfp4-grouped.md, "Pipelined consumers").
WS_UNROLL = gl.constexpr(2)


def ws_layouts(block_m: int):
    """(P3, MMA, SW) of a 64-K sub-step for ``WS_ROWS`` rows over ``WS_WARPS`` warps (``grouped_gluon.gluon_layouts``
    with a third warp basis: warps 4-7 are the second warpgroup, rows 64-127)."""
    reg = [[8, 0, 0], [0, 1, 0], [0, 2, 0], [0, 4, 0]]
    lanes = [[0, 0, 1], [0, 0, 2], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warps = [[16, 0, 0], [32, 0, 0], [64, 0, 0]]
    p3 = gl.DistributedLinearLayout(reg_bases=reg, lane_bases=lanes, warp_bases=warps, block_bases=[],
                                    shape=[WS_ROWS, 8, 4])  # fmt: skip
    mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WS_WARPS, 1], instr_shape=[16, block_m, 16])
    sw = gl.DistributedLinearLayout(reg_bases=[[8, 0]], lane_bases=[[0, 0], [0, 0], [1, 0], [2, 0], [4, 0]],
                                    warp_bases=[[16, 0], [32, 0], [64, 0]], block_bases=[],
                                    shape=[WS_ROWS, 1])  # fmt: skip
    return p3, mma, sw


@gluon.jit
def _tile(t, bexp_ptr, bstart_ptr, bend_ptr, QN: gl.constexpr):
    """Tile ``t`` of the persistent schedule: (q, expert, start, end) of weight-row tile q = t % QN of row block
    t // QN (an empty block has end <= start)."""
    b = t // QN
    return t % QN, gl.load(bexp_ptr + b).to(gl.int64), gl.load(bstart_ptr + b), gl.load(bend_ptr + b)


@gluon.jit
def _producer(codes_s, scl_s, x_s, xt_s, full, empty, x_ptr, order_ptr, bexp_ptr, bstart_ptr, bend_ptr, w_ptr, s_ptr,
              n_tiles, K: gl.constexpr, KW: gl.constexpr, W_ROWS: gl.constexpr, MP: gl.constexpr,
              N_ROWS: gl.constexpr, KP: gl.constexpr, QN: gl.constexpr, TOPK: gl.constexpr, BM: gl.constexpr,
              TAIL: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, GATE_UP: gl.constexpr):  # fmt: skip
    """Producer partition: for each tile of this program (``_tile``; empty blocks skipped), the copies of every K
    step (and, TAIL > 0 and the block longer than BM, the tail rows' tile) into ring slot ``it % STAGES`` (``it``
    counts the program's K steps over its tiles) once the consumers released it (``empty``), then ``full`` arrives
    when this thread's copies have landed. K the reduction length (the operand rows' length), KW the stored one of a
    weight row, W_ROWS / MP the weight / scale rows of an expert, N_ROWS the rows a tile may read (down: H, the
    rows past it read row 0), TOPK 0: the operand rows are the pairs' own."""
    R: gl.constexpr = codes_s.shape[1]
    NW: gl.constexpr = BK // 8
    NS: gl.constexpr = BK // 64
    it = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        q, e, start, end = _tile(t, bexp_ptr, bstart_ptr, bend_ptr, QN)
        if end > start:
            w_base = w_ptr.to(gl.pointer_type(gl.int32)) + e * (W_ROWS * KW // 8)
            s_base = (s_ptr + e * (MP * KP)).to(gl.pointer_type(gl.int32))
            w_ptrs, s_ptrs = _weight_ptrs(w_base, s_base, q, N_ROWS, KW // 8, KP, R, BK, GATE_UP)
            x_ptrs, x_ok = _token_ptrs(x_ptr, order_ptr, start, end, TOPK, K, BM, BK)
            xt_ptrs, xt_ok = _token_ptrs(x_ptr, order_ptr, start + BM, end, TOPK, K, max(TAIL, 16), BK)
            for kk in range(K // BK):
                st = it % STAGES
                mbarrier.wait(empty.index(st), ((it // STAGES) & 1) ^ 1)  # the first round passes (fresh barrier)
                async_copy.async_copy_global_to_shared(codes_s.index(st), w_ptrs + kk * NW)
                async_copy.async_copy_global_to_shared(scl_s.index(st), s_ptrs + kk * (NS * 128))
                async_copy.async_copy_global_to_shared(x_s.index(st), x_ptrs + kk * BK, mask=x_ok)
                if TAIL > 0:
                    if end - start > BM:  # blocks without a tail never read the tail tile
                        async_copy.async_copy_global_to_shared(xt_s.index(st), xt_ptrs + kk * BK, mask=xt_ok)
                async_copy.mbarrier_arrive(full.index(st), increment_count=False)
                it += 1


@gluon.jit
def _wait(n: gl.constexpr, WITH_TAIL: gl.constexpr, acc, acc_t, a, b):
    """``warpgroup_mma_wait(n)`` (at most ``n`` wgmma groups left in flight) keeping ``acc`` (WITH_TAIL: and
    ``acc_t``) and the A fragments ``a`` / ``b`` alive up to it. Returns (acc, acc_t, a, b)."""
    if WITH_TAIL:
        acc, acc_t, a, b = hopper.warpgroup_mma_wait(n, deps=[acc, acc_t, a, b])
    else:
        acc, a, b = hopper.warpgroup_mma_wait(n, deps=[acc, a, b])
    return acc, acc_t, a, b


@gluon.jit
def _full_slot(codes_s, scl_s, x_s, xt_s, full, it, STAGES: gl.constexpr):
    """Wait until the ring slot of the program's K step ``it`` is full. Returns (slot, its codes, scales, tokens,
    tail tokens)."""
    st = it % STAGES
    mbarrier.wait(full.index(st), (it // STAGES) & 1)
    return st, codes_s.index(st), scl_s.index(st), x_s.index(st), xt_s.index(st)


@gluon.jit
def _step_loop(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, it, K: gl.constexpr, BK: gl.constexpr,
               STAGES: gl.constexpr, WITH_TAIL: gl.constexpr, P3: gl.constexpr, MMA: gl.constexpr,
               MMA_T: gl.constexpr, SW: gl.constexpr):  # fmt: skip
    """``K // BK`` K steps one at a time from the program's K step ``it``: wait for the slot, dequantise and issue
    the two 64-K halves (the second dequantised while the first's wgmma runs; WITH_TAIL: each half's A registers
    also feed the tail rows' wgmma), wait for all of them, release the slot. Returns (acc, acc_t, it)."""
    DOT: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_T: gl.constexpr = gl.DotOperandLayout(0, MMA_T, 2)
    cidx = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, P3)))
    csel = (cidx | 0x4440)[None, None, :]
    for _ in range(K // BK):
        st, cs, ss, xs, xts = _full_slot(codes_s, scl_s, x_s, xt_s, full, it, STAGES)
        a0, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 0, WITH_TAIL, P3, SW, DOT, DOT_T)
        a1, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 1, WITH_TAIL, P3, SW, DOT, DOT_T)
        acc, acc_t, a0, a1 = _wait(0, WITH_TAIL, acc, acc_t, a0, a1)
        mbarrier.arrive(empty.index(st))
        it += 1
    return acc, acc_t, it


@gluon.jit
def _consumer_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, it, K: gl.constexpr, BK: gl.constexpr,
                    STAGES: gl.constexpr, WITH_TAIL: gl.constexpr, P3: gl.constexpr, MMA: gl.constexpr,
                    MMA_T: gl.constexpr, SW: gl.constexpr):  # fmt: skip
    """The consumers' K loop of one tile from the program's K step ``it``, in bodies of ``WS_UNROLL`` steps: inside a
    body each 64-K half but the first is dequantised while the previous half's wgmma runs (``warpgroup_mma_wait(NG)``
    leaves one half's NG groups in flight: the BM tile's, and the tail tile's WITH_TAIL), a slot is released once its
    second half is waited for, and the body ends with a full wait, so no wgmma in flight crosses the loop's back edge
    (the A registers an in-flight wgmma reads are values of the same straight-line body). Steps left over take
    :func:`_step_loop`. Same A slots, same k16 wgmma chain in increasing k as one step at a time: the same bits. Returns
    (acc, acc_t, it)."""
    DOT: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_T: gl.constexpr = gl.DotOperandLayout(0, MMA_T, 2)
    NG: gl.constexpr = 2 if WITH_TAIL else 1
    NSTEP: gl.constexpr = K // BK
    cidx = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, P3)))
    csel = (cidx | 0x4440)[None, None, :]
    for _ in range(NSTEP // WS_UNROLL):
        st, cs, ss, xs, xts = _full_slot(codes_s, scl_s, x_s, xt_s, full, it, STAGES)
        a0, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 0, WITH_TAIL, P3, SW, DOT, DOT_T)
        a1, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 1, WITH_TAIL, P3, SW, DOT, DOT_T)
        acc, acc_t, a0, a1 = _wait(NG, WITH_TAIL, acc, acc_t, a0, a1)  # the first half done, the second in flight
        done = st
        it += 1
        for _u in gl.static_range(1, WS_UNROLL):
            st, cs, ss, xs, xts = _full_slot(codes_s, scl_s, x_s, xt_s, full, it, STAGES)
            b0, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 0, WITH_TAIL, P3, SW, DOT, DOT_T)
            acc, acc_t, a1, b0 = _wait(NG, WITH_TAIL, acc, acc_t, a1, b0)  # the previous step's second half done
            mbarrier.arrive(empty.index(done))
            b1, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 1, WITH_TAIL, P3, SW, DOT, DOT_T)
            acc, acc_t, b0, b1 = _wait(NG, WITH_TAIL, acc, acc_t, b0, b1)
            a1 = b1
            done = st
            it += 1
        acc, acc_t, a1, a1 = _wait(0, WITH_TAIL, acc, acc_t, a1, a1)  # the first half was retired by the first wait
        mbarrier.arrive(empty.index(done))
    if NSTEP % WS_UNROLL:
        acc, acc_t, it = _step_loop(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, it, (NSTEP % WS_UNROLL) * BK,
                                    BK, STAGES, WITH_TAIL, P3, MMA, MMA_T, SW)  # fmt: skip
    return acc, acc_t, it


@gluon.jit
def _consumer(codes_s, scl_s, x_s, xt_s, full, empty, order_ptr, bexp_ptr, bstart_ptr, bend_ptr, alpha_ptr, out_ptr,
              aux_ptr, aux2_ptr, n_tiles, K: gl.constexpr, N_OUT: gl.constexpr, QN: gl.constexpr, BM: gl.constexpr,
              TAIL: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, TAP: gl.constexpr, P3: gl.constexpr,
              MMA: gl.constexpr, MMA_T: gl.constexpr, SW: gl.constexpr, GATE_UP: gl.constexpr):  # fmt: skip
    """Default partition (two warpgroups): for each tile of this program (the producer's sequence), the K loop
    (reduction length K) of a block with or without its tail rows (one loop per kind of block), then the epilogue
    for the BM pairs and the tail's: gate/up rule steps 6-7 (``out_ptr`` act, taps ``aux_ptr`` / ``aux2_ptr`` g_acc
    / u_acc, N_OUT = I) or down rule step 8 (``out_ptr`` y, tap ``aux_ptr`` down_acc, N_OUT = H). The epilogue of a
    tile runs while the producer already loads the next tile's first K steps."""
    R: gl.constexpr = codes_s.shape[1]
    TN: gl.constexpr = 16 if TAIL == 0 else TAIL
    it = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        q, e, start, end = _tile(t, bexp_ptr, bstart_ptr, bend_ptr, QN)
        if end > start:
            acc = gl.zeros([R, BM], gl.float32, layout=MMA)
            acc_t = gl.zeros([R, TN], gl.float32, layout=MMA_T)
            has_tail = end - start > BM
            if TAIL > 0:
                if has_tail:
                    acc, acc_t, it = _consumer_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, it, K, BK,
                                                     STAGES, True, P3, MMA, MMA_T, SW)  # fmt: skip
                else:
                    acc, acc_t, it = _consumer_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, it, K, BK,
                                                     STAGES, False, P3, MMA, MMA_T, SW)  # fmt: skip
            else:
                acc, acc_t, it = _consumer_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, it, K, BK, STAGES,
                                                 False, P3, MMA, MMA_T, SW)  # fmt: skip
            gs = gl.load(alpha_ptr + e)
            _epilogue(acc, order_ptr, start, end, q, gs, out_ptr, aux_ptr, aux2_ptr, N_OUT, TAP, GATE_UP)
            if TAIL > 0:
                if has_tail:
                    _epilogue(acc_t, order_ptr, start + BM, end, q, gs, out_ptr, aux_ptr, aux2_ptr, N_OUT, TAP,
                              GATE_UP)  # fmt: skip


@gluon.jit
def _epilogue(acc, order_ptr, pos0, end, q, gs, out_ptr, aux_ptr, aux2_ptr, N_OUT: gl.constexpr, TAP: gl.constexpr,
              GATE_UP: gl.constexpr):  # fmt: skip
    """The package kernels' epilogues: gate/up ``grouped_gluon._gate_up_store``, down ``_down_store``."""
    if GATE_UP:
        _gate_up_store(acc, order_ptr, pos0, end, q, gs, out_ptr, aux_ptr, aux2_ptr, N_OUT, TAP)
    else:
        _down_store(acc, order_ptr, pos0, end, q, gs, out_ptr, aux_ptr, N_OUT, TAP)


@gluon.jit
def _ws_grouped_kernel(src_ptr, order_ptr, bexp_ptr, bstart_ptr, bend_ptr, w_ptr, s_ptr, alpha_ptr, out_ptr,
                       aux_ptr, aux2_ptr, n_tiles, H: gl.constexpr, IP: gl.constexpr, INTER: gl.constexpr,
                       TOPK: gl.constexpr, BM: gl.constexpr, TAIL: gl.constexpr, STAGES: gl.constexpr,
                       TAP: gl.constexpr, P3: gl.constexpr, MMA: gl.constexpr, MMA_T: gl.constexpr, SW: gl.constexpr,
                       GATE_UP: gl.constexpr):  # fmt: skip
    """GATE_UP: ``_gluon_gate_up_kernel``'s contract (``src_ptr`` x, ``out_ptr`` act, taps g_acc / u_acc), tiles of
    128 weight rows = 64 intermediate columns, QN = cdiv(I, 64) per row block; else ``_gluon_down_kernel``'s
    (``src_ptr`` act, ``out_ptr`` y, tap down_acc), tiles of 128 hidden rows, QN = cdiv(H, 128). Persistent: program
    p takes tiles p, p + grid, ... of the ``n_tiles`` = QN x row blocks (``_tile``: the weight-row tiles of a row
    block next to each other); one ring and one K-step count run across a program's tiles. K steps of 128, row
    blocks of up to BM + TAIL pairs."""
    BK: gl.constexpr = 128
    R: gl.constexpr = P3.shape[0]
    K: gl.constexpr = H if GATE_UP else INTER
    KW: gl.constexpr = H if GATE_UP else IP  # stored reduction length of a weight row
    KP: gl.constexpr = (KW // 16 + 3) // 4 * 4
    MP: gl.constexpr = (2 * IP + 127) // 128 * 128 if GATE_UP else (H + 127) // 128 * 128
    W_ROWS: gl.constexpr = 2 * IP if GATE_UP else H
    N_ROWS: gl.constexpr = 0 if GATE_UP else H
    N_OUT: gl.constexpr = INTER if GATE_UP else H
    QN: gl.constexpr = (INTER + R // 2 - 1) // (R // 2) if GATE_UP else (H + R - 1) // R
    codes_s = gl.allocate_shared_memory(gl.int32, [STAGES, R, BK // 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    scl_s = gl.allocate_shared_memory(gl.int32, [STAGES, R, BK // 64], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK],
                                    gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16))  # fmt: skip
    if TAIL > 0:
        xt_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, TAIL, BK],
                                         gl.NVMMASharedLayout.get_default_for([TAIL, BK], gl.bfloat16))  # fmt: skip
    else:
        xt_s = x_s  # never read (no tail)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=WS_PRODUCER_WARPS * 32)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize(
        [(_consumer, (codes_s, scl_s, x_s, xt_s, full, empty, order_ptr, bexp_ptr, bstart_ptr, bend_ptr, alpha_ptr,
                      out_ptr, aux_ptr, aux2_ptr, n_tiles, K, N_OUT, QN, BM, TAIL, BK, STAGES, TAP, P3, MMA, MMA_T,
                      SW, GATE_UP)),
         (_producer, (codes_s, scl_s, x_s, xt_s, full, empty, src_ptr, order_ptr, bexp_ptr, bstart_ptr, bend_ptr,
                      w_ptr, s_ptr, n_tiles, K, KW, W_ROWS, MP, N_ROWS, KP, QN, TOPK, BM, TAIL, BK, STAGES,
                      GATE_UP))],
        [WS_PRODUCER_WARPS], [WS_PRODUCER_REGS])  # fmt: skip


def ws_stage_bytes(block_m: int, tail: int = 0, gate_up: bool = True) -> tuple[int, int]:
    """(bytes per ring slot, the epilogue's scratch bytes): a slot holds 128 rows x (64 B codes + 8 B scales) and
    (BM + TAIL) token rows of 256 B; gate/up stages its fp32 accumulator [128, max(BM, TAIL)] in shared memory,
    down converts its layout through ~16 KiB."""
    per_stage = WS_ROWS * 64 + WS_ROWS * 8 + (block_m + tail) * 128 * 2
    scratch = WS_ROWS * max(block_m, tail) * 4 if gate_up else 16 * 1024
    return per_stage, scratch


def ws_stages(block_m: int, tail: int = 0, gate_up: bool = True) -> int:
    """Ring depth: as many K steps (2..6) as fit 224 KiB next to the epilogue's scratch (one CTA per SM;
    :func:`ws_stage_bytes`)."""
    per_stage, scratch = ws_stage_bytes(block_m, tail, gate_up)
    return max(2, min(6, (224 * 1024 - scratch) // per_stage))


def _meta(block_m: int, tail: int = 0, stages: int | None = None, gate_up: bool = True) -> dict:
    if stages is not None:
        per_stage, scratch = ws_stage_bytes(block_m, tail, gate_up)
        if stages < 2 or stages * per_stage + scratch > 224 * 1024:
            raise ValueError(f"config ENGINE 'gluon_ws': num_stages = {stages} needs 2 .. "
                             f"{(224 * 1024 - scratch) // per_stage} ring slots at BM {block_m} + tail {tail} "
                             f"(224 KiB of shared memory)")  # fmt: skip
    p3, mma, sw = ws_layouts(block_m)
    mma_t = ws_layouts(max(tail, 16))[1]
    return {"BM": block_m, "TAIL": tail, "STAGES": stages or ws_stages(block_m, tail, gate_up), "P3": p3,
            "MMA": mma, "MMA_T": mma_t, "SW": sw, "num_warps": WS_WARPS}  # fmt: skip


def _grid(n_tiles: int, device, persistent: bool) -> tuple[int]:
    """One program per SM taking every grid-th tile (``persistent``), or one program per tile."""
    if not persistent or n_tiles == 0:
        return (max(n_tiles, 1),)
    return (min(n_tiles, torch.cuda.get_device_properties(device).multi_processor_count),)


def launch_ws_gate_up(x, perm, w1, w1_scales, w1_alpha, act, gacc, uacc, *, H, IP, INTER, TOPK, TAP,
                      stages=None, persistent=True) -> None:  # fmt: skip
    """Launch the gate/up GEMM on checked operands (``nvfp4_grouped_gate_up`` with ENGINE 'gluon_ws', after
    :func:`check_ws_launch`); ``stages`` None: :func:`ws_stages`; ``persistent``: one program per SM (else one per
    tile; the same bits)."""
    n_tiles = triton.cdiv(INTER, WS_ROWS // 2) * perm.num_blocks
    _ws_grouped_kernel[_grid(n_tiles, x.device, persistent)](
        x, perm.order, perm.block_expert, perm.block_start, perm.block_end, w1, w1_scales, w1_alpha, act, gacc, uacc,
        n_tiles, H=H, IP=IP, INTER=INTER, TOPK=TOPK, TAP=TAP, GATE_UP=True, **_meta(perm.block_m, perm.tail, stages))


def launch_ws_down(act, perm, w2, w2_scales, w2_alpha, y, dacc, *, H, IP, INTER, TAP, stages=None,
                   persistent=True) -> None:  # fmt: skip
    """Launch the down GEMM on checked operands (``nvfp4_grouped_down`` with ENGINE 'gluon_ws')."""
    n_tiles = triton.cdiv(H, WS_ROWS) * perm.num_blocks
    _ws_grouped_kernel[_grid(n_tiles, act.device, persistent)](
        act, perm.order, perm.block_expert, perm.block_start, perm.block_end, w2, w2_scales, w2_alpha, y, dacc, dacc,
        n_tiles, H=H, IP=IP, INTER=INTER, TOPK=0, TAP=TAP, GATE_UP=False,
        **_meta(perm.block_m, perm.tail, stages, gate_up=False),
    )


def ws_refusal(perm, k: int) -> str | None:
    """Why the warp-specialised GEMMs cannot serve this launch, or None: they need a CUDA device of compute
    capability 9.x (no interpreter path), row blocks of 16..128 pairs, a tail of at most 64 pairs (a 128-pair
    tail's accumulator spills) and a reduction length ``k`` that is a multiple of 128 (the K step)."""
    from flint_moe.kernels.nvfp4.grouped_gluon import gluon_refusal

    why = gluon_refusal(perm, k)
    if why is not None:
        return why
    if perm.tail > 64:
        return f"needs a tail of at most 64 pairs, got {perm.tail}"
    if k % 128:
        return f"needs a reduction length that is a multiple of 128, got {k}"
    return None


def check_ws_launch(name: str, perm, k: int) -> None:
    """ValueError naming the constraint unless the warp-specialised GEMMs serve this launch (:func:`ws_refusal`)."""
    why = ws_refusal(perm, k)
    if why is not None:
        raise ValueError(f"{name}: config ENGINE 'gluon_ws' {why}")


def _build_args(H: int, I: int, k: int, block_m: int, tail: int = 0, tap: bool = False, gate_up: bool = True):  # noqa: N803, E741
    """(kernel, signature, constexprs, num_warps) of the launchers' build (``grouped_gluon._build_args``)."""
    ip = (I + 63) // 64 * 64
    tap_t = "*fp32" if tap else "*bf16"  # an untapped launch passes its bf16 output for the (unused) tap pointers
    ptrs = {"src_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32", "out_ptr": "*bf16",
            "aux_ptr": tap_t, "aux2_ptr": tap_t}  # fmt: skip
    consts = {"H": H, "IP": ip, "INTER": I, "TOPK": k if gate_up else 0, "TAP": tap, "GATE_UP": gate_up,
              **_meta(block_m, tail, gate_up=gate_up)}  # fmt: skip
    num_warps = consts.pop("num_warps")
    ptrs["n_tiles"] = "i32"
    sig = {a: ptrs.get(a, "*i32") for a in _ws_grouped_kernel.arg_names if a not in consts}
    return _ws_grouped_kernel, sig, consts, num_warps


def compile_ws_sm90(H: int, I: int, k: int, block_m: int, tail: int = 0, tap: bool = False,  # noqa: N803, E741
                    gate_up: bool = True):  # fmt: skip
    """The ``triton.compile`` result of the gate/up (``gate_up`` True) or down GEMM for sm_90a on any machine (no
    GPU needed): shapes (H, I, top_k), row block ``block_m`` and ``tail``, the launchers' meta-parameters, pointer
    arguments 16-byte aligned as a launch on torch tensors specialises them (as
    ``grouped_gluon.compile_gluon_sm90``)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kern, ptr_sig, consts, num_warps = _build_args(H, I, k, block_m, tail, tap, gate_up)
    sig = {a: ("constexpr" if a in consts else ptr_sig[a]) for a in kern.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kern.arg_names) if sig[a].startswith("*")}
    src = GluonASTSource(fn=kern, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def layout_constexprs(consts: dict) -> dict:
    """The layout constexprs (P3, MMA, MMA_T, SW) of a launch whose other constexprs are ``consts`` (BM, TAIL), as
    the launchers make them (``grouped_gluon.layout_constexprs``)."""
    p3, mma, sw = ws_layouts(consts["BM"])
    return {"P3": p3, "MMA": mma, "MMA_T": ws_layouts(max(consts["TAIL"], 16))[1], "SW": sw}


#: (H, I, k, BM, TAIL) builds audited for sm_90: the default engine at row blocks of 128 + 32 pairs (DeepSeek-V3
#: M = 4096), gate/up and down, with the instruction lists of ``grouped_gluon.GLUON_AUDIT_REQUIRE``.
WS_AUDIT_CASES = [(7168, 2048, 8, 128, 32)]


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of both warp-specialised GEMMs at ``WS_AUDIT_CASES`` (production builds)."""
    names = []
    for gate_up in (True, False):
        kind = "gate_up" if gate_up else "down"
        for h, i, k, bm, tail in WS_AUDIT_CASES:
            kern, sig, consts, warps = _build_args(h, i, k, bm, tail, False, gate_up)
            names.append(register_audit(f"nvfp4_gluon_ws_{kind}.H{h}.I{i}.BM{bm}+{tail}", kern, sig, consts,
                                        GLUON_AUDIT_REQUIRE[kind], options={"num_warps": warps}).name)  # fmt: skip
    return names


audit_specs()
