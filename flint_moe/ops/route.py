"""``route``: router logits + top-k + renormalised routing weights (rule steps 1-4).

- M <= ROUTE_GEMV_MAX_TOKENS: one Triton kernel (``flint_moe.kernels.router._router_gemv_topk_kernel``):
  router GEMV with bf16 logits, the top-k in each token's last program (per-token atomic counter, never
  reset; CUDA-graph safe).
- larger M: the router GEMM on the tensor cores (``flint_moe.kernels.router_gemm``: bf16 x bf16 products, exact,
  summed into fp32 in one declared order of k16 tensor-core steps), then the Triton top-k kernel, which does
  rule step 1's bf16 cast with ``cvt.rn.bf16.f32`` and steps 2-4.

``router_accumulation_model(M)`` names the summation model that bounds ``router_acc`` on each path (the GEMV's
fp32 round-to-nearest adds, or the tensor cores' truncating accumulation). ``router_logits_fp32`` is an
independent fp32 GEMM (cuBLAS, TF32 off) kept for tests that compare the two routes.

Seed: ``vllm.models.flint.ops.moe`` ``route`` / ``make_route_counter`` (semantics only).
"""

from __future__ import annotations

import torch

from flint_moe.kernels._launch import check_op_tensor, check_taps
from flint_moe.kernels.router import (
    MAX_EXPERTS,
    MAX_TOP_K,
    ROUTE_GEMV_MAX_TOKENS,
    launch_router_gemv_topk,
    launch_topk,
)
from flint_moe.kernels.router_gemm import launch_router_gemm
from flint_moe.ops._checks import check_kernel_device, check_top_k
from flint_moe.reference.exact import FP32_RN, FP32_TRUNCATE, SummationModel

__all__ = ["ROUTE_GEMV_MAX_TOKENS", "make_route_counter", "route", "router_accumulation_model", "router_logits_fp32"]


def make_route_counter(device: torch.device | str | None = None) -> torch.Tensor:
    """Zeroed int32 [ROUTE_GEMV_MAX_TOKENS] counter for ``route``'s GEMV path.

    Allocate it once, outside CUDA-graph capture; it is never reset (each launch leaves every used entry a
    multiple of 2^16 higher; int32 wraparound is harmless). Launches sharing it must be ordered on one stream.
    """
    return torch.zeros(ROUTE_GEMV_MAX_TOKENS, dtype=torch.int32, device=device)


def router_logits_fp32(x: torch.Tensor, router_weight: torch.Tensor) -> torch.Tensor:
    """fp32 router sums x @ router_weight.T (fp32 [M, E]) by an fp32 GEMM, TF32 and reduced-precision
    reductions disabled for the call (flags restored afterwards): an order-free second route to the sums, for tests."""
    flags = torch.backends.cuda.matmul
    saved = (flags.allow_tf32, flags.allow_bf16_reduced_precision_reduction)
    try:
        flags.allow_tf32 = False
        flags.allow_bf16_reduced_precision_reduction = False
        return torch.mm(x.float(), router_weight.float().t())
    finally:
        flags.allow_tf32, flags.allow_bf16_reduced_precision_reduction = saved


def route(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    top_k: int,
    counter: torch.Tensor,
    *,
    taps: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule steps 1-4: (ids int32 [M, k], weights fp32 [M, k]) for tokens x.

    Args:
        x: bf16 [M, H], contiguous.
        router_weight: bf16 [E, H], contiguous, same device; E >= top_k, E <= 32768, any E (no power of two).
        top_k: int, 1 <= top_k <= min(E, 16).
        counter: ``make_route_counter(device)`` buffer: int32 [>= min(M, ROUTE_GEMV_MAX_TOKENS)], contiguous,
            same device. Used (and advanced) only on the GEMV path (M <= ROUTE_GEMV_MAX_TOKENS).
        taps: optional dict; when given, the tapped kernel build runs and the dict receives ``router_acc``
            fp32 [M, E] (the fp32 sums before bf16), ``logits`` bf16 [M, E], ``ids``, ``weights``.
    Returns:
        ids: expert indices in descending totalOrder of the bf16 logits, ties to the lower index (step 2).
        weights: bf16(div_rn(s_j, RN(S + 1e-20f))) as fp32 (steps 3-4); 0 for an all-underflow row.
    Raises:
        TypeError (not a tensor, dtype, top_k not an int), ValueError (shape, device, contiguity, k range,
        counter too small); RuntimeError for CPU tensors without TRITON_INTERPRET=1; messages name the
        argument. Inputs are never modified.
    """
    check_op_tensor("x", x, dtype=torch.bfloat16, shape=(None, None))
    check_kernel_device("x", x)
    m, h = x.shape
    dev = x.device
    check_op_tensor("router_weight", router_weight, dtype=torch.bfloat16, shape=(None, h), device=dev)
    e = int(router_weight.shape[0])
    check_top_k(top_k, min(e, MAX_TOP_K), f"min(E = {e}, {MAX_TOP_K})")
    if e > MAX_EXPERTS:
        raise ValueError(f"router_weight: at most {MAX_EXPERTS} experts, got E = {e}")
    if h < 1:
        raise ValueError(f"x: hidden size must be >= 1, got shape {tuple(x.shape)}")
    check_taps(taps)
    if m <= ROUTE_GEMV_MAX_TOKENS:
        check_op_tensor("counter", counter, dtype=torch.int32, shape=(None,), device=dev)
        if counter.numel() < m:
            raise ValueError(f"counter: needs >= {m} entries (one per token), got {counter.numel()}")
        return launch_router_gemv_topk(x, router_weight, top_k, counter, taps=taps)
    acc = launch_router_gemm(x, router_weight)
    return launch_topk(acc, top_k, taps=taps)


def router_accumulation_model(m: int) -> SummationModel:
    """Summation model bounding ``router_acc`` of ``route`` for M = ``m`` tokens: ``FP32_RN`` (the GEMV kernel's
    fp32 round-to-nearest FMAs and adds) for m <= ROUTE_GEMV_MAX_TOKENS, else ``FP32_TRUNCATE`` (the router
    GEMM's tensor-core accumulation, u = 2^-23)."""
    return FP32_RN if m <= ROUTE_GEMV_MAX_TOKENS else FP32_TRUNCATE
