"""reference.mma: the H200 tensor-core k16 step (bf16 x bf16 -> fp32), bit for bit.

- Hardware vectors (``flint_moe/reference/data/mma_probe.npz``, captured on the H200 by
  ``python -m flint_moe.tools.mma probe``): the model reproduces every output (NaN as NaN-ness).
- An independent scalar oracle in exact rational arithmetic (``fractions.Fraction``) of the documented steps
  agrees on random vectors of several distributions.
- Hand-derived cases: exact products kept where an fp32 FMA chain loses them, per-term truncation, RZ against
  round to nearest, zero terms' exponents, the alignment floor, signs of zeros, subnormals, overflow, inf / NaN,
  k-order independence.
- Argument errors.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from flint_moe.reference import MMA_INSTRUCTIONS, mma_bf16_f32
from flint_moe.tools.mma import RANDOM_CLASSES

DATA = Path(__file__).resolve().parents[2] / "flint_moe" / "reference" / "data" / "mma_probe.npz"


def _bits(x: torch.Tensor) -> list[int]:
    return [v & 0xFFFFFFFF for v in x.view(torch.int32).reshape(-1).tolist()]


def _same(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.view(torch.int32) == y.view(torch.int32)) | (torch.isnan(x) & torch.isnan(y))


def _one(acc: float, a: list[float], b: list[float], instruction: str = "mma.sync.m16n8k16") -> torch.Tensor:
    return mma_bf16_f32(
        torch.tensor([acc], dtype=torch.float32),
        torch.tensor([a], dtype=torch.float32).bfloat16(),
        torch.tensor([b], dtype=torch.float32).bfloat16(),
        instruction=instruction,
    )[0]


def _f32_bits(v: float) -> int:
    return int(torch.tensor([v], dtype=torch.float32).view(torch.int32)[0]) & 0xFFFFFFFF


# ------------------------------------------------------------------------------------------------------------
# hardware vectors


def test_probe_vectors_bit_exact() -> None:
    z = np.load(DATA)
    acc = torch.from_numpy(z["acc"].astype(np.uint32).view(np.int32).copy()).view(torch.float32)
    a = torch.from_numpy(z["a"].astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16)
    b = torch.from_numpy(z["b"].astype(np.uint16).view(np.int16).copy()).view(torch.bfloat16)
    d = torch.from_numpy(z["d"].astype(np.uint32).view(np.int32).copy()).view(torch.float32)
    instr = z["instruction"]
    names = [str(x) for x in z["instructions"]]
    assert set(names) == set(MMA_INSTRUCTIONS)
    classes = [str(x) for x in z["classes"]]
    # every random class of the capture tool and every adversarial class but the hand-written one
    for need in RANDOM_CLASSES + ("align_shift", "ties", "carry", "kperm", "zero_exponent", "tiny"):
        assert need in classes
        assert (z["klass"] == classes.index(need)).sum() >= 100
    assert acc.numel() >= 3000
    for i, name in enumerate(names):
        sel = torch.from_numpy(instr == i)
        got = mma_bf16_f32(acc[sel], a[sel], b[sel], instruction=name)
        ok = _same(got, d[sel])
        assert bool(ok.all()), f"{name}: {int((~ok).sum())} of {int(sel.sum())} hardware vectors differ"


# ------------------------------------------------------------------------------------------------------------
# independent oracle: the documented steps in exact rational arithmetic, one vector at a time


def _decode(bits: int, ebits: int, mbits: int) -> tuple[int, int, int, int]:
    """(sign, biased exponent field, mantissa field, value exponent) of a binary float bit pattern."""
    sign = bits >> (ebits + mbits)
    ef = (bits >> mbits) & ((1 << ebits) - 1)
    mf = bits & ((1 << mbits) - 1)
    return sign, ef, mf, ef


def _oracle(acc_bits: int, a_bits: list[int], b_bits: list[int]) -> float:
    terms = []  # (value as Fraction, exponent)
    specials = []
    for x, y in zip(a_bits, b_bits, strict=True):
        vals = []
        for t in (x, y):
            s, ef, mf, _ = _decode(t, 8, 7)
            if ef == 255:
                vals.append(("nan", None) if mf else ("inf", -1 if s else 1))
            else:
                sig = Fraction((128 | mf) if ef else mf, 128)
                vals.append(("fin", (-1 if s else 1) * sig * Fraction(2) ** (max(ef, 1) - 127), max(ef, 1) - 127, sig))
        if any(v[0] == "nan" for v in vals):
            specials.append("nan")
        elif any(v[0] == "inf" for v in vals):
            other = [v for v in vals if v[0] == "fin"]
            if other and other[0][1] == 0:
                specials.append("nan")
            else:
                sgn = 1
                for v in vals:
                    sgn *= v[1] if v[0] == "inf" else (1 if v[1] > 0 else -1)
                specials.append("+inf" if sgn > 0 else "-inf")
        else:
            p = vals[0][1] * vals[1][1]
            if p != 0:
                terms.append((p, vals[0][2] + vals[1][2]))
    s, ef, mf, _ = _decode(acc_bits, 8, 23)
    if ef == 255:
        specials.append("nan" if mf else ("-inf" if s else "+inf"))
    elif ef or mf:
        sig = Fraction(((1 << 23) | mf) if ef else mf, 1 << 23)
        terms.append(((-1 if s else 1) * sig * Fraction(2) ** (max(ef, 1) - 127), max(ef, 1) - 127))
    if "nan" in specials or ("+inf" in specials and "-inf" in specials):
        return math.nan
    if specials:
        return math.inf if specials[0] == "+inf" else -math.inf
    if not terms:
        return 0.0
    emax = max(max(e for _, e in terms), -133)
    q = Fraction(2) ** (emax - 25)
    total = sum(((abs(v) // q) * q) * (1 if v > 0 else -1) for v, _ in terms)
    if total == 0:
        return 0.0
    mag = abs(total)
    e = math.floor(math.log2(mag))
    while Fraction(2) ** e > mag:
        e -= 1
    while Fraction(2) ** (e + 1) <= mag:
        e += 1
    step = Fraction(2) ** (max(e, -126) - 23)
    r = (mag // step) * step
    if r == 0:
        return 0.0
    if r >= Fraction(2) ** 128:
        return math.copysign(math.inf, total)
    return math.copysign(float(r), total)


@pytest.mark.parametrize("dist", ["wide", "gaussian", "tiny", "cancel"])
def test_against_exact_rational_oracle(dist: str) -> None:
    g = torch.Generator().manual_seed(11)
    n = 150
    if dist == "wide":
        a = torch.randint(-32768, 32767, (n, 16), generator=g, dtype=torch.int32)
        b = torch.randint(-32768, 32767, (n, 16), generator=g, dtype=torch.int32)
        a = torch.where(((a >> 7) & 0xFF) == 255, a & ~(1 << 14), a).to(torch.int16).view(torch.bfloat16)
        b = torch.where(((b >> 7) & 0xFF) == 255, b & ~(1 << 14), b).to(torch.int16).view(torch.bfloat16)
        acc = (torch.randn(n, generator=g) * 2.0 ** torch.randint(-140, 120, (n,), generator=g).double()).float()
    elif dist == "gaussian":
        a = torch.randn(n, 16, generator=g).bfloat16()
        b = torch.randn(n, 16, generator=g).bfloat16()
        acc = torch.randn(n, generator=g)
    elif dist == "tiny":
        a = (torch.randn(n, 16, generator=g) * 2.0**-70).bfloat16()
        b = (torch.randn(n, 16, generator=g) * 2.0**-72).bfloat16()
        acc = torch.zeros(n)
    else:
        a = torch.randn(n, 16, generator=g).bfloat16()
        b = torch.randn(n, 16, generator=g).bfloat16()
        acc = -(a.double() * b.double()).sum(-1).float()
    got = mma_bf16_f32(acc, a, b)
    ab = [[v & 0xFFFF for v in row] for row in a.view(torch.int16).tolist()]
    bb = [[v & 0xFFFF for v in row] for row in b.view(torch.int16).tolist()]
    cb = _bits(acc)
    want = torch.tensor([_oracle(cb[i], ab[i], bb[i]) for i in range(n)], dtype=torch.float32)
    assert bool(_same(got, want).all())


# ------------------------------------------------------------------------------------------------------------
# hand-derived cases


def test_products_kept_that_an_fma_chain_loses() -> None:
    # 2^24 + 16 * 1: each 1 sits 24 bits below 2^24, inside the 25 kept bits; the sum 2^24 + 16 is an fp32.
    # An fp32 FMA chain rounds 2^24 + 1 to 2^24 (ties to even) at every step and returns 2^24.
    assert float(_one(2.0**24, [1.0] * 16, [1.0] * 16)) == 2.0**24 + 16
    # 2^-1 is 25 bits below 2^24: kept; 2^24 + 8 exactly
    assert float(_one(2.0**24, [1.0] * 16, [0.5] * 16)) == 2.0**24 + 8
    # 2^-2 is 26 bits below: every product is truncated to 0 although 2^24 + 4 is an fp32
    assert float(_one(2.0**24, [1.0] * 16, [0.25] * 16)) == 2.0**24


def test_per_term_truncation() -> None:
    # 1 + 16 * 2^-26 = 1 + 2^-22 exactly (an fp32), but each 2^-26 lies below the last kept bit 2^-25
    assert float(_one(1.0, [1.0] * 16, [2.0**-26] * 16)) == 1.0
    # 1 + 2 * 2^-25 = 1 + 2^-24: kept bits, then RZ to 24 significant bits -> 1
    assert float(_one(1.0, [1.0] * 16, [2.0**-25] * 2 + [0.0] * 14)) == 1.0


def test_truncation_differs_from_round_to_nearest() -> None:
    # 1 + 3 * 2^-25 = 1 + 1.5 ulp(1)/2: round to nearest gives 1 + 2^-23, truncation 1
    r = _one(1.0, [1.0] * 16, [3.0 * 2.0**-25] + [0.0] * 15)
    assert _bits(r) == [_f32_bits(1.0)]
    # -1 + 2^-25: exactly halfway between -(1 - 2^-24) and -1; RNE gives -1, RZ -(1 - 2^-24)
    r = _one(-1.0, [1.0] * 16, [2.0**-25] + [0.0] * 15)
    assert float(r) == -(1.0 - 2.0**-24)


def test_k_order_does_not_matter() -> None:
    g = torch.Generator().manual_seed(5)
    n = 400
    e = torch.randint(-30, 2, (n, 16), generator=g).double()
    a = (torch.randn(n, 16, generator=g).double() * 2.0**e).bfloat16()
    b = torch.randn(n, 16, generator=g).bfloat16()
    acc = torch.randn(n, generator=g)
    base = mma_bf16_f32(acc, a, b)
    for _ in range(4):
        p = torch.randperm(16, generator=g)
        assert torch.equal(mma_bf16_f32(acc, a[:, p], b[:, p]).view(torch.int32), base.view(torch.int32))


def test_zero_terms_take_no_part_in_the_exponent() -> None:
    # 0 * 2^127 would have exponent -126 + 127 = 1 if zeros counted; then 1.0078125 * 2^-30 (31 below) would be
    # truncated away. Measured: zeros do not count, the product is returned exactly.
    a = [0.0, 1.0078125] + [0.0] * 14
    b = [2.0**127, 2.0**-30] + [0.0] * 14
    assert float(_one(0.0, a, b)) == 1.0078125 * 2.0**-30


def test_alignment_floor() -> None:
    # zero accumulator, largest product 2^-140 (< 2^-133): the last kept bit is 2^(-133 - 25) = 2^-158
    a = [2.0**-70, -(2.0**-80)] + [0.0] * 14
    # -2^-158 is kept: 2^-140 - 2^-158 truncates to 2^-140 - 2^-149 on the subnormal grid
    r = _one(0.0, a, [2.0**-70, 2.0**-78] + [0.0] * 14)
    assert _bits(r) == [(1 << 9) - 1]  # 2^-140 = 2^9 * 2^-149
    # -2^-159 lies below 2^-158 and is dropped: exactly 2^-140
    r = _one(0.0, a, [2.0**-70, 2.0**-79] + [0.0] * 14)
    assert _bits(r) == [1 << 9]


def test_signs_of_zeros() -> None:
    # every zero result is +0: -0 + 16 * (1 * -0), -0 + (-0) * (-0), and an exact cancellation
    for acc, a, b in [
        (-0.0, [1.0] * 16, [-0.0] * 16),
        (-0.0, [-0.0] * 16, [-0.0] * 16),
        (-1.0, [1.0] + [0.0] * 15, [1.0] * 16),
        (1.0, [1.0] + [0.0] * 15, [-1.0] * 16),
    ]:
        assert _bits(_one(acc, a, b)) == [0]
    # a negative sum below the smallest subnormal truncates to +0
    assert _bits(_one(0.0, [-(2.0**-76)] + [0.0] * 15, [2.0**-76] + [0.0] * 15)) == [0]
    # a negative sum above it keeps its sign: -2^-149
    assert _bits(_one(0.0, [-(2.0**-75)] + [0.0] * 15, [2.0**-74] + [0.0] * 15)) == [0x80000001]


def test_subnormal_inputs_and_results() -> None:
    # bf16 subnormal 2^-133 times 2^10: 2^-123 exactly
    assert float(_one(0.0, [2.0**-133] + [0.0] * 15, [2.0**10] + [0.0] * 15)) == 2.0**-123
    # fp32 subnormal accumulator passes through: 3 * 2^-149
    assert _bits(_one(3 * 2.0**-149, [0.0] * 16, [0.0] * 16)) == [3]
    # a subnormal accumulator counts with exponent -126: the last kept bit is 2^-151, so 16 products of
    # 2^-151 add 2^-147 (2^-149 + 2^-147 = 5 * 2^-149) while 16 products of 2^-152 are truncated away
    assert _bits(_one(2.0**-149, [2.0**-75] * 16, [2.0**-76] * 16)) == [5]
    assert _bits(_one(2.0**-149, [2.0**-76] * 16, [2.0**-76] * 16)) == [1]


def test_overflow_is_infinity() -> None:
    # FLT_MAX + 16 * 2^127 overflows; RZ in IEEE would give FLT_MAX, the tensor cores give inf
    fmax = 3.4028234663852886e38
    assert math.isinf(float(_one(fmax, [2.0**64] * 16, [2.0**63] * 16)))
    assert float(_one(-fmax, [2.0**64] * 16, [-(2.0**63)] * 16)) == -math.inf
    # an overflowing product alone: 2^100 * 2^100 = 2^200
    assert float(_one(0.0, [2.0**100] + [0.0] * 15, [2.0**100] + [0.0] * 15)) == math.inf
    # FLT_MAX plus a product below its last kept bit stays FLT_MAX
    assert float(_one(fmax, [1.0] + [0.0] * 15, [1.0] * 16)) == fmax


def test_inf_and_nan() -> None:
    inf, nan = math.inf, math.nan
    assert math.isnan(float(_one(1.0, [inf] + [0.0] * 15, [0.0] * 16)))  # inf * 0
    assert math.isnan(float(_one(1.0, [inf, 1.0] + [0.0] * 14, [1.0, -inf] + [0.0] * 14)))  # inf - inf
    assert math.isnan(float(_one(-inf, [inf] + [0.0] * 15, [1.0] * 16)))
    assert math.isnan(float(_one(nan, [1.0] * 16, [1.0] * 16)))
    assert math.isnan(float(_one(0.0, [1.0] * 16, [nan] + [1.0] * 15)))
    assert float(_one(inf, [2.0**100] * 16, [-(2.0**100)] * 16)) == inf
    assert float(_one(1.0, [-inf] + [0.0] * 15, [2.0] + [0.0] * 15)) == -inf


def test_instructions_identical_and_broadcast() -> None:
    g = torch.Generator().manual_seed(3)
    acc = torch.randn(3, 1, generator=g)
    a = torch.randn(4, 16, generator=g).bfloat16()
    b = torch.randn(1, 16, generator=g).bfloat16()
    out = mma_bf16_f32(acc, a, b, instruction="wgmma.m64nNk16")
    assert out.shape == (3, 4) and out.dtype == torch.float32
    for i in range(3):
        for j in range(4):
            one = mma_bf16_f32(acc[i, :1], a[j : j + 1], b)
            assert _bits(out[i, j]) == _bits(one)
    assert torch.equal(out.view(torch.int32), mma_bf16_f32(acc, a, b).view(torch.int32))


# ------------------------------------------------------------------------------------------------------------
# argument errors


def test_argument_errors() -> None:
    acc = torch.zeros(2)
    a = torch.zeros(2, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="acc: dtype"):
        mma_bf16_f32(acc.double(), a, a)
    with pytest.raises(TypeError, match="a: dtype"):
        mma_bf16_f32(acc, a.float(), a)
    with pytest.raises(TypeError, match="b: expected a torch.Tensor"):
        mma_bf16_f32(acc, a, [0.0] * 16)
    with pytest.raises(ValueError, match="b: last dimension must be 16"):
        mma_bf16_f32(acc, a, torch.zeros(2, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="do not broadcast"):
        mma_bf16_f32(torch.zeros(3), a, a)
    with pytest.raises(ValueError, match="instruction"):
        mma_bf16_f32(acc, a, a, instruction="mma.sync.m16n8k8")


def test_outer_step_equals_the_broadcast_step() -> None:
    """``mma_bf16_f32_outer`` (every activation row against every weight row of each group) gives the bits of
    ``mma_bf16_f32`` on the materialised broadcast, for every input class of the probe generator."""
    from flint_moe.reference import mma_bf16_f32_outer
    from flint_moe.tools.mma import CLASSES, generate

    g, r, n = 2, 3, 5
    for klass in CLASSES:
        acc, a, b = generate(klass, 64, 9, "cpu")
        w, x, c = a[: g * n].reshape(g, n, 16), b[: g * r].reshape(g, r, 16), acc[: g * r * n].reshape(g, r, n)
        got = mma_bf16_f32_outer(c, w, x, instruction="wgmma.m64nNk16")
        want = mma_bf16_f32(c, w[:, None].expand(g, r, n, 16), x[:, :, None].expand(g, r, n, 16))
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), klass
    with pytest.raises(ValueError, match=r"expected \[G, R, N\]"):
        mma_bf16_f32_outer(c, w[:, :2], x)
    with pytest.raises(TypeError, match="acc: expected torch.float32 with 3 dimensions"):
        mma_bf16_f32_outer(c[0], w, x)
