"""Compact, JSON-ready pictures of where a stage differs, kept in report.json for report.html.

- :func:`mismatch_map` ``(bad) -> dict``: a boolean mask of one stage (``[M, H]``, ``[M, k, H]``, ...; the
  leading dimensions are flattened into rows: token, or token x slot) downsampled to at most
  :data:`MAP_ROWS` x :data:`MAP_COLS` cells, each cell counting the True elements it covers. Sparse: only
  non-empty cells are listed, so a map costs bytes in proportion to how much differs.
- :func:`ulp_histogram` ``(ulp) -> list[int]``: counts of ulp distances in power-of-two bins
  (:data:`ULP_BIN_LABELS`), for the ulp histograms.

Both are pure functions of their argument (CPU or CUDA tensors; nothing is modified). The comparison
(``judge/stages.py``) attaches them to a StageResult (docs/ARCHITECTURE.md, section 2).
"""

from __future__ import annotations

import math

import torch

__all__ = ["MAP_ROWS", "MAP_COLS", "ULP_BINS", "ULP_BIN_LABELS", "mismatch_map", "ulp_histogram", "map_dense"]

#: Largest map grid: rows (tokens, or token x slot) x columns (hidden / intermediate index).
MAP_ROWS = 64
MAP_COLS = 128

#: ulp histogram bins: [0], [1], [2, 4), [4, 8), ..., [2^30, 2^31), [2^31, inf] (inf: one side NaN).
ULP_BINS = 33


def _bin_label(b: int) -> str:
    if b == 0:
        return "0"
    if b == 1:
        return "1"
    if b == ULP_BINS - 1:
        return f">=2^{b - 1}"
    return f"[2^{b - 1},2^{b})"


ULP_BIN_LABELS = tuple(_bin_label(b) for b in range(ULP_BINS))


def ulp_histogram(ulp: torch.Tensor) -> list[int]:
    """Counts of ``ulp`` (float tensor of non-negative ulp distances, any shape; inf allowed) per bin of
    :data:`ULP_BIN_LABELS`: bin 0 holds distance 0, bin 1 distance 1, bin b (2..31) distances in
    [2^(b-1), 2^b), the last bin everything >= 2^31 (incl. inf). Raises ValueError on NaN or negative
    entries (a distance is never either)."""
    u = ulp.detach().reshape(-1).to(torch.float64)
    if bool(torch.isnan(u).any()) or bool((u < 0).any()):
        raise ValueError("ulp_histogram: ulp distances must be >= 0 and not NaN")
    # bin = 0 for 0; else floor(log2(u)) + 1 (1 -> 1, 2..3 -> 2, 4..7 -> 3, ...), capped.
    safe = torch.where(u > 0, u, 1.0)
    b = torch.where(u > 0, torch.floor(torch.log2(safe)) + 1, 0.0)
    b = torch.where(torch.isinf(u), float(ULP_BINS - 1), b).clamp(max=ULP_BINS - 1).to(torch.int64)
    return [int(c) for c in torch.bincount(b, minlength=ULP_BINS).tolist()]


def mismatch_map(bad: torch.Tensor, *, rows: int = MAP_ROWS, cols: int = MAP_COLS) -> dict:
    """Downsampled map of a boolean mask ``bad`` (True = differing / failing element).

    Args:
        bad: bool tensor of >= 1 dimension; ``[..., N]`` is viewed as ``R x N`` with R the product of the
            leading dimensions (a 1-D mask is one row).
        rows, cols: largest grid (>= 1 each).
    Returns:
        ``{"shape": [R, N] (the full mask), "dims": original shape, "cell": [rh, cw] (elements per cell:
        ceil(R / rows), ceil(N / cols)), "grid": [gr, gc], "total": True count,
        "cells": [[i, j, count], ...] (non-empty cells only, row-major)}``. Cell (i, j) covers mask rows
        ``i*rh .. i*rh+rh-1`` and columns ``j*cw .. j*cw+cw-1``.
    Raises:
        ValueError: ``bad`` not a bool tensor, 0-D, or ``rows`` / ``cols`` < 1.
    """
    if not isinstance(bad, torch.Tensor) or bad.dtype != torch.bool:
        raise ValueError(f"mismatch_map: bad must be a bool tensor, got {getattr(bad, 'dtype', type(bad))}")
    if bad.dim() == 0:
        raise ValueError("mismatch_map: bad must have at least one dimension")
    if rows < 1 or cols < 1:
        raise ValueError(f"mismatch_map: rows and cols must be >= 1, got {rows}, {cols}")
    dims = [int(d) for d in bad.shape]
    n = dims[-1]
    r = math.prod(dims[:-1]) if len(dims) > 1 else 1
    m = bad.detach().reshape(r, n)
    rh, cw = max(1, -(-r // rows)), max(1, -(-n // cols))
    gr, gc = -(-r // rh) if r else 0, -(-n // cw) if n else 0
    cells: list[list[int]] = []
    total = int(m.sum())
    if total:
        pad = torch.zeros(gr * rh, gc * cw, dtype=torch.int32, device=m.device)
        pad[:r, :n] = m.to(torch.int32)
        counts = pad.reshape(gr, rh, gc, cw).sum(dim=(1, 3)).cpu()
        nz = torch.nonzero(counts)
        cells = [[int(i), int(j), int(counts[i, j])] for i, j in nz.tolist()]
    return {"shape": [r, n], "dims": dims, "cell": [rh, cw], "grid": [gr, gc], "total": total, "cells": cells}


def map_dense(m: dict) -> list[list[int]]:
    """The ``gr x gc`` count grid of a :func:`mismatch_map` dict (row-major lists; for plotting and tests)."""
    gr, gc = m["grid"]
    grid = [[0] * gc for _ in range(gr)]
    for i, j, c in m["cells"]:
        grid[i][j] = c
    return grid
