"""The decode block's conformance paths ``ll_block`` / ``ll_module`` on the CPU.

The CuTe DSL kernels of ``flint_moe.ops.flint_moe_ll`` cannot run here, so the path runs against a stand-in
kernel side (``tests/conformance/ll_standin.py``: the op's taps from the golden model's ``moe_decode_block``,
weights read back from the ``LLMoEWeights`` views by the golden model's decoders): the judge must give it
EXACT on every stage, FAIL a tampered tap, and name each of the block's catalogued faults (the mutations
themselves: tests/conformance/judge/test_mutation.py). Also: the inputs (deterministic, shapes, the shared
layout decoded back), the refused shapes, profile membership and the declared orders the judge asks for.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.conformance.inputs.block import BLOCK_PROFILES, GPU_BLOCK_SHAPES, block_shape
from flint_moe.conformance.inputs.cases import Case, make_inputs, matrix
from flint_moe.conformance.judge.block import BLOCK_STAGES, block_taps, compare_block_case
from flint_moe.conformance.judge.faults import diagnose
from flint_moe.conformance.judge.results import EXACT, FAIL, STAGES
from flint_moe.conformance.run.paths import PATHS, block_orders
from flint_moe.conformance.run.runner import run_case
from flint_moe.reference.decode_block import residual_add
from flint_moe.reference.layouts import experts_from_cutedsl, unswizzle_scales
from flint_moe.shapes import MODEL_SHAPES
from tests.conformance import ll_standin

SHAPE = "cpu-deepseek-v3"  # E = 10, H = 384, I = 128, k = 8, SI = 128


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.fixture
def standin(monkeypatch):
    ll_standin.install(monkeypatch)
    return ll_standin.CALLS


@pytest.mark.parametrize(
    "case_id",
    [
        f"ll_block/{SHAPE}/M1/gaussian/s0",
        f"ll_block/{SHAPE}/M8/heavy_tailed/s0",
        "ll_block/cpu-ling-mini-2.0/M3/subnormal_tokens/s0",
        "ll_block/cpu-glm-4.5/M2/poisoned_padding/s0",
        "ll_block/cpu-kimi-k2/M2/global_scales/s0",
        f"ll_module/{SHAPE}/M4/skewed_routing/s0",
    ],
)
def test_golden_standin_is_exact_on_every_stage(standin, case_id) -> None:
    res = run_case(Case.from_id(case_id), "cpu")
    assert [s.stage for s in res.stages] == [*BLOCK_STAGES, *STAGES]
    assert {s.stage: s.verdict for s in res.stages} == {s.stage: EXACT for s in res.stages}
    assert res.verdict == EXACT and res.end_to_end.verdict == EXACT
    assert res.path == case_id.split("/")[0] and res.meta["SI"] == 128
    assert len(standin) == 1  # one op call per case (the module calls the same op)


def test_module_path_calls_the_op_with_the_module_state(standin) -> None:
    case = Case.from_id(f"ll_module/{SHAPE}/M2/gaussian/s0")
    inputs = make_inputs(case)
    taps: dict = {}
    out = PATHS["ll_module"].run(inputs, None, taps)
    (call,) = standin
    assert call["attn_out"] is inputs.x and call["residual"] is inputs.shared
    assert call["top_k"] == case.k and call["eps"] == inputs.eps == 1e-6
    assert call["w"].shared_w13.data_ptr() == inputs.ll.shared_w13.data_ptr()  # the layer's storage, no copy
    assert call["counter"].dtype == torch.int32 and call["counter"].shape == (8,)
    assert torch.equal(_bits(out), _bits(taps["out"]))
    assert torch.equal(_bits(taps["returned_residual_out"]), _bits(taps["residual_out"]))


def test_block_taps_equal_the_golden_block(standin) -> None:
    """The judge's own golden run (used to re-simulate after a fault) equals moe_decode_block's, tap by tap."""
    case = Case.make("ll_block", SHAPE, 3, "gaussian")
    inputs = make_inputs(case)
    mine = block_taps(inputs)
    theirs = ll_standin.golden_block_taps(inputs.x, inputs.shared, inputs.ln_weight, inputs.eps, inputs.ll, case.k)
    assert set(mine) == set(theirs)
    for name, v in theirs.items():
        assert v.dtype == mine[name].dtype and torch.equal(_bits(v), _bits(mine[name])), name


def _clean(case_id: str):
    case = Case.from_id(case_id)
    inputs = make_inputs(case)
    taps: dict = {}
    out = PATHS[case.path].run(inputs, None, taps)
    return case, inputs, taps, out


def test_tampered_taps_fail_their_stage(standin) -> None:
    case, inputs, taps, out = _clean(f"ll_block/{SHAPE}/M2/gaussian/s0")
    # returned residual_out differs from the tap: residual_out FAILs
    t = dict(taps, returned_residual_out=taps["residual_out"].clone())
    t["returned_residual_out"][1, 5] = -t["returned_residual_out"][1, 5] + 1
    res = compare_block_case(case, inputs, t, out)
    assert res.failed_stages == ["residual_out"] and res.verdict == FAIL
    # a sum of squares far outside its bound: sumsq FAILs; xn from it no longer matches the kernel's xn
    t = dict(taps, sumsq=taps["sumsq"] * 1.01)
    res = compare_block_case(case, inputs, t, out)
    assert res.failed_stages == ["sumsq", "xn"]
    assert diagnose(case, inputs, t, out, res) == []
    # one shared accumulator 2^-5 off: that stage FAILs, and the act teacher-forced from it no longer matches
    t = dict(taps, shared_up_acc=taps["shared_up_acc"].clone())
    t["shared_up_acc"][0, 3] *= 1 + 2.0**-5
    res = compare_block_case(case, inputs, t, out)
    assert res.failed_stages == ["shared_up_acc", "shared_act"]
    # a missing tap is a FAIL naming it
    t = {k: v for k, v in taps.items() if k != "shared_y"}
    res = compare_block_case(case, inputs, t, out)
    (sy,) = [s for s in res.stages if s.stage == "shared_y"]
    assert sy.verdict == FAIL and "missing" in sy.note


def test_inputs_are_deterministic_and_decode_back() -> None:
    case = Case.make("ll_block", SHAPE, 4, "subnormal_tokens")
    a = make_inputs(case)
    b = make_inputs(Case.from_id(case.id))
    s, eps = block_shape(SHAPE)
    E, H, I, k, SI = s.num_experts, s.hidden, s.intermediate, s.top_k, s.shared_intermediate  # noqa: N806, E741
    assert (E, H, I, k, SI) == (10, 384, 128, 8, 128) and eps == 1e-6
    for name in ("x", "shared", "router_weight", "ln_weight"):
        assert torch.equal(_bits(getattr(a, name)), _bits(getattr(b, name))), name
    assert a.x.shape == a.shared.shape == (4, H) and a.x.dtype == a.shared.dtype == torch.bfloat16
    assert a.ln_weight.shape == (H,) and a.ln_weight.dtype == torch.bfloat16
    ll = a.ll
    assert ll.shared_w13.shape == (2 * SI, H // 2) and ll.shared_w13_sf.shape == (2 * SI, H // 16)
    assert ll.shared_w2.shape == (H, SI // 2) and ll.shared_w2_sf.shape == (H, SI // 16)
    assert ll.shared_w13_sf.dtype == torch.uint8 and ll.shared_w13_gs.shape == ()
    assert ll.router_weight is a.router_weight and ll.experts is a.stored
    for lin, sf in ((a.shared_w13, ll.shared_w13_sf), (a.shared_w2, ll.shared_w2_sf)):
        n, kk = lin.out_features, lin.in_features
        back = unswizzle_scales(sf.reshape(1, -1), n, kk // 16)[0]
        assert torch.equal(back, lin.scale_bytes()), "swizzled shared scales decode back to the logical ones"
        assert not torch.equal(sf, lin.scale_bytes()), "the stored scales are swizzled, not row-major"
    assert float(ll.shared_w13_gs) == float(a.shared_w13.global_scale)
    routed = experts_from_cutedsl(ll.experts)
    assert torch.equal(routed.w13, a.logical.w13) and torch.equal(routed.w2, a.logical.w2)
    # subnormal_tokens: attn_out zero on the all-subnormal residual rows, so s stays subnormal there
    for r in a.notes["subnormal_rows"]:
        assert not bool(a.x[r].any())
        assert bool((residual_add(a.x, a.shared)[r].abs() < 2.0**-126).all())


def test_refused_shapes() -> None:
    for name in ("qwen3-next-80b", "cpu-qwen3-next-80b"):
        with pytest.raises(ValueError, match="qwen3-next-80b has a sigmoid gate"):
            Case.make("ll_block", name, 1, "gaussian")
    with pytest.raises(ValueError, match="qwen3-30b-a3b has no shared expert"):
        Case.make("ll_module", "qwen3-30b-a3b", 1, "gaussian")
    with pytest.raises(ValueError, match="not a model shape"):
        Case.make("ll_block", "cpu-E6-H96-I64-k3", 1, "gaussian")
    with pytest.raises(ValueError, match="M = 9 exceeds its max_tokens = 8"):
        PATHS["ll_block"].run(type("I", (), {"x": torch.zeros(9, 4)})(), None, {})


def test_profile_membership() -> None:
    from flint_moe.conformance.inputs.cases import pending_gpu_cases

    cpu = matrix("cpu")
    assert not [c for c in cpu if c.path.startswith("ll_")], "the block's kernels cannot run on the cpu profile"
    # in the gpu profile (its kernels passed an H200 run), none left pending
    assert not [c for c in pending_gpu_cases() if c.path.startswith("ll_")]
    gpu = matrix("gpu")
    blk = [c for c in gpu if c.path == "ll_block"]
    mod = [c for c in gpu if c.path == "ll_module"]
    assert 20 <= len(blk) <= 28 and 1 <= len(mod) <= 4
    assert {c.shape for c in blk} == set(GPU_BLOCK_SHAPES) == {"deepseek-v3", "kimi-k2", "glm-4.5", "ling-mini-2.0"}
    assert {c.M for c in blk if c.shape == "deepseek-v3" and c.profile == "gaussian"} == set(range(1, 9))
    assert {c.profile for c in blk} == set(BLOCK_PROFILES)
    for name in GPU_BLOCK_SHAPES:
        assert len({(c.M, c.profile) for c in blk if c.shape == name}) >= 3, name
        assert MODEL_SHAPES[name].shared_intermediate is not None
    assert all(c.M <= PATHS[c.path].max_tokens for c in blk + mod)
    assert len({c.id for c in blk + mod}) == len(blk + mod)


def test_declared_orders_are_the_kernels_declarations() -> None:
    """The judge replays exactly what the block's kernels declare: the router kernel's sumsq / router orders and
    the CuTe kernels' expert orders, for the case's own H, I, SI (GLM-4.5: H 5120, I = SI = 1536)."""
    from flint_moe.kernels import orders

    case = Case.make("ll_block", "glm-4.5", 3, "gaussian")
    got = block_orders(case)
    assert set(got) == {"sumsq", "router", "gate_up", "down", "shared_gate_up", "shared_down"}
    assert got["sumsq"] == orders.ll_router_orders(5120)["sumsq"]
    assert got["router"] == orders.ll_router_orders(5120)["router"]
    routed = orders.ll_block_orders(5120, 1536, 1536, top_k=case.k, E=case.E)
    extra = orders.ll_block_extra_orders(5120, 1536, 1536, top_k=case.k, E=case.E)
    assert got == {**routed, **extra}
    assert got["gate_up"]["length"] == 5120 and got["down"]["length"] == 1536 and got["shared_down"]["length"] == 1536


def test_block_mutations_are_named_alone(standin) -> None:
    """Each of the block's faults, injected into the stand-in's taps, FAILs its own stage first and is the only
    fault the diagnosis names (killed-and-named for every fault: tests/conformance/judge/test_mutation.py)."""
    from flint_moe.conformance.judge.faults import FAULTS_BY_NAME
    from flint_moe.conformance.judge.mutation import MUTATIONS, run_mutation

    block = [m for m in MUTATIONS if m.path == "ll_block"]
    assert {m.fault for m in block} == {"residual_rounded_before_norm", "eps_after_rsqrt", "rsqrt_exact",
                                        "shared_global_scale_after_round", "shared_expert_skipped"}  # fmt: skip
    cache: dict = {}
    for m in block:
        res = run_mutation(m, cache=cache, device="cpu")
        stage = FAULTS_BY_NAME[m.fault].stage
        first = [s for s in (*BLOCK_STAGES, *STAGES) if s in res.failed_stages][0]
        assert res.killed and first in ("sumsq", stage), (m.fault, res.failed_stages)
        assert [d.split(":")[0] for d in res.diagnosis] == [m.fault], (m.fault, res.diagnosis)


def test_declared_sum_of_squares_order_is_replayed(standin) -> None:
    """Given the router kernel's declared ``sumsq`` order, a kernel whose sum of squares is that order's value
    is EXACT ("bitwise equal to the replay"); one ulp away in one row, still inside the any-order bound, it
    FAILs with "order differs from declared"."""
    from flint_moe.kernels.orders import ll_router_orders
    from flint_moe.reference.decode_block import rmsnorm_apply
    from flint_moe.reference.orders import replay_dot

    case, inputs, taps, out = _clean(f"ll_block/{SHAPE}/M2/gaussian/s0")
    order = ll_router_orders(384)["sumsq"]
    s = residual_add(inputs.x, inputs.shared)

    def kernel_with(sumsq):
        t = dict(taps, sumsq=sumsq)
        xn = rmsnorm_apply(s, sumsq, inputs.ln_weight, inputs.eps)
        return block_taps(inputs, xn=xn, taps=t)

    replayed = replay_dot(order, s, s)
    t = kernel_with(replayed)
    res = compare_block_case(case, inputs, t, t["out"], orders={"sumsq": order})
    (sq,) = [st for st in res.stages if st.stage == "sumsq"]
    assert res.verdict == EXACT and sq.verdict == EXACT and "bitwise equal to the replay" in sq.note
    off = replayed.clone()
    off[1] = torch.nextafter(off[1], torch.tensor(float("inf")))
    t = kernel_with(off)
    res = compare_block_case(case, inputs, t, t["out"], orders={"sumsq": order})
    (sq,) = [st for st in res.stages if st.stage == "sumsq"]
    assert sq.verdict == FAIL and sq.mismatches == 0 and "order differs from declared: 1 of 2" in sq.note
    assert res.failed_stages == ["sumsq"]


def test_tied_logits_survive_the_norm() -> None:
    """``tied_logits`` on the block: the router reads ``xn``, not the residual, and the power-of-two router rows
    still tie bitwise, with a tie group straddling the k-th place in every token."""
    case = Case.make("ll_block", SHAPE, 3, "tied_logits")
    logits = block_taps(make_inputs(case))["logits"]
    key = logits.view(torch.int16).to(torch.int32)
    for m in range(case.M):
        srt = torch.sort(key[m] ^ torch.where(key[m] < 0, 0x7FFF, 0), descending=True).values
        assert srt[case.k - 1] == srt[case.k], f"token {m}: no tie straddling the k-th place"
