"""Production weight-layout converters: checkpoint (ModelOpt / HF) experts -> the layouts the kernels read
in place (FlashInfer CuTe-DSL W4A16, TRT-LLM BF16 / NVFP4 / FP8 / DeepSeek-FP8 / MXFP8, the per-token NVFP4
grouped-GEMM layout).

Every conversion is vectorised over experts (one gather per tensor; bounded scratch where a full copy
would double memory). Index formulas: shared/notes/layouts.md and docs/layouts.md. The golden model reads
these layouts back through the independent decoders in ``flint_moe.reference.layouts``.
"""

from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights, merge_gate_up_global_scales
from flint_moe.layouts.ll_weights import LLMoEWeights, ll_weights_from_layers
from flint_moe.layouts.padding import pad_intermediate_bf16, pad_intermediate_nvfp4
from flint_moe.layouts.routed_nvfp4 import RoutedNVFP4Weights, to_routed_nvfp4
from flint_moe.layouts.swizzle import mma_view, mma_view_storage, swizzle_block_scales, swizzled_scale_shape
from flint_moe.layouts.trtllm_bf16 import to_trtllm_bf16, trtllm_bf16_row_maps
from flint_moe.layouts.trtllm_fp8 import to_trtllm_deepseek_fp8, to_trtllm_fp8_per_tensor, to_trtllm_mxfp8
from flint_moe.layouts.trtllm_nvfp4 import to_trtllm_nvfp4

__all__ = [
    "FlintMoEWeights",
    "merge_gate_up_global_scales",
    "LLMoEWeights",
    "ll_weights_from_layers",
    "pad_intermediate_bf16",
    "pad_intermediate_nvfp4",
    "RoutedNVFP4Weights",
    "to_routed_nvfp4",
    "mma_view",
    "mma_view_storage",
    "swizzle_block_scales",
    "swizzled_scale_shape",
    "to_trtllm_bf16",
    "trtllm_bf16_row_maps",
    "to_trtllm_nvfp4",
    "to_trtllm_fp8_per_tensor",
    "to_trtllm_deepseek_fp8",
    "to_trtllm_mxfp8",
]
