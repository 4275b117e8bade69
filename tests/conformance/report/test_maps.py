"""Mismatch maps and ulp histograms (flint_moe.conformance.report.maps), checked against hand-counted masks."""

from __future__ import annotations

import math

import pytest
import torch

from flint_moe.conformance.report.maps import ULP_BINS, map_dense, mismatch_map, ulp_histogram


def test_small_mask_is_kept_cell_for_cell():
    bad = torch.zeros(3, 5, dtype=torch.bool)
    bad[0, 4] = bad[2, 0] = bad[2, 1] = True
    m = mismatch_map(bad)
    assert m["shape"] == [3, 5] and m["cell"] == [1, 1] and m["grid"] == [3, 5] and m["total"] == 3
    assert m["cells"] == [[0, 4, 1], [2, 0, 1], [2, 1, 1]]


def test_downsampled_counts_and_leading_dims_flattened():
    bad = torch.zeros(2, 3, 10, dtype=torch.bool)  # [M, k, H] -> 6 rows x 10 cols
    bad[0, 0, :] = True  # row 0: 10 elements
    bad[1, 2, 9] = True  # row 5, col 9
    m = mismatch_map(bad, rows=4, cols=4)
    # rh = ceil(6/4) = 2, cw = ceil(10/4) = 3 -> grid 3 x 4.
    assert m["dims"] == [2, 3, 10] and m["shape"] == [6, 10] and m["cell"] == [2, 3] and m["grid"] == [3, 4]
    assert map_dense(m) == [[3, 3, 3, 1], [0, 0, 0, 0], [0, 0, 0, 1]]
    assert sum(c for _, _, c in m["cells"]) == m["total"] == 11


def test_empty_mask_has_no_cells_and_bad_input_raises():
    m = mismatch_map(torch.zeros(4, 300, dtype=torch.bool))
    assert m["cells"] == [] and m["total"] == 0 and m["cell"] == [1, 3] and m["grid"] == [4, 100]
    with pytest.raises(ValueError, match="bool tensor"):
        mismatch_map(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="at least one dimension"):
        mismatch_map(torch.tensor(True))


def test_ulp_histogram_bins():
    u = torch.tensor([0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 7.0, 8.0, 2.0**31, math.inf, 2.0**40])
    h = ulp_histogram(u)
    assert len(h) == ULP_BINS and sum(h) == u.numel()
    assert h[0] == 2 and h[1] == 1 and h[2] == 2 and h[3] == 2 and h[4] == 1 and h[ULP_BINS - 1] == 3
    with pytest.raises(ValueError, match="NaN"):
        ulp_histogram(torch.tensor([math.nan]))
