"""flint_moe.conformance.judge.faults: the diagnosis on hand-built tap mutations, and the faulty decoders.

Stage faults are injected into a tiny interpreter case (test_stages.py's builders) by rewriting the taps the
way a kernel with that fault would produce them (downstream stages re-simulated); the comparison must FAIL
that stage and ``diagnose`` must name exactly that fault. The layout (weights) faults' decoders are checked
against hand-derived index formulas on small stored tensors. The full catalogue, injected into the kernel
paths themselves, is test_mutation.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flint_moe.conformance.judge.faults import FAULTS, FAULTS_BY_NAME, NotApplicable, diagnose, faulty_weights
from flint_moe.conformance.judge.results import FAIL
from flint_moe.conformance.judge.stages import compare_case
from flint_moe.reference.experts import SWIGLU_C, swiglu
from flint_moe.reference.formats import round_bf16, to_bf16
from flint_moe.reference.mufu import ex2_approx_ftz, rcp_approx_ftz
from flint_moe.reference.routing import routing_scores, total_order_key
from flint_moe.reference.weights import BF16Experts, NVFP4Experts
from tests.conformance.judge import test_stages as TC

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


def test_stage_faults_are_caught_and_named(cases) -> None:
    """Every stage fault of this module's tap mutations, on every path it applies to, FAILs its stage and is
    named (alone) by diagnose."""
    assert set(MUTATIONS) <= {f.name for f in FAULTS if f.kind == "stage"}
    killed, total, misses = 0, 0, []
    for f in FAULTS:
        for key, stage, fn in MUTATIONS.get(f.name, []):
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


# -- faulty decoders of the layout faults, against hand-derived formulas -------------------------------------


def _stored_nvfp4(I=64, H=32, E=1):  # noqa: E741, N803
    """Logical NVFP4 experts with distinct bytes everywhere, and their FlintMoEWeights."""
    from flint_moe.layouts import FlintMoEWeights

    g = torch.Generator().manual_seed(3)
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, generator=g)
    s13 = torch.randint(1, 0x7F, (E, 2 * I, H // 16), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
    s2 = torch.randint(1, 0x7F, (E, H, I // 16), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
    gs = torch.ones(E)
    logical = NVFP4Experts(w13, s13, gs, w2, s2, gs)
    return logical, FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs)


def _faulty(name, case_path, logical, stored):
    case = SimpleNamespace(path=case_path)
    inputs = SimpleNamespace(logical=logical, weights_logical=logical, stored=stored)
    return faulty_weights(FAULTS_BY_NAME[name], case, inputs)


def test_faulty_decoders_nvfp4_by_hand() -> None:
    logical, stored = _stored_nvfp4(I=128)
    I = 128  # noqa: E741
    # halves swapped: logical gate row g is read from up row g and vice versa
    f = _faulty("w13_halves_swapped", "nvfp4_decode", logical, stored)
    assert torch.equal(f.w13[0, :I], logical.w13[0, I:]) and torch.equal(f.w13[0, I:], logical.w13[0, :I])
    assert torch.equal(f.w2, logical.w2)
    # nibbles: every code byte with its nibbles exchanged
    f = _faulty("nibble_order_swapped", "nvfp4_decode", logical, stored)
    b = logical.w13[0, 5, 3]
    assert int(f.w13[0, 5, 3]) == ((int(b) & 15) << 4) | (int(b) >> 4)
    # interleave group 32: physical row r = (j // 32) * 64 + (0 if up else 32) + j % 32 of the stored w1
    f = _faulty("interleave_group_32", "nvfp4_decode", logical, stored)
    for lrow in (0, 31, 32, 100, I + 0, I + 33, 2 * I - 1):
        j, up = lrow % I, lrow >= I
        r = (j // 32) * 64 + (0 if up else 32) + j % 32
        assert torch.equal(f.w13[0, lrow], stored.w1[0, r]), lrow
    f = _faulty("interleave_group_128", "nvfp4_decode", logical, stored)
    assert torch.equal(f.w13[0, 5], stored.w1[0, 128 + 5]) and torch.equal(f.w13[0, I + 5], stored.w1[0, 5])
    # scale swizzle missing: logical (row l, col c) read at byte r * Kp + c of the expert's swizzled block,
    # r the physical row of l (64-row interleave: gate row 5 -> physical 64 + 5)
    sw = stored.w1_sf_swizzled.view(torch.uint8).reshape(-1)
    kp = stored.w1_sf_swizzled.shape[2]
    f = _faulty("scale_swizzle_missing", "nvfp4_decode", logical, stored)
    assert int(f.w13_scale.view(torch.uint8)[0, 5, 1]) == int(sw[(64 + 5) * kp + 1])
    f = _faulty("scale_swizzle_transposed", "nvfp4_decode", logical, stored)
    assert int(f.w13_scale.view(torch.uint8)[0, 5, 1]) == int(sw[(64 + 5) * 4 + 1])
    with pytest.raises(NotApplicable):
        _faulty("interleave_group_128", "nvfp4_decode", *_stored_nvfp4(I=64))


def test_faulty_decoder_bf16_shuffle_missing_by_hand() -> None:
    from flint_moe.layouts import to_trtllm_bf16, trtllm_bf16_row_maps

    E, I, H = 1, 64, 64  # noqa: E741, N806
    w13 = torch.arange(E * 2 * I * H, dtype=torch.float32).reshape(E, 2 * I, H).to(torch.bfloat16)
    w2 = torch.arange(E * H * I, dtype=torch.float32).reshape(E, H, I).to(torch.bfloat16)
    g1, g2 = to_trtllm_bf16(w13, w2)
    logical = BF16Experts(w13, w2)
    stored = (g1, g2, trtllm_bf16_row_maps(H, I))
    f = _faulty("row_shuffle_missing", "bf16_decode", logical, stored)
    phys13 = g1.permute(0, 2, 1, 3).reshape(E, 2 * I, H)  # un-BlockMajorK: physical rows
    # without the shuffle, gate row g is taken from physical row 2g + 1, up row u from 2u; w2 row h from h
    assert torch.equal(f.w13[0, 7], phys13[0, 15]) and torch.equal(f.w13[0, I + 7], phys13[0, 14])
    assert torch.equal(f.w2[0, 9], g2.permute(0, 2, 1, 3).reshape(E, H, I)[0, 9])
    assert not torch.equal(f.w13, w13)
    f = _faulty("w13_halves_swapped", "bf16_decode", logical, stored)
    assert torch.equal(f.w13[0, :I], w13[0, I:]) and torch.equal(f.w2, w2)
