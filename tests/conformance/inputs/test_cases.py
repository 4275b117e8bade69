"""The conformance case matrix (flint_moe/conformance/inputs/cases.py, profiles.py, paths.py) and the CLI.

Ids round-trip; the gpu matrix is large and covers DeepSeek-V3 and every path; inputs are deterministic per
(case, seed) and differ across seeds; each data profile produces what it claims (checked through the golden
model, never through the kernels); inputs validate (the weight containers construct); a 2-case CLI smoke run
writes the report and exits 0.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe import reference as R
from flint_moe.conformance.inputs.block import BLOCK_PATHS
from flint_moe.conformance.inputs.cases import (
    ORACLE_PROFILES,
    PATH_NAMES,
    PATH_PROFILES,
    Case,
    make_inputs,
    matrix,
    oracle_available,
)
from flint_moe.conformance.inputs.profiles import POISON_BYTES, scale_padding_mask
from flint_moe.conformance.run.paths import PATHS
from flint_moe.layouts import FlintMoEWeights
from flint_moe.reference.weights import BF16Experts, NVFP4Experts

CPU = matrix("cpu")
GPU = matrix("gpu")


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _all_bytes(inp) -> bytes:
    stored = inp.stored
    if isinstance(stored, FlintMoEWeights):
        parts = [
            stored.w1,
            stored.w1_sf_swizzled,
            stored.w1_alpha,
            stored.w2,
            stored.w2_sf_swizzled,
            stored.w2_alpha,
        ]
    elif isinstance(stored, tuple):
        parts = [stored[0], stored[1], *stored[2]]
    else:  # RoutedNVFP4Weights (per-token paths) and the routing they take as input
        parts = [getattr(stored, n) for n in ("fc1_data", "fc1_scale_swizzled", "fc1_alpha", "fc2_data",
                                              "fc2_scale_swizzled", "fc2_alpha")]  # fmt: skip
        parts += [v for _, v in sorted(inp.notes.items()) if isinstance(v, torch.Tensor)]
    return b"".join(_bytes(t) for t in (inp.x, inp.router_weight, inp.shared, *parts))


def _golden_logits(inp) -> torch.Tensor:
    acc = R.router_accumulate(inp.x, inp.router_weight)
    return R.logits_from_accumulator(acc.exact.to(torch.float32))  # fp32 RN of the exact sum


def _case(profile: str, path: str = "nvfp4_decode", M: int = 3) -> Case:
    shape = next(c.shape for c in CPU if c.path == path)
    return Case.make(path, shape, M, profile)


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cases", [CPU, GPU], ids=["cpu_matrix", "full_matrix"])
def test_ids_round_trip(cases):
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), "duplicate case ids"
    for c in cases:
        assert Case.from_id(c.id) == c


def test_from_id_rejects_bad_ids():
    bad_ids = (
        "nvfp4_decode/deepseek-v3/M1/gaussian",
        "nope/deepseek-v3/M1/gaussian/s0",
        "nvfp4_decode/no-such-shape/M1/gaussian/s0",
        "bf16_decode/deepseek-v3/M1/modelopt/s0",
    )
    for bad in bad_ids:
        with pytest.raises(ValueError):
            Case.from_id(bad)


def test_gpu_matrix_coverage():
    from flint_moe.conformance.inputs.cases import GPU_PENDING_PATHS, pending_gpu_cases

    assert len(GPU) >= 200
    # paths whose kernels have not yet passed an H200 run stay out of the gpu profile (the pull-request gate);
    # today every path is in it
    assert GPU_PENDING_PATHS == () and pending_gpu_cases() == []
    assert {c.path for c in GPU} == set(PATH_NAMES)
    pending = pending_gpu_cases()
    everything = GPU + pending
    ds = [c for c in everything if c.shape == "deepseek-v3"]
    assert ds and (ds[0].E, ds[0].H, ds[0].I, ds[0].k) == (256, 7168, 2048, 8)
    for path in PATH_NAMES:
        ms = {c.M for c in everything if c.path == path}
        if path == "bf16_decode":  # grouped / module serve any M: both sides of the threshold
            assert ms == set(range(1, PATHS[path].max_tokens + 1))
        if path == "nvfp4_decode":  # every M of the router's GEMV range (8), then up to a threshold (16)
            assert set(range(1, 9)) <= ms <= set(range(1, PATHS[path].max_tokens + 1)) and max(ms) > 8
        assert {c.profile for c in everything if c.path == path} == set(PATH_PROFILES[path]) - set(ORACLE_PROFILES)
    from flint_moe.conformance.inputs.cases import GPU_CORE_SHAPES, threshold_m

    # ops.flint_moe on both sides of each core shape's decode / grouped threshold (DeepSeek-V3, gpt-oss-120b 24 / 25,
    # Qwen3-30B-A3B 16 / 17), and of the measured Qwen3-235B-A22B's (16 / 17), through the op and the module
    for name in (*GPU_CORE_SHAPES, "qwen3-235b-a22b"):
        s = next(c for c in everything if c.shape == name)
        for path in ("nvfp4_dispatch", "nvfp4_module") if name in GPU_CORE_SHAPES else ("nvfp4_dispatch",):
            assert set(threshold_m(s)) <= {c.M for c in everything if c.path == path and c.shape == name}, (name, path)
    # min(24, E // k): 256 // 8 = 32 -> 24, 128 // 4 = 32 -> 24, 128 // 8 = 16
    want_m = {"deepseek-v3": (24, 25), "gpt-oss-120b-p128": (24, 25), "qwen3-30b-a3b": (16, 17),
              "qwen3-235b-a22b": (16, 17)}  # fmt: skip
    assert {n: threshold_m(next(c for c in everything if c.shape == n)) for n in want_m} == want_m

    for name in GPU_CORE_SHAPES:  # the core shapes get every M <= 8 and every data profile on each path
        for path in (p for p in PATH_NAMES if p not in BLOCK_PATHS and not p.startswith("nvfp4_pertoken_")):
            got = [c for c in everything if c.path == path and c.shape == name]
            want = set(PATH_PROFILES[path]) - {"modelopt", *ORACLE_PROFILES}
            assert want <= {c.profile for c in got}, (name, path)
            if path in ("nvfp4_decode", "bf16_decode"):
                assert {c.M for c in got if c.profile == "gaussian"} == set(range(1, 9))
    for path in ("nvfp4_pertoken_swiglu", "nvfp4_pertoken_relu2"):  # DeepSeek-V3 widths, every profile
        got = [c for c in everything if c.path == path and (c.H, c.I) == (7168, 2048)]
        assert set(PATH_PROFILES[path]) - {"outlier_rows"} <= {c.profile for c in got}, path
    assert 10 <= len([c for c in everything if c.path.startswith("nvfp4_pertoken_")]) <= 14
    grouped = {c.M for c in everything if c.path == "nvfp4_grouped"}
    assert min(grouped) <= PATHS["nvfp4_decode"].max_tokens < max(grouped) and max(grouped) >= 2048
    assert all(c.M <= PATHS[c.path].max_tokens for c in everything + CPU)


def test_gpu_full_profile_is_gpu_plus_its_slowest_cases():
    from flint_moe.conformance.inputs.cases import GPU_FULL_ONLY

    full = matrix("gpu-full")
    # the gpu profile is the full one minus the named cases, in the same order; every named case exists
    assert [c.id for c in GPU] == [c.id for c in full if c.id not in GPU_FULL_ONLY]
    assert GPU_FULL_ONLY <= {c.id for c in full}
    assert len(full) == len(GPU) + len(GPU_FULL_ONLY) == len({c.id for c in full})
    # the gpu profile still meets each left-out case's path and shape
    for i in GPU_FULL_ONLY:
        c = Case.from_id(i)
        assert any(g.path == c.path and g.shape == c.shape for g in GPU), i
    with pytest.raises(ValueError, match="gpu-full"):
        matrix("gpu_full")


def test_cpu_matrix_divisibility():
    # cpu profile: 5-minute budget (the 29 hand-picked cases of then took 196 s under `nox -s conformance` on a fresh
    # clone, 2 cores; the 2 nvfp4_dispatch cases add ~9 s, the 6 scaled-down real shapes at M = 1 ~2-12 s each);
    # the oracle-tool cases (ORACLE_PROFILES, only where installed) add at most 4 small ones
    from flint_moe.conformance.inputs.cases import DERIVED_CPU_SHAPES
    from flint_moe.shapes import MODEL_SHAPES

    base = [c for c in CPU if c.profile not in ORACLE_PROFILES]
    derived = {s.name for s in DERIVED_CPU_SHAPES}
    # the 4 per-token cases (interpreter-sized, ~20 s together) bring the hand-picked count to 42
    assert 12 <= len(base) <= 42 and len(CPU) - len(base) <= 4
    assert len([c for c in base if c.shape in derived]) <= 6
    assert {c.path for c in CPU} == set(PATH_NAMES) - set(BLOCK_PATHS)  # the block's kernels need a GPU
    pow2 = lambda n: n & (n - 1) == 0  # noqa: E731
    for c in CPU:
        assert not pow2(c.E) and not pow2(c.H), c.id
        if c.shape in derived:  # a real layer's top_k, whatever it is
            assert c.k == MODEL_SHAPES[c.shape.removeprefix("cpu-")].top_k
        else:
            assert not pow2(c.k), c.id
        assert c.H % (64 if c.path.startswith("bf16_") else 32) == 0
        assert c.Ip % 64 == 0
    assert any(c.pad_to for c in CPU if c.path == "nvfp4_decode")
    assert any(c.pad_to for c in CPU if c.path == "bf16_decode")
    for path in PATH_NAMES:
        assert {c.profile for c in CPU if c.path == path} <= set(PATH_PROFILES[path])
    want = {p for p in PATH_PROFILES["nvfp4_decode"] if oracle_available(p)}
    assert {c.profile for c in CPU if c.path == "nvfp4_decode"} == want


@pytest.mark.parametrize("case", CPU, ids=[c.id for c in CPU])
def test_inputs_deterministic_and_valid(case):
    a, b = make_inputs(case), make_inputs(Case.from_id(case.id))
    assert _all_bytes(a) == _all_bytes(b)
    assert a.x.shape == (case.M, case.H) and a.x.dtype == torch.bfloat16
    assert a.router_weight.shape == (case.E, case.H) and a.shared.shape == (case.M, case.H)
    assert torch.isfinite(a.x.float()).all() and torch.isfinite(a.router_weight.float()).all()
    if case.path.startswith("nvfp4_pertoken_"):
        from flint_moe.layouts.routed_nvfp4 import RoutedNVFP4Weights
        from flint_moe.reference.pertoken_experts import PerTokenNVFP4Experts

        assert isinstance(a.logical, PerTokenNVFP4Experts) and isinstance(a.stored, RoutedNVFP4Weights)
        assert (a.logical.num_experts, a.logical.hidden_size, a.logical.intermediate_size) == (case.E, case.H, case.I)
        assert a.stored.padded_intermediate_size == case.Ip and a.notes["routing_map"].shape == (case.M, case.k)
    elif case.path.startswith("nvfp4_"):
        ex = a.logical
        assert isinstance(ex, NVFP4Experts) and isinstance(a.stored, FlintMoEWeights)
        NVFP4Experts(ex.w13, ex.w13_scale, ex.w13_gs, ex.w2, ex.w2_scale, ex.w2_gs)
        assert (ex.num_experts, ex.hidden, ex.intermediate) == (case.E, case.H, case.I)
        assert a.stored.intermediate_size == case.Ip and a.stored.valid_intermediate == case.I
    else:
        assert isinstance(a.logical, BF16Experts)
        assert (a.logical.num_experts, a.logical.hidden, a.logical.intermediate) == (case.E, case.H, case.I)
        g1, g2, maps = a.stored
        assert g1.shape == (case.E, case.H // 64, 2 * case.Ip, 64) and g2.shape == (
            case.E,
            case.Ip // 64,
            case.H,
            64,
        )


def test_distinct_seeds_differ():
    c0 = CPU[0]
    c1 = Case.make(c0.path, c0.shape, c0.M, c0.profile, seed=1)
    a, b = make_inputs(c0), make_inputs(c1)
    assert not torch.equal(a.x, b.x)
    assert not torch.equal(a.stored.w1, b.stored.w1)


def test_real_shapes_bring_their_scaled_down_cpu_cases():
    """Every distinct scaled-down size of flint_moe/shapes.py runs in the cpu profile (the first model of each
    size names it), and a new shape with new sizes adds a case without touching cases.py."""
    from flint_moe.conformance.inputs import cases as C
    from flint_moe.shapes import MoEShape

    got = [c.id for c in CPU if c.shape.startswith("cpu-") and not c.shape.startswith("cpu-E")]
    assert got == [
        "nvfp4_decode/cpu-deepseek-v3/M1/gaussian/s0", "nvfp4_decode/cpu-qwen3-next-80b/M1/gaussian/s0",
        "nvfp4_decode/cpu-gpt-oss-120b/M1/gaussian/s0", "nvfp4_decode/cpu-llama-4-maverick/M1/gaussian/s0",
        "nvfp4_decode/cpu-mixtral-8x7b/M1/gaussian/s0", "nvfp4_decode/cpu-gpt-oss-120b-p128/M1/gaussian/s0",
    ]  # fmt: skip
    for i in got:
        assert Case.from_id(i).id == i
    new = MoEShape("new-model", 96, 3136, 1344, 6, 1344)  # 3136 % 128 = 64, 1344 % 128 = 64, k = 6
    spec = C.ShapeSpec.of(new.scaled_down())
    assert (spec.name, spec.E, spec.H, spec.I, spec.k) == ("cpu-new-model", 9, 192, 192, 6)
    old = C.DERIVED_CPU_SHAPES
    try:
        C.DERIVED_CPU_SHAPES = (*old, spec)
        assert C._derived_cpu_cases()[-1].id == "nvfp4_decode/cpu-new-model/M1/gaussian/s0"
        C.DERIVED_CPU_SHAPES = (*old, C.ShapeSpec.of(MoEShape("same-as-glm", 96, 4096, 1024, 8).scaled_down()))
        assert [c.id for c in C._derived_cpu_cases()] == got  # same sizes as cpu-deepseek-v3: no new case
    finally:
        C.DERIVED_CPU_SHAPES = old


def test_shapes_named_by_sizes_and_shape_cases():
    from flint_moe.conformance.inputs.cases import SHAPES
    from flint_moe.conformance.selection import shape_cases, shape_spec

    assert shape_spec("6,96,64,3,32") == shape_spec("E6-H96-I64-k3") != SHAPES["cpu-E6-H96-I64-k3"]
    c = Case.from_id("nvfp4_grouped/mut-E6-H96-I48-P64-k3/M9/gaussian/s0")  # rebuilt from the name alone
    assert (c.E, c.H, c.I, c.k, c.pad_to, c.Ip) == (6, 96, 48, 3, 64, 64)
    ids = [c.id for c in shape_cases(shape_spec("deepseek-v3"))]
    # both sides of DeepSeek-V3's decode limit, ops.decode_max_tokens(256, 8) = min(24, 32) = 24; BF16 decode up to 8
    assert ids == [f"{p}/deepseek-v3/M{m}/gaussian/s0" for p, ms in (
        ("nvfp4_decode", (1, 24)), ("bf16_decode", (1, 8)), ("nvfp4_grouped", (25, 64)), ("nvfp4_dispatch", (24, 25)))
        for m in ms]  # fmt: skip
    # Qwen3-235B-A22B: limit 128 // 8 = 16; a limit of 1 (E 10, k 8) runs decode M 1 once
    qwen = [c.id.split("/")[0] + "/" + c.id.split("/")[2] for c in shape_cases(shape_spec("qwen3-235b-a22b"))]
    assert [q for q in qwen if not q.startswith("bf16")] == [
        "nvfp4_decode/M1", "nvfp4_decode/M16", "nvfp4_grouped/M17", "nvfp4_grouped/M64", "nvfp4_dispatch/M16",
        "nvfp4_dispatch/M17"]  # fmt: skip
    assert [c.M for c in shape_cases(shape_spec("cpu-deepseek-v3")) if c.path == "nvfp4_decode"] == [1]
    # H = 96: no BF16 BlockMajorK layout (H % 64), so no bf16_decode case
    assert {c.path for c in shape_cases(shape_spec("6,96,64,3"))} == {"nvfp4_decode", "nvfp4_grouped",
                                                                       "nvfp4_dispatch"}  # fmt: skip
    with pytest.raises(ValueError, match="expected a model name"):
        shape_spec("7168")


def test_tied_logits_straddle_kth():
    for path in PATH_NAMES:  # the block's router reads the normalised residual: tests/conformance/test_ll_block.py
        if "tied_logits" not in PATH_PROFILES[path] or path in BLOCK_PATHS:
            continue
        c = _case("tied_logits", path)
        inp = make_inputs(c)
        logits = _golden_logits(inp)
        key = logits.view(torch.int16)
        for m in range(c.M):
            row = key[m]
            srt = torch.sort(row.to(torch.int32) ^ torch.where(row < 0, 0x7FFF, 0), descending=True).values
            assert srt[c.k - 1] == srt[c.k], f"{c.id}: no tie straddling the k-th place in token {m}"
            assert len(set(row.tolist())) <= c.E - 2, f"{c.id}: too few equal logits in token {m}"


def test_subnormal_tokens_profile():
    """Even token rows are all bf16 subnormals or zeros; odd rows carry some; the golden logits of the
    subnormal rows lie within a few binades of the subnormal range."""
    c = _case("subnormal_tokens", M=3)
    inp = make_inputs(c)
    x = inp.x.float()
    tiny = x.abs() < 2.0**-126
    assert bool(tiny[0::2].all()) and bool((x[0::2] != 0).any())
    assert 0 < int(tiny[1].sum()) < c.H
    assert inp.notes["subnormal_rows"] == [0, 2]
    assert bool((_golden_logits(inp).float()[0::2].abs() < 2.0**-122).all())


def test_subnormal_tokens_judged_on_the_interpreter():
    """Subnormal bf16 activations pass on the CPU as on the H200: the interpreter's bf16 -> fp32 widening is
    exact (kernels._rule), so router_acc and gate_acc hold their bounds."""
    from flint_moe.conformance.run.runner import run_case
    from flint_moe.ops import make_route_counter

    dev = torch.device("cpu")
    res = run_case(_case("subnormal_tokens", M=3), dev, make_route_counter(dev), invariance=False)
    bad = [st["stage"] for st in res.to_json()["stages"] if st["verdict"] == "FAIL"]
    assert res.verdict != "FAIL" and not bad, bad


def test_tiny_sigmoids_and_skewed_routing():
    c = _case("tiny_sigmoids")
    logits = _golden_logits(make_inputs(c)).float()
    assert bool((logits < -30).all()) and bool((logits > -88).all())
    c = _case("skewed_routing", M=4)
    inp = make_inputs(c)
    ids = R.topk_total_order(_golden_logits(inp), c.k)
    assert bool((ids == 0).any(dim=1).all()), "expert 0 must take every token"
    never = set(inp.notes["never_routed"])
    assert never and not never & set(ids.flatten().tolist())


def test_weight_profiles():
    ex = make_inputs(_case("global_scales")).logical
    for gs in (ex.w13_gs, ex.w2_gs):
        assert float(gs.min()) == 2.0**-20 or float(gs.max()) == 2.0**4
        assert bool(((gs >= 2.0**-20) & (gs <= 2.0**4)).all())
    b = make_inputs(_case("e4m3_scales")).logical.w13_scale.view(torch.uint8)
    assert bool(((b & 0x7F) == 0x7E).any()) and bool((((b & 0x78) == 0) & ((b & 7) != 0)).any())
    assert not bool(((b & 0x7F) == 0x7F).any())
    ex = make_inputs(_case("zero_blocks")).logical
    assert bool((ex.w13[:, 0] == 0).all()) and bool((ex.w13_scale.view(torch.uint8) & 0x7F == 0).any())


def test_poisoned_padding_present():
    for c in (
        _case("poisoned_padding"),
        next(c for c in CPU if c.profile == "poisoned_padding" and c.pad_to),
    ):
        w = make_inputs(c).stored
        for name in ("w1_sf_swizzled", "w2_sf_swizzled"):
            t = getattr(w, name).view(torch.uint8)
            mask = scale_padding_mask(w, name)
            assert bool(mask.any()), f"{c.id}: {name} has no padding at this shape"
            assert set(t[mask].unique().tolist()) == set(POISON_BYTES)
        clean = make_inputs(Case.make(c.path, c.shape, c.M, "gaussian")).stored
        assert not bool((clean.w1_sf_swizzled.view(torch.uint8)[scale_padding_mask(clean, "w1_sf_swizzled")]).any())


def test_asymmetric_gate_up():
    c = _case("asymmetric")
    ex = make_inputs(c).logical
    codes = ex.w13
    assert bool(((codes[:, : c.I] & 0x88) == 0x88).all()), "gate codes must all be negative"
    up_nz = ((codes[:, c.I :] & 0x0F) != 0).sum(-1) + ((codes[:, c.I :] >> 4) != 0).sum(-1)
    assert bool((up_nz == 1).all()), "up must be identity-like (one nonzero per row)"
    cb = _case("asymmetric", "bf16_decode")
    w = make_inputs(cb).logical.w13.float()
    assert bool((w[:, : cb.I] < 0).all()) and bool(((w[:, cb.I :] != 0).sum(-1) == 1).all())


def test_cli_smoke(tmp_path, capsys):
    from flint_moe.conformance.__main__ import main

    rc = main(["--profile", "cpu", "--filter", "/M1/", "--filter", "cpu-E6-H96-I48-P64-k3", "--out", str(tmp_path)])
    assert rc == 0
    assert (tmp_path / "report.json").exists() and (tmp_path / "summary.md").exists()
    assert "bit-exactness NOT claimed" in capsys.readouterr().out


def test_launch_configurations_are_cases():
    from flint_moe.conformance.inputs.cases import PATH_CONFIGS
    from flint_moe.conformance.run.paths import kernel_configs, path_for

    for path, configs in PATH_CONFIGS.items():
        assert "default" in configs and configs["default"] == {}
        for name in configs:
            if name == "default":
                continue
            got = [c for c in GPU if c.path == path and c.config == name]
            assert got and all(c.id.endswith(f"/c-{name}") and Case.from_id(c.id) == c for c in got)
            assert kernel_configs(path, name) and path_for(got[0]).name == f"{path}[{name}]"
    for path in ("nvfp4_decode", "bf16_decode"):  # every decode configuration also on the cpu profile
        assert {c.config for c in CPU if c.path == path} == set(PATH_CONFIGS[path])
    assert path_for(CPU[-1]) is PATHS[CPU[-1].path] or CPU[-1].config != "default"
    with pytest.raises(ValueError, match="config 'nope' not defined for path 'nvfp4_decode'"):
        Case.make("nvfp4_decode", "deepseek-v3", 1, "gaussian", 0, "nope")
    with pytest.raises(ValueError, match="config"):
        Case.from_id("nvfp4_decode/deepseek-v3/M1/gaussian/s0/c-nope")


def test_launch_configurations_are_audited():
    """Every non-default launch configuration of the matrix is compiled by the sm_90 PTX audit."""
    from flint_moe.conformance.inputs.cases import PATH_CONFIGS
    from flint_moe.kernels.audit.registry import collect_audit_specs
    from flint_moe.kernels.bf16 import down_combine as bf16_down, gate_up as bf16_gate_up
    from flint_moe.kernels.nvfp4 import down_combine as nvfp4_down, gate_up as nvfp4_gate_up, tuned as nvfp4_tuned

    specs = collect_audit_specs()
    bf = [v for n, v in PATH_CONFIGS["bf16_decode"].items() if n != "default"]
    assert [v["gate_up"] for v in bf if "gate_up" in v] == list(bf16_gate_up.AUDIT_CONFIGS)
    assert [v["down"] for v in bf if "down" in v] == list(bf16_down.AUDIT_CONFIGS)
    assert {"bf16_gate_up.H2048_I768_k8_cfg0", "bf16_down_combine.H2048_I768_k8_cfg0"} <= set(specs)
    nv = PATH_CONFIGS["nvfp4_decode"]
    assert nv["gu-cuda-core"] == {"gate_up": "GATE_UP_CUDA_CORE"} and nv["dn-cuda-core"] == {"down": "DOWN_CUDA_CORE"}
    assert nvfp4_gate_up.accumulation_model(nvfp4_tuned.GATE_UP_MMA).name == "fp32-truncate"
    assert nvfp4_down.accumulation_model(nvfp4_tuned.DOWN_CUDA_CORE).name == "fp32-rn-block16"
    assert {"nvfp4_gate_up.H7168.I2048.mma", "nvfp4_down.H7168.I2048.cuda_core.tap"} <= set(specs)


# ---------------------------------------------------------------------------------------------------------
# inputs made by the field's own tools (ORACLE_PROFILES): present where installed, never on the gpu profile


def test_oracle_profiles_only_where_installed():
    assert not [c.id for c in GPU if c.profile in ORACLE_PROFILES]  # the H200 has neither tool
    for prof in ORACLE_PROFILES:
        got = [c for c in CPU if c.profile == prof]
        assert bool(got) == oracle_available(prof), prof


@pytest.mark.oracle
@pytest.mark.parametrize("path", ["nvfp4_decode", "nvfp4_grouped", "bf16_decode"])
def test_flashinfer_layout_inputs_equal_ours(path):
    """The stored weights FlashInfer's preparation made equal flint_moe.layouts' for the same checkpoint
    tensors, byte for byte (so a difference in a flashinfer_layout case is a kernel's, not the layout's)."""
    pytest.importorskip("flashinfer")
    from flint_moe.layouts import to_trtllm_bf16

    case = next(c for c in CPU if c.profile == "flashinfer_layout" and c.path == path)
    inp = make_inputs(case)
    if path.startswith("nvfp4_"):
        L = inp.logical
        ours = FlintMoEWeights.from_modelopt(L.w13, L.w13_scale, L.w13_gs, L.w2, L.w2_scale, L.w2_gs)
        for name in ("w1", "w1_sf_swizzled", "w1_alpha", "w2", "w2_sf_swizzled", "w2_alpha"):
            assert _bytes(getattr(inp.stored, name)) == _bytes(getattr(ours, name)), name
        assert inp.stored.valid_intermediate == ours.valid_intermediate
    else:
        g1, g2 = to_trtllm_bf16(inp.logical.w13, inp.logical.w2)
        assert _bytes(inp.stored[0]) == _bytes(g1) and _bytes(inp.stored[1]) == _bytes(g2)


@pytest.mark.oracle
def test_modelopt_quantizer_inputs_match_our_recipe():
    """nvidia-modelopt's quantizer and reference.quantize_experts give the same checkpoint tensors for the
    profile's bf16 stack (codes, block scales, one global scale per expert for gate and up)."""
    pytest.importorskip("modelopt")
    from flint_moe.conformance.inputs.profiles import _gen
    from flint_moe.reference.quantize import quantize_experts

    case = next(c for c in CPU if c.profile == "modelopt_quantizer")
    L = make_inputs(case).logical
    g = _gen(torch.device("cpu"), "/".join(map(str, (case.path, case.shape, case.profile, case.seed))))
    E, H, I = case.E, case.H, case.I  # noqa: E741
    gate = torch.randn(E, I, H, generator=g) * 0.05 + 0.01
    up = torch.randn(E, I, H, generator=g) * 0.25 - 0.03
    w2f = torch.randn(E, H, I, generator=g) * 0.05
    ex = quantize_experts(torch.cat([gate, up], 1).to(torch.bfloat16), w2f.to(torch.bfloat16))
    assert _bytes(L.w13) == _bytes(ex.w13) and _bytes(L.w2) == _bytes(ex.w2)
    assert _bytes(L.w13_scale) == _bytes(ex.w13_scale) and _bytes(L.w2_scale) == _bytes(ex.w2_scale)
    assert _bytes(L.w13_gs) == _bytes(ex.w13_gs) and _bytes(L.w2_gs) == _bytes(ex.w2_gs)
