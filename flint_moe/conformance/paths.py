"""Kernel paths under conformance test: thin wrappers over the public ops that run them with taps
(issue 5; docs/CONTRACTS.md "Issue 5" and "Taps").

``PATHS[name].run(inputs, counter, taps) -> out`` runs one case's inputs (``cases.CaseInputs``) through the
op; ``taps`` (a dict or None) receives the kernels' stage tensors. ``max_tokens`` is the largest M the path
serves (``cases.matrix`` never asks for more).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["KernelPath", "PATHS"]


@dataclass(frozen=True)
class KernelPath:
    """One kernel path: ``name`` (a ``cases.PATH_NAMES`` entry), ``max_tokens`` (largest M served),
    ``weights`` ("nvfp4" | "bf16": the stored layout it reads),
    ``fn(inputs, counter, taps) -> bf16 [M, H]``."""

    name: str
    max_tokens: int
    weights: str
    fn: Callable

    def run(self, inputs, counter: torch.Tensor, taps: dict | None = None) -> torch.Tensor:
        """Run the op on ``inputs`` (``CaseInputs``); ``counter`` from ``ops.make_route_counter(device)``.

        Returns bf16 [M, H]. Raises ValueError if M exceeds ``max_tokens``."""
        m = int(inputs.x.shape[0])
        if m > self.max_tokens:
            raise ValueError(f"path {self.name}: M = {m} exceeds its max_tokens = {self.max_tokens}")
        return self.fn(inputs, counter, taps)


def _nvfp4(inputs, counter, taps):
    from flint_moe.ops import flint_moe

    k = _top_k(inputs)
    return flint_moe(inputs.x, inputs.router_weight, inputs.stored, k, counter, inputs.shared, taps=taps)


def _nvfp4_grouped(inputs, counter, taps):
    from flint_moe.ops import flint_moe_grouped

    k = _top_k(inputs)
    return flint_moe_grouped(inputs.x, inputs.router_weight, inputs.stored, k, counter, inputs.shared, taps=taps)


def _bf16(inputs, counter, taps):
    from flint_moe.ops import flint_moe_bf16_decode

    g1, g2, maps = inputs.stored
    k = _top_k(inputs)
    return flint_moe_bf16_decode(
        inputs.x, inputs.router_weight, g1, g2, maps, k, counter, inputs.shared, taps=taps
    )


def _top_k(inputs) -> int:
    try:
        return int(inputs.notes["top_k"])
    except KeyError:
        raise ValueError("inputs.notes['top_k'] missing: build inputs with cases.make_inputs") from None


def _build() -> dict[str, KernelPath]:
    from flint_moe.ops import DECODE_BF16_MAX_TOKENS, DECODE_MAX_TOKENS, GROUPED_MAX_TOKENS

    return {
        "nvfp4_decode": KernelPath("nvfp4_decode", DECODE_MAX_TOKENS, "nvfp4", _nvfp4),
        "bf16_decode": KernelPath("bf16_decode", DECODE_BF16_MAX_TOKENS, "bf16", _bf16),
        "nvfp4_grouped": KernelPath("nvfp4_grouped", GROUPED_MAX_TOKENS, "nvfp4", _nvfp4_grouped),
    }


PATHS: dict[str, KernelPath] = _build()
