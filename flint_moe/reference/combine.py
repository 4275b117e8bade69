"""Combine: rule step 9 (``acc = fma(tw_j, y_j, acc)`` in selection order) and step 10 (shared-expert add).

``fma_f32`` computes IEEE binary32 ``fma(a, b, c)`` (one rounding of ``a*b + c``) exactly with float64 ops.

Proof that ``fma_f32`` returns ``RN32(a*b + c)`` for binary32 a, b, c:

1. ``p = a * b`` in float64 is exact: the significands have at most 24 bits each, so the product has at most
   48 <= 53 bits, and a non-zero product has magnitude in [2^-298, 2^256), inside float64's normal range.
2. ``s = RN64(p + c)`` and ``err = (p + c) - s`` by Knuth's TwoSum (6 float64 ops, RN): ``s + err = p + c``
   exactly, since nothing overflows (|p + c| < 2^257). ``s`` is NOT in general ``RN32``-safe: rounding
   ``p + c`` to 53 bits and then to 24 bits can differ from one rounding to 24 bits (double rounding, e.g.
   when ``p + c`` lies just above a binary32 midpoint and RN64 lands exactly on it).
3. Round to odd: ``z = s`` if ``err == 0``, else the one of ``s`` and its float64 neighbour towards ``err``
   whose significand is odd (their bit patterns differ by one, so exactly one is odd). Then ``z`` is
   ``p + c`` rounded to odd at 53 bits (``p + c`` lies strictly between the two neighbours when err != 0).
4. Boldo & Melquiond (IEEE Trans. Computers 57(4), 2008, Theorem "round-to-odd then round-to-nearest"):
   ``RN_p(RO_q(x)) = RN_p(x)`` whenever the odd format has q >= p + 2 bits at the magnitude of x. Here q = 53,
   p = 24 for normal binary32 results; in binary32's subnormal range (|x| < 2^-126) the binary32 grid
   spacing is 2^-149 while float64's is <= 2^-178, i.e. >= 29 extra bits. So ``RN32(z) = RN32(p + c)``, and
   torch's float64 -> float32 conversion is that RN32 (subnormals kept; >= 2^128 - 2^103 -> inf).
5. Zeros: ``s == 0`` only when ``p + c == 0`` exactly (TwoSum), and float64 addition gives the zero the sign
   IEEE prescribes for an exact zero sum of ``a*b`` and ``c`` (+0 unless both are -0), as fma does.
6. Non-finite operands: float64 ``p`` and ``s`` follow IEEE (inf*0 = NaN, inf - inf = NaN), and ``s`` is
   returned (converted) directly.
"""

from __future__ import annotations

import math

import torch

from ._checks import check_same_device, check_tensor
from .formats import round_bf16, to_bf16

__all__ = ["fma_f32", "combine_fp32", "combine", "add_shared"]


def _round_to_odd(s: torch.Tensor, err: torch.Tensor) -> torch.Tensor:
    bits = s.view(torch.int64)
    even = (bits & 1) == 0
    toward = torch.where(err > 0, math.inf, -math.inf).to(torch.float64)
    return torch.where((err != 0) & even, torch.nextafter(s, toward), s)


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """IEEE binary32 ``fma(a, b, c)``: one round-to-nearest-even of the exact ``a*b + c`` (subnormals kept).

    Args: fp32 tensors of broadcast-compatible shapes, one device. Returns fp32 (broadcast shape).
    Raises TypeError / ValueError naming ``a``, ``b`` or ``c``. See the module docstring for the proof.
    """
    for name, t in (("a", a), ("b", b), ("c", c)):
        check_tensor(name, t, dtype=torch.float32)
    check_same_device(a=a, b=b, c=c)
    p = a.to(torch.float64) * b.to(torch.float64)  # exact
    c64 = c.to(torch.float64)
    s = p + c64
    # TwoSum (Knuth): err = (p + c) - s exactly.
    bp = s - c64
    err = (p - bp) + (c64 - (s - bp))
    finite = torch.isfinite(s)
    z = torch.where(finite, _round_to_odd(s, torch.where(finite, err, 0.0)), s)
    return z.to(torch.float32)


def _check_combine(tw: torch.Tensor, y: torch.Tensor) -> None:
    check_tensor("tw", tw, dtype=torch.float32, ndim=2)
    check_tensor("y", y, dtype=torch.bfloat16, shape=(tw.shape[0], tw.shape[1], None))
    check_same_device(tw=tw, y=y)
    if tw.shape[1] < 1:
        raise ValueError(f"tw: need k >= 1 columns, got shape {tuple(tw.shape)}")
    not_bf16 = ~((round_bf16(tw) == tw) | torch.isnan(tw))
    if bool(not_bf16.any()):
        raise ValueError("tw: routing weights must be fp32 holding bf16 values (step 4 output)")


def combine_fp32(tw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Step 9 accumulator: ``acc = +0; for j in 0..k-1: acc = fma(tw[:, j], y[:, j, :], acc)``.

    Args: ``tw`` fp32 [M, k] holding bf16 values (step 4), ``y`` bf16 [M, k, H] (step 8, per slot).
    Returns fp32 [M, H] (before the bf16 cast). Raises TypeError / ValueError naming ``tw`` or ``y``.
    """
    _check_combine(tw, y)
    y32 = y.to(torch.float32)
    acc = torch.zeros((y.shape[0], y.shape[2]), dtype=torch.float32, device=y.device)
    for j in range(tw.shape[1]):
        acc = fma_f32(tw[:, j : j + 1], y32[:, j, :], acc)
    return acc


def combine(tw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Step 9: ``routed = bf16(acc)`` with ``acc`` from :func:`combine_fp32`. -> bf16 [M, H]."""
    return to_bf16(combine_fp32(tw, y))


def add_shared(routed: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """Step 10: ``out = bf16(RN(fp32(routed) + fp32(shared)))``; bf16 [M, H] each -> torch.bfloat16 [M, H]."""
    check_tensor("routed", routed, dtype=torch.bfloat16, ndim=2)
    check_tensor("shared", shared, dtype=torch.bfloat16, shape=tuple(routed.shape))
    check_same_device(routed=routed, shared=shared)
    return to_bf16(routed.to(torch.float32) + shared.to(torch.float32))
