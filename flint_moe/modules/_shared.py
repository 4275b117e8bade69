"""Running the shared expert beside the routed path: auxiliary CUDA stream, fork/join events.

Seed: ``_start_shared`` of ``vllm.models.flint.ops.moe`` (semantics only).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SharedRunner"]


class SharedRunner:
    """Owns one auxiliary stream and a fork / join event pair per module (created lazily on first CUDA use).

    ``start(shared, x)``:
      - ``shared`` a tensor: returned as is, no event.
      - ``shared`` an ``nn.Module`` on CUDA: the fork event is recorded on the current stream, the auxiliary
        stream waits on it, runs ``shared(x)`` and records the join event; returns (output, join event). The
        op waits on the join event just before the kernel that reads the output, so the router and gate/up
        kernels overlap the shared expert. Only events and stream waits: legal inside CUDA-graph capture (the
        captured graph forks and joins the same way). Memory: the output is allocated on the auxiliary stream;
        the next call's fork orders the auxiliary stream after every earlier main-stream kernel, so a block
        freed after a call is never rewritten while that call's kernels still read it.
      - ``shared`` an ``nn.Module`` on the CPU: run inline, no event.
    TypeError for anything else.
    """

    def __init__(self) -> None:
        self._stream: torch.cuda.Stream | None = None
        self._fork: torch.cuda.Event | None = None
        self._join: torch.cuda.Event | None = None

    def start(self, shared: object, x: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        if isinstance(shared, torch.Tensor):
            return shared, None
        if not isinstance(shared, nn.Module):
            raise TypeError(f"shared: expected a tensor or an nn.Module, got {type(shared).__name__}")
        if x.device.type != "cuda":
            return shared(x), None
        if self._stream is None or self._stream.device != x.device:
            self._stream = torch.cuda.Stream(device=x.device)
            self._fork = torch.cuda.Event()
            self._join = torch.cuda.Event()
        main = torch.cuda.current_stream(x.device)
        self._fork.record(main)
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(self._fork)
            out = shared(x)
            self._join.record(self._stream)
        return out, self._join
