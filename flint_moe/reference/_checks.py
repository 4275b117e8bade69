"""Input validation shared by the golden model: every error names the tensor and the violated constraint.

Raises ``TypeError`` for a wrong type or dtype, ``ValueError`` for a wrong shape, size or value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

__all__ = ["check_tensor", "check_same_device", "check_multiple"]


def check_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Iterable[torch.dtype] | None = None,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
) -> torch.Tensor:
    """Check that ``t`` is a tensor with the given dtype(s), rank and shape (``None`` = any size).

    Returns ``t`` unchanged. Raises ``TypeError`` (not a tensor, wrong dtype) or ``ValueError`` (rank, shape),
    with a message that starts with ``name``.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            want = " or ".join(str(d) for d in allowed)
            raise TypeError(f"{name}: dtype must be {want}, got {t.dtype}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if shape is not None:
        for axis, (want, got) in enumerate(zip(shape, t.shape, strict=True)):
            if want is not None and want != got:
                raise ValueError(
                    f"{name}: dimension {axis} must be {want}, got {got} (shape {tuple(t.shape)})"
                )
    return t


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """All named tensors on one device; returns it. Raises ``ValueError`` naming the odd one out."""
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{name}: on {t.device}, but {first_name} is on {first.device}")
    return first.device


def check_multiple(name: str, value: int, multiple: int, what: str = "size") -> None:
    """Raise ``ValueError`` unless ``value`` is a positive multiple of ``multiple``."""
    if value <= 0 or value % multiple:
        raise ValueError(f"{name}: {what} {value} must be a positive multiple of {multiple}")
