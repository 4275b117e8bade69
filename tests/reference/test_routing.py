"""Routing (rule steps 1-4): logits cast, totalOrder top-k, sigmoid scores, renormalisation."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

from flint_moe.reference.routing import (
    RENORM_EPS,
    logits_from_accumulator,
    renormalize,
    router_accumulate,
    routing_scores,
    topk_total_order,
    total_order_key,
)
from tests.reference._oracle import (
    bf16,
    f32_bits,
    install_stub_mufu,
    mufu_tables_present,
    rn32,
    scalar,
    stub_expf,
    t32,
    tbf,
)

INF, NAN = math.inf, math.nan


# ---------------------------------------------------------------------------------------------------------
# step 1
# ---------------------------------------------------------------------------------------------------------


def test_logits_cast_rounding_points():
    # 1 + 2^-8 is the midpoint of 1 and 1 + 2^-7 -> even: 1.0
    # 1 + 3*2^-8 is the midpoint of 1 + 2^-7 (odd) and 1 + 2^-6 (even) -> 1 + 2^-6
    # 1 + 2^-8 + 2^-20 is above the midpoint -> 1 + 2^-7
    # 2^-130 + 2^-140: bf16 subnormal grid is 2^-133, so 2^-130 (kept, not flushed)
    # 3.4e38 (> bf16 max 3.3895e38 + half ulp 2^119): rounds to +inf
    acc = t32([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-20, 2.0**-130 + 2.0**-140, 3.4e38, -0.0])
    out = logits_from_accumulator(acc).to(torch.float64).tolist()
    assert out == [1.0, 1 + 2.0**-6, 1 + 2.0**-7, 2.0**-130, INF, -0.0]
    assert math.copysign(1, out[-1]) == -1


def test_router_accumulate_shape_and_names():
    x = torch.zeros(3, 16, dtype=torch.bfloat16)
    acc = router_accumulate(x, torch.zeros(5, 16, dtype=torch.bfloat16))
    assert acc.shape == (3, 5) and acc.n == 16
    with pytest.raises(ValueError, match="router_weight: dimension 1 must be 16"):
        router_accumulate(x, torch.zeros(5, 15, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x: dtype must be torch.bfloat16"):
        router_accumulate(x.float(), torch.zeros(5, 16, dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------------------
# step 2
# ---------------------------------------------------------------------------------------------------------


def _bf16_all() -> torch.Tensor:
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def test_total_order_key_exhaustive():
    v = _bf16_all()
    key = total_order_key(v)
    f = v.to(torch.float64)
    nan = torch.isnan(f)
    assert bool((key[nan] == 32641).all())  # every NaN equal, above +inf
    assert int(key[~nan].max()) == 32640 and bool((key[~nan] < 32641).all())
    order = torch.argsort(key[~nan], stable=True)
    fs = f[~nan][order]
    ks = key[~nan][order]
    assert bool((fs[1:] >= fs[:-1]).all())  # monotone in value
    assert bool((ks[1:] > ks[:-1]).all())  # distinct patterns -> distinct keys (incl. -0 < +0)
    z = tbf([-0.0, 0.0])
    assert total_order_key(z).tolist() == [-1, 0]


def _ref_topk(row: list[float], k: int) -> list[int]:
    """Plain reference: rank NaN above all, -0 below +0, ties by lower index."""

    def rank(i):
        v = row[i]
        if math.isnan(v):
            return (2, 0.0, 0)
        return (1, v, 1 if math.copysign(1, v) > 0 else 0)

    return sorted(range(len(row)), key=lambda i: (tuple(-c for c in rank(i)), i))[:k]


def test_topk_hand_cases():
    # ties straddling the k-th place: values [1, 3, 3, 2, 3], k=2 -> the two lowest-index 3s: [1, 2]
    assert topk_total_order(tbf([[1.0, 3.0, 3.0, 2.0, 3.0]]), 2).tolist() == [[1, 2]]
    # -0 < +0: [-0, +0] top-1 is index 1; [+0, -0] top-1 is index 0
    assert topk_total_order(tbf([[-0.0, 0.0], [0.0, -0.0]]), 1).tolist() == [[1], [0]]
    # NaN above +inf, NaNs equal (lower index first), -inf last
    row = [INF, NAN, -INF, 5.0, -NAN, 0.0]
    assert topk_total_order(tbf([row]), 6).tolist() == [[1, 4, 0, 3, 5, 2]]
    # NaN with payload / negative sign bit via raw bits (0xFFC1, 0x7F81) equal to each other
    raw = torch.tensor([[0x7F80, -63, 0x7F81, 0x0000]], dtype=torch.int16)  # +inf, 0xFFC1, 0x7F81, +0
    assert topk_total_order(raw.view(torch.bfloat16), 3).tolist() == [[1, 2, 0]]
    assert topk_total_order(tbf([[0.0] * 7]), 7).tolist() == [list(range(7))]


@pytest.mark.parametrize("e,k", [(160, 6), (384, 10), (512, 10), (7, 7), (384, 1)])
def test_topk_against_plain_reference(e, k):
    rng = random.Random(e * 31 + k)
    pool = [1.0, 1.5, -0.0, 0.0, 2.0, -2.0, INF, -INF, NAN, 0.25]
    rows = [[rng.choice(pool) for _ in range(e)] for _ in range(6)]
    rows.append([rng.choice([1.0, 1.0078125]) for _ in range(e)])  # heavy ties
    ids = topk_total_order(tbf(rows), k)
    assert ids.dtype == torch.int32 and ids.shape == (len(rows), k)
    for r, row in enumerate(rows):
        assert ids[r].tolist() == _ref_topk(row, k)


def test_topk_bad_input():
    with pytest.raises(ValueError, match="k: must satisfy 1 <= k <= E = 3"):
        topk_total_order(tbf([[1.0, 2.0, 3.0]]), 4)
    with pytest.raises(TypeError, match="logits: dtype must be torch.bfloat16"):
        topk_total_order(torch.zeros(2, 3), 1)
    with pytest.raises(TypeError, match="k: expected an int"):
        topk_total_order(tbf([[1.0, 2.0, 3.0]]), 1.0)


# ---------------------------------------------------------------------------------------------------------
# step 3
# ---------------------------------------------------------------------------------------------------------


def test_scores_rounding_points(monkeypatch):
    # Stand-in expf returning chosen values, recording its input (which must be -l, a bf16 value).
    seen = []
    table = {0.0: 1.0, -1.0: 2.0**-24, -2.0: 3 * 2.0**-24, INF: INF, -INF: 0.0, 3.0: 7.0}

    def fake(x):
        assert x.dtype == torch.bfloat16
        seen.extend(x.to(torch.float64).reshape(-1).tolist())
        return torch.tensor(
            [table[v] if not math.isnan(v) else NAN for v in x.reshape(-1).tolist()], dtype=torch.float32
        ).reshape(x.shape)

    from flint_moe.reference import mufu

    monkeypatch.setattr(mufu, "expf_libdevice", fake)
    s = routing_scores(tbf([[0.0, 1.0, 2.0, -INF, INF, NAN, -3.0]])).tolist()[0]
    assert seen[:5] == [-0.0, -1.0, -2.0, INF, -INF] and math.copysign(1, seen[0]) == -1  # -(+0) = -0
    # l=0: e=1, d=2, s=0.5
    # l=1: e=2^-24, d=RN(1+2^-24)=1 (tie to even), s=1
    # l=2: e=3*2^-24, d=RN(1+3*2^-24)=1+2^-22 (tie between 1+2^-23 odd and 1+2^-22 even),
    #      s=RN(1/(1+2^-22)) = RN(1 - 2^-22 + 2^-44 - ...) = 1 - 2^-22 (spacing below 1 is 2^-24)
    # l=-inf: e=inf, d=inf, s=+0;  l=+inf: e=0, d=1, s=1;  NaN -> NaN
    # l=-3: e=7, d=8, s=0.125
    assert s[:5] == [0.5, 1.0, 1 - 2.0**-22, 0.0, 1.0]
    assert math.isnan(s[5]) and s[6] == 0.125


def test_scores_against_plain_loop(monkeypatch):
    install_stub_mufu(monkeypatch)
    vals = [v for v in _bf16_all().to(torch.float64).tolist() if not math.isnan(v)][::97]
    s = routing_scores(tbf([vals]))[0].tolist()
    for v, got in zip(vals, s, strict=False):
        e = scalar(stub_expf, -v)
        d = rn32(Fraction(1) + Fraction(e)) if math.isfinite(e) else e
        want = rn32(Fraction(1) / Fraction(d)) if math.isfinite(d) else 0.0
        assert f32_bits(got) == f32_bits(want), v


@pytest.mark.skipif(not mufu_tables_present(), reason="mufu tables are captured on the GPU")
def test_scores_with_real_expf():
    # l = +-inf and 0 do not depend on the approximation:
    # expf(-inf)=0 -> 1, expf(inf)=inf -> 0, expf(-0)=1 -> 0.5
    assert routing_scores(tbf([[INF, -INF, 0.0]])).tolist() == [[1.0, 0.0, 0.5]]


# ---------------------------------------------------------------------------------------------------------
# step 4
# ---------------------------------------------------------------------------------------------------------


def _ref_renorm(row: list[float]) -> list[float]:
    total = row[0]
    for v in row[1:]:
        total = rn32(Fraction(total) + Fraction(v))
    denom = rn32(Fraction(total) + Fraction(RENORM_EPS))
    return [bf16(rn32(Fraction(v) / Fraction(denom))) for v in row]


def test_renorm_eps_is_fp32_of_1e_20():
    assert f32_bits(RENORM_EPS) == 0x1E3CE508


def test_renormalize_hand_cases():
    # [0.5, 0.25, 0.25]: S = 1, RN(1 + 1e-20f) = 1, tw = [0.5, 0.25, 0.25]
    # all-underflow row [0, 0]: S = 0, denom = 1e-20f, tw = 0/1e-20f = 0 (not NaN)
    # [1, 2^-24, 2^-24]: sequential S = RN(RN(1 + 2^-24) + 2^-24) = RN(1 + 2^-24) = 1 (ties to even twice);
    #   tw = [1, bf16(2^-24), bf16(2^-24)] = [1, 2^-24, 2^-24]
    # [2^-100]*3: S = 3*2^-100 (exact), denom = RN(3*2^-100 + 1e-20f) = 1e-20f (3*2^-100 < half ulp of
    #   1e-20f = 2^-90), tw_j = bf16(RN(2^-100 / 1e-20f))
    sc = t32([[0.5, 0.25, 0.25], [0.0, 0.0, 0.0], [1.0, 2.0**-24, 2.0**-24], [2.0**-100] * 3])
    tw = renormalize(sc).tolist()
    assert tw[0] == [0.5, 0.25, 0.25]
    assert tw[1] == [0.0, 0.0, 0.0]
    assert tw[2] == [1.0, 2.0**-24, 2.0**-24]
    q = bf16(rn32(Fraction(2.0**-100) / Fraction(RENORM_EPS)))
    assert tw[3] == [q] * 3 and q == bf16(rn32(Fraction(2) ** -100 / Fraction(RENORM_EPS)))


def test_renormalize_sequential_order_matters():
    # [2^-24, 2^-24, 1]: sequential S = RN(2^-23 + 1) = 1 + 2^-23; the other order gave 1.
    # tw_2 = bf16(RN(1 / (1 + 2^-23))) = bf16(1 - 2^-23 rounded) = bf16(1 - 2^-24)... = 1.0 after bf16,
    # so check S through tw_0 = bf16(RN(2^-24 / (1+2^-23))) = bf16(2^-24 (1 - 2^-23)) -> compare to loop.
    row = [2.0**-24, 2.0**-24, 1.0]
    assert renormalize(t32([row])).tolist()[0] == _ref_renorm(row)


def test_renormalize_against_plain_loop():
    rng = random.Random(3)
    rows = []
    for k in (1, 6, 10):
        for _ in range(20):
            rows.append(
                [
                    float(torch.tensor(rng.random() ** rng.choice((1, 8, 40)), dtype=torch.float32))
                    for _ in range(k)
                ]
            )
    for row in rows:
        assert renormalize(t32([row])).tolist()[0] == _ref_renorm(row)


def test_renormalize_bad_input():
    with pytest.raises(TypeError, match="scores: dtype must be torch.float32"):
        renormalize(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="scores: expected 2 dimensions"):
        renormalize(torch.zeros(3))
