"""The low-latency decode block's entry (docs/kernels/ll-block.md): its input checks and its first stage.

- :func:`check_ll_inputs`: every argument of the block op ``flint_moe_ll(attn_out, residual, ln_weight, eps,
  w, top_k, counter)`` checked, before any launch (TypeError / ValueError / RuntimeError naming it).
- :func:`ll_route`: rule step 11 + steps 1-4 in one launch (``kernels/ll_router.py``): residual add,
  RMSNorm with ``rsqrt.approx.ftz``, router GEMV, top-k and renormalisation; returns what the expert kernels
  read. The expert stages (CuTe DSL kernels, ``kernels/cute/ll_gate_up.py``) await their GPU run; until then
  the block op itself is not exported.
"""

from __future__ import annotations

import math

import torch

from flint_moe.kernels._launch import check_op_tensor
from flint_moe.kernels.ll_router import launch_ll_router
from flint_moe.kernels.router import MAX_EXPERTS, MAX_TOP_K, ROUTE_GEMV_MAX_TOKENS
from flint_moe.layouts.ll_weights import LLMoEWeights
from flint_moe.reference.decode_block import eps_fp32

from ._checks import check_kernel_device, check_top_k

__all__ = ["LL_MOE_MAX_TOKENS", "check_ll_inputs", "ll_route"]

#: Largest token count of the block (the route counter's length; to be set from the measured crossover with
#: the Triton decode path, at least 8).
LL_MOE_MAX_TOKENS = ROUTE_GEMV_MAX_TOKENS


def _check_front(attn_out, residual, ln_weight, eps, router_weight, top_k, counter, taps, rw="router_weight") -> float:
    check_op_tensor("attn_out", attn_out, dtype=torch.bfloat16, shape=(None, None))
    check_kernel_device("attn_out", attn_out)
    m, h = attn_out.shape
    dev = attn_out.device
    if not 0 < m <= LL_MOE_MAX_TOKENS:
        raise ValueError(
            f"attn_out: the block takes 1 <= M <= LL_MOE_MAX_TOKENS = {LL_MOE_MAX_TOKENS} tokens, got M = {m}"
        )
    if not 0 < h < (1 << 24):
        raise ValueError(f"attn_out: hidden size must be in [1, 2^24), got H = {h}")
    check_op_tensor("residual", residual, dtype=torch.bfloat16, shape=(m, h), device=dev)
    check_op_tensor("ln_weight", ln_weight, dtype=torch.bfloat16, shape=(h,), device=dev)
    eps32 = eps_fp32(eps)  # TypeError unless a Python number
    if not (math.isfinite(eps32) and eps32 >= 0.0):
        raise ValueError(f"eps: must be finite and >= 0 in fp32, got {eps!r} (fp32 {eps32!r})")
    check_op_tensor(rw, router_weight, dtype=torch.bfloat16, shape=(None, h), device=dev)
    e = int(router_weight.shape[0])
    if e > MAX_EXPERTS:
        raise ValueError(f"{rw}: at most {MAX_EXPERTS} experts, got E = {e}")
    check_top_k(top_k, min(e, MAX_TOP_K), f"min(E = {e}, {MAX_TOP_K})")
    check_op_tensor("counter", counter, dtype=torch.int32, shape=(None,), device=dev)
    if counter.numel() < m:
        raise ValueError(f"counter: needs >= {m} entries (one per token), got {counter.numel()}")
    if taps is not None and not isinstance(taps, dict):
        raise TypeError(f"taps: expected a dict or None, got {type(taps).__name__}")
    return eps32


def check_ll_inputs(
    attn_out: torch.Tensor,
    residual: torch.Tensor,
    ln_weight: torch.Tensor,
    eps: float,
    w: LLMoEWeights,
    top_k: int,
    counter: torch.Tensor,
    *,
    taps: dict | None = None,
) -> float:
    """Check the block op's arguments; return ``eps`` rounded to fp32 (a Python float).

    Args: ``attn_out``, ``residual`` bf16 [M, H] contiguous, 1 <= M <= ``LL_MOE_MAX_TOKENS``; ``ln_weight``
    bf16 [H]; ``eps`` a Python number, finite and >= 0 in fp32; ``w`` LLMoEWeights with hidden size H (its
    host-side metadata re-checked: :meth:`LLMoEWeights.check_metadata`), every tensor on ``attn_out``'s
    device; ``top_k`` an int in [1, min(E, 16)]; ``counter`` int32 [>= M] (``make_route_counter``).

    Raises TypeError (type, dtype), ValueError (shape, device, contiguity, ranges), RuntimeError (CPU tensors
    without ``TRITON_INTERPRET=1``); each message starts with the argument's name (``w.shared_w13_sf: ...``).
    """
    if not isinstance(w, LLMoEWeights):
        raise TypeError(f"w: expected LLMoEWeights, got {type(w).__name__}")
    w.check_metadata("w")
    return _check_front(attn_out, residual, ln_weight, eps, w.router_weight, top_k, counter, taps, "w.router_weight")


def ll_route(
    attn_out: torch.Tensor,
    residual: torch.Tensor,
    ln_weight: torch.Tensor,
    eps: float,
    router_weight: torch.Tensor,
    top_k: int,
    counter: torch.Tensor,
    *,
    taps: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rule step 11 then steps 1-4 in one launch: ``(ids, weights, xn, residual_out)``.

    Args: as :func:`check_ll_inputs` with ``router_weight`` bf16 [E, H] contiguous in place of the weights.
    Returns: ``ids`` int32 [M, k], ``weights`` fp32 [M, k] (bf16 values), ``xn`` bf16 [M, H] (the normalised
    input the experts read), ``residual_out`` bf16 [M, H] = bf16(attn_out + residual); new tensors, inputs never
    modified. With ``taps`` (a dict): ``residual_out``, ``sumsq`` fp32 [M], ``xn``, ``router_acc`` fp32 [M, E],
    ``logits`` bf16 [M, E], ``ids``, ``weights``. No host synchronisation (CUDA-graph capturable with a counter
    allocated outside the capture). Raises as :func:`check_ll_inputs`.
    """
    eps32 = _check_front(attn_out, residual, ln_weight, eps, router_weight, top_k, counter, taps)
    return launch_ll_router(attn_out, residual, ln_weight, eps32, router_weight, top_k, counter, taps=taps)
