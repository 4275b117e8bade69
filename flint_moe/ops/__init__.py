"""Public ops of the decode path: routing, the NVFP4 MoE and the BF16 TRT-LLM-layout MoE.

- ``make_route_counter`` / ``route``: rule steps 1-4 (flint_moe/ops/route.py).
- ``flint_moe``: NVFP4 W4A16 routed experts on ``FlintMoEWeights``, by the decode kernels for M <=
  ``decode_max_tokens(E, k)`` (at most ``DECODE_DISPATCH_MAX_TOKENS``; ``DECODE_MAX_TOKENS``: the largest M the
  decode kernels serve; flint_moe/ops/moe_nvfp4.py).
- ``flint_moe_grouped``: the same NVFP4 MoE by grouped GEMMs for larger batches (``flint_moe`` calls it for
  M > ``decode_max_tokens(E, k)``; flint_moe/ops/moe_nvfp4_grouped.py).
- ``flint_moe_bf16_decode``: BF16 experts in the TRT-LLM BlockMajorK layout for M <= ``DECODE_BF16_MAX_TOKENS``
  (flint_moe/ops/moe_bf16.py); ``check_row_map_status``: every row map it has checked compared again (writes
  through ``.data`` / ``.numpy()`` included; flint_moe/ops/_checks.py).
- ``flint_moe_ll``: the low-latency decode block (residual add + RMSNorm, routing, routed and shared NVFP4
  experts, combine: rule step 11 then steps 1-10) for M <= ``LL_MOE_MAX_TOKENS`` on ``LLMoEWeights``, Triton
  router + CuTe DSL expert kernels (flint_moe/ops/moe_ll.py); ``ll_route``: its first stage alone (step 11
  fused with steps 1-4).
- ``quantize_routed_nvfp4_input``: the per-token NVFP4 input of the routed experts (numerics.md "Per-token
  NVFP4 experts", P1-P5), padded (flint_moe/ops/pertoken_quant.py).
- ``prepare_routed_nvfp4_weights`` / ``routed_nvfp4_moe``: the per-token NVFP4 x NVFP4 routed experts (P6-P12;
  flint_moe/ops/moe_pertoken.py).
"""

from __future__ import annotations

from ._checks import check_row_map_status
from .moe_bf16 import DECODE_BF16_MAX_TOKENS, flint_moe_bf16_decode
from .moe_ll import LL_MOE_MAX_TOKENS, flint_moe_ll, ll_route
from .moe_nvfp4 import DECODE_DISPATCH_MAX_TOKENS, DECODE_MAX_TOKENS, decode_max_tokens, flint_moe
from .moe_nvfp4_grouped import GROUPED_MAX_TOKENS, flint_moe_grouped
from .moe_pertoken import prepare_routed_nvfp4_weights, routed_nvfp4_moe
from .pertoken_quant import quantize_routed_nvfp4_input
from .route import ROUTE_GEMV_MAX_TOKENS, make_route_counter, route

__all__ = [
    "DECODE_BF16_MAX_TOKENS",
    "DECODE_DISPATCH_MAX_TOKENS",
    "DECODE_MAX_TOKENS",
    "GROUPED_MAX_TOKENS",
    "LL_MOE_MAX_TOKENS",
    "ROUTE_GEMV_MAX_TOKENS",
    "check_row_map_status",
    "decode_max_tokens",
    "flint_moe",
    "flint_moe_bf16_decode",
    "flint_moe_grouped",
    "flint_moe_ll",
    "ll_route",
    "make_route_counter",
    "prepare_routed_nvfp4_weights",
    "quantize_routed_nvfp4_input",
    "route",
    "routed_nvfp4_moe",
]
