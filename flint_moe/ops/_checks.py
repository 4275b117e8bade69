"""Argument checks shared by the public ops (one wording and one exception type per violation).

- :func:`check_top_k`: ``TypeError`` unless ``top_k`` is an int (bool rejected), ``ValueError`` unless
  ``1 <= top_k <= limit``; the message starts with ``top_k:``.
- :func:`check_kernel_device`: ``RuntimeError`` for a CPU tensor when the Triton interpreter is off (Triton
  itself would fail with "0 active drivers", which names neither the tensor nor the fix).
- :func:`check_shared_ready`: ``TypeError`` unless ``shared_ready`` is None or a ``torch.cuda.Event``,
  ``ValueError`` for an event with CPU tensors; every op calls it before its first launch.
- :func:`checked_row_maps`: the TRT-LLM BF16 row maps' values, checked once per tensor and again after any
  in-place change the tensor's version counter sees (the immediate error of the common case).
- :func:`check_out`: an ``out=`` buffer: bf16, the output's shape, the op's device, contiguous, and no byte shared
  with any input (``ValueError`` naming the input; :func:`op_inputs` names the NVFP4 ops' inputs); the message
  starts with ``out:``.
- :func:`check_nvfp4_entry` / :func:`check_nvfp4_operands`: the NVFP4 ops' (decode and grouped) checks of
  their arguments, in two parts so that each op may refuse or redirect by token count between them.
- :func:`check_row_map_status`: the check no write can bypass: every map tensor the op has checked is compared
  with the expected map again, on demand (the BF16 decode kernels themselves only keep every loaded value in
  range: ``flint_moe.kernels.bf16.gemv.checked_row``).
"""

from __future__ import annotations

import weakref

import torch

from flint_moe.kernels._launch import INTERPRET, check_op_tensor

__all__ = [
    "check_top_k",
    "check_kernel_device",
    "check_shared_ready",
    "check_nvfp4_entry",
    "check_nvfp4_operands",
    "check_out",
    "op_inputs",
    "checked_row_maps",
    "check_row_map_status",
]


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


def _byte_span(t: torch.Tensor) -> tuple[int, int] | None:
    """[first, last + 1) byte addresses ``t`` can touch (None when empty)."""
    if t.numel() == 0:
        return None
    extent = sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()


def check_out(out: object, shape: tuple[int, int], device: torch.device, inputs) -> torch.Tensor | None:
    """Check an op's ``out=`` buffer; None stays None (the op allocates its output).

    ``out`` must be a bf16 tensor of ``shape`` ([M, H]) on ``device``, contiguous, and its bytes must not overlap
    the byte range any tensor of ``inputs`` spans, first to last element (name -> tensor, e.g. ``{"x": x,
    "weights.w2": w.w2}``; a strided input counts the gaps between its elements too): the kernels read their inputs
    while other programs write ``out`` (the combine reads ``shared_output`` block by block), so in-place use
    such as ``out=shared_output`` or ``out=x`` is refused. Host-side checks only (no synchronisation), so the
    op stays capturable in a CUDA graph with the same buffer on every replay. Raises TypeError (not a tensor,
    dtype) or ValueError (shape, device, contiguity, overlap), the message starting with ``out:``."""
    if out is None:
        return None
    from flint_moe.kernels._launch import check_op_tensor

    check_op_tensor("out", out, dtype=torch.bfloat16, shape=shape, device=device)
    span = _byte_span(out)
    if span is None:
        return out
    for name, t in inputs.items():
        other = _byte_span(t) if isinstance(t, torch.Tensor) and t.device == out.device else None
        if other is not None and span[0] < other[1] and other[0] < span[1]:
            raise ValueError(f"out: shares memory with {name}; out must not overlap any input of the op")
    return out


def op_inputs(x, router_weight, counter, shared_output, weights) -> dict:
    """The inputs of an NVFP4 op by name, for :func:`check_out`: ``x``, ``router_weight``, ``counter``,
    ``shared_output`` and every tensor field of the ``FlintMoEWeights`` as ``weights.<field>``."""
    from flint_moe.layouts.flashinfer_w4a16 import TENSOR_FIELDS

    named = {"x": x, "router_weight": router_weight, "counter": counter, "shared_output": shared_output}
    return named | {f"weights.{f}": getattr(weights, f) for f in TENSOR_FIELDS}


#: id(map tensor) -> (weak reference, its ``_version`` when its values were checked, (H, Ip, which map)).
_CHECKED: dict[int, tuple[weakref.ref, int, tuple[int, int, int]]] = {}
#: (H, Ip, device) -> the expected maps on that device.
_EXPECTED: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def check_nvfp4_entry(x: torch.Tensor, weights, shared_ready: object) -> torch.device:
    """First checks of an NVFP4 op; returns the weights' device.

    ``weights`` must be a ``flint_moe.layouts.FlintMoEWeights`` (TypeError) whose metadata still holds
    (``check_metadata``); ``x`` bf16 [M, H] contiguous on that device with H = ``weights.hidden_size``
    (``check_op_tensor``), not on the CPU without the interpreter (:func:`check_kernel_device`);
    ``shared_ready`` as :func:`check_shared_ready`.
    """
    from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights

    if not isinstance(weights, FlintMoEWeights):
        raise TypeError(f"weights: expected FlintMoEWeights, got {type(weights).__name__}")
    weights.check_metadata()
    dev = weights.w1.device
    check_op_tensor("x", x, dtype=torch.bfloat16, shape=(None, weights.hidden_size), device=dev)
    check_kernel_device("x", x)
    check_shared_ready(shared_ready, dev)
    return dev


def check_nvfp4_operands(x, router_weight, top_k, counter, shared_output, weights, out, dev) -> None:
    """The other checks of an NVFP4 op, after :func:`check_nvfp4_entry` (same ``dev``).

    ``router_weight`` bf16 [E, H] contiguous on ``dev`` (E = ``weights.num_experts``); ``top_k`` as
    :func:`check_top_k` with limit E; ``shared_output`` bf16 of ``x``'s shape on ``dev``; the weights' sizes
    as the kernels take them (``flint_moe.kernels.nvfp4.gate_up.decode_sizes``, ValueError); ``out`` as
    :func:`check_out` against every input (:func:`op_inputs`); the tensors the expert kernels read or write
    (``x``, ``shared_output``, ``out``, the weights) 16-byte aligned (:func:`check_aligned`).
    """
    from flint_moe.kernels.nvfp4.gate_up import decode_sizes

    E = weights.num_experts
    check_op_tensor("router_weight", router_weight, dtype=torch.bfloat16, shape=(E, x.shape[1]), device=dev)
    check_top_k(top_k, E, f"E = {E}")
    check_op_tensor("shared_output", shared_output, dtype=torch.bfloat16, shape=tuple(x.shape), device=dev)
    decode_sizes(weights)
    inputs = op_inputs(x, router_weight, counter, shared_output, weights)
    check_out(out, tuple(x.shape), dev, inputs)
    # the expert kernels' tensors (the router kernels' order does not depend on the alignment of router_weight)
    check_aligned({k: v for k, v in inputs.items() if k not in ("router_weight", "counter")} | {"out": out})


#: Byte alignment every tensor of an NVFP4 op must have: Triton specialises a launch on 16-byte-aligned pointers
#: (vector loads, and the layout that fixes the CUDA-core decode path's declared summation order).
ALIGN = 16


def check_aligned(tensors: dict) -> None:
    """ValueError naming the first tensor whose data pointer is not :data:`ALIGN`-byte aligned (a view at an odd
    offset). torch's allocations always are; the kernels' vector loads and declared orders assume it."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.data_ptr() % ALIGN:
            raise ValueError(
                f"{name}: data pointer {t.data_ptr():#x} is not {ALIGN}-byte aligned (a view at an offset); "
                f"pass a contiguous copy (.clone())"
            )


def _is_checked(t: torch.Tensor) -> bool:
    entry = _CHECKED.get(id(t))
    return entry is not None and entry[0]() is t and entry[1] == t._version


def _expected(hidden: int, inter: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (hidden, inter, device)
    want = _EXPECTED.get(key)
    if want is None:
        from flint_moe.layouts import trtllm_bf16_row_maps

        want = _EXPECTED[key] = trtllm_bf16_row_maps(hidden, inter, device)
    return want


def checked_row_maps(maps: tuple[torch.Tensor, torch.Tensor], hidden: int, inter: int) -> None:
    """ValueError unless ``maps`` (shapes, dtypes and device already checked) hold the values of
    ``trtllm_bf16_row_maps(hidden, inter)``. The values are compared on the device once per tensor and again
    after any in-place change (its version counter); that comparison reads one flag back to the host, so a
    first call inside a CUDA-graph capture raises RuntimeError (run the op once eagerly before capturing).
    Every map tensor that passed is remembered (weakly) for :func:`check_row_map_status`."""
    todo = [(i, t) for i, t in enumerate(maps) if not _is_checked(t)]
    if not todo:
        return
    if maps[0].device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "row_maps: values not checked yet and a CUDA graph is being captured; call the op once eagerly "
            "with these row_maps before capturing"
        )
    want = _expected(hidden, inter, maps[0].device)
    for i, t in todo:
        if not torch.equal(t, want[i]):
            raise ValueError(
                f"row_maps[{i}]: not the TRT-LLM BF16 row map of H = {hidden}, I = {inter} "
                "(use flint_moe.layouts.trtllm_bf16_row_maps)"
            )
        key = id(t)
        _CHECKED[key] = (weakref.ref(t, lambda _r, k=key: _CHECKED.pop(k, None)), t._version, (hidden, inter, i))


def check_row_map_status(device: torch.device | str | None = None) -> None:
    """RuntimeError if a row-map tensor ``flint_moe_bf16_decode`` has checked (and that is still alive) on
    ``device`` (None: every device) no longer holds the TRT-LLM BF16 row map's values, however it was changed.

    The op compares a map tensor's values once and again only after an in-place change its version counter
    sees; writes through ``.data``, ``.numpy()`` or DLPack leave the counter as it was, so the op keeps using
    the changed map. Its kernels never read outside the weights whatever the values (a value out of range
    reads the layout's own row), but a wrong in-range value reads a wrong row. This function compares every
    remembered map with the expected one on its device (reading one flag per map back to the host: a
    synchronisation, so call it at a safe point, e.g. once per scheduler step, after CUDA-graph replays, or
    after loading weights); nothing on the decode path waits for it. The message names ``row_maps[0]``
    (map13) or ``row_maps[1]`` (map2), H and I, the first wrong entry, its value and the expected one. The
    tensor is forgotten, so the op checks it again at its next call (ValueError while it stays wrong).
    """
    want_dev = None if device is None else torch.device(device)
    for key, (ref, _version, (hidden, inter, i)) in list(_CHECKED.items()):
        t = ref()
        if t is None:
            continue
        dev = t.device
        other_index = want_dev is not None and want_dev.index is not None and dev.index != want_dev.index
        if want_dev is not None and (dev.type != want_dev.type or other_index):
            continue
        want = _expected(hidden, inter, dev)[i]
        if tuple(t.shape) == tuple(want.shape) and t.dtype == want.dtype and torch.equal(t, want):
            continue
        _CHECKED.pop(key, None)
        name = ("map13", "map2")[i]
        if tuple(t.shape) != tuple(want.shape) or t.dtype != want.dtype:
            detail = f"now {t.dtype} of shape {tuple(t.shape)}"
        else:
            row = int((t != want).nonzero()[0, 0])
            detail = f"entry {row} holds {int(t[row])}, the layout's value is {int(want[row])}"
        raise RuntimeError(
            f"row_maps[{i}]: the {name} tensor on {dev} (H = {hidden}, I = {inter}) changed after "
            f"flint_moe_bf16_decode checked it (e.g. through .data or .numpy()): {detail}. Outputs computed with "
            "it since are wrong (values out of range read the layout's own row, never outside the weights)"
        )
