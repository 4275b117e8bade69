"""``CheckpointLayer``: one MoE layer read from a checkpoint (experts in ModelOpt layout + router weight)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flint_moe.checkpoints.experts import ModelOptExperts
from flint_moe.reference._checks import check_tensor

__all__ = ["CheckpointLayer", "router_to_bf16"]


def router_to_bf16(name: str, t: object, num_experts: int | None = None, hidden: int | None = None) -> torch.Tensor:
    """The router weight as bf16 [E, H]: bf16 as given; fp32 / fp16 only if every value is a bf16 value
    (converters such as llama.cpp's write the bf16 router as F32; a value that would round is a ValueError,
    never a silent change). TypeError for other dtypes; ValueError for a wrong shape or a NaN / infinite value
    (naming its index)."""
    check_tensor(name, t, dtype=(torch.bfloat16, torch.float32, torch.float16), shape=(num_experts, hidden))
    inf = ~torch.isfinite(t)
    if bool(inf.any()):
        idx = tuple(int(i) for i in inf.nonzero()[0].tolist())
        raise ValueError(f"{name}: non-finite value {float(t[idx])} at index {idx} (router logits must be finite)")
    if t.dtype == torch.bfloat16:
        return t.contiguous()
    b = t.to(torch.bfloat16)
    bad = b.float() != t.float()
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0].tolist())
        raise ValueError(
            f"{name}: {t.dtype} value {float(t[idx])!r} at index {idx} is not a bf16 value (the Flint rule's router "
            "weight is bf16; refusing to round it)"
        )
    return b.contiguous()


@dataclass
class CheckpointLayer:
    """One MoE layer of a checkpoint.

    Fields:
        layer: the layer index in the checkpoint.
        experts: the routed experts, ModelOpt layout (``checkpoints.experts.ModelOptExperts``).
        router_weight: bf16 [E, H] (``...mlp.gate.weight``; ModelOpt leaves it unquantized).
        top_k: experts per token from the checkpoint's config (``num_experts_per_tok`` / GGUF
            ``<arch>.expert_used_count``), None when the checkpoint does not say.
        source: ``"modelopt"`` (safetensors), ``"gguf-modelopt"`` (GGUF, per-expert ModelOpt tensors) or
            ``"gguf-nvfp4"`` (GGUF, llama.cpp NVFP4 type 40 merged experts).
        path: the checkpoint path read.
        names: checkpoint tensor names read, for reports.
    """

    layer: int
    experts: ModelOptExperts
    router_weight: torch.Tensor
    top_k: int | None
    source: str
    path: str
    names: list[str] = field(default_factory=list, repr=False)

    @property
    def num_experts(self) -> int:
        return self.experts.num_experts

    @property
    def hidden_size(self) -> int:
        return self.experts.hidden_size

    @property
    def intermediate_size(self) -> int:
        return self.experts.intermediate_size

    def resolve_top_k(self, top_k: int | None) -> int:
        """``top_k`` if given, else the checkpoint's; ValueError if neither is known."""
        k = top_k if top_k is not None else self.top_k
        if k is None:
            raise ValueError(
                f"top_k: the checkpoint {self.path} does not record experts per token; pass top_k explicitly"
            )
        return k

    def build_module(
        self,
        top_k: int | None = None,
        *,
        max_num_tokens: int = 0,
        pad_intermediate_to: int | None = None,
        device: torch.device | str | None = None,
    ):
        """A loaded ``modules.FlintNvfp4Experts`` for this layer (the experts go through its ``load_weights``).

        ``pad_intermediate_to`` defaults to 64 when I % 64 != 0 (the CuTe-DSL layout's 64-row interleave).
        """
        from flint_moe.modules import FlintNvfp4Experts

        if pad_intermediate_to is None and self.intermediate_size % 64:
            pad_intermediate_to = 64
        mod = FlintNvfp4Experts(
            self.num_experts, self.hidden_size, self.intermediate_size, self.resolve_top_k(top_k),
            max_num_tokens, pad_intermediate_to=pad_intermediate_to, device=device,
        )  # fmt: skip
        mod.load_weights(self.experts.named_tensors())
        return mod
