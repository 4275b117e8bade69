"""The fused (``torch.compile``) evaluations the order replay uses on CUDA equal the eager ones bit for bit
(``pytest -m gpu tests/reference/test_replay_fused_gpu.py``): the tensor-core model on every input class of
``flint_moe.tools.mma`` (contiguous, strided and broadcast operands, as the replay passes them) and the
one-rounding fp32 fma on random, subnormal and cancelling operands."""

from __future__ import annotations

import pytest
import torch

from flint_moe.reference import mma as mma_model, orders
from flint_moe.tools.mma import CLASSES, generate

pytestmark = pytest.mark.gpu


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("klass", CLASSES)
def test_fused_mma_equals_eager(klass: str) -> None:
    acc, a, b = generate(klass, 20000, 77, "cuda")
    eager = mma_model._fused_dot_bits(a.view(torch.int16), b.view(torch.int16), acc.view(torch.int32))
    assert torch.equal(_bits(mma_model.mma_bf16_f32(acc, a, b)), eager)
    assert not mma_model._dot_fused.fell_back(), "torch.compile failed: the replay runs eagerly"
    # a strided slice of a [rows, steps, 16] operand and a broadcast activation row, as in replay_dot
    a3 = torch.stack([a, a.flip(0)], dim=1)
    got = mma_model.mma_bf16_f32(acc, a3[:, 1, :], b[:1].expand_as(b))
    want = mma_model._fused_dot_bits(
        a.flip(0).view(torch.int16), b[:1].expand_as(b).contiguous().view(torch.int16), acc.view(torch.int32)
    )
    assert torch.equal(_bits(got), want)


def test_fused_fma32_equals_eager() -> None:
    g = torch.Generator(device="cuda").manual_seed(5)
    n = 1 << 20
    x = torch.randn(n, device="cuda", generator=g) * torch.exp2(
        torch.randint(-140, 100, (n,), device="cuda", generator=g).float()
    )
    y = torch.randn(n, device="cuda", generator=g) * torch.exp2(
        torch.randint(-60, 20, (n,), device="cuda", generator=g).float()
    )
    z = -x * y + torch.randn(n, device="cuda", generator=g) * 1e-30  # near-cancelling sums
    z[: n // 4] = torch.randn(n // 4, device="cuda", generator=g) * 1e-40  # subnormal addends
    fused = orders._fma32_on(x)
    assert torch.equal(_bits(fused(x, y, z)), _bits(orders._fma32(x, y, z)))
    assert not fused.fell_back(), "torch.compile failed: the replay runs eagerly"
    assert torch.equal(_bits(fused(x[::3], y[::3], z[::3])), _bits(orders._fma32(x[::3], y[::3], z[::3])))


@pytest.mark.parametrize("klass", CLASSES)
def test_fused_outer_step_equals_eager(klass: str) -> None:
    acc, a, b = generate(klass, 4096, 78, "cuda")
    g, r, n = 3, 5, 7
    w, x, c = a[: g * n].reshape(g, n, 16), b[: g * r].reshape(g, r, 16), acc[: g * r * n].reshape(g, r, n)
    got = mma_model.mma_bf16_f32_outer(c, w, x)
    want = mma_model.mma_bf16_f32(c, w[:, None].expand(g, r, n, 16), x[:, :, None].expand(g, r, n, 16))
    assert torch.equal(_bits(got), _bits(want))
    assert not mma_model._outer_fused.fell_back(), "torch.compile failed: the grouped replay runs eagerly"
