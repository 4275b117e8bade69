"""The certified float64 filter of the exact accumulation (``exact.filtered_sums``): same RN32 values and the
same acceptance decisions as the exact (round-to-odd) summation, exact summation where the filter cannot
decide. Values derived by hand or from ``fractions.Fraction``."""

from __future__ import annotations

import random
from fractions import Fraction

import torch

from flint_moe.reference import exact as X
from flint_moe.reference.exact import check_accumulator, dot_accumulate, filtered_sums, round_exact
from tests.reference._oracle import rn32


def _bf16(rng: random.Random, n: int, lo: int, hi: int) -> list[float]:
    out = []
    for _ in range(n):
        m = rng.randrange(128, 256) / 128.0  # 8 significant bits
        out.append(rng.choice((-1.0, 1.0)) * m * 2.0 ** rng.randrange(lo, hi))
    return out


def test_filter_is_off_by_default_and_scoped():
    a = torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)
    assert dot_accumulate(a, a).exact_error is None
    with filtered_sums():
        assert dot_accumulate(a, a).exact_error is not None
        with filtered_sums(False):
            assert dot_accumulate(a, a).exact_error is None
    assert dot_accumulate(a, a).exact_error is None


def test_midpoint_case_is_summed_exactly():
    # exact sum 1 + 2^-24 + 2^-60: just above the binary32 midpoint between 1 and 1 + 2^-23, so RN32 is
    # 1 + 2^-23; a float64 GEMM loses the 2^-60 (it returns the midpoint, RN32 of which is 1.0), and the
    # cancelling +-2^20 make its certified error (~2^-30) straddle the midpoint: the filter must fall back.
    b = torch.tensor([[1.0, 2.0**-24, 2.0**-60, 2.0**20, -(2.0**20)]], dtype=torch.bfloat16)
    a = torch.ones((1, 5), dtype=torch.bfloat16)
    with filtered_sums():
        acc = dot_accumulate(a, b)
    assert float(acc.exact_error[0, 0]) == 0.0  # decided by exact summation
    assert float(round_exact("t", acc)[0, 0]) == 1.0 + 2.0**-23
    assert float(round_exact("t", dot_accumulate(a, b))[0, 0]) == 1.0 + 2.0**-23


def test_zero_sums_and_signs_match_the_exact_path():
    a = torch.tensor([[1.0, -1.0, 0.0], [-0.0, -0.0, 0.0]], dtype=torch.bfloat16)
    b = torch.tensor([[1.0, 1.0, 5.0], [0.0, 0.0, -0.0], [2.0**-100, 2.0**-100, 1.0]], dtype=torch.bfloat16)
    ref = dot_accumulate(a, b)
    with filtered_sums():
        got = dot_accumulate(a, b)
    assert torch.equal(round_exact("t", got).view(torch.int32), round_exact("t", ref).view(torch.int32))
    assert torch.equal(torch.signbit(got.exact), torch.signbit(ref.exact))


def test_random_wide_range_rn32_and_decisions_equal_exact_path():
    rng = random.Random(7)
    m, n, k = 6, 40, 96
    a_rows = [_bf16(rng, k, -30, 30) for _ in range(m)]
    b_rows = [_bf16(rng, k, -30, 30) for _ in range(n)]
    for r in range(0, n, 4):  # heavy cancellation rows: b[r] = -b[r + 1] except one term
        b_rows[r + 1] = [-v for v in b_rows[r]]
        b_rows[r + 1][rng.randrange(k)] *= 0.5
    a = torch.tensor(a_rows, dtype=torch.float64).to(torch.bfloat16)
    b = torch.tensor(b_rows, dtype=torch.float64).to(torch.bfloat16)
    ref = dot_accumulate(a, b)
    with filtered_sums():
        got = dot_accumulate(a, b)
    want = torch.tensor(
        [[rn32(sum((Fraction(x) * Fraction(y) for x, y in zip(ar, br, strict=True)), Fraction(0))) for br in b_rows]
         for ar in a_rows],
        dtype=torch.float32,
    )  # fmt: skip
    assert torch.equal(round_exact("t", got).view(torch.int32), want.view(torch.int32))
    assert torch.equal(round_exact("t", ref).view(torch.int32), want.view(torch.int32))
    # the filter's value is within its certified error of the exact sum, and the error is tiny vs the bound
    diff = (got.exact - ref.exact).abs()
    assert bool((diff <= got.exact_error + ref.fp64_error).all())
    assert bool((got.bound - ref.bound <= got.exact_error * 1.001 + 1e-300).all())
    # kernel-like values: fp32 sums in a shuffled order, and values just outside the bound
    kern = torch.empty((m, n), dtype=torch.float32)
    for i in range(m):
        for j in range(n):
            order = list(range(k))
            rng.shuffle(order)
            s = torch.zeros((), dtype=torch.float32)
            for t in order:
                s = s + torch.tensor(a_rows[i][t] * b_rows[j][t], dtype=torch.float32)
            kern[i, j] = s
    assert torch.equal(check_accumulator(kern, got), check_accumulator(kern, ref))
    assert bool(check_accumulator(kern, got).all())
    outside = (ref.exact + 2 * ref.bound).to(torch.float32)
    assert torch.equal(check_accumulator(outside, got), check_accumulator(outside, ref))


def test_filtered_bound_survives_with_model_and_indexing():
    a = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    b = torch.tensor([[4.0, -5.0, 6.0], [1.0, 1.0, 1.0]], dtype=torch.bfloat16)
    with filtered_sums():
        acc = dot_accumulate(a, b)
    re = acc.with_model(X.FP32_TRUNCATE)
    assert re.exact_error is not None and torch.equal(re.exact_error, acc.exact_error)
    assert torch.equal(acc[..., :1].exact_error, acc.exact_error[..., :1])
