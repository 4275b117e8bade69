"""flint_moe.conformance.faults: mutation testing of the diagnosis (issue 5 "Diagnosis and self-test").

Each catalogued fault is injected into a tiny interpreter case (test_compare.py's builders) by rewriting the
taps the way a kernel with that fault would produce them (downstream stages re-simulated); the comparison
must FAIL that stage and ``diagnose`` must name exactly that fault. The kill rate is asserted to be 100 %.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from flint_moe.conformance.compare import FAIL, compare_case
from flint_moe.conformance.faults import FAULTS, diagnose
from flint_moe.reference.experts import SWIGLU_C, swiglu
from flint_moe.reference.formats import round_bf16, to_bf16
from flint_moe.reference.mufu import ex2_approx_ftz, rcp_approx_ftz
from flint_moe.reference.routing import routing_scores, total_order_key


def _tc():
    spec = importlib.util.spec_from_file_location("_conf_test_compare", Path(__file__).with_name("test_compare.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(mod)
    return sys.modules[spec.name]


TC = _tc()
_ROUTER = TC._router


def _tiny_router(gen, e, h):
    """Every logit near -45 (the TIE experts' near -42): sigmoids ~1e-19, where the epsilon matters."""
    w = _ROUTER(gen, e, h).float()
    w[:, 0] = -15.0
    w[TC.TIE[0], 0] = w[TC.TIE[1], 0] = -14.0
    return w.to(torch.bfloat16)


@pytest.fixture(scope="module")
def cases():
    nv, bf = TC._build_nvfp4(), TC._build_bf16()
    orig = TC._router
    TC._router = _tiny_router
    try:
        tiny = TC._build_nvfp4()
    finally:
        TC._router = orig
    return {"nvfp4": nv, "bf16": bf, "tiny_sigmoids": tiny}


def _per_pair_act(case, inputs, t, fn):
    for m in range(case.M):
        for j in range(case.k):
            g, u = TC._gate_up_scaled(case, inputs, t, m, j)
            t["act"][m, j] = fn(g, u)
    TC._redo_from_act(case, inputs, t)


def _sigmoid_rcp(g):
    return rcp_approx_ftz(ex2_approx_ftz(g * SWIGLU_C) + 1.0)


# -- the mutations: (case key, stage, injector(case, inputs, t)) per fault ----------------------------------


def _m_gate_up(case, inputs, t):
    _per_pair_act(case, inputs, t, lambda g, u: swiglu(u, g))


def _m_act_twice(case, inputs, t):
    _per_pair_act(case, inputs, t, lambda g, u: to_bf16(u * to_bf16(g * _sigmoid_rcp(g)).float()))


def _m_exact_sigmoid(case, inputs, t):
    _per_pair_act(case, inputs, t, lambda g, u: to_bf16(u * (g * torch.sigmoid(g.double()).float())))


def _m_scale_after(case, inputs, t):
    for m in range(case.M):
        for j in range(case.k):
            gs = inputs.weights_logical.w2_gs[int(t["ids"][m, j])]
            t["y"][m, j] = to_bf16(to_bf16(t["down_acc"][m, j].contiguous()).float() * gs)
    TC._redo_out(inputs, t)


def _m_ties_highest(case, inputs, t):
    E = t["logits"].shape[1]
    key = total_order_key(t["logits"]).long() * E + torch.arange(E)
    bad = torch.topk(key, case.k, dim=1).indices.to(torch.int32)
    assert not torch.equal(bad, t["ids"])
    perm = [1, 0]
    t["ids"] = bad
    for name in ("weights", "gate_acc", "up_acc", "act", "down_acc", "y"):
        t[name] = t[name][:, perm].contiguous()
    TC._redo_out(inputs, t)


def _m_no_eps(case, inputs, t):
    s = routing_scores(torch.gather(t["logits"], 1, t["ids"].long()))
    t["weights"] = round_bf16(s / (s[:, 0] + s[:, 1])[:, None])
    TC._redo_out(inputs, t)


MUTATIONS = {
    "gate_up_swapped": [("nvfp4", "act", _m_gate_up), ("bf16", "act", _m_gate_up)],
    "act_rounded_twice": [("nvfp4", "act", _m_act_twice), ("bf16", "act", _m_act_twice)],
    "global_scale_after_round": [("nvfp4", "y", _m_scale_after)],
    "topk_ties_highest": [("nvfp4", "ids", _m_ties_highest), ("bf16", "ids", _m_ties_highest)],
    "renorm_no_eps": [("tiny_sigmoids", "weights", _m_no_eps)],
}


def _inject(cases, key, stage, fn):
    case, inputs, taps, _ = cases[key]
    t = TC._clone(taps)
    fn(case, inputs, t)
    assert not torch.equal(t[stage].view(torch.uint8) if t[stage].is_floating_point() else t[stage],
                           taps[stage].view(torch.uint8) if taps[stage].is_floating_point() else taps[stage]), (
        f"test data: the fault must change {stage}"
    )  # fmt: skip
    res = compare_case(case, inputs, t, t["out"])
    return case, inputs, t, res


def test_clean_cases_diagnose_nothing(cases) -> None:
    for case, inputs, taps, out in cases.values():
        res = compare_case(case, inputs, taps, out)
        assert res.verdict != FAIL
        assert diagnose(case, inputs, taps, out, res) == []


def test_every_fault_is_caught_and_named(cases) -> None:
    """Mutation kill rate: every catalogued fault, on every path it applies to, FAILs its stage and is named
    (alone) by diagnose."""
    assert set(MUTATIONS) == {f.name for f in FAULTS}, "every catalogued fault needs a mutation"
    killed, total, misses = 0, 0, []
    for f in FAULTS:
        for key, stage, fn in MUTATIONS[f.name]:
            total += 1
            assert stage == f.stage
            case, inputs, t, res = _inject(cases, key, stage, fn)
            names = [d.split(":")[0] for d in diagnose(case, inputs, t, t["out"], res)]
            if res.failed_stages == [stage] and names == [f.name]:
                killed += 1
            else:
                misses.append((f.name, key, res.failed_stages, names))
    assert killed == total, f"mutation kill rate {killed}/{total}; missed {misses}"


def test_diagnosis_text(cases) -> None:
    case, inputs, t, res = _inject(cases, "nvfp4", "act", _m_gate_up)
    assert diagnose(case, inputs, t, t["out"], res) == [
        "gate_up_swapped: matches the reference with gate/up swapped (SwiGLU(up, gate))"
    ]
