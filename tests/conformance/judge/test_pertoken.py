"""The per-token paths' judge (flint_moe/conformance/judge/pertoken.py) on the CPU (Triton interpreter).

A clean run is EXACT at every stage of PERTOKEN_STAGES; one flipped bit in a tap makes that stage the first
failing one (earlier stages never read it; a later stage may fail where the golden model, fed the flipped tap,
disagrees with what the kernel computed from the true value); an accumulator moved far outside its bound fails
its accumulation stage; a missing tap fails its stage with a note.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.conformance.inputs.cases import PERTOKEN_SHAPES, Case, make_inputs
from flint_moe.conformance.judge.pertoken import PERTOKEN_STAGES, compare_pertoken
from flint_moe.conformance.judge.results import EXACT, FAIL
from flint_moe.conformance.run.paths import PATHS


@pytest.fixture(scope="module")
def run():
    case = Case.make("nvfp4_pertoken_swiglu", PERTOKEN_SHAPES["cpu"], 3, "dispatcher")
    inputs = make_inputs(case)
    taps: dict = {}
    out = PATHS[case.path].run(inputs, None, taps)
    return case, inputs, taps, out


def _verdicts(res):
    return {s.stage: s.verdict for s in res.stages}


def test_clean_run_is_exact_everywhere(run):
    case, inputs, taps, out = run
    res = compare_pertoken(case, inputs, taps, out)
    assert [s.stage for s in res.stages] == list(PERTOKEN_STAGES)
    assert res.verdict == EXACT and set(_verdicts(res).values()) == {EXACT}
    assert res.meta["token_capacity"] == 3 and res.meta["order_replay"] is False  # CPU: bound only


@pytest.mark.parametrize("stage", ["x_token_scale", "h", "act", "a_codes", "y", "w"])
def test_one_flipped_bit_is_the_first_failing_stage(run, stage):
    case, inputs, taps, out = run
    t = dict(taps)
    local = taps["local"]
    v = taps[stage].clone()
    flat = v.view(torch.uint8).reshape(-1) if v.dtype == torch.uint8 else v.view(torch.int32).reshape(-1)
    idx = int(local.nonzero()[0, 0]) if stage == "x_token_scale" else 0
    if v.dim() >= 2:  # a local slot's first element
        r, j = (int(i) for i in local.nonzero()[0])
        idx = (r * v.shape[1] + j) * (v[0, 0].numel())
    flat[idx] ^= 1
    t[stage] = v
    res = compare_pertoken(case, inputs, t, out)
    failing = [s for s, vd in _verdicts(res).items() if vd == FAIL]
    assert failing and failing[0] == stage, failing


def test_accumulator_outside_bound_and_missing_tap(run):
    case, inputs, taps, out = run
    t = dict(taps)
    r, j = (int(i) for i in taps["local"].nonzero()[0])
    acc = taps["fc2_acc"].clone()
    acc[r, j, 5] = acc[r, j, 5] * 2 + 1
    t["fc2_acc"] = acc
    del t["w"]
    res = compare_pertoken(case, inputs, t, out)
    v = _verdicts(res)
    assert v["fc2_acc"] == FAIL and v["w"] == FAIL and v["a_token_scale"] == EXACT
    assert [s for s, vd in v.items() if vd == FAIL][0] == "fc2_acc"
    assert "missing" in res.stage("w").note
