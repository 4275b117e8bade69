"""``python -m flint_moe.conformance``: run the conformance matrix and write the report (issue 5).

    python -m flint_moe.conformance [--profile auto|cpu|gpu] [--filter S] [--out DIR] [--list]
                                    [--invariance | --no-invariance]

For each case (``cases.matrix(profile)``, only ids containing every ``--filter`` substring): build its inputs
(``cases.make_inputs``), run its kernel path with taps (``paths.PATHS``), compare with the golden model
(``compare.compare_case``); then ``report.write_report`` into ``--out`` (default
``reports/<run-id>/``), a rich
summary table (case, verdict, failing stages), exit status 1 on any FAIL (or a case that raised), else 0.
Without CUDA the kernels run under Triton's interpreter: TRITON_INTERPRET=1 is set here before triton is
imported (bit-exactness is then NOT claimed; the report says so).
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

__all__ = ["environment", "main", "run_cases"]

INTERPRETER_BACKEND = "triton-interpreter (CPU): bit-exactness NOT claimed"


def environment() -> dict:
    """Run environment for the report: backend, gpu, torch, triton, python, cuda, git commit (or None)."""
    import triton

    cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    env = {
        "backend": f"triton-cuda ({torch.cuda.get_device_name(0)})" if cuda else INTERPRETER_BACKEND,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": os.environ.get("FLINT_GIT_COMMIT") or _git_commit(),
    }
    return env


def _git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() or None if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def select(profile: str, filters: list[str]) -> list:
    """Cases of ``profile`` whose id contains every substring in ``filters``."""
    from flint_moe.conformance.cases import matrix

    return [c for c in matrix(profile) if all(f in c.id for f in filters)]


def run_cases(cases: list, device: torch.device, console=None, *, invariance: bool = False) -> list:
    """Run and compare every case on ``device`` (rich progress bar); returns the CaseResults in order.
    With ``invariance``, each case's invariances (``invariance.check_invariances``) are attached; a required
    one that FAILs makes the case FAIL. FAIL cases get ``faults.diagnose`` names.
    An exception in a case (bad inputs, a kernel error) propagates: the run stops with a traceback."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flint_moe.conformance import compare
    from flint_moe.conformance.cases import make_inputs
    from flint_moe.conformance.faults import diagnose
    from flint_moe.conformance.invariance import check_invariances, required_failed
    from flint_moe.conformance.paths import PATHS
    from flint_moe.ops import make_route_counter

    counter = make_route_counter(device)
    results = []
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, console=console, transient=False) as prog:
        task = prog.add_task("conformance", total=len(cases))
        for case in cases:
            prog.update(task, description=case.id)
            inputs = make_inputs(case, device)
            taps: dict = {}
            path = PATHS[case.path]
            out = path.run(inputs, counter, taps)
            res = compare.compare_case(case, inputs, taps, out)
            if res.verdict == compare.FAIL:
                res.diagnosis = diagnose(case, inputs, taps, out, res)
            if invariance:
                res.invariance = check_invariances(case, inputs, path, counter, out, taps)
                if required_failed(res.invariance):
                    res.verdict = compare.FAIL
            results.append(res)
            prog.advance(task)
    return results


def summary_table(results: list):
    """rich Table: case, verdict, failing stages, warnings."""
    from rich.table import Table

    style = {"EXACT": "green", "WITHIN-BOUND": "cyan", "EXPLAINED": "yellow", "FAIL": "bold red"}
    t = Table(title="flint-moe conformance")
    t.add_column("case", overflow="fold")
    for col in ("verdict", "stages failing", "warnings", "invariances failing", "diagnosis"):
        t.add_column(col)
    for r in results:
        v = r.verdict
        inv = ", ".join(i.name for i in r.invariance if i.outcome == "FAIL") or ("-" if r.invariance else "n/a")
        diag = "; ".join(d.split(":")[0] for d in r.diagnosis) or "-"
        t.add_row(
            r.case_id, f"[{style.get(v, '')}]{v}[/]", ", ".join(r.failed_stages) or "-", str(r.warnings),
            inv, diag,
        )
    return t


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status (1 on any FAIL or no case selected, else 0)."""
    from rich.console import Console

    from flint_moe.conformance.report import write_report

    ap = argparse.ArgumentParser(prog="python -m flint_moe.conformance", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--profile",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="case matrix: gpu (real layers) or cpu (small shapes); auto = gpu if CUDA is present",
    )
    ap.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="S",
        help="keep cases whose id contains S (repeatable: all must match)",
    )
    ap.add_argument("--out", default=None, help="report directory (default reports/<run-id>/)")
    ap.add_argument("--list", action="store_true", help="print the selected case ids and exit")
    ap.add_argument(
        "--force",
        action="store_true",
        help="run the gpu profile without CUDA (real shapes under the Triton interpreter: minutes per case)",
    )
    ap.add_argument(
        "--invariance",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="check determinism, row independence, CUDA-graph replay (required) and batch invariance "
        "(measured) for every case (default: on for gpu, off for cpu, where the interpreter makes the ~2 + "
        "2 + M extra runs per case too slow for the 5-minute budget)",
    )
    args = ap.parse_args(argv)  # fmt: skip

    profile = args.profile
    if profile == "auto":
        profile = "gpu" if torch.cuda.is_available() else "cpu"
    cases = select(profile, args.filter)
    console = Console()
    if args.list:
        for c in cases:
            console.print(c.id, highlight=False)
        return 0
    if not cases:
        console.print(f"[red]no case of profile {profile!r} matches filters {args.filter}[/]")
        return 1
    if profile == "gpu" and not torch.cuda.is_available() and not args.force:
        console.print(
            "[red]the gpu profile runs real layer shapes; without CUDA they would run under the Triton "
            "interpreter (minutes per case, and bit-exactness is not claimed there). Use --profile cpu, "
            "or --force to run them anyway.[/]"
        )
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = environment()
    env["profile"] = profile
    env["filters"] = list(args.filter)
    now = datetime.datetime.now(datetime.UTC)
    env["date_utc"] = now.isoformat(timespec="seconds")
    env["command"] = " ".join(["python -m flint_moe.conformance", *(sys.argv[1:] if argv is None else argv)])
    from flint_moe.conformance.cases import matrix

    env["cases_run"] = f"{len(cases)} of {len(matrix(profile))}"
    run_id = now.strftime("%Y%m%dT%H%M%SZ") + f"-{profile}"
    out_dir = Path(args.out) if args.out else Path("reports") / run_id
    console.print(f"backend: {env['backend']}; {len(cases)} cases ({profile}); report -> {out_dir}")
    invariance = (profile == "gpu") if args.invariance is None else bool(args.invariance)
    env["invariance"] = invariance
    results = run_cases(cases, device, console, invariance=invariance)
    paths = write_report(results, env, out_dir)
    console.print(summary_table(results))
    n_fail = sum(r.verdict == "FAIL" for r in results)
    console.print(f"{len(results)} cases, {n_fail} FAIL; report: {', '.join(str(p) for p in paths.values())}")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
