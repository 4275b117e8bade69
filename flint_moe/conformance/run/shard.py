"""Deterministic shards of a conformance run: ``--shard K/N`` runs one of N parts of the selected cases, so N CI
jobs or N hosts share one profile; ``python -m flint_moe.conformance.merge`` joins their reports into one.

Split (:func:`plan_shards`): the selected cases are grouped into atoms, one per set of cases sharing weights
(``profiles.weight_key``: a worker builds them once). An atom whose estimated cost exceeds an even share
(total / N) is cut into the parallel runner's units (``parallel.plan_units``), so it cannot make its shard the
long pole. Atoms go, longest estimated first (``parallel.estimate_seconds``), to the shard with the least
estimated load so far (ties: the lowest index); the mutation self-test is one more atom. Within a shard the
cases keep the matrix order. The split depends only on the selected case ids, N and whether the self-test
runs: every host computes the same shards, each case lands in exactly one.

A shard's report records ``env["shard"]`` (:func:`shard_record`): its index, N, the selection's digest and
size, and its own case ids, which the merge checks. A shard report alone is never the GPU evidence.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

__all__ = ["Shard", "parse_shard", "plan_shards", "selection_digest", "shard_record"]

_SHARD_RE = re.compile(r"^(\d+)/(\d+)$")


@dataclass
class Shard:
    """One shard of a run: ``index`` (1-based) of ``count``; ``cases`` in matrix order; ``mutation``: whether
    this shard runs the mutation self-test; ``seconds``: its estimated cost."""

    index: int
    count: int
    cases: list = field(default_factory=list)
    mutation: bool = False
    seconds: float = 0.0


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N) with 1 <= K <= N. ValueError naming ``--shard`` otherwise."""
    m = _SHARD_RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"--shard: expected K/N with integers 1 <= K <= N (e.g. 2/4), got {text!r}")
    k, n = int(m[1]), int(m[2])
    if not 1 <= k <= n:
        raise ValueError(f"--shard: expected 1 <= K <= N, got {k}/{n}")
    return k, n


def selection_digest(case_ids: list[str]) -> str:
    """SHA-256 (hex, 16 digits) of the selected case ids in order: shards of one selection share it."""
    return hashlib.sha256("\n".join(case_ids).encode()).hexdigest()[:16]


def plan_shards(cases: list, count: int, *, mutation: bool = False) -> list[Shard]:
    """The ``count`` shards of ``cases`` (a matrix selection, in order); see the module docstring.
    ValueError for ``count < 1``."""
    from flint_moe.conformance.inputs.profiles import weight_key
    from flint_moe.conformance.run.parallel import MUTATION_SECONDS, estimate_seconds, plan_units

    if not isinstance(count, int) or count < 1:
        raise ValueError(f"plan_shards: count must be a positive integer, got {count!r}")
    groups: dict[tuple, list] = {}
    for pos, case in enumerate(cases):
        groups.setdefault(weight_key(case), []).append((pos, case))
    total = sum(estimate_seconds(c) for c in cases) + (MUTATION_SECONDS if mutation else 0.0)
    share = total / count
    atoms: list[tuple[float, int, list]] = []  # (seconds, first position, [(pos, case)])
    for members in groups.values():
        sec = sum(estimate_seconds(c) for _, c in members)
        if count > 1 and sec > share:
            for u in plan_units([c for _, c in members]):
                part = [members[p] for p, _ in u.cases]
                atoms.append((sum(estimate_seconds(c) for _, c in part), part[0][0], part))
        else:
            atoms.append((sec, members[0][0], members))
    if mutation:
        atoms.append((MUTATION_SECONDS, -1, []))  # the self-test: position -1 marks it
    atoms.sort(key=lambda a: (-a[0], a[1]))
    shards = [Shard(i + 1, count) for i in range(count)]
    chosen: list[list] = [[] for _ in range(count)]
    for sec, first, part in atoms:
        j = min(range(count), key=lambda i: (shards[i].seconds, i))
        shards[j].seconds += sec
        if first == -1:
            shards[j].mutation = True
        chosen[j] += part
    for s, part in zip(shards, chosen, strict=True):
        s.cases = [c for _, c in sorted(part, key=lambda pc: pc[0])]
    return shards


def shard_record(shard: Shard, selected_ids: list[str]) -> dict:
    """``env["shard"]`` of a shard's report (JSON-ready)."""
    return {
        "index": shard.index,
        "count": shard.count,
        "selection_digest": selection_digest(selected_ids),
        "selection_size": len(selected_ids),
        "cases": [c.id for c in shard.cases],
        "mutation": shard.mutation,
    }
