"""The decode block's router kernel (flint_moe/kernels/ll_router.py) under the Triton interpreter: every stage
against the golden model's step 11 and steps 1-4, fed the kernel's own taps (residual_out and xn bit for bit,
sumsq and router_acc within the certified bound and equal to a replay of the documented orders), a zero row,
H over one chunk with a masked tail, a counter shared with route(), tapped == untapped, inputs unmodified."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.ll_router import LL_ROUTER_TAPS, launch_ll_router, ll_router_config
from flint_moe.kernels.orders import ll_router_orders
from flint_moe.kernels.router import COUNTER_ALIGN
from flint_moe.ops import make_route_counter, route
from flint_moe.reference.decode_block import eps_fp32, residual_add, rmsnorm_apply, sum_squares
from flint_moe.reference.exact import check_accumulator
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.orders import replay_dot

from ._router_check import check_route, replay_gemv_order, same_bits

BACKEND = "interpreter"


def _inputs(m: int, e: int, h: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    attn = torch.randn(m, h, generator=g).bfloat16()
    res = (torch.randn(m, h, generator=g) * 4).bfloat16()
    lnw = (torch.rand(h, generator=g) * 2 - 0.5).bfloat16()
    w = (torch.randn(e, h, generator=g) * 0.5).bfloat16()
    return attn, res, lnw, w


def _replay_sumsq(s: torch.Tensor, e: int, k: int) -> torch.Tensor:
    """The documented sum-of-squares order as the interpreter evaluates it (``tl.fma`` = fp32 multiply, then
    fp32 add): lane j sequential over chunks of BLOCK_H, then the pairwise tree over adjacent lanes."""
    m, h = s.shape
    bh = ll_router_config(e, h, k)["BLOCK_H"]
    c = -(-h // bh)
    sp = torch.zeros(m, c * bh, dtype=torch.float32)
    sp[:, :h] = s
    q = torch.zeros(m, bh, dtype=torch.float32)
    for ci in range(c):
        chunk = sp[:, ci * bh : (ci + 1) * bh]
        q = chunk * chunk + q  # two fp32 roundings, as separate torch ops
    while q.shape[-1] > 1:
        q = q[:, 0::2] + q[:, 1::2]
    return q[:, 0]


def _run_checked(attn, res, lnw, eps, w, k, counter=None):
    counter = make_route_counter("cpu") if counter is None else counter
    before = [t.clone() for t in (attn, res, lnw, w)]
    taps: dict = {}
    ids, tw, xn, res_out = launch_ll_router(attn, res, lnw, eps, w, k, counter, taps=taps)
    assert sorted(taps) == sorted(LL_ROUTER_TAPS)
    assert taps["xn"] is xn and taps["residual_out"] is res_out
    s = residual_add(attn, res)
    # step 11, order-free parts bit for bit
    assert same_bits(res_out, to_bf16(s)), "residual_out != bf16(attn_out + residual)"
    sumsq = taps["sumsq"]
    assert sumsq.shape == (attn.shape[0],) and sumsq.dtype == torch.float32
    assert same_bits(xn, rmsnorm_apply(s, sumsq, lnw, eps)), "xn differs from step 11 fed the kernel's sumsq"
    # the sum of squares: within the certified bound, and the documented order
    ok = check_accumulator(sumsq, sum_squares(s), name="sumsq")
    assert bool(ok.all()), f"sumsq outside the certified bound at {torch.nonzero(~ok).flatten().tolist()}"
    assert same_bits(sumsq, _replay_sumsq(s, w.shape[0], k)), "sum of squares: documented order not followed"
    # steps 1-4 on the kernel's own xn, as the router GEMV kernel (same order, same top-k)
    check_route(xn, w, k, ids, tw, taps)
    assert same_bits(taps["router_acc"], replay_gemv_order(xn, w, k)), "router sums: documented order not followed"
    for t0, t1 in zip(before, (attn, res, lnw, w), strict=True):
        assert same_bits(t0, t1), "an input was modified"
    plain = launch_ll_router(attn, res, lnw, eps, w, k, counter)  # production (untapped) build
    for a, b in zip(plain, (ids, tw, xn, res_out), strict=True):
        assert same_bits(a, b), "tapped and untapped outputs differ"
    return ids, tw, taps


@pytest.mark.parametrize(
    ("e", "k", "m", "h"),
    [(16, 4, 2, 96), (8, 8, 1, 64), (7, 6, 3, 48), (160, 8, 2, 64), (256, 8, 1, 128)],
)  # fmt: skip
def test_matches_golden_stages(e: int, k: int, m: int, h: int) -> None:
    attn, res, lnw, w = _inputs(m, e, h, seed=e * 7 + m)
    _run_checked(attn, res, lnw, eps_fp32(1e-6), w, k)


def test_hidden_over_one_chunk_with_a_masked_tail() -> None:
    """H = 1100 > BLOCK_H = 1024: two chunks for both passes, the second masked (padding adds +0)."""
    assert ll_router_config(8, 1100, 6)["BLOCK_H"] == 1024
    attn, res, lnw, w = _inputs(2, 8, 1100, seed=3)
    _run_checked(attn, res, lnw, eps_fp32(1e-5), w, 6)


def test_zero_row_normalises_to_zero_and_ties_to_the_lowest_experts() -> None:
    """attn_out = -residual: s = 0, sumsq = +0, inv = rsqrt(eps) finite, xn = 0, every logit +0; the top-k of
    equal logits takes experts 0..k-1, each score 1/(1 + e^0) = 0.5, weights 0.5 / 2.0 = 0.25 (k = 4)."""
    attn, res, lnw, w = _inputs(1, 16, 64, seed=9)
    res = -attn
    ids, tw, taps = _run_checked(attn, res, lnw, eps_fp32(1e-6), w, 4)
    assert taps["sumsq"].tolist() == [0.0]
    assert not bool(taps["xn"].float().abs().any())
    assert ids.tolist() == [[0, 1, 2, 3]]
    assert tw.tolist() == [[0.25, 0.25, 0.25, 0.25]]


def test_eps_is_added_before_the_rsqrt() -> None:
    """A huge eps swallows the mean square: the fp32 ulp of 2^40 is 2^17 > 2 * max(sumsq / H), so
    RN(mean + 2^40) = 2^40 and inv = rsqrt.approx.ftz(2^40) = 2^-20 (the golden emulation's value for an even
    power of two), so xn = bf16(RN(s * 2^-20) * w_ln) = bf16(s * w_ln * 2^-20) exactly (power-of-two scaling,
    no underflow at these magnitudes)."""
    attn, res, lnw, w = _inputs(2, 8, 64, seed=4)
    _, _, taps = _run_checked(attn, res, lnw, 2.0**40, w, 2)
    s = residual_add(attn, res)
    assert bool((taps["sumsq"] / 64 < 2.0**16).all())
    assert same_bits(taps["xn"], to_bf16(s * lnw.float() * 2.0**-20))


def test_counter_is_shared_with_route() -> None:
    counter = make_route_counter("cpu")
    attn, res, lnw, w = _inputs(3, 12, 32, seed=6)
    ids, _, taps = _run_checked(attn, res, lnw, eps_fp32(1e-6), w, 3, counter)
    # two launches (tapped + untapped) of NP programs per token: every used entry advanced by 2 * 2^16
    np_ = -(-12 // ll_router_config(12, 32, 3)["EB"])
    assert np_ > 1
    assert counter[:3].tolist() == [2 * COUNTER_ALIGN] * 3 and counter[3:].tolist() == [0] * (counter.numel() - 3)
    ids2, _ = route(taps["xn"], w, 3, counter)
    assert torch.equal(ids2, ids)
    assert counter[:3].tolist() == [3 * COUNTER_ALIGN] * 3


def test_declared_orders_replay_the_taps() -> None:
    """The golden model's replay of ``ll_router_orders`` reproduces the taps bit for bit. With attn_out = 0,
    s = residual (bf16 values), so s_h^2 is exact in fp32 and the interpreter's multiply-then-add equals the
    GPU's fma; the router sums' bf16 x bf16 products are always exact."""
    attn, res, lnw, w = _inputs(2, 16, 1100, seed=8)
    attn = torch.zeros_like(attn)
    _, _, taps = _run_checked(attn, res, lnw, eps_fp32(1e-6), w, 4)
    orders = ll_router_orders(1100)
    assert orders["sumsq"]["axes"] == [["step", 2], ["lane", 1024]]
    s = res.float()
    assert same_bits(taps["sumsq"], replay_dot(orders["sumsq"], s, s))
    assert same_bits(taps["router_acc"], replay_dot(orders["router"], w.float(), taps["xn"].float()[:, None, :]))
