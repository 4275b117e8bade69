"""What-if schedule of a parallel conformance run, on the CPU: the makespan the planner would reach, and why.

``python -m flint_moe.conformance.run.simulate [--report R] [--profile gpu] [--jobs N] [--budget-gib G]
[--without PATTERN ...]`` plans the profile's cases exactly as :func:`parallel.run_parallel` does
(:func:`parallel.plan_units` with the report's measured seconds and peak device memory, the mutation self-test
unit) and replays the parent's hand-out loop (:func:`parallel.pick_unit`: longest first, a unit starts only while
the running units' memory plus its own fits the budget) with each unit taking its planned seconds. It prints the
simulated makespan beside three lower bounds:

- work: the summed unit seconds over the workers;
- memory: the summed ``seconds x bytes`` of the units over the budget (units hold their planned bytes for their
  whole time, so no schedule beats it);
- the longest unit;

and the paths / shapes with the largest share of the memory-time, the quantity to cut when the memory bound is
the binding one. ``--without`` drops the cases whose id matches a glob (``fnmatch``) before planning: the effect of
moving them to the ``gpu-full`` profile; ``--order area`` hands out units by their seconds times their share of the
budget instead of longest first. Worker start-up, the process's set-up and the report are outside the
simulation (``env.run_seconds`` of a report against its ``conformance wall``).
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import sys
from collections import Counter

from flint_moe.conformance.run.parallel import DEFAULT_PLAN_FROM, Unit, measured_costs, pick_unit, plan_units

__all__ = ["Schedule", "simulate", "memory_shares", "main"]

_GIB = 1 << 30


@dataclasses.dataclass
class Schedule:
    """A simulated run: ``makespan`` (s), per-worker busy seconds, ``starts`` as (start s, worker, Unit) in
    hand-out order, and the lower bounds ``work_bound`` (summed seconds / workers), ``memory_bound`` (summed
    seconds x bytes / budget, a unit's bytes capped at the budget: one over it runs alone) and ``longest`` (the
    longest unit's seconds)."""

    makespan: float
    busy: list[float]
    starts: list[tuple[float, int, Unit]]
    work_bound: float
    memory_bound: float
    longest: float


def simulate(units: list[Unit], jobs: int, budget: int) -> Schedule:
    """Replay ``parallel.run_parallel``'s hand-out of ``units`` (longest first, as ``plan_units`` returns them) to
    ``jobs`` workers on one device with ``budget`` bytes, each unit taking ``unit.seconds``. ValueError for
    ``jobs`` < 1 or ``budget`` < 1."""
    if jobs < 1 or budget < 1:
        raise ValueError(f"simulate: jobs and budget must be >= 1, got {jobs} and {budget}")
    pending = list(units)
    running: dict[int, tuple[float, Unit]] = {}  # worker -> (end, unit)
    busy = [0.0] * jobs
    starts: list[tuple[float, int, Unit]] = []
    t = 0.0
    while pending or running:
        for w in range(jobs):  # the parent offers a unit to every idle worker, in worker order
            if w in running or not pending:
                continue
            unit = pick_unit(pending, [u.nbytes for _, u in running.values()], budget)
            if unit is None:
                break  # nothing fits beside the running units; wait for one to end
            running[w] = (t + unit.seconds, unit)
            busy[w] += unit.seconds
            starts.append((t, w, unit))
        # one completion per step, as the parent reads one "done" message before handing out again (units ending at
        # the same moment are freed one after the other, the others still counted as running)
        w, (t, _) = min(running.items(), key=lambda kv: (kv[1][0], kv[0]))
        del running[w]
    total = sum(u.seconds for u in units)
    return Schedule(
        makespan=t, busy=busy, starts=starts, work_bound=total / jobs,
        memory_bound=sum(u.seconds * min(u.nbytes, budget) for u in units) / budget,  # a unit over it runs alone
        longest=max((u.seconds for u in units), default=0.0),
    )  # fmt: skip


def memory_shares(units: list[Unit], depth: int = 2) -> Counter:
    """Summed ``seconds x bytes`` (GiB s) of ``units`` per leading ``depth`` parts of their first case id (path /
    shape); the mutation self-test as ``mutation``."""
    shares: Counter = Counter()
    for u in units:
        key = "/".join(u.cases[0][1].id.split("/")[:depth]) if u.cases else u.kind
        shares[key] += u.seconds * u.nbytes / _GIB
    return shares


def _report_parallel(path: str, key: str) -> int | None:
    """A positive integer ``env.parallel[key]`` of the report at ``path``, or None."""
    import json

    try:
        with open(path) as f:
            par = json.load(f).get("env", {}).get("parallel") or {}
    except (OSError, ValueError, AttributeError):
        return None
    v = par.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def main(argv: list[str] | None = None) -> int:
    from flint_moe.conformance.inputs.cases import GPU_PROFILES, matrix

    ap = argparse.ArgumentParser(prog="python -m flint_moe.conformance.run.simulate",
                                 description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--report", default=DEFAULT_PLAN_FROM, help="report whose measured costs plan the units")
    ap.add_argument("--profile", default="gpu", choices=GPU_PROFILES)
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: the report's env.parallel.jobs)")
    ap.add_argument("--budget-gib", type=float, default=None,
                    help="device memory budget (default: the report's env.parallel budget)")  # fmt: skip
    ap.add_argument("--without", action="append", default=[], metavar="PATTERN",
                    help="drop the cases whose id matches this glob (repeatable)")  # fmt: skip
    ap.add_argument("--top", type=int, default=8, help="memory-time shares listed")
    ap.add_argument("--order", choices=("seconds", "area"), default="seconds",
                    help="hand-out order: the planner's (longest first) or by seconds x max(1, bytes / (budget / "
                         "jobs)), units holding a large share of the budget earlier")  # fmt: skip
    args = ap.parse_args(argv)
    measured = measured_costs(args.report, profile=args.profile)
    if not measured:
        print(f"{args.report}: no measured costs of a GPU run of profile {args.profile}", file=sys.stderr)
        return 2
    if args.jobs is None:
        args.jobs = _report_parallel(args.report, "jobs") or 8
    if args.jobs < 1 or (args.budget_gib is not None and args.budget_gib <= 0):
        print(f"--jobs must be >= 1 and --budget-gib > 0, got {args.jobs} and {args.budget_gib}", file=sys.stderr)
        return 2
    budget = _report_parallel(args.report, "device_memory_budget_bytes")
    if args.budget_gib:
        budget = int(args.budget_gib * _GIB)
    if budget is None:
        print(f"{args.report}: no env.parallel budget recorded; pass --budget-gib", file=sys.stderr)
        return 2
    cases = [c for c in matrix(args.profile) if not any(fnmatch.fnmatchcase(c.id, p) for p in args.without)]
    units = plan_units(cases, mutation=True, measured=measured)
    if args.order == "area":
        units.sort(key=lambda u: -u.seconds * max(1.0, u.nbytes * args.jobs / budget))
    unmeasured = sum(c.id not in measured for c in cases)
    s = simulate(units, args.jobs, budget)
    print(f"{len(cases)} cases ({unmeasured} without a measured cost), {len(units)} units, {args.jobs} workers, "
          f"budget {budget / _GIB:.1f} GiB")  # fmt: skip
    print(f"simulated makespan {s.makespan:.0f} s; bounds: work {s.work_bound:.0f} s, memory {s.memory_bound:.0f} s, "
          f"longest unit {s.longest:.0f} s")  # fmt: skip
    print("busy per worker (s): " + ", ".join(f"{b:.0f}" for b in s.busy))
    shares = memory_shares(units)
    total = sum(shares.values())
    print(f"memory-time {total:.0f} GiB s; largest shares:")
    for key, v in shares.most_common(args.top):
        print(f"  {v:7.0f} GiB s {100 * v / total:5.1f}%  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
