"""flint_moe.conformance.judge.results: the verdict order, ``worst_verdict`` and the strict-JSON form of the
result types (non-finite floats as strings), on hand-made results."""

from __future__ import annotations

import json
import math

import pytest

from flint_moe.conformance.judge.results import (
    EXACT,
    EXPLAINED,
    FAIL,
    STAGES,
    VERDICT_ORDER,
    WITHIN_BOUND,
    CaseResult,
    EndToEndResult,
    StageResult,
    worst_verdict,
)


def test_worst_verdict_follows_the_order() -> None:
    assert VERDICT_ORDER == ("EXACT", "WITHIN-BOUND", "EXPLAINED", "FAIL")
    assert worst_verdict([]) == EXACT
    assert worst_verdict([EXACT, WITHIN_BOUND, EXACT]) == WITHIN_BOUND
    assert worst_verdict([EXPLAINED, WITHIN_BOUND]) == EXPLAINED
    assert worst_verdict([FAIL, EXACT, EXPLAINED]) == FAIL
    with pytest.raises(ValueError, match="unknown verdict 'PASS'"):
        worst_verdict([EXACT, "PASS"])


def test_to_json_is_strict_json() -> None:
    s = StageResult("down_acc", "accumulation", WITHIN_BOUND, elements=4, max_ulp=math.inf, max_bound_fraction=math.nan)
    e = EndToEndResult("taps", EXACT, elements=4, max_ulp=-math.inf)
    c = CaseResult("p/s/M1/gaussian/s0", "p", WITHIN_BOUND, [s], meta={"x": math.inf}, end_to_end=e)
    d = c.to_json()
    assert d["stages"][0]["max_ulp"] == "inf" and d["stages"][0]["max_bound_fraction"] == "nan"
    assert d["end_to_end"]["max_ulp"] == "-inf" and d["meta"] == {"x": "inf"}
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    assert (d["verdict"], d["mode"], d["warnings"]) == (WITHIN_BOUND, "taps", 0)
    assert d["invariance"] == [] and d["diagnosis"] == []


def test_case_result_lookups() -> None:
    stages = [StageResult(n, "bits", FAIL if n in ("ids", "y") else EXACT, warnings=i) for i, n in enumerate(STAGES)]
    c = CaseResult("id", "p", FAIL, stages)
    assert c.stage("act") is stages[STAGES.index("act")]
    assert c.failed_stages == ["ids", "y"]
    assert c.warnings == sum(range(len(STAGES)))
    with pytest.raises(KeyError, match="no stage 'nope' in case id"):
        c.stage("nope")
