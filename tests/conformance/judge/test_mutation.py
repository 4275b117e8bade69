"""flint_moe.conformance.judge.mutation: every catalogued fault, injected into a kernel path, is killed and named.

Each parameter is one mutation (a fault on one path; mutation.py says how it is injected: tampered stored
weights, a wrapped path, or a post-processed tap). The harness must FAIL the case (killed) and
``faults.diagnose`` must name the fault (named). Clean kernel runs are shared between the tap mutations of a
case (module cache); each weights / path mutation is one more interpreter run of the smallest cpu shape.
"""

from __future__ import annotations

import json

import pytest

from flint_moe.conformance.inputs.block import BLOCK_PATHS
from flint_moe.conformance.judge.faults import FAULTS
from flint_moe.conformance.judge.mutation import MUTATIONS, MutationResult, mutation_report, run_mutation
from tests.conformance import ll_standin


@pytest.fixture(scope="module")
def cache():
    return {}


def test_every_catalogued_fault_has_a_mutation() -> None:
    names = {f.name for f in FAULTS}
    covered = {m.fault for m in MUTATIONS}
    assert covered == names, f"faults without a mutation: {sorted(names - covered)}"
    for m in MUTATIONS:
        f = next(f for f in FAULTS if f.name == m.fault)
        assert f.applies(m.path), (m.fault, m.path)
        assert m.injection in ("weights", "path", "tap")


@pytest.mark.parametrize("mut", MUTATIONS, ids=[f"{m.fault}-{m.path}" for m in MUTATIONS])
def test_mutation_killed_and_named(mut, cache, monkeypatch) -> None:
    if mut.path in BLOCK_PATHS:  # the block's CuTe kernels need a GPU: the golden stand-in kernel side on the CPU
        ll_standin.install(monkeypatch)
    res = run_mutation(mut, cache=cache, device="cpu")
    assert "invisible" not in res.note, f"test data cannot show {mut.fault}: {res.note}"
    assert res.killed, f"{mut.fault} on {mut.path} not killed: verdict {res.verdict}"
    fault = next(f for f in FAULTS if f.name == mut.fault)
    assert fault.stage in res.failed_stages, (fault.stage, res.failed_stages)
    assert res.named, f"{mut.fault} not named; diagnosis {res.diagnosis}"
    assert f"{mut.fault}: matches the reference with {fault.what}" in res.diagnosis
    j = json.loads(json.dumps(res.to_json()))
    assert j["name"] == j["fault"] == mut.fault and j["killed"] and j["named"]


def test_mutation_report_counts() -> None:
    """mutation_report from hand-built results: kill rate = killed AND named / total; untested faults."""
    rs = [
        MutationResult("gate_up_swapped", "nvfp4_decode", "c1", "tap", killed=True, named=True, verdict="FAIL"),
        MutationResult("renorm_no_eps", "nvfp4_decode", "c2", "tap", killed=True, named=False, verdict="FAIL"),
        MutationResult("nibble_order_swapped", "nvfp4_decode", "c3", "weights", killed=False, verdict="EXACT"),
    ]
    rep = mutation_report(rs)
    assert (rep["killed"], rep["named"], rep["total"]) == (2, 1, 3)
    assert rep["kill_rate"] == pytest.approx(1 / 3)
    assert rep["catalogue"] == [f.name for f in FAULTS]
    assert set(rep["untested"]) == {f.name for f in FAULTS} - {"gate_up_swapped", "renorm_no_eps",
                                                                "nibble_order_swapped"}  # fmt: skip
    assert [r["fault"] for r in rep["results"]] == [r.fault for r in rs]
    json.dumps(rep)
    assert mutation_report([])["kill_rate"] == 0.0
