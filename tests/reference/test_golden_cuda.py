"""The golden model on CUDA tensors gives the same bits as on the CPU.

Every stage must agree bit for bit, the exact accumulations included: ``exact`` is computed by exact,
order-independent binned summation (flint_moe/reference/exact_sum.py), so neither the BLAS nor the device may change
it. (The certified bounds use a float64 sum of |terms| whose order may differ; both are valid bounds and are not
compared.)
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import flint_moe.reference as R
from flint_moe.reference.exact import Accumulation

pytestmark = pytest.mark.gpu


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.cpu()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, with NaNs compared as NaN-ness (CPU and GPU NaN payloads differ)."""
    a, b = a.cpu(), b.cpu()
    if a.is_floating_point():
        na, nb = torch.isnan(a.float()), torch.isnan(b.float())
        if not torch.equal(na, nb):
            return False
        a = torch.where(na, torch.zeros_like(a), a)
        b = torch.where(nb, torch.zeros_like(b), b)
    return torch.equal(_bits(a), _bits(b))


def _compare(cpu_result, cuda_result, prefix=""):
    for f in dataclasses.fields(cpu_result):
        a, b = getattr(cpu_result, f.name), getattr(cuda_result, f.name)
        name = prefix + f.name
        if isinstance(a, Accumulation):
            assert b.exact.is_cuda, name
            assert _same(a.exact, b.exact), f"{name}: exact accumulator values differ between CPU and CUDA"
        elif isinstance(a, torch.Tensor):
            assert b.is_cuda and a.dtype == b.dtype and a.shape == b.shape, name
            assert _same(a, b), f"{name}: CPU and CUDA bits differ"
        elif dataclasses.is_dataclass(a):
            _compare(a, b, name + ".")


def _cuda(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cuda()
    if dataclasses.is_dataclass(obj):
        return type(obj)(**{f.name: _cuda(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init})
    return obj


def _nvfp4(e, h, i, g):
    w13 = torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, generator=g)
    s13 = torch.randint(0x28, 0x40, (e, 2 * i, h // 16), dtype=torch.uint8, generator=g)
    s2 = torch.randint(0x28, 0x40, (e, h, i // 16), dtype=torch.uint8, generator=g)
    gs13 = (torch.rand(e, generator=g) + 0.5) * 0.25
    gs2 = (torch.rand(e, generator=g) + 0.5) * 0.25
    return R.NVFP4Experts(w13, s13, gs13, w2, s2, gs2)


@pytest.mark.parametrize("e,h,i,k,m", [(160, 320, 192, 6, 3), (12, 2880, 704, 4, 5)])
def test_moe_nvfp4_cuda_equals_cpu(e, h, i, k, m):
    g = torch.Generator().manual_seed(e + h)
    ex = _nvfp4(e, h, i, g)
    x = torch.randn(m, h, generator=g).to(torch.bfloat16)
    x[0, :3] = torch.tensor([float("inf"), 0.0, -0.0])  # special values propagate identically
    wr = (torch.randn(e, h, generator=g) * 0.05).to(torch.bfloat16)
    shared = torch.randn(m, h, generator=g).to(torch.bfloat16)
    _compare(R.moe_nvfp4(x, wr, ex, k, shared), R.moe_nvfp4(x.cuda(), wr.cuda(), _cuda(ex), k, shared.cuda()))


def test_moe_bf16_cuda_equals_cpu():
    g = torch.Generator().manual_seed(3)
    e, h, i, k, m = 10, 384, 128, 3, 4
    ex = R.BF16Experts((torch.randn(e, 2 * i, h, generator=g) * 0.05).to(torch.bfloat16),
                       (torch.randn(e, h, i, generator=g) * 0.05).to(torch.bfloat16))  # fmt: skip
    x = torch.randn(m, h, generator=g).to(torch.bfloat16)
    wr = torch.randn(e, h, generator=g).to(torch.bfloat16)
    _compare(R.moe_bf16(x, wr, ex, k), R.moe_bf16(x.cuda(), wr.cuda(), _cuda(ex), k))


def test_moe_decode_block_cuda_equals_cpu():
    g = torch.Generator().manual_seed(5)
    e, h, i, k, m, si = 9, 256, 128, 3, 3, 64
    ex = _nvfp4(e, h, i, g)
    sh = _nvfp4(1, h, si, g)
    sw13 = R.NVFP4Linear(sh.w13[0], sh.w13_scale[0], sh.w13_gs[0])
    sw2 = R.NVFP4Linear(sh.w2[0], sh.w2_scale[0], sh.w2_gs[0])
    attn = torch.randn(m, h, generator=g).to(torch.bfloat16)
    res = torch.randn(m, h, generator=g).to(torch.bfloat16)
    w_ln = (torch.rand(h, generator=g) + 0.5).to(torch.bfloat16)
    wr = torch.randn(e, h, generator=g).to(torch.bfloat16)
    a = R.moe_decode_block(attn, res, w_ln, 1e-6, wr, ex, k, sw13, sw2)
    b = R.moe_decode_block(attn.cuda(), res.cuda(), w_ln.cuda(), 1e-6, wr.cuda(), _cuda(ex), k, _cuda(sw13),
                           _cuda(sw2))  # fmt: skip
    _compare(a, b)


def test_order_free_stages_cuda_equal_cpu_on_special_values():
    """Steps 3, 4, 7, 9, 10 and 11's normalisation fed identical inputs incl. NaN/inf/subnormal/signed zero."""
    g = torch.Generator().manual_seed(11)
    bits = torch.randint(-(2**15), 2**15, (4096,), dtype=torch.int32, generator=g).to(torch.int16)
    logits = bits.view(torch.bfloat16).reshape(512, 8)
    for fn in (R.routing_scores,):
        assert _same(fn(logits), fn(logits.cuda()))
    scores = R.routing_scores(logits[:, :6])
    assert _same(R.renormalize(scores), R.renormalize(scores.cuda()))
    f32 = torch.randint(-(2**31), 2**31, (2, 1 << 16), dtype=torch.int64, generator=g).to(torch.int32)
    gg, uu = f32.view(torch.float32)
    assert _same(R.swiglu(gg, uu), R.swiglu(gg.cuda(), uu.cuda()))
    ids = R.topk_total_order(logits, 5)
    assert _same(ids, R.topk_total_order(logits.cuda(), 5))
