"""Shared pieces of the BF16 TRT-LLM-layout decode GEMVs (owner G, issue 4).

The summation order of every length-H / length-I reduction of the BF16 decode kernels
(``bf16_gate_up.py``, ``bf16_down.py``) is the one order below, the same for every tile configuration
(rows per program, warps, loop unrolling), so tuning a launch never changes a bit:

**Lane chains, then a pairwise tree over the 64 lanes.** A reduction ``sum_h w[h] * v[h]`` of length
``K = 64 * NB`` (K = H for gate/up, K = Ip for down; the TRT-LLM BlockMajorK block is 64 elements) is split
into 64 lanes by ``h % 64``. Lane ``l`` (0 <= l < 64) starts from ``+0.0`` and adds its terms
``h = l, 64 + l, 128 + l, ..., 64 * (NB - 1) + l`` in increasing ``h``, one ``fma.rn.f32`` each:
``p_l = fma(w[h], v[h], p_l)``. The 64 lane partials are then combined by a balanced binary tree of
``add.rn.f32`` that adds neighbours first: level 1 forms ``q_i = p_{2i} + p_{2i+1}`` (32 values), level 2
adds neighbouring pairs of those, ... level 6 gives the sum. In closed form, with ``T(a, n)`` the sum of lanes
``a .. a+n-1``: ``T(a, 1) = p_a``, ``T(a, n) = T(a, n/2) + T(a + n/2, n/2)``; the result is ``T(0, 64)``.

Where this lives in the code: each program holds a ``[rows, 64]`` fp32 accumulator tile, one column per lane,
updated with ``tl.fma`` once per 64-element K block (a bf16 weight and a bf16 activation, both widened exactly
to fp32, so the product is exact in fp32 unless it underflows and ``fma(w, v, p) = RN(w * v + p)``); the tree
is ``_sum64_pairwise`` (explicit ``reshape`` + ``split`` + ``+``, not ``tl.sum``, whose tree depends on the
register layout). Which thread or warp owns a lane never matters: every lane chain is sequential and the tree
is fixed by lane index.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = [
    "LANES",
    "STATUS_WORDS",
    "checked_row",
    "row_map_status",
    "status_buffers",
    "status_for",
    "sum64_pairwise",
    "trtllm_row",
]

#: Lanes of one reduction = elements of one TRT-LLM BF16 BlockMajorK block (128 bytes).
LANES = 64


@triton.jit
def _pair_add(acc, R: tl.constexpr, W: tl.constexpr):
    """[R, W] -> [R, W // 2]: element i of the result is ``acc[:, 2i] + acc[:, 2i+1]`` (one add.rn.f32)."""
    a, b = tl.split(tl.reshape(acc, [R, W // 2, 2]))
    return a + b


@triton.jit
def sum64_pairwise(acc, R: tl.constexpr):
    """Pairwise tree over the 64 lane partials of each row: fp32 [R, 64] -> fp32 [R] (module docstring).

    Six levels of neighbour additions (64 -> 32 -> 16 -> 8 -> 4 -> 2 -> 1), so the result is
    ``T(0, 64)`` with ``T(a, n) = T(a, n/2) + T(a + n/2, n/2)``.
    """
    acc = _pair_add(acc, R, 64)
    acc = _pair_add(acc, R, 32)
    acc = _pair_add(acc, R, 16)
    acc = _pair_add(acc, R, 8)
    acc = _pair_add(acc, R, 4)
    a, b = tl.split(acc)  # [R, 2] -> 2 x [R]
    return a + b


# ---------------------------------------------------------------------------------------------------------
# Row maps: loads that cannot leave the weights, and the status word a wrong map value sets
# ---------------------------------------------------------------------------------------------------------
#
# The kernels read the TRT-LLM BF16 weights through the logical -> physical row maps of
# ``flint_moe.layouts.trtllm_bf16_row_maps``. A map value is data the host cannot keep checked for free
# (writes through ``.data`` or ``.numpy()`` leave no trace in the tensor's version counter), so every
# loaded value goes through :func:`checked_row`: it is compared with the map's closed form at its index
# (:func:`trtllm_row`); a mismatch stores ``index + 1`` into one int32 word of a status buffer (a plain
# predicated store, no atomics: any one of several faulty indices may win); and the value used as a row is
# clamped into ``[0, rows)`` (unsigned minimum: negative values become ``rows - 1``). A correct map passes
# through unchanged, so the weights read, the arithmetic and the bits of every result are the same as
# without the check. Host side: :func:`row_map_status` (one status buffer per device), read by
# ``flint_moe.ops.check_row_map_status``.

#: Words of a row-map status buffer: ``[0]`` the gate/up kernel's map13 check, ``[1]`` the down kernel's
#: map2 check; each 0 (no fault seen) or 1 + the index of a map entry found wrong.
STATUS_WORDS = 2


@triton.jit
def trtllm_row(j):
    """Closed form of the TRT-LLM BF16 row maps: the physical row of shuffle position ``j`` (int32, any shape).

    The epilogue-tile shuffle (32-row blocks, ``flint_moe.layouts.rows.shuffle_rows``) puts source row
    ``32 b + 4 w + q`` (0 <= w < 8, 0 <= q < 4) at physical row ``32 b + 8 q + w``. So
    ``map2[h] = trtllm_row(h)``, ``map13[n] = trtllm_row(2 n + 1)`` (gate row n) and
    ``map13[Ip + n] = trtllm_row(2 n)`` (up row n): the gated reorder puts up row n at position 2n, gate
    row n at 2n + 1. Integer and/shift/or only."""
    return (j & -32) | ((j & 3) << 3) | ((j & 31) >> 2)


@triton.jit
def checked_row(map_ptr, idx, expected, status_ptr, ROWS: tl.constexpr):
    """``map[idx]`` (int32, shape of ``idx``) clamped into ``[0, ROWS)``; where it differs from ``expected``,
    ``idx + 1`` is stored into ``status_ptr[0]``. Per loaded index: one compare, one predicated store, one
    unsigned minimum."""
    v = tl.load(map_ptr + idx)
    tl.store(status_ptr + tl.zeros_like(idx), idx + 1, mask=v != expected)
    return tl.minimum(v.to(tl.uint32, bitcast=True), ROWS - 1).to(tl.int32, bitcast=True)


#: (device type, index, scratch) -> int32 [STATUS_WORDS] status buffer.
_STATUS: dict[tuple[str, int | None, bool], torch.Tensor] = {}


def _status_key(device: torch.device, scratch: bool) -> tuple[str, int | None, bool]:
    index = device.index
    if device.type == "cuda" and index is None:
        index = torch.cuda.current_device()
    return device.type, index, scratch


def row_map_status(device: torch.device | str, *, scratch: bool = False) -> torch.Tensor:
    """The row-map status buffer of ``device``: int32 [STATUS_WORDS], zeroed when first made.

    On a CUDA device it lives in pinned host memory, which the kernels write directly (unified virtual
    addressing) and the host reads with no copy, no event and no synchronisation: no work is added to the
    stream. On the CPU (Triton interpreter) it is an ordinary tensor. ``scratch=True`` gives a second buffer
    that nothing reads (the op's ``check_row_map_values=False`` runs, whose maps are wrong on purpose).
    Both buffers of a device are made together, by the first call: make it outside CUDA-graph capture
    (RuntimeError otherwise)."""
    device = torch.device(device)
    key = _status_key(device, scratch)
    st = _STATUS.get(key)
    if st is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"row map status of {device}: not made yet and a CUDA graph is being captured; call the op once "
                "eagerly before capturing"
            )
        for s in (False, True):
            if device.type == "cuda":
                _STATUS[_status_key(device, s)] = torch.zeros(STATUS_WORDS, dtype=torch.int32, pin_memory=True)
            else:
                _STATUS[_status_key(device, s)] = torch.zeros(STATUS_WORDS, dtype=torch.int32, device=device)
        st = _STATUS[key]
    return st


def status_buffers() -> dict[tuple[str, int | None], torch.Tensor]:
    """Every device's (non-scratch) status buffer made so far: (device type, index) -> int32 [STATUS_WORDS]."""
    return {k[:2]: v for k, v in _STATUS.items() if not k[2]}


def status_for(t: torch.Tensor, status: torch.Tensor | None, *, scratch: bool = False) -> torch.Tensor:
    """``status`` checked (int32 [STATUS_WORDS], contiguous, on ``t``'s device or, for a CUDA ``t``, in pinned
    host memory), or the default buffer of ``t``'s device when None. A tensor without data (a fake tensor:
    shape propagation, the conformance launch recorder) gets a fresh buffer of its kind. Raises TypeError /
    ValueError naming ``status``."""
    if status is None:
        from torch._subclasses.fake_tensor import is_fake

        if is_fake(t):
            return torch.zeros(STATUS_WORDS, dtype=torch.int32, device=t.device)
        return row_map_status(t.device, scratch=scratch)
    if not isinstance(status, torch.Tensor):
        raise TypeError(f"status: expected a torch.Tensor or None, got {type(status).__name__}")
    if status.dtype != torch.int32 or tuple(status.shape) != (STATUS_WORDS,) or not status.is_contiguous():
        raise ValueError(
            f"status: expected a contiguous int32 [{STATUS_WORDS}] tensor, got {status.dtype} {tuple(status.shape)}"
        )
    pinned = t.device.type == "cuda" and status.device.type == "cpu" and status.is_pinned()
    if status.device != t.device and not pinned:
        raise ValueError(f"status: must be on {t.device} (or pinned host memory for CUDA tensors), got {status.device}")
    return status
