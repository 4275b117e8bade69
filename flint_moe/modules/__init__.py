"""torch.nn modules a serving engine calls.

- ``FlintNvfp4Experts``: routed NVFP4 experts of one layer, loaded from per-expert ModelOpt tensors and
  repacked into ``FlintMoEWeights``; forward = ``flint_moe.ops.flint_moe`` + the shared expert on an auxiliary
  CUDA stream.
- ``FlintBf16DecodeMoE``: the BF16 decode path over an existing TRT-LLM-layout BF16 expert layer (no copy).
- ``FlintLLDecodeBlock``: the low-latency decode block (residual add + RMSNorm, router, routed and NVFP4 shared
  experts) over ``LLMoEWeights`` views of the layer; forward = ``flint_moe.ops.flint_moe_ll``.
"""

from __future__ import annotations

from flint_moe.modules.bf16_decode import FlintBf16DecodeMoE
from flint_moe.modules.ll_block import FlintLLDecodeBlock
from flint_moe.modules.nvfp4_experts import FlintNvfp4Experts

__all__ = ["FlintBf16DecodeMoE", "FlintLLDecodeBlock", "FlintNvfp4Experts"]
