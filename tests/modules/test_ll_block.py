"""``FlintLLDecodeBlock`` (flint_moe/modules/ll_block.py): built from the layer's modules (views, no copy),
forward hands the op its own state (the op itself is replaced by the golden stand-in: its CuTe kernels need a
GPU), and every rejection names the argument and the constraint.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from flint_moe.conformance.inputs.cases import Case, make_inputs
from flint_moe.conformance.run.paths import ll_module_from_inputs
from flint_moe.modules import FlintLLDecodeBlock
from tests.conformance import ll_standin


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(Case.make("ll_module", "cpu-deepseek-v3", 2, "gaussian"))


def _block(inputs, **kw) -> FlintLLDecodeBlock:
    args = {"weights": inputs.ll, "ln_weight": inputs.ln_weight, "eps": 1e-6, "top_k": 8} | kw
    return FlintLLDecodeBlock(**args)


def test_from_layers_holds_views_and_forward_calls_the_op(inputs, monkeypatch) -> None:
    ll_standin.install(monkeypatch)
    mod = ll_module_from_inputs(inputs, 8)
    assert mod.weights.shared_w13.data_ptr() == inputs.ll.shared_w13.data_ptr()
    assert mod.weights.shared_w2_sf.data_ptr() == inputs.ll.shared_w2_sf.data_ptr()
    assert mod.ln_weight.data_ptr() == inputs.ln_weight.data_ptr()
    assert mod.route_counter.dtype == torch.int32 and not bool(mod.route_counter.any())
    attn, res = inputs.x.clone(), inputs.shared.clone()
    out, residual_out = mod(inputs.x, inputs.shared)
    (call,) = ll_standin.CALLS
    assert call["counter"] is mod.route_counter and call["ln_weight"] is mod.ln_weight
    assert call["w"] is mod.weights and call["top_k"] == 8 and call["eps"] == 1e-6
    gold = ll_standin.golden_block_taps(attn, res, inputs.ln_weight, 1e-6, inputs.ll, 8)
    assert torch.equal(out.view(torch.int16), gold["out"].view(torch.int16))
    want = (attn.float() + res.float()).to(torch.bfloat16)
    assert torch.equal(residual_out.view(torch.int16), want.view(torch.int16))
    assert "shared_intermediate_size=128" in repr(mod)


def test_constructor_rejections(inputs) -> None:
    with pytest.raises(TypeError, match="weights: expected LLMoEWeights, got FlintMoEWeights"):
        _block(inputs, weights=inputs.stored)
    with pytest.raises(TypeError, match="ln_weight: dtype must be torch.bfloat16"):
        _block(inputs, ln_weight=inputs.ln_weight.float())
    with pytest.raises(ValueError, match=r"ln_weight: expected shape \[H=384\], got \(383,\)"):
        _block(inputs, ln_weight=inputs.ln_weight[:383])
    with pytest.raises(ValueError, match="ln_weight: must be contiguous"):
        _block(inputs, ln_weight=torch.stack([inputs.ln_weight] * 2, 1)[:, 0])
    for eps in (-1e-6, math.nan, math.inf, 1e39):
        with pytest.raises(ValueError, match="eps: must be finite and >= 0 in fp32"):
            _block(inputs, eps=eps)
    with pytest.raises(TypeError, match="eps: expected a Python float"):
        _block(inputs, eps=torch.tensor(1e-6))
    with pytest.raises(ValueError, match=r"top_k: must satisfy 1 <= top_k <= min\(E = 10, 16\), got 11"):
        _block(inputs, top_k=11)
    with pytest.raises(TypeError, match="top_k: expected an int, got bool"):
        _block(inputs, top_k=True)


def test_forward_rejections(inputs, monkeypatch) -> None:
    ll_standin.install(monkeypatch)
    mod = _block(inputs)
    x, r = inputs.x, inputs.shared
    cases = [
        ((x.float(), r), TypeError, "attn_out: dtype must be torch.bfloat16"),
        ((x, r.half()), TypeError, "residual: dtype must be torch.bfloat16"),
        ((x[:, :128], r), ValueError, r"attn_out: expected shape \[M, H=384\], got \(2, 128\)"),
        ((x[0], r), ValueError, r"attn_out: expected shape \[M, H=384\]"),
        ((x, r[:1]), ValueError, r"residual: expected shape \(2, 384\) \(attn_out's\), got \(1, 384\)"),
        ((x[:0], r[:0]), ValueError, "attn_out: the block takes 1 <= M <= LL_MOE_MAX_TOKENS = 8 tokens, got M = 0"),
        ((x.repeat(5, 1), r.repeat(5, 1)), ValueError, "got M = 10"),
        ((torch.cat([x, x], 1)[:, ::2], r), ValueError, "attn_out: must be contiguous"),
        ((x, "r"), TypeError, "residual: expected a torch.Tensor, got str"),
    ]
    for args, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            mod(*args)
    with pytest.raises(TypeError, match="taps: expected a dict or None, got list"):
        mod(x, r, taps=[])
    assert ll_standin.CALLS == []  # nothing reached the op


def test_sigmoid_gated_shared_expert_is_refused(inputs) -> None:
    ll = inputs.ll

    def linear(codes, sf, gs):
        m = nn.Module()
        m.weight, m.weight_scale, m.weight_global_scale = codes, sf, gs.reshape(1)
        return m

    gate_up = linear(ll.shared_w13, ll.shared_w13_sf, ll.shared_w13_gs)
    down = linear(ll.shared_w2, ll.shared_w2_sf, ll.shared_w2_gs)
    with pytest.raises(ValueError, match="sigmoid gate"):
        FlintLLDecodeBlock.from_layers(ll.router_weight, gate_up, down, ll.experts, inputs.ln_weight, 1e-6, 8,
                                       shared_expert_gate=nn.Linear(384, 1))  # fmt: skip
    ok = FlintLLDecodeBlock.from_layers(ll.router_weight, gate_up, down, ll.experts, inputs.ln_weight, 1e-5, 2)
    assert ok.top_k == 2 and ok.eps == 1e-5 and ok.hidden_size == 384
