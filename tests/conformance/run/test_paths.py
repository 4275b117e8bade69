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
    """``nvfp4_dispatch`` runs ``ops.flint_moe`` at any M: bitwise the decode path's output and taps at
    DECODE_MAX_TOKENS, the grouped path's above; its stages are bounded by that path's summation models."""
    from flint_moe.conformance.judge.stages import expert_models
    from flint_moe.conformance.run.paths import PATHS
    from flint_moe.ops import DECODE_MAX_TOKENS, make_route_counter

    assert PATHS["nvfp4_dispatch"].max_tokens > DECODE_MAX_TOKENS == 8
    for m, target in ((DECODE_MAX_TOKENS, "nvfp4_decode"), (DECODE_MAX_TOKENS + 1, "nvfp4_grouped")):
        assert expert_models("nvfp4_dispatch", M=m) == expert_models(target)
        case = Case.make("nvfp4_dispatch", "cpu-E6-H96-I64-k3", m, "gaussian")
        inp = make_inputs(case)
        taps, ref_taps = {}, {}
        out = PATHS["nvfp4_dispatch"].run(inp, make_route_counter("cpu"), taps)
        ref = PATHS[target].run(inp, make_route_counter("cpu"), ref_taps)
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
        assert sorted(taps) == sorted(ref_taps)
        for name, t in taps.items():
            assert torch.equal(_bits(t), _bits(ref_taps[name])), (m, name)
