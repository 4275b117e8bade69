"""ModelOpt NVFP4 experts -> FlashInfer TRT-LLM-gen NVFP4 layout (``trtllm_fp4_block_scale_moe``).

Layout (shared/notes/layouts.md, "TRT-LLM layouts"; vLLM ``prepare_static_weights_for_trtllm_fp4_moe``):

- ``g1`` uint8 [E, 2Ip, H/2]: rows ``rows.w13_rows_trtllm_gated`` ([up; gate], gated reorder, shuffle with
  epilogue_tile_m = 128) of the packed codes;
- ``g1_scale`` float8_e4m3fn [E, roundup(2Ip, 128), roundup(H/16, 4)]: the same rows, then the 128x4
  swizzle (FlashInfer ``nvfp4_block_scale_interleave``, CUDA only). For 2Ip % 128 == 0 and H % 64 == 0 this is
  FlashInfer's [E, 2I, H/16] exactly;
- ``g2`` uint8 [E, H, Ip/2]: rows ``rows.shuffle_rows(H)``; ``g2_scale`` [E, roundup(H,128), roundup(Ip/16, 4)].
"""

from __future__ import annotations

import torch

from flint_moe.layouts._core import (
    DEFAULT_SCRATCH_BYTES,
    check_codes,
    check_nvfp4_rest,
    gather_rows,
)
from flint_moe.layouts.padding import pad_columns, padded_intermediate
from flint_moe.layouts.rows import shuffle_rows, w13_rows_trtllm_gated
from flint_moe.layouts.swizzle import swizzle_block_scales

__all__ = ["to_trtllm_nvfp4", "EPILOGUE_TILE_M"]

EPILOGUE_TILE_M = 128


def to_trtllm_nvfp4(
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    *,
    pad_intermediate_to: int | None = None,
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Convert ModelOpt NVFP4 experts to the TRT-LLM-gen NVFP4 layout (global scales are unchanged).

    Args:
        w13 uint8 [E, 2I, H/2] ([gate; up]); w13_scale uint8|float8_e4m3fn [E, 2I, H/16]; w2 uint8 [E, H, I/2];
        w2_scale [E, H, I/16]. Needs H % 32 == 0 and Ip % 16 == 0.
        pad_intermediate_to: pad I per half to a multiple of this (multiple of 16).

    Returns:
        (g1, g1_scale, g2, g2_scale) as in the module docstring; new tensors.

    Raises:
        TypeError / ValueError naming the tensor (dtype, shape, alignment, NaN scale bytes).
    """
    check_codes("w13", w13, (None, None, None))
    E, two_i, h2 = w13.shape
    inter, hidden = two_i // 2, 2 * h2
    if two_i % 2 or inter % 16 or inter == 0:
        raise ValueError(f"w13: dimension 1 (2I = {two_i}) must be 2 x a positive multiple of 16")
    if hidden % 32:
        raise ValueError(f"w13: hidden size H = {hidden} must be a multiple of 32 (row shuffle of w2)")
    check_nvfp4_rest(w13, w13_scale, w2, w2_scale, hidden)
    if pad_intermediate_to is not None and (pad_intermediate_to <= 0 or pad_intermediate_to % 16):
        raise ValueError(f"pad_intermediate_to: {pad_intermediate_to} must be a positive multiple of 16")
    ip = inter if pad_intermediate_to is None else padded_intermediate(inter, pad_intermediate_to)
    rows13 = w13_rows_trtllm_gated(inter, ip, EPILOGUE_TILE_M, w13.device)
    rows2 = shuffle_rows(hidden, EPILOGUE_TILE_M, w13.device)
    g1 = gather_rows(w13, rows13)
    g1s = swizzle_block_scales(w13_scale, rows=rows13, name="w13_scale", scratch_bytes=scratch_bytes)
    g2 = gather_rows(pad_columns(w2, ip // 2) if ip != inter else w2, rows2)
    g2s = swizzle_block_scales(
        w2_scale, rows=rows2, cols=ip // 16, name="w2_scale", scratch_bytes=scratch_bytes
    )
    return g1, g1s.view(torch.float8_e4m3fn), g2, g2s.view(torch.float8_e4m3fn)
