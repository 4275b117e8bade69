"""Argument checks shared by the public ops (one wording and one exception type per violation).

- :func:`check_top_k`: ``TypeError`` unless ``top_k`` is an int (bool rejected), ``ValueError`` unless
  ``1 <= top_k <= limit``; the message starts with ``top_k:``.
- :func:`check_kernel_device`: ``RuntimeError`` for a CPU tensor when the Triton interpreter is off (Triton
  itself would fail with "0 active drivers", which names neither the tensor nor the fix).
- :func:`checked_row_maps`: the TRT-LLM BF16 row maps' values, checked once per tensor (a map out of range
  would make the kernels read outside the weights).
"""

from __future__ import annotations

import weakref

import torch

from flint_moe.kernels._common import INTERPRET

__all__ = ["check_top_k", "check_kernel_device", "checked_row_maps"]


def check_top_k(top_k: object, limit: int, what: str) -> int:
    """``top_k`` as an int after checking ``1 <= top_k <= limit``; ``what`` describes the limit in the message
    (e.g. ``"E = 256"``). Raises TypeError (not an int, or a bool) or ValueError (out of range)."""
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k: expected an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= limit:
        raise ValueError(f"top_k: must satisfy 1 <= top_k <= {what}, got {top_k}")
    return top_k


def check_kernel_device(name: str, t: torch.Tensor) -> None:
    """RuntimeError naming ``name`` when ``t`` is on the CPU and Triton's interpreter is off: the kernels need
    a CUDA device, or ``TRITON_INTERPRET=1`` in the environment before triton is first imported."""
    if t.device.type == "cpu" and not INTERPRET:
        raise RuntimeError(
            f"{name}: on the CPU, but the Triton kernels need a CUDA device; to run them on the CPU set "
            "TRITON_INTERPRET=1 in the environment before triton is first imported (the Triton interpreter)"
        )


#: id(map tensor) -> (weak reference, its ``_version`` when its values were checked).
_CHECKED: dict[int, tuple[weakref.ref, int]] = {}
#: (H, Ip, device) -> the expected maps on that device.
_EXPECTED: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _is_checked(t: torch.Tensor) -> bool:
    entry = _CHECKED.get(id(t))
    return entry is not None and entry[0]() is t and entry[1] == t._version


def checked_row_maps(maps: tuple[torch.Tensor, torch.Tensor], hidden: int, inter: int) -> None:
    """ValueError unless ``maps`` (shapes, dtypes and device already checked) hold the values of
    ``trtllm_bf16_row_maps(hidden, inter)``. The values are compared on the device once per tensor and again
    after any in-place change (its version counter); that comparison reads one flag back to the host, so a
    first call inside a CUDA-graph capture raises RuntimeError (run the op once eagerly before capturing)."""
    todo = [(i, t) for i, t in enumerate(maps) if not _is_checked(t)]
    if not todo:
        return
    if maps[0].device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "row_maps: values not checked yet and a CUDA graph is being captured; call the op once eagerly "
            "with these row_maps before capturing"
        )
    key = (hidden, inter, maps[0].device)
    want = _EXPECTED.get(key)
    if want is None:
        from flint_moe.layouts import trtllm_bf16_row_maps

        want = _EXPECTED[key] = trtllm_bf16_row_maps(hidden, inter, maps[0].device)
    for i, t in todo:
        if not torch.equal(t, want[i]):
            raise ValueError(
                f"row_maps[{i}]: not the TRT-LLM BF16 row map of H = {hidden}, I = {inter} "
                "(use flint_moe.layouts.trtllm_bf16_row_maps)"
            )
        key = id(t)
        _CHECKED[key] = (weakref.ref(t, lambda _r, k=key: _CHECKED.pop(k, None)), t._version)
