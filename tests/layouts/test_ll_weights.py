"""``LLMoEWeights`` / ``ll_weights_from_layers`` (flint_moe/layouts/ll_weights.py): views of the layers' own
storage, the layout assertions (N % 128, K % 64, contiguity, scale storage size), value checks, a sigmoid
shared-expert gate refused, ``check_metadata`` after in-place changes."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from flint_moe.layouts import FlintMoEWeights, swizzle_block_scales
from flint_moe.layouts.ll_weights import LLMoEWeights, check_nvfp4_linear, ll_weights_from_layers
from flint_moe.reference.layouts import unswizzle_scales
from tests.layouts._gen import e4m3_scales, gen, nvfp4, u8

E, H, I, SI = 3, 128, 64, 64  # noqa: E741


class _Linear(nn.Module):
    """A FlashInfer-prepared NVFP4 linear [N, K] as a serving engine holds it (parameters, swizzled scales)."""

    def __init__(self, n: int, k: int, seed: int, gs: float = 0.25, gs_name: str = "weight_global_scale") -> None:
        super().__init__()
        g = gen(seed)
        self.logical_scale = e4m3_scales((n, k // 16), g)
        sw = swizzle_block_scales(self.logical_scale[None])[0]  # [roundup(n, 128), roundup(k / 16, 4)]
        self.weight = nn.Parameter(u8((n, k // 2), g), requires_grad=False)
        self.weight_scale = nn.Parameter(sw, requires_grad=False)
        setattr(self, gs_name, nn.Parameter(torch.tensor([gs]), requires_grad=False))


def _experts() -> FlintMoEWeights:
    w13, s13, w2, s2 = nvfp4(E, H, I, 3)
    return FlintMoEWeights.from_modelopt(w13, s13, torch.ones(E), w2, s2, torch.ones(E))


def _router() -> torch.Tensor:
    return torch.randn(E, H, generator=gen(4)).to(torch.bfloat16)


def _build(**kw):
    args = {"router_weight": _router(), "shared_gate_up": _Linear(2 * SI, H, 5), "shared_down": _Linear(H, SI, 6),
            "experts": _experts()} | kw  # fmt: skip
    return args, ll_weights_from_layers(**args)


def test_fields_are_views_of_the_layers_storage() -> None:
    args, w = _build()
    gu, dn = args["shared_gate_up"], args["shared_down"]
    assert w.experts is args["experts"]
    assert w.router_weight.data_ptr() == args["router_weight"].data_ptr()
    for field, mod in (("shared_w13", gu), ("shared_w2", dn)):
        codes, sf, gs = (getattr(w, field + s) for s in ("", "_sf", "_gs"))
        assert codes.data_ptr() == mod.weight.data_ptr() and torch.equal(codes, mod.weight.data)
        assert sf.data_ptr() == mod.weight_scale.data_ptr() and sf.dtype == torch.uint8
        assert gs.data_ptr() == mod.weight_global_scale.data_ptr() and gs.shape == () and float(gs) == 0.25
        assert not codes.requires_grad
    assert tuple(w.shared_w13_sf.shape) == (2 * SI, H // 16)
    assert tuple(w.shared_w2_sf.shape) == (H, SI // 16)
    assert (w.num_experts, w.hidden_size, w.shared_intermediate_size) == (E, H, SI)
    # writes through the layer are visible through the view (no copy was made)
    gu.weight.data[0, 0] = 0xAB
    assert int(w.shared_w13[0, 0]) == 0xAB


def test_scale_view_reads_back_the_logical_scales() -> None:
    # the golden model's independent decoder reads the view as the 128x4 swizzle of the row-major scales
    args, w = _build()
    for field, mod, (n, k) in (("shared_w13_sf", args["shared_gate_up"], (2 * SI, H)),
                               ("shared_w2_sf", args["shared_down"], (H, SI))):  # fmt: skip
        back = unswizzle_scales(getattr(w, field)[None], n, k // 16)[0]
        assert torch.equal(back, mod.logical_scale.view(torch.uint8))


def test_weight_scale_2_is_read_when_weight_global_scale_is_absent() -> None:
    _, w = _build(shared_down=_Linear(H, SI, 6, gs=2.0, gs_name="weight_scale_2"))
    assert float(w.shared_w2_gs) == 2.0


def test_layout_assertions_name_the_module_and_tensor() -> None:
    with pytest.raises(ValueError, match=r"^shared_gate_up\.weight: .* N % 128 == 0 .* \(N = 64, K = 128\)"):
        _build(shared_gate_up=_Linear(64, H, 5))
    with pytest.raises(ValueError, match=r"^shared_down\.weight: K must be 64, got 128"):
        _build(shared_down=_Linear(H, 128, 6))
    with pytest.raises(ValueError, match=r"^shared_down\.weight: N must be 128, got 256"):
        _build(shared_down=_Linear(256, SI, 6))
    codes = torch.zeros(128, 16, dtype=torch.uint8)  # K = 32: not a multiple of 64
    with pytest.raises(ValueError, match=r"^lin\.weight: .*K % 64 == 0 \(N = 128, K = 32\)"):
        check_nvfp4_linear("lin", codes, torch.zeros(256, dtype=torch.uint8), torch.ones(()))
    gu = _Linear(2 * SI, H, 5)
    gu.weight.data = torch.cat([gu.weight.data, gu.weight.data], 1)[:, ::2]
    with pytest.raises(ValueError, match=r"^shared_gate_up\.weight: must be contiguous"):
        _build(shared_gate_up=gu)
    gu = _Linear(2 * SI, H, 5)
    gu.weight_scale.data = gu.weight_scale.data[:-1]
    with pytest.raises(ValueError, match=r"^shared_gate_up\.weight_scale: .* take 128 x 8 = 1024 bytes, got 1016"):
        _build(shared_gate_up=gu)
    gu = _Linear(2 * SI, H, 5)
    gu.weight_scale.data = gu.weight_scale.data.t()
    with pytest.raises(ValueError, match=r"^shared_gate_up\.weight_scale: must be contiguous"):
        _build(shared_gate_up=gu)
    gu = _Linear(2 * SI, H, 5)
    gu.weight_scale.data = gu.weight_scale.data.view(torch.uint8).to(torch.int16)
    with pytest.raises(TypeError, match=r"^shared_gate_up\.weight_scale: dtype must be"):
        _build(shared_gate_up=gu)
    dn = _Linear(H, SI, 6)
    dn.weight_global_scale.data = torch.ones(2)
    with pytest.raises(ValueError, match=r"^shared_down\.weight_global_scale: expected one element"):
        _build(shared_down=dn)
    dn = _Linear(H, SI, 6)
    del dn.weight_scale
    with pytest.raises(ValueError, match=r"^shared_down: _Linear has no weight_scale"):
        _build(shared_down=dn)


def test_scale_storage_of_any_shape_with_the_right_size_is_accepted() -> None:
    gu = _Linear(2 * SI, H, 5)
    flat = gu.weight_scale.data.reshape(-1)
    gu.weight_scale.data = flat
    _, w = _build(shared_gate_up=gu)
    assert w.shared_w13_sf.data_ptr() == flat.data_ptr() and tuple(w.shared_w13_sf.shape) == (2 * SI, H // 16)


@pytest.mark.parametrize("gs", [float("nan"), float("inf"), -1.0, -0.0])
def test_bad_global_scales_are_refused(gs) -> None:
    with pytest.raises(ValueError, match=r"^shared_down\.weight_global_scale: global scales must be finite"):
        _build(shared_down=_Linear(H, SI, 6, gs=gs))


def test_nan_scale_byte_is_refused() -> None:
    gu = _Linear(2 * SI, H, 5)
    gu.weight_scale.data.view(torch.uint8)[37, 3] = 0xFF
    with pytest.raises(ValueError, match=r"^shared_gate_up\.weight_scale: contains E4M3 NaN .* \(37, 3\)"):
        _build(shared_gate_up=gu)


def test_router_and_experts_must_agree() -> None:
    with pytest.raises(ValueError, match=r"^router_weight: expected shape \[E=3, H=128\]"):
        _build(router_weight=_router()[:2].contiguous())
    with pytest.raises(TypeError, match=r"^router_weight: dtype must be torch.bfloat16"):
        _build(router_weight=_router().float())
    lin = nn.Linear(H, E, bias=False).to(torch.bfloat16)
    args, w = _build(router_weight=lin)
    assert w.router_weight.data_ptr() == lin.weight.data_ptr() and not w.router_weight.requires_grad
    with pytest.raises(TypeError, match=r"^experts: expected FlintMoEWeights"):
        _build(experts=object())


def test_sigmoid_gated_shared_expert_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^shared_expert_gate: a shared expert with a sigmoid gate"):
        _build(shared_expert_gate=nn.Linear(H, 1, bias=False))
    gu = _Linear(2 * SI, H, 5)
    gu.shared_expert_gate = nn.Linear(H, 1, bias=False)
    with pytest.raises(ValueError, match=r"^shared_gate_up: a shared expert with a sigmoid gate .* outside the"):
        _build(shared_gate_up=gu)


def test_frozen_and_check_metadata_sees_in_place_changes() -> None:
    _, w = _build()
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.shared_w13 = w.shared_w13
    w.check_metadata()
    w.shared_w2_sf.resize_(H, 2)
    with pytest.raises(ValueError, match=r"^weights\.shared_w2_sf: .* take 128 x 4 = 512 bytes, got 256"):
        w.check_metadata()
    _, w = _build()
    w.shared_w13.resize_(2 * SI, 32)
    with pytest.raises(ValueError, match=r"^weights\.shared_w13: K must be 128, got 64"):
        w.check_metadata()


def test_constructor_checks_its_own_field_names() -> None:
    _, w = _build()
    kw = {f.name: getattr(w, f.name) for f in dataclasses.fields(w)}
    with pytest.raises(ValueError, match=r"^shared_w13_gs: expected a 0-d tensor"):
        LLMoEWeights(**(kw | {"shared_w13_gs": torch.ones(1)}))
    with pytest.raises(ValueError, match=r"^shared_w2: N must be 128, got 256"):
        LLMoEWeights(**(kw | {"shared_w2": torch.zeros(256, SI // 2, dtype=torch.uint8)}))
    with pytest.raises(ValueError, match=r"^shared_w13_sf: expected the uint8 \[N, K/16\] view"):
        LLMoEWeights(**(kw | {"shared_w13_sf": w.shared_w13_sf.view(torch.float8_e4m3fn)}))
