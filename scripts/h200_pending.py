"""The paths whose kernels have not yet passed an H200 run (``inputs.cases.GPU_PENDING_PATHS``): their gpu cases
(``inputs.cases.pending_gpu_cases``) with the invariances, and their catalogued mutations, judged exactly as the
gpu profile judges its own; a report beside the gpu profile's (report.json, summary.md, summary-full.md,
report.html), labelled with the selection. Once a committed run of this passes, the paths join the gpu profile.

Usage (repository root, on the GPU; the decode block needs CuTe DSL importable):
    python scripts/h200_pending.py --out DIR [--filter S ...] [--no-mutation] [--case ID ...] [--jobs N]
On CUDA the cases run in the gpu profile's worker processes (``run.parallel``, ``--jobs``, default as the gpu
profile's); the report of the cases is written as soon as they are done, then again with the mutations, into a
staging directory beside ``--out`` (``.<name>.partial-<run id>``) that replaces ``--out`` when the run completes,
as the CLI does (``run.outdir``; the committed GPU evidence is refused). SIGTERM (``timeout``) stops the run: the
report covers what finished, says INCOMPLETE and in which phase (the cases or the mutations), and stays in the
staging directory. Exit status 1 when a case FAILed or was not judged, or a mutation was not killed and named
(or the self-test raised); else 3 for a stopped run; else 0 (2: ``--out`` refused).
"""

from __future__ import annotations

import argparse
import signal
import sys
import traceback
from datetime import UTC, datetime

import torch


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from flint_moe.conformance.__main__ import environment, summary_table
    from flint_moe.conformance.inputs.cases import GPU_PENDING_PATHS, Case, pending_gpu_cases
    from flint_moe.conformance.judge.mutation import MUTATIONS, mutation_report, run_mutations
    from flint_moe.conformance.judge.results import fail_counts
    from flint_moe.conformance.report.report import write_report
    from flint_moe.conformance.report.summary import mutation_line
    from flint_moe.conformance.run.outdir import OutDirError, RunKind, new_run_id, prepare_staging, publish
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
    run_id = new_run_id(datetime.now(UTC), "pending")
    kind = RunKind(device.type == "cuda", env["profile"], ("pending paths",))
    try:  # as the CLI: never into the committed evidence; the report is staged and published once complete
        staging = prepare_staging(args.out, run_id, kind, overwrite=True)
    except OutDirError as e:
        print(e, file=sys.stderr)
        return 2
    stopped: list[str] = []
    old_term = signal.signal(signal.SIGTERM, stop_handler())
    results, mutation, phase = [], None, "cases"
    try:
        if jobs > 1:
            results, _, env["parallel"] = run_parallel(cases, jobs, str(device), console,
                                                       invariance=not args.no_invariance, stopped=stopped,
                                                       profile=env["profile"])  # fmt: skip
        else:
            results = run_cases(cases, device, console, invariance=not args.no_invariance, stopped=stopped)
        if not stopped:
            write_report(results, env, staging)  # the cases' verdicts, whatever happens to the mutations
            wanted = {c.path for c in cases}
            muts = [m for m in MUTATIONS if m.path in GPU_PENDING_PATHS and m.path in wanted]
            if muts and not args.no_mutation:
                phase = "mutations"
                try:
                    mutation = mutation_report(run_mutations(muts, device=device))
                except Exception as e:  # noqa: BLE001  (reported as a self-test that did not pass)
                    traceback.print_exc()
                    mutation = {"error": f"{type(e).__name__}: {e}"}
    except (RunStopped, KeyboardInterrupt) as e:  # during the mutations (run_cases records a stop itself)
        stopped.append(str(e) or "SIGINT")
    finally:
        signal.signal(signal.SIGTERM, old_term)
    if stopped:
        env["incomplete"] = (f"stopped by {stopped[0]} after {len(results)} of {len(cases)} cases" if phase == "cases"
                             else f"stopped by {stopped[0]} during the mutations (after all {len(cases)} cases)")
        env["cases_run"] = f"{len(results)} (INCOMPLETE: {env['incomplete']}) of {env['cases_run']}"
    paths = write_report(results, env, staging, mutation=mutation)
    if not stopped:  # a complete run replaces --out; an INCOMPLETE one stays in the staging directory
        final = publish(staging, args.out, run_id)
        paths = {k: final / p.name for k, p in paths.items()}
    console.print(summary_table(results))
    if mutation and "error" not in mutation:
        console.print(mutation_line(mutation), markup=False)
    elif mutation:
        console.print(f"mutation self-test raised {mutation['error']}", style="bold red", markup=False)
    n_fail, n_nj = fail_counts(results)
    print(f"{len(results)} of {len(cases)} pending cases, {n_fail} FAIL" + (f", {n_nj} NOT-JUDGED" if n_nj else "")
          + (f" ({env['incomplete']})" if stopped else "") + f"; report: {', '.join(map(str, paths.values()))}")
    if stopped:
        print(f"INCOMPLETE RUN: {env['incomplete']}; its report stays in {staging} ({args.out} was not replaced)")
    total = int((mutation or {}).get("total") or 0)
    missed = mutation is not None and (
        "error" in mutation or mutation.get("killed", 0) < total or mutation.get("named", 0) < total
    )  # as the CLI's mutation line: every catalogued fault killed AND named by the diagnosis
    return 1 if n_fail or n_nj or missed else 3 if stopped else 0

if __name__ == "__main__":
    sys.exit(main())
