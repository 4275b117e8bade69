"""One expert's golden steps 6-8 on either weight format (NVFP4 with block scales and global scales, or BF16),
for the judge modules that recompute them: the stage checks (:mod:`~flint_moe.conformance.judge.stages`), the
golden model's own run (:mod:`~flint_moe.conformance.judge.explain`) and the fault injections
(:mod:`~flint_moe.conformance.judge.injections`). ``wl`` is a logical checkpoint
(``flint_moe.reference.weights.NVFP4Experts`` when ``nv``, else ``BF16Experts``); the arithmetic is
``flint_moe.reference.experts``'.
"""

from __future__ import annotations

import torch

from flint_moe.reference import experts as ref
from flint_moe.reference.exact import Accumulation

__all__ = ["expert_down", "expert_gate_up", "expert_replays", "expert_y"]


def _on(t: torch.Tensor, dev) -> torch.Tensor:
    return t if dev is None else t.to(dev)


def expert_gate_up(wl, e: int, x: torch.Tensor, nv: bool, dev=None, **kw) -> Accumulation:
    """Step 6 golden sum of expert ``e``: ``x`` bf16 [M, H] against ``wl.w13[e]`` -> :class:`Accumulation`
    [M, 2I] ([gate | up], no global scale); NVFP4 (``nv``, with ``wl.w13_scale[e]``) or BF16 weights, moved to
    ``dev`` unless it is None; ``kw`` (``model``, ``order``) goes to ``gate_up_accumulate`` /
    ``gate_up_accumulate_bf16``, whose errors it raises."""
    if nv:
        return ref.gate_up_accumulate(x, _on(wl.w13[e], dev), _on(wl.w13_scale[e], dev), **kw)
    return ref.gate_up_accumulate_bf16(x, _on(wl.w13[e], dev), **kw)


def expert_down(wl, e: int, act: torch.Tensor, nv: bool, dev=None, **kw) -> Accumulation:
    """Step 8 golden sum of expert ``e``: ``act`` bf16 [M, I] against ``wl.w2[e]`` -> :class:`Accumulation`
    [M, H]; weights, ``dev`` and ``kw`` as :func:`expert_gate_up` (``down_accumulate`` /
    ``down_accumulate_bf16``)."""
    if nv:
        return ref.down_accumulate(act, _on(wl.w2[e], dev), _on(wl.w2_scale[e], dev), **kw)
    return ref.down_accumulate_bf16(act, _on(wl.w2[e], dev), **kw)


def expert_replays(wl, experts: list, xs: list, nv: bool, dev, order: dict, which: str) -> list:
    """The replays of the declared ``order`` for ``experts`` (``which`` = "w13": gate/up against
    ``wl.w13[e]``, "w2": down against ``wl.w2[e]``), each against its rows ``xs[i]`` (bf16 [m_i, K]), a group
    of experts per tensor-core step (``reference.experts.replay_experts``): per expert fp32 [m_i, N], the
    ``Accumulation.replay`` the single-expert step would carry."""
    w = getattr(wl, which)
    weights = [_on(w[e], dev) for e in experts]
    scales = [_on(getattr(wl, which + "_scale")[e], dev) for e in experts] if nv else None
    return ref.replay_experts(order, xs, weights, scales)


def expert_y(wl, e: int, d: torch.Tensor, nv: bool, dev=None) -> torch.Tensor:
    """Step 8 output of expert ``e``: fp32 down sums ``d`` [..., H] -> bf16 [..., H], times ``wl.w2_gs[e]``
    (rounded to fp32) first when ``nv`` (``down_output`` / ``down_output_bf16``)."""
    return ref.down_output(d, _on(wl.w2_gs[e : e + 1], dev)) if nv else ref.down_output_bf16(d)
