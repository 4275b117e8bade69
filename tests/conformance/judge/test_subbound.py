"""Sub-bound faults on the CPU: the interpreter runs the BF16 decode kernels' declared order, so the order
replay must kill every visible mutant, while the any-order bound alone lets those inside it pass."""

from __future__ import annotations

import pytest

from flint_moe.conformance.judge.subbound import SUB_BOUND_CASES, SUB_BOUND_FAULTS, run_sub_bound, sub_bound_report
from flint_moe.conformance.report.summary import mutation_line


@pytest.fixture(scope="module")
def results():
    return run_sub_bound(device="cpu")


def test_every_fault_tried_on_every_case(results):
    assert [(r.case_id, r.fault) for r in results] == [
        (c, f) for c in SUB_BOUND_CASES["cpu"] for f in SUB_BOUND_FAULTS
    ]


def test_replay_kills_every_visible_mutant(results):
    seen = [r for r in results if not r.note]
    assert len(seen) >= 4, [(r.fault, r.note) for r in results]
    for r in seen:
        assert r.killed_by_replay, r
        # the bound alone kills exactly the mutants that leave it
        assert r.killed_by_bound == (not r.within_bound), r


def test_inside_the_bound_only_the_replay_kills(results):
    inside = [r for r in results if not r.note and r.within_bound]
    assert {"one_ulp", "swap_two_terms"} <= {r.fault for r in inside}
    assert not any(r.killed_by_bound for r in inside)


def test_report_block_and_line(results):
    rep = sub_bound_report(results)
    assert rep["replay_kill_rate"] == 1.0 and rep["bound_kill_rate"] < 1.0
    line = mutation_line({"total": 1, "killed": 1, "named": 1, "kill_rate": 1.0, "results": [], "sub_bound": rep})
    assert "killed by the order replay 100.0%" in line and "by the bound alone" in line
