"""Exact long reductions of the Flint rule and their certified error bounds (rule "Accumulation").

The length-H / length-I reductions of steps 1 (router logits), 6 (gate/up), 8 (down) and 11 (sum of squares)
are the only places where a kernel's bits depend on its summation order. For each of them the golden model
computes the exact sum (bit-exact, independent of summation order, batch size and device; returned as its
53-bit round-to-odd float64, whose binary32 rounding is RN32 of the exact sum) and a bound that certifies
``|kernel fp32 value - exact| <= bound`` for every summation order (and every documented regrouping) a
conforming kernel may use.

The modules behind it: :mod:`.exact_sum` (how the exact value is computed: fixed-exponent binning, round to
odd at 53 bits; and the certified float64 filter, :func:`filtered_sums`) and :mod:`.accumulation` (the
summation models, the :class:`Accumulation` record and the kernel bound it certifies, and the rule's
acceptance criterion :func:`check_accumulator`). Their public names are importable from here as well.

This module holds the reductions themselves: :func:`dot_accumulate` / :func:`dot_accumulate_rows` (steps 1, 6,
8), :func:`sum_squares_accumulate` (step 11) and the default accumulate policy :func:`round_exact`. Each forms
its products elementwise in float64 (exact: :mod:`.exact_sum`), a chunk of rows at a time (the values never
depend on the chunking), and sums them exactly.

Non-finite terms (inf, NaN inputs) are taken out of the exact sum and their IEEE result (NaN, +-inf) is
derived from exact indicator counts, independent of how a BLAS treats 0 * inf. ``abs_sum`` (``S``) is
computed by a float64 matmul of the absolute values: ``Shat = S (1 + theta)``, ``|theta| <= gamma_n(2^-53)``,
and the stored value is ``Shat * (1 + 2*gamma_n(2^-53))``, an upper bound on ``S``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import accumulation as _accumulation
from ._checks import check_tensor
from .accumulation import *  # noqa: F403  (re-exported: the models, Accumulation, the criterion)
from .accumulation import FP32_RN, Accumulation, SummationModel, _s_upper
from .exact_sum import _FILTER, _MAX_TERMS, _exact_sum_terms, _filtered_chunk, filtered_sums

__all__ = [
    *_accumulation.__all__,
    "dot_accumulate",
    "dot_accumulate_rows",
    "filtered_sums",
    "sum_squares_accumulate",
    "round_exact",
]

_FP32_MIN_NORMAL = 2.0**-126
#: Elements of one float64 product chunk (tokens * rows * K) in the chunked dot products (128 MiB per buffer).
_CHUNK_ELEMENTS = 1 << 24


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
            bits (bf16 x bf16, bf16 x E2M1*E4M3), enabling the underflow refinement (:mod:`.accumulation`).
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
            ex, ex_err = _filtered_chunk(
                a0, b0, _s_upper(s_hat, k), k, a_max, a_min, b_min, bits, max(1, _CHUNK_ELEMENTS // max(k, 1))
            )
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

    The rule's reductions 1 (x . Wr^T), 6 and 8 (BF16 experts), exact (:mod:`.exact_sum`) with the certified
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

    Each square is exact in float64 (48 bits, exponent >= -298); the sum is exact (:mod:`.exact_sum`), +0 for
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
    exact sum (:mod:`.exact_sum`); independent of summation order, batch size and device.
    Policy signature used by :mod:`.model`: ``policy(stage, acc, operands) -> fp32`` of ``acc.shape``.
    ``operands`` (a dict of the reduction's inputs) lets other policies replay a kernel's summation order.
    """
    return acc.exact.to(torch.float32)
