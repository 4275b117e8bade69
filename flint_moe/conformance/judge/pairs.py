"""Golden-side work shared by the stage checks (:mod:`~flint_moe.conformance.judge.stages`, teacher-forced)
and the golden model's own run (:mod:`~flint_moe.conformance.judge.explain`): a routing ``ids`` [M, k] grouped
by expert (:class:`_Pairs`), the per-expert golden gate/up accumulations cached between the two
(:func:`_gate_up_rows`), the split of a summation model into its (gate/up, down) pair, and one expert's golden
steps 6-8 on either weight format (:func:`_expert_gate_up`, :func:`_expert_down`, :func:`_expert_y`; also used
by the fault injections, :mod:`~flint_moe.conformance.judge.injections`).
"""

from __future__ import annotations

import torch

from flint_moe.reference.exact import Accumulation, SummationModel
from flint_moe.reference.experts import (
    down_accumulate,
    down_accumulate_bf16,
    down_output,
    down_output_bf16,
    gate_up_accumulate,
    gate_up_accumulate_bf16,
)


def _split_models(model) -> tuple[SummationModel, SummationModel]:
    return tuple(model) if isinstance(model, tuple) else (model, model)


class _Pairs:
    """A routing ``ids`` [M, k] grouped by expert on the host, from one device read (a per-expert
    ``nonzero`` / ``unique`` / ``tolist`` on the device would synchronise several times per expert).

    ``experts``: the distinct ids, ascending. Per expert e: ``tokens[e]``, ``slots[e]`` (device int64, the
    pairs in row-major order, as ``torch.nonzero(ids == e, as_tuple=True)``), ``uniq[e]`` (device, ascending
    distinct tokens), ``inv[e]`` (device, each pair's index into ``uniq[e]``), ``pairs[e]`` (host list of
    (token, slot)), ``uniq_host[e]`` (host tuple). The device tensors are views of one host-to-device copy."""

    def __init__(self, ids: torch.Tensor, dev: torch.device):
        import numpy as np

        h = ids.detach().to("cpu", torch.int64).numpy()
        k = h.shape[1]
        flat = h.reshape(-1)
        order = np.argsort(flat, kind="stable")  # within one expert: ascending flat index = row-major
        vals, starts = np.unique(flat[order], return_index=True)
        ends = [*starts[1:].tolist(), flat.size]
        parts, spans, off = [], {}, 0
        self.pairs: dict[int, list] = {}
        self.uniq_host: dict[int, tuple] = {}
        for e, a, b in zip(vals.tolist(), starts.tolist(), ends, strict=True):
            idx = order[a:b]
            tok, slot = idx // k, idx % k
            uq, inv = np.unique(tok, return_inverse=True)
            spans[e] = (off, len(idx), len(uq))
            parts += [tok, slot, inv.reshape(-1), uq]
            off += 3 * len(idx) + len(uq)
            self.pairs[e] = list(zip(tok.tolist(), slot.tolist(), strict=True))
            self.uniq_host[e] = tuple(uq.tolist())
        big = torch.from_numpy(np.concatenate(parts).astype(np.int64)).to(dev) if parts else None
        self.experts: list[int] = vals.tolist()
        self.tokens, self.slots, self.inv, self.uniq = {}, {}, {}, {}
        for e, (o, n, u) in spans.items():
            self.tokens[e], self.slots[e] = big[o : o + n], big[o + n : o + 2 * n]
            self.inv[e], self.uniq[e] = big[o + 2 * n : o + 3 * n], big[o + 3 * n : o + 3 * n + u]


def _gate_up_rows(cache: dict, e: int, tokens: torch.Tensor, compute, host: tuple) -> Accumulation:
    """Golden gate/up Accumulation [len(tokens), 2I] of expert ``e`` for the (sorted, unique) ``tokens``
    (device; ``host``: the same tokens as a host tuple): from ``cache["gu"][e] = (host tokens, Accumulation)``
    when it covers them, else computed (``compute(tokens)``) and cached. Rows are independent, so a subset
    gives the same values as all M tokens."""
    gu = cache.setdefault("gu", {})
    hit = gu.get(e)
    if hit is not None:
        have, acc = hit
        if have == host:
            return acc
        at = {t: i for i, t in enumerate(have)}
        if all(t in at for t in host):
            return acc[torch.tensor([at[t] for t in host], dtype=torch.int64).to(tokens.device)]
    acc = compute(tokens)
    gu[e] = (host, acc)
    return acc


def _on(t: torch.Tensor, dev) -> torch.Tensor:
    return t if dev is None else t.to(dev)


def _expert_gate_up(wl, e: int, x: torch.Tensor, nv: bool, dev=None, **kw) -> Accumulation:
    """Step 6 golden sum of expert ``e``: ``x`` bf16 [M, H] against ``wl.w13[e]`` -> :class:`Accumulation`
    [M, 2I]; NVFP4 (``nv``, with ``wl.w13_scale[e]``) or BF16 weights, moved to ``dev`` unless it is None;
    ``kw`` (``model``, ``order``) goes to ``gate_up_accumulate`` / ``gate_up_accumulate_bf16``."""
    if nv:
        return gate_up_accumulate(x, _on(wl.w13[e], dev), _on(wl.w13_scale[e], dev), **kw)
    return gate_up_accumulate_bf16(x, _on(wl.w13[e], dev), **kw)


def _expert_down(wl, e: int, act: torch.Tensor, nv: bool, dev=None, **kw) -> Accumulation:
    """Step 8 golden sum of expert ``e``: ``act`` bf16 [M, I] against ``wl.w2[e]`` -> :class:`Accumulation`
    [M, H]; weights and ``kw`` as :func:`_expert_gate_up` (``down_accumulate`` / ``down_accumulate_bf16``)."""
    if nv:
        return down_accumulate(act, _on(wl.w2[e], dev), _on(wl.w2_scale[e], dev), **kw)
    return down_accumulate_bf16(act, _on(wl.w2[e], dev), **kw)


def _expert_y(wl, e: int, d: torch.Tensor, nv: bool, dev=None) -> torch.Tensor:
    """Step 8 output of expert ``e``: fp32 down sums ``d`` (any shape ending in H) -> bf16, scaled by
    ``wl.w2_gs[e]`` first when ``nv`` (``down_output`` / ``down_output_bf16``)."""
    return down_output(d, _on(wl.w2_gs[e : e + 1], dev)) if nv else down_output_bf16(d)
