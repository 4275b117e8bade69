"""128x4 block-scale swizzle (CUTLASS / TRT-LLM "128x4 interleave") and FlashInfer's 6-D MMA view of it.

Layout (shared/notes/layouts.md, "Block scales ... in the 128x4 swizzle"): a per-expert scale matrix
[M, C] (C = K / 16 for NVFP4, K / 32 for MXFP8) is padded to Mp = roundup(M, 128) rows and
Kp = roundup(C, 4) columns; scale (e, r, c) lives at byte

    e*Mp*Kp + (r // 128) * (Kp / 4) * 512 + (c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4

which is vLLM's ``swizzle_blockscale`` (reshape (E, Mp/128, 4, 32, Kp/4, 4), permute (0, 1, 4, 3, 2, 5)),
FlashInfer's ``block_scale_interleave`` / ``nvfp4_block_scale_interleave`` (CUDA only) and FlashInfer's
CPU helper ``fused_moe.prepare._swizzle_cutile_fp4_scales``. The MMA view is FlashInfer's
``cute_dsl.utils.convert_sf_to_mma_layout``: ``view(E, Mp/128, Kp/4, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)``,
shape (32, 4, Mp/128, 4, Kp/4, E), a non-contiguous view over the swizzled storage.
"""

from __future__ import annotations

import torch

from flint_moe.layouts._core import (
    DEFAULT_SCRATCH_BYTES,
    GATHER_CHUNK_BYTES,
    SCALE_DTYPES,
    expert_groups,
    round_up,
)
from flint_moe.reference._checks import check_tensor

__all__ = ["swizzled_scale_shape", "swizzle_block_scales", "mma_view", "mma_view_storage"]


def swizzled_scale_shape(rows: int, scale_cols: int) -> tuple[int, int]:
    """(Mp, Kp) = (roundup(rows, 128), roundup(scale_cols, 4)) of one expert's swizzled scale block."""
    if rows <= 0 or scale_cols <= 0:
        raise ValueError(f"swizzled_scale_shape: rows {rows} and scale_cols {scale_cols} must be positive")
    return round_up(rows, 128), round_up(scale_cols, 4)


def swizzle_block_scales(
    scale: torch.Tensor,
    *,
    rows: torch.Tensor | None = None,
    fill: int = 0,
    cols: int | None = None,
    name: str = "scale",
    scratch_bytes: int = DEFAULT_SCRATCH_BYTES,
) -> torch.Tensor:
    """Row-permute (optional) and 128x4-swizzle per-expert block scales.

    Args:
        scale: uint8 | float8_e4m3fn (E4M3 or UE8M0 bytes) [E, M, C], row-major (checkpoint layout).
        rows: optional int [R] source-row map applied before the swizzle: pre-swizzle row r is
            ``scale[:, rows[r]]``, or padding (byte ``fill``) where ``rows[r] == -1``. Default: identity (R = M).
        fill: byte written to every padding position (rows >= R, columns >= C, rows with -1).
        cols: logical column count to pad to before the 4-column rounding (>= C; default C). Used when the
            K dimension itself was padded (intermediate-size padding of w2): Kp = roundup(cols, 4).
        name: tensor name used in error messages.
        scratch_bytes: bound on the temporary buffer (experts are processed in groups).

    Returns:
        [E, Mp, Kp] tensor of ``scale``'s dtype, Mp = roundup(R, 128), Kp = roundup(C, 4), holding the swizzled
        bytes in storage order (``out.view(-1)[offset]`` follows the formula in the module docstring).

    Raises:
        TypeError / ValueError naming ``name`` for a wrong dtype, rank or row map.
    """
    check_tensor(name, scale, dtype=SCALE_DTYPES, ndim=3)
    E, M, C = scale.shape
    if rows is None:
        rows = torch.arange(M, device=scale.device)
    rows = rows.to(device=scale.device, dtype=torch.long)
    if rows.dim() != 1 or rows.numel() == 0:
        raise ValueError(f"{name}: row map must be a non-empty 1-D tensor, got shape {tuple(rows.shape)}")
    if bool(((rows < -1) | (rows >= M)).any()):
        raise ValueError(f"{name}: row map entries must lie in [-1, {M})")
    R = rows.numel()
    if cols is not None and cols < C:
        raise ValueError(f"{name}: cols {cols} must be >= the scale column count {C}")
    Mp, Kp = swizzled_scale_shape(R, C if cols is None else cols)
    mT, kT = Mp // 128, Kp // 4
    src = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
    src = src.contiguous()
    out = torch.empty((E, Mp, Kp), dtype=torch.uint8, device=scale.device)
    valid = (rows >= 0).nonzero().flatten()
    simple = Kp == C and R == Mp and valid.numel() == R
    groups = expert_groups(E, Mp * Kp, min(scratch_bytes, GATHER_CHUNK_BYTES))
    g = groups[0][1] - groups[0][0]
    scratch = torch.empty((g, Mp, Kp), dtype=torch.uint8, device=scale.device)
    for s, e in groups:
        buf = scratch[: e - s]
        if simple:
            torch.index_select(src[s:e], 1, rows, out=buf)
        else:
            buf.fill_(fill)
            buf[:, valid, :C] = src[s:e].index_select(1, rows[valid])
        # 4 consecutive scale columns stay together: permute 32-bit words (c % 4 is the byte in the word).
        words = buf.view(torch.int32).view(e - s, mT, 4, 32, kT)
        out[s:e].view(torch.int32).view(e - s, mT, kT, 32, 4).copy_(words.permute(0, 1, 4, 3, 2))
    return out.view(scale.dtype)


def mma_view(swizzled: torch.Tensor, *, name: str = "swizzled") -> torch.Tensor:
    """FlashInfer's 6-D MMA view (``convert_sf_to_mma_layout``) of swizzled scales.

    Args:
        swizzled: contiguous [E, Mp, Kp] (Mp % 128 == 0, Kp % 4 == 0), as returned by ``swizzle_block_scales``.

    Returns:
        A view (same storage, no copy) of shape (32, 4, Mp/128, 4, Kp/4, E) with strides
        (16, 4, Kp/4*512, 1, 512, Mp*Kp) (in elements): ``v[r%32, (r%128)//32, r//128, c%4, c//4, e]`` is
        the scale of (e, r, c).
    """
    check_tensor(name, swizzled, ndim=3)
    E, Mp, Kp = swizzled.shape
    if Mp % 128 or Kp % 4:
        raise ValueError(
            f"{name}: swizzled shape (E, Mp, Kp) needs Mp % 128 == 0 and Kp % 4 == 0, got {(E, Mp, Kp)}"
        )
    if not swizzled.is_contiguous():
        raise ValueError(f"{name}: swizzled scales must be contiguous")
    return swizzled.view(E, Mp // 128, Kp // 4, 32, 4, 4).permute(3, 4, 1, 5, 2, 0)


def mma_view_storage(view: torch.Tensor) -> torch.Tensor:
    """Inverse of ``mma_view``: the contiguous [E, Mp, Kp] swizzled tensor behind a 6-D MMA view (no copy)."""
    check_tensor("mma_view", view, ndim=6)
    o, i, mT, ik, kT, E = view.shape
    if (o, i, ik) != (32, 4, 4):
        raise ValueError(f"mma_view: expected shape (32, 4, mT, 4, kT, E), got {tuple(view.shape)}")
    base = view.permute(5, 2, 4, 0, 1, 3)
    if not base.is_contiguous():
        raise ValueError("mma_view: not a view over contiguous swizzled storage")
    return base.reshape(E, mT * 128, kT * 4)
