"""Routing: rule steps 1-4 (router logits, totalOrder top-k, sigmoid scores, renormalisation).

fp32 arithmetic is done with separate torch float32 operations: each is one IEEE-754 round-to-nearest-even
with subnormals kept (CPU and CUDA; torch neither fuses separate ops nor flushes denormals unless
``torch.set_flush_denormal(True)`` was called, which the golden model forbids), and fp32 ``/`` is correctly
rounded (``div.rn.f32``) on both devices.
"""

from __future__ import annotations

import dataclasses

import torch

from ._checks import check_same_device, check_tensor
from .exact import FP32_RN, Accumulation, SummationModel, dot_accumulate
from .formats import round_bf16, to_bf16

__all__ = [
    "router_accumulate",
    "logits_from_accumulator",
    "total_order_key",
    "topk_total_order",
    "routing_scores",
    "renormalize",
    "RENORM_EPS",
]

#: fp32(1e-20) as used by step 4 (0x1E3CE508 = 9.99999968e-21).
RENORM_EPS = torch.tensor(1e-20, dtype=torch.float32).item()


def router_accumulate(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    *,
    model: SummationModel = FP32_RN,
    order: dict | None = None,
    mma=None,
) -> Accumulation:
    """Step 1 reduction: exact ``sum_h x[t, h] * Wr[e, h]``.

    Args: ``x`` bf16 [M, H], ``router_weight`` bf16 [E, H] (same device); ``order``: a summation-order
    declaration (:mod:`.orders`) or None; ``mma``: the tensor-core step for an order that has one.
    Returns :class:`Accumulation` [M, E] with the bound of ``model``; with ``order`` its ``replay`` is the
    fp32 value of that order (:func:`.orders.replay_matmul`). Raises TypeError / ValueError naming ``x`` or
    ``router_weight`` (``OrderError`` for a bad declaration).
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2)
    check_tensor("router_weight", router_weight, dtype=torch.bfloat16, shape=(None, x.shape[1]))
    check_same_device(x=x, router_weight=router_weight)
    acc = dot_accumulate(x, router_weight, model=model, a_name="x", b_name="router_weight")
    if order is None:
        return acc
    from .orders import replay_matmul

    return dataclasses.replace(acc, replay=replay_matmul(order, x, router_weight, mma=mma))


def logits_from_accumulator(acc_fp32: torch.Tensor) -> torch.Tensor:
    """Step 1 cast: ``l = bf16(acc)`` (RNE, subnormals kept). fp32 [M, E] -> torch.bfloat16 [M, E]."""
    check_tensor("acc_fp32", acc_fp32, dtype=torch.float32)
    return to_bf16(acc_fp32)


def total_order_key(logits: torch.Tensor) -> torch.Tensor:
    """int32 key, monotone in IEEE-754 totalOrder of the bf16 bit pattern, with every NaN equal and on top.

    -inf -> -32641, -0 -> -1, +0 -> 0, +inf -> 32640, any NaN -> 32641 (step 2). ``logits`` bf16.
    """
    check_tensor("logits", logits, dtype=torch.bfloat16)
    b = logits.view(torch.int16).to(torch.int32)  # signed: negative values have b < 0
    key = torch.where(b < 0, b ^ 0x7FFF, b)  # negatives: flip the magnitude bits, so larger |v| is smaller
    nan = (b & 0x7FFF) > 0x7F80
    return torch.where(nan, torch.full_like(key, 32641), key)


def topk_total_order(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Step 2: ids of the k largest bf16 logits per row under totalOrder, ties -> lower expert index first.

    Args: ``logits`` bf16 [M, E]; ``k`` int with 1 <= k <= E (any E, no power-of-two limit).
    Returns: int32 [M, k] in descending order (ids[:, 0] is the largest). Sorting uses unique int64 keys
    ``key * E + (E - 1 - index)``, so no float comparison or sort stability is involved.
    Raises: TypeError (dtype, k not an int), ValueError (rank, k out of range).
    """
    check_tensor("logits", logits, dtype=torch.bfloat16, ndim=2)
    if not isinstance(k, int) or isinstance(k, bool):
        raise TypeError(f"k: expected an int, got {type(k).__name__}")
    m, e = logits.shape
    if not 1 <= k <= e:
        raise ValueError(f"k: must satisfy 1 <= k <= E = {e}, got {k}")
    key = total_order_key(logits).to(torch.int64)
    idx = torch.arange(e, dtype=torch.int64, device=logits.device)
    composite = key * e + (e - 1 - idx)
    _, ids = torch.topk(composite, k, dim=1, largest=True, sorted=True)
    return ids.to(torch.int32)


def routing_scores(logits_selected: torch.Tensor) -> torch.Tensor:
    """Step 3: ``s = div_rn(1, RN(1 + expf(-l)))`` with ``expf`` = libdevice ``__nv_expf`` (mufu emulation).

    Args: ``logits_selected`` bf16 [M, k] (any shape). ``-l`` of a bf16 is a bf16 (sign flip, exact).
    Returns: fp32, same shape. expf overflow (l < -88.7) gives inf, so s = +0; l = +inf: s = 1; NaN -> NaN.
    """
    from .mufu import expf_libdevice

    check_tensor("logits_selected", logits_selected, dtype=torch.bfloat16)
    e = expf_libdevice(-logits_selected)
    d = e + 1.0  # one fp32 RN
    return torch.ones_like(d) / d  # div.rn


def renormalize(scores: torch.Tensor) -> torch.Tensor:
    """Step 4: ``S = RN(...RN(s_0 + s_1)... + s_{k-1})``, ``tw_j = bf16(s_j / RN(S + eps))``.

    Args: ``scores`` fp32 [M, k] (k >= 1), selection order; eps = fp32(1e-20). Returns fp32 [M, k] holding
    bf16 values.
    Rows whose scores all underflowed to 0 give tw = 0 (0 / 1e-20f), never NaN. NaN scores propagate.
    """
    check_tensor("scores", scores, dtype=torch.float32, ndim=2)
    if scores.shape[1] < 1:
        raise ValueError(f"scores: need k >= 1 columns, got shape {tuple(scores.shape)}")
    total = scores[:, 0].clone()
    for j in range(1, scores.shape[1]):
        total = total + scores[:, j]
    denom = total + RENORM_EPS
    return round_bf16(scores / denom[:, None])
