"""flint_moe.conformance.judge.stages / report on hand-built cases (Triton interpreter, tiny shapes).

A small NVFP4 decode case and a BF16 decode case (padded intermediate) run the real ops with taps; the
comparison must say EXACT / WITHIN-BOUND for every stage. Then MUTATION tests corrupt the taps the way known
faults would (downstream stages re-simulated with the golden model, as a faulty kernel would produce them)
and check that exactly the faulty stage FAILs, with the right counts and coordinates. The end-to-end check
on these cases: test_explain.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from flint_moe.conformance.judge.results import EXACT, EXPLAINED, FAIL, STAGES, VERDICT_ORDER, WITHIN_BOUND
from flint_moe.conformance.judge.stages import compare_case, expert_models
from flint_moe.conformance.report.report import SCHEMA, write_report
from flint_moe.reference import combine as ref_combine
from flint_moe.reference.combine import add_shared
from flint_moe.reference.exact import Accumulation
from flint_moe.reference.experts import (
    apply_global_scale,
    dequant_nvfp4,
    down_accumulate,
    down_accumulate_bf16,
    down_output,
    down_output_bf16,
    gate_up_accumulate,
    gate_up_accumulate_bf16,
    swiglu,
)
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.routing import total_order_key
from flint_moe.reference.weights import BF16Experts, NVFP4Experts

FP8 = torch.float8_e4m3fn
E, H, K, M = 6, 96, 2, 2
TIE = (1, 4)  # experts with identical router rows: their logits tie exactly, and they win the top-2


@dataclass(frozen=True)
class _Case:
    id: str
    path: str
    k: int
    shape: str
    M: int


def _router(gen: torch.Generator, e: int, h: int) -> torch.Tensor:
    """Router rows: column 0 decides (+4 for the TIE experts, -4 for the others), noise elsewhere; the TIE
    rows are equal."""
    w = torch.randn(e, h, generator=gen) * 0.1
    w[:, 0] = -4.0
    w[TIE[1]] = w[TIE[0]]
    w[TIE[0], 0] = w[TIE[1], 0] = 4.0
    return w.to(torch.bfloat16)


def _tokens(gen: torch.Generator, m: int, h: int) -> torch.Tensor:
    x = torch.randn(m, h, generator=gen)
    x[:, 0] = 3.0
    return x.to(torch.bfloat16)


def _build_nvfp4():
    from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights
    from flint_moe.ops import flint_moe, make_route_counter

    I = 64  # noqa: E741
    g = torch.Generator().manual_seed(5)
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, generator=g)

    def scales(shape):
        b = torch.randint(50, 64, shape, generator=g) | (torch.randint(0, 2, shape, generator=g) << 7)
        return b.to(torch.uint8).view(FP8)

    s13, s2 = scales((E, 2 * I, H // 16)), scales((E, H, I // 16))
    gs1 = torch.rand(E, generator=g) * 2.0**-6 + 2.0**-8
    gs2 = torch.rand(E, generator=g) * 2.0**-6 + 2.0**-8
    stored = FlintMoEWeights.from_modelopt(w13, s13, gs1, w2, s2, gs2)
    logical = NVFP4Experts(w13, s13, gs1, w2, s2, gs2)
    x, router = _tokens(g, M, H), _router(g, E, H)
    shared = torch.randn(M, H, generator=g).to(torch.bfloat16)
    taps: dict = {}
    out = flint_moe(x, router, stored, K, make_route_counter("cpu"), shared, taps=taps)
    inputs = SimpleNamespace(x=x, router_weight=router, shared=shared, weights_logical=logical, stored=stored)
    return _Case("nvfp4_decode/tiny/M2/gaussian/s0", "nvfp4_decode", K, "tiny", M), inputs, taps, out


def _build_bf16():
    from flint_moe.layouts import pad_intermediate_bf16, to_trtllm_bf16, trtllm_bf16_row_maps
    from flint_moe.ops import make_route_counter
    from flint_moe.ops.moe_bf16 import flint_moe_bf16_decode

    h, i = 128, 96  # I padded to 128 in storage: the padded columns are checked as exact zeros
    g = torch.Generator().manual_seed(7)
    gate = torch.randn(E, i, h, generator=g) * 0.05 + 0.01
    up = torch.randn(E, i, h, generator=g) * 0.25 - 0.03
    w13 = torch.cat([gate, up], dim=1).to(torch.bfloat16)
    w2 = (torch.randn(E, h, i, generator=g) * 0.05).to(torch.bfloat16)
    w13p, w2p, ip = pad_intermediate_bf16(w13, w2, 128)
    g1, g2 = to_trtllm_bf16(w13p, w2p)
    maps = trtllm_bf16_row_maps(h, ip)
    x, router = _tokens(g, M, h), _router(g, E, h)
    shared = (torch.randn(M, h, generator=g) * 0.1).to(torch.bfloat16)
    taps: dict = {}
    out = flint_moe_bf16_decode(x, router, g1, g2, maps, K, make_route_counter("cpu"), shared, taps=taps)
    inputs = SimpleNamespace(x=x, router_weight=router, shared=shared, weights_logical=BF16Experts(w13, w2))
    return _Case("bf16_decode/tiny/M2/gaussian/s0", "bf16_decode", K, "tiny", M), inputs, taps, out


@pytest.fixture(scope="module")
def nvfp4():
    return _build_nvfp4()


@pytest.fixture(scope="module")
def bf16():
    return _build_bf16()


@pytest.fixture(scope="module", params=["nvfp4", "bf16"])
def built(request, nvfp4, bf16):
    return {"nvfp4": nvfp4, "bf16": bf16}[request.param]


# --------------------------------------------------------------------------------------------------------
# golden re-simulation of the stages after a mutated one (what a faulty kernel would go on to produce)
# --------------------------------------------------------------------------------------------------------


def _clone(taps: dict) -> dict:
    return {k: v.clone() for k, v in taps.items()}


def _dense_w2(case, inputs, e: int) -> torch.Tensor:
    wl = inputs.weights_logical
    if case.path == "nvfp4_decode":
        return dequant_nvfp4(wl.w2[e], wl.w2_scale[e]).double()
    return wl.w2[e].double()


def _redo_from_act(case, inputs, t: dict) -> None:
    """down_acc = RN32(exact act . W2^T) (a valid order), then y and out, from t['act']."""
    wl = inputs.weights_logical
    I = wl.w2.shape[2] * (2 if case.path == "nvfp4_decode" else 1)  # noqa: E741
    for m in range(case.M):
        for j in range(case.k):
            e = int(t["ids"][m, j])
            exact = _dense_w2(case, inputs, e) @ t["act"][m, j, :I].double()
            t["down_acc"][m, j] = exact.float()
    _redo_y(case, inputs, t)


def _redo_y(case, inputs, t: dict) -> None:
    wl = inputs.weights_logical
    for m in range(case.M):
        for j in range(case.k):
            e = int(t["ids"][m, j])
            if case.path == "nvfp4_decode":
                t["y"][m, j] = down_output(t["down_acc"][m, j].contiguous(), wl.w2_gs[e : e + 1])
            else:
                t["y"][m, j] = down_output_bf16(t["down_acc"][m, j].contiguous())
    _redo_out(inputs, t)


def _redo_out(inputs, t: dict) -> torch.Tensor:
    t["out"] = add_shared(ref_combine(t["weights"].contiguous(), t["y"].contiguous()), inputs.shared)
    return t["out"]


def _gate_up_scaled(case, inputs, t, m, j):
    g, u = t["gate_acc"][m, j].contiguous(), t["up_acc"][m, j].contiguous()
    if case.path == "nvfp4_decode":
        e = int(t["ids"][m, j])
        gs = inputs.weights_logical.w13_gs[e : e + 1]
        g, u = apply_global_scale(g, gs), apply_global_scale(u, gs)
    return g, u


def _only_failing(res, stage: str) -> None:
    failing = res.failed_stages
    assert failing == [stage], f"expected only {stage} to fail, got {failing}: " + str(
        {s.stage: s.note for s in res.stages if s.verdict == FAIL}
    )
    assert res.verdict == FAIL


# --------------------------------------------------------------------------------------------------------
# clean runs
# --------------------------------------------------------------------------------------------------------


def test_clean_case_conforms(built) -> None:
    case, inputs, taps, out = built
    res = compare_case(case, inputs, taps, out)
    assert [s.stage for s in res.stages] == list(STAGES)
    for s in res.stages:
        if s.kind == "bits":
            assert s.verdict == EXACT, (s.stage, s.note, s.first_failures)
            assert s.mismatches == 0 and s.exact == s.elements > 0
        else:
            assert s.verdict in (EXACT, WITHIN_BOUND), (s.stage, s.first_failures)
            assert 0.0 <= s.max_bound_fraction <= 1.0 and s.warnings == 0, (s.stage, s.worst_warnings)
    e2e = res.end_to_end
    assert e2e.mode == "taps" and e2e.elements == M * out.shape[1]
    assert e2e.unexplained == 0 and e2e.verdict in (EXACT, EXPLAINED)
    assert res.verdict in (EXACT, WITHIN_BOUND, EXPLAINED)
    assert res.verdict == VERDICT_ORDER[max(VERDICT_ORDER.index(v) for v in [e2e.verdict, WITHIN_BOUND])]
    assert res.stage("gate_acc").elements == M * K * taps["gate_acc"].shape[-1]
    assert set(res.digests) >= {"out", "taps.act", "taps.y"} and all(len(d) == 64 for d in res.digests.values())
    j = json.loads(json.dumps(res.to_json()))
    assert j["mode"] == "taps" and j["end_to_end"]["verdict"] == e2e.verdict and j["warnings"] == 0
    assert j["stages"][0]["ulp_hist"] is not None and j["stages"][0]["map"] is None


def test_ids_tie_exists(built) -> None:
    """Guards the test data: the TIE experts' logits are bitwise equal and win the top-2 of every token."""
    _, _, taps, _ = built
    lg = taps["logits"]
    assert torch.equal(lg[:, TIE[0]].view(torch.int16), lg[:, TIE[1]].view(torch.int16))
    assert taps["ids"].tolist() == [list(TIE)] * M


# --------------------------------------------------------------------------------------------------------
# mutations
# --------------------------------------------------------------------------------------------------------


def test_mutation_act_one_ulp(built) -> None:
    case, inputs, taps, _ = built
    t = _clone(taps)
    a = t["act"].view(torch.int16)
    a[1, 0, 5] += 1  # one bf16 element one ulp off (a rounding slip in the epilogue)
    _redo_from_act(case, inputs, t)
    res = compare_case(case, inputs, t, t["out"])
    _only_failing(res, "act")
    s = res.stage("act")
    assert (s.mismatches, s.first_failures, s.max_ulp) == (1, [[1, 0, 5]], 1.0)
    assert s.elements == s.exact + 1


def test_mutation_global_scale_after_bf16_cast(nvfp4) -> None:
    """y = bf16(bf16(down_acc) * gs2) instead of bf16(RN(down_acc * gs2)): a double rounding."""
    case, inputs, taps, _ = nvfp4
    t = _clone(taps)
    gold = t["y"].clone()
    for m in range(M):
        for j in range(K):
            e = int(t["ids"][m, j])
            gs = inputs.weights_logical.w2_gs[e]
            t["y"][m, j] = to_bf16(to_bf16(t["down_acc"][m, j].contiguous()).float() * gs)
    differ = t["y"].view(torch.int16) != gold.view(torch.int16)
    assert int(differ.sum()) > 0, "test data: the fault must change some y"
    _redo_out(inputs, t)
    res = compare_case(case, inputs, t, t["out"])
    _only_failing(res, "y")
    s = res.stage("y")
    assert s.mismatches == int(differ.sum())
    assert s.first_failures == torch.nonzero(differ)[:5].tolist()
    assert s.max_ulp >= 1.0


def test_mutation_tie_to_higher_index(built) -> None:
    """top-k ties resolved to the higher expert index: the slots of the tied experts come out swapped."""
    case, inputs, taps, _ = built
    t = _clone(taps)
    key = total_order_key(t["logits"]).long() * E + torch.arange(E)  # ties -> HIGHER index first (the fault)
    bad_ids = torch.topk(key, K, dim=1).indices.to(torch.int32)
    assert bad_ids.tolist() == [list(TIE[::-1])] * M
    perm = [1, 0]  # the faulty kernel then computes every per-slot stage in its own slot order
    t["ids"] = bad_ids
    for name in ("weights", "gate_acc", "up_acc", "act", "down_acc", "y"):
        t[name] = t[name][:, perm].contiguous()
    _redo_out(inputs, t)
    res = compare_case(case, inputs, t, t["out"])
    _only_failing(res, "ids")
    s = res.stage("ids")
    assert (s.elements, s.mismatches, s.max_ulp) == (M * K, M * K, None)
    assert s.first_failures == [[0, 0], [0, 1], [1, 0], [1, 1]]
    # end to end: the tied experts' logit intervals overlap, so the other order is an explained difference
    e2e = res.end_to_end
    assert e2e.unexplained == 0 and e2e.verdict in (EXACT, EXPLAINED)
    assert set(e2e.causes) <= {"routing"} and all(r["causes"] == ["routing"] for r in e2e.rows)


def test_mutation_down_acc_dropped_term(built) -> None:
    """One term of one down reduction dropped (e.g. a masked-off lane): far outside the bound."""
    case, inputs, taps, _ = built
    t = _clone(taps)
    m, j, h = 1, 1, 7
    e = int(t["ids"][m, j])
    wrow = _dense_w2(case, inputs, e)[h]
    terms = wrow * t["act"][m, j, : wrow.shape[0]].double()
    i = int(terms.abs().argmax())
    t["down_acc"][m, j, h] = float(t["down_acc"][m, j, h].double() - terms[i])
    _redo_y(case, inputs, t)
    res = compare_case(case, inputs, t, t["out"])
    _only_failing(res, "down_acc")
    s = res.stage("down_acc")
    assert (s.mismatches, s.first_failures) == (1, [[m, j, h]])
    assert s.max_bound_fraction > 100.0 and s.warnings >= 1
    assert s.worst_warnings[0]["index"] == [m, j, h]


def test_mutation_gate_up_swapped_in_epilogue(built) -> None:
    """act = SwiGLU(up, gate): the epilogue swaps its operands; act FAILs, everything else is consistent."""
    case, inputs, taps, _ = built
    t = _clone(taps)
    for m in range(M):
        for j in range(K):
            g, u = _gate_up_scaled(case, inputs, t, m, j)
            t["act"][m, j] = swiglu(u, g)
    differ = t["act"].view(torch.int16) != taps["act"].view(torch.int16)
    _redo_from_act(case, inputs, t)
    res = compare_case(case, inputs, t, t["out"])
    _only_failing(res, "act")
    s = res.stage("act")
    assert s.mismatches == int(differ.sum()) > 0
    assert s.first_failures == torch.nonzero(differ)[:5].tolist()


def test_mutation_gate_up_rows_swapped(built) -> None:
    """Gate and up rows swapped in the layout: both accumulators land outside their golden bounds."""
    case, inputs, taps, _ = built
    t = _clone(taps)
    t["gate_acc"], t["up_acc"] = t["up_acc"], t["gate_acc"]
    res = compare_case(case, inputs, t, taps["out"])
    assert {"gate_acc", "up_acc"} <= set(res.failed_stages)
    assert res.stage("gate_acc").mismatches > res.stage("gate_acc").elements // 2


def test_mutation_out_element(built) -> None:
    case, inputs, taps, out = built
    bad = out.clone()
    bad.view(torch.int16)[0, 3] ^= 0x0001
    t = _clone(taps)
    t["out"] = bad
    res = compare_case(case, inputs, t, bad)
    _only_failing(res, "out")
    assert (res.stage("out").mismatches, res.stage("out").first_failures) == (1, [[0, 3]])
    e2e = res.end_to_end  # nothing upstream differs: the end-to-end difference is unexplained
    assert (e2e.verdict, e2e.differing, e2e.unexplained, e2e.first_failures) == (FAIL, 1, 1, [[0, 3]])
    assert e2e.failure_details[0]["index"] == [0, 3] and "no upstream" in e2e.failure_details[0]["why"]
    assert res.stage("out").map["total"] == 1


def _down_acc(case, inputs, t, m, j) -> Accumulation:
    wl, e = inputs.weights_logical, int(t["ids"][m, j])
    model = expert_models(case.path)[1]
    if case.path == "nvfp4_decode":
        a = t["act"][m, j, : wl.w2.shape[2] * 2][None].contiguous()
        return down_accumulate(a, wl.w2[e], wl.w2_scale[e], model=model)[0]
    return down_accumulate_bf16(t["act"][m, j, : wl.w2.shape[2]][None].contiguous(), wl.w2[e], model=model)[0]


def _gate_up_acc(case, inputs, t, m, j) -> Accumulation:
    wl, e = inputs.weights_logical, int(t["ids"][m, j])
    model = expert_models(case.path)[0]
    if case.path == "nvfp4_decode":
        return gate_up_accumulate(inputs.x[m : m + 1], wl.w13[e], wl.w13_scale[e], model=model)[0]
    return gate_up_accumulate_bf16(inputs.x[m : m + 1], wl.w13[e], model=model)[0]


def test_cases_inputs_attribute_name(bf16) -> None:
    """profiles.CaseInputs names the logical weights ``logical``; compare_case accepts it too."""
    case, inputs, taps, out = bf16
    alt = SimpleNamespace(x=inputs.x, router_weight=inputs.router_weight, shared=inputs.shared,
                          logical=inputs.weights_logical)  # fmt: skip
    assert compare_case(case, alt, taps, out).verdict != FAIL


def test_missing_tap_fails_clearly(nvfp4) -> None:
    case, inputs, taps, out = nvfp4
    t = dict(taps)
    del t["router_acc"]
    res = compare_case(case, inputs, t, out)
    assert res.stage("router_acc").verdict == FAIL and "missing" in res.stage("router_acc").note
    with pytest.raises(ValueError, match="unknown path"):
        compare_case(_Case("x", "nope", K, "tiny", M), inputs, taps, out)


# --------------------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------------------


def test_report_roundtrip(tmp_path, nvfp4, bf16) -> None:
    results = [compare_case(*nvfp4), compare_case(*bf16)]
    case, inputs, taps, _ = nvfp4
    t = _clone(taps)
    t["act"].view(torch.int16)[0, 1, 2] += 1
    _redo_from_act(case, inputs, t)
    bad = compare_case(_Case(case.id + "-mut", case.path, K, "tiny", M), inputs, t, t["out"])
    results.append(bad)
    env = {"backend": "cpu (Triton interpreter)", "torch": torch.__version__}
    paths = write_report(results, env, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["schema"] == SCHEMA == "flint-moe-conformance/1"
    assert data["env"]["torch"] == torch.__version__
    assert [c["case_id"] for c in data["cases"]] == [r.case_id for r in results]
    assert data["cases"][2]["verdict"] == FAIL and data["cases"][0]["digests"]["out"] == results[0].digests["out"]
    assert data["totals"]["FAIL"] == 1
    md = paths["summary_full"].read_text()
    assert "| path | shape | M |" in md and "bit-exactness is not claimed" in md
    assert "act" in md.split("## Failures")[1]
    for p in paths.values():
        assert p.stat().st_size < 16 * 2**20


def test_accumulation_warning_within_bound() -> None:
    """WARNING (rule "Accumulation"): an error inside the certified bound n*u*S but 40x the
    probabilistic estimate sqrt(n)*u*S (n = 4096, what a partly bf16 accumulation would leave) is flagged
    with its index, the verdict staying WITHIN-BOUND; an RN32-exact element is not flagged."""
    from flint_moe.conformance.judge.stages import WARN_FACTOR, compare_accumulation
    from flint_moe.reference.exact import FP32_RN, dot_accumulate

    n = 4096
    g = torch.Generator().manual_seed(11)
    a = torch.randn(1, n, generator=g).to(torch.bfloat16)
    b = torch.randn(2, n, generator=g).to(torch.bfloat16)
    acc = dot_accumulate(a, b, model=FP32_RN)
    u = 2.0**-24
    off = 40.0 * n**0.5 * u * acc.abs_sum[0, 1]  # 40 estimates, 40*64/4096 of the bound
    kernel = acc.exact.to(torch.float32).clone()
    kernel[0, 1] = float(acc.exact[0, 1] + off)
    s = compare_accumulation("down_acc", kernel, acc)
    assert s.verdict == WITHIN_BOUND and s.mismatches == 0
    assert s.warnings == 1 and s.worst_warnings[0]["index"] == [0, 1]
    assert 39.0 < s.worst_warnings[0]["ratio"] < 41.0 and s.worst_warnings[0]["ratio"] > WARN_FACTOR
    assert 0.0 < s.worst_warnings[0]["bound_fraction"] < 1.0 and s.max_bound_fraction < 1.0

