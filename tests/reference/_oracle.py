"""Plain-Python oracle for the reference tests: exact rationals (Fractions) and IEEE roundings written out.

Independent of the package: rounding to binary32 / bfloat16 is done here from the exact rational value,
and Python floats are moved in and out of binary32 with ``struct``.
"""

from __future__ import annotations

import math
import random
import struct
from fractions import Fraction

import torch


def f32(x: float) -> float:
    """The binary32 value nearest to the float64 ``x`` (struct; only used on values that are exact)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def from_f32_bits(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def exponent(a: Fraction) -> int:
    """The binade of a positive rational: the integer e with 2^e <= a < 2^(e+1)."""
    e = math.floor(math.log2(a.numerator) - math.log2(a.denominator))
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    return e


def _round(q: Fraction, mant_bits: int, mode: str = "rn") -> float:
    """Round the exact rational q to a binary format with ``mant_bits`` fraction bits and binary32's
    exponent range (min normal 2^-126, subnormals kept, overflow to inf for RN / max for RZ)."""
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    a = abs(q)
    quantum = Fraction(2) ** (max(exponent(a), -126) - mant_bits)
    n, rem = divmod(a, quantum)
    n = int(n)
    if mode == "rn":
        if rem * 2 > quantum or (rem * 2 == quantum and n % 2 == 1):
            n += 1
    elif mode != "rz":
        raise ValueError(mode)
    v = n * quantum
    top = Fraction(2) ** 128 - Fraction(2) ** (127 - mant_bits)  # largest finite value
    if v > top:
        return sign * (math.inf if mode == "rn" else float(top))
    return sign * float(v)


def rn32(q: Fraction | float) -> float:
    """RN binary32 of an exact rational (or float64; float zeros, inf and NaN pass through)."""
    if isinstance(q, float) and (q == 0 or not math.isfinite(q)):
        return q
    return _round(Fraction(q), 23)


def rz32(q: Fraction | float) -> float:
    return _round(Fraction(q), 23, "rz")


def bf16(q: Fraction | float) -> float:
    """RN bfloat16 (subnormals kept) of an exact rational or float; NaN / inf pass through."""
    if isinstance(q, float) and (q == 0 or not math.isfinite(q)):
        return q
    return _round(Fraction(q), 7)


def random_bf16(rng: random.Random, n: int, lo: int = -20, hi: int = 20) -> list[float]:
    """``n`` random bf16 values (8 significant bits, random sign) with exponents in [lo, hi)."""
    out = []
    for _ in range(n):
        m = rng.randrange(128, 256) / 128.0  # 8 significant bits
        out.append(rng.choice((-1.0, 1.0)) * m * 2.0 ** rng.randrange(lo, hi))
    return out


def t32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def tbf(values) -> torch.Tensor:
    """bf16 tensor from Python floats that are exact bf16 values (checked)."""
    t = torch.tensor(values, dtype=torch.float64)
    b = t.to(torch.bfloat16)
    ok = (b.to(torch.float64) == t) | torch.isnan(t)
    assert bool(ok.all()), "tbf: value is not a bf16 value"
    return b


# ---------------------------------------------------------------------------------------------------------
# Stand-ins for the MUFU emulation (its tables are captured on the GPU). They are simple, documented
# models (correctly rounded base + the .ftz behaviour), so tests of the rule's composition around the
# instructions can compare against a plain-Python evaluation that calls the same stand-ins.
# ---------------------------------------------------------------------------------------------------------

_TINY = 2.0**-126


def _ftz(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t.abs() < _TINY, t * 0, t)


def stub_ex2(x: torch.Tensor) -> torch.Tensor:
    r = torch.exp2(_ftz(x).to(torch.float64)).to(torch.float32)
    return torch.where(r < _TINY, torch.zeros_like(r), r)  # results below 2^-126 flush to +0


def stub_rcp(x: torch.Tensor) -> torch.Tensor:
    return _ftz(torch.ones_like(x) / _ftz(x))


def stub_rsqrt(x: torch.Tensor) -> torch.Tensor:
    return (1.0 / torch.sqrt(_ftz(x).to(torch.float64))).to(torch.float32)


def stub_expf(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x.to(torch.float64)).to(torch.float32)


def install_stub_mufu(monkeypatch) -> None:
    from flint_moe.reference import mufu

    monkeypatch.setattr(mufu, "ex2_approx_ftz", stub_ex2)
    monkeypatch.setattr(mufu, "rcp_approx_ftz", stub_rcp)
    monkeypatch.setattr(mufu, "rsqrt_approx_ftz", stub_rsqrt)
    monkeypatch.setattr(mufu, "expf_libdevice", stub_expf)


def mufu_tables_present() -> bool:
    from flint_moe.reference import mufu

    try:
        return mufu.tables_path().exists()
    except Exception:  # pragma: no cover
        return False


def scalar(fn, v: float) -> float:
    """Apply a tensor function to one fp32 value."""
    return float(fn(torch.tensor([v], dtype=torch.float32))[0])


def mul32(a: float, b: float) -> float:
    """IEEE binary32 a*b for binary32 a, b: exact rational product rounded once; zeros / inf / NaN by float
    arithmetic (float64 gives the same signs and specials)."""
    if a == 0 or b == 0 or not (math.isfinite(a) and math.isfinite(b)):
        return a * b
    return rn32(Fraction(a) * Fraction(b))


def add32(a: float, b: float) -> float:
    """IEEE binary32 a+b (exact zero sums: +0 unless both operands are -0, as float arithmetic does)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a + b
    q = Fraction(a) + Fraction(b)
    return a + b if q == 0 else rn32(q)


def div32(a: float, b: float) -> float:
    if a == 0 or b == 0 or not (math.isfinite(a) and math.isfinite(b)):
        if b == 0:
            return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
        return a / b
    return rn32(Fraction(a) / Fraction(b))
