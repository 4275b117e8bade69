"""Decode-block front: rule step 11 (residual add, RMSNorm with rsqrt.approx.ftz) and the shared expert.

fp32 arithmetic: separate torch float32 ops (one IEEE RN each, subnormals kept); ``/`` is ``div.rn.f32``.
"""

from __future__ import annotations

import torch

from ._checks import check_same_device, check_tensor
from .exact import FP32_RN, Accumulation, SummationModel, sum_squares_accumulate
from .formats import to_bf16

__all__ = ["residual_add", "sum_squares", "rmsnorm_apply", "eps_fp32"]


def residual_add(attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """Step 11: ``s = RN(attn_out + residual)`` in fp32; bf16 [M, H] each -> fp32 [M, H].

    ``residual' = bf16(s)`` is ``formats.to_bf16(s)``. Raises TypeError / ValueError naming the tensor.
    """
    check_tensor("attn_out", attn_out, dtype=torch.bfloat16, ndim=2)
    check_tensor("residual", residual, dtype=torch.bfloat16, shape=tuple(attn_out.shape))
    check_same_device(attn_out=attn_out, residual=residual)
    return attn_out.to(torch.float32) + residual.to(torch.float32)


def sum_squares(s: torch.Tensor, *, model: SummationModel = FP32_RN) -> Accumulation:
    """Step 11 reduction: exact ``sum_h s[t, h]^2`` for fp32 ``s`` [M, H] -> :class:`Accumulation` [M]."""
    return sum_squares_accumulate(s, model=model, name="s")


def eps_fp32(eps: float) -> float:
    """``eps`` as used by step 11: its fp32 rounding (returned as a Python float holding the fp32 value)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps: expected a Python float, got {type(eps).__name__}")
    return float(torch.tensor(float(eps), dtype=torch.float32))


def rmsnorm_apply(s: torch.Tensor, sumsq_fp32: torch.Tensor, w_ln: torch.Tensor, eps: float) -> torch.Tensor:
    """Step 11: ``xn = bf16(RN(RN(s * inv) * w_ln))``, ``inv = rsqrt.approx.ftz(RN(div_rn(sumsq, H) + eps))``.

    Args: ``s`` fp32 [M, H] (residual sum), ``sumsq_fp32`` fp32 [M] (the kernel's / policy's value of the
    sum of squares), ``w_ln`` bf16 [H], ``eps`` Python float (used as fp32(eps)).
    H is exact in fp32 (H < 2^24).
    Returns torch.bfloat16 [M, H]. Raises TypeError / ValueError naming the tensor.
    """
    from .mufu import rsqrt_approx_ftz

    check_tensor("s", s, dtype=torch.float32, ndim=2)
    m, h = s.shape
    check_tensor("sumsq_fp32", sumsq_fp32, dtype=torch.float32, shape=(m,))
    check_tensor("w_ln", w_ln, dtype=torch.bfloat16, shape=(h,))
    check_same_device(s=s, sumsq_fp32=sumsq_fp32, w_ln=w_ln)
    if not 0 < h < (1 << 24):
        raise ValueError(f"s: hidden size H = {h} must be in [1, 2^24)")
    mean = sumsq_fp32 / torch.tensor(float(h), dtype=torch.float32, device=s.device)  # div.rn
    v = mean + torch.tensor(eps_fp32(eps), dtype=torch.float32, device=s.device)
    inv = rsqrt_approx_ftz(v)
    return to_bf16((s * inv[:, None]) * w_ln.to(torch.float32))
