"""Summation models, the ``Accumulation`` record with its certified kernel bound, and the rule's acceptance
criterion (rule "Accumulation").

A :class:`SummationModel` (:data:`FP32_RN`, :data:`FP32_TRUNCATE`, :func:`block_model`) says how a kernel
evaluates a length-n reduction, as far as the error bound needs to know. An :class:`Accumulation` holds the
exact value of a batch of such reductions (computed by :mod:`.exact`, summed by :mod:`.exact_sum`) and the
bound that certifies ``|kernel fp32 value - exact| <= bound`` for every summation order the model allows;
:func:`check_accumulator` / :func:`accumulator_report` apply the rule's criterion to a kernel's fp32 values.

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

import math
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
_U64 = 2.0**-53
_EVAL_SLACK = 1.0 + 2.0**-45


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
            (:func:`.exact_sum.filtered_sums`), a bound on ``|exact - exact sum|`` (0 where the element was summed
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
