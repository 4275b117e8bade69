"""Exact long reductions of the Flint rule and their certified error bounds (rule "Accumulation").

The length-H / length-I reductions of steps 1 (router logits), 6 (gate/up), 8 (down) and 11 (sum of squares)
are the only places where a kernel's bits depend on its summation order. For each of them the golden model
computes the exact sum (bit-exact, independent of summation order, batch size and device; returned as its
53-bit round-to-odd float64, whose binary32 rounding is RN32 of the exact sum) and a bound that certifies
``|kernel fp32 value - exact| <= bound`` for every summation order (and every documented regrouping) a
conforming kernel may use.

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

Non-finite terms (inf, NaN inputs) are taken out of the exact sum and their IEEE result (NaN, +-inf) is
derived from exact indicator counts, independent of how a BLAS treats 0 * inf. ``abs_sum`` (``S``) is
computed by a float64 matmul of the absolute values: ``Shat = S (1 + theta)``, ``|theta| <= gamma_n(2^-53)``,
and the stored value is ``Shat * (1 + 2*gamma_n(2^-53))``, an upper bound on ``S``.

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

The kernel bound (what ``bound`` certifies)
-------------------------------------------
Standard model with gradual underflow (Higham, section 2.2, eq. (2.8)): every binary32 operation returns
``op(a, b) (1 + delta) + eta`` with ``|delta| <= u``, ``|eta| <= eta0`` and ``delta * eta = 0``; additions of
binary32 numbers have ``eta = 0`` (a sum in the subnormal range is exact: Hauser, ACM TOPLAS 18(2), 1996).
``u = 2^-24, eta0 = 2^-150`` for round-to-nearest; ``u = 2^-23, eta0 = 2^-149`` for truncation (tensor-core
accumulation, rule "Accumulation"). If every term ``t_i`` reaches the result through <= ``d`` roundings and
at most ``N`` roundings can carry an ``eta``, then (Higham Lemma 3.1, ``prod (1 + delta_j) = 1 + theta_d``,
``|theta_d| <= gamma_d``)::

    |kernel - exact| <= gamma_d(u) * S + N * eta0 * (1 + gamma_d(u)),      S = sum_i |t_i|.

* plain summation of ``n`` products in any order (any tree, any split-K, FMA or not): a leaf-to-root path of
  a tree with n leaves has at most n - 1 additions, plus at most one rounding of the product (or the FMA that
  fuses it), so ``d = n`` and ``N = n``. (For round-to-nearest this is within a factor ``1/(1 - n u)`` of the
  Jeannerod-Rump bound ``n*u*S`` named by the rule; gamma_n keeps the bound rigorous with underflow.)
* block regrouping (``block = B``, e.g. NVFP4: sum ``code*x`` inside each 16-element block in any order,
  multiply the partial by the block scale, then add the ``n/B`` partials in any order): the path of a term is
  one product rounding, at most ``B - 1`` inner additions, one scale multiplication and at most ``n/B - 1``
  outer additions, so ``d = B + n/B``; ``N = n + n/B`` (products and scale multiplications).
* underflow refinement: ``eta != 0`` needs an operation whose result is in the subnormal range and inexact.
  When both factors of every product are bf16-like (at most 24 significant bits together, as for all the
  rule's dot products) a non-zero product of magnitude >= 2^-126 is exactly representable, so a subnormal
  result of a product or an FMA is then exact; and for the sum of squares (non-negative terms) a result below
  2^-126 needs a product below 2^-126. So when the smallest non-zero product (``min|a_row| * min|b_row|``,
  exact in float64) is >= 2^-126, or ``S = 0``, the plain model has ``eta = 0`` (the block model always keeps
  its eta term, since a block partial can be tiny after cancellation).

The stored ``bound`` is ``(gamma_d(u) * S + eta_term + 2^-52 * |exact|) * (1 + 2^-45)``: the kernel bound
plus the float64 error of ``exact`` (round-to-odd: below one ulp64 of ``|exact|``, 0 when the sum is a
float64), inflated to cover the few float64 roundings of the bound's own evaluation (each <= 2^-53 relative).

Overflow. The model above assumes no operation overflows. A binary32 partial sum or product of magnitude at
least ``T = 2^128 - 2^103`` rounds to inf. For plain summation every partial is a sum of rounded terms, so
no partial can reach ``(1 + gamma_d) S + eta_term``. For the block regrouping the documented order sums
``code * x`` within a block BEFORE the block scale is applied: the inner products and partials are bounded
by ``(1 + gamma_d) S_inner`` with ``S_inner = sum_h |x_h| * |E2M1(code_h)|`` (no scales), which can exceed
``S`` by the factor ``1 / min|scale|`` (e.g. 2^9 for the smallest E4M3 subnormal scale; with a zero scale an
inf partial even gives inf * 0 = NaN although the exact sum is finite). The NVFP4 path knows the codes and
records ``S_inner`` (``inner_abs_sum``, an upper bound computed like ``S``); a block model without it uses
``S_inner = S`` (a block partial is then a sum of the terms themselves). So overflow is excluded below
``(1 + gamma_d) max(S, S_inner) + eta_term`` for block models and ``(1 + gamma_d) S + eta_term`` otherwise.
Where it cannot be excluded (``overflow_possible``) a kernel's value is either within the bound or
non-finite (+-inf, or NaN from inf - inf or inf * 0), and truncating accumulation saturates, so there every
non-finite value is accepted (and, for truncation, every value): this contains the rule's "a kernel inf where
``|exact| + bound`` reaches the fp32 range is within bound", which is also applied as written.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch

from ._checks import check_tensor

__all__ = [
    "SummationModel",
    "FP32_RN",
    "FP32_TRUNCATE",
    "block_model",
    "Accumulation",
    "gamma",
    "dot_accumulate",
    "dot_accumulate_rows",
    "filtered_sums",
    "sum_squares_accumulate",
    "round_exact",
    "check_accumulator",
    "AccumulatorReport",
    "accumulator_report",
    "ulp_fp32",
    "FP32_OVERFLOW",
    "FP32_MAX",
]

#: Smallest magnitude that round-to-nearest binary32 sends to inf: 2^128 - 2^103 (max + half an ulp).
FP32_OVERFLOW = 2.0**128 - 2.0**103
#: Largest finite binary32.
FP32_MAX = 2.0**128 - 2.0**104
_FP32_MIN_NORMAL = 2.0**-126
_U64 = 2.0**-53
_EVAL_SLACK = 1.0 + 2.0**-45
#: Elements of one float64 product chunk (tokens * rows * K) in the chunked dot products (128 MiB per buffer).
_CHUNK_ELEMENTS = 1 << 24
#: Bin width of the exact summation (module docstring): K <= 2^(53 - W) terms are summed exactly.
_W = 32
_MAX_TERMS = 1 << (53 - _W)
#: Bin range: products lie in [2^-298, 2^256) (module docstring); bins b = -10 .. 8 cover them.
_LOWEST_BIT = -298


def gamma(d: int, u: float) -> float:
    """Higham's ``gamma_d(u) = d*u / (1 - d*u)`` (float64, rounded upward by one ulp); inf if ``d*u >= 1``."""
    du = d * u
    if du >= 1.0:
        return math.inf
    return math.nextafter(du / (1.0 - du), math.inf)


@dataclass(frozen=True)
class SummationModel:
    """How a kernel evaluates a length-n reduction, as far as the error bound needs to know.

    Fields:
        name: short label used in reports.
        u: unit roundoff of each binary32 rounding (2^-24 round-to-nearest, 2^-23 truncation).
        eta: absolute error of one rounding into the subnormal range (2^-150 RN, 2^-149 truncation).
        truncating: True for truncating (tensor-core) accumulation; values that may have overflowed are then
            not certified at all (truncation saturates instead of producing inf).
        block: None for plain summation in any order; B for the documented regrouping "sum B consecutive
            products in any order, multiply the partial by its block scale, add the partials in any order"
            (n must be a multiple of B).
    """

    name: str
    u: float
    eta: float
    truncating: bool = False
    block: int | None = None

    def depth(self, n: int) -> int:
        """Most roundings on the path of one term (module docstring)."""
        if self.block is None:
            return n
        return self.block + n // self.block

    def eta_count(self, n: int) -> int:
        """Most roundings that can carry an underflow error eta."""
        return n if self.block is None else n + n // self.block

    def check_length(self, n: int) -> None:
        """``ValueError`` if this model cannot describe a reduction of length n."""
        if self.block is not None and (self.block <= 0 or n % self.block):
            raise ValueError(f"model {self.name}: reduction length {n} is not a multiple of block {self.block}")


#: Plain binary32 round-to-nearest accumulation in any order (CUDA-core FMA loops, tl.sum trees, split-K).
FP32_RN = SummationModel("fp32-rn", 2.0**-24, 2.0**-150)
#: Tensor-core (wgmma) accumulation: truncating, u = 2^-23 (rule "Accumulation"). The per-operation model
#: assumes each alignment/normalisation truncation loses < 2^-23 relative to the exact sum of the operands it
#: combines; a bit-accurate model of the hardware (Khattak & Mikaitis 2025) should confirm that assumption.
FP32_TRUNCATE = SummationModel("fp32-truncate", 2.0**-23, 2.0**-149, truncating=True)


def block_model(block: int = 16, base: SummationModel = FP32_RN) -> SummationModel:
    """``base`` with the block regrouping of ``block`` consecutive terms (NVFP4: 16, one E4M3 scale each)."""
    if not isinstance(block, int) or block <= 0:
        raise ValueError(f"block: must be a positive int, got {block!r}")
    return replace(base, name=f"{base.name}-block{block}", block=block)


@dataclass(frozen=True)
class Accumulation:
    """Exact value and certified bound of a batch of length-n reductions (rule "Accumulation").

    Fields (all tensors have the same shape and device):
        exact: float64, the exact sum rounded to odd at 53 bits (equal to it whenever it is a float64;
            ``exact.to(float32)`` is RN32 of the exact sum), NaN / +-inf where IEEE gives them.
        bound: float64 >= 0, certified bound on ``|kernel binary32 value - exact|`` under ``model``
            (includes the float64 error of ``exact``; module docstring).
        abs_sum: float64, an upper bound on ``sum |t_i|`` over the finite terms.
        eta_possible: bool, where an underflow error eta cannot be excluded.
        n: the reduction length.
        model: the :class:`SummationModel` the bound was derived for.
        inner_abs_sum: float64 or None, an upper bound on ``sum |x| * |E2M1(code)|`` (the unscaled block
            partials of the NVFP4 block regrouping; module docstring "Overflow"); None where the reduction
            has no block scales (block models then use ``abs_sum``).
        exact_error: float64 or None: where ``exact`` came from the certified float64 filter
            (:func:`filtered_sums`), a bound on ``|exact - exact sum|`` (0 where the element was summed
            exactly); None = every element summed exactly (round-to-odd). Included in ``bound``.
        replay: fp32 or None: the binary32 value of a declared summation order (:mod:`.orders`,
            ``replay_dot``) where the reduction was given one; None otherwise. ``exact`` and ``bound`` do not
            depend on it (the any-order bound stays the second check).
    Derived: ``rel`` (= gamma_d(u)), ``fp64_error``, ``eta_term``, ``overflow_possible``.
    Use :meth:`with_model` for the bound of another documented summation order.
    """

    exact: torch.Tensor
    bound: torch.Tensor
    abs_sum: torch.Tensor
    eta_possible: torch.Tensor
    n: int
    model: SummationModel = field(default=FP32_RN)
    inner_abs_sum: torch.Tensor | None = None
    exact_error: torch.Tensor | None = None
    replay: torch.Tensor | None = None

    @staticmethod
    def build(
        exact: torch.Tensor,
        abs_sum: torch.Tensor,
        eta_possible: torch.Tensor,
        n: int,
        model: SummationModel,
        inner_abs_sum: torch.Tensor | None = None,
        exact_error: torch.Tensor | None = None,
    ) -> Accumulation:
        """Assemble an Accumulation, computing ``bound`` from the other fields."""
        model.check_length(n)
        bound = _bound(exact, abs_sum, eta_possible, n, model, exact_error)
        return Accumulation(exact, bound, abs_sum, eta_possible, n, model, inner_abs_sum, exact_error)

    def with_model(self, model: SummationModel) -> Accumulation:
        """Same exact values (and ``replay``), bound re-derived for ``model`` (e.g. :data:`FP32_TRUNCATE`, a
        block model)."""
        acc = Accumulation.build(
            self.exact, self.abs_sum, self.eta_possible, self.n, model, self.inner_abs_sum, self.exact_error
        )
        return acc if self.replay is None else replace(acc, replay=self.replay)

    @property
    def shape(self) -> torch.Size:
        return self.exact.shape

    @property
    def rel(self) -> float:
        """gamma_d(u): the relative coefficient of ``abs_sum`` in the kernel bound."""
        return gamma(self.model.depth(self.n), self.model.u)

    @property
    def fp64_error(self) -> torch.Tensor:
        """Bound on ``|exact - true exact sum|`` (float64): ``2^-52 |exact|`` (> the round-to-odd error,
        which is below one ulp64 of ``|exact|`` and 0 when the sum is a float64), or ``exact_error`` where
        larger (filtered elements); 0 where not finite."""
        return _fp64_error(self.exact, self.exact_error)

    @property
    def eta_term(self) -> torch.Tensor:
        """The absolute (underflow) part of the kernel bound (float64)."""
        e = self.model.eta_count(self.n) * self.model.eta * (1.0 + self.rel)
        return self.eta_possible.to(torch.float64) * e

    @property
    def overflow_possible(self) -> torch.Tensor:
        """Where a binary32 partial sum or product may have overflowed (bool). For block models this includes
        the unscaled block partials (``inner_abs_sum``; module docstring "Overflow")."""
        s = self.abs_sum
        if self.model.block is not None and self.inner_abs_sum is not None:
            s = torch.maximum(s, self.inner_abs_sum)
        reach = ((1.0 + self.rel) * s + self.eta_term) * _EVAL_SLACK
        return reach >= FP32_OVERFLOW

    def __getitem__(self, index) -> Accumulation:
        """Index every tensor field alike (e.g. ``acc[..., :I]``); n and model are kept."""
        return Accumulation(
            self.exact[index],
            self.bound[index],
            self.abs_sum[index],
            self.eta_possible[index],
            self.n,
            self.model,
            None if self.inner_abs_sum is None else self.inner_abs_sum[index],
            None if self.exact_error is None else self.exact_error[index],
            None if self.replay is None else self.replay[index],
        )


def _fp64_error(exact: torch.Tensor, exact_error: torch.Tensor | None = None) -> torch.Tensor:
    e = torch.where(torch.isfinite(exact), exact.abs(), 0.0) * 2.0**-52
    if exact_error is not None:
        e = torch.maximum(e, torch.where(torch.isfinite(exact), exact_error, 0.0))
    return e


def _bound(
    exact: torch.Tensor,
    abs_sum: torch.Tensor,
    eta_possible: torch.Tensor,
    n: int,
    model: SummationModel,
    exact_error: torch.Tensor | None = None,
) -> torch.Tensor:
    rel = gamma(model.depth(n), model.u)
    eta = model.eta_count(n) * model.eta * (1.0 + rel)
    b = rel * abs_sum + eta_possible.to(torch.float64) * eta + _fp64_error(exact, exact_error)
    return b * _EVAL_SLACK


def _s_upper(s_hat: torch.Tensor, n: int) -> torch.Tensor:
    g = gamma(n, _U64)
    if g > 0.5:  # pragma: no cover - needs n > 2^51
        raise ValueError(f"reduction length {n} too long for the float64 error model")
    return s_hat * (1.0 + 2.0 * g) * _EVAL_SLACK


def _min_nonzero_abs(t: torch.Tensor) -> torch.Tensor:
    """Per row (last dim) smallest non-zero |finite value|, inf where none (float64)."""
    a = t.abs()
    return torch.where(a > 0, a, math.inf).amin(dim=-1) if t.shape[-1] else a.new_full(t.shape[:-1], math.inf)


def _indicators(t: torch.Tensor) -> dict[str, torch.Tensor]:
    f = torch.float64
    return {
        "pinf": (t == math.inf).to(f),
        "ninf": (t == -math.inf).to(f),
        "zero": (t == 0).to(f),
        "pos": (t > 0).to(f),  # includes +inf
        "neg": (t < 0).to(f),  # includes -inf
        "nan": torch.isnan(t).any(dim=-1),
    }


def _special_values(a: dict, b: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """IEEE result class of sum_k a[m,k] * b[n,k] from exact indicator counts: (nan, +inf, -inf) masks."""

    def mm(p, q):
        return p @ q.T > 0

    inf0 = mm(a["pinf"] + a["ninf"], b["zero"]) | mm(a["zero"], b["pinf"] + b["ninf"])
    pos = mm(a["pinf"], b["pos"]) | mm(a["ninf"], b["neg"]) | mm(a["pos"], b["pinf"]) | mm(a["neg"], b["ninf"])
    neg = mm(a["pinf"], b["neg"]) | mm(a["ninf"], b["pos"]) | mm(a["pos"], b["ninf"]) | mm(a["neg"], b["pinf"])
    nan = a["nan"][:, None] | b["nan"][None, :] | inf0 | (pos & neg)
    return nan, pos & ~nan, neg & ~nan


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
    """Within the block, :func:`dot_accumulate_rows` (and so ``dot_accumulate`` and the golden model's
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """(value, error) of ``a0 @ b0^T`` (finite float64 operands whose products are exact) for one chunk.

    ``value`` is the float64 GEMM result where the interval ``value +- error`` (``error = gamma_k(2^-53) *
    s_up``, ``s_up`` >= sum |terms|) rounds to one binary32 value at both ends (then RN32 of the exact sum is
    that value: RN32 is monotonic), and the exact round-to-odd sum (error 0) elsewhere. All-zero-term
    elements (``s_up == 0``) give +0 with error 0 (the caller fixes -0).
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

        ex = _exact_sum_terms(terms, int(t_idx.numel()), (), pmax, pmin, bits, max(1, _CHUNK_ELEMENTS // max(k, 1)))
        approx = approx.index_put((t_idx, r_idx), ex)
        err = err.index_put((t_idx, r_idx), torch.zeros_like(ex))
    return approx, err


def _chunk_rows(k: int, m: int, device: torch.device, filtered: bool) -> int:
    """Rows of B per chunk of :func:`dot_accumulate_rows`. Exact summation materialises [m, rows, K] products:
    rows = 2^24 / (m K). The filter materialises only [rows, K] operands (its exact fallback works on the few
    ambiguous elements, :func:`_filtered_chunk`): rows = 2^24 / K, and 4x that on a CUDA device (a few buffers
    of 512 MiB), so a real layer's expert is one or two chunks instead of one per few rows. The values never
    depend on the chunking."""
    if filtered:
        return max(1, (_CHUNK_ELEMENTS * (4 if device.type == "cuda" else 1)) // max(k, 1))
    return max(1, _CHUNK_ELEMENTS // max(k * m, 1))


def _check_terms(k: int, name: str) -> None:
    if k > _MAX_TERMS:
        raise ValueError(f"{name}: reduction length {k} exceeds {_MAX_TERMS} (exact summation limit)")


def dot_accumulate_rows(
    a: torch.Tensor,
    rows: Callable[[int, int], torch.Tensor],
    n_rows: int,
    *,
    model: SummationModel = FP32_RN,
    narrow_products: bool = True,
    name: str = "a",
) -> Accumulation:
    """Exact ``a @ B^T`` where the rows of B [n_rows, K] are produced on demand, a chunk at a time.

    Args:
        a: bf16 or fp32 [M, K], the activations.
        rows: ``rows(start, stop)`` returns float64 [stop - start, K] holding binary32-representable values
            (the chunk of B), or a tuple ``(values, all_finite: bool, row_min)`` where ``row_min`` float64
            [stop - start] is a lower bound on each row's smallest non-zero |value| (saves two passes), or
            ``(values, all_finite, row_min, inner_abs)`` for block-scaled weights, ``inner_abs`` float64
            [stop - start, K] the unscaled |E2M1| values (recorded as ``inner_abs_sum``); called for
            consecutive chunks of rows (:func:`_chunk_rows`: 2^24 / (M K) rows; under the filter 2^24 / K rows,
            4x that on CUDA; memory: a few float64 buffers of that many elements).
        n_rows: number of rows N of B.
        model: the kernel's summation model (default :data:`FP32_RN`).
        narrow_products: True when every product of an ``a`` value and a B value has at most 24 significant
            bits (bf16 x bf16, bf16 x E2M1*E4M3), enabling the underflow refinement (module docstring).
        name: tensor name used in errors.
    Returns:
        :class:`Accumulation` of shape [M, N], on ``a``'s device.
    Raises:
        TypeError / ValueError naming ``name`` (dtype, rank), ValueError if K does not fit ``model`` or
        exceeds 2^21.
    """
    check_tensor(name, a, dtype=(torch.bfloat16, torch.float32), ndim=2)
    m, k = a.shape
    model.check_length(k)
    _check_terms(k, name)
    bits = 24 if narrow_products else 48
    a64 = a.to(torch.float64)
    a_fin = torch.isfinite(a64)
    a_all_finite = bool(a_fin.all())
    a0 = torch.where(a_fin, a64, 0.0)
    a_abs = a0.abs()
    a_max = a_abs.amax(dim=-1) if k else a_abs.new_zeros(m)
    a_min = _min_nonzero_abs(a0)
    a_neg = torch.signbit(a0).to(torch.float64)
    a_ind = None if a_all_finite else _indicators(a64)
    use_filter = _FILTER.get()
    chunk = _chunk_rows(k, m, a.device, use_filter and a_all_finite)
    exact_parts, s_parts, eta_parts, inner_parts, err_parts = [], [], [], [], []
    for start in range(0, n_rows, chunk):
        stop = min(n_rows, start + chunk)
        got = rows(start, stop)
        inner_abs = None
        # a tuple: (values, all finite, lower bound on each row's smallest |value|[, inner |E2M1| values])
        if isinstance(got, tuple):
            b64, b_all_finite, b_min = got[:3]
            if len(got) > 3:
                inner_abs = got[3]
        else:
            b64, b_all_finite, b_min = got, None, None
        if b_all_finite is None:
            b_all_finite = bool(torch.isfinite(b64).all())
        b0 = b64 if b_all_finite else torch.where(torch.isfinite(b64), b64, 0.0)
        b_abs = b0.abs()
        b_min = _min_nonzero_abs(b0) if b_min is None else b_min
        s_hat = a_abs @ b_abs.T
        if inner_abs is not None:
            inner_parts.append(a_abs @ inner_abs.T)
        if narrow_products and model.block is None:
            tiny = (a_min[:, None] * b_min[None, :]) < _FP32_MIN_NORMAL
            eta = tiny & (s_hat > 0)
        else:
            eta = s_hat > 0
        # exact sums: products a[t, k] * b[r, k] (exact in float64), token blocks of <= 2^24 products
        b_max = b_abs.amax() if k else b_abs.new_zeros(())
        b_lower = b_min.amin() if b_min.numel() else b_abs.new_full((), math.inf)
        rows_k = (stop - start) * k

        def terms(i: int, j: int, s: float, b0=b0) -> torch.Tensor:
            return a0[i:j, None, :] * (b0 * s)[None]

        if use_filter and a_all_finite and b_all_finite:
            ex, ex_err = _filtered_chunk(a0, b0, _s_upper(s_hat, k), k, a_max, a_min, b_min, bits)
        else:
            ex = _exact_sum_terms(
                terms,
                m,
                (stop - start,),
                a_max * b_max,
                a_min * b_lower,
                bits,
                max(1, _CHUNK_ELEMENTS // max(rows_k, 1)),
            )
            ex_err = torch.zeros_like(ex)
        zero_sum = s_hat == 0
        if bool(zero_sum.any()):  # all terms are zeros: -0 iff every product is -0 (IEEE, any order)
            b_neg = torch.signbit(b0).to(torch.float64)
            n_neg = a_neg @ (1.0 - b_neg).T + (1.0 - a_neg) @ b_neg.T
            ex = torch.where(zero_sum & (n_neg == k) & (k > 0), -0.0, ex)
        if not (a_all_finite and b_all_finite):
            ai = a_ind if a_ind is not None else _indicators(a64)
            nan, pinf, ninf = _special_values(ai, _indicators(b64))
            ex = torch.where(nan, math.nan, torch.where(pinf, math.inf, torch.where(ninf, -math.inf, ex)))
        exact_parts.append(ex)
        err_parts.append(ex_err)
        s_parts.append(s_hat)
        eta_parts.append(eta)
        del b64, b0, b_abs
    inner = None
    exact_error = None
    if exact_parts:
        exact = torch.cat(exact_parts, dim=1)
        s_hat = torch.cat(s_parts, dim=1)
        eta = torch.cat(eta_parts, dim=1)
        if len(inner_parts) == len(exact_parts):
            inner = _s_upper(torch.cat(inner_parts, dim=1), k)
        if use_filter:
            exact_error = torch.cat(err_parts, dim=1)
    else:
        exact = a64.new_zeros((m, 0))
        s_hat = exact.clone()
        eta = torch.zeros((m, 0), dtype=torch.bool, device=a.device)
    return Accumulation.build(exact, _s_upper(s_hat, k), eta, k, model, inner, exact_error)


def dot_accumulate(
    a: torch.Tensor, b: torch.Tensor, *, model: SummationModel = FP32_RN, a_name: str = "a", b_name: str = "b"
) -> Accumulation:
    """Exact ``a @ b^T``: a bf16 or fp32 [M, K], b bf16 or fp32 [N, K] -> :class:`Accumulation` [M, N].

    The rule's reductions 1 (x . Wr^T), 6 and 8 (BF16 experts), exact (module docstring) with the certified
    bound of ``model``. Raises TypeError / ValueError naming ``a_name`` / ``b_name`` (dtype, rank, K
    mismatch, device).
    """
    check_tensor(a_name, a, dtype=(torch.bfloat16, torch.float32), ndim=2)
    check_tensor(b_name, b, dtype=(torch.bfloat16, torch.float32), shape=(None, a.shape[1]))
    if a.device != b.device:
        raise ValueError(f"{b_name}: on {b.device}, but {a_name} is on {a.device}")
    narrow = a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16

    def rows(i: int, j: int) -> torch.Tensor:
        return b[i:j].to(torch.float64)

    return dot_accumulate_rows(a, rows, b.shape[0], model=model, narrow_products=narrow, name=a_name)


def sum_squares_accumulate(s: torch.Tensor, *, model: SummationModel = FP32_RN, name: str = "s") -> Accumulation:
    """Exact ``sum_h s[m, h]^2`` (rule step 11) for fp32 ``s`` [M, H] -> :class:`Accumulation` [M].

    Each square is exact in float64 (48 bits, exponent >= -298); the sum is exact (module docstring), +0 for
    an all-zero row. NaN -> NaN, inf -> +inf (IEEE). Raises TypeError / ValueError naming ``name``.
    """
    check_tensor(name, s, dtype=torch.float32, ndim=2)
    m, h = s.shape
    model.check_length(h)
    _check_terms(h, name)
    s64 = s.to(torch.float64)
    sq = s64 * s64
    fin = torch.where(torch.isfinite(sq), sq, 0.0)
    s_hat = fin.sum(dim=-1)
    sq_min = _min_nonzero_abs(fin)
    if h:

        def terms(i: int, j: int, sc: float) -> torch.Tensor:
            return fin[i:j] * sc

        exact = _exact_sum_terms(terms, m, (), fin.amax(dim=-1), sq_min, 48, max(1, _CHUNK_ELEMENTS // h))
    else:
        exact = s_hat.clone()
    exact = torch.where(
        torch.isnan(sq).any(dim=-1), math.nan, torch.where(torch.isinf(sq).any(dim=-1), math.inf, exact)
    )
    if model.block is None:
        eta = (sq_min < _FP32_MIN_NORMAL) & (s_hat > 0)
    else:
        eta = s_hat > 0
    return Accumulation.build(exact, _s_upper(s_hat, h), eta, h, model)


def round_exact(stage: str, acc: Accumulation, operands: object = None) -> torch.Tensor:
    """Default accumulate policy: RN32 (binary32 round-to-nearest-even, subnormals kept) of the exact sum.

    ``acc.exact`` is the exact sum rounded to odd at 53 bits, so its one binary32 rounding is RN32 of the
    exact sum (module docstring); independent of summation order, batch size and device.
    Policy signature used by :mod:`.model`: ``policy(stage, acc, operands) -> fp32`` of ``acc.shape``.
    ``operands`` (a dict of the reduction's inputs) lets other policies replay a kernel's summation order.
    """
    return acc.exact.to(torch.float32)


# ---------------------------------------------------------------------------------------------------------
# The rule's acceptance criterion
# ---------------------------------------------------------------------------------------------------------


def _two_diff(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Knuth's TwoSum of a and -b in float64: (d, err) with a - b = d + err exactly (finite, no overflow)."""
    d = a - b
    bb = d - a
    err = (a - (d - bb)) + (-b - bb)
    return d, err


def _within(k64: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Exact test of ``|k - exact| <= bound`` for finite float64 operands (no rounding can flip it).

    With ``d = RN(k - exact)`` and the exact remainder ``err``: RN is monotonic and ``bound`` is a float64, so
    ``|d| < bound`` implies ``|k - exact| <= bound``, ``|d| > bound`` implies ``> bound``; at ``|d| == bound``
    the sign of ``err`` decides.
    """
    d, err = _two_diff(k64, exact)
    ad = d.abs()
    return (ad < bound) | ((ad == bound) & (err * torch.sign(d) <= 0))


def _check_pair(kernel_value: torch.Tensor, acc: Accumulation, name: str) -> torch.Tensor:
    if not isinstance(acc, Accumulation):
        raise TypeError(f"acc: expected an Accumulation, got {type(acc).__name__}")
    check_tensor(name, kernel_value, dtype=torch.float32, shape=tuple(acc.exact.shape))
    if kernel_value.device != acc.exact.device:
        raise ValueError(f"{name}: on {kernel_value.device}, but acc is on {acc.exact.device}")
    return kernel_value.to(torch.float64)


def check_accumulator(kernel_value: torch.Tensor, acc: Accumulation, *, name: str = "kernel_value") -> torch.Tensor:
    """Rule "Accumulation" criterion: bool mask, True where the kernel's fp32 value conforms.

    * exact NaN: the kernel value must be NaN (positions match; NaN bits are not compared);
    * exact +-inf: the same inf (or NaN where ``acc.overflow_possible``);
    * exact finite: ``|kernel - exact| <= bound`` (tested exactly; an exact zero sum therefore accepts +0 and
      -0); a kernel inf where ``|exact| + bound`` reaches the fp32 overflow threshold 2^128 - 2^103; any
      non-finite value where ``acc.overflow_possible`` (any value at all for truncating models).
    Args: ``kernel_value`` fp32 of ``acc.shape`` on ``acc``'s device. Raises TypeError / ValueError naming it.
    """
    k64 = _check_pair(kernel_value, acc, name)
    e = acc.exact
    ovf = acc.overflow_possible
    k_fin = torch.isfinite(k64)
    k_nan = torch.isnan(k64)
    e_nan = torch.isnan(e)
    e_inf = torch.isinf(e)
    fin_both = k_fin & torch.isfinite(e)
    within = _within(torch.where(fin_both, k64, 0.0), torch.where(fin_both, e, 0.0), acc.bound) & fin_both
    rule_inf = torch.isinf(k64) & ((e.abs() + acc.bound) * _EVAL_SLACK >= FP32_OVERFLOW)
    ok_finite = within | rule_inf | (~k_fin & ovf)
    if acc.model.truncating:
        ok_finite = ok_finite | ovf
    ok_inf = (k64 == e) | (k_nan & ovf)
    return torch.where(e_nan, k_nan, torch.where(e_inf, ok_inf, ok_finite))


def ulp_fp32(x: torch.Tensor) -> torch.Tensor:
    """Spacing of binary32 numbers at |x| (float64 in, float64 out): 2^(floor(log2|x|) - 23), >= 2^-149."""
    _, e = torch.frexp(x.to(torch.float64).abs())
    u = torch.ldexp(torch.ones_like(x, dtype=torch.float64), (e - 24).to(torch.int32))
    return torch.clamp(torch.where(torch.isfinite(x), u, 2.0**104), min=2.0**-149)


@dataclass(frozen=True)
class AccumulatorReport:
    """Per-element outcome of :func:`check_accumulator` for the harness.

    Fields:
        ok: bool mask (acc's shape). violations: number of False elements.
        nan_mismatch: elements where exactly one of (kernel, exact) is NaN.
        excess_ulps: float64, ``max(0, |kernel - exact| - bound)`` in binary32 ulps of ``exact`` where both
            are finite, inf at other violations, 0 where ok.
        worst_excess_ulps: the maximum of ``excess_ulps`` (0.0 if none); worst_index: its index or None.
        overflow_possible: number of elements whose bound is not certified against overflow.
        model: name of the summation model.
    """

    ok: torch.Tensor
    violations: int
    nan_mismatch: int
    excess_ulps: torch.Tensor
    worst_excess_ulps: float
    worst_index: tuple[int, ...] | None
    overflow_possible: int
    model: str


def accumulator_report(
    kernel_value: torch.Tensor, acc: Accumulation, *, name: str = "kernel_value"
) -> AccumulatorReport:
    """Check ``kernel_value`` against ``acc`` (see :func:`check_accumulator`) and summarise per element."""
    ok = check_accumulator(kernel_value, acc, name=name)
    k64 = kernel_value.to(torch.float64)
    e = acc.exact
    fin = torch.isfinite(k64) & torch.isfinite(e)
    excess = torch.clamp((k64 - e).abs() - acc.bound, min=0.0) / ulp_fp32(e)
    excess = torch.where(ok, 0.0, torch.where(fin, excess, math.inf))
    nan_mm = torch.isnan(k64) ^ torch.isnan(e)
    violations = int((~ok).sum())
    worst, idx = 0.0, None
    if violations:
        flat = int(torch.argmax(excess.reshape(-1)))
        worst = float(excess.reshape(-1)[flat])
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), excess.shape))
    return AccumulatorReport(
        ok,
        violations,
        int(nan_mm.sum()),
        excess,
        worst,
        idx,
        int(acc.overflow_possible.sum()),
        acc.model.name,
    )
