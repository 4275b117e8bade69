"""The harness's module paths on the CPU: ``bf16_module`` (``modules.FlintBf16DecodeMoE`` over the case's
TRT-LLM-layout layer) returns bitwise the op's output and taps, passes the comparison, and FAILs when the layer
it reads is wrong (gate/up rows exchanged)."""

from __future__ import annotations

import torch

from flint_moe.conformance.inputs.cases import Case, make_inputs, matrix
from flint_moe.conformance.judge.results import FAIL
from flint_moe.conformance.judge.stages import compare_case
from flint_moe.conformance.run.paths import path_for
from flint_moe.ops import make_route_counter


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def test_bf16_module_path_equals_the_op_and_passes():
    case = next(c for c in matrix("cpu") if c.path == "bf16_module")
    dev = torch.device("cpu")
    inputs = make_inputs(case, dev)
    taps_m, taps_o = {}, {}
    out_m = path_for(case).run(inputs, make_route_counter(dev), taps_m)
    twin = Case.make("bf16_decode", case.shape, case.M, case.profile)  # same shape: same stored layout type
    out_o = path_for(twin).run(inputs, make_route_counter(dev), taps_o)
    assert torch.equal(_bits(out_m), _bits(out_o))
    assert sorted(taps_m) == sorted(taps_o) and all(torch.equal(_bits(taps_m[k]), _bits(taps_o[k])) for k in taps_o)
    res = compare_case(case, inputs, taps_m, out_m)
    assert res.verdict != FAIL, [(s.stage, s.note) for s in res.stages if s.verdict == FAIL]


def test_bf16_module_path_fails_a_wrong_layer():
    case = next(c for c in matrix("cpu") if c.path == "bf16_module")
    dev = torch.device("cpu")
    inputs = make_inputs(case, dev)
    g1, g2, maps = inputs.stored
    half = g1.shape[2] // 2
    bad = torch.cat([g1[:, :, half:], g1[:, :, :half]], dim=2).contiguous()  # the two halves of w13 exchanged
    inputs.stored = (bad, g2, maps)
    taps: dict = {}
    out = path_for(case).run(inputs, make_route_counter(dev), taps)
    res = compare_case(case, inputs, taps, out)
    assert res.verdict == FAIL


def test_dispatch_path_is_the_op_and_is_judged_like_its_target():
    """``nvfp4_dispatch`` runs ``ops.flint_moe`` at any M: bitwise the decode path's output and taps at the
    shape's threshold (``ops.decode_max_tokens(6, 3)`` = 6 // 3 = 2), the grouped path's above; its stages are
    bounded by that path's summation models and replayed in its orders (``dispatch_path``, the op's own rule)."""
    import pytest

    from flint_moe.conformance.inputs.cases import threshold_m
    from flint_moe.conformance.judge.stages import expert_models
    from flint_moe.conformance.run.paths import PATHS, declared_orders, dispatch_path
    from flint_moe.ops import DECODE_MAX_TOKENS, make_route_counter

    assert PATHS["nvfp4_dispatch"].max_tokens > PATHS["nvfp4_decode"].max_tokens == DECODE_MAX_TOKENS == 32
    shape = Case.make("nvfp4_dispatch", "cpu-E6-H96-I64-k3", 1, "gaussian")
    assert threshold_m(shape) == (2, 3)
    assert [dispatch_path(m, 256, 8) for m in (24, 25)] == ["nvfp4_decode", "nvfp4_grouped"]  # DeepSeek-V3
    assert [dispatch_path(m, 128, 8) for m in (16, 17)] == ["nvfp4_decode", "nvfp4_grouped"]  # Qwen3-235B-A22B
    assert [dispatch_path(m, 128, 4) for m in (24, 25)] == ["nvfp4_decode", "nvfp4_grouped"]  # gpt-oss-120b
    assert [dispatch_path(m, 8, 2) for m in (4, 5)] == ["nvfp4_decode", "nvfp4_grouped"]  # Mixtral-8x7B
    with pytest.raises(ValueError, match="E and k are needed"):
        expert_models("nvfp4_dispatch", M=3)
    assert expert_models("nvfp4_dispatch") == expert_models("nvfp4_decode")  # no M: decode
    for m, target in zip(threshold_m(shape), ("nvfp4_decode", "nvfp4_grouped"), strict=True):
        assert expert_models("nvfp4_dispatch", M=m, E=6, k=3) == expert_models(target)
        case = Case.make("nvfp4_dispatch", "cpu-E6-H96-I64-k3", m, "gaussian")
        assert declared_orders(case) == declared_orders(Case.make(target, case.shape, m, "gaussian"))
        inp = make_inputs(case)
        taps, ref_taps = {}, {}
        out = PATHS["nvfp4_dispatch"].run(inp, make_route_counter("cpu"), taps)
        ref = PATHS[target].run(inp, make_route_counter("cpu"), ref_taps)
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
        assert sorted(taps) == sorted(ref_taps)
        for name, t in taps.items():
            assert torch.equal(_bits(t), _bits(ref_taps[name])), (m, name)


def test_decode_path_runs_the_decode_kernels_past_the_ops_limit(monkeypatch):
    """``nvfp4_decode`` serves any M <= ``ops.DECODE_MAX_TOKENS``: through ``ops.flint_moe`` up to the shape's
    limit (``decode_max_tokens(6, 3)`` = 2), the same kernels launched directly above it (never the grouped path,
    which ``flint_moe`` would pick there). The runs are replaced by recorders: no kernel launches."""
    from types import SimpleNamespace

    from flint_moe.conformance.run import paths

    ran: list = []
    monkeypatch.setattr(paths, "_nvfp4", lambda inputs, counter, taps: ran.append(("op", inputs.x.shape[0])))
    monkeypatch.setattr(paths, "_nvfp4_with", lambda cfg: lambda i, c, t: ran.append(("kernels", cfg, i.x.shape[0])))
    for m in (1, 2, 3, 32):
        inp = SimpleNamespace(x=torch.zeros(m, 96), router_weight=torch.zeros(6, 96), notes={"top_k": 3})
        paths.PATHS["nvfp4_decode"].fn(inp, None, None)
    assert ran == [("op", 1), ("op", 2), ("kernels", {}, 3), ("kernels", {}, 32)]
