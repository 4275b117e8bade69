"""BF16 TRT-LLM-layout decode on the H200 (compiled kernels, sm_90): the GPU half of the BF16 decode tests.

Run: ``PYTHONPATH=$PWD python -m pytest -q -m gpu tests/kernels/test_bf16_decode_gpu.py`` on a CUDA machine
(TRITON_INTERPRET unset). For M = 1..8 at Qwen3-30B-A3B (E=128, H=2048, I=768, k=8) and gpt-oss-like shapes
(H = I = 2880 read as is, and I padded to 2944 for FlashInfer's launcher; fewer experts than the model to keep
the golden model fast) plus an I = 704 shape:

- every accumulator tap (gate_acc, up_acc, down_acc) within the golden model's certified bound, and bit-equal
  to a replay of the summation order the kernels document (flint_moe/kernels/bf16/gemv.py);
- every order-free step bit-exact from the taps: routing weights (steps 2-4 from the router's logits),
  SwiGLU with the hardware ex2/rcp against the golden emulation (step 7), y (step 8), combine and shared add
  (steps 9-10);
- tapped == production; repeated runs and CUDA-graph replays bitwise identical; launch configurations
  (rows per program, warps, unrolling) never change a bit; the shared_ready event path gives the same bits.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe import reference as R

from ._bf16_check import _bits, assert_same, replay_order, trtllm_experts

BACKEND = "gpu"
pytestmark = pytest.mark.gpu

#: (name, E, H, I, pad_to, k)
SHAPES = [
    ("qwen3-30b-a3b", 128, 2048, 768, None, 8),
    ("gpt-oss-like-I2880", 32, 2880, 2880, None, 4),
    ("gpt-oss-like-I2944pad", 32, 2880, 2880, 128, 4),
    ("H5120-I704", 24, 5120, 704, None, 8),
]
TOKENS = list(range(1, 9))


@pytest.fixture(scope="module", params=SHAPES, ids=[s[0] for s in SHAPES])
def model(request) -> dict:
    from flint_moe.ops.route import make_route_counter

    name, e, h, i, pad_to, k = request.param
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1234)
    c = trtllm_experts(gen, e, h, i, pad_to, gate=(0.03, 0.002), up=(0.05, -0.003), w2_scale=0.03)
    torch.cuda.empty_cache()
    return dict(
        c, name=name, k=k, router=(torch.randn(e, h, generator=gen, device=dev) * 0.05).to(torch.bfloat16),
        counter=make_route_counter(dev), gen=gen,
    )  # fmt: skip


def _inputs(mdl: dict, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(m, mdl["H"], generator=mdl["gen"], device="cuda").to(torch.bfloat16)
    shared = (torch.randn(m, mdl["H"], generator=mdl["gen"], device="cuda") * 0.1).to(torch.bfloat16)
    return x, shared


def _op(mdl: dict, x: torch.Tensor, shared: torch.Tensor, taps=None, shared_ready=None, **kw) -> torch.Tensor:
    from flint_moe.ops.moe_bf16 import flint_moe_bf16_decode

    return flint_moe_bf16_decode(
        x,
        mdl["router"],
        mdl["g1"],
        mdl["g2"],
        mdl["maps"],
        mdl["k"],
        mdl["counter"],
        shared,
        shared_ready,
        taps=taps,
        **kw,
    )


@pytest.mark.parametrize("m", TOKENS)
def test_decode_conforms(model, m: int) -> None:
    mdl = model
    i, ip, k = mdl["I"], mdl["Ip"], mdl["k"]
    x, shared = _inputs(mdl, m)
    taps: dict = {}
    out = _op(mdl, x, shared, taps)
    torch.cuda.synchronize()
    ids, tw = taps["ids"], taps["weights"]
    assert ids.shape == (m, k) and ids.dtype == torch.int32

    # steps 2-4 from the router's own bf16 logits (order-free)
    logits = taps["logits"]
    assert torch.equal(ids.long().cpu(), R.topk_total_order(logits.cpu(), k).long())
    sel = torch.gather(logits.cpu(), 1, ids.long().cpu())
    assert_same(tw, R.renormalize(R.routing_scores(sel)), "weights")

    full = mdl["padded"]  # with the Ip padded columns
    w13p, w2p = full.w13, full.w2
    for t in range(m):
        xt = x[t].float()
        for j in range(k):
            e = int(ids[t, j])
            # step 6 accumulators: certified bound against the exact sums, and the documented order
            acc = R.gate_up_accumulate_bf16(x[t : t + 1], mdl["golden"].w13[e])
            g, u = taps["gate_acc"][t, j], taps["up_acc"][t, j]
            ok_g = R.check_accumulator(g[:i][None], acc[:, :i])
            ok_u = R.check_accumulator(u[:i][None], acc[:, i:])
            assert bool(ok_g.all()) and bool(ok_u.all()), (mdl["name"], m, t, j)
            assert_same(g, replay_order(w13p[e, :ip].float(), xt), f"gate_acc order ({t},{j})")
            assert_same(u, replay_order(w13p[e, ip:].float(), xt), f"up_acc order ({t},{j})")
            # step 8 accumulator on the kernel's own act
            a = taps["act"][t, j]
            dacc = R.down_accumulate_bf16(a[:i][None], mdl["golden"].w2[e])
            assert bool(R.check_accumulator(taps["down_acc"][t, j][None], dacc).all()), (mdl["name"], m, t, j)
            assert_same(
                taps["down_acc"][t, j], replay_order(w2p[e].float(), a.float()), f"down order ({t},{j})"
            )

    # order-free steps, bit for bit from the taps (golden model on the CPU)
    act_gold = R.swiglu(taps["gate_acc"].cpu().contiguous(), taps["up_acc"].cpu().contiguous())
    assert_same(taps["act"], act_gold, "act (hardware ex2/rcp/cvt vs golden emulation)")
    if ip > i:
        assert not bool(_bits(taps["act"][:, :, i:]).any()), "padded intermediate columns must give act = +0"
    y_gold = R.down_output_bf16(taps["down_acc"].cpu())
    assert_same(taps["y"], y_gold, "y")
    out_gold = R.add_shared(R.combine(tw.cpu(), taps["y"].cpu()), shared.cpu())
    assert_same(out, out_gold, "out")
    assert taps["out"] is out

    # production build, repeated: the same bits
    for rep in range(3):
        assert_same(_op(mdl, x, shared), out, f"production run {rep}")


@pytest.mark.parametrize("m", [1, 3, 8])
def test_cuda_graph_replays_are_bitwise_identical(model, m: int) -> None:
    mdl = model
    x, shared = _inputs(mdl, m)
    eager = _op(mdl, x, shared)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _op(mdl, x, shared)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _op(mdl, x, shared)
    for rep in range(5):
        static_out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert_same(static_out, eager, f"graph replay {rep}")
    # new inputs copied into the captured buffers: the replay follows them
    x2, shared2 = _inputs(mdl, m)
    x.copy_(x2)
    shared.copy_(shared2)
    graph.replay()
    torch.cuda.synchronize()
    assert_same(static_out, _op(mdl, x2, shared2), "graph replay on new inputs")


def test_launch_config_never_changes_a_bit(model) -> None:
    """The summation order is fixed per row: rows per program, warps and unrolling change no bit."""
    from flint_moe.kernels.bf16.down_combine import bf16_down_combine
    from flint_moe.kernels.bf16.gate_up import bf16_gate_up

    mdl = model
    m = 4
    x, shared = _inputs(mdl, m)
    taps: dict = {}
    ref = _op(mdl, x, shared, taps)
    ids, tw = taps["ids"], taps["weights"]
    configs = [
        (dict(BN=1, num_warps=1, UNROLL=1), dict(BH=1, num_warps=1, UNROLL=1)),
        (dict(BN=4, num_warps=1, UNROLL=8), dict(BH=8, num_warps=2, UNROLL=2)),
        (dict(BN=16, num_warps=4, UNROLL=2), dict(BH=16, num_warps=4, UNROLL=8)),
        (dict(BN=64, num_warps=8, UNROLL=1), dict(BH=64, num_warps=8, UNROLL=1)),
    ]
    for gu, dn in configs:
        t2: dict = {}
        act = bf16_gate_up(x, ids, mdl["g1"], mdl["maps"][0], taps=t2, config=gu)
        out = bf16_down_combine(act, ids, tw, mdl["g2"], mdl["maps"][1], shared, taps=t2, config=dn)
        for key in ("gate_acc", "up_acc", "act", "down_acc", "y"):
            assert_same(t2[key], taps[key], f"{key} {gu} {dn}")
        assert_same(out, ref, f"out {gu} {dn}")


def test_shared_ready_event(model) -> None:
    """shared_output produced on a side stream and signalled by an event: same bits as the plain call."""
    mdl = model
    x, shared = _inputs(mdl, 2)
    ref = _op(mdl, x, shared)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sh2 = shared * 1  # produced on the side stream (exact copy)
        ev = torch.cuda.Event()
        ev.record(side)
    out = _op(mdl, x, sh2, shared_ready=ev)
    torch.cuda.synchronize()
    assert_same(out, ref, "shared_ready")


def test_row_map_checks_on_the_gpu(model) -> None:
    """Map values out of range read the layout's own rows (same bits); a wrong in-range value written behind
    the version counter is reported by ``check_row_map_status``; every map the tests above used is intact."""
    from flint_moe.ops import check_row_map_status

    mdl = model
    check_row_map_status("cuda")
    x, shared = _inputs(mdl, 3)
    ref = _op(mdl, x, shared)
    m13, m2 = mdl["maps"]
    h, two_ip = m2.numel(), m13.numel()
    bad13, bad2 = m13.clone(), m2.clone()
    bad13[0], bad13[two_ip - 1], bad2[0], bad2[h - 1] = 1 << 30, -1, two_ip + h, -(1 << 31)
    assert_same(_op(dict(mdl, maps=(bad13, bad2)), x, shared, check_row_map_values=False), ref, "out of range")
    ok13 = m13.clone()
    try:  # behind the version counter: the op's first-use check passes it
        m13.data[0], m13.data[1] = ok13[1], ok13[0]
        _op(mdl, x, shared)
        with pytest.raises(RuntimeError, match=r"^row_maps\[0\]: the map13 tensor on cuda:0 .* entry 0 holds"):
            check_row_map_status("cuda")
    finally:
        m13.data.copy_(ok13)
    assert_same(_op(mdl, x, shared), ref, "repaired")  # checked again (it was forgotten when reported)
    check_row_map_status("cuda")
