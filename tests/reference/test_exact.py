"""Exact accumulation (flint_moe.reference.exact, .exact_sum): exact values against Fractions, special values,
round_exact = RN32 of the exact sum, order-, batch- and chunking-independence, the filtered path."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

from flint_moe.reference import exact as X
from flint_moe.reference.exact import check_accumulator, dot_accumulate, sum_squares_accumulate
from tests.reference._oracle import exponent, random_bf16, rn32, tbf


def _fraction_dot(a: list[float], b: list[float]) -> Fraction:
    return sum((Fraction(x) * Fraction(y) for x, y in zip(a, b, strict=False)), Fraction(0))


# ---------------------------------------------------------------------------------------------------------
# exact values
# ---------------------------------------------------------------------------------------------------------


def test_fp64_value_matches_fractions_within_its_own_error():
    rng = random.Random(1)
    a = [random_bf16(rng, 48, -60, 60) for _ in range(3)]
    b = [random_bf16(rng, 48, -60, 60) for _ in range(5)]
    acc = dot_accumulate(tbf(a), tbf(b))
    for i in range(3):
        for j in range(5):
            q = _fraction_dot(a[i], b[j])
            err = abs(Fraction(float(acc.exact[i, j])) - q)
            assert err <= Fraction(float(acc.fp64_error[i, j]))
            s = sum(abs(Fraction(x) * Fraction(y)) for x, y in zip(a[i], b[j], strict=False))
            assert Fraction(float(acc.abs_sum[i, j])) >= s  # abs_sum is an upper bound on sum|t|


def test_cancellation_is_exact():
    # 2^100 * 1 + 1 * 1 + (-2^100) * 1: float64 left to right gives 0 (1 is lost), the exact sum is 1, and
    # the exact summation returns exactly 1 (a float64, so round-to-odd leaves it unchanged).
    acc = dot_accumulate(tbf([[2.0**100, 1.0, -(2.0**100)]]), tbf([[1.0, 1.0, 1.0]]))
    assert float(acc.exact[0, 0]) == 1.0
    assert float(acc.fp64_error[0, 0]) == 2.0**-52  # 2^-52 |exact|


def test_products_below_fp32_range_are_exact_in_fp64():
    # min bf16 subnormal 2^-133 squared = 2^-266: not representable in fp32, exact in fp64 (normal there).
    acc = dot_accumulate(tbf([[2.0**-133]]), tbf([[2.0**-133]]))
    assert float(acc.exact[0, 0]) == 2.0**-266
    assert bool(acc.eta_possible[0, 0])  # the kernel's product underflows: eta term present
    # eta term: n * eta0 * (1 + gamma_1) with n = 1, eta0 = 2^-150; bound >= 2^-150
    assert float(acc.bound[0, 0]) >= 2.0**-150
    # the kernel's fp32 product is RN(2^-266) = +0 and conforms; 2^-149 is 2^-149 - 2^-266 away: fails
    assert bool(check_accumulator(torch.tensor([[0.0]]), acc)[0, 0])
    assert not bool(check_accumulator(torch.tensor([[2.0**-149]]), acc)[0, 0])


def test_special_values_follow_ieee():
    inf, nan = math.inf, math.nan
    x = tbf([[1.0, 2.0], [inf, 1.0], [inf, 1.0], [nan, 0.0], [inf, 1.0], [0.0, 1.0]])
    w = tbf([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 1.0], [inf, 1.0]])
    # row r of x against row c of w; diagonal cases:
    acc = dot_accumulate(x, w)
    d = torch.diagonal(acc.exact)
    assert float(d[0]) == 3.0
    assert float(d[1]) == inf  # inf*1 + 1*1
    assert math.isnan(float(d[2]))  # inf*0 -> NaN
    assert math.isnan(float(d[3]))  # NaN*1
    assert float(d[4]) == -inf  # inf*-1 + 1
    assert math.isnan(float(d[5]))  # 0*inf
    # +inf term and -inf term -> NaN: x row 1 (inf, 1) . w (1, 1) is +inf; x (inf, -inf) . (1, 1) NaN
    acc2 = dot_accumulate(tbf([[inf, -inf]]), tbf([[1.0, 1.0]]))
    assert math.isnan(float(acc2.exact[0, 0]))


def test_chunked_rows_equal_unchunked(monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(3, 40).bfloat16()
    w = torch.randn(37, 40).bfloat16()
    whole = dot_accumulate(x, w)
    monkeypatch.setattr(X, "_CHUNK_ELEMENTS", 40 * 5)  # 5 rows per chunk, last chunk of 2
    parts = dot_accumulate(x, w)
    for f in ("exact", "bound", "abs_sum", "eta_possible"):
        assert torch.equal(getattr(whole, f), getattr(parts, f)), f


def test_sum_squares_exact_and_specials():
    s = torch.tensor([[3.0, 4.0, 2.0**-100], [1.0, math.nan, 0.0], [math.inf, 1.0, 0.0]], dtype=torch.float32)
    acc = sum_squares_accumulate(s)
    # 9 + 16 + 2^-200 is not a float64 (needs bits 2^4..2^-200): round to odd at 53 bits gives the odd
    # neighbour 25 + 2^-48 (ulp64 of 25 is 2^(4-52)); error 2^-48 - 2^-200 <= fp64_error = 2^-52 * |exact|.
    assert float(acc.exact[0]) == 25.0 + 2.0**-48
    assert abs(Fraction(25) + Fraction(2) ** -200 - Fraction(float(acc.exact[0]))) <= Fraction(
        float(acc.fp64_error[0])
    )
    assert bool(acc.eta_possible[0])  # (2^-100)^2 = 2^-200 < 2^-126 underflows in the kernel
    assert math.isnan(float(acc.exact[1]))
    assert float(acc.exact[2]) == math.inf
    # all squares >= 2^-126 -> no eta term
    acc2 = sum_squares_accumulate(torch.tensor([[2.0**-63, 1.0]], dtype=torch.float32))
    assert not bool(acc2.eta_possible[0])


# ---------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------


def test_inputs_not_modified():
    x = tbf([[1.0, math.inf]])
    w = tbf([[0.0, 2.0]])
    xc, wc = x.clone(), w.clone()
    dot_accumulate(x, w)
    assert torch.equal(x.view(torch.int16), xc.view(torch.int16))
    assert torch.equal(w.view(torch.int16), wc.view(torch.int16))


# ---------------------------------------------------------------------------------------------------------
# exact summation: bit-exact, order- and batch-independent, round_exact = RN32(exact sum)
# ---------------------------------------------------------------------------------------------------------


def _ro53(q: Fraction) -> float:
    """Round-to-odd of an exact rational to 53 significant bits (plain Python; float64 exponent range)."""
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    a = abs(q)
    quantum = Fraction(2) ** (exponent(a) - 52)
    n, rem = divmod(a, quantum)
    n = int(n) | (1 if rem else 0)
    return sign * float(n * quantum)


def _f32_bits_list(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.int32).reshape(-1).tolist()


def _f64_bits_list(t: torch.Tensor) -> list[int]:
    return t.contiguous().view(torch.int64).reshape(-1).tolist()


FMAX = 2.0**128 - 2.0**104  # largest finite binary32
F32_ADVERSARIAL = [
    # (a row, b row) of binary32 values; the expected results come from Fractions
    ([1.0, 2.0**-12, 2.0**-35], [1.0, 2.0**-12, 2.0**-35]),  # 1 + 2^-24 + 2^-70: just above a tie -> up
    ([-1.0, -(2.0**-12), -(2.0**-35)], [1.0, 2.0**-12, 2.0**-35]),  # the same, negative
    ([1.0, 2.0**-12], [1.0, 2.0**-12]),  # 1 + 2^-24: exact tie -> even (1.0)
    ([1.0, 2.0**-12, 2.0**-35], [1.0, 2.0**-12, -(2.0**-35)]),  # just below the tie -> 1.0
    ([1.0, 2.0**-23, 2.0**-12], [1.0, 1.0, 2.0**-12]),  # 1 + 2^-23 + 2^-24: tie -> even (1 + 2^-22)
    # huge cancellation: 2^254-scale terms cancel, leaving 1 + 2^-298 (RN32 1, RO53 1 + 2^-52)
    ([FMAX, 1.0, -FMAX, 2.0**-149], [FMAX, 1.0, FMAX, 2.0**-149]),
    # cancellation leaving only subnormal-range bits: 2^200 - 2^200 + 3 * 2^-150 (tie -> 2^-148)
    ([2.0**100, -(2.0**100), 3.0 * 2.0**-75], [2.0**100, 2.0**100, 2.0**-75]),
    # terms spanning 2^-298 .. 2^256: overflow in binary32
    ([2.0**-149, FMAX, 1.0], [2.0**-149, FMAX, 1.0]),
    # subnormal results: 2.5 * 2^-149 is a tie -> 2^-148; + 2^-298 -> 3 * 2^-149; 2^-150 alone -> +0
    ([2.0**-74, 2.0**-75], [2.0**-74, 2.0**-75]),
    ([2.0**-74, 2.0**-75, 2.0**-149], [2.0**-74, 2.0**-75, 2.0**-149]),
    ([2.0**-75, 2.0**-149], [2.0**-75, -(2.0**-149)]),
    ([2.0**-75], [2.0**-75]),
    ([2.0**-100, -(2.0**-100), 2.0**-149], [2.0**-40, 2.0**-40, 2.0**-149]),
    # the overflow threshold 2^128 - 2^103: a tie -> inf; 2^-298 below it -> largest finite; above -> inf
    ([2.0**127, 2.0**127 - 2.0**103], [1.0, 1.0]),
    ([2.0**127, 2.0**127 - 2.0**103, -(2.0**-149)], [1.0, 1.0, 2.0**-149]),
    ([2.0**127, 2.0**127 - 2.0**103, 2.0**-149], [1.0, 1.0, 2.0**-149]),
    ([-(2.0**127), -(2.0**127 - 2.0**103)], [1.0, 1.0]),
    # intermediate overflow of every binary32 order, finite exact sum
    ([FMAX, FMAX, -FMAX], [1.0, 1.0, 1.0]),
    # exact zero from cancellation: +0
    ([3.0, -3.0, 2.0**-149, -(2.0**-149)], [5.0, 5.0, 2.0**-149, 2.0**-149]),
]


@pytest.mark.parametrize("a_row,b_row", F32_ADVERSARIAL)
def test_round_exact_is_rn32_of_the_fraction_sum(a_row, b_row):
    a = torch.tensor([a_row], dtype=torch.float32)
    b = torch.tensor([b_row], dtype=torch.float32)
    assert [float(v) for v in a[0]] == a_row and [float(v) for v in b[0]] == b_row  # binary32 inputs
    q = _fraction_dot(a_row, b_row)
    acc = dot_accumulate(a, b)
    got = X.round_exact("router", acc)
    want = rn32(q)
    assert _f32_bits_list(got) == _f32_bits_list(torch.tensor([want], dtype=torch.float32)), (
        float(got),
        want,
    )
    assert float(acc.exact[0, 0]) == _ro53(q)
    assert abs(Fraction(float(acc.exact[0, 0])) - q) <= Fraction(float(acc.fp64_error[0, 0]))


def test_round_exact_random_wide_range_against_fractions():
    # binary32 x binary32 products spanning 2^-298 .. 2^250 with heavy cancellation; every result checked
    rng = random.Random(11)

    def f32v(lo, hi):
        m = rng.randrange(1 << 23, 1 << 24)
        return rng.choice((-1.0, 1.0)) * m * 2.0 ** (rng.randrange(lo, hi) - 23)

    rows_a, rows_b = [], []
    for r in range(12):
        lo, hi = [(-149, 127), (-40, 40), (-149, -100), (100, 127)][r % 4]
        a = [f32v(lo, hi) for _ in range(40)]
        b = [f32v(lo, hi) for _ in range(40)]
        if r % 3 == 0:  # cancel the largest terms exactly, leaving the small ones
            a += [-v for v in a[:10]]
            b += b[:10]
        else:
            a += [f32v(lo, hi) for _ in range(10)]
            b += [f32v(lo, hi) for _ in range(10)]
        rows_a.append(a)
        rows_b.append(b)
    ta = torch.tensor(rows_a, dtype=torch.float32)
    tb = torch.tensor(rows_b, dtype=torch.float32)
    rows_a, rows_b = ta.double().tolist(), tb.double().tolist()  # the binary32 values (subnormals rounded)
    acc = dot_accumulate(ta, tb)
    got = X.round_exact("router", acc)
    for i in range(12):
        for j in range(12):
            q = _fraction_dot(rows_a[i], rows_b[j])
            assert float(acc.exact[i, j]) == _ro53(q), (i, j)
            assert _f32_bits_list(got[i, j : j + 1]) == _f32_bits_list(torch.tensor([rn32(q)])), (i, j)


def test_fp64_to_fp32_cast_rounds_to_nearest_even_with_subnormals_and_overflow():
    # round_exact relies on torch's float64 -> float32 cast being one IEEE RN-even rounding
    cases = [
        (2.0**-150, 0.0),  # tie -> even (0)
        (2.0**-150 + 2.0**-200, 2.0**-149),
        (3 * 2.0**-150, 2.0**-148),  # tie -> even
        (5 * 2.0**-151, 2.0**-149),
        (-(2.0**-150), -0.0),
        (2.0**-126 - 2.0**-150, 2.0**-126),  # tie at the normal boundary -> even (2^-126)
        (2.0**128 - 2.0**103, math.inf),  # overflow threshold: tie -> inf
        (2.0**128 - 2.0**103 - 2.0**75, FMAX),
        (1.0 + 2.0**-24, 1.0),
        (1.0 + 3 * 2.0**-24, 1.0 + 2.0**-22),
    ]
    src = torch.tensor([c[0] for c in cases], dtype=torch.float64)
    want = torch.tensor([c[1] for c in cases], dtype=torch.float32)
    assert _f32_bits_list(src.to(torch.float32)) == _f32_bits_list(want)


def test_batch_invariance():
    # The reviewer's case: K = 4096, terms 1, 2^-24, 2^-53, 2^-53 at positions 1, 3993, 1776, 216 (exact sum
    # 1 + 2^-24 + 2^-52: above the binary32 tie, RN32 = 1 + 2^-23). Alone and inside a batch of 16 rows the
    # exact and round_exact bits must be identical.
    k = 4096
    row = torch.zeros(k, dtype=torch.float64)
    for pos, v in ((1, 1.0), (3993, 2.0**-12), (1776, 2.0**-26), (216, 2.0**-27)):
        row[pos] = v
    w_row = torch.zeros(k, dtype=torch.float64)
    for pos, v in ((1, 1.0), (3993, 2.0**-12), (1776, 2.0**-27), (216, 2.0**-26)):
        w_row[pos] = v
    g = torch.Generator().manual_seed(3)
    batch = (torch.randn(16, k, generator=g) * 4.0 ** torch.randint(-6, 6, (16, 1), generator=g)).to(
        torch.bfloat16
    )
    batch[5] = row.to(torch.bfloat16)
    w = (torch.randn(24, k, generator=g) * 0.05).to(torch.bfloat16)
    w[7] = w_row.to(torch.bfloat16)
    alone = dot_accumulate(batch[5:6], w)
    batched = dot_accumulate(batch, w)
    assert float(alone.exact[0, 7]) == _ro53(Fraction(1) + Fraction(2) ** -24 + Fraction(2) ** -52)
    assert float(X.round_exact("router", alone)[0, 7]) == 1.0 + 2.0**-23
    assert _f64_bits_list(alone.exact) == _f64_bits_list(batched.exact[5:6])
    assert _f32_bits_list(X.round_exact("r", alone)) == _f32_bits_list(X.round_exact("r", batched)[5:6])
    # the same for the NVFP4 path and the sum of squares
    from flint_moe.reference import experts as EX

    codes = torch.randint(0, 256, (40, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(0x01, 0x7F, (40, k // 16), dtype=torch.uint8, generator=g)
    one = EX.gate_up_accumulate(batch[5:6], codes, scales)
    many = EX.gate_up_accumulate(batch, codes, scales)
    assert _f64_bits_list(one.exact) == _f64_bits_list(many.exact[5:6])
    s = batch.float() * 1.7
    assert _f64_bits_list(sum_squares_accumulate(s[5:6]).exact) == _f64_bits_list(
        sum_squares_accumulate(s).exact[5:6]
    )


def test_order_and_chunking_independence(monkeypatch):
    g = torch.Generator().manual_seed(5)
    k = 96
    x = (torch.randn(6, k, generator=g) * 2.0 ** torch.randint(-40, 40, (6, k), generator=g)).to(
        torch.bfloat16
    )
    w = (torch.randn(9, k, generator=g) * 2.0 ** torch.randint(-40, 40, (9, k), generator=g)).to(
        torch.bfloat16
    )
    x[:, 10:20] = -x[:, 0:10]  # exact cancellations
    w[:, 10:20] = w[:, 0:10]
    base = dot_accumulate(x, w)
    for seed in range(4):
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
        p = dot_accumulate(x[:, perm], w[:, perm])
        assert _f64_bits_list(p.exact) == _f64_bits_list(base.exact)
    monkeypatch.setattr(X, "_CHUNK_ELEMENTS", k * 2)  # 1 row per chunk, 2 tokens per product block
    small = dot_accumulate(x, w)
    assert _f64_bits_list(small.exact) == _f64_bits_list(base.exact)
    for i in range(6):
        for j in range(9):
            q = _fraction_dot([float(v) for v in x[i]], [float(v) for v in w[j]])
            assert float(base.exact[i, j]) == _ro53(q)


def test_sum_squares_exact_against_fractions_wide_range():
    rng = random.Random(4)
    rows = [
        [
            rng.choice((-1.0, 1.0)) * rng.randrange(1 << 23, 1 << 24) * 2.0 ** rng.randrange(-172, 104)
            for _ in range(33)
        ]
        for _ in range(5)
    ]
    rows.append([2.0**-149] * 3 + [0.0])  # 3 * 2^-298
    rows.append([-0.0, 0.0])  # squares are +0: +0
    width = max(len(r) for r in rows)
    rows = [r + [0.0] * (width - len(r)) for r in rows]
    s = torch.tensor(rows, dtype=torch.float32)
    rows = s.double().tolist()  # the binary32 values
    acc = sum_squares_accumulate(s)
    for i, r in enumerate(rows):
        q = sum((Fraction(v) ** 2 for v in r), Fraction(0))
        assert float(acc.exact[i]) == _ro53(q), i
        assert float(X.round_exact("sumsq", acc)[i]) == rn32(q)
    assert not math.copysign(1.0, float(acc.exact[-1])) < 0


def test_sign_of_an_exact_zero():
    # all terms -0 -> -0 (IEEE in every order); mixed zeros or cancellation -> +0
    # row 0: -0*1, 0*-2, 1*-0 are all -0 -> -0; row 1: +0, -0, -0 -> +0; row 2: 2 - 2 + -0 -> +0
    acc = dot_accumulate(tbf([[-0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [2.0, 1.0, 0.0]]), tbf([[1.0, -2.0, -0.0]]))
    signs = [math.copysign(1.0, float(v)) for v in acc.exact[:, 0]]
    assert float(acc.exact.abs().max()) == 0.0 and signs == [-1.0, 1.0, 1.0]
    got = X.round_exact("router", acc)
    assert [math.copysign(1.0, float(v)) for v in got[:, 0]] == signs


def test_too_long_reduction_is_rejected():
    with pytest.raises(ValueError, match="exceeds 2097152"):
        z = torch.zeros(1, (1 << 21) + 1, dtype=torch.bfloat16)
        dot_accumulate(z, z)


def test_chunk_rows_filtered_independent_of_tokens():
    assert X._chunk_rows(1024, 8, torch.device("cpu"), False) == X._CHUNK_ELEMENTS // (1024 * 8)
    assert X._chunk_rows(1024, 8, torch.device("cpu"), True) == X._CHUNK_ELEMENTS // 1024
    assert X._chunk_rows(1024, 1, torch.device("cuda"), True) == 4 * X._CHUNK_ELEMENTS // 1024
    assert X._chunk_rows(1 << 30, 8, torch.device("cpu"), True) == 1


def test_filtered_chunked_rows_equal_unchunked(monkeypatch):
    from flint_moe.reference.exact import filtered_sums

    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 48, generator=g).bfloat16()
    w = torch.randn(29, 48, generator=g).bfloat16()
    w[3] = 0.0  # an all-zero row: +0 sums
    with filtered_sums():
        whole = dot_accumulate(x, w)
        monkeypatch.setattr(X, "_CHUNK_ELEMENTS", 48 * 4)  # 4 rows per chunk under the filter, last chunk of 1
        parts = dot_accumulate(x, w)
    for f in ("exact", "bound", "abs_sum", "eta_possible", "exact_error"):
        assert torch.equal(getattr(whole, f), getattr(parts, f)), f
    exact = dot_accumulate(x, w)  # without the filter: every element summed exactly
    assert torch.equal(whole.exact.to(torch.float32), exact.exact.to(torch.float32))  # same RN32 values
