"""Exact long reductions of the Flint rule and their certified error bounds (rule "Accumulation").

The length-H / length-I reductions of steps 1 (router logits), 6 (gate/up), 8 (down) and 11 (sum of squares)
are the only places where a kernel's bits depend on its summation order. For each of them the golden model
computes the exact value in float64 and a bound that certifies ``|kernel fp32 value - exact| <= bound``
for every summation order (and every documented regrouping) a conforming kernel may use.

Why the float64 value is (nearly) exact, and how its own error is bounded
-------------------------------------------------------------------------
Every term is a product of two values representable in binary32 (bf16 activations or weights, dequantized
NVFP4 weights ``E2M1 * E4M3`` which have at most 6 significant bits, fp32 ``s`` for the sum of squares):

* significands: at most 24 + 24 = 48 bits <= 53, so each product is exact in float64 unless it leaves
  float64's normal range;
* exponents: a non-zero binary32 value lies in [2^-149, 2^128), so a product lies in [2^-298, 2^256): far
  inside float64's normal range [2^-1022, 2^1024). Products never underflow or overflow in float64.

Hence every term is computed exactly, and every partial sum is a multiple of 2^-298 with magnitude below
n * 2^256: float64 never underflows (a sum of multiples of 2^-298 is either 0 or >= 2^-298 > 2^-1022) nor
overflows (n < 2^700). The only error of the float64 value is the rounding of the additions of the float64
matmul / sum (any order, with or without FMA): Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed,
Lemma 3.1 / eq. (3.4) for any summation tree: ``|exact64 - exact| <= gamma_n(2^-53) * sum|t_i|`` with
``gamma_n(u) = n*u / (1 - n*u)``. ``sum|t_i|`` is itself computed in float64 from non-negative exact
terms, so ``Shat = S (1 + theta)``, ``|theta| <= gamma_n(2^-53)``, and ``S <= Shat * (1 + 2*gamma_n(2^-53))``
(valid while ``gamma_n <= 1/2``). Non-finite terms (inf, NaN inputs) are taken out of the matmuls and their
IEEE result (NaN, +-inf) is derived from exact indicator counts, independent of how a BLAS treats 0 * inf.

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

The stored ``bound`` is ``(gamma_d(u) * S + eta_term + gamma_n(2^-53) * S) * (1 + 2^-45)``: the kernel bound
plus the float64 error of ``exact``, inflated to cover the few float64 roundings of the bound's own
evaluation (each <= 2^-53 relative).

Overflow. The model above assumes no operation overflows. A binary32 partial sum or product of magnitude at
least ``T = 2^128 - 2^103`` rounds to inf; no partial can reach ``(1 + gamma_d) S + eta_term``, so below that
the bound holds. Where it cannot be excluded (``overflow_possible``) a kernel's value is either within the
bound or non-finite (+-inf, or NaN from inf - inf), and truncating accumulation saturates, so there every
non-finite value is accepted (and, for truncation, every value): this contains the rule's "a kernel inf where
``|exact| + bound`` reaches the fp32 range is within bound", which is also applied as written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
#: Elements of one float64 weight chunk (rows * K) in the chunked dot products (128 MiB per buffer).
_CHUNK_ELEMENTS = 1 << 24


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
            raise ValueError(
                f"model {self.name}: reduction length {n} is not a multiple of block {self.block}"
            )


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
        exact: float64, the float64 evaluation of the exact sum (NaN / +-inf where IEEE gives them).
        bound: float64 >= 0, certified bound on ``|kernel binary32 value - exact|`` under ``model``
            (includes the float64 error of ``exact``; module docstring).
        abs_sum: float64, an upper bound on ``sum |t_i|`` over the finite terms.
        eta_possible: bool, where an underflow error eta cannot be excluded.
        n: the reduction length.
        model: the :class:`SummationModel` the bound was derived for.
    Derived: ``rel`` (= gamma_d(u)), ``fp64_error``, ``eta_term``, ``overflow_possible``.
    Use :meth:`with_model` for the bound of another documented summation order.
    """

    exact: torch.Tensor
    bound: torch.Tensor
    abs_sum: torch.Tensor
    eta_possible: torch.Tensor
    n: int
    model: SummationModel = field(default=FP32_RN)

    @staticmethod
    def build(
        exact: torch.Tensor, abs_sum: torch.Tensor, eta_possible: torch.Tensor, n: int, model: SummationModel
    ) -> Accumulation:
        """Assemble an Accumulation, computing ``bound`` from the other fields."""
        model.check_length(n)
        bound = _bound(abs_sum, eta_possible, n, model)
        return Accumulation(exact, bound, abs_sum, eta_possible, n, model)

    def with_model(self, model: SummationModel) -> Accumulation:
        """Same exact values, bound re-derived for ``model`` (e.g. :data:`FP32_TRUNCATE`, a block model)."""
        return Accumulation.build(self.exact, self.abs_sum, self.eta_possible, self.n, model)

    @property
    def shape(self) -> torch.Size:
        return self.exact.shape

    @property
    def rel(self) -> float:
        """gamma_d(u): the relative coefficient of ``abs_sum`` in the kernel bound."""
        return gamma(self.model.depth(self.n), self.model.u)

    @property
    def fp64_error(self) -> torch.Tensor:
        """Bound on ``|exact - true exact sum|`` (float64)."""
        return gamma(self.n, _U64) * self.abs_sum

    @property
    def eta_term(self) -> torch.Tensor:
        """The absolute (underflow) part of the kernel bound (float64)."""
        e = self.model.eta_count(self.n) * self.model.eta * (1.0 + self.rel)
        return self.eta_possible.to(torch.float64) * e

    @property
    def overflow_possible(self) -> torch.Tensor:
        """Where a binary32 partial sum or product may have overflowed (bool)."""
        reach = ((1.0 + self.rel) * self.abs_sum + self.eta_term) * _EVAL_SLACK
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
        )


def _bound(abs_sum: torch.Tensor, eta_possible: torch.Tensor, n: int, model: SummationModel) -> torch.Tensor:
    rel = gamma(model.depth(n), model.u)
    eta = model.eta_count(n) * model.eta * (1.0 + rel)
    b = (rel + gamma(n, _U64)) * abs_sum + eta_possible.to(torch.float64) * eta
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
    pos = (
        mm(a["pinf"], b["pos"]) | mm(a["ninf"], b["neg"]) | mm(a["pos"], b["pinf"]) | mm(a["neg"], b["ninf"])
    )
    neg = (
        mm(a["pinf"], b["neg"]) | mm(a["ninf"], b["pos"]) | mm(a["pos"], b["ninf"]) | mm(a["neg"], b["pinf"])
    )
    nan = a["nan"][:, None] | b["nan"][None, :] | inf0 | (pos & neg)
    return nan, pos & ~nan, neg & ~nan


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
            [stop - start] is a lower bound on each row's smallest non-zero |value| (saves two passes);
            called for consecutive chunks of about 2^24 elements (memory: a few float64 copies of a chunk).
        n_rows: number of rows N of B.
        model: the kernel's summation model (default :data:`FP32_RN`).
        narrow_products: True when every product of an ``a`` value and a B value has at most 24 significant
            bits (bf16 x bf16, bf16 x E2M1*E4M3), enabling the underflow refinement (module docstring).
        name: tensor name used in errors.
    Returns:
        :class:`Accumulation` of shape [M, N], on ``a``'s device.
    Raises:
        TypeError / ValueError naming ``name`` (dtype, rank), ValueError if K does not fit ``model``.
    """
    check_tensor(name, a, dtype=(torch.bfloat16, torch.float32), ndim=2)
    m, k = a.shape
    model.check_length(k)
    a64 = a.to(torch.float64)
    a_fin = torch.isfinite(a64)
    a_all_finite = bool(a_fin.all())
    a0 = torch.where(a_fin, a64, 0.0)
    a_abs = a0.abs()
    a_min = _min_nonzero_abs(a0)
    a_ind = None if a_all_finite else _indicators(a64)
    chunk = max(1, _CHUNK_ELEMENTS // max(k, 1))
    exact_parts, s_parts, eta_parts = [], [], []
    for start in range(0, n_rows, chunk):
        stop = min(n_rows, start + chunk)
        got = rows(start, stop)
        if isinstance(
            got, tuple
        ):  # (values, all finite, lower bound on each row's smallest non-zero |value|)
            b64, b_all_finite, b_min = got
        else:
            b64, b_all_finite, b_min = got, None, None
        if b_all_finite is None:
            b_all_finite = bool(torch.isfinite(b64).all())
        b0 = b64 if b_all_finite else torch.where(torch.isfinite(b64), b64, 0.0)
        ex = a0 @ b0.T
        s_hat = a_abs @ b0.abs().T
        if narrow_products and model.block is None:
            b_min = _min_nonzero_abs(b0) if b_min is None else b_min
            tiny = (a_min[:, None] * b_min[None, :]) < _FP32_MIN_NORMAL
            eta = tiny & (s_hat > 0)
        else:
            eta = s_hat > 0
        if not (a_all_finite and b_all_finite):
            ai = a_ind if a_ind is not None else _indicators(a64)
            nan, pinf, ninf = _special_values(ai, _indicators(b64))
            ex = torch.where(nan, math.nan, torch.where(pinf, math.inf, torch.where(ninf, -math.inf, ex)))
        exact_parts.append(ex)
        s_parts.append(s_hat)
        eta_parts.append(eta)
        del b64, b0
    if exact_parts:
        exact = torch.cat(exact_parts, dim=1)
        s_hat = torch.cat(s_parts, dim=1)
        eta = torch.cat(eta_parts, dim=1)
    else:
        exact = a64.new_zeros((m, 0))
        s_hat = exact.clone()
        eta = torch.zeros((m, 0), dtype=torch.bool, device=a.device)
    return Accumulation.build(exact, _s_upper(s_hat, k), eta, k, model)


def dot_accumulate(
    a: torch.Tensor, b: torch.Tensor, *, model: SummationModel = FP32_RN, a_name: str = "a", b_name: str = "b"
) -> Accumulation:
    """Exact ``a @ b^T``: a bf16 or fp32 [M, K], b bf16 or fp32 [N, K] -> :class:`Accumulation` [M, N].

    The rule's reductions 1 (x . Wr^T), 6 and 8 (BF16 experts) in float64 with the certified bound of
    ``model``. Raises TypeError / ValueError naming ``a_name`` / ``b_name`` (dtype, rank, K mismatch, device).
    """
    check_tensor(a_name, a, dtype=(torch.bfloat16, torch.float32), ndim=2)
    check_tensor(b_name, b, dtype=(torch.bfloat16, torch.float32), shape=(None, a.shape[1]))
    if a.device != b.device:
        raise ValueError(f"{b_name}: on {b.device}, but {a_name} is on {a.device}")
    narrow = a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16

    def rows(i: int, j: int) -> torch.Tensor:
        return b[i:j].to(torch.float64)

    return dot_accumulate_rows(a, rows, b.shape[0], model=model, narrow_products=narrow, name=a_name)


def sum_squares_accumulate(
    s: torch.Tensor, *, model: SummationModel = FP32_RN, name: str = "s"
) -> Accumulation:
    """Exact ``sum_h s[m, h]^2`` (rule step 11) for fp32 ``s`` [M, H] -> :class:`Accumulation` [M].

    Each square is exact in float64 (48 bits, exponent >= -298). NaN -> NaN, inf -> +inf (IEEE).
    Raises TypeError / ValueError naming ``name``.
    """
    check_tensor(name, s, dtype=torch.float32, ndim=2)
    h = s.shape[1]
    model.check_length(h)
    s64 = s.to(torch.float64)
    sq = s64 * s64
    exact = sq.sum(dim=-1)
    fin = torch.where(torch.isfinite(sq), sq, 0.0)
    s_hat = fin.sum(dim=-1)
    if model.block is None:
        eta = (_min_nonzero_abs(fin) < _FP32_MIN_NORMAL) & (s_hat > 0)
    else:
        eta = s_hat > 0
    return Accumulation.build(exact, _s_upper(s_hat, h), eta, h, model)


def round_exact(stage: str, acc: Accumulation, operands: object = None) -> torch.Tensor:
    """Default accumulate policy: the binary32 rounding (RN, subnormals kept) of ``acc.exact``.

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


def check_accumulator(
    kernel_value: torch.Tensor, acc: Accumulation, *, name: str = "kernel_value"
) -> torch.Tensor:
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
