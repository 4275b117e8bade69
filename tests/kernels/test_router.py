"""Router kernels under the Triton interpreter (rule steps 1-4): ids / weights exactly equal the golden model
fed the kernel's own router_acc taps, router_acc within the certified bound (and, on the GEMV path, equal to
a replay of the documented summation order), special logits (ties, NaN, +-inf, -0), all-underflow rows,
counter reuse and wraparound, tapped == untapped, input errors."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.router import COUNTER_ALIGN, ROUTE_GEMV_MAX_TOKENS
from flint_moe.ops import make_route_counter, route

from ._router_check import check_route, replay_gemv_order, same_bits

BACKEND = "interpreter"


def _inputs(m: int, e: int, h: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g).bfloat16()
    w = (torch.randn(e, h, generator=g) * 0.5).bfloat16()
    return x, w


def _route_checked(x, w, k, counter=None):
    counter = make_route_counter("cpu") if counter is None else counter
    x0, w0 = x.clone(), w.clone()
    taps: dict = {}
    ids, tw = route(x, w, k, counter, taps=taps)
    check_route(x, w, k, ids, tw, taps)
    assert torch.equal(x.view(torch.int16), x0.view(torch.int16)), "x modified"
    assert torch.equal(w.view(torch.int16), w0.view(torch.int16)), "router_weight modified"
    ids2, tw2 = route(x, w, k, counter)  # production (untapped) build
    assert torch.equal(ids2, ids) and same_bits(tw2, tw), "tapped and untapped outputs differ"
    if x.shape[0] <= ROUTE_GEMV_MAX_TOKENS:
        assert same_bits(taps["router_acc"], replay_gemv_order(x, w, k)), "documented order not followed"
    return ids, tw, taps


@pytest.mark.parametrize(
    ("e", "k", "m", "h"),
    [(8, 1, 2, 40), (8, 8, 1, 64), (7, 6, 3, 24), (160, 6, 2, 48), (384, 8, 1, 40), (512, 10, 1, 72),
     (512, 16, 1, 16)],
)  # fmt: skip
def test_gemv_path_matches_golden(e: int, k: int, m: int, h: int) -> None:
    x, w = _inputs(m, e, h, seed=e * 31 + k)
    _route_checked(x, w, k)


def test_gemv_multi_chunk_hidden() -> None:
    """H > BLOCK_H (1024) and not a power of two: several chunks, a masked tail."""
    x, w = _inputs(2, 8, 1100, seed=5)
    _route_checked(x, w, 6)


@pytest.mark.parametrize(("e", "k"), [(160, 6), (7, 6), (512, 10)])
def test_gemm_path_matches_golden(e: int, k: int) -> None:
    m = ROUTE_GEMV_MAX_TOKENS + 4
    x, w = _inputs(m, e, 32, seed=e + k)
    _route_checked(x, w, k)


def _special_weights(e: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows giving logits: +NaN, -NaN (other payload), +inf, -inf, +0, -0, and ties at the k-th place."""
    g = torch.Generator().manual_seed(11)
    x = (torch.rand(3, h, generator=g) + 0.5).bfloat16()  # positive
    x[:, 0] = 2.0**-75
    w = (torch.randn(e, h, generator=g) * 0.1).bfloat16()
    w[1] = float("nan")
    w[4] = torch.tensor(-1, dtype=torch.int16).view(torch.bfloat16)  # 0xFFFF: -NaN, another payload
    w[2], w[5] = 0.0, 0.0
    w[2, 0] = float("inf")  # +inf * 2^-75 = +inf; 0 elsewhere
    w[5, 0] = float("-inf")
    w[6] = 0.0  # +0 logit
    w[7] = 0.0
    w[7, 0] = -(2.0**-74)  # product -2^-149: sum -2^-149, bf16 -> -0
    for e_tie in (9, 12, 13):
        w[e_tie] = w[8]  # equal logits: ties broken by the lower index
    return x, w


@pytest.mark.parametrize("k", [1, 3, 6, 8, 10])
def test_special_logits(k: int) -> None:
    x, w = _special_weights(16, 24)
    ids, tw, taps = _route_checked(x, w, k)
    lg = taps["logits"].float()
    assert torch.isnan(lg[:, 1]).all() and torch.isnan(lg[:, 4]).all()
    assert (lg[:, 2] == float("inf")).all() and (lg[:, 5] == float("-inf")).all()
    bits = taps["logits"].view(torch.int16)
    assert (bits[:, 6] == 0).all() and (bits[:, 7] == torch.tensor(-32768, dtype=torch.int16)).all()
    # NaNs first (lower index first), then +inf
    assert ids[:, :3].tolist() == [[1, 4, 2]] * 3 if k >= 3 else True


def test_ties_at_kth_place() -> None:
    e, h = 12, 16
    x = torch.ones(2, h).bfloat16()
    w = torch.zeros(e, h).bfloat16()
    w[:, 0] = torch.tensor([1, 5, 3, 5, 3, 3, 2, 3, 5, 0, 3, 4], dtype=torch.float32).bfloat16()
    ids, tw, _ = _route_checked(x, w, 6)
    assert ids[0].tolist() == [1, 3, 8, 11, 2, 4]  # 5,5,5,4, then the two lowest-index 3s


def test_all_underflow_row_gives_zero_weights() -> None:
    x = torch.ones(2, 32).bfloat16()
    w = torch.full((10, 32), -20.0).bfloat16()  # logits -640: expf(640) = inf, s = 0
    w[3] = -25.0
    ids, tw, _ = _route_checked(x, w, 4)
    assert (tw == 0).all() and not torch.isnan(tw).any()
    assert tw.view(torch.int32).eq(0).all()  # +0


@pytest.mark.parametrize("start", [0x7FFF0000, -COUNTER_ALIGN, -(2**31)])
def test_counter_reuse_and_wraparound(start: int) -> None:
    x, w = _inputs(3, 7, 16, seed=2)
    counter = make_route_counter("cpu")
    counter[:] = start
    first = None
    for _ in range(4):
        ids, tw = route(x, w, 3, counter)
        if first is None:
            first = (ids, tw)
        assert torch.equal(ids, first[0]) and same_bits(tw, first[1])
    expect = (start + 4 * COUNTER_ALIGN + 2**31) % 2**32 - 2**31
    assert counter[:3].tolist() == [expect] * 3 and counter[3:].tolist() == [start] * 5


def test_counter_shared_across_expert_counts() -> None:
    counter = make_route_counter("cpu")
    for e, k in ((7, 2), (160, 6), (8, 8), (7, 2)):
        x, w = _inputs(2, e, 16, seed=e)
        _route_checked(x, w, k, counter)
    assert (counter[:2] % COUNTER_ALIGN == 0).all()


def test_empty_batch() -> None:
    ids, tw = route(torch.zeros(0, 16).bfloat16(), torch.zeros(8, 16).bfloat16(), 2, make_route_counter())
    assert ids.shape == (0, 2) and tw.shape == (0, 2)


def test_bad_inputs() -> None:
    x, w = _inputs(2, 8, 16, seed=1)
    c = make_route_counter("cpu")
    with pytest.raises(TypeError, match=r"^x: dtype must be torch.bfloat16"):
        route(x.float(), w, 2, c)
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor"):
        route(x.tolist(), w, 2, c)
    with pytest.raises(ValueError, match=r"^x: expected 2 dimensions"):
        route(x[0], w, 2, c)
    with pytest.raises(ValueError, match=r"^x: must be contiguous"):
        route(torch.zeros(16, 2).bfloat16().t(), w, 2, c)
    with pytest.raises(TypeError, match=r"^router_weight: dtype"):
        route(x, w.float(), 2, c)
    with pytest.raises(ValueError, match=r"^router_weight: dimension 1 must be 16"):
        route(x, w[:, :8].contiguous(), 2, c)
    with pytest.raises(ValueError, match=r"^router_weight: must be on cpu"):
        route(x, w.to("meta"), 2, c)
    with pytest.raises(ValueError, match=r"^top_k: must satisfy"):
        route(x, w, 0, c)
    with pytest.raises(ValueError, match=r"^top_k: must satisfy"):
        route(x, w, 9, c)
    with pytest.raises(ValueError, match=r"^top_k: must satisfy"):
        route(x, torch.zeros(40, 16).bfloat16(), 17, c)
    with pytest.raises(TypeError, match=r"^top_k: expected an int"):
        route(x, w, True, c)
    with pytest.raises(TypeError, match=r"^counter: dtype must be torch.int32"):
        route(x, w, 2, c.long())
    with pytest.raises(ValueError, match=r"^counter: needs >= 2 entries"):
        route(x, w, 2, c[:1])
    with pytest.raises(TypeError, match=r"^taps: expected a dict"):
        route(x, w, 2, c, taps=[])
