"""Real MoE layer shapes (from the models' configs; shared/notes/models-and-formats.md).

Used by the conformance matrix, benchmarks and demos instead of toy sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MoEShape", "MODEL_SHAPES"]


@dataclass(frozen=True)
class MoEShape:
    """One MoE layer: E routed experts, hidden size H, expert intermediate size I, top_k, shared-expert size."""

    name: str
    num_experts: int
    hidden: int
    intermediate: int
    top_k: int
    shared_intermediate: int | None = None


MODEL_SHAPES: dict[str, MoEShape] = {
    s.name: s
    for s in (
        MoEShape("deepseek-v3", 256, 7168, 2048, 8, 2048),
        MoEShape("kimi-k2", 384, 7168, 2048, 8, 2048),
        MoEShape("glm-4.5", 160, 5120, 1536, 8, 1536),
        MoEShape("glm-4.5-air", 128, 4096, 1408, 8, 1408),
        MoEShape("qwen3-30b-a3b", 128, 2048, 768, 8),
        MoEShape("qwen3-235b-a22b", 128, 4096, 1536, 8),
        MoEShape("qwen3-next-80b", 512, 2048, 512, 10, 512),
        MoEShape("gpt-oss-120b", 128, 2880, 2880, 4),
        MoEShape("llama-4-maverick", 128, 5120, 8192, 1, 8192),
        MoEShape("mixtral-8x7b", 8, 4096, 14336, 2),
        MoEShape("minimax-m2", 256, 3072, 1536, 8),
        MoEShape("ling-mini-2.0", 256, 2048, 512, 8, 512),
    )
}
