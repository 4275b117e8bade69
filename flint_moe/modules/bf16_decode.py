"""``FlintBf16DecodeMoE``: the BF16 decode path over an existing TRT-LLM-layout BF16 expert layer (no copy).

Seed: ``FlintBf16DecodeMoE`` of ``vllm.models.flint.ops.moe`` (semantics only).
"""

from __future__ import annotations

import torch
from torch import nn

from flint_moe.modules._shared import SharedRunner

__all__ = ["FlintBf16DecodeMoE", "trtllm_bf16_views"]


def _view(name: str, w: object, blocked: tuple[int, ...], plain: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(w).__name__}")
    if w.dtype != torch.bfloat16:
        raise TypeError(f"{name}: dtype must be torch.bfloat16, got {w.dtype}")
    shape = tuple(w.shape)
    if shape == blocked:
        return w
    if shape == plain:
        if not w.is_contiguous():
            raise ValueError(f"{name}: a {plain} tensor holding BlockMajorK bytes must be contiguous")
        return w.view(blocked)
    raise ValueError(
        f"{name}: expected the TRT-LLM BF16 BlockMajorK layout {blocked} (or the same bytes shaped {plain}), "
        f"got {shape}"
    )


def trtllm_bf16_views(
    w13: torch.Tensor, w2: torch.Tensor, num_experts: int, hidden_size: int, intermediate_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g1 [E, H/64, 2I, 64], g2 [E, I/64, H, 64]) views of a TRT-LLM BF16 layer's weights, no copy.

    Accepts each tensor either in that 4-D shape (``layouts.to_trtllm_bf16``) or as the same BlockMajorK bytes
    in the checkpoint shape [E, 2I, H] / [E, H, I] (how a FusedMoE layer keeps its parameters after
    FlashInfer's ``prepare_trtllm_bf16_weights``; must then be contiguous). TypeError / ValueError naming
    ``w13_weight`` / ``w2_weight`` otherwise.
    """
    E, H, I = num_experts, hidden_size, intermediate_size  # noqa: E741
    g1 = _view("w13_weight", w13, (E, H // 64, 2 * I, 64), (E, 2 * I, H))
    g2 = _view("w2_weight", w2, (E, I // 64, H, 64), (E, H, I))
    return g1, g2


class FlintBf16DecodeMoE(nn.Module):
    """Decode path (M <= ``DECODE_BF16_MAX_TOKENS``) for BF16 routed experts stored in the TRT-LLM BF16 layout.

    Reads the expert weights of an existing layer in place (``flint_moe.ops.flint_moe_bf16_decode`` with
    ``layouts.trtllm_bf16_row_maps``); larger batches keep using that layer.

    Args:
        num_experts: E. hidden_size: H (multiple of 64). intermediate_size: the layer's stored intermediate
            size (after any padding; multiple of 64). top_k: 1 <= top_k <= min(E, 16).
        device: where the row maps and the router counter live (default: torch's default device).

    ``forward(hidden_states, router_weight, routed_experts, shared)``: ``routed_experts`` is the layer, an
    ``nn.Module`` with ``w13_weight`` / ``w2_weight`` (see :func:`trtllm_bf16_views`), or a (w13, w2) pair.
    Its shapes are checked on every call (host-side only, no device sync).

    ``check_row_maps()``: RuntimeError if the row-map buffers (``row_map13``, ``row_map2``) no longer hold the
    layout's values, e.g. after a write through ``.data`` (``flint_moe.ops.check_row_map_status``).
    """

    def __init__(
        self, num_experts: int, hidden_size: int, intermediate_size: int, top_k: int, *,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        from flint_moe.kernels.router import MAX_TOP_K
        from flint_moe.layouts import trtllm_bf16_row_maps
        from flint_moe.ops import make_route_counter

        for what, v, mult in (("num_experts", num_experts, 1), ("hidden_size", hidden_size, 64),
                              ("intermediate_size", intermediate_size, 64), ("top_k", top_k, 1)):  # fmt: skip
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0 or v % mult:
                raise ValueError(f"{what}: must be a positive int multiple of {mult}, got {v!r}")
        if top_k > min(num_experts, MAX_TOP_K):
            raise ValueError(f"top_k: must satisfy 1 <= top_k <= min(E = {num_experts}, {MAX_TOP_K}), got {top_k}")
        dev = torch.device(device) if device is not None else torch.empty(0).device
        self.num_experts, self.hidden_size, self.intermediate_size, self.top_k = (
            num_experts, hidden_size, intermediate_size, top_k,
        )  # fmt: skip
        map13, map2 = trtllm_bf16_row_maps(hidden_size, intermediate_size, dev)
        self.register_buffer("route_counter", make_route_counter(dev), persistent=False)
        self.register_buffer("row_map13", map13, persistent=False)
        self.register_buffer("row_map2", map2, persistent=False)
        self._shared = SharedRunner()

    def forward(
        self,
        hidden_states: torch.Tensor,
        router_weight: torch.Tensor,
        routed_experts: nn.Module | tuple[torch.Tensor, torch.Tensor],
        shared: torch.Tensor | nn.Module,
        *,
        taps: dict | None = None,
    ) -> torch.Tensor:
        """bf16 [M, H]: routed experts (BF16 rule) + shared expert.

        Args:
            hidden_states: bf16 [M, H], M <= DECODE_BF16_MAX_TOKENS. router_weight: bf16 [E, H].
            routed_experts: the TRT-LLM BF16 layer (class docstring).
            shared: bf16 [M, H] shared-expert output, or the shared-expert module (auxiliary CUDA stream with
                fork/join events, CUDA-graph safe; inline on the CPU).
            taps: optional dict filled with the kernels' raw accumulators (the op's ``taps``; for the
                conformance harness).
        Raises:
            TypeError / ValueError naming the tensor (layer shapes, dtypes); NotImplementedError for
            M > DECODE_BF16_MAX_TOKENS (from the op).
        """
        from flint_moe.ops import flint_moe_bf16_decode

        if isinstance(routed_experts, nn.Module):
            for attr in ("w13_weight", "w2_weight"):
                if not hasattr(routed_experts, attr):
                    raise TypeError(f"routed_experts: {type(routed_experts).__name__} has no {attr}")
            w13, w2 = routed_experts.w13_weight, routed_experts.w2_weight
        elif isinstance(routed_experts, (tuple, list)) and len(routed_experts) == 2:
            w13, w2 = routed_experts
        else:
            raise TypeError("routed_experts: expected an nn.Module with w13_weight / w2_weight or a (w13, w2) pair")
        w13 = w13.data if isinstance(w13, nn.Parameter) else w13
        w2 = w2.data if isinstance(w2, nn.Parameter) else w2
        g1, g2 = trtllm_bf16_views(w13, w2, self.num_experts, self.hidden_size, self.intermediate_size)
        out, ready = self._shared.start(shared, hidden_states)
        return flint_moe_bf16_decode(
            hidden_states, router_weight, g1, g2, (self.row_map13, self.row_map2), self.top_k,
            self.route_counter, out, ready, taps=taps,
        )  # fmt: skip

    def check_row_maps(self) -> None:
        """RuntimeError if the row-map buffers (``row_map13``, ``row_map2``) no longer hold the layout's values
        after forward checked them (e.g. written through ``.data``): ``flint_moe.ops.check_row_map_status``
        on the module's device (one synchronisation; call it at a safe point, e.g. after CUDA-graph
        replays). The kernels never read outside the layer whatever the values."""
        from flint_moe.ops import check_row_map_status

        check_row_map_status(self.row_map13.device)

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
            f"intermediate_size={self.intermediate_size}, top_k={self.top_k}"
        )
