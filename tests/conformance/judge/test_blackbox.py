"""flint_moe.conformance.judge.blackbox: our own kernels judged as black boxes (no taps), and wrong callables.

The NVFP4 decode op on a ``tied_logits`` case (four experts tie for two places: six possible top-k selections)
must come out EXACT or EXPLAINED; a callable that resolves ties to the highest index (the golden model on
experts listed in reverse order) must be EXPLAINED by a routing difference (the competing logits' intervals
overlap); a callable with gate/up swapped, one with an output element off, and one returning the wrong dtype
must FAIL.
"""

from __future__ import annotations

import json

import pytest
import torch

from flint_moe.conformance.inputs.cases import Case, ShapeSpec, make_inputs
from flint_moe.conformance.judge.blackbox import _possible_selections, compare_blackbox, output_intervals
from flint_moe.conformance.judge.results import EXACT, EXPLAINED, FAIL
from flint_moe.reference.model import moe_bf16, moe_nvfp4
from flint_moe.reference.weights import BF16Experts, NVFP4Experts

NV = Case.make("nvfp4_decode", "cpu-E6-H96-I64-k3", 2, "tied_logits")
BF = Case.make("bf16_decode", ShapeSpec("bb-E6-H128-I64-k3", 6, 128, 64, 3), 2, "gaussian")


def _kernel(case):
    from flint_moe.conformance.run.paths import PATHS
    from flint_moe.ops import make_route_counter

    counter = make_route_counter("cpu")
    inputs = make_inputs(case)

    def fn(x, router_weight, weights, top_k):
        run_inputs = type(inputs)(x, router_weight, inputs.shared, inputs.logical, weights, inputs.notes)
        assert top_k == case.k
        return PATHS[case.path].run(run_inputs, counter, None)

    return inputs, fn


@pytest.fixture(scope="module")
def nv():
    inputs, fn = _kernel(NV)
    out = fn(inputs.x, inputs.router_weight, inputs.stored, NV.k)
    return inputs, (lambda *a: out.clone()), fn


def _judge(case, inputs, fn, **kw):
    return compare_blackbox(
        fn, inputs.x, inputs.router_weight, inputs.stored, case.k, inputs.logical, shared=inputs.shared,
        name=case.path, **kw,
    )  # fmt: skip


def test_own_nvfp4_kernel_as_black_box(nv) -> None:
    inputs, cached, _ = nv
    res = _judge(NV, inputs, cached)
    assert res.mode == "black-box" and res.stages == [] and res.path == "nvfp4_decode"
    e2e = res.end_to_end
    assert res.verdict in (EXACT, EXPLAINED) and e2e.unexplained == 0 and e2e.mode == "black-box"
    j = json.loads(json.dumps(res.to_json()))
    assert j["mode"] == "black-box" and j["end_to_end"]["mode"] == "black-box" and j["stages"] == []
    assert res.digests["out"] and res.meta["mode"] == "black-box"


def test_own_bf16_kernel_as_black_box() -> None:
    inputs, fn = _kernel(BF)
    res = _judge(BF, inputs, fn)
    assert res.verdict in (EXACT, EXPLAINED) and res.end_to_end.unexplained == 0


def test_tie_to_highest_index_is_explained_by_routing(nv) -> None:
    """The golden model with the experts listed in reverse order breaks the tie the other way round: another
    of the possible selections, so the differences are EXPLAINED with cause ``routing``."""
    inputs, _, _ = nv
    wl = inputs.logical
    rev = torch.arange(wl.w13.shape[0] - 1, -1, -1)
    flipped = NVFP4Experts(wl.w13[rev], wl.w13_scale[rev], wl.w13_gs[rev], wl.w2[rev], wl.w2_scale[rev],
                           wl.w2_gs[rev])  # fmt: skip

    def ties_high(x, router_weight, weights, top_k):
        return moe_nvfp4(x, router_weight[rev], flipped, top_k, inputs.shared).out

    res = _judge(NV, inputs, ties_high)
    e2e = res.end_to_end
    assert e2e.differing > 0, "test data: the tie must change the output"
    assert (res.verdict, e2e.unexplained) == (EXPLAINED, 0)
    assert e2e.causes.get("routing", 0) > 0 and all("routing" in r["causes"] for r in e2e.rows)


def test_gate_up_swapped_fails(nv) -> None:
    inputs, _, _ = nv
    wl = inputs.logical
    I = wl.w13.shape[1] // 2  # noqa: E741
    perm = torch.cat([torch.arange(I, 2 * I), torch.arange(I)])
    swapped = NVFP4Experts(wl.w13[:, perm], wl.w13_scale[:, perm], wl.w13_gs, wl.w2, wl.w2_scale, wl.w2_gs)

    def bad(x, router_weight, weights, top_k):
        return moe_nvfp4(x, router_weight, swapped, top_k, inputs.shared).out

    res = _judge(NV, inputs, bad)
    e2e = res.end_to_end
    assert res.verdict == FAIL and e2e.unexplained > e2e.elements // 2
    assert e2e.failure_details and e2e.failure_details[0]["lo"] is not None


def test_one_element_off_fails(nv) -> None:
    inputs, cached, _ = nv

    def bad(*a):
        o = cached()
        o.view(torch.int16)[1, 5] += 3  # three bf16 ulps
        return o

    res = _judge(NV, inputs, bad)
    e2e = res.end_to_end
    assert (res.verdict, e2e.unexplained, e2e.first_failures) == (FAIL, 1, [[1, 5]])
    d = e2e.failure_details[0]
    assert d["index"] == [1, 5] and d["lo"] <= d["golden"] <= d["hi"] and not d["lo"] <= d["kernel"] <= d["hi"]


def test_wrong_output_dtype_fails(nv) -> None:
    inputs, cached, _ = nv
    res = _judge(NV, inputs, lambda *a: cached().float())
    assert res.verdict == FAIL and "torch.float32" in res.end_to_end.note


def test_bad_arguments_raise(nv) -> None:
    inputs, cached, _ = nv
    with pytest.raises(TypeError, match="logical"):
        compare_blackbox(cached, inputs.x, inputs.router_weight, None, NV.k, object())
    with pytest.raises(ValueError, match="top_k"):
        compare_blackbox(cached, inputs.x, inputs.router_weight, None, 0, inputs.logical)
    with pytest.raises((TypeError, ValueError), match="x"):
        compare_blackbox(cached, inputs.x.float(), inputs.router_weight, None, NV.k, inputs.logical)


def test_possible_selections_by_hand() -> None:
    """Intervals (bf16): e0 [3, 3], e1 [1, 2], e2 [1.5, 1.5], e3 [0, 0.5]: top-2 = e0 plus e1 or e2; e3 never
    (its interval lies below both competitors')."""
    lo = torch.tensor([3.0, 1.0, 1.5, 0.0]).to(torch.bfloat16)
    hi = torch.tensor([3.0, 2.0, 1.5, 0.5]).to(torch.bfloat16)
    assert _possible_selections(lo, hi, 2) == [(0, 1), (0, 2)]
    assert _possible_selections(lo, hi, 1) == [(0,)]
    assert _possible_selections(lo, hi, 3) == [(0, 1, 2)]


def test_intervals_contain_golden_and_are_tight_on_bf16() -> None:
    """On the BF16 case the golden output lies in its own selection's interval, and intervals are narrow
    (a few bf16 ulps), i.e. the bounded explanation still fails gross faults."""
    inputs = make_inputs(BF)
    wl = inputs.logical
    assert isinstance(wl, BF16Experts)
    gold = moe_bf16(inputs.x, inputs.router_weight, wl, BF.k, inputs.shared)
    rows = output_intervals(inputs.x, inputs.router_weight, wl, BF.k, inputs.shared)
    for m, row in enumerate(rows):
        gsel = tuple(sorted(gold.ids[m].tolist()))
        (lo, hi) = next((lo, hi) for sel, lo, hi in row if sel == gsel)
        g = gold.out[m].float()
        assert bool(((lo.float() <= g) & (g <= hi.float())).all())
        width = (hi.float() - lo.float()) / g.abs().clamp(min=2.0**-20)
        assert float(width.median()) < 2.0**-5
