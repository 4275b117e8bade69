"""Exact summation of binary32 products and the certified float64 filter (rule "Accumulation").

:func:`_exact_sum_terms` sums blocks of terms exactly and returns each sum rounded to odd at 53 bits (a float64
whose binary32 rounding is RN32 of the exact sum); :func:`filtered_sums` switches :mod:`.exact`'s dot products
to the certified float64 filter (:func:`_filtered_chunk`), which gives the same RN32 values and acceptance
decisions much faster. The reductions that use them, and the bound they feed, are in :mod:`.exact` and
:mod:`.accumulation`.

How the exact value is computed (bit-exact, order- and batch-independent)
------------------------------------------------------------------------
Every term is a product of two values representable in binary32 (bf16 activations or weights, dequantized
NVFP4 weights ``E2M1 * E4M3`` which have at most 6 significant bits, fp32 ``s`` for the sum of squares):

* significands: at most 24 + 24 = 48 bits <= 53, so each product is exact in float64 unless it leaves
  float64's normal range;
* exponents: a non-zero binary32 value lies in [2^-149, 2^128), so a product lies in [2^-298, 2^256): far
  inside float64's normal range [2^-1022, 2^1024). Products never underflow or overflow in float64;
* every product is a multiple of 2^-298 (each factor is a multiple of 2^-149), and a product p with
  2^e <= |p| < 2^(e+1) is a multiple of 2^(e+1-bits), ``bits`` = 48 (24 when both factors are bf16-like).

The products are formed elementwise in float64 (exact), a chunk of rows at a time, and summed exactly by
fixed-exponent binning with ``W = 32``: ``hi_b(p) = trunc(p * 2^(-W b)) * 2^(W b)`` (exact: power-of-two
scaling and trunc are exact here), ``q_b = hi_b(p) - hi_{b+1}(p)``, so ``p = sum_b q_b`` exactly. ``q_b`` is
a multiple of 2^(W b) with ``|q_b| < 2^(W (b+1))``; for ``K <= 2^21`` terms the row sum of ``q_b`` is a
multiple of 2^(W b) below 2^(W b + 53) in magnitude, as is every partial sum, so ANY float64 summation order
(torch.sum, any device, any blocking) returns it exactly. The bins run from the one holding the largest
possible product (``max|a| * max|b|`` of the chunk) down to the one holding the lowest possible set bit
(``min nonzero |a| * min nonzero |b| * 2^(1-bits)``, at least 2^-298); the lowest bin takes the whole
remainder, an integer multiple of its unit. In the implementation the running remainder is kept scaled by
``2^(-W b)`` (``y``): digit sum ``d_b = sum trunc(y)`` (an integer below 2^53), then ``y = frac(y) * 2^W``.

The integer digits ``d_b`` (int64, exact) are normalised in base 2^32 from the lowest bin up (arithmetic
shift carries), which gives the sign of the total; the magnitude's digits are then all in [0, 2^32). From the
highest non-zero digit and the two below it a 63-bit window ``Y`` (leading bit at 2^62) and a sticky bit (any
lower bit set) give

* ``exact`` = RO53(sum): the round-to-odd of the exact sum to 53 bits (``Z = Y >> 10``, its last bit ORed
  with the sticky bits), an ordinary float64 (``Z * 2^e``, exact, normal range). It equals the exact sum
  whenever that is a float64, otherwise it is the neighbour with an odd last bit, so
  ``|exact - sum| < ulp64(exact) <= 2^-52 |exact|`` (``fp64_error``; round-to-odd never leaves the binade
  of the exact sum, so ulp64 is the same on both sides).
* ``round_exact`` = ``fp32(exact)``, one round-to-nearest-even to binary32 (torch's float64 -> float32
  cast; subnormals kept, overflow to inf at 2^128 - 2^103, ties to even; tests/reference/test_exact.py checks
  the cast on every boundary). This is RN32(sum) exactly (Boldo & Melquiond, IEEE TC 57(4), 2008, for
  53 >= 24 + 2): let ``x > 0`` be the exact sum and ``P`` the set of binary32 values, binary32 midpoints and
  the overflow threshold. Every point of ``P`` in the binade [2^e, 2^(e+1)) of x is a multiple of
  ``2 * ulp53(x) = 2^(e-51)``: normal-range points have at most 25 significant bits, subnormal-range points
  are multiples of 2^-150 and there ``e <= -127``. If x is a float64 then exact = x. Otherwise exact is the
  neighbour of x on the 53-bit grid whose last bit is odd, so it is not a multiple of 2^(e-51) and hence not
  in P; and no point of P lies strictly between x and exact (they are adjacent 53-bit grid points, the
  upper one 2^(e+1) being even). So x and exact lie strictly inside the same gap between consecutive points
  of P, where RN32 is constant: RN32(exact) = RN32(x). Negative sums by symmetry.
* the sign of an exact zero: -0 when every term is -0 (what IEEE gives in any order), else +0 (the rule:
  "an exact sum of zero may come out as +0 or -0"; the checker accepts both).

The float64 filter (``filtered_sums``; used by the conformance harness on real layer shapes)
-------------------------------------------------------------------------------------------
Exact summation costs a few float64 passes per 32-bit bin over every product. Inside ``filtered_sums()``
each chunk first takes one float64 GEMM ``G = a @ b^T`` (the products are exact in float64, so any BLAS
summation order obeys the standard model: ``|G - sum| <= gamma_K(2^-53) * S``, ``S <= _s_upper(Shat)``).
Where both ends of ``G +- err`` (widened by one ulp64) round to the same binary32 value, RN32 of the exact sum
is that value (RN is monotonic), so ``G`` is kept with ``exact_error = err``; everywhere else (sums near a
binary32 rounding boundary or an exact zero after cancellation; on real data about one element in 10^3) the
exact round-to-odd sum above is computed for that element alone (``exact_error = 0``). Consequences:
``round_exact`` (RN32) is bit-identical to the exact path; ``bound`` adds ``exact_error`` as it adds the
round-to-odd error, so a conforming kernel still always passes and the test is loose by at most
``2 * gamma_K(2^-53) * S`` (about 10^-9 of the kernel bound at K = 7168); ``exact`` itself is no longer
bit-reproducible across batch sizes (its RN32 is). Non-finite inputs always take the exact path. The BLAS
float64 GEMM must be an IEEE one (cuBLAS DGEMM on Hopper, MKL/OpenBLAS on the CPU; not an emulated FP64).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator

import torch

from .accumulation import _EVAL_SLACK, _U64, gamma

__all__ = ["filtered_sums"]

#: Bin width of the exact summation (module docstring): K <= 2^(53 - W) terms are summed exactly.
_W = 32
_MAX_TERMS = 1 << (53 - _W)
#: Bin range: products lie in [2^-298, 2^256) (module docstring); bins b = -10 .. 8 cover them.
_LOWEST_BIT = -298

# ---------------------------------------------------------------------------------------------------------
# Exact summation (module docstring "How the exact value is computed")
# ---------------------------------------------------------------------------------------------------------

_MASK = (1 << _W) - 1


def _bin_range(pmax: float, pmin: float, bits: int) -> tuple[int, int]:
    """(lowest, highest) bin b for products with ``|p| <= pmax``, non-zero ``|p| >= pmin``, each with at most
    ``bits`` significant bits: every product is below 2^(W (highest + 1)) and a multiple of 2^(W lowest)."""
    top = (math.frexp(pmax)[1] - 1) // _W  # pmax < 2^E with E = frexp exponent; need W (top + 1) >= E
    # |p| >= pmin >= 2^(E' - 1) -> its lowest set bit is >= 2^(E' - 1 - (bits - 1)); and >= 2^-298 always
    low_bit = max(math.frexp(pmin)[1] - bits, _LOWEST_BIT) if math.isfinite(pmin) else _LOWEST_BIT
    return min(low_bit // _W, top), top


def _bin_digits(y: torch.Tensor, nbins: int) -> torch.Tensor:
    """Exact digit sums of the bins of ``y`` [..., K] (overwritten).

    ``y`` holds the terms scaled by 2^(-W top) (so ``|y| < 2^W``), each a multiple of 2^(-W (nbins - 1)).
    Returns int64 [..., nbins], index 0 = lowest bin: ``d_j = sum_k trunc-digit_j(y_k)``, each an integer
    below 2^(W + 21) <= 2^53 in magnitude, so every float64 partial sum of it is exact in any order.
    """
    digits = []
    t = torch.empty_like(y) if nbins > 1 else None
    for _ in range(nbins - 1):
        torch.trunc(y, out=t)
        digits.append(t.sum(dim=-1))
        y.frac_()  # y - trunc(y): exact
        y.mul_(2.0**_W)  # exact; |y| < 2^W again
    digits.append(y.sum(dim=-1))  # the lowest bin: integers (lowest set bits are >= its unit)
    return torch.stack(digits[::-1], dim=-1).to(torch.int64)


def _normalise(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Base-2^W carry normalisation from the lowest digit up: (digits in [0, 2^W), signed top carry)."""
    carry = torch.zeros_like(d[..., 0])
    out = []
    for j in range(d.shape[-1]):
        v = d[..., j] + carry  # |v| < 2^53 + 2^22: no int64 overflow
        out.append(v & _MASK)
        carry = v >> _W  # arithmetic shift: floor division
    return torch.stack(out, dim=-1), carry


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as float64 for int64 ``e`` in [-1022, 1023], assembled from its bits (exact on every device)."""
    return ((e + 1023) << 52).view(torch.float64)


def _round_odd53(d: torch.Tensor, b_lo: int) -> torch.Tensor:
    """``sum_j d[..., j] * 2^(W (b_lo + j))`` (int64 digits, ``|d| < 2^53``), rounded to odd at 53 bits.

    Zero gives +0. The result equals the sum when that is a float64, else it is the neighbouring float64 with
    an odd last bit (module docstring: its binary32 rounding is RN32 of the sum).
    """
    digits, carry = _normalise(d)
    neg = carry < 0  # the digits are >= 0 and below 2^(W nbins): the carry has the total's sign
    if bool(neg.any()):
        digits, carry = _normalise(torch.where(neg[..., None], -d, d))
    zero = torch.zeros_like(carry)[..., None]
    # magnitude digits: e[..., i] has weight 2^(W (b_lo + i - 2)); two zero digits below keep a 3-digit window
    e = torch.cat([zero, zero, digits, carry[..., None]], dim=-1)
    nz = e != 0
    idx = torch.arange(e.shape[-1], device=e.device)
    is_zero = ~nz.any(dim=-1)
    top = torch.clamp(torch.where(nz, idx, 0).amax(dim=-1), min=2)  # highest non-zero digit (>= 2)

    def at(i: torch.Tensor) -> torch.Tensor:
        return e.gather(-1, i[..., None]).squeeze(-1)

    hi = torch.where(is_zero, 1, at(top))
    mid, lo = at(top - 1), at(top - 2)
    below = (nz & (idx < (top - 2)[..., None])).any(dim=-1)  # any set bit under the window
    length = torch.frexp(hi.to(torch.float64)).exponent.to(torch.int64)  # bit length L of hi, 1..W
    # X = hi 2^64 + mid 2^32 + lo has 64 + L bits; Y = X >> (L + 1) has exactly 63 (leading bit 2^62)
    one = torch.ones_like(hi)
    mid_part = torch.where(length <= 31, mid << torch.clamp(31 - length, min=0), mid >> 1)
    y = (hi << (63 - length)) | mid_part | (lo >> (length + 1))
    lost = (lo & ((one << (length + 1)) - 1)) | torch.where(length == 32, mid & 1, 0)
    sticky = (lost != 0) | below | ((y & 1023) != 0)
    z = (y >> 10) | sticky.to(torch.int64)  # round to odd: 53 bits, [2^52, 2^53)
    scale = _pow2(_W * (b_lo + top - 4) + length + 11)  # weight of lo is 2^(W (b_lo + top - 4))
    val = z.to(torch.float64) * scale  # exact: z < 2^53 and the result is a normal float64
    val = torch.where(neg, -val, val)
    return torch.where(is_zero, 0.0, val)


def _exact_sum_terms(
    terms: Callable[[int, int, float], torch.Tensor],
    n_lead: int,
    rest: tuple[int, ...],
    pmax: torch.Tensor,
    pmin: torch.Tensor,
    bits: int,
    step: int,
) -> torch.Tensor:
    """Exact sums (round-to-odd float64) of term blocks along the last dim.

    ``terms(i, j, s)`` returns a fresh float64 tensor [j - i, ..., K] of the finite terms of leading rows
    i..j times ``s`` (a power of two; exact); ``rest``: the result shape after the leading dim. ``pmax`` /
    ``pmin`` [n_lead]: upper bound on |term| / lower bound on non-zero |term| per leading row (products of
    binary32 values: exact float64). Leading rows are processed ``step`` at a time (bounded memory); the
    value of a sum never depends on the blocking.
    """
    parts = []
    for i in range(0, n_lead, step):
        j = min(n_lead, i + step)
        hi_p = float(pmax[i:j].max())
        if hi_p == 0.0:
            parts.append(pmax.new_zeros((j - i, *rest)))  # all terms zero: +0 (callers fix -0)
            continue
        b_lo, b_hi = _bin_range(hi_p, float(pmin[i:j].min()), bits)
        y = terms(i, j, 2.0 ** (-_W * b_hi))
        parts.append(_round_odd53(_bin_digits(y, b_hi - b_lo + 1), b_lo))
        del y
    return torch.cat(parts, dim=0)


# ---------------------------------------------------------------------------------------------------------
# Certified float64 filter (module docstring "The float64 filter")
# ---------------------------------------------------------------------------------------------------------

_FILTER = contextvars.ContextVar("flint_moe_exact_filter", default=False)


@contextlib.contextmanager
def filtered_sums(enabled: bool = True) -> Iterator[None]:
    """Within the block, :func:`.exact.dot_accumulate_rows` (and so ``dot_accumulate`` and the golden model's
    gate/up, down and router reductions) uses the certified float64 filter for finite inputs: one float64
    GEMM per chunk, exact summation only for the elements whose binary32 rounding the GEMM's certified
    error cannot decide. ``round_exact`` and ``check_accumulator`` give the same answers as without the
    filter (module docstring "The float64 filter"); ``exact`` is then within ``exact_error`` of the exact sum
    instead of its round-to-odd value. Used by the conformance harness (real layer shapes on the GPU)."""
    token = _FILTER.set(bool(enabled))
    try:
        yield
    finally:
        _FILTER.reset(token)


def _rn32_bits(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).view(torch.int32)


def _filtered_chunk(
    a0: torch.Tensor,
    b0: torch.Tensor,
    s_up: torch.Tensor,
    k: int,
    a_max: torch.Tensor,
    a_min: torch.Tensor,
    b_min: torch.Tensor,
    bits: int,
    step: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, error) of ``a0 @ b0^T`` (finite float64 operands whose products are exact) for one chunk.

    ``value`` is the float64 GEMM result where the interval ``value +- error`` (``error = gamma_k(2^-53) *
    s_up``, ``s_up`` >= sum |terms|) rounds to one binary32 value at both ends (then RN32 of the exact sum is
    that value: RN32 is monotonic), and the exact round-to-odd sum (error 0) elsewhere. All-zero-term
    elements (``s_up == 0``) give +0 with error 0 (the caller fixes -0). The ambiguous elements are summed
    exactly ``step`` at a time (bounded memory; the values never depend on it).
    """
    approx = a0 @ b0.T
    zero = s_up == 0
    approx = torch.where(zero, 0.0, approx)
    err = s_up * (gamma(k, _U64) * _EVAL_SLACK)
    inf = torch.full((), math.inf, dtype=approx.dtype, device=approx.device)  # a fill, not a host copy
    lo = torch.nextafter(approx - err, -inf)
    hi = torch.nextafter(approx + err, inf)
    ambiguous = (_rn32_bits(lo) != _rn32_bits(hi)) & ~zero
    err = torch.where(zero, 0.0, err)
    if bool(ambiguous.any()):
        t_idx, r_idx = ambiguous.nonzero(as_tuple=True)
        b_abs_max = b0.abs().amax(dim=-1)
        pmax = a_max[t_idx] * b_abs_max[r_idx]
        pmin = a_min[t_idx] * b_min[r_idx]

        def terms(i: int, j: int, sc: float) -> torch.Tensor:
            return a0[t_idx[i:j]] * (b0[r_idx[i:j]] * sc)

        ex = _exact_sum_terms(terms, int(t_idx.numel()), (), pmax, pmin, bits, step)
        approx = approx.index_put((t_idx, r_idx), ex)
        err = err.index_put((t_idx, r_idx), torch.zeros_like(ex))
    return approx, err
