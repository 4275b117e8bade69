"""Fused evaluation of the golden model's elementwise integer / float64 programs on CUDA.

``fused(fn)`` wraps a pure torch function of tensors (the tensor-core model's bit arithmetic, the one-rounding
fp32 fma) so that on CUDA it runs as one kernel made by ``torch.compile`` of the same code: the operations
are integer arithmetic (exact) or IEEE float64 operations whose fusion cannot change a value (the modules say
why), and a GPU test compares fused and eager bit for bit. Eager on the CPU, with ``FLINT_MMA_COMPILE=0``, or
when compiling fails (the first failure is warned about once and the eager function is used from then on).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch

__all__ = ["fused"]


def fused(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``fn`` evaluated fused on CUDA tensors, eagerly otherwise (module docstring); same results."""
    state: dict = {}

    def call(*args: torch.Tensor) -> torch.Tensor:
        if not args[0].is_cuda or os.environ.get("FLINT_MMA_COMPILE", "1") == "0" or state.get("eager"):
            return fn(*args)
        if "compiled" not in state:
            state["compiled"] = torch.compile(fn, dynamic=True, fullgraph=True)
        try:
            return state["compiled"](*args)
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - any compiler failure: the eager function gives the same bits
            state["eager"] = True
            warnings.warn(f"{fn.__name__}: torch.compile failed ({type(exc).__name__}: {exc}); evaluating eagerly",
                          RuntimeWarning, stacklevel=2)  # fmt: skip
            return fn(*args)

    call.__name__ = f"fused_{fn.__name__}"
    call.eager = fn  # type: ignore[attr-defined]
    call.fell_back = lambda: bool(state.get("eager"))  # type: ignore[attr-defined]
    return call
