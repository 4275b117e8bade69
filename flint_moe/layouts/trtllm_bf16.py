"""BF16 experts -> TRT-LLM BlockMajorK layout (FlashInfer ``trtllm_bf16_moe``).

Layout (shared/notes/layouts.md, "TRT-LLM layouts"): per expert, rows permuted (w13: [up; gate] gated reorder
then epilogue-tile shuffle with epilogue_tile_m = 128, i.e. ``rows.w13_rows_trtllm_gated``; w2: shuffle only),
then BlockMajorK with 64 bf16 elements (128 bytes) per block:

    g1[e, k // 64, m, k % 64] = w13[e, rows13[m], k]      g1: bf16 [E, H/64, 2I, 64]
    g2[e, k // 64, m, k % 64] = w2[e, rows2[m], k]        g2: bf16 [E, I/64, H, 64]

FlashInfer: ``fused_moe.core._maybe_get_cached_w3_w1_permute_indices`` / ``get_w2_permute_indices_with_cache``
(epilogue_tile_m 128) + ``convert_to_block_layout(blockK=128)`` on the uint8 view; vLLM
``convert_moe_weights_to_flashinfer_trtllm_block_layout`` (same bytes, one expert of scratch).
"""

from __future__ import annotations

import torch

from flint_moe.layouts._core import DEFAULT_SCRATCH_BYTES, GATHER_CHUNK_BYTES, check_bf16_experts, expert_groups
from flint_moe.layouts.rows import invert_rows, shuffle_rows, w13_rows_trtllm_gated
from flint_moe.reference._checks import check_same_device

__all__ = ["BLOCK_K_ELEMS", "EPILOGUE_TILE_M", "trtllm_bf16_row_maps", "to_trtllm_bf16", "block_major_k"]

BLOCK_K_ELEMS = 64  #: bf16 elements per BlockMajorK block (128 bytes)
EPILOGUE_TILE_M = 128


def trtllm_bf16_row_maps(
    hidden: int, intermediate: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logical -> physical row maps of the TRT-LLM BF16 expert weights (for the decode kernels).

    Returns ``(map13 int32 [2I], map2 int32 [H])``: ``map13[l]`` is the physical row (the ``m`` of
    ``g1[e, :, m, :]``) of logical w13 row ``l`` in [gate; up] order; ``map2[h]`` that of w2 output row h.
    Inverse of the physical -> logical maps ``rows.w13_rows_trtllm_gated(I)`` / ``rows.shuffle_rows(H)``.
    Raises ValueError unless 2I and H are positive multiples of 32.
    """
    src13 = w13_rows_trtllm_gated(intermediate, None, EPILOGUE_TILE_M, device)
    src2 = shuffle_rows(hidden, EPILOGUE_TILE_M, device)
    return (
        invert_rows(src13, 2 * intermediate).to(torch.int32),
        invert_rows(src2, hidden).to(torch.int32),
    )


def block_major_k(
    w: torch.Tensor,
    rows: torch.Tensor,
    *,
    block: int,
    out: torch.Tensor | None = None,
    inplace: bool = False,
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
    name: str = "w",
) -> torch.Tensor:
    """``out[e, k // block, m, k % block] = w[e, rows[m], k]`` for every expert (any 1- or 2-byte dtype).

    ``rows``: permutation of [0, M). Out of place: one ``index_select`` over a strided view into ``out``
    (allocated if None). ``inplace=True``: groups of experts go through a scratch buffer of at most
    ``max(scratch_bytes, one expert)`` bytes and are written back into ``w``'s storage; returns a view of ``w``.
    """
    E, M, K = w.shape
    if K % block:
        raise ValueError(f"{name}: K = {K} must be a multiple of the BlockMajorK block {block}")
    idx = rows.to(device=w.device, dtype=torch.long)
    iv = torch.int16 if w.element_size() == 2 else torch.uint8
    blocked = w.view(iv).view(E, M, K // block, block).permute(0, 2, 1, 3)
    shape = (E, K // block, M, block)
    if not inplace:
        if out is None:
            out = torch.empty(shape, dtype=w.dtype, device=w.device)
        out_i = out.view(iv)
        for s, e in expert_groups(E, M * K * w.element_size(), GATHER_CHUNK_BYTES):
            torch.index_select(blocked[s:e], 2, idx, out=out_i[s:e])
        return out
    if not w.is_contiguous():
        raise ValueError(f"{name}: must be contiguous for inplace=True")
    groups = expert_groups(E, M * K * w.element_size(), min(scratch_bytes, GATHER_CHUNK_BYTES))
    g = groups[0][1] - groups[0][0]
    scratch = torch.empty((g, *shape[1:]), dtype=iv, device=w.device)
    flat = w.view(iv).view(E, -1)
    for s, e in groups:
        buf = scratch[: e - s]
        torch.index_select(blocked[s:e], 2, idx, out=buf)
        flat[s:e].copy_(buf.view(e - s, -1))
    return w.view(shape)


def to_trtllm_bf16(
    w13: torch.Tensor, w2: torch.Tensor, *, inplace: bool = False, scratch_bytes: int = DEFAULT_SCRATCH_BYTES
) -> tuple[torch.Tensor, torch.Tensor]:
    """[gate; up] BF16 experts -> TRT-LLM BF16 BlockMajorK (gated reorder + epilogue-tile shuffle).

    Args:
        w13: bf16 [E, 2I, H] ([gate; up]); w2: bf16 [E, H, I]. Needs H % 64 == 0 and I % 64 == 0
            (the TRT-LLM BF16 launcher itself requires I % 128 == 0: pad with ``padding.pad_intermediate_bf16``).
        inplace: reorder inside ``w13`` / ``w2``'s storage (both are modified) with a scratch buffer of at
            most ``max(scratch_bytes, one expert)``; the results are views of the inputs.

    Returns:
        (g1 bf16 [E, H/64, 2I, 64], g2 bf16 [E, I/64, H, 64]).

    Raises:
        TypeError (dtype) / ValueError (shape, alignment, device) naming the tensor.
    """
    E, inter, H = check_bf16_experts(w13, w2)
    check_same_device(w13=w13, w2=w2)
    if H % BLOCK_K_ELEMS:
        raise ValueError(f"w13: hidden size H = {H} must be a multiple of {BLOCK_K_ELEMS} (BlockMajorK)")
    if inter % BLOCK_K_ELEMS:
        raise ValueError(
            f"w2: intermediate size I = {inter} must be a multiple of {BLOCK_K_ELEMS} (BlockMajorK); "
            "pad it with flint_moe.layouts.padding.pad_intermediate_bf16"
        )
    rows13 = w13_rows_trtllm_gated(inter, None, EPILOGUE_TILE_M, w13.device)
    rows2 = shuffle_rows(H, EPILOGUE_TILE_M, w13.device)
    kw = dict(block=BLOCK_K_ELEMS, inplace=inplace, scratch_bytes=scratch_bytes)
    return (
        block_major_k(w13, rows13, name="w13", **kw),
        block_major_k(w2, rows2, name="w2", **kw),
    )
