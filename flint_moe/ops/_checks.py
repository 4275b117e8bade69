"""Argument checks shared by the public ops (one wording and one exception type per violation).

- :func:`check_top_k`: ``TypeError`` unless ``top_k`` is an int (bool rejected), ``ValueError`` unless
  ``1 <= top_k <= limit``; the message starts with ``top_k:``.
- :func:`check_kernel_device`: ``RuntimeError`` for a CPU tensor when the Triton interpreter is off (Triton
  itself would fail with "0 active drivers", which names neither the tensor nor the fix).
- :func:`check_shared_ready`: ``TypeError`` unless ``shared_ready`` is None or a ``torch.cuda.Event``,
  ``ValueError`` for an event with CPU tensors; every op calls it before its first launch.
- :func:`checked_row_maps`: the TRT-LLM BF16 row maps' values, checked once per tensor and again after any
  in-place change the tensor's version counter sees (the immediate error of the common case).
- :func:`check_row_map_status`: the check no write can bypass: the BF16 decode kernels compare every map value
  they load with the layout's closed form (``flint_moe.kernels._bf16_gemv``); this reads what they found.
"""

from __future__ import annotations

import weakref

import torch

from flint_moe.kernels._common import INTERPRET

__all__ = ["check_top_k", "check_kernel_device", "check_shared_ready", "checked_row_maps", "check_row_map_status"]


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


def check_shared_ready(shared_ready: object, device: torch.device) -> None:
    """``TypeError`` unless ``shared_ready`` is None or a ``torch.cuda.Event``; ``ValueError`` for an event when
    the op's tensors are on ``device`` of type CPU (there is no stream to wait on). Call before any launch."""
    if shared_ready is None:
        return
    if not isinstance(shared_ready, torch.cuda.Event):
        raise TypeError(f"shared_ready: expected a torch.cuda.Event or None, got {type(shared_ready).__name__}")
    if device.type != "cuda":
        raise ValueError("shared_ready: a CUDA event only makes sense for CUDA tensors; pass None")


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


_STATUS_MAPS = ("map13", "map2")


def check_row_map_status(device: torch.device | str | None = None, *, synchronize: bool = True) -> None:
    """RuntimeError if a BF16 decode kernel on ``device`` (None: every device used so far) loaded a row-map
    value other than the TRT-LLM BF16 row map's since the last check; the status is cleared when reported.

    The kernels (``flint_moe.kernels.bf16_gate_up`` / ``bf16_down``) compare every map value they load with
    the map's closed form, clamp it into the map's range (so no value reads outside the weights) and, on a
    mismatch, store 1 + the entry's index into the device's status buffer
    (``flint_moe.kernels._bf16_gemv.row_map_status``; on CUDA pinned host memory written directly by the
    kernels). Nothing on the decode path waits for it: ``flint_moe_bf16_decode`` reads it at entry without
    synchronising (it reports what earlier calls found), and this function is the explicit check for a safe
    point, e.g. once per scheduler step or after CUDA-graph replays. ``synchronize=True`` (default) first
    synchronises ``device`` (CUDA) so that every kernel launched before is accounted for; False reads what
    has landed so far (no synchronisation).

    The message names ``row_maps[0]`` (map13) or ``row_maps[1]`` (map2) and the index of a faulty entry (one
    of them, when several are wrong). Outputs computed since the fault are wrong: a map changed after the op
    checked it (e.g. through ``.data`` or ``.numpy()``, which leave the version counter as it was).
    """
    from flint_moe.kernels._bf16_gemv import status_buffers

    want = None if device is None else torch.device(device)
    for (dtype, index), st in status_buffers().items():
        if want is not None and (want.type != dtype or (want.index is not None and want.index != index)):
            continue
        dev = torch.device(dtype, index) if index is not None else torch.device(dtype)
        if synchronize and dtype == "cuda":
            torch.cuda.synchronize(dev)
        report_row_map_status(st, dev)


def report_row_map_status(status: torch.Tensor, device: torch.device) -> None:
    """The RuntimeError of :func:`check_row_map_status` if ``status`` (a CPU or pinned host buffer of
    ``device``) holds a fault, which is then cleared; reads it as it is, with no synchronisation."""
    words = status.numpy()  # the buffer itself (CPU or pinned host memory): no copy, no synchronisation
    if not words.any():
        return
    i = int(words.nonzero()[0][0])
    entry = int(words[i]) - 1
    words[:] = 0
    raise RuntimeError(
        f"row_maps[{i}]: entry {entry} of {_STATUS_MAPS[i]} held a value other than the TRT-LLM BF16 row map's "
        f"(flint_moe.layouts.trtllm_bf16_row_maps) when a BF16 decode kernel on {device} loaded it: the map was "
        "changed after the op checked it (e.g. through .data or .numpy()). Outputs computed since are wrong "
        "(values out of range were clamped into it, never read outside the weights); status cleared"
    )
