"""Intermediate-size padding: each half of w13 ([gate; up]) is padded on its own with zero rows, w2 with zero
columns, so the padded region contributes exactly zero (zero codes x zero scales; bf16 zeros).

shared/notes/layouts.md "Gate/up order": pad each half separately, never after both halves (the kernels split
w13 at the padded half). vLLM: ``align_fp4_moe_weights_for_fi`` / ``align_moe_weights_for_fi``.
"""

from __future__ import annotations

import torch

from flint_moe.layouts._core import check_bf16_experts, check_codes, check_scales, gather_rows, round_up

__all__ = [
    "padded_intermediate",
    "w13_padding_rows",
    "pad_columns",
    "pad_intermediate_bf16",
    "pad_intermediate_nvfp4",
]


def padded_intermediate(intermediate: int, alignment: int) -> int:
    """roundup(intermediate, alignment); ValueError for non-positive sizes."""
    if intermediate <= 0 or alignment <= 0:
        raise ValueError(f"intermediate {intermediate} and alignment {alignment} must be positive")
    return round_up(intermediate, alignment)


def w13_padding_rows(
    intermediate: int, padded: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Source rows of the padded [gate; up] w13 (int64 [2*padded]): ``[0..I) -1.. [I..2I) -1..``."""
    if padded < intermediate:
        raise ValueError(f"padded intermediate {padded} must be >= intermediate {intermediate}")
    r = torch.arange(padded, dtype=torch.long, device=device)
    half = torch.where(r < intermediate, r, torch.full_like(r, -1))
    return torch.cat([half, torch.where(half >= 0, half + intermediate, half)])


def pad_columns(t: torch.Tensor, cols: int, fill: int = 0) -> torch.Tensor:
    """New tensor [..., cols] holding ``t`` in its first columns and byte ``fill`` (as the dtype's zero when 0)
    after them; ``t`` itself when no padding is needed is copied too (the result never aliases ``t``)."""
    if cols < t.shape[-1]:
        raise ValueError(f"pad_columns: target {cols} smaller than {t.shape[-1]}")
    out = torch.empty((*t.shape[:-1], cols), dtype=t.dtype, device=t.device)
    tail = out[..., t.shape[-1] :]
    if t.element_size() == 1:
        tail.view(torch.uint8).fill_(fill)
    else:
        tail.zero_()
    out[..., : t.shape[-1]].copy_(t)
    return out


def pad_intermediate_bf16(
    w13: torch.Tensor, w2: torch.Tensor, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Pad BF16 experts to ``Ip = roundup(I, alignment)``.

    Args:
        w13: bf16 [E, 2I, H] ([gate; up]); w2: bf16 [E, H, I].
    Returns:
        (w13 bf16 [E, 2Ip, H], w2 bf16 [E, H, Ip], Ip): new tensors, zeros in the padding.
    Raises:
        TypeError / ValueError naming the tensor (dtype, shape).
    """
    inter = check_bf16_experts(w13, w2)[1]
    ip = padded_intermediate(inter, alignment)
    w13p = gather_rows(w13.view(torch.int16), w13_padding_rows(inter, ip, w13.device)).view(torch.bfloat16)
    return w13p, pad_columns(w2, ip), ip


def pad_intermediate_nvfp4(
    w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor, alignment: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Pad ModelOpt NVFP4 experts to ``Ip = roundup(I, alignment)`` (alignment a multiple of 16).

    Args:
        w13 uint8 [E, 2I, H/2], w13_scale uint8|float8_e4m3fn [E, 2I, H/16], w2 uint8 [E, H, I/2],
        w2_scale [E, H, I/16]; rows [gate; up].
    Returns:
        (w13 [E, 2Ip, H/2], w13_scale [E, 2Ip, H/16], w2 [E, H, Ip/2], w2_scale [E, H, Ip/16], Ip): new
        tensors; padded codes and scales are byte 0.
    """
    check_codes("w13", w13, (None, None, None))
    E, two_i, h2 = w13.shape
    inter = two_i // 2
    if alignment % 16:
        raise ValueError(f"alignment: {alignment} must be a multiple of 16 (one NVFP4 scale block)")
    check_scales("w13_scale", w13_scale, (E, two_i, h2 // 8))
    check_codes("w2", w2, (E, 2 * h2, inter // 2))
    check_scales("w2_scale", w2_scale, (E, 2 * h2, inter // 16))
    ip = padded_intermediate(inter, alignment)
    rows = w13_padding_rows(inter, ip, w13.device)
    return (
        gather_rows(w13, rows),
        gather_rows(w13_scale, rows),
        pad_columns(w2, ip // 2),
        pad_columns(w2_scale, ip // 16),
        ip,
    )
