"""``quantize_routed_nvfp4_input`` on the H200 (``pytest -m gpu``): codes, block-scale bytes and token-scale
bits equal the golden model (``reference.pertoken.quantize_nvfp4_pertoken``, run on the CPU) on every row;
the interpreter tests (test_pertoken_quant.py) check the same rows on the CPU, this checks sm_90's own
div.rn.f32 / mul.f32 and the subnormal token scales."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flint_moe.ops import quantize_routed_nvfp4_input
from flint_moe.reference.pertoken import quantize_nvfp4_pertoken

pytestmark = pytest.mark.gpu


def _compare(x: torch.Tensor, hp: int) -> None:
    codes, scale, d = quantize_routed_nvfp4_input(x.cuda(), hp)
    r_codes, r_scale, r_d, _ = quantize_nvfp4_pertoken(x)
    h = x.shape[1]
    assert torch.equal(codes[:, : h // 2].cpu(), r_codes)
    assert torch.equal(scale[:, : h // 16].cpu(), r_scale.view(torch.uint8))
    assert torch.equal(d.cpu().view(torch.int32), r_d.view(torch.int32))
    assert not codes[:, h // 2 :].any() and not scale[:, h // 16 :].any()


@pytest.mark.parametrize("h,hp", [(7168, 7168), (2880, 3072), (272, 512)])
def test_random_rows(h: int, hp: int) -> None:
    gen = torch.Generator().manual_seed(h)
    scale = torch.exp2(torch.randint(-40, 40, (64, 1), generator=gen).float())
    x = (torch.randn(64, h, generator=gen) * scale).to(torch.bfloat16)
    x[3, 77] = 3.0e38
    x[5] = 0.0
    x[7] = -0.0
    x[9, :16] = 2.0**-133  # the smallest bf16 subnormal as the row maximum: a subnormal token scale
    x[9, 16:] = 0.0
    _compare(x, hp)


@pytest.mark.parametrize("context_bits", [0x0000, 0x0001, 0x43E0, 0x4528, 0x7F7F])
def test_every_finite_bf16_pattern_beside_a_context_block(context_bits: int) -> None:
    """All 4,080 groups of 16 consecutive finite bf16 patterns, each beside a block of one repeated value."""
    bits = np.arange(1 << 16, dtype=np.int64)
    finite = bits[(bits & 0x7F80) != 0x7F80].reshape(-1, 16)
    rows = np.concatenate([finite, np.full_like(finite, context_bits)], 1).astype(np.int16)
    _compare(torch.from_numpy(rows).view(torch.bfloat16).contiguous(), 256)
