"""Golden-side work shared by the stage checks (:mod:`~flint_moe.conformance.judge.stages`, teacher-forced)
and the golden model's own run (:mod:`~flint_moe.conformance.judge.explain`): a routing ``ids`` [M, k] grouped
by expert (:class:`_Pairs`), the per-expert golden gate/up accumulations cached between the two
(:func:`_gate_up_rows`) and the split of a summation model into its (gate/up, down) pair.
"""

from __future__ import annotations

import torch

from flint_moe.reference.exact import Accumulation, SummationModel


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
