"""The judge replays a stage's experts together (``expert_steps.expert_replays``): on a CPU NVFP4 grouped case
judged against the grouped kernels' declared tensor-core orders, each accumulation stage's count of accumulators
that differ from the replay equals the count against the single-expert replay computed here independently
(``reference.orders.replay_matmul`` on the dequantised weights, one (token, slot) pair at a time). The
interpreter does not run the GPU's tensor-core order, so the counts, not EXACT, are what is checked (the H200
run shows the EXACT verdicts)."""

from __future__ import annotations

import re

import torch

from flint_moe.conformance.inputs.cases import make_inputs, matrix
from flint_moe.conformance.judge.stages import compare_case
from flint_moe.conformance.run.paths import declared_orders, path_for
from flint_moe.ops import make_route_counter
from flint_moe.reference import experts as ref
from flint_moe.reference.orders import replay_matmul

CASE = "nvfp4_grouped/cpu-E6-H96-I64-k3/M12/gaussian/s0"


def _differing(note: str) -> int:
    if "bitwise equal to the replay" in note:
        return 0
    m = re.search(r"order differs from declared: (\d+) of \d+ accumulators", note)
    assert m, note
    return int(m.group(1))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.contiguous().view(torch.int32) == b.contiguous().view(torch.int32)


def test_batched_replay_counts_match_the_single_expert_replay(monkeypatch):
    monkeypatch.setenv("FLINT_REPLAY_ROWS", "64")  # every row of the M = 12 case replayed
    case = next(c for c in matrix("cpu") if c.id == CASE)
    inputs = make_inputs(case, "cpu")
    taps: dict = {}
    out = path_for(case).run(inputs, make_route_counter("cpu"), taps)
    orders = declared_orders(case)
    res = compare_case(case, inputs, taps, out, orders=orders)
    by = {st.stage: st for st in res.stages}
    wl = inputs.logical
    ids = taps["ids"].long()
    I = wl.w13.shape[1] // 2  # noqa: E741
    want = {"gate_acc": 0, "up_acc": 0, "down_acc": 0}
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            w13 = ref.dequant_nvfp4(wl.w13[e], wl.w13_scale[e])
            gu = replay_matmul(orders["gate_up"], inputs.x[t : t + 1].float(), w13)
            want["gate_acc"] += int((~_same_bits(taps["gate_acc"][t, j, :I], gu[0, :I])).sum())
            want["up_acc"] += int((~_same_bits(taps["up_acc"][t, j, :I], gu[0, I:])).sum())
            act = taps["act"][t : t + 1, j, :I].float()
            dn = replay_matmul(orders["down"], act, ref.dequant_nvfp4(wl.w2[e], wl.w2_scale[e]))
            want["down_acc"] += int((~_same_bits(taps["down_acc"][t, j], dn[0])).sum())
    for stage, n in want.items():
        assert _differing(by[stage].note) == n, (stage, by[stage].note)
    assert sum(want.values()) > 0  # the interpreter's order differs somewhere: the counts are informative
