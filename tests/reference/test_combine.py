"""Combine (rule steps 9-10): exact binary32 fma in selection order, shared-expert add."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

from flint_moe.reference.combine import add_shared, combine, combine_fp32, fma_f32
from tests.reference._oracle import add32, bf16, f32, f32_bits, rn32, t32, tbf


def _ref_fma(a: float, b: float, c: float) -> float:
    """One rounding of the exact a*b + c; exact zero sums take the IEEE sign (product sign vs c)."""
    if not all(math.isfinite(v) for v in (a, b, c)):
        return f32(a * b + c)
    q = Fraction(a) * Fraction(b) + Fraction(c)
    if q == 0:
        return (a * b) + c  # float64: a*b exact here, same zero-sign rule
    return rn32(q)


def test_fma_double_rounding_case():
    # a = 1 + 2^-23, b = 2^-24 (1 - 2^-23), c = 1 + 2^-23: a*b = 2^-24 - 2^-70, so
    # a*b + c = 1 + 2^-23 + 2^-24 - 2^-70, just below the binary32 midpoint 1 + 2^-23 + 2^-24:
    # RN32 -> 1 + 2^-23. Rounding first to float64 lands on the midpoint (2^-70 < half an ulp64 = 2^-53)
    # and ties-to-even would then give 1 + 2^-22: the round-to-odd step must prevent that.
    a, b, c = 1 + 2.0**-23, 2.0**-24 * (1 - 2.0**-23), 1 + 2.0**-23
    naive = float(torch.tensor(a * b + c, dtype=torch.float64).float())
    assert naive == 1 + 2.0**-22  # the double-rounding trap is real
    assert fma_f32(t32([a]), t32([b]), t32([c])).tolist() == [1 + 2.0**-23]
    # the mirror case above the midpoint: c = -(1 + 2^-23), a*b negated -> -(1 + 2^-23)
    assert fma_f32(t32([-a]), t32([b]), t32([-c])).tolist() == [-(1 + 2.0**-23)]


def test_fma_zero_signs_and_specials():
    # (-1 * 0) + +0 = +0 ; (-1 * 0) + -0 = -0 ; 1*1 + -1 = +0 ; inf * 0 + 1 = NaN ; 2^127*4 + 0 -> inf
    a = t32([-1.0, -1.0, 1.0, math.inf, 2.0**127, 2.0**-149])
    b = t32([0.0, 0.0, 1.0, 0.0, 4.0, 0.5])
    c = t32([0.0, -0.0, -1.0, 1.0, 0.0, 0.0])
    out = fma_f32(a, b, c).tolist()
    assert [math.copysign(1, v) for v in out[:3]] == [1, -1, 1] and out[:3] == [0.0, 0.0, 0.0]
    assert math.isnan(out[3]) and out[4] == math.inf
    # 2^-149 * 0.5 = 2^-150: exactly half the smallest subnormal -> ties to even: +0
    assert out[5] == 0.0 and math.copysign(1, out[5]) == 1


def test_fma_random_against_fractions():
    rng = random.Random(2)
    vals = []
    for _ in range(3000):
        a = f32(rng.uniform(-2, 2) * 2.0 ** rng.randrange(-80, 40))
        b = f32(rng.uniform(-2, 2) * 2.0 ** rng.randrange(-80, 40))
        c = f32(rng.choice((-1, 1)) * a * b * (1 + rng.choice((0, 2.0**-24, -(2.0**-25), 1e-3))))
        vals.append((a, b, c))
    out = fma_f32(t32([v[0] for v in vals]), t32([v[1] for v in vals]), t32([v[2] for v in vals])).tolist()
    for (a, b, c), got in zip(vals, out, strict=False):
        assert f32_bits(got) == f32_bits(_ref_fma(a, b, c)), (a, b, c)


def test_combine_against_plain_loop():
    rng = random.Random(4)
    m, k, h = 5, 6, 9
    tw = [[bf16(rng.random()) for _ in range(k)] for _ in range(m)]
    y = [
        [[bf16(rng.uniform(-3, 3) * 2.0 ** rng.randrange(-130, 5)) for _ in range(h)] for _ in range(k)]
        for _ in range(m)
    ]
    y[0][0] = [-0.0] * h  # product -0 into +0 accumulator
    acc = combine_fp32(t32(tw), tbf(y))
    routed = combine(t32(tw), tbf(y))
    for t in range(m):
        for i in range(h):
            a = 0.0
            for j in range(k):
                a = _ref_fma(tw[t][j], y[t][j][i], a)
            assert f32_bits(float(acc[t, i])) == f32_bits(a)
            assert f32_bits(float(routed[t, i].float())) == f32_bits(bf16(a))


def test_combine_hand_cases():
    # tw = [1, 1], y = [1, -1]: acc = fma(1,1,+0) = 1, fma(1,-1,1) = +0 -> routed +0
    # tw = [0.5, 0.5], y = [-0, -0]: fma(0.5,-0,+0) = +0 (mixed-sign zero sum) -> +0
    # tw = [1, 2^-9], y = [1, 1]: acc = 1 + 2^-9 exact in fp32; bf16 -> 1.0 (below the midpoint 1 + 2^-8)
    # tw = [1, 2^-8], y = [1, 1 + 2^-7]: acc = 1 + 2^-8 + 2^-15 -> bf16 1 + 2^-7 (above the midpoint)
    tw = t32([[1.0, 1.0], [0.5, 0.5], [1.0, 2.0**-9], [1.0, 2.0**-8]])
    y = tbf([[[1.0], [-1.0]], [[-0.0], [-0.0]], [[1.0], [1.0]], [[1.0], [1 + 2.0**-7]]])
    r = combine(tw, y).float().reshape(-1).tolist()
    assert r == [0.0, 0.0, 1.0, 1 + 2.0**-7]
    assert math.copysign(1, r[0]) == 1 and math.copysign(1, r[1]) == 1


def test_add_shared_rounding_points():
    # 1 + 2^-8: fp32 exact, bf16 tie -> even 1.0; (1 + 2^-7) + 2^-8 = 1 + 3*2^-8: tie -> 1 + 2^-6;
    # (-1) + 1 = +0; inf + -inf = NaN
    out = add_shared(tbf([[1.0, 1 + 2.0**-7, -1.0, math.inf]]), tbf([[2.0**-8, 2.0**-8, 1.0, -math.inf]]))
    v = out.float().tolist()[0]
    assert v[:3] == [1.0, 1 + 2.0**-6, 0.0] and math.copysign(1, v[2]) == 1 and math.isnan(v[3])
    assert add32(-1.0, 1.0) == 0.0


def test_combine_bad_inputs():
    with pytest.raises(ValueError, match="tw: routing weights must be fp32 holding bf16 values"):
        combine(t32([[1 + 2.0**-20]]), tbf([[[1.0]]]))
    with pytest.raises(ValueError, match="y: dimension 1 must be 2"):
        combine(t32([[1.0, 1.0]]), tbf([[[1.0]]]))
    with pytest.raises(TypeError, match="shared: dtype must be torch.bfloat16"):
        add_shared(tbf([[1.0]]), t32([[1.0]]))
    with pytest.raises(TypeError, match="c: dtype must be torch.float32"):
        fma_f32(t32([1.0]), t32([1.0]), torch.ones(1, dtype=torch.float64))
