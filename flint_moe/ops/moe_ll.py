"""The low-latency decode block (docs/kernels/ll-block.md): one layer's residual add + RMSNorm, routing,
routed and shared NVFP4 experts and combine for M <= ``LL_MOE_MAX_TOKENS`` tokens.

- :func:`flint_moe_ll`: the block op (rule step 11, then steps 1-10 with the shared expert): the Triton router
  kernel (``kernels/ll_router.py``) then the CuTe DSL expert kernels (``kernels/cute/ll_launch.py``: routed
  gate/up, shared gate/up, down + combine), chained by programmatic dependent launch.
- :func:`check_ll_inputs`: every argument of the block op checked, before any launch (TypeError /
  ValueError / RuntimeError naming it).
- :func:`ll_route`: rule step 11 + steps 1-4 in one launch: residual add, RMSNorm with
  ``rsqrt.approx.ftz``, router GEMV, top-k and renormalisation; returns what the expert kernels read.
"""

from __future__ import annotations

import math

import torch

from flint_moe.kernels._launch import check_op_tensor, check_taps
from flint_moe.kernels.ll_router import launch_ll_router
from flint_moe.kernels.router import MAX_EXPERTS, MAX_TOP_K
from flint_moe.layouts.ll_weights import LLMoEWeights
from flint_moe.reference.decode_block import eps_fp32

from ._checks import check_kernel_device, check_top_k

__all__ = ["LL_MOE_MAX_TOKENS", "check_ll_inputs", "flint_moe_ll", "ll_route"]

#: Largest token count of the block: 8, the route counter's length (``ROUTE_GEMV_MAX_TOKENS``); the crossover
#: with the Triton decode path is measured by ``benchmarks/bench_ll.py``.
LL_MOE_MAX_TOKENS = 8


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
    check_taps(taps)
    return eps32


def check_ll_inputs(
    attn_out: torch.Tensor, residual: torch.Tensor, ln_weight: torch.Tensor, eps: float, w: LLMoEWeights,
    top_k: int, counter: torch.Tensor, *, taps: dict | None = None,
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


def flint_moe_ll(
    attn_out: torch.Tensor,
    residual: torch.Tensor,
    ln_weight: torch.Tensor,
    eps: float,
    w: LLMoEWeights,
    top_k: int,
    counter: torch.Tensor,
    *,
    taps: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode block of one layer: rule step 11 then steps 1-10 on ``xn`` with the shared expert (step 10's
    ``shared`` = the shared expert's ``y``); the golden model is ``reference.model.moe_decode_block``.

    Args: as :func:`check_ll_inputs` (``attn_out``, ``residual`` bf16 [M, H], 1 <= M <= ``LL_MOE_MAX_TOKENS``;
    ``ln_weight`` bf16 [H]; ``eps`` a Python number; ``w`` LLMoEWeights; ``top_k``; ``counter`` int32 [>= M]
    from ``make_route_counter``, allocated outside a CUDA-graph capture); ``taps``: None or a dict that
    receives the stages: ``residual_out``, ``sumsq`` fp32 [M], ``xn``, ``router_acc`` fp32 [M, E], ``logits``
    bf16 [M, E], ``ids`` int32 [M, k], ``weights`` fp32 [M, k] (router kernel); ``gate_acc`` / ``up_acc`` fp32
    [M, k, I] (before the global scale), ``act`` bf16 [M, k, I], ``shared_gate_acc`` / ``shared_up_acc`` fp32
    [M, SI], ``shared_act`` bf16 [M, SI], ``shared_down_acc`` fp32 [M, H], ``shared_y`` bf16 [M, H],
    ``down_acc`` fp32 [M, k, H] (before the global scale), ``y`` bf16 [M, k, H], ``out`` bf16 [M, H].
    Returns: ``(moe_out, residual_out)``, bf16 [M, H] each, new tensors; inputs never modified. No host
    synchronisation (CUDA-graph capturable once each specialisation has run eagerly: the first call compiles).
    The expert kernels (``kernels/cute/ll_partial.py``) read each selected expert's weights once for all its
    tokens.
    Raises: as :func:`check_ll_inputs`; ValueError for shapes the CuTe kernels do not take
    (``kernels/cute/ll_launch.py``: H, Ip, SI multiples of 16, int32 offsets) and for inputs or weights not
    starting on a 16-byte boundary; RuntimeError naming what is missing without a CUDA device of sm_90 or later
    or without nvidia-cutlass-dsl (CuTe DSL has no CPU interpreter).
    """
    from flint_moe.kernels.cute.ll_launch import launch_ll_experts, ll_experts_status, ll_plan

    eps32 = check_ll_inputs(attn_out, residual, ln_weight, eps, w, top_k, counter, taps=taps)
    ok, why = ll_experts_status(attn_out.device)
    if not ok:
        raise RuntimeError(f"flint_moe_ll: {why}")
    plan = ll_plan(w, top_k)
    ids, tw, xn, residual_out = launch_ll_router(
        attn_out, residual, ln_weight, eps32, w.router_weight, top_k, counter, taps=taps
    )
    out = launch_ll_experts(xn, ids, tw, w, top_k, taps=taps, plan=plan)
    return out, residual_out
