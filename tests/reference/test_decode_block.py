"""Decode-block front (rule step 11): residual add, sum of squares, RMSNorm with rsqrt.approx.ftz."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

from flint_moe.reference.decode_block import eps_fp32, residual_add, rmsnorm_apply, sum_squares
from flint_moe.reference.formats import to_bf16
from tests.reference._oracle import bf16, f32, f32_bits, install_stub_mufu, mul32, rn32, t32, tbf


def test_residual_add_rounding_point():
    # 1 + 2^-8 is exact in fp32 (s), residual' = bf16(s) = 1.0 (tie to even);
    # 2^-133 + 2^-133 = 2^-132 (bf16 subnormals kept); 3e38 + 3e38 -> inf
    s = residual_add(tbf([[1.0, 2.0**-133, 2.0**127]]), tbf([[2.0**-8, 2.0**-133, 2.0**127]]))
    assert s.tolist() == [[1 + 2.0**-8, 2.0**-132, math.inf]]
    assert to_bf16(s).float().tolist() == [[1.0, 2.0**-132, math.inf]]


def test_sum_squares_against_fractions():
    rng = random.Random(9)
    rows = [[f32(rng.uniform(-3, 3) * 2.0 ** rng.randrange(-70, 20)) for _ in range(24)] for _ in range(3)]
    acc = sum_squares(t32(rows))
    for r, row in enumerate(rows):
        q = sum(Fraction(v) ** 2 for v in row)
        assert abs(Fraction(float(acc.exact[r])) - q) <= Fraction(float(acc.fp64_error[r]))


def test_rmsnorm_rounding_points(monkeypatch):
    install_stub_mufu(monkeypatch)
    from flint_moe.reference import mufu

    seen = []
    monkeypatch.setattr(
        mufu, "rsqrt_approx_ftz", lambda v: (seen.append(v.clone()), t32([0.25] * v.numel()))[1]
    )
    # s = [3, 4], H = 2: sumsq = 25, div_rn(25, 2) = 12.5, eps = fp32(1e-6) = 9.99999997e-7;
    # 12.5 + 1e-6: spacing at 12.5 is 2^-20 = 9.54e-7, 1e-6 / 2^-20 = 1.049 -> RN -> 12.5 + 2^-20.
    # inv (stand-in) = 0.25: xn = bf16(RN(RN(s * 0.25) * w)) with w = [1, 1 + 2^-7]:
    #   3 * 0.25 = 0.75 -> 0.75; 4 * 0.25 = 1, * (1 + 2^-7) = 1 + 2^-7 -> bf16 exact
    xn = rmsnorm_apply(t32([[3.0, 4.0]]), t32([25.0]), tbf([1.0, 1 + 2.0**-7]), 1e-6)
    assert seen[0].tolist() == [12.5 + 2.0**-20]
    assert xn.float().tolist() == [[0.75, 1 + 2.0**-7]]
    assert f32_bits(eps_fp32(1e-6)) == f32_bits(f32(1e-6))


def test_rmsnorm_against_plain_loop(monkeypatch):
    install_stub_mufu(monkeypatch)
    from tests.reference._oracle import scalar, stub_rsqrt

    rng = random.Random(12)
    h = 12
    s = [[f32(rng.uniform(-5, 5)) for _ in range(h)] for _ in range(4)]
    w = [bf16(rng.uniform(-2, 2)) for _ in range(h)]
    sumsq = [rn32(sum(Fraction(v) ** 2 for v in row)) for row in s]
    out = rmsnorm_apply(t32(s), t32(sumsq), tbf(w), 1e-5).float().tolist()
    e = f32(1e-5)
    for r in range(4):
        inv = scalar(stub_rsqrt, rn32(rn32(Fraction(sumsq[r]) / h) + Fraction(e)))
        for i in range(h):
            assert f32_bits(out[r][i]) == f32_bits(bf16(mul32(mul32(s[r][i], inv), w[i])))


def test_rmsnorm_bad_inputs():
    with pytest.raises(ValueError, match="sumsq_fp32: dimension 0 must be 1"):
        rmsnorm_apply(t32([[1.0]]), t32([1.0, 2.0]), tbf([1.0]), 1e-6)
    with pytest.raises(ValueError, match="w_ln: dimension 0 must be 1"):
        rmsnorm_apply(t32([[1.0]]), t32([1.0]), tbf([1.0, 1.0]), 1e-6)
    with pytest.raises(TypeError, match="eps: expected a Python float"):
        rmsnorm_apply(t32([[1.0]]), t32([1.0]), tbf([1.0]), torch.tensor(1e-6))
    with pytest.raises(ValueError, match="residual: dimension 1 must be 2"):
        residual_add(tbf([[1.0, 2.0]]), tbf([[1.0]]))
