"""Rows per warp of the decode block's partial kernel (``ll_partial.rows_per_warp``): hand-derived values at the
block's shapes (blocks per lane = ceil(ceil(K / 16 / S) / 32)); no GPU or CuTe DSL needed."""

import pytest

from flint_moe.kernels.cute import ll_partial
from flint_moe.kernels.cute.ll_partial import rows_per_warp


@pytest.mark.parametrize(
    "n, k, splits, cap, rows",
    [
        (4096, 7168, 1, 28, 2),  # DeepSeek-V3 gate/up: 14 blocks per lane, 2 x 14 = 28 <= 28, 4 x 14 > 28
        (4096, 7168, 1, 16, 1),  # the same under a cap of 16: 2 x 14 > 16
        (7168, 2048, 1, 28, 4),  # DeepSeek-V3 down: 4 blocks per lane, 1792 rows per CTA column
        (7168, 2048, 1, 8, 2),
        (7168, 2048, 1, 4, 1),
        (3072, 5120, 1, 28, 2),  # GLM-4.5 gate/up: 10 blocks per lane
        (1024, 2048, 4, 28, 4),  # Ling-mini-2.0 gate/up at S = 4: 1 block per lane
        (4096, 1408, 1, 28, 4),  # GLM-4.5-Air down: 88 blocks, 3 per lane (a lane tail)
        (24, 2048, 1, 28, 2),  # 6 rows per CTA column: 4 does not divide them
        (12, 2048, 1, 28, 1),  # 3 rows per CTA column: neither 4 nor 2 divides them
    ],
)
def test_rows_per_warp(monkeypatch, n, k, splits, cap, rows):
    monkeypatch.setattr(ll_partial, "BLOCKS_PER_LANE_CAP", cap)
    assert rows_per_warp(n, k, splits) == rows
