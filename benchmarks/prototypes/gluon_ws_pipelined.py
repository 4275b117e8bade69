"""Prototype under evaluation: the warp-specialised Gluon grouped GEMMs with every 64-K half's dequantisation
under the previous half's wgmma, measured against the package kernels (``grouped_gluon_ws``) before it moves in.

The package's consumers (``grouped_gluon_ws._consumer_steps``) wait for all of a K step's wgmma at its end, so each
step's first half is dequantised while the tensor cores idle: at DeepSeek-V3 M = 4096 a step takes ~2550 clocks
of which the HGMMA need ~1280 (tensor pipe 48%, docs/kernels/nvfp4-grouped.md). Here the K loop runs bodies of
``UNROLL`` steps; inside a body the second half of a step stays in flight while the next step's first half is
dequantised (``warpgroup_mma_wait(NG)``: NG = the wgmma groups of one half, 2 with a tail tile), the slot of a step
is released once its second half is waited for, and each body ends with ``warpgroup_mma_wait(0)``. No wgmma is in
flight across the loop's back edge: the A registers an in-flight wgmma reads are values of the same straight-line
body, kept alive by the wait's dependencies (a version that carried them across the back edge gave other bits on
the H200: the notes' "Gluon main loop"). Steps left over (K / 128 not a multiple of UNROLL) take the package's
one-step loop. Same weights in the same A slots, the same k16 wgmma chain per output element in increasing k
(``orders.nvfp4_grouped_order``): the outputs and taps must be bitwise the package kernels'.

Built without copying the package kernel: :func:`rebound` re-creates a Gluon function with some of its global names
bound to other functions, so the package's ``_ws_grouped_kernel`` and ``_consumer`` are rebuilt around
:func:`_pipelined_steps` (everything else, producer, epilogues, layouts, launch meta-parameters, is the package's).

``python -m benchmarks.prototypes.gluon_ws_pipelined --sass`` (CPU: registers, spills, shared memory, the consumer
loops' HGMMA / wait / barrier counts and the in-flight register check, package and prototype side by side);
``--gpu`` (H200: act, y and the taps bitwise the package kernels' at DeepSeek-V3 M = 4096 / 16384 and Qwen3-235B-A22B
M = 4096, row blocks of 128 + 32 pairs, then every variant's kernels and the package's timed with CUDA graphs).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import types

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from flint_moe.kernels._rule import global_scale, swiglu
from flint_moe.kernels.nvfp4 import grouped_gluon_ws as pkg
from flint_moe.kernels.nvfp4.grouped_gluon import _block_pairs, _half_mma
from flint_moe.kernels.nvfp4.grouped_gluon_ws import _consumer_steps as _package_steps

__all__ = ["UNROLL", "SCRATCH", "rebound", "variant", "VARIANTS", "sass_report", "gpu_check", "SASS_BUILDS",
           "GPU_CASES"]  # fmt: skip

#: K steps per loop body (the first half of a body is dequantised with the tensor cores idle, the rest under a wgmma);
#: :func:`variant` rebinds it.
UNROLL = gl.constexpr(2)


def rebound(fn, **names):
    """A copy of the Gluon function (or plain Python function) ``fn`` whose global ``names`` resolve to the given
    objects (the rest of its module's globals as they are now); Triton's cache key follows the new bindings."""
    py = fn.fn if hasattr(fn, "fn") else fn
    scope = dict(py.__globals__)
    scope.update(names)
    copy = types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__, py.__closure__)
    copy.__doc__, copy.__qualname__, copy.__module__ = py.__doc__, py.__qualname__, py.__module__
    copy.__kwdefaults__ = dict(py.__kwdefaults__) if py.__kwdefaults__ else None
    copy.__annotations__ = dict(py.__annotations__)  # gl.constexpr parameters stay constexpr
    return gluon.jit(copy) if hasattr(fn, "fn") else copy


@gluon.jit
def _wait(n: gl.constexpr, WITH_TAIL: gl.constexpr, acc, acc_t, a, b):
    """``warpgroup_mma_wait(n)`` keeping ``acc`` (and, WITH_TAIL, ``acc_t``) and the A fragments ``a`` / ``b``
    alive up to it. Returns (acc, acc_t, a, b)."""
    if WITH_TAIL:
        acc, acc_t, a, b = hopper.warpgroup_mma_wait(n, deps=[acc, acc_t, a, b])
    else:
        acc, a, b = hopper.warpgroup_mma_wait(n, deps=[acc, a, b])
    return acc, acc_t, a, b


@gluon.jit
def _pipelined_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, it, K: gl.constexpr, BK: gl.constexpr,
                     STAGES: gl.constexpr, WITH_TAIL: gl.constexpr, P3: gl.constexpr, MMA: gl.constexpr,
                     MMA_T: gl.constexpr, SW: gl.constexpr):  # fmt: skip
    """``grouped_gluon_ws._consumer_steps``'s contract (the consumers' K loop of one tile from the program's K step
    ``it``; returns (acc, acc_t, it)) in bodies of ``UNROLL`` steps, each half's dequantisation under the previous
    half's wgmma (module docstring), then the package's loop for the steps left over."""
    DOT: gl.constexpr = gl.DotOperandLayout(0, MMA, 2)
    DOT_T: gl.constexpr = gl.DotOperandLayout(0, MMA_T, 2)
    NG: gl.constexpr = 2 if WITH_TAIL else 1  # wgmma groups of one half: the BM tile, the tail tile
    NSTEP: gl.constexpr = K // BK
    cidx = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, P3)))
    csel = (cidx | 0x4440)[None, None, :]
    for _ in range(NSTEP // UNROLL):
        st = it % STAGES
        mbarrier.wait(full.index(st), (it // STAGES) & 1)
        cs, ss, xs, xts = codes_s.index(st), scl_s.index(st), x_s.index(st), xt_s.index(st)
        a0, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 0, WITH_TAIL, P3, SW, DOT, DOT_T)
        a1, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 1, WITH_TAIL, P3, SW, DOT, DOT_T)
        acc, acc_t, a0, a1 = _wait(NG, WITH_TAIL, acc, acc_t, a0, a1)  # the first half done, the second in flight
        done = st
        it += 1
        for _u in gl.static_range(1, UNROLL):
            st = it % STAGES
            mbarrier.wait(full.index(st), (it // STAGES) & 1)
            cs, ss, xs, xts = codes_s.index(st), scl_s.index(st), x_s.index(st), xt_s.index(st)
            b0, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 0, WITH_TAIL, P3, SW, DOT, DOT_T)
            acc, acc_t, a1, b0 = _wait(NG, WITH_TAIL, acc, acc_t, a1, b0)  # the previous step's second half done
            mbarrier.arrive(empty.index(done))
            b1, acc, acc_t = _half_mma(cs, ss, xs, xts, acc, acc_t, csel, 1, WITH_TAIL, P3, SW, DOT, DOT_T)
            acc, acc_t, b0, b1 = _wait(NG, WITH_TAIL, acc, acc_t, b0, b1)
            a1 = b1
            done = st
            it += 1
        acc, acc_t, a0, a1 = _wait(0, WITH_TAIL, acc, acc_t, a0, a1)
        mbarrier.arrive(empty.index(done))
    if NSTEP % UNROLL:
        acc, acc_t, it = _package_steps(codes_s, scl_s, x_s, xt_s, full, empty, acc, acc_t, it,
                                        (NSTEP % UNROLL) * BK, BK, STAGES, WITH_TAIL, P3, MMA, MMA_T, SW)  # fmt: skip
    return acc, acc_t, it


#: The gate/up epilogue's scratch of :func:`_gate_up_store_swizzled`: column-major, 8-element vectors, the phase
#: moving every 2 columns over 4 groups (docs/kernels/nvfp4-grouped.md, "The gate/up epilogue's scratch").
SCRATCH = gl.constexpr(gl.SwizzledSharedLayout(8, 2, 4, [0, 1]))


@gluon.jit
def _gate_up_store_swizzled(acc, order_ptr, pos0, end, q, gs, act_ptr, gacc_ptr, uacc_ptr, INTER: gl.constexpr,
                            TAP: gl.constexpr):  # fmt: skip
    """``grouped_gluon._gate_up_store`` with its scratch in :data:`SCRATCH` instead of row-major: the same values
    through other addresses (``python -m benchmarks.smem_banks``: 1024 wavefronts per 128 x 128 tile, not
    18432). A copy because the package writes the layout inline (a change of the package's digested source is
    what the measurement decides); only the ``allocate_shared_memory`` line differs."""
    R: gl.constexpr = acc.shape[0]
    N: gl.constexpr = acc.shape[1]
    BC: gl.constexpr = R // 2
    epi_l: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, gl.num_warps()], [0, 1])
    epi_s = gl.allocate_shared_memory(gl.float32, [R, N], SCRATCH)
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


@functools.cache
def variant(unroll: int | None = 2, swizzled: bool = False) -> types.SimpleNamespace:
    """The package kernel rebuilt around :func:`_pipelined_steps` with bodies of ``unroll`` K steps (None: the
    package's K loop) and, ``swizzled``, the gate/up epilogue :func:`_gate_up_store_swizzled`: ``kernel``,
    ``compile_sm90`` (``grouped_gluon_ws.compile_ws_sm90``'s arguments), ``gate_up`` / ``down`` (the package
    launchers' arguments). ValueError for ``unroll`` < 2."""
    if unroll is not None and unroll < 2:
        raise ValueError(f"unroll: a body of at least 2 K steps overlaps anything, got {unroll}")
    steps = pkg._consumer_steps if unroll is None else rebound(_pipelined_steps, UNROLL=gl.constexpr(unroll))
    epilogue = rebound(pkg._epilogue, _gate_up_store=_gate_up_store_swizzled) if swizzled else pkg._epilogue
    consumer = rebound(pkg._consumer, _consumer_steps=steps, _epilogue=epilogue)
    kern = rebound(pkg._ws_grouped_kernel, _consumer=consumer)
    build_args = rebound(pkg._build_args, _ws_grouped_kernel=kern)
    return types.SimpleNamespace(
        kernel=kern, compile_sm90=rebound(pkg.compile_ws_sm90, _build_args=build_args),
        gate_up=rebound(pkg.launch_ws_gate_up, _ws_grouped_kernel=kern),
        down=rebound(pkg.launch_ws_down, _ws_grouped_kernel=kern),
    )  # fmt: skip


#: The variants :func:`sass_report` and :func:`gpu_check` compare with the package: name -> :func:`variant` args.
VARIANTS = {"unroll 2": (2, False), "unroll 4": (4, False), "swizzled epilogue": (None, True),
            "unroll 2 + swizzled epilogue": (2, True)}  # fmt: skip


#: (BM, TAIL, gate_up) of the builds :func:`sass_report` compares (the default engine's DeepSeek-V3 builds).
SASS_BUILDS = ((128, 32, True), (128, 32, False), (128, 0, True), (16, 0, True))


def sass_report(H: int = 7168, I: int = 2048, k: int = 8) -> list[dict]:  # noqa: N803, E741
    """CPU: per build of :data:`SASS_BUILDS`, the package's and each of :data:`VARIANTS`: registers, spills, shared
    memory, and per loop
    around HGMMAs (shortest first) the HGMMA, wgmma-wait, ``BAR.SYNC`` and ``SYNCS`` counts; the in-flight
    register check (``benchmarks.sass_grouped_nvfp4.inflight_register_writes``) over the whole kernel."""
    from benchmarks.sass_grouped_nvfp4 import _opcode, _resources, hgmma_loops, inflight_register_writes, sass_of

    out = []
    for bm, tail, gate_up in SASS_BUILDS:
        builds = [("package", pkg.compile_ws_sm90)] + [(n, variant(*a).compile_sm90) for n, a in VARIANTS.items()]
        for name, comp in builds:
            c = comp(H, I, k, bm, tail, gate_up=gate_up)
            sass = sass_of(c.asm["cubin"])
            loops = []
            for body in sorted(hgmma_loops(sass), key=len):
                ops = [_opcode(t) for t in body]
                loops.append({"instr": len(ops), **{
                    key: sum(o.startswith(prefix) for o in ops)
                    for key, prefix in (("hgmma", "HGMMA"), ("waits", "WARPGROUP.DEPBAR"), ("bar_sync", "BAR.SYNC"),
                                        ("syncs", "SYNCS"), ("sts", "STS"), ("ldsm", "LDSM"))}})  # fmt: skip
            res = {key: v for key, v in _resources(c).items() if key != "tma"}
            out.append({"build": name, "kind": "gate_up" if gate_up else "down", "BM": bm, "TAIL": tail, **res,
                        "loops": loops, "inflight_writes": len(inflight_register_writes(sass))})  # fmt: skip
    return out


def gpu_case(layer, M: int, tail: int, variants=tuple(VARIANTS)) -> dict:
    """H200, one layer and M, row blocks of 128 pairs with ``tail``: per variant of ``variants``, act (and the
    tapped build's g_acc / u_acc) of the prototype gate/up against the package's, and y (and down_acc) of the
    prototype down against the package's on the package's act, bitwise; then every gate/up and down kernel timed
    (CUDA graphs, us)."""
    import torch

    from benchmarks.bench_grouped_nvfp4 import time_fn
    from flint_moe.kernels.nvfp4.gate_up import gate_up_buffers, w1_operands
    from flint_moe.kernels.nvfp4.permute import moe_permute
    from flint_moe.ops import make_route_counter, route

    x, router, _ = layer.inputs(M, seed=5)
    ids, _ = route(x, router, layer.k, make_route_counter(layer.device))
    perm = moe_permute(ids, layer.E, 128, tail)
    pkg.check_ws_launch("gate/up", perm, layer.H)
    pkg.check_ws_launch("down", perm, layer.I)
    w1 = w1_operands(layer.w)
    w2 = (layer.w.w2, layer.w.w2_sf_swizzled.view(torch.uint8), layer.w.w2_alpha)
    P, H, ip, dev = M * layer.k, layer.H, (layer.I + 63) // 64 * 64, x.device
    kw = {"H": H, "IP": ip, "INTER": layer.I}
    impls = {"package": (pkg.launch_ws_gate_up, pkg.launch_ws_down)}
    impls.update({n: (variant(*VARIANTS[n]).gate_up, variant(*VARIANTS[n]).down) for n in variants})

    def run(name, tap):
        gu, dn = impls[name]
        act, gacc, uacc = gate_up_buffers(P, layer.I, tap, dev)
        gu(x, perm, *w1, act, gacc, uacc, TOPK=layer.k, TAP=tap, **kw)
        y = torch.empty(P, H, dtype=torch.bfloat16, device=dev)
        dacc = torch.empty(P, H, dtype=torch.float32, device=dev) if tap else y
        dn(ref_act if ref_act is not None else act, perm, *w2, y, dacc, TAP=tap, **kw)
        out = {"act": act, "y": y}
        if tap:
            out.update(g_acc=gacc, u_acc=uacc, down_acc=dacc)
        return out

    bits = {}
    for tap in (False, True):
        ref_act = None
        ref = run("package", tap)
        ref_act = ref["act"]  # every down kernel reads the package's act
        for name in impls:
            if name != "package":
                got = run(name, tap)
                bits[f"{name}{' tapped' * tap}"] = {t: torch.equal(got[t], ref[t]) for t in ref}
        del ref
    torch.cuda.synchronize()
    act = gate_up_buffers(P, layer.I, False, dev)[0]
    pkg.launch_ws_gate_up(x, perm, *w1, act, act, act, TOPK=layer.k, TAP=False, **kw)
    runs = {}
    for name, (gu, dn) in impls.items():
        a_out = gate_up_buffers(P, layer.I, False, dev)[0]
        y = torch.empty(P, H, dtype=torch.bfloat16, device=dev)
        runs[f"gate_up {name}"] = lambda i, g=gu, o=a_out: g(x, perm, *w1, o, o, o, TOPK=layer.k, TAP=False, **kw)
        runs[f"down {name}"] = lambda i, d=dn, o=y: d(act, perm, *w2, o, o, TAP=False, **kw)
    return {"model": layer.model, "M": M, "BM": 128, "TAIL": tail, "bits_equal_package": bits,
            "us": {n: time_fn(f) * 1e6 for n, f in runs.items()}}  # fmt: skip


#: (model, M, tail) of :func:`gpu_check`: the layers whose reduction lengths the warp-specialised kernels take
#: (multiples of 128; gpt-oss-120b's H = 2880 is not), at the default engine's row blocks.
GPU_CASES = (("deepseek-v3", 4096, 32), ("deepseek-v3", 16384, 32), ("qwen3-235b-a22b", 4096, 32))


def gpu_check(cases=GPU_CASES) -> list[dict]:
    """:func:`gpu_case` for every (model, M, tail) of ``cases``, one layer alive at a time, printed as JSON lines."""
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
