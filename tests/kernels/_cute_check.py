"""The check both CuTe DSL kernels' addressing tests share: one weight row, read through the functions the
kernels trace (flint_moe/kernels/cute/ll_gate_up.py), against the checkpoint's codes and scale bytes."""

from __future__ import annotations

import torch

from flint_moe.kernels.cute.ll_gate_up import codes_row_word, scale_block_byte, scale_block_shape, scale_row_byte


def assert_row_reads_checkpoint(
    words: torch.Tensor, sf: torch.Tensor, e: int, row: int, rows: int, cols: int, codes: torch.Tensor,
    scales: torch.Tensor,
) -> None:  # fmt: skip
    """Row ``row`` of expert ``e`` of a [rows, cols] NVFP4 matrix: for each block c < len(scales), the scale
    byte at ``scale_row_byte + scale_block_byte`` in ``sf`` (uint8, the swizzled scales of every expert) is
    ``scales[c]`` (E4M3 [blocks]), and the 16 codes of words ``codes_row_word + 2c`` and ``+ 2c + 1`` in
    ``words`` (int32, the packed codes) are ``codes``' (uint8 [cols / 2], two E2M1 codes a byte, low first)."""
    mp, kp = scale_block_shape(rows, cols)
    base = codes_row_word(e, row, rows, cols)
    for blk in range(scales.numel()):
        assert int(sf[scale_row_byte(e, row, mp, kp) + scale_block_byte(blk)]) == int(scales[blk].view(torch.uint8))
        for half in range(2):
            word = int(words[base + 2 * blk + half]) & 0xFFFFFFFF
            for n in range(8):
                c = 16 * blk + 8 * half + n
                assert (word >> (4 * n)) & 15 == (int(codes[c // 2]) >> (4 * (c % 2))) & 15
