"""Order replay at scale: which cases replay their kernels' declared summation orders, and how a large case
replays a deterministic sample of token rows.

The replay itself is the golden model's (``flint_moe.reference.orders``, reached through the accumulate
functions' ``order=`` argument); the declarations are the kernels' (``flint_moe.kernels.orders``, gathered per
case by ``run.paths.declared_orders``). A case replays on the GPU only: Triton's interpreter does not run the
GPU's reduction orders, so a CPU run judges accumulations by the any-order bound alone.
"""

from __future__ import annotations

import torch

from flint_moe.conformance.judge.results import EXACT, FAIL, CaseResult, worst_verdict

__all__ = ["REPLAY_ROWS", "case_orders", "replay_row_count", "replay_rows", "replay_sampled"]


#: Token rows replayed in full; a larger case replays this many rows, evenly spaced (rows are independent:
#: the ``row_independence`` invariance checks it), and keeps the any-order bound for the others. Every row of
#: a replayed row is replayed: all its experts and all their output columns. 64 rows replay every row of the
#: cases up to M = 64 and keep the gpu profile at 258 s on the H200 (reports/h200). ``FLINT_REPLAY_ROWS=N``
#: replays N rows instead.
REPLAY_ROWS = 64


def replay_row_count() -> int:
    """Rows a case replays in full: ``FLINT_REPLAY_ROWS`` (a positive integer) or :data:`REPLAY_ROWS`.
    Raises ValueError for any other value of the variable."""
    import os

    v = os.environ.get("FLINT_REPLAY_ROWS")
    if v is None or v == "":
        return REPLAY_ROWS
    if not v.isdigit() or int(v) < 1:
        raise ValueError(f"FLINT_REPLAY_ROWS: expected a positive integer, got {v!r}")
    return int(v)


def case_orders(case, device: torch.device) -> dict | None:
    """The declared summation orders of ``case``'s kernels (``run.paths.declared_orders``) when the case ran on
    a GPU; None on the CPU (Triton's interpreter does not run the GPU's reduction orders, so the CPU judges
    accumulations by the any-order bound alone) or when ``FLINT_ORDER_REPLAY=0``."""
    import os

    if torch.device(device).type != "cuda" or os.environ.get("FLINT_ORDER_REPLAY", "1") == "0":
        return None
    from flint_moe.conformance.run.paths import declared_orders

    return declared_orders(case)


def replay_rows(m: int, n: int | None = None) -> torch.Tensor:
    """The deterministic sample of ``n`` token rows of an M = ``m`` case: evenly spaced, first and last
    included (int64, ascending, distinct); ``n`` defaults to :func:`replay_row_count`."""
    n = replay_row_count() if n is None else n
    if m <= n:
        return torch.arange(m)
    return torch.unique(torch.linspace(0, m - 1, n).round().to(torch.int64))


def _rows_of(t, rows: torch.Tensor, m: int):
    return t[rows.to(t.device)].contiguous() if isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[0] == m else t


def replay_sampled(compare_case, case, inputs, taps: dict, out, orders: dict, logical) -> CaseResult:
    """Every stage on all rows by the any-order bound, then the replay of the declared orders on
    :func:`replay_rows`: an accumulation stage is EXACT when the sampled accumulators equal the replay, the
    end-to-end check EXACT when the sampled output rows equal the golden model's own run in the declared orders
    (and the other rows are explained); the notes say "on N sampled rows". ``compare_case``: the stage
    comparison (``judge.stages.compare_case``); ``logical``: the checkpoint-layout experts of ``inputs``."""
    from types import SimpleNamespace

    full = compare_case(case, inputs, taps, out, orders=None)
    m = int(inputs.x.shape[0])
    rows = replay_rows(m)
    if len(rows) >= m:
        raise ValueError(f"replay_sampled: M = {m} needs no sample (at most {len(rows)} rows)")
    sub_inputs = SimpleNamespace(
        x=_rows_of(inputs.x, rows, m),
        router_weight=inputs.router_weight,
        shared=_rows_of(inputs.shared, rows, m),
        weights_logical=logical,
    )
    sub_case = SimpleNamespace(**{k: getattr(case, k) for k in ("id", "path", "k", "config") if hasattr(case, k)})
    sub_taps = {name: _rows_of(v, rows, m) for name, v in taps.items()}
    sub = compare_case(sub_case, sub_inputs, sub_taps, _rows_of(out, rows, m), orders=orders)
    tag = f"on {len(rows)} sampled rows of {m}"
    by_name = {st.stage: st for st in sub.stages}
    for st in full.stages:
        rs = by_name.get(st.stage)
        if st.kind != "accumulation" or rs is None or st.verdict == FAIL:
            continue
        st.verdict = rs.verdict
        at = [
            i
            for i in (rs.note.find("order differs from declared"), rs.note.find("bitwise equal to the replay"))
            if i >= 0
        ]
        replay_part = rs.note[min(at) :] if at else rs.note
        st.note = f"{st.note}; {replay_part} {tag}" if st.note else f"{replay_part} {tag}"
    e2e, se = full.end_to_end, sub.end_to_end
    if e2e is not None and se is not None and e2e.verdict != FAIL:
        if se.verdict == FAIL:
            e2e.verdict = FAIL
            e2e.note = f"{e2e.note}; sampled rows differ from the golden model's run in the declared orders: {se.note}"
        elif se.verdict == EXACT:
            rest = "all rows bitwise" if e2e.verdict == EXACT else f"other rows {e2e.verdict}"
            e2e.verdict = EXACT
            e2e.note = f"EXACT {tag} (golden model in the declared orders); {rest}" + (
                f": {e2e.note}" if e2e.note else ""
            )
    full.verdict = worst_verdict([*(st.verdict for st in full.stages), *([e2e.verdict] if e2e else [])])
    return full
