"""The paths whose kernels have not yet passed an H200 run (``inputs.cases.GPU_PENDING_PATHS``): their gpu cases
(``inputs.cases.pending_gpu_cases``) with the invariances, and their catalogued mutations, judged exactly as the
gpu profile judges its own; a report beside the gpu profile's (report.json, summary.md, summary-full.md,
report.html), labelled with the selection. Once a committed run of this passes, the paths join the gpu profile.

Usage (repository root, on the GPU; the decode block needs CuTe DSL importable):
    python scripts/h200_pending.py --out DIR [--filter S ...] [--no-mutation] [--case ID ...] [--jobs N]
On CUDA the cases run in the gpu profile's worker processes (``run.parallel``, ``--jobs``, default as the gpu
profile's); the report of the cases is written as soon as they are done, then again with the mutations. SIGTERM
(``timeout``) stops the run: the report covers what finished and says INCOMPLETE. Exit status 0 when every case
passed and every mutation was killed and named, 3 for a stopped run, 1 otherwise.
"""

from __future__ import annotations

import argparse
import signal
import sys
from datetime import UTC, datetime

import torch


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from flint_moe.conformance.__main__ import environment, summary_table
    from flint_moe.conformance.inputs.cases import GPU_PENDING_PATHS, Case, pending_gpu_cases
    from flint_moe.conformance.judge.mutation import MUTATIONS, mutation_report, run_mutations
    from flint_moe.conformance.report.report import write_report
    from flint_moe.conformance.report.summary import mutation_line
    from flint_moe.conformance.run.parallel import default_jobs, run_parallel
    from flint_moe.conformance.run.runner import RunStopped, run_cases, stop_handler

    ap = argparse.ArgumentParser(prog="python scripts/h200_pending.py", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="report directory (created)")
    ap.add_argument("--filter", action="append", default=[], help="keep case ids containing S (all must match)")
    ap.add_argument("--case", action="append", default=[], help="run this case id instead of the pending list")
    ap.add_argument("--no-mutation", action="store_true", help="skip the pending paths' mutations")
    ap.add_argument("--no-invariance", action="store_true", help="skip the invariances")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default: the gpu profile's)")
    args = ap.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases = [Case.from_id(c) for c in args.case] if args.case else pending_gpu_cases()
    cases = [c for c in cases if all(f in c.id for f in args.filter)]
    if not cases:
        print(f"no pending case matches {args.filter}", file=sys.stderr)
        return 1
    console = Console(width=200)
    env = environment()
    env.update(profile="gpu" if device.type == "cuda" else "cpu", filters=["pending paths", *args.filter],
               date_utc=datetime.now(UTC).isoformat(timespec="seconds"),
               command=" ".join(["python scripts/h200_pending.py", *(sys.argv[1:] if argv is None else argv)]),
               cases_run=f"{len(cases)} pending-path cases ({', '.join(GPU_PENDING_PATHS)})",
               invariance=not args.no_invariance, black_box=False)  # fmt: skip
    jobs = args.jobs if args.jobs is not None else default_jobs(device.type)
    stopped: list[str] = []
    old_term = signal.signal(signal.SIGTERM, stop_handler())
    results, mutation = [], None
    try:
        if jobs > 1:
            results, _, env["parallel"] = run_parallel(
                cases, jobs, str(device), console, invariance=not args.no_invariance, stopped=stopped
            )
        else:
            results = run_cases(cases, device, console, invariance=not args.no_invariance, stopped=stopped)
        if stopped:
            env["incomplete"] = f"stopped by {stopped[0]} after {len(results)} of {len(cases)} cases"
        paths = write_report(results, env, args.out)  # the cases' verdicts, whatever happens to the mutations
        wanted = {c.path for c in cases}
        muts = [m for m in MUTATIONS if m.path in GPU_PENDING_PATHS and m.path in wanted]
        if muts and not args.no_mutation and not stopped:
            mutation = mutation_report(run_mutations(muts, device=device))
            paths = write_report(results, env, args.out, mutation=mutation)
    except (RunStopped, KeyboardInterrupt) as e:  # during the mutations: the cases' report is written
        stopped.append(str(e) or "SIGINT")
        env["incomplete"] = f"stopped by {stopped[-1]} during the mutations"
        paths = write_report(results, env, args.out)
    finally:
        signal.signal(signal.SIGTERM, old_term)
    console.print(summary_table(results))
    if mutation:
        console.print(mutation_line(mutation), markup=False)
    n_fail = sum((r["verdict"] if isinstance(r, dict) else r.verdict) == "FAIL" for r in results)
    print(f"{len(results)} of {len(cases)} pending cases, {n_fail} FAIL"
          + (f" ({env['incomplete']})" if stopped else "") + f"; report: {', '.join(map(str, paths.values()))}")
    missed = mutation is not None and mutation["killed"] < mutation["total"]
    return 3 if stopped else 1 if n_fail or missed else 0


if __name__ == "__main__":
    sys.exit(main())
