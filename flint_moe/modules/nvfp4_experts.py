"""``FlintNvfp4Experts``: the routed experts of one Flint NVFP4 (W4A16) MoE layer as a ``torch.nn.Module``.

Seed: ``FlintNvfp4Experts`` of ``vllm.models.flint.ops.moe`` (semantics only).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from flint_moe.checkpoints.experts import ExpertStack
from flint_moe.modules._shared import SharedRunner

__all__ = ["FlintNvfp4Experts", "warmup_token_counts"]


def warmup_token_counts(max_num_tokens: int, decode_max: int, top_k: int = 1, num_experts: int = 1) -> list[int]:
    """Token counts whose kernels ``load_weights`` compiles (ascending).

    ``decode_max``: the largest M ``flint_moe`` runs on the decode kernels for this layer (``load_weights``
    passes ``ops.decode_max_tokens(num_experts, top_k)``). Every M in [1, min(max_num_tokens, decode_max)]: each
    is its own decode launch (the router switches from its GEMV to its GEMM above ``ROUTE_GEMV_MAX_TOKENS``
    inside that range). Above the decode limit
    the grouped path (``ops.moe_nvfp4_grouped``) picks its row block from ``grouped_config(M * top_k, E)``;
    for each row-block size reached by some M <= max_num_tokens: the smallest and largest such M and the
    smallest multiple of 16 among them (Triton specialises integer arguments on divisibility by 16), so every
    tile configuration and both integer specialisations are compiled.
    """
    if max_num_tokens <= 0:
        return []
    out = set(range(1, min(max_num_tokens, decode_max) + 1))
    if max_num_tokens > decode_max:
        from flint_moe.kernels.nvfp4.grouped_gate_up import grouped_config

        buckets: dict = {}
        for m in range(decode_max + 1, max_num_tokens + 1):
            buckets.setdefault(grouped_config(m * top_k, num_experts)["BM"], []).append(m)
        for ms in buckets.values():
            out |= {ms[0], ms[-1], next((m for m in ms if m % 16 == 0), ms[0])}
    return sorted(out)


class FlintNvfp4Experts(nn.Module):
    """Routed NVFP4 experts of one MoE layer: rule steps 1-10 via ``flint_moe.ops.flint_moe``.

    Args:
        num_experts: E >= 1. hidden_size: H, a positive multiple of 16. intermediate_size: I (checkpoint
            size), a positive multiple of 16; I % 64 != 0 needs ``pad_intermediate_to`` (a multiple of 64).
        top_k: experts per token, 1 <= top_k <= min(E, 16) (the router's limit).
        max_num_tokens: largest batch; on CUDA the kernels for every token count up to it
            (``warmup_token_counts``) are compiled when loading completes. 0 = none. Under the CPU
            interpreter nothing is compiled.
        pad_intermediate_to: per-half intermediate padding of the stored layout (``FlintMoEWeights``).
        device: where the weights live (default: torch's default device). Fixed: load on this device.

    Loading (``load_weights``): (name, tensor) pairs named ``{e}.{gate,up,down}_proj.{weight, weight_scale,
    weight_scale_2}`` (ModelOpt NVFP4 per-expert tensors: ``flint_moe.checkpoints.experts``; ``.input_scale``
    accepted and ignored), in any order and over any number of calls. When the last required tensor arrives the
    stack is repacked into ``FlintMoEWeights`` (FlashInfer CuTe-DSL W4A16 layout; in place when unpadded, so the
    checkpoint-layout w13 storage becomes w1) and the checkpoint buffers are released. ``e`` is canonical decimal
    (``flint_moe.checkpoints.experts.parse_expert_name``: ``00.down_proj.weight`` is refused, never taken for
    expert 0), and loading completes only when every (expert, projection, kind) slot was written once. Errors
    (ValueError, naming the tensor; ``checkpoints.CheckpointError`` for the names): unknown names, an index
    that is not canonical or out of range, a tensor loaded twice or after loading completed, wrong shapes, E4M3
    NaN scale bytes (0x7F / 0xFF), non-finite or negative global scales, gate and up global scales of an expert
    that differ (raised at repack, naming the experts); TypeError for a wrong dtype.

    ``forward(hidden_states, router_weight, shared)``: see :meth:`forward`.
    """

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        top_k: int,
        max_num_tokens: int = 0,
        *,
        pad_intermediate_to: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        from flint_moe.kernels.router import MAX_TOP_K
        from flint_moe.ops import make_route_counter

        for what, v in (("num_experts", num_experts), ("top_k", top_k)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{what}: must be a positive int, got {v!r}")
        if top_k > min(num_experts, MAX_TOP_K):
            raise ValueError(f"top_k: must satisfy 1 <= top_k <= min(E = {num_experts}, {MAX_TOP_K}), got {top_k}")
        if isinstance(max_num_tokens, bool) or not isinstance(max_num_tokens, int) or max_num_tokens < 0:
            raise ValueError(f"max_num_tokens: must be an int >= 0, got {max_num_tokens!r}")
        if pad_intermediate_to is None and isinstance(intermediate_size, int) and intermediate_size % 64:
            raise ValueError(
                f"intermediate_size: {intermediate_size} is not a multiple of 64 (the CuTe-DSL layout's gate/up "
                "interleave); pass pad_intermediate_to=64"
            )
        dev = torch.device(device) if device is not None else torch.empty(0).device
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.top_k, self.max_num_tokens, self.pad_intermediate_to = top_k, max_num_tokens, pad_intermediate_to
        self._stack: ExpertStack | None = ExpertStack(num_experts, hidden_size, intermediate_size, device=dev)
        self.weights = None  # FlintMoEWeights once loaded
        self.compiled_token_counts: list[int] = []
        self._repack_error: str | None = None
        self.register_buffer("route_counter", make_route_counter(dev), persistent=False)
        self._shared = SharedRunner()

    @property
    def device(self) -> torch.device:
        return self.route_counter.device

    @property
    def loaded(self) -> bool:
        """True once every expert is loaded and repacked."""
        return self.weights is not None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load (name, tensor) pairs (class docstring); returns the names accepted by this call."""
        done: set[str] = set()
        for name, t in weights:
            if self._stack is None or self._repack_error is not None:
                raise ValueError(f"{name}: every expert is already loaded (load_weights after completion)")
            self._stack.add(name, t)
            done.add(name)
            if self._stack.complete:
                self._repack()
        return done

    def _repack(self) -> None:
        experts = self._stack.finish()
        inplace = self.pad_intermediate_to is None
        try:  # from_modelopt validates everything before it reorders w13 in place
            self.weights = experts.to_flint_weights(pad_intermediate_to=self.pad_intermediate_to, inplace=inplace)
        except ValueError as exc:
            self._repack_error = str(exc)
            raise
        self._stack = None  # the checkpoint buffers go with it (w13 became w1 when repacked in place)
        del experts
        self._warmup()

    def _warmup(self) -> None:
        from flint_moe.kernels._launch import INTERPRET
        from flint_moe.ops import decode_max_tokens, flint_moe

        if self.device.type != "cuda" or INTERPRET or self.max_num_tokens == 0:
            return
        H, E = self.hidden_size, self.num_experts
        router = torch.zeros(E, H, dtype=torch.bfloat16, device=self.device)
        decode_max = decode_max_tokens(self.num_experts, self.top_k)
        for m in warmup_token_counts(self.max_num_tokens, decode_max, self.top_k, self.num_experts):
            x = torch.zeros(m, H, dtype=torch.bfloat16, device=self.device)
            try:
                flint_moe(x, router, self.weights, self.top_k, self.route_counter, torch.zeros_like(x))
            except (NotImplementedError, ValueError):
                break  # M beyond what the op serves (GROUPED_MAX_TOKENS): forward raises the same error
            self.compiled_token_counts.append(m)
        torch.cuda.synchronize(self.device)

    def forward(
        self,
        hidden_states: torch.Tensor,
        router_weight: torch.Tensor,
        shared: torch.Tensor | nn.Module,
        *,
        taps: dict | None = None,
    ) -> torch.Tensor:
        """Routed experts + shared expert, Flint rule steps 1-10.

        Args:
            hidden_states: bf16 [M, H] contiguous, on the module's device (never modified).
            router_weight: bf16 [E, H] contiguous.
            shared: the shared expert's output, bf16 [M, H], or the shared-expert ``nn.Module`` (called with
                ``hidden_states``; on CUDA it runs on an auxiliary stream overlapping the router and gate/up
                kernels, joined before the down/combine kernel; CUDA-graph safe; on the CPU it runs inline).
            taps: optional dict for the conformance harness (``flint_moe.ops.flint_moe``'s taps: raw fp32
                accumulators and stage outputs; the tapped kernel builds run).
        Returns:
            bf16 [M, H].
        Raises:
            RuntimeError: before every expert is loaded. NotImplementedError: M above what ``flint_moe``
            serves. TypeError / ValueError from ``flint_moe`` (names the tensor).
        """
        if self._repack_error is not None:
            raise RuntimeError(f"FlintNvfp4Experts: loading failed: {self._repack_error}")
        if self.weights is None:
            have = 0 if self._stack is None else len(self._stack.loaded)
            miss = [] if self._stack is None else self._stack.missing(4)
            raise RuntimeError(
                f"FlintNvfp4Experts: forward before loading completed ({have} tensors loaded; missing e.g. "
                f"{', '.join(miss)})"
            )
        from flint_moe.ops import flint_moe

        out, ready = self._shared.start(shared, hidden_states)
        return flint_moe(
            hidden_states, router_weight, self.weights, self.top_k, self.route_counter, out, ready, taps=taps
        )

    def extra_repr(self) -> str:
        return (
            f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
            f"intermediate_size={self.intermediate_size}, top_k={self.top_k}, loaded={self.loaded}"
        )
