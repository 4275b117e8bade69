"""The decode block's router kernel on the H200 (``pytest -m gpu``), real widths: residual_out and xn bit for
bit against step 11 fed the kernel's own sum of squares, the sum of squares and the router sums bit for bit
equal to the golden model's replay of the declared orders (``kernels.orders.ll_router_orders``: on the GPU
each chain step is one fused fma), sumsq within its certified bound, steps 1-4 exactly from the taps."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.ll_router import launch_ll_router
from flint_moe.kernels.orders import ll_router_orders
from flint_moe.ops import make_route_counter
from flint_moe.reference.decode_block import eps_fp32, residual_add, rmsnorm_apply, sum_squares
from flint_moe.reference.exact import check_accumulator
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.orders import replay_dot

from ._router_check import check_route, same_bits

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("e", "h", "k"), [(256, 7168, 8), (160, 5120, 8), (384, 7168, 8), (256, 2048, 8)])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_stages_on_the_gpu(e: int, h: int, k: int, m: int) -> None:
    g = torch.Generator().manual_seed(e + h + m)
    attn = torch.randn(m, h, generator=g).bfloat16()
    res = (torch.randn(m, h, generator=g) * 4).bfloat16()
    lnw = (torch.rand(h, generator=g) * 2 - 0.5).bfloat16()
    w = (torch.randn(e, h, generator=g) * 0.05).bfloat16()
    eps = eps_fp32(1e-6)
    taps: dict = {}
    ids, tw, xn, res_out = launch_ll_router(
        attn.cuda(), res.cuda(), lnw.cuda(), eps, w.cuda(), k, make_route_counter("cuda"), taps=taps
    )
    t = {n: v.cpu() for n, v in taps.items()}
    s = residual_add(attn, res)
    assert same_bits(res_out.cpu(), to_bf16(s))
    assert same_bits(xn.cpu(), rmsnorm_apply(s, t["sumsq"], lnw, eps))
    orders = ll_router_orders(h)
    assert same_bits(t["sumsq"], replay_dot(orders["sumsq"], s, s)), "sum of squares: declared order not followed"
    assert bool(check_accumulator(t["sumsq"], sum_squares(s), name="sumsq").all())
    acc = replay_dot(orders["router"], w.float(), xn.cpu().float()[:, None, :])
    assert same_bits(t["router_acc"], acc), "router sums: declared order not followed"
    check_route(xn, w.cuda(), k, ids, tw, taps)
