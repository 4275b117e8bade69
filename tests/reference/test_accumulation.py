"""Summation models, certified bounds and the rule's acceptance criterion (flint_moe.reference.accumulation):
hand-derived bounds, adversarial and random summation orders inside them, and ``check_accumulator`` /
``accumulator_report`` on boundary values."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

from flint_moe.reference import exact as X
from flint_moe.reference.exact import (
    FP32_OVERFLOW,
    FP32_RN,
    FP32_TRUNCATE,
    Accumulation,
    accumulator_report,
    block_model,
    check_accumulator,
    dot_accumulate,
    gamma,
    sum_squares_accumulate,
)
from tests.reference._oracle import random_bf16, rn32, rz32, tbf

U = 2.0**-24


def _acc(exact, bound, n=4, model=FP32_RN, abs_sum=None):
    e = torch.tensor(exact, dtype=torch.float64)
    b = torch.tensor(bound, dtype=torch.float64)
    s = e.abs() if abs_sum is None else torch.tensor(abs_sum, dtype=torch.float64)
    return Accumulation(e, b, s, torch.zeros(e.shape, dtype=torch.bool), n, model)


# ---------------------------------------------------------------------------------------------------------
# the bound
# ---------------------------------------------------------------------------------------------------------


def test_bound_formula_hand_derived():
    # Terms 1*1 and 1*2^-8, n = 2: S = 1 + 2^-8. RN model: rel = gamma_2(2^-24) = 2u/(1-2u).
    # bound = (gamma_2(2^-24) + gamma_2(2^-53)) * S_up + 0 (no eta: products >= 2^-126), S_up ~ S.
    acc = dot_accumulate(tbf([[1.0, 1.0]]), tbf([[1.0, 2.0**-8]]))
    s = 1.0 + 2.0**-8
    assert float(acc.exact[0, 0]) == s
    assert acc.rel == gamma(2, 2.0**-24)
    lo = (2 * U / (1 - 2 * U) + 2 * 2.0**-53) * s
    b = float(acc.bound[0, 0])
    assert lo <= b <= lo * (1 + 2.0**-40)
    assert not bool(acc.eta_possible[0, 0])
    # truncation: u = 2^-23, depth n = 2
    t = acc.with_model(FP32_TRUNCATE)
    assert t.rel == gamma(2, 2.0**-23)
    # block model B = 16 over n = 32: depth = 16 + 32/16 = 18, eta count = 32 + 2
    m = block_model(16)
    assert m.depth(32) == 18 and m.eta_count(32) == 34
    with pytest.raises(ValueError, match="not a multiple of block 16"):
        acc.with_model(m)


def test_gamma_infinite_when_du_reaches_one():
    assert gamma(2**24, 2.0**-24) == math.inf
    assert gamma(10, 2.0**-24) > 10 * 2.0**-24


def _seq(terms, rnd):
    acc = 0.0
    for t in terms:
        acc = rnd(Fraction(acc) + Fraction(t))
    return acc


def test_adversarial_orders_stay_within_bound():
    # Terms 1, then n-1 copies of 2^-24: sequential RN keeps 1 (each 1 + 2^-24 is a tie to even 1),
    # so the error is (n-1) 2^-24 = close to the worst case; the bound n*u*S certifies it.
    n = 64
    a = [1.0] + [2.0**-12] * (n - 1)
    b = [1.0] + [2.0**-12] * (n - 1)
    acc = dot_accumulate(tbf([a]), tbf([b]))
    terms = [x * y for x, y in zip(a, b, strict=False)]
    forward = _seq(terms, rn32)
    assert forward == 1.0
    backward = _seq(terms[::-1], rn32)
    assert backward == rn32(Fraction(1) + (n - 1) * Fraction(2) ** -24)
    trunc = _seq(terms, rz32)
    ok = check_accumulator(torch.tensor([[forward]], dtype=torch.float32), acc)
    assert bool(ok[0, 0])
    assert bool(check_accumulator(torch.tensor([[backward]], dtype=torch.float32), acc)[0, 0])
    assert bool(
        check_accumulator(torch.tensor([[trunc]], dtype=torch.float32), acc.with_model(FP32_TRUNCATE))[0, 0]
    )
    # a value 2 * n * u away is outside the RN bound
    far = rn32(Fraction(1) - 2 * n * Fraction(2) ** -24)
    assert not bool(check_accumulator(torch.tensor([[far]], dtype=torch.float32), acc)[0, 0])


def test_random_orders_and_block_regrouping_within_bound():
    rng = random.Random(7)
    n, blk = 64, 16
    for _ in range(20):
        x = random_bf16(rng, n, -8, 8)
        codes = [rng.choice((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)) * rng.choice((-1, 1)) for _ in range(n)]
        scales = [rng.choice((2.0**-9, 0.875, 1.0, 448.0, 3.0)) for _ in range(n // blk)]
        w = [codes[i] * scales[i // blk] for i in range(n)]
        acc = dot_accumulate(tbf([x]), tbf([w]))
        terms = [Fraction(a) * Fraction(b) for a, b in zip(x, w, strict=False)]
        order = list(range(n))
        rng.shuffle(order)
        shuffled = _seq([terms[i] for i in order], rn32)
        # block regrouping: sum code*x per block (RN), multiply by the scale (RN), add partials (RN)
        partials = []
        for blk_i in range(n // blk):
            p = _seq(
                [Fraction(codes[i]) * Fraction(x[i]) for i in range(blk_i * blk, (blk_i + 1) * blk)], rn32
            )
            partials.append(rn32(Fraction(p) * Fraction(scales[blk_i])))
        regrouped = _seq(partials, rn32)
        assert bool(check_accumulator(torch.tensor([[shuffled]], dtype=torch.float32), acc)[0, 0])
        assert bool(
            check_accumulator(
                torch.tensor([[regrouped]], dtype=torch.float32), acc.with_model(block_model(16))
            )[0, 0]
        )


# ---------------------------------------------------------------------------------------------------------
# the criterion
# ---------------------------------------------------------------------------------------------------------


def test_just_inside_passes_just_outside_fails():
    # exact 1, bound 2^-20: 1 + 2^-20 is exactly at the bound (passes); the next fp32 up, 1 + 2^-20 + 2^-23,
    # is 2^-23 beyond (fails); below: 1 - 2^-20 passes, 1 - 2^-20 - 2^-24 fails.
    acc = _acc([1.0] * 4, [2.0**-20] * 4)
    k = torch.tensor([1 + 2.0**-20, 1 + 2.0**-20 + 2.0**-23, 1 - 2.0**-20, 1 - 2.0**-20 - 2.0**-24])
    assert check_accumulator(k, acc).tolist() == [True, False, True, False]


def test_difference_is_compared_exactly_not_after_float64_rounding():
    # exact = 1 + 2^-52 (float64), bound = 1 + 2^-52. kernel -2^-60: |k - e| = 1 + 2^-52 + 2^-60 > bound,
    # but RN64(k - e) = -(1 + 2^-52) == -bound, so a naive float64 test would pass it. kernel +2^-60:
    # |k - e| = 1 + 2^-52 - 2^-60 < bound: passes.
    e = 1.0 + 2.0**-52
    acc = _acc([e, e], [e, e])
    k = torch.tensor([-(2.0**-60), 2.0**-60], dtype=torch.float32)
    assert check_accumulator(k, acc).tolist() == [False, True]


def test_zero_sum_accepts_both_zero_signs_only():
    # all products zero: S = 0, bound = 0 exactly (no eta term since S = 0)
    acc = dot_accumulate(tbf([[0.0, -0.0, 1.0]]).expand(4, 3), tbf([[5.0, 3.0, 0.0]]))
    assert float(acc.bound.max()) == 0.0
    k = torch.tensor([[0.0], [-0.0], [2.0**-149], [-(2.0**-149)]])
    assert check_accumulator(k, acc).reshape(-1).tolist() == [True, True, False, False]
    # exact cancellation to zero with S > 0: +0 and -0 both accepted
    acc2 = dot_accumulate(tbf([[1.0, 1.0]]).expand(2, 2), tbf([[3.0, -3.0]]))
    assert float(acc2.exact[0, 0]) == 0.0
    assert check_accumulator(torch.tensor([[0.0], [-0.0]]), acc2).reshape(-1).tolist() == [True, True]


def test_inf_near_overflow():
    # 2^127 + 2^127 = 2^128 >= FP32_OVERFLOW: RN fp32 gives +inf, accepted; FP32 max is 2^104 away from
    # 2^128 and gamma_2 * 2^128 ~ 2^105 >= 2^104: accepted too; -inf: accepted (overflow possible: any
    # non-finite); 1.0 rejected.
    acc = dot_accumulate(tbf([[2.0**127, 2.0**127]]).expand(4, 2), tbf([[1.0, 1.0]]))
    assert bool(acc.overflow_possible.all())
    k = torch.tensor([[math.inf], [3.4028234663852886e38], [-math.inf], [1.0]])
    assert check_accumulator(k, acc).reshape(-1).tolist() == [True, True, True, False]
    # far from overflow (exact 2^120): inf rejected
    acc2 = dot_accumulate(tbf([[2.0**119, 2.0**119]]), tbf([[1.0, 1.0]]))
    assert not bool(acc2.overflow_possible.any())
    assert not bool(check_accumulator(torch.tensor([[math.inf]]), acc2)[0, 0])
    assert bool(check_accumulator(torch.tensor([[2.0**120]]), acc2)[0, 0])
    # intermediate overflow: 2^127.x + 2^127.x - 2^127.x: exact finite, but a sequential fp32 sum is inf
    v = 1.9921875 * 2.0**127
    acc3 = dot_accumulate(tbf([[v, v, -v]]), tbf([[1.0, 1.0, 1.0]]))
    assert bool(check_accumulator(torch.tensor([[math.inf]]), acc3)[0, 0])
    assert bool(check_accumulator(torch.tensor([[math.nan]]), acc3)[0, 0])
    assert FP32_OVERFLOW == 2.0**128 - 2.0**103


def test_nan_positions_must_match():
    x = tbf([[1.0, math.nan], [1.0, 2.0]])
    w = tbf([[1.0, 1.0], [3.0, 1.0]])
    acc = dot_accumulate(x, w)  # row 0 NaN, row 1 = [3, 5]
    good = torch.tensor([[math.nan, math.nan], [3.0, 5.0]])
    assert bool(check_accumulator(good, acc).all())
    bad = torch.tensor([[1.0, math.nan], [3.0, math.nan]])
    assert check_accumulator(bad, acc).tolist() == [[False, True], [True, False]]
    rep = accumulator_report(bad, acc)
    assert rep.violations == 2 and rep.nan_mismatch == 2
    assert rep.worst_excess_ulps == math.inf


def test_inf_exact_requires_same_inf():
    acc = dot_accumulate(tbf([[math.inf, 1.0]]), tbf([[1.0, 1.0], [-1.0, 1.0]]))
    assert acc.exact.tolist() == [[math.inf, -math.inf]]
    k = torch.tensor([[math.inf, math.inf]])
    assert check_accumulator(k, acc).tolist() == [[True, False]]


def test_report_excess_in_ulps():
    # exact 1, bound 0: kernel 1 + 2^-22 is 2 ulps (ulp(1) = 2^-23) beyond
    acc = _acc([1.0, 1.0], [0.0, 0.0])
    rep = accumulator_report(torch.tensor([1.0 + 2.0**-22, 1.0]), acc)
    assert rep.violations == 1
    assert rep.worst_excess_ulps == 2.0
    assert rep.worst_index == (0,)
    assert rep.excess_ulps.tolist() == [2.0, 0.0]


def test_bad_inputs_name_the_tensor():
    with pytest.raises(TypeError, match="a: dtype must be"):
        dot_accumulate(torch.zeros(2, 4, dtype=torch.float16), torch.zeros(3, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="b: dimension 1 must be 4"):
        dot_accumulate(torch.zeros(2, 4, dtype=torch.bfloat16), torch.zeros(3, 5, dtype=torch.bfloat16))
    acc = _acc([1.0], [0.0])
    with pytest.raises(ValueError, match="kernel_value: dimension 0 must be 1"):
        check_accumulator(torch.zeros(2), acc)
    with pytest.raises(TypeError, match="kernel_value: dtype must be torch.float32"):
        check_accumulator(torch.zeros(1, dtype=torch.float64), acc)
    with pytest.raises(TypeError, match="s: dtype"):
        sum_squares_accumulate(torch.zeros(2, 3, dtype=torch.bfloat16))


# ---------------------------------------------------------------------------------------------------------
# block model: unscaled block partials
# ---------------------------------------------------------------------------------------------------------


def test_block_model_inner_partials_set_overflow_possible():
    from flint_moe.reference import experts as EX
    from flint_moe.reference.formats import pack_e2m1

    h = 32
    x = torch.full((2, h), 2.0**127).to(torch.bfloat16)
    x[1] = 1.0
    codes = pack_e2m1(torch.full((3, h), 7, dtype=torch.uint8))  # E2M1 value 6
    scale = torch.tensor([[0x01, 0x01], [0x00, 0x01], [0x7E, 0x7E]], dtype=torch.uint8)  # 2^-9; 0; 448
    acc = EX.gate_up_accumulate(x, codes, scale)
    assert acc.inner_abs_sum is not None
    # S_inner = sum |x| * 6 (an upper bound, inflated by (1 + 2 gamma) (1 + 2^-45))
    inner = float(acc.inner_abs_sum[1, 0])
    assert 6.0 * h <= inner <= 6.0 * h * (1 + 2**-40)
    plain = acc  # FP32_RN: the products are the scaled terms, exact sum 1.5 * 2^125 and 0.75 * 2^124 etc.
    blk = acc.with_model(block_model(16))
    assert blk.inner_abs_sum is acc.inner_abs_sum
    # row 0 (x = 2^127): the plain model cannot overflow for scales 2^-9 (S = 32 * 6 * 2^118), the block
    # model's inner partial 16 * 6 * 2^127 does
    assert not bool(plain.overflow_possible[0, 0]) and bool(blk.overflow_possible[0, 0])
    # zero scale in block 0: the block kernel computes inf * 0 = NaN; exact is 6 * 2^-9 * 2^127 * 16 finite
    assert torch.isfinite(blk.exact[0, 1])
    k = torch.tensor([[math.inf, math.nan, math.inf], [0.0, 0.0, 0.0]])
    k[1] = X.round_exact("gate_up", blk)[1]
    ok = check_accumulator(k, blk)
    assert ok[0].tolist() == [True, True, True] and ok[1].tolist() == [True, True, True]
    assert not bool(blk.overflow_possible[1].any())
    # slicing keeps the inner sums; a block model without them (BF16 path) uses abs_sum
    assert blk[:, :2].inner_abs_sum.shape == (2, 2)
    bf = dot_accumulate(tbf([[2.0**120] * 16]), tbf([[1.0] * 16])).with_model(block_model(16))
    assert bf.inner_abs_sum is None and not bool(bf.overflow_possible[0, 0])
