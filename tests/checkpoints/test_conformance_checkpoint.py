"""``flint_moe.conformance.inputs.checkpoint.checkpoint_cases``: cases and inputs from a checkpoint's MoE layer
(a ModelOpt directory written with safetensors, a GGUF file), deterministic tokens, the stored weights equal to
``FlintMoEWeights.from_modelopt`` of the checkpoint tensors, and one case run through the harness (path +
``compare_case``) without a FAIL.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.conformance.inputs.checkpoint import CHECKPOINT_PROFILE, checkpoint_cases, checkpoint_shape_name
from flint_moe.layouts import FlintMoEWeights
from tests.checkpoints._writers import random_experts, write_gguf_nvfp4, write_modelopt_dir

E, H, I, K = 6, 64, 64, 3  # noqa: E741


def _experts(seed: int) -> tuple[dict, torch.Tensor, tuple]:
    named, router = random_experts(E, H, I, seed)
    st = lambda p, k: torch.stack([named[f"{e}.{p}.{k}"] for e in range(E)])  # noqa: E731
    stacked = (
        torch.cat([st("gate_proj", "weight"), st("up_proj", "weight")], 1),
        torch.cat([st("gate_proj", "weight_scale"), st("up_proj", "weight_scale")], 1),
        st("gate_proj", "weight_scale_2"),
        st("down_proj", "weight"),
        st("down_proj", "weight_scale"),
        st("down_proj", "weight_scale_2"),
    )
    return named, router, stacked


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.uint8)


def test_checkpoint_cases(tmp_path) -> None:
    named, router, stacked = _experts(7)
    d = write_modelopt_dir(tmp_path / "my ckpt", {2: (named, router)}, top_k=K, shards=2)
    cases = checkpoint_cases(d, 2, token_counts=[1, 3], seed=4)
    assert [c.M for c, _ in cases] == [1, 3]
    case, inp = cases[0]
    assert case.shape == checkpoint_shape_name(d, 2) == "ckpt-my-ckpt-L2"
    assert case.id == "nvfp4_decode/ckpt-my-ckpt-L2/M1/modelopt/s4" and case.profile == CHECKPOINT_PROFILE
    assert (case.E, case.H, case.I, case.k, case.pad_to, case.seed) == (E, H, I, K, None, 4)
    assert inp.notes == {"top_k": K, "checkpoint": str(d), "layer": 2, "source": "modelopt"}
    assert inp.x.shape == (1, H) and inp.shared.shape == (1, H) and inp.x.dtype == torch.bfloat16
    assert torch.equal(inp.router_weight.view(torch.int16), router.view(torch.int16))
    want = FlintMoEWeights.from_modelopt(*stacked)
    for f in ("w1", "w1_sf_swizzled", "w1_alpha", "w2", "w2_sf_swizzled", "w2_alpha"):
        assert torch.equal(_bits(getattr(inp.stored, f)), _bits(getattr(want, f))), f
    lg = inp.logical
    assert torch.equal(lg.w13, stacked[0]) and torch.equal(lg.w13_scale.view(torch.uint8), stacked[1].view(torch.uint8))
    assert torch.equal(_bits(lg.w13_gs), _bits(stacked[2])) and torch.equal(_bits(lg.w2_gs), _bits(stacked[5]))
    # deterministic tokens, different per M and per seed
    again = checkpoint_cases(d, 2, token_counts=[1], seed=4)[0][1]
    assert torch.equal(again.x.view(torch.int16), inp.x.view(torch.int16))
    assert torch.equal(again.shared.view(torch.int16), inp.shared.view(torch.int16))
    other = checkpoint_cases(d, 2, token_counts=[1], seed=5, top_k=2)[0]
    assert other[0].k == 2 and not torch.equal(other[1].x, inp.x)
    # the same layer from a GGUF (llama.cpp NVFP4) file gives the same stored weights
    b = write_gguf_nvfp4(tmp_path / "l.gguf", {2: (named, router)}, top_k=K)
    gcase, ginp = checkpoint_cases(b, 2, token_counts=[1], seed=4)[0]
    assert gcase.shape == "ckpt-l.gguf-L2" and ginp.notes["source"] == "gguf-nvfp4"
    for f in ("w1", "w1_sf_swizzled", "w1_alpha", "w2", "w2_sf_swizzled", "w2_alpha"):
        assert torch.equal(_bits(getattr(ginp.stored, f)), _bits(getattr(want, f))), f
    for bad, pattern in (([], r"^token_counts: need at least one M >= 1"), ([0], r"^token_counts")):
        with pytest.raises(ValueError, match=pattern):
            checkpoint_cases(d, 2, token_counts=bad)


def test_case_runs_through_the_harness(tmp_path) -> None:
    from flint_moe.conformance.judge.stages import compare_case
    from flint_moe.conformance.run.paths import PATHS
    from flint_moe.ops import make_route_counter

    named, router, _ = _experts(8)
    d = write_modelopt_dir(tmp_path / "c", {0: (named, router)}, top_k=K, shards=1)
    case, inp = checkpoint_cases(d, 0, token_counts=[2], seed=0)[0]
    taps: dict = {}
    out = PATHS[case.path].run(inp, make_route_counter(), taps)
    res = compare_case(case, inp, taps, out)
    assert res.verdict != "FAIL", [(s.name, s.verdict) for s in res.stages]
    assert res.meta["shape"] == "ckpt-c-L0" and res.meta["M"] == 2
