"""``python -m flint_moe.tools.golden``: the shared expert is the shape's own (none for a model without one)."""

from __future__ import annotations

import pytest
import torch

from flint_moe.shapes import MoEShape
from flint_moe.tools import golden as tool

TINY = MoEShape("tiny-no-shared", 6, 64, 32, 2)
TINY_SHARED = MoEShape("tiny-shared", 6, 64, 32, 2, 48)


def _run(monkeypatch, shape: MoEShape) -> dict:
    """main() on ``shape`` with the golden model call recorded."""
    seen: dict = {}
    real = tool.golden.moe_nvfp4

    def spy(x, router_weight, experts, top_k, shared=None, **kw):
        seen.update(x=x, shared=shared)
        seen["result"] = real(x, router_weight, experts, top_k, shared=shared, **kw)
        return seen["result"]

    monkeypatch.setitem(tool.MODEL_SHAPES, shape.name, shape)
    monkeypatch.setattr(tool.golden, "moe_nvfp4", spy)
    assert tool.main(["--model", shape.name, "--tokens", "3"]) == 0
    return seen


def test_model_without_shared_expert_gets_no_shared_output(monkeypatch):
    seen = _run(monkeypatch, TINY)
    assert seen["shared"] is None
    r = seen["result"]
    assert torch.equal(r.out.view(torch.int16), r.routed.view(torch.int16))  # step 10 skipped: out = routed


def test_model_with_shared_expert_uses_its_size(monkeypatch):
    made: list[MoEShape] = []
    synth = tool.synthesize_nvfp4_experts

    def record(shape, generator, device="cpu"):
        made.append(shape)
        return synth(shape, generator, device)

    monkeypatch.setattr(tool, "synthesize_nvfp4_experts", record)
    seen = _run(monkeypatch, TINY_SHARED)
    assert [(s.num_experts, s.hidden, s.intermediate) for s in made] == [(6, 64, 32), (1, 64, 48)]
    shared = seen["shared"]
    assert shared.dtype == torch.bfloat16 and shared.shape == (3, 64)
    # step 10 with that output: out = bf16(RN(routed + shared)), recomputed with torch's own fp32 add and cast
    r = seen["result"]
    want = (r.routed.float() + shared.float()).to(torch.bfloat16)
    assert torch.equal(r.out.view(torch.int16), want.view(torch.int16))
    assert not torch.equal(r.out.view(torch.int16), r.routed.view(torch.int16))


def test_shared_output_is_none_only_without_shared_expert():
    g = torch.Generator().manual_seed(0)
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    assert tool.shared_expert_output(TINY, x, g) is None
    with pytest.raises(ValueError):
        tool.shared_expert_output(MoEShape("bad", 6, 64, 32, 2, 40), x, g)  # 40 / 16 blocks: not a layout
