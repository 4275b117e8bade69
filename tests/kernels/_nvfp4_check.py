"""Golden-model checks of the NVFP4 decode kernels' taps (shared by the interpreter and the GPU tests).

The golden model reads the same ``FlintMoEWeights`` through the independent decoder
``flint_moe.reference.layouts.experts_from_cutedsl``; order-free steps are recomputed from the kernel's own
taps and compared bit for bit, accumulators are checked against the certified bound of the kernels'
documented grouping (block model, B = 16).
"""

from __future__ import annotations

import dataclasses

import torch

from flint_moe.layouts.flashinfer_w4a16 import TENSOR_FIELDS, FlintMoEWeights
from flint_moe.reference.combine import add_shared, combine_fp32
from flint_moe.reference.exact import block_model, check_accumulator
from flint_moe.reference.experts import (
    apply_global_scale,
    down_accumulate,
    down_output,
    gate_up_accumulate,
    swiglu,
)
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.layouts import experts_from_cutedsl

FP8 = torch.float8_e4m3fn
MODEL = block_model(16)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN positions must match; NaN payloads are not compared)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        na, nb = torch.isnan(a), torch.isnan(b)
        if not torch.equal(na, nb):
            return False
        a = torch.where(na, torch.zeros_like(a), a)
        b = torch.where(nb, torch.zeros_like(b), b)
    return torch.equal(bits(a), bits(b))


def make_weights(E, H, I, *, seed=0, pad_to=None, device="cpu", scale_exp=(100, 127)) -> FlintMoEWeights:
    """Random NVFP4 experts (all E2M1 codes; E4M3 scale bytes of both signs, exponent field limited to keep
    sums in a moderate range) converted to FlintMoEWeights; gate/up global scales shared per expert."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, generator=g)

    def scales(shape):
        b = torch.randint(scale_exp[0] // 2, scale_exp[1] // 2 + 1, shape, generator=g) & 0x7F
        b = torch.where(b == 0x7F, torch.full_like(b, 0x7E), b)
        sign = torch.randint(0, 2, shape, generator=g) << 7
        return (b | sign).to(torch.uint8).view(FP8)

    s13 = scales((E, 2 * I, H // 16))
    s2 = scales((E, H, I // 16))
    gs1 = torch.rand(E, generator=g) * 2.0**-6 + 2.0**-8
    gs2 = torch.rand(E, generator=g) * 2.0**-6 + 2.0**-8
    w = FlintMoEWeights.from_modelopt(w13, s13, gs1, w2, s2, gs2, pad_intermediate_to=pad_to)
    if device != "cpu":  # FlintMoEWeights is immutable: a new one over the moved tensors (checked again)
        w = dataclasses.replace(w, **{n: getattr(w, n).to(device) for n in TENSOR_FIELDS})
    return w


def make_inputs(M, H, E, k, *, seed=0, device="cpu"):
    """x bf16 [M, H] (normal), distinct ids per token, tw fp32 holding bf16 values, shared bf16 [M, H]."""
    g = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).to(torch.int32)
    tw = to_bf16(torch.rand(M, k, generator=g) / k).to(torch.float32)
    shared = (torch.randn(M, H, generator=g) * 4).to(torch.bfloat16)
    return tuple(t.to(device) for t in (x, ids, tw, shared))


def check_taps(
    weights, x, ids, tw, shared, taps, out, *, accumulators=True, acc_pairs=None, gu_model=None, dn_model=None
):
    """Assert every order-free step bit-exact from the taps and (optionally) accumulators within bound.

    ``gu_model`` / ``dn_model``: summation models of the gate/up and down accumulators; default the kernels'
    own for their default configurations (``nvfp4_gate_up.accumulation_model()``, ``nvfp4_down.
    accumulation_model()``: the block model B = 16 of the CUDA-core path, ``FP32_TRUNCATE`` for the
    tensor-core ``MMA`` path).

    Returns a dict of counts (pairs checked, accumulator elements checked)."""
    if gu_model is None or dn_model is None:
        from flint_moe.kernels.nvfp4 import down_combine as nvfp4_down, gate_up as nvfp4_gate_up

        gu_model = gu_model or nvfp4_gate_up.accumulation_model()
        dn_model = dn_model or nvfp4_down.accumulation_model()
    dev = weights.w1.device
    cpu = lambda t: t.detach().to(dev)  # noqa: E731  (golden model on the weights' device)
    ex = experts_from_cutedsl(_cpu_weights(weights))
    x, ids, tw, shared, out = (cpu(t) for t in (x, ids, tw, shared, out))
    t = {k: cpu(v) for k, v in taps.items()}
    M, k = ids.shape
    inter = weights.valid_intermediate
    assert same(t["out"], out), "taps['out'] differs from the returned output"
    n_acc = 0
    for m in range(M):
        for j in range(k):
            e = int(ids[m, j])
            g_acc, u_acc = t["gate_acc"][m, j], t["up_acc"][m, j]
            gs1, gs2 = ex.w13_gs[e : e + 1], ex.w2_gs[e : e + 1]
            act = swiglu(apply_global_scale(g_acc, gs1), apply_global_scale(u_acc, gs1))
            assert same(t["act"][m, j], act), (
                f"act differs from the golden SwiGLU of the taps (token {m}, slot {j})"
            )
            y = down_output(t["down_acc"][m, j], gs2)
            assert same(t["y"][m, j], y), (
                f"y differs from the golden step 8 of the taps (token {m}, slot {j})"
            )
            if accumulators and (acc_pairs is None or (m, j) in acc_pairs):
                acc = gate_up_accumulate(x[m : m + 1], ex.w13[e], ex.w13_scale[e], model=gu_model)
                ok_g = check_accumulator(g_acc[None], acc[:, :inter], name="gate_acc")
                ok_u = check_accumulator(u_acc[None], acc[:, inter:], name="up_acc")
                assert bool(ok_g.all()), (
                    f"gate_acc outside the bound (token {m}, slot {j}): {int((~ok_g).sum())}"
                )
                assert bool(ok_u.all()), (
                    f"up_acc outside the bound (token {m}, slot {j}): {int((~ok_u).sum())}"
                )
                dacc = down_accumulate(t["act"][m, j][None], ex.w2[e], ex.w2_scale[e], model=dn_model)
                ok_d = check_accumulator(t["down_acc"][m, j][None], dacc, name="down_acc")
                assert bool(ok_d.all()), (
                    f"down_acc outside the bound (token {m}, slot {j}): {int((~ok_d).sum())}"
                )
                n_acc += 2 * inter + weights.hidden_size
    routed = to_bf16(combine_fp32(tw, t["y"]))
    assert same(out, add_shared(routed, shared)), (
        "out differs from the golden combine + shared add of the taps"
    )
    return {"pairs": M * k, "acc_elements": n_acc}


def _cpu_weights(weights):
    class _W:
        pass

    w = _W()
    for n in ("w1", "w1_sf", "w1_alpha", "w2", "w2_sf", "w2_alpha"):
        setattr(w, n, getattr(weights, n).detach())
    w.valid_intermediate = weights.valid_intermediate
    return w


def run_op_checked(op, check, weights, x, router, k, counter, shared, *, acc_pairs=None):
    """Run the op ``op`` (``flint_moe`` / ``flint_moe_grouped``) tapped and untapped on the same inputs: assert
    the two outputs equal bit for bit, the routing steps 1-4 (``_router_check.check_route``) and steps 5-10
    from the taps with ``check`` (``check_taps`` / ``check_grouped_taps``). Returns (taps, tapped out, out)."""
    from ._router_check import check_route

    taps: dict = {}
    out_t = op(x, router, weights, k, counter, shared, taps=taps)
    out = op(x, router, weights, k, counter, shared)
    assert same(out, out_t), "the tapped build's output differs from the production build's"
    check_route(x, router, k, taps["ids"], taps["weights"], taps)
    check(weights, x, taps["ids"], taps["weights"], shared, taps, out_t, acc_pairs=acc_pairs)
    return taps, out_t, out


def capture_graph(fn):
    """``fn()`` run once on a side stream (warm-up), then captured in a CUDA graph: returns (graph, the output
    tensor the graph writes on every replay)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def check_graph_replays(run, eager: torch.Tensor, renew, equal) -> None:
    """``run()`` captured in a CUDA graph (``capture_graph``): three replays each ``equal`` to ``eager``; then
    ``renew()`` writes new inputs in place and one more replay is ``equal`` to a fresh eager ``run()``."""
    graph, out = capture_graph(run)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert equal(out, eager)
    renew()
    graph.replay()
    torch.cuda.synchronize()
    assert equal(out, run())
