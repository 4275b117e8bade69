"""flint_moe.conformance.judge.explain on the hand-built cases of test_stages.py: the end-to-end check (returned
output vs the golden model's own run) EXPLAINS differences that come from an accumulation within its bound or
a top-k tie, FAILs those with no upstream cause, counts NaN and signed-zero positions, gives the same result
with and without the reused teacher-forced sums; logit intervals and the routing explanation by hand.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flint_moe.conformance.judge.explain import logit_intervals, routing_explained
from flint_moe.conformance.judge.results import EXPLAINED, FAIL, WITHIN_BOUND
from flint_moe.conformance.judge.stages import compare_case, expert_models
from flint_moe.reference import combine as ref_combine
from flint_moe.reference.exact import Accumulation
from flint_moe.reference.experts import swiglu
from flint_moe.reference.formats import to_bf16
from tests.conformance.judge import test_stages as TC

M, K = TC.M, TC.K
_clone, _redo_y, _redo_from_act, _redo_out = TC._clone, TC._redo_y, TC._redo_from_act, TC._redo_out
_gate_up_scaled, _down_acc, _gate_up_acc = TC._gate_up_scaled, TC._down_acc, TC._gate_up_acc


@pytest.fixture(scope="module")
def nvfp4():
    return TC._build_nvfp4()


@pytest.fixture(scope="module")
def bf16():
    return TC._build_bf16()


@pytest.fixture(scope="module", params=["nvfp4", "bf16"])
def built(request, nvfp4, bf16):
    return {"nvfp4": nvfp4, "bf16": bf16}[request.param]


def _edge(acc: Accumulation, sign: float) -> torch.Tensor:
    """fp32 values at the edge of the bound (RN32 of exact +- bound, pulled inside when it rounded out)."""
    edge = (acc.exact + sign * acc.bound).to(torch.float32)
    over = (edge.double() - acc.exact).abs() > acc.bound
    return torch.where(over, torch.nextafter(edge, acc.exact.to(torch.float32)), edge)


def _edge_run(case, inputs, taps, stage: str, sign: float) -> dict:
    t = _clone(taps)
    I = inputs.weights_logical.w13.shape[1] // 2  # noqa: E741
    for m in range(M):
        for j in range(K):
            if stage == "down_acc":
                t["down_acc"][m, j] = _edge(_down_acc(case, inputs, taps, m, j), sign)
            else:
                half = slice(0, I) if stage == "gate_acc" else slice(I, 2 * I)
                t[stage][m, j, :I] = _edge(_gate_up_acc(case, inputs, taps, m, j)[half], sign)
    if stage == "down_acc":
        _redo_y(case, inputs, t)
    else:
        for m in range(M):
            for j in range(K):
                g, u = _gate_up_scaled(case, inputs, t, m, j)
                t["act"][m, j] = swiglu(g, u)
        _redo_from_act(case, inputs, t)
    return t


def test_end_to_end_explained_by_accumulations(built) -> None:
    """Accumulators moved to the edge of their bounds (legal summation orders) change some outputs: every
    stage still conforms and the end-to-end differences are EXPLAINED (down_acc, or gate/up through act)."""
    case, inputs, taps, _ = built
    # shared = 0 (re-simulated), so that a changed routed sum is not absorbed by the shared output's rounding
    inputs = SimpleNamespace(**{**vars(inputs), "shared": torch.zeros_like(inputs.shared)})
    taps = _clone(taps)
    _redo_out(inputs, taps)
    found = None
    for stage in ("down_acc", "gate_acc", "up_acc"):
        for sign in (1.0, -1.0):
            t = _edge_run(case, inputs, taps, stage, sign)
            if not torch.equal(t["out"].view(torch.int16), taps["out"].view(torch.int16)):
                found = (stage, t)
                break
        if found:
            break
    assert found is not None, "test data: some accumulator edge must change the output"
    stage, t = found
    res = compare_case(case, inputs, t, t["out"])
    assert res.failed_stages == [] and res.stage(stage).verdict == WITHIN_BOUND
    e2e = res.end_to_end
    assert e2e.verdict == EXPLAINED and res.verdict == EXPLAINED
    assert e2e.differing >= 1 and e2e.unexplained == 0
    assert set(e2e.causes) <= ({"down_acc"} if stage == "down_acc" else {"gate_up_acc", "down_acc"})
    differ = t["out"].view(torch.int16) != taps["out"].view(torch.int16)
    assert e2e.differing == int(differ.sum()) and e2e.first_differences == torch.nonzero(differ)[:5].tolist()
    assert e2e.map["total"] == e2e.differing


def test_end_to_end_unexplained_y(built) -> None:
    """y changed although its down accumulator did not: the y stage FAILs and so does the end-to-end check."""
    case, inputs, taps, _ = built
    t = _clone(taps)
    t["y"].view(torch.int16)[0, 0, :] += 64  # far off, every element of one slot
    _redo_out(inputs, t)
    res = compare_case(case, inputs, t, t["out"])
    assert "y" in res.failed_stages and res.end_to_end.verdict == FAIL
    assert res.end_to_end.first_failures[0][0] == 0


def test_logit_intervals_and_routing_explained() -> None:
    """Hand-made router accumulations: exact 1.0 +- 2^-30 stays 1.0; exact 1.0 + 2^-8 (the bf16 midpoint
    above 1.0) +- 2^-12 spans two bf16 values; overlap decides whether a changed top-k is explained."""
    exact = torch.tensor([[1.0, 1.0 + 2.0**-8, 0.5, -3.0]], dtype=torch.float64)
    bound = torch.tensor([[2.0**-30, 2.0**-12, 0.0, 0.0]], dtype=torch.float64)
    acc = Accumulation(exact, bound, exact.abs(), torch.zeros_like(exact, dtype=torch.bool), 4)
    lo, hi = logit_intervals(acc)
    assert lo.float().tolist() == [[1.0, 1.0, 0.5, -3.0]]
    assert hi.float().tolist() == [[1.0, 1.0 + 2.0**-7, 0.5, -3.0]]
    golden = to_bf16(exact.float())[0]  # ties to even: expert 1 rounds to 1.0 too
    # golden top-2 = [0, 1] (tie, lower index first); [1, 0] is explained (equal / overlapping intervals)
    assert routing_explained(torch.tensor([1, 0]), golden, lo[0], hi[0]) == (True, None)
    # picking expert 2 (0.5) over expert 1 (>= 1.0) is not
    assert routing_explained(torch.tensor([0, 2]), golden, lo[0], hi[0]) == (False, (2, 1))


def test_end_to_end_reuse_matches_fresh_golden(built) -> None:
    """compare_case reuses its teacher-forced golden sums in the end-to-end run (rows whose act agrees with
    the golden act); a fresh golden run (no cache) must give the same end-to-end result."""
    from flint_moe.conformance.judge.explain import end_to_end_taps

    case, inputs, taps, _ = built
    t = _clone(taps)
    t["act"].view(torch.int16)[1, 0, :8] += 3  # row (1, 0) of act differs: its down sum is recomputed
    _redo_from_act(case, inputs, t)
    res = compare_case(case, inputs, t, t["out"])
    fresh = end_to_end_taps(
        case.path, expert_models(case.path), inputs.weights_logical, inputs.x, inputs.router_weight,
        inputs.shared, K, t, t["out"],
    )  # fmt: skip
    a, b = res.end_to_end.to_json(), fresh.to_json()
    assert a == b and a["differing"] > 0


def test_end_to_end_nan_and_signed_zero_positions(nvfp4) -> None:
    """A NaN where the golden output is finite and a -0 where it is +0 (routed + shared = 0 makes +0 under the
    rule: the sign is fixed) are unexplained differences, counted as such."""
    case, inputs, taps, out = nvfp4
    # make out[1, 2] an exact zero by construction: shared = -routed there (re-simulated kernel output)
    t = _clone(taps)
    routed = ref_combine(t["weights"].contiguous(), t["y"].contiguous())
    shared = inputs.shared.clone()
    shared[1, 2] = -routed[1, 2]
    ins = SimpleNamespace(**{**vars(inputs), "shared": shared})
    _redo_out(ins, t)
    assert t["out"][1, 2].item() == 0.0 and not torch.signbit(t["out"][1, 2].float())
    bad = t["out"].clone()
    bad[0, 1] = float("nan")
    bad[1, 2] = -0.0
    t["out"] = bad
    e2e = compare_case(case, ins, t, bad).end_to_end
    assert (e2e.verdict, e2e.differing, e2e.unexplained) == (FAIL, 2, 2)
    assert (e2e.nan_mismatches, e2e.signed_zero_mismatches) == (1, 1)
    assert e2e.first_failures == [[0, 1], [1, 2]] and e2e.max_ulp == float("inf")
