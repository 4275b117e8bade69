"""FP8 experts -> the FlashInfer TRT-LLM FP8 layouts of vLLM's ``prepare_fp8_moe_layer_for_fi`` (is_trtllm).

All take checkpoint [gate; up] w13 (float8_e4m3fn [E, 2I, H]) and w2 (float8_e4m3fn [E, H, I]):

- per-tensor FP8 (``to_trtllm_fp8_per_tensor``): w13 rows ``rows.w13_rows_trtllm_gated`` (epilogue 128), w2
  rows ``rows.shuffle_rows(H, 128)``; shapes unchanged. (vLLM ``rotate_weights_for_fi_trtllm_fp8_per_tensor_moe``.)
- DeepSeek FP8 block scales (``to_trtllm_deepseek_fp8``): [up; gate] halves + shuffle with epilogue_tile_m 64
  (block 16) + BlockMajorK with 128 one-byte elements: ``g1[e, k//128, m, k%128] = w13[e, rows13[m], k]``,
  ``g1`` [E, H/128, 2I, 128], ``g2`` [E, I/128, H, 128]; fp32 block scales [E, 2I/128, H/128] get their halves
  swapped ([up; gate]), w2's are unchanged. (vLLM ``_shuffle_deepseek_fp8_moe_weights``.)
- MXFP8 (``to_trtllm_mxfp8``): I padded to 128 and H to 256 (weights 0, UE8M0 scales 127 = 1.0), gated
  reorder + shuffle (128) on weights, the same rows + 128x4 swizzle on the scales, reshaped to
  [E, 2Ip, Hp/32] / [E, Hp, Ip/32]. (vLLM ``align_mxfp8_moe_weights_for_fi_trtllm`` + ``_shuffle_mxfp8_moe_weights``.)
"""

from __future__ import annotations

import torch

from flint_moe.layouts._core import DEFAULT_SCRATCH_BYTES, gather_rows
from flint_moe.layouts.padding import pad_columns, padded_intermediate
from flint_moe.layouts.rows import shuffle_rows, w13_rows_trtllm_gated, w13_rows_trtllm_swapped
from flint_moe.layouts.swizzle import swizzle_block_scales
from flint_moe.layouts.trtllm_bf16 import block_major_k
from flint_moe.reference._checks import check_same_device, check_tensor

__all__ = ["to_trtllm_fp8_per_tensor", "to_trtllm_deepseek_fp8", "to_trtllm_mxfp8", "UE8M0_ONE"]

FP8 = torch.float8_e4m3fn
UE8M0_ONE = 127  #: UE8M0 byte of 1.0, used for padded MXFP8 scales
DEEPSEEK_BLOCK = 128


def _check_pair(w13: torch.Tensor, w2: torch.Tensor) -> tuple[int, int, int]:
    check_tensor("w13", w13, dtype=FP8, ndim=3)
    E, two_i, H = w13.shape
    if two_i % 2 or two_i == 0:
        raise ValueError(f"w13: dimension 1 (2I) must be positive and even, got {two_i}")
    check_tensor("w2", w2, dtype=FP8, shape=(E, H, two_i // 2))
    check_same_device(w13=w13, w2=w2)
    return E, two_i // 2, H


def to_trtllm_fp8_per_tensor(w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor-scaled FP8 -> TRT-LLM layout (gated reorder + shuffle; per-tensor scales unchanged).

    Args: w13 float8_e4m3fn [E, 2I, H] ([gate; up]), w2 float8_e4m3fn [E, H, I]; 2I % 32 == 0, H % 32 == 0.
    Returns: (g1 [E, 2I, H], g2 [E, H, I]) float8_e4m3fn, new tensors.
    Raises: TypeError / ValueError naming the tensor.
    """
    E, inter, H = _check_pair(w13, w2)
    if inter % 16:
        raise ValueError(
            f"w13: intermediate size I = {inter} must be a multiple of 16 (2I rows shuffled by 32)"
        )
    if H % 32:
        raise ValueError(f"w2: hidden size H = {H} must be a multiple of 32 (rows shuffled by 32)")
    g1 = gather_rows(w13.view(torch.uint8), w13_rows_trtllm_gated(inter, None, 128, w13.device))
    g2 = gather_rows(w2.view(torch.uint8), shuffle_rows(H, 128, w2.device))
    return g1.view(FP8), g2.view(FP8)


def to_trtllm_deepseek_fp8(
    w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek (128x128 block-scaled) FP8 -> TRT-LLM shuffled BlockMajorK layout.

    Args: w13 float8_e4m3fn [E, 2I, H], w13_scale fp32 [E, 2I/128, H/128], w2 [E, H, I], w2_scale fp32
        [E, H/128, I/128]; H % 128 == 0 and I % 128 == 0.
    Returns: (g1 float8 [E, H/128, 2I, 128], g1_scale fp32 [E, 2I/128, H/128] ([up; gate] halves),
        g2 float8 [E, I/128, H, 128], g2_scale fp32 [E, H/128, I/128] (a copy)).
    Raises: TypeError / ValueError naming the tensor.
    """
    E, inter, H = _check_pair(w13, w2)
    b = DEEPSEEK_BLOCK
    if H % b:
        raise ValueError(f"w13: hidden size H = {H} must be a multiple of {b}")
    if inter % b:
        raise ValueError(f"w2: intermediate size I = {inter} must be a multiple of {b}")
    check_tensor("w13_scale", w13_scale, dtype=torch.float32, shape=(E, 2 * inter // b, H // b))
    check_tensor("w2_scale", w2_scale, dtype=torch.float32, shape=(E, H // b, inter // b))
    rows13 = w13_rows_trtllm_swapped(inter, None, 64, w13.device)
    rows2 = shuffle_rows(H, 64, w2.device)
    g1 = block_major_k(w13.view(torch.uint8), rows13, block=b, name="w13").view(FP8)
    g2 = block_major_k(w2.view(torch.uint8), rows2, block=b, name="w2").view(FP8)
    half = inter // b
    g1s = torch.cat([w13_scale[:, half:], w13_scale[:, :half]], dim=1)
    return g1, g1s, g2, w2_scale.clone()


def to_trtllm_mxfp8(
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    *,
    intermediate_alignment: int = 128,
    hidden_alignment: int = 256,
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """MXFP8 (UE8M0 scale per 32 elements) -> TRT-LLM MXFP8 layout, padding I and H.

    Args: w13 float8_e4m3fn [E, 2I, H], w13_scale uint8 [E, 2I, H/32], w2 [E, H, I], w2_scale uint8
        [E, H, I/32]; H % 32 == 0, I % 32 == 0. Alignments must be multiples of 128.
    Returns: (g1 float8 [E, 2Ip, Hp], g1_scale uint8 [E, 2Ip, Hp/32] (swizzled), g2 float8 [E, Hp, Ip],
        g2_scale uint8 [E, Hp, Ip/32] (swizzled), Ip, Hp). Padded weights are 0, padded scales 127.
    Raises: TypeError / ValueError naming the tensor.
    """
    E, inter, H = _check_pair(w13, w2)
    if H % 32 or inter % 32:
        raise ValueError(f"w13: H = {H} and I = {inter} must be multiples of 32 (MXFP8 block)")
    if (
        intermediate_alignment % 128
        or hidden_alignment % 128
        or intermediate_alignment <= 0
        or hidden_alignment <= 0
    ):
        raise ValueError("intermediate_alignment / hidden_alignment must be positive multiples of 128")
    check_tensor("w13_scale", w13_scale, dtype=torch.uint8, shape=(E, 2 * inter, H // 32))
    check_tensor("w2_scale", w2_scale, dtype=torch.uint8, shape=(E, H, inter // 32))
    ip = padded_intermediate(inter, intermediate_alignment)
    hp = padded_intermediate(H, hidden_alignment)
    rows13 = w13_rows_trtllm_gated(inter, ip, 128, w13.device)
    rows2 = shuffle_rows(hp, 128, w2.device)
    rows2 = torch.where(rows2 < H, rows2, torch.full_like(rows2, -1))
    w13u = w13.view(torch.uint8)
    g1 = gather_rows(pad_columns(w13u, hp) if hp != H else w13u, rows13)
    g2 = gather_rows(pad_columns(w2.view(torch.uint8), ip), rows2)
    kw = dict(fill=UE8M0_ONE, scratch_bytes=scratch_bytes)
    g1s = swizzle_block_scales(w13_scale, rows=rows13, cols=hp // 32, name="w13_scale", **kw)
    g2s = swizzle_block_scales(w2_scale, rows=rows2, cols=ip // 32, name="w2_scale", **kw)
    return g1.view(FP8), g1s, g2.view(FP8), g2s, ip, hp
