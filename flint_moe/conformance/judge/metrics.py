"""Element-wise metrics of a kernel tensor against a golden one: bitwise equality (NaN as NaN-ness, signed zeros
compared), ulp distances on the dtype's ordered integer keys, the first differing coordinates, mismatch maps
and ulp histograms (:mod:`flint_moe.conformance.report.maps`), SHA-256 digests of tensors, and the checks that
read a tap from a kernel's taps dict.
"""

from __future__ import annotations

import hashlib
import math

import torch

__all__ = ["MAX_COORDS", "tensor_digest", "ulp_distance"]

#: Coordinates listed per stage (first failures, worst warnings).
MAX_COORDS = 5

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 (hex) of a tensor's bytes in row-major order (dtype and shape are not part of the digest)."""
    b = t.detach().contiguous().cpu().reshape(-1)
    return hashlib.sha256(b.view(torch.uint8).numpy().tobytes()).hexdigest()


def _ordered_key(t: torch.Tensor) -> torch.Tensor:
    """int64 key monotone in the value of a float tensor (+0 and -0 share key 0); NaN keys are meaningless."""
    iv = _INT_VIEW[t.element_size()]
    b = t.contiguous().view(iv).to(torch.int64)
    mag_mask = (1 << (8 * t.element_size() - 1)) - 1
    return torch.where(b < 0, -(b & mag_mask), b)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 ulp distance of two float tensors of one dtype/shape: |key(a) - key(b)| on the ordered
    integer keys of the dtype (fp32: binary32 ulps, bf16: bf16 ulps); 0 where both are NaN, inf where exactly
    one is NaN. +0 and -0 are at distance 0 (compare bits to see the sign)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"ulp_distance: {a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}")
    na, nb = torch.isnan(a), torch.isnan(b)
    d = (_ordered_key(a) - _ordered_key(b)).abs().to(torch.float64)
    d = torch.where(na & nb, 0.0, d)
    return torch.where(na ^ nb, math.inf, d)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bool mask: bitwise equal, NaN == NaN (payload ignored), +0 != -0."""
    if not a.is_floating_point():
        return a == b
    na, nb = torch.isnan(a), torch.isnan(b)
    iv = _INT_VIEW[a.element_size()]
    eq = a.contiguous().view(iv) == b.contiguous().view(iv)
    return torch.where(na | nb, na & nb, eq)


def _coords(mask: torch.Tensor, limit: int = MAX_COORDS) -> list[list[int]]:
    return (
        [[int(i) for i in row] for row in torch.nonzero(mask)[:limit].tolist()]
        if mask.dim()
        else ([[]] if bool(mask) else [])
    )


def _map(mask: torch.Tensor) -> dict | None:
    from flint_moe.conformance.report.maps import mismatch_map

    return mismatch_map(mask.reshape(1, -1) if mask.dim() == 0 else mask)


def _hist(dist: torch.Tensor) -> list[int]:
    from flint_moe.conformance.report.maps import ulp_histogram

    return ulp_histogram(dist)


def _tap(taps: dict, name: str, dev: torch.device):
    t = taps.get(name)
    return t.detach().to(dev) if isinstance(t, torch.Tensor) else t


def _usable(t, shape, dtype) -> bool:
    return isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(shape) and t.dtype == dtype
