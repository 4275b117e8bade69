"""Order replay in the stage comparison: a kernel whose accumulators follow its declared order is EXACT at every
accumulation stage and end to end; the same run judged against a changed declaration FAILs with "order differs
from declared"; a large case replays a deterministic sample of rows.

On the CPU the Triton interpreter runs the router GEMV and the BF16 decode kernels' documented orders exactly
(explicit fma chains and adjacent-pair trees in the kernel code), so their taps equal the replay here; the
NVFP4 paths' GPU orders (tensor cores, warp shuffles) are checked on the H200 (tests/kernels/test_orders_gpu.py).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from flint_moe.conformance.judge.replay import REPLAY_ROWS, replay_row_count, replay_rows
from flint_moe.conformance.judge.results import ACCUMULATION_STAGES, EXACT, FAIL
from flint_moe.conformance.judge.stages import compare_case
from flint_moe.kernels import orders as K
from flint_moe.reference.weights import BF16Experts

E, H, I, TOP_K = 6, 128, 64, 3  # noqa: E741


def _bf16_run(m: int):
    from flint_moe.layouts import to_trtllm_bf16, trtllm_bf16_row_maps
    from flint_moe.ops import make_route_counter
    from flint_moe.ops.moe_bf16 import flint_moe_bf16_decode

    g = torch.Generator().manual_seed(11 + m)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) * 0.05).to(torch.bfloat16)
    g1, g2 = to_trtllm_bf16(w13, w2)
    x = torch.randn(m, H, generator=g).to(torch.bfloat16)
    router = (torch.randn(E, H, generator=g) * 0.1).to(torch.bfloat16)
    shared = (torch.randn(m, H, generator=g) * 0.1).to(torch.bfloat16)
    taps: dict = {}
    maps = trtllm_bf16_row_maps(H, I)
    out = flint_moe_bf16_decode(x, router, g1, g2, maps, TOP_K, make_route_counter("cpu"), shared, taps=taps)
    inputs = SimpleNamespace(x=x, router_weight=router, shared=shared, weights_logical=BF16Experts(w13, w2))
    case = SimpleNamespace(id=f"bf16_decode/tiny/M{m}/gaussian/s0", path="bf16_decode", k=TOP_K, M=m, H=H, I=I)
    return case, inputs, taps, out, K.bf16_decode_orders(H, I, M=m)


@pytest.fixture(scope="module")
def bf16_m3():
    return _bf16_run(3)


def test_declared_orders_replayed_bitwise_give_exact(bf16_m3):
    case, inputs, taps, out, orders = bf16_m3
    res = compare_case(case, inputs, taps, out, orders=orders)
    for st in res.stages:
        assert st.verdict == EXACT, (st.stage, st.verdict, st.note)
        if st.stage in ACCUMULATION_STAGES:
            assert "bitwise equal to the replay of the declared order" in st.note
            assert st.exact == st.elements > 0  # exact counts agreement with the replay
    assert res.end_to_end.verdict == EXACT and res.verdict == EXACT
    bound_only = compare_case(case, inputs, taps, out)
    fewer = [s for s in bound_only.stages if s.stage in ACCUMULATION_STAGES and s.exact < s.elements]
    assert fewer, "some accumulators differ from RN32 of the exact sum (what exact counts without a replay)"


def test_without_orders_the_bound_alone_judges(bf16_m3):
    case, inputs, taps, out, _ = bf16_m3
    res = compare_case(case, inputs, taps, out)  # CPU: no replay ("auto" gives none off the GPU)
    for st in res.stages:
        if st.stage in ACCUMULATION_STAGES:
            assert "replay" not in st.note


@pytest.mark.parametrize("stage,tap", [("gate_up", "gate_acc"), ("down", "down_acc"), ("router", "router_acc")])
def test_changed_declaration_fails_with_order_differs(bf16_m3, stage, tap):
    case, inputs, taps, out, orders = bf16_m3
    wrong = copy.deepcopy(orders)
    tree = next(s for s in wrong[stage]["program"] if s["op"] == "tree")
    tree["shape"] = "halves"  # a butterfly instead of the kernel's adjacent-pair tree: the declaration only
    res = compare_case(case, inputs, taps, out, orders=wrong)
    st = next(s for s in res.stages if s.stage == tap)
    assert st.verdict == FAIL and "order differs from declared" in st.note, st.note
    assert res.verdict == FAIL
    assert st.first_failures, "the differing accumulators are located"


def test_replay_rows_sample():
    assert replay_rows(5).tolist() == [0, 1, 2, 3, 4]
    r = replay_rows(4096, 64)
    assert len(r) == 64 and r[0] == 0 and r[-1] == 4095 and bool((r[1:] > r[:-1]).all())


def test_replay_row_count(monkeypatch):
    monkeypatch.delenv("FLINT_REPLAY_ROWS", raising=False)
    assert replay_row_count() == REPLAY_ROWS == len(replay_rows(4096))
    monkeypatch.setenv("FLINT_REPLAY_ROWS", "64")
    assert replay_row_count() == 64 and replay_rows(64).tolist() == list(range(64))
    for bad in ("0", "-3", "x"):
        monkeypatch.setenv("FLINT_REPLAY_ROWS", bad)
        with pytest.raises(ValueError, match="FLINT_REPLAY_ROWS"):
            replay_row_count()


def test_large_case_replays_sampled_rows(monkeypatch):
    case, inputs, taps, out, orders = _bf16_run(5)
    monkeypatch.setattr("flint_moe.conformance.judge.replay.REPLAY_ROWS", 2)
    res = compare_case(case, inputs, taps, out, orders=orders)
    for st in res.stages:
        assert st.verdict == EXACT, (st.stage, st.note)
        if st.stage in ACCUMULATION_STAGES:
            assert "on 2 sampled rows of 5" in st.note, st.note
    assert res.end_to_end.verdict == EXACT and "sampled rows of 5" in res.end_to_end.note
    # a sampled row's accumulator off by one ulp: the replay catches it, the bound alone does not
    bad = {n: v.clone() for n, v in taps.items()}
    acc = bad["down_acc"]
    acc[4, 0, 0] = torch.nextafter(acc[4, 0, 0], torch.tensor(float("inf")))
    res = compare_case(case, inputs, bad, out, orders=orders)
    st = next(s for s in res.stages if s.stage == "down_acc")
    assert st.verdict == FAIL and "order differs from declared" in st.note
    assert next(s for s in compare_case(case, inputs, bad, out).stages if s.stage == "down_acc").verdict != FAIL
