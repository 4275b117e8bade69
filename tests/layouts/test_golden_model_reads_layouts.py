"""The golden model accepts weights held in FlashInfer's CuTe-DSL W4A16 layout: every stage of
``moe_nvfp4`` on ``FlintMoEWeights`` is bit-identical to the run on the logical checkpoint tensors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flint_moe.layouts import FlintMoEWeights
from flint_moe.reference.exact import Accumulation
from flint_moe.reference.model import moe_nvfp4
from flint_moe.reference.weights import NVFP4Experts

from ._gen import bits, gen


def _stage_tensors(result) -> dict[str, torch.Tensor]:
    out = {}
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        if isinstance(v, Accumulation):
            out[f.name + ".exact"] = v.exact
            out[f.name + ".bound"] = v.bound
        elif isinstance(v, torch.Tensor):
            out[f.name] = v
    return out


@pytest.mark.parametrize("E,H,I,k,pad_to", [(10, 256, 128, 3, None), (6, 160, 176, 4, 128)])
def test_moe_nvfp4_on_cutedsl_layout_equals_logical(E, H, I, k, pad_to):
    g = gen(7)
    # Finite, positive-and-negative E4M3 block scales in a moderate range so outputs are neither all zero nor
    # overflowing; distinct global scales per expert so an expert mix-up would show.
    w13 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, generator=g)
    s13 = torch.randint(0x30, 0x48, (E, 2 * I, H // 16), dtype=torch.uint8, generator=g)
    s2 = torch.randint(0x30, 0x48, (E, H, I // 16), dtype=torch.uint8, generator=g)
    gs13 = (torch.rand(E, generator=g) + 0.5) * 2.0**-4
    gs2 = (torch.rand(E, generator=g) + 0.5) * 2.0**-4
    logical = NVFP4Experts(w13, s13.view(torch.float8_e4m3fn), gs13, w2, s2.view(torch.float8_e4m3fn), gs2)
    stored = FlintMoEWeights.from_modelopt(
        w13, s13.view(torch.float8_e4m3fn), gs13, w2, s2.view(torch.float8_e4m3fn), gs2,
        pad_intermediate_to=pad_to,
    )  # fmt: skip
    x = torch.randn(3, H, generator=g).to(torch.bfloat16)
    router = torch.randn(E, H, generator=g).to(torch.bfloat16)

    a = _stage_tensors(moe_nvfp4(x, router, logical, k))
    b = _stage_tensors(moe_nvfp4(x, router, stored, k))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(bits(a[name]), bits(b[name])), name
    assert int(torch.count_nonzero(a["out"].float())) > 0


def test_moe_nvfp4_rejects_other_objects():
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="experts: expected NVFP4Experts or a FlintMoEWeights-like"):
        moe_nvfp4(x, torch.zeros(4, 32, dtype=torch.bfloat16), object(), 2)
