"""Row maps of the MoE weight layouts (physical row -> source row, int64, -1 = padding row).

All maps are closed forms from shared/notes/layouts.md, vectorised (no Python loop over rows), identical
for every expert, and checked against FlashInfer 0.7.4 in tests/layouts (oracle tests).

Source convention: the checkpoint's fused gate/up rows ``[gate; up]`` (I rows each, logical row ``g`` of the
gate = row ``g``, up row ``u`` = row ``I + u``). When the intermediate size is padded to ``Ip`` the layout
holds ``2 * Ip`` rows; rows of the padded region map to -1.
"""

from __future__ import annotations

import torch

__all__ = [
    "shuffle_block_size",
    "shuffle_rows",
    "gated_reorder_rows",
    "w13_rows_cutedsl",
    "w13_rows_trtllm_gated",
    "w13_rows_trtllm_swapped",
    "invert_rows",
]


def _check(name: str, value: int, multiple: int) -> None:
    if value <= 0 or value % multiple:
        raise ValueError(f"{name}: {value} must be a positive multiple of {multiple}")


def shuffle_block_size(epilogue_tile_m: int) -> int:
    """TRT-LLM ``shuffleMatrixA`` block: 32 rows if ``epilogue_tile_m % 128 == 0`` else 16
    (FlashInfer ``utils.get_shuffle_block_size``)."""
    if epilogue_tile_m <= 0:
        raise ValueError(f"epilogue_tile_m: {epilogue_tile_m} must be positive")
    return 32 if epilogue_tile_m % 128 == 0 else 16


def shuffle_rows(
    m: int, epilogue_tile_m: int = 128, device: torch.device | str | None = None
) -> torch.Tensor:
    """Epilogue-tile row shuffle: ``out[r] = in[(r//B)*B + (r%8)*(B//8) + (r%B)//8]``.

    FlashInfer: ``utils.get_shuffle_matrix_a_row_indices`` / ``shuffle_matrix_a``. Returns int64 [m].
    Raises ValueError unless ``m`` is a positive multiple of B.
    """
    b = shuffle_block_size(epilogue_tile_m)
    _check("rows", m, b)
    r = torch.arange(m, dtype=torch.long, device=device)
    return (r // b) * b + (r % 8) * (b // 8) + (r % b) // 8


def gated_reorder_rows(m: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Gated-activation row reorder: ``out[2i] = x[i]``, ``out[2i+1] = x[m/2 + i]``.

    FlashInfer: ``fused_moe.core.get_reorder_rows_for_gated_act_gemm_row_indices``. Returns int64 [m].
    """
    _check("rows", m, 2)
    r = torch.arange(m, dtype=torch.long, device=device)
    return torch.where(r % 2 == 0, r // 2, m // 2 + r // 2)


def _valid(half_row: torch.Tensor, is_up: torch.Tensor, inter: int) -> torch.Tensor:
    """Map (row within a padded half, half) -> logical [gate; up] row, or -1 inside the padding."""
    logical = torch.where(is_up, inter + half_row, half_row)
    return torch.where(half_row < inter, logical, torch.full_like(half_row, -1))


def _padded(inter: int, padded: int | None) -> int:
    _check("intermediate", inter, 1)
    p = inter if padded is None else padded
    if p < inter:
        raise ValueError(f"padded intermediate {p} must be >= intermediate {inter}")
    return p


def w13_rows_cutedsl(
    intermediate: int, padded_intermediate: int | None = None, group: int = 64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """FlashInfer CuTe-DSL W4A16 gate/up rows: [up; gate] interleaved by ``group`` rows.

    Physical row r (of 2*Ip): block b = r // (2*group), w = r % (2*group); w < group holds up row
    ``b*group + w``, else gate row ``b*group + w - group`` (FlashInfer ``reorder_w13_to_w31`` then
    ``fused_moe.prepare.interleave_cute_dsl_moe_weights`` / ``_interleave_linear_and_gate(group_size=64)``).
    Returns int64 [2*Ip] of source rows in ``[gate; up]`` (I rows each), -1 for padding.
    Raises ValueError unless Ip is a positive multiple of ``group``.
    """
    ip = _padded(intermediate, padded_intermediate)
    _check("padded intermediate", ip, group)
    r = torch.arange(2 * ip, dtype=torch.long, device=device)
    w = r % (2 * group)
    half_row = (r // (2 * group)) * group + w % group
    return _valid(half_row, w < group, intermediate)


def w13_rows_trtllm_gated(
    intermediate: int, padded_intermediate: int | None = None, epilogue_tile_m: int = 128,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """TRT-LLM gated gemm1 rows: [up; gate] -> gated reorder -> epilogue-tile shuffle.

    ``j = shuffle(r)``; ``j`` even: up row ``j // 2``, odd: gate row ``j // 2`` (FlashInfer
    ``fused_moe.core._maybe_get_cached_w3_w1_permute_indices(..., is_gated_act_gemm=True)`` on [up; gate], or
    vLLM's rotation by half on [gate; up]). Returns int64 [2*Ip] source rows in ``[gate; up]``, -1 = padding.
    """
    ip = _padded(intermediate, padded_intermediate)
    j = shuffle_rows(2 * ip, epilogue_tile_m, device)
    return _valid(j // 2, j % 2 == 0, intermediate)


def w13_rows_trtllm_swapped(
    intermediate: int, padded_intermediate: int | None = None, epilogue_tile_m: int = 64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """[up; gate] halves (no gated reorder) then the epilogue-tile shuffle (DeepSeek-FP8 BlockMajorK layout,
    epilogue_tile_m = 64, vLLM ``swap_w13_to_w31`` + ``_shuffle_deepseek_fp8_moe_weights``).
    Returns int64 [2*Ip] source rows in ``[gate; up]``, -1 = padding."""
    ip = _padded(intermediate, padded_intermediate)
    j = shuffle_rows(2 * ip, epilogue_tile_m, device)
    return _valid(j % ip, j < ip, intermediate)


def invert_rows(src: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Inverse of a physical -> source row map: ``inv[src[r]] = r`` (int64 [n]; -1 where no physical row)."""
    n = int(src.max()) + 1 if n is None else n
    inv = torch.full((n,), -1, dtype=torch.long, device=src.device)
    ok = src >= 0
    inv[src[ok]] = torch.arange(src.numel(), device=src.device)[ok]
    return inv
