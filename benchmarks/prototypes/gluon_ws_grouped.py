"""Prototype under evaluation: warp-specialised Gluon grouped GEMMs (gate/up and down, sm_90), measured against the
Gluon kernels of ``flint_moe.kernels.nvfp4.grouped_gluon`` before anything of it moves into the package.

Structure (docs/kernels/nvfp4-grouped.md, "Gluon main loop"): programs of 128 weight rows (gate/up: one w1
interleave group, 64 up rows then their 64 gate rows; down: 128 hidden rows) and BM pairs. A producer partition of 4
warps issues every ``cp.async`` of a K step (code words, scale words, the gathered token rows) into a ring of
``STAGES`` slots and signals the slot's ``full`` mbarrier when its copies land (``cp.async.mbarrier.arrive.noinc``:
128 arrivals); the default partition, two consumer warpgroups of 64 rows each, waits for ``full``, dequantises its
rows straight into the wgmma A registers (``grouped_gluon._half_mma``: the package kernel's two 64-K halves) and
issues the wgmma against the token tile both warpgroups share (half the token fill per multiply-add of 64-row
programs), waits for it, and releases the slot through its ``empty`` mbarrier (one arrival, from one thread after a
barrier of the partition's 256 threads that the compiler places there, as it places one before the ``full`` wait: two
partition-wide ``bar.sync`` per K step, none across the producer). The loads run up to ``STAGES`` steps ahead. Same
weights, same A slots, same k16 wgmma chain per output element in increasing k from +0 as the package kernels
(``orders.nvfp4_grouped_order``): the output must be bitwise the package kernels'.

Scope: row blocks of 16..128 pairs with or without a tail (``moe_permute(..., tail)``: the tail rows'
wgmma on the same A registers, one K loop per kind of block), reduction lengths that are multiples of 128.

``python -m benchmarks.prototypes.gluon_ws_grouped --sass`` (CPU: registers, shared memory, the SASS checks of the
package kernels); ``python -m benchmarks.prototypes.gluon_ws_grouped --gpu`` (H200: act and y bitwise the package
kernels' at DeepSeek-V3 M = 4096 without and with tails and M = 128, then the kernels timed with CUDA graphs).
"""

from __future__ import annotations

import argparse
import json
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from flint_moe.kernels.nvfp4.grouped_gluon import _down_store, _gate_up_store, _half_mma, _token_ptrs, _weight_ptrs

#: Weight rows per program (two consumer warpgroups), consumer and producer warps, producer registers.
WS_ROWS, WS_WARPS = 128, 8
WS_PRODUCER_WARPS, WS_PRODUCER_REGS = gl.constexpr(4), gl.constexpr(80)


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
def _producer(codes_s, scl_s, x_s, xt_s, full, empty, x_ptr, order_ptr, w_base, s_base, q, start, end,
              K: gl.constexpr, ROW_WORDS: gl.constexpr, N_ROWS: gl.constexpr, KP: gl.constexpr,
              TOPK: gl.constexpr, BM: gl.constexpr, TAIL: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
              GATE_UP: gl.constexpr):  # fmt: skip
    """Producer partition: the copies of every K step (and, TAIL > 0, the tail rows' tile) into ring slot
    ``kk % STAGES`` once the consumers released it (``empty``), then ``full`` arrives when this thread's copies
    have landed. K the reduction length (the operand rows' length), ROW_WORDS the code words of a weight row,
    N_ROWS the weight rows (down: H, the rows past it read row 0), TOPK 0: the operand rows are the pairs' own."""
    R: gl.constexpr = codes_s.shape[1]
    NW: gl.constexpr = BK // 8
    NS: gl.constexpr = BK // 64
    w_ptrs, s_ptrs = _weight_ptrs(w_base, s_base, q, N_ROWS, ROW_WORDS, KP, R, BK, GATE_UP)
    x_ptrs, x_ok = _token_ptrs(x_ptr, order_ptr, start, end, TOPK, K, BM, BK)
    xt_ptrs, xt_ok = _token_ptrs(x_ptr, order_ptr, start + BM, end, TOPK, K, max(TAIL, 16), BK)
    for kk in range(K // BK):
        st = kk % STAGES
        mbarrier.wait(empty.index(st), ((kk // STAGES) & 1) ^ 1)  # the first round passes (fresh barrier)
        async_copy.async_copy_global_to_shared(codes_s.index(st), w_ptrs + kk * NW)
        async_copy.async_copy_global_to_shared(scl_s.index(st), s_ptrs + kk * (NS * 128))
        async_copy.async_copy_global_to_shared(x_s.index(st), x_ptrs + kk * BK, mask=x_ok)
        if TAIL > 0:
            if end - start > BM:  # blocks without a tail never read the tail tile
                async_copy.async_copy_global_to_shared(xt_s.index(st), xt_ptrs + kk * BK, mask=xt_ok)
        async_copy.mbarrier_arrive(full.index(st), increment_count=False)


@gluon.jit
def _consumer_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, K: gl.constexpr, BK: gl.constexpr,
                    STAGES: gl.constexpr, WITH_TAIL: gl.constexpr, P3: gl.constexpr, MMA: gl.constexpr,
                    MMA_T: gl.constexpr, SW: gl.constexpr):  # fmt: skip
    """The consumers' K loop: per K step wait for the slot, dequantise and issue the two 64-K halves (the second
    dequantised while the first's wgmma runs; WITH_TAIL: each half's A registers also feed the tail rows' wgmma),
    wait for all of them once, release the slot. Returns (acc, acc_t)."""
    DOT: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_T: gl.constexpr = gl.DotOperandLayout(0, MMA_T, 2)
    cidx = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, P3)))
    csel = (cidx | 0x4440)[None, None, :]
    for kk in range(K // BK):
        st = kk % STAGES
        mbarrier.wait(full.index(st), (kk // STAGES) & 1)
        cs, ss, xs, xts = codes_s.index(st), scl_s.index(st), x_s.index(st), xt_s.index(st)
        a0, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 0, WITH_TAIL, P3, SW, DOT, DOT_T)
        a1, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 1, WITH_TAIL, P3, SW, DOT, DOT_T)
        if WITH_TAIL:
            acc, acc_t, a0, a1 = hopper.warpgroup_mma_wait(0, deps=[acc, acc_t, a0, a1])
        else:
            acc, a0, a1 = hopper.warpgroup_mma_wait(0, deps=[acc, a0, a1])
        mbarrier.arrive(empty.index(st))
    return acc, acc_t


@gluon.jit
def _consumer(codes_s, scl_s, x_s, xt_s, full, empty, order_ptr, start, end, q, gs, out_ptr, aux_ptr, aux2_ptr,
              K: gl.constexpr, N_OUT: gl.constexpr, BM: gl.constexpr, TAIL: gl.constexpr, BK: gl.constexpr,
              STAGES: gl.constexpr, TAP: gl.constexpr, P3: gl.constexpr, MMA: gl.constexpr, MMA_T: gl.constexpr,
              SW: gl.constexpr, GATE_UP: gl.constexpr):  # fmt: skip
    """Default partition (two warpgroups): the K loop (reduction length K) of a block with or without its tail
    rows (one loop per kind of block, chosen once), then the epilogue for the BM pairs and the tail's: gate/up rule
    steps 6-7 (``out_ptr`` act, taps ``aux_ptr`` / ``aux2_ptr`` g_acc / u_acc, N_OUT = I) or down rule step 8
    (``out_ptr`` y, tap ``aux_ptr`` down_acc, N_OUT = H)."""
    R: gl.constexpr = codes_s.shape[1]
    TN: gl.constexpr = 16 if TAIL == 0 else TAIL
    acc = gl.zeros([R, BM], gl.float32, layout=MMA)
    acc_t = gl.zeros([R, TN], gl.float32, layout=MMA_T)
    has_tail = end - start > BM
    if TAIL > 0:
        if has_tail:
            acc, acc_t = _consumer_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, K, BK, STAGES, True, P3,
                                         MMA, MMA_T, SW)  # fmt: skip
        else:
            acc, acc_t = _consumer_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, K, BK, STAGES, False, P3,
                                         MMA, MMA_T, SW)  # fmt: skip
    else:
        acc, acc_t = _consumer_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, K, BK, STAGES, False, P3,
                                     MMA, MMA_T, SW)  # fmt: skip
    _epilogue(acc, order_ptr, start, end, q, gs, out_ptr, aux_ptr, aux2_ptr, N_OUT, TAP, GATE_UP)
    if TAIL > 0:
        if has_tail:
            _epilogue(acc_t, order_ptr, start + BM, end, q, gs, out_ptr, aux_ptr, aux2_ptr, N_OUT, TAP, GATE_UP)


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
                       aux_ptr, aux2_ptr, H: gl.constexpr, IP: gl.constexpr, INTER: gl.constexpr,
                       TOPK: gl.constexpr, BM: gl.constexpr, TAIL: gl.constexpr, STAGES: gl.constexpr,
                       TAP: gl.constexpr, P3: gl.constexpr, MMA: gl.constexpr, MMA_T: gl.constexpr, SW: gl.constexpr,
                       GATE_UP: gl.constexpr):  # fmt: skip
    """GATE_UP: ``_gluon_gate_up_kernel``'s contract (``src_ptr`` x, ``out_ptr`` act, taps g_acc / u_acc), grid
    ``(cdiv(I, 64), NB)``, 128 weight rows = 64 intermediate columns per program; else ``_gluon_down_kernel``'s
    (``src_ptr`` act, ``out_ptr`` y, tap down_acc), grid ``(cdiv(H, 128), NB)``, 128 hidden rows per program. K
    steps of 128, row blocks of up to BM + TAIL pairs."""
    BK: gl.constexpr = 128
    R: gl.constexpr = P3.shape[0]
    K: gl.constexpr = H if GATE_UP else INTER
    KW: gl.constexpr = H if GATE_UP else IP  # stored reduction length of a weight row
    KP: gl.constexpr = (KW // 16 + 3) // 4 * 4
    MP: gl.constexpr = (2 * IP + 127) // 128 * 128 if GATE_UP else (H + 127) // 128 * 128
    N_ROWS: gl.constexpr = 0 if GATE_UP else H
    N_OUT: gl.constexpr = INTER if GATE_UP else H
    q = gl.program_id(0)
    b = gl.program_id(1)
    e = gl.load(bexp_ptr + b).to(gl.int64)
    start = gl.load(bstart_ptr + b)
    end = gl.load(bend_ptr + b)
    if end > start:
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
        w_base = w_ptr.to(gl.pointer_type(gl.int32)) + e * ((2 * IP if GATE_UP else H) * KW // 8)
        s_base = (s_ptr + e * (MP * KP)).to(gl.pointer_type(gl.int32))
        gs = gl.load(alpha_ptr + e)
        gl.warp_specialize(
            [(_consumer, (codes_s, scl_s, x_s, xt_s, full, empty, order_ptr, start, end, q, gs, out_ptr, aux_ptr,
                          aux2_ptr, K, N_OUT, BM, TAIL, BK, STAGES, TAP, P3, MMA, MMA_T, SW, GATE_UP)),
             (_producer, (codes_s, scl_s, x_s, xt_s, full, empty, src_ptr, order_ptr, w_base, s_base, q, start, end,
                          K, KW // 8, N_ROWS, KP, TOPK, BM, TAIL, BK, STAGES, GATE_UP))],
            [WS_PRODUCER_WARPS], [WS_PRODUCER_REGS])  # fmt: skip


def ws_stages(block_m: int, tail: int = 0, gate_up: bool = True) -> int:
    """Ring depth: as many K steps (2..6) as fit 224 KiB next to the epilogue's scratch (one CTA per SM): gate/up
    stages its fp32 accumulator [128, BM] in shared memory (the tail's [128, TAIL] reuses it), down converts
    its layout through ~16 KiB."""
    per_stage = WS_ROWS * 64 + WS_ROWS * 8 + (block_m + tail) * 128 * 2
    scratch = WS_ROWS * max(block_m, tail) * 4 if gate_up else 16 * 1024
    return max(2, min(6, (224 * 1024 - scratch) // per_stage))


def _meta(block_m: int, tail: int = 0, stages: int | None = None, gate_up: bool = True) -> dict:
    p3, mma, sw = ws_layouts(block_m)
    mma_t = ws_layouts(max(tail, 16))[1]
    return {"BM": block_m, "TAIL": tail, "STAGES": stages or ws_stages(block_m, tail, gate_up), "P3": p3,
            "MMA": mma, "MMA_T": mma_t, "SW": sw, "num_warps": WS_WARPS}  # fmt: skip


def launch_ws_gate_up(x, perm, w1, w1_scales, w1_alpha, act, gacc, uacc, *, H, IP, INTER, TOPK, TAP, stages=None):
    """Launch the gate/up prototype (operands as ``grouped_gluon.launch_gluon_gate_up``'s; ``perm`` of BM 16..128
    pairs with or without a tail; H a multiple of 128)."""
    _check(perm, H)
    grid = (triton.cdiv(INTER, WS_ROWS // 2), perm.num_blocks)
    _ws_grouped_kernel[grid](x, perm.order, perm.block_expert, perm.block_start, perm.block_end, w1, w1_scales,
                             w1_alpha, act, gacc, uacc, H=H, IP=IP, INTER=INTER, TOPK=TOPK, TAP=TAP, GATE_UP=True,
                             **_meta(perm.block_m, perm.tail, stages))  # fmt: skip


def launch_ws_down(act, perm, w2, w2_scales, w2_alpha, y, dacc, *, H, IP, INTER, TAP, stages=None):
    """Launch the down prototype (operands as ``grouped_gluon.launch_gluon_down``'s; INTER a multiple of 128)."""
    _check(perm, INTER)
    grid = (triton.cdiv(H, WS_ROWS), perm.num_blocks)
    _ws_grouped_kernel[grid](act, perm.order, perm.block_expert, perm.block_start, perm.block_end, w2, w2_scales,
                             w2_alpha, y, dacc, dacc, H=H, IP=IP, INTER=INTER, TOPK=0, TAP=TAP, GATE_UP=False,
                             **_meta(perm.block_m, perm.tail, stages, gate_up=False))  # fmt: skip


def _check(perm, k: int) -> None:
    if perm.block_m not in (16, 32, 64, 128) or perm.tail > 64 or k % 128:
        raise ValueError(f"gluon_ws prototype: needs BM 16..128, a tail of at most 64 pairs (128 spills) and a "
                         f"reduction length that is a multiple of 128, got BM {perm.block_m}, tail {perm.tail}, "
                         f"K {k}")  # fmt: skip


def compile_ws_sm90(H: int, I: int, k: int, block_m: int, tail: int = 0, tap: bool = False,  # noqa: N803, E741
                    gate_up: bool = True):  # fmt: skip
    """``triton.compile`` of the prototype (``gate_up``: the gate/up GEMM, else down) for sm_90a on any machine (as
    ``grouped_gluon.compile_gluon_sm90``)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    ip = (I + 63) // 64 * 64
    ptrs = {"src_ptr": "*bf16", "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32", "out_ptr": "*bf16",
            "aux_ptr": "*fp32", "aux2_ptr": "*fp32"}  # fmt: skip
    consts = {"H": H, "IP": ip, "INTER": I, "TOPK": k if gate_up else 0, "TAP": tap, "GATE_UP": gate_up,
              **_meta(block_m, tail, gate_up=gate_up)}  # fmt: skip
    num_warps = consts.pop("num_warps")
    kern = _ws_grouped_kernel
    sig = {a: ("constexpr" if a in consts else ptrs.get(a, "*i32")) for a in kern.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kern.arg_names) if sig[a].startswith("*")}
    src = GluonASTSource(fn=kern, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def sass_report(H: int = 7168, I: int = 2048, k: int = 8) -> list[dict]:  # noqa: N803, E741
    """CPU: registers, shared memory and, in the consumers' K loop (the shortest loop around HGMMAs: with a tail,
    the loop of blocks without one), the HGMMA, wgmma-wait, ``BAR.SYNC`` and ``SYNCS`` (mbarrier) counts, plus the
    in-flight register check, of the gate/up BM 128, BM 16 and BM 128 + 32 builds and the down BM 128 + 32 one."""
    from benchmarks.sass_grouped_nvfp4 import _opcode, _resources, inflight_register_writes, main_loop, sass_of

    out = []
    for bm, tail, gate_up in ((128, 0, True), (16, 0, True), (128, 32, True), (128, 32, False)):
        c = compile_ws_sm90(H, I, k, bm, tail, gate_up=gate_up)
        sass = sass_of(c.asm["cubin"])
        ops = [_opcode(t) for t in main_loop(sass)]
        count = {name: sum(o.startswith(prefix) for o in ops)
                 for name, prefix in (("hgmma", "HGMMA"), ("waits", "WARPGROUP.DEPBAR"), ("bar_sync", "BAR.SYNC"),
                                      ("syncs", "SYNCS"), ("sts", "STS"), ("ldsm", "LDSM"))}  # fmt: skip
        res = {k2: v for k2, v in _resources(c).items() if k2 != "tma"}
        out.append({"kind": "gate_up" if gate_up else "down", "BM": bm, "TAIL": tail, **res, "loop": count,
                    "inflight_writes": len(inflight_register_writes(sass))})  # fmt: skip
    return out


def gpu_case(layer, M: int, tail: int = 0) -> dict:
    """H200, one layer, M and tail, on one permutation (the default's BM capped at 128, the given tail): act of the
    gate/up prototype against the Gluon and the Triton gate/up kernels, and y of the down prototype against the
    Gluon down kernel (bitwise the Triton one: tests/kernels/test_nvfp4_grouped_gluon_gpu.py) on the same act,
    bitwise; then the five kernels timed (CUDA graphs, us)."""
    import torch

    from benchmarks.bench_grouped_nvfp4 import time_fn
    from flint_moe.kernels.nvfp4.gate_up import gate_up_buffers, w1_operands
    from flint_moe.kernels.nvfp4.grouped_gate_up import grouped_config, nvfp4_grouped_gate_up
    from flint_moe.kernels.nvfp4.grouped_gluon import launch_gluon_down, launch_gluon_gate_up
    from flint_moe.kernels.nvfp4.permute import moe_permute
    from flint_moe.ops import make_route_counter, route

    x, router, _ = layer.inputs(M, seed=5)
    ids, _ = route(x, router, layer.k, make_route_counter(layer.device))
    bm = min(grouped_config(M * layer.k, layer.E)["BM"], 128)
    perm = moe_permute(ids, layer.E, bm, min(tail, bm))
    w1 = w1_operands(layer.w)
    w2 = (layer.w.w2, layer.w.w2_sf_swizzled.view(torch.uint8), layer.w.w2_alpha)
    P, H, ip = M * layer.k, layer.H, (layer.I + 63) // 64 * 64
    kw = {"H": H, "IP": ip, "INTER": layer.I, "TAP": False}
    act_ws, act_gl = (gate_up_buffers(P, layer.I, False, x.device)[0] for _ in range(2))
    act_tr = nvfp4_grouped_gate_up(x, ids, perm, layer.w, config={"SCALE_WORD": True})
    y_ws, y_gl = (torch.empty(P, H, dtype=torch.bfloat16, device=x.device) for _ in range(2))
    runs = {
        "gate_up ws": lambda i: launch_ws_gate_up(x, perm, *w1, act_ws, act_ws, act_ws, TOPK=layer.k, **kw),
        "gate_up gluon": lambda i: launch_gluon_gate_up(x, perm, *w1, act_gl, act_gl, act_gl, TOPK=layer.k, **kw),
        "gate_up triton": lambda i: nvfp4_grouped_gate_up(x, ids, perm, layer.w, config={"SCALE_WORD": True}),
        "down ws": lambda i: launch_ws_down(act_tr, perm, *w2, y_ws, y_ws, **kw),
        "down gluon": lambda i: launch_gluon_down(act_tr, perm, *w2, y_gl, y_gl, **kw),
    }
    for name in ("gate_up ws", "gate_up gluon", "down ws", "down gluon"):
        runs[name](0)
    torch.cuda.synchronize()
    bits = {"act_ws_eq_gluon": torch.equal(act_ws.view(torch.int16), act_gl.view(torch.int16)),
            "act_ws_eq_triton": torch.equal(act_ws.view(torch.int16), act_tr.view(torch.int16)),
            "y_ws_eq_gluon": torch.equal(y_ws.view(torch.int16), y_gl.view(torch.int16))}  # every pair's row written
    return {"model": layer.model, "M": M, "BM": bm, "TAIL": perm.tail, **bits,
            "us": {n: time_fn(f) * 1e6 for n, f in runs.items()}}  # fmt: skip


def gpu_check(cases=(("deepseek-v3", 4096, 0), ("deepseek-v3", 4096, 32), ("deepseek-v3", 128, 0))) -> list[dict]:
    """:func:`gpu_case` for every (model, M, tail) of ``cases``, printed as JSON lines."""
    from benchmarks.bench_grouped_nvfp4 import Layer

    out, layers = [], {}
    for model, M, tail in cases:
        if model not in layers:
            layers.clear()
            layers[model] = Layer(model)
        out.append(gpu_case(layers[model], M, tail))
        print(json.dumps(out[-1]), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sass", action="store_true", help="CPU: the sm_90a builds' resources and SASS checks")
    ap.add_argument("--gpu", action="store_true", help="H200: bits against the package kernels, then times")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args(argv)
    res = {}
    if a.sass:
        res["sass"] = sass_report()
        print(json.dumps(res["sass"], indent=1))
    if a.gpu:
        res["gpu"] = gpu_check()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0 if res else 2


if __name__ == "__main__":
    sys.exit(main())
