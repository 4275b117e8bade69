"""``FlintLLDecodeBlock``: the low-latency decode block of one layer as a ``torch.nn.Module`` a serving engine calls
once per decode step: rule step 11 (residual add, RMSNorm) then steps 1-10 with the NVFP4 shared expert, via
``flint_moe.ops.flint_moe_ll`` (docs/kernels/ll-block.md).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from flint_moe.layouts.ll_weights import LLMoEWeights, ll_weights_from_layers
from flint_moe.reference.decode_block import eps_fp32

__all__ = ["FlintLLDecodeBlock"]


def _max_tokens() -> int:
    from flint_moe.ops.moe_ll import LL_MOE_MAX_TOKENS

    return LL_MOE_MAX_TOKENS


class FlintLLDecodeBlock(nn.Module):
    """The decode block of one MoE layer over the layer's own weights (views, no copy).

    Args:
        weights: ``flint_moe.layouts.LLMoEWeights`` (router, routed ``FlintMoEWeights``, NVFP4 shared expert);
            build it with :meth:`from_layers` from the engine's layers.
        ln_weight: bf16 [H], the post-attention RMSNorm weight, on the weights' device (held, not copied).
        eps: the RMSNorm epsilon, a Python number, finite and >= 0 in fp32 (used as fp32(eps)).
        top_k: experts per token, an int in [1, min(E, 16)].

    Holds its own route counter (``ops.make_route_counter``, made once on the weights' device: CUDA-graph
    capture of ``forward`` needs no allocation). Calls on one module must be ordered on one stream.

    Raises (constructor): TypeError (a type or dtype) / ValueError (shape, device, contiguity, range), naming
    the argument (``ln_weight: ...``); ``LLMoEWeights``' own errors from :meth:`from_layers`.
    """

    def __init__(self, weights: LLMoEWeights, ln_weight: torch.Tensor, eps: float, top_k: int) -> None:
        super().__init__()
        from flint_moe.kernels.router import MAX_TOP_K
        from flint_moe.ops import make_route_counter
        from flint_moe.ops._checks import check_top_k

        if not isinstance(weights, LLMoEWeights):
            raise TypeError(f"weights: expected LLMoEWeights, got {type(weights).__name__}")
        weights.check_metadata("weights")
        e, h = weights.num_experts, weights.hidden_size
        dev = weights.router_weight.device
        if not isinstance(ln_weight, torch.Tensor):
            raise TypeError(f"ln_weight: expected a torch.Tensor, got {type(ln_weight).__name__}")
        if ln_weight.dtype != torch.bfloat16:
            raise TypeError(f"ln_weight: dtype must be torch.bfloat16, got {ln_weight.dtype}")
        if tuple(ln_weight.shape) != (h,):
            raise ValueError(f"ln_weight: expected shape [H={h}], got {tuple(ln_weight.shape)}")
        if ln_weight.device != dev:
            raise ValueError(f"ln_weight: on {ln_weight.device}, but the weights are on {dev}")
        if not ln_weight.is_contiguous():
            raise ValueError(f"ln_weight: must be contiguous (strides {ln_weight.stride()})")
        eps32 = eps_fp32(eps)  # TypeError unless a Python number
        if not (math.isfinite(eps32) and eps32 >= 0.0):
            raise ValueError(f"eps: must be finite and >= 0 in fp32, got {eps!r} (fp32 {eps32!r})")
        self.top_k = check_top_k(top_k, min(e, MAX_TOP_K), f"min(E = {e}, {MAX_TOP_K})")
        self.weights = weights
        self.ln_weight = ln_weight.detach()
        self.eps = float(eps)
        self.route_counter = make_route_counter(dev)

    @classmethod
    def from_layers(
        cls,
        router_weight: torch.Tensor | nn.Module,
        shared_gate_up: nn.Module,
        shared_down: nn.Module,
        experts,
        ln_weight: torch.Tensor,
        eps: float,
        top_k: int,
        *,
        shared_expert_gate: object = None,
    ) -> FlintLLDecodeBlock:
        """The block over the engine's layers: ``layouts.ll_weights_from_layers(router_weight, shared_gate_up,
        shared_down, experts, shared_expert_gate=...)`` (FlashInfer-prepared NVFP4 linears; a sigmoid-gated
        shared expert is refused with a ValueError), then the constructor's checks."""
        w = ll_weights_from_layers(router_weight, shared_gate_up, shared_down, experts,
                                   shared_expert_gate=shared_expert_gate)  # fmt: skip
        return cls(w, ln_weight, eps, top_k)

    @property
    def hidden_size(self) -> int:
        return self.weights.hidden_size

    def forward(
        self, attn_out: torch.Tensor, residual: torch.Tensor, *, taps: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of the layer: ``(moe_out, residual_out)``.

        Args:
            attn_out: bf16 [M, H] contiguous, 1 <= M <= ``ops.LL_MOE_MAX_TOKENS``, on the weights' device.
            residual: bf16 [M, H] contiguous, same device. Neither is modified.
            taps: optional dict for the conformance harness (the op's taps).
        Returns:
            ``moe_out`` bf16 [M, H] (routed + shared expert on the normalised input) and ``residual_out`` bf16
            [M, H] = bf16(attn_out + residual), both new tensors.
        Raises:
            TypeError / ValueError naming ``attn_out`` / ``residual`` / ``taps``; the op's own errors (a
            RuntimeError without a GPU and CuTe DSL).
        """
        h, dev = self.hidden_size, self.weights.router_weight.device
        for name, t in (("attn_out", attn_out), ("residual", residual)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dtype != torch.bfloat16:
                raise TypeError(f"{name}: dtype must be torch.bfloat16, got {t.dtype}")
            if t.dim() != 2 or t.shape[1] != h:
                raise ValueError(f"{name}: expected shape [M, H={h}], got {tuple(t.shape)}")
            if t.device != dev:
                raise ValueError(f"{name}: on {t.device}, but the block's weights are on {dev}")
            if not t.is_contiguous():
                raise ValueError(f"{name}: must be contiguous (strides {t.stride()})")
        m, limit = attn_out.shape[0], _max_tokens()
        if not 1 <= m <= limit:
            raise ValueError(f"attn_out: the block takes 1 <= M <= LL_MOE_MAX_TOKENS = {limit} tokens, got M = {m}")
        if residual.shape != attn_out.shape:
            raise ValueError(f"residual: expected shape {tuple(attn_out.shape)} (attn_out's), got "
                             f"{tuple(residual.shape)}")  # fmt: skip
        from flint_moe.kernels._launch import check_taps
        from flint_moe.ops import moe_ll

        check_taps(taps)
        return moe_ll.flint_moe_ll(attn_out, residual, self.ln_weight, self.eps, self.weights, self.top_k,
                                   self.route_counter, taps=taps)  # fmt: skip

    def extra_repr(self) -> str:
        w = self.weights
        return (
            f"num_experts={w.num_experts}, hidden_size={w.hidden_size}, "
            f"shared_intermediate_size={w.shared_intermediate_size}, top_k={self.top_k}, eps={self.eps}"
        )
