"""``python -m flint_moe.conformance``: run the conformance matrix and write the report.

    python -m flint_moe.conformance [--profile auto|cpu|gpu|gpu-full] [--filter S] [--out DIR [--overwrite]] [--list]
                                    [--shape NAME|E,H,I,k[,SI]] [--route SPEC]
                                    [--invariance | --no-invariance] [--mutation | --no-mutation]
                                    [--baseline OTHER] [--no-html] [--gpu-report REPORT] [--black-box]

For each case (``cases.matrix(profile)``, ids containing every ``--filter`` substring; ``--shape`` /
``--route``: ``selection.shape_cases`` of any shape, forced routing, ``inputs/routing.py``): build its inputs, run
its kernel path with taps (``paths.PATHS``), compare with the golden model (``stages.compare_case``); then
``report.write_report`` into ``--out`` (default ``reports/<run-id>/``, staged beside it and renamed when the
run completes, ``outdir.publish``): report.json, summary.md (the short pull-request summary), summary-full.md
and report.html; ``--mutation`` adds the self-test (``mutation.self_test``), ``--baseline OTHER`` the verdict
and output digest changes (``baseline.compare_reports``). Every run ends with the freshness line of the
committed GPU report (``digest.check_report``). Exit status 1 on any FAIL (or a case that raised) or NOT-JUDGED
case (out of device memory on every attempt); 2 for a bad baseline, a refused gpu profile or ``--out`` (a file,
a non-empty directory without ``--overwrite``, the GPU evidence from a run that is not a complete gpu-profile GPU
run), before the first case; 3 for a run stopped by SIGTERM / SIGINT (the report covers the cases done, says
INCOMPLETE, stays staged); else 0. Without CUDA the kernels run under Triton's interpreter (TRITON_INTERPRET=1,
set here); console strings are printed literally.
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
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from flint_moe.conformance.inputs.cases import GPU_PROFILES, PROFILES  # noqa: E402
from flint_moe.conformance.run.runner import (  # noqa: E402  (re-exported: the CLI's case runner)
    RunStopped,
    raised_result,
    run_case,
    run_cases,
    stop_handler,
)

__all__ = ["RunStopped", "environment", "main", "raised_result", "run_case", "run_cases"]

INTERPRETER_BACKEND = "triton-interpreter (CPU): bit-exactness NOT claimed"
_NOT_PASS = ("FAIL", "NOT-JUDGED")  # verdicts that make the exit status 1 (NOT-JUDGED: out of device memory)


def environment() -> dict:
    """Run environment for the report: backend, gpu, driver, cuda, torch, triton, python, git commit (or None),
    the tracked files modified in the checkout (``git_dirty``) and the source digest of the kernels and the
    golden model (``digest.source_digest``)."""
    import triton

    from flint_moe.conformance.report.digest import source_digest

    cuda = _compiled_cuda()
    env = {
        "backend": f"triton-cuda ({torch.cuda.get_device_name(0)})" if cuda else INTERPRETER_BACKEND,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "cuda": torch.version.cuda if cuda else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": os.environ.get("FLINT_GIT_COMMIT") or _git_commit(),
        "git_dirty": _git_dirty(),
        "driver": _driver() if cuda else None,
        "source_digest": source_digest(),
    }
    return env


def _compiled_cuda() -> bool:
    """True when the kernels run compiled on a CUDA GPU (not under the Triton interpreter)."""
    return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def run_kind(args, profile: str, invariance: bool, mutation: bool):
    """``outdir.RunKind`` of a run of the parsed ``args``: partial when filtered, a ``--rerun-failed`` merge,
    ``--black-box``, a ``--checkpoint`` layer, without report.html, or (gpu profile) without the invariances or
    the mutation self-test the profile runs by default."""
    from flint_moe.conformance.run.outdir import RunKind

    partial = []
    if getattr(args, "shard", None):
        partial.append(f"shard {args.shard} (merge the shards: python -m flint_moe.conformance.merge)")
    if args.filter:
        partial.append("filtered (" + ", ".join(args.filter) + ")")
    for flag, on in (("--shape", getattr(args, "shape", None)), ("--route", getattr(args, "route", None)),
                     ("--rerun-failed", args.rerun_failed), ("--black-box", args.black_box),
                     ("--checkpoint", args.checkpoint is not None), ("--no-html", not args.html),
                     ("--no-invariance", profile in GPU_PROFILES and not invariance),
                     ("--no-mutation", profile in GPU_PROFILES and not mutation)):  # fmt: skip
        if on:
            partial.append(flag)
    return RunKind(gpu=_compiled_cuda(), profile=profile, partial=tuple(partial))


def _driver() -> str | None:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)  # fmt: skip
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def _git(*args: str) -> str | None:
    """stdout of ``git ARGS`` run in the package's checkout, or None without git, on error, or when the
    package is not the top level of a git work tree (e.g. a ``git archive`` snapshot unpacked inside another
    checkout, as on the H200: that checkout's state would not describe the snapshot)."""
    root = Path(__file__).resolve().parents[2]
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True,
                             timeout=10)  # fmt: skip
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
            return None
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return r.stdout if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _git_dirty() -> list[str] | None:
    """Tracked files modified in the checkout (the sources then differ from ``git_commit``; the source digest
    is what counts), [] for a clean one, None without a checkout of its own (a ``git archive`` snapshot) or when
    ``FLINT_GIT_COMMIT`` names the commit the tree was sent as."""
    if os.environ.get("FLINT_GIT_COMMIT"):
        return None
    out = _git("status", "--porcelain", "--untracked-files=no")
    return None if out is None else sorted(ln[3:] for ln in out.splitlines() if ln.strip())


def _git_commit() -> str | None:
    out = _git("rev-parse", "HEAD")
    return (out or "").strip() or None


def select(profile: str, filters: list[str]) -> list:
    """Cases of ``profile`` whose id contains every substring in ``filters``."""
    from flint_moe.conformance.inputs.cases import matrix

    return [c for c in matrix(profile) if all(f in c.id for f in filters)]


def checkpoint_selection(path: str, layer: int, profile: str, filters: list[str], device: torch.device):
    """(cases, {case id: CaseInputs}) for ``--checkpoint PATH --layer N``: one case per distinct token count of
    the ``profile`` matrix's NVFP4 paths (decode up to the layer's ``ops.decode_max_tokens(E, k)``, grouped
    above: ``run.paths.dispatch_path``), on that layer's weights (``checkpoint.checkpoint_cases``), filtered
    like the matrix."""
    from dataclasses import replace

    from flint_moe.conformance.inputs.cases import matrix
    from flint_moe.conformance.inputs.checkpoint import checkpoint_cases
    from flint_moe.conformance.run.paths import dispatch_path

    counts = sorted({c.M for c in matrix(profile) if c.path.startswith("nvfp4_")})
    pairs = checkpoint_cases(path, layer, token_counts=counts, device=device)
    cases, inputs = [], {}
    for case, inp in pairs:
        if dispatch_path(case.M, case.E, case.k) == "nvfp4_grouped":
            case = replace(case, path="nvfp4_grouped")
        if all(f in case.id for f in filters):
            cases.append(case)
            inputs[case.id] = inp
    return cases, inputs


def _merge_rerun(prev: dict, prev_path: str, results: list, mutation, env: dict) -> tuple[list, dict | None]:
    """``--rerun-failed``: the earlier report's cases in order, each rerun one replaced by its new result;
    the earlier mutation report unless this run made one; ``env["rerun"]`` records what was merged."""
    from flint_moe.conformance.report.summary import case_dicts

    new = {c["case_id"]: c for c in case_dicts(results)}
    merged = [new.get(c["case_id"], c) for c in prev["cases"]]
    pe = prev.get("env") or {}
    env["rerun"] = {
        "report": prev_path,
        "previous_run": pe.get("date_utc"),
        "previous_commit": pe.get("git_commit"),
        "previous_run_seconds": pe.get("run_seconds"),
        "previous_jobs": pe.get("jobs"),
        "rerun_cases": sorted(new),
    }
    env["cases_run"] = (
        f"{len(merged)} ({len(new)} FAIL cases of the run of {pe.get('date_utc')} rerun, the others from it)"
    )
    return merged, mutation if mutation is not None else prev.get("mutation")


def summary_table(results: list, width: int | None = None):
    """rich Table: case (black-box labelled), verdict, exact %, max ulp, end to end, failing stages,
    warnings, failing invariances, diagnosis (``results``: CaseResults or their JSON dicts). Every cell is a
    rich Text: what a result holds is shown literally, never read as markup. With the console's ``width``, case
    ids up to half of it are never wrapped (an id is what --filter takes; the other columns fold first)."""
    from rich.table import Table
    from rich.text import Text

    from flint_moe.conformance.report.summary import _e2e_cell, _max_ulp, _warnings, case_dicts, exact_percent

    style = {"EXACT": "green", "WITHIN-BOUND": "cyan", "EXPLAINED": "yellow", "FAIL": "bold red"}
    cases = case_dicts(results)
    t = Table(title="flint-moe conformance")
    longest = max((len(str(c["case_id"])) for c in cases), default=4)
    if width is not None and longest <= width // 2:
        t.add_column("case", no_wrap=True, min_width=longest)
    else:
        t.add_column("case", overflow="fold")
    t.add_column("verdict", no_wrap=True)
    for col in ("exact %", "max ulp", "end to end", "stages failing", "warnings", "invariances failing", "diagnosis"):
        t.add_column(col, overflow="fold")
    for c in cases:
        v = c["verdict"]
        inv = ", ".join(i["name"] for i in c.get("invariance") or [] if i.get("outcome") == "FAIL")
        inv = inv or ("-" if c.get("invariance") else "n/a")
        diag = "; ".join(d.split(":")[0] for d in c.get("diagnosis") or []) or "-"
        failing = ", ".join(s["stage"] for s in c.get("stages", []) if s.get("verdict") == "FAIL") or "-"
        pct, mu = exact_percent(c), _max_ulp(c)
        case = Text(str(c["case_id"]))
        if c.get("mode") == "black-box":
            case.append(" (black-box)", style="magenta")
        t.add_row(
            case, Text(str(v), style=style.get(v, "")), "-" if pct is None else f"{pct:.2f}",
            "-" if mu is None else f"{mu:.3g}", *(Text(x) for x in (_e2e_cell(c), failing, str(_warnings(c)), inv,
                                                                    diag)),
        )  # fmt: skip
    return t


def _mutation(console) -> dict | None:
    """``mutation.self_test()`` (catalogued and sub-bound faults: the harness's self-test), or None with a note when
    the module is not there yet."""
    try:
        from flint_moe.conformance.judge.mutation import self_test
    except ImportError as e:
        console.print(f"mutation testing unavailable ({e}); report without a kill rate", style="yellow",
                      markup=False)
        return None
    console.print("mutation testing: injecting each catalogued fault ...")
    return self_test()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status (1 on any FAIL / NOT-JUDGED or no case selected, 2 for a refused gpu
    profile, an unusable baseline or --rerun-failed report, or a refused --out, 3 for a stopped run, else 0)."""
    t_main = time.perf_counter()
    from rich.console import Console

    from flint_moe.conformance.report.digest import DEFAULT_GPU_REPORT, check_report, repo_root
    from flint_moe.conformance.report.report import write_report

    ap = argparse.ArgumentParser(prog="python -m flint_moe.conformance", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--profile",
        choices=("auto", *PROFILES),
        default="auto",
        help="case matrix: gpu (real layers, the pull-request gate), gpu-full (gpu plus its slowest cases) or cpu "
        "(small shapes); auto = gpu if CUDA is present",
    )
    ap.add_argument(
        "--filter",
        action="append",
        default=[],
        metavar="S",
        help="keep cases whose id contains S (repeatable: all must match)",
    )
    ap.add_argument("--out", default=None, help="report directory (default reports/<run-id>/); refused when it is a "
                    "non-empty directory unless --overwrite, and when it is the committed GPU evidence (reports/h200, "
                    "reports/gpu/...) unless this is a complete gpu-profile run on a GPU")  # fmt: skip
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the report files of a non-empty --out (its other files are kept) when the run "
                    "completes")  # fmt: skip
    ap.add_argument("--list", action="store_true", help="print the selected case ids and exit")
    ap.add_argument(
        "--force",
        action="store_true",
        help="run the gpu profile, or a --shape above 1 GiB of bf16 weights, without CUDA (real shapes under the "
        "Triton interpreter: minutes to hours per case)",
    )
    ap.add_argument(
        "--black-box",
        action="store_true",
        help="judge every selected case as a kernel without taps is judged: production build, end-to-end "
        "comparison with the golden model's bounded intervals only (blackbox.compare_blackbox), labelled "
        "black-box in the report; no stage verdicts and no fault diagnosis",
    )
    ap.add_argument(
        "--invariance",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="check determinism, row independence, CUDA-graph replay (required) and batch invariance "
        "(measured) for every case (default: on for gpu, off for cpu, where the interpreter makes the ~2 + "
        "2 + M extra runs per case too slow for the 5-minute budget)",
    )
    ap.add_argument(
        "--mutation",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mutation-test the harness (inject each catalogued fault, report the kill rate; default: on for "
        "gpu, off for cpu)",
    )
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="OTHER",
        help="an earlier report (directory or report.json) of the same kind of device: list verdict changes and "
        "changed output digests (a CPU run against a GPU report, or the reverse, is refused: exit 2)",
    )
    ap.add_argument("--html", action=argparse.BooleanOptionalAction, default=True, help="write report.html")
    ap.add_argument(
        "--gpu-report",
        default=DEFAULT_GPU_REPORT,
        metavar="REPORT",
        help=f"committed GPU report whose freshness ends the run (default {DEFAULT_GPU_REPORT})",
    )
    ap.add_argument(
        "--checkpoint",
        default=None,
        metavar="PATH",
        help="run the matrix's NVFP4 token counts on one MoE layer of a checkpoint (ModelOpt NVFP4 directory "
        "or GGUF file) instead of the case matrix; needs --layer",
    )
    ap.add_argument("--layer", type=int, default=None, metavar="N", help="MoE layer index for --checkpoint")
    from flint_moe.conformance.selection import add_selection_args

    add_selection_args(ap)
    ap.add_argument(
        "--rerun-failed",
        default=None,
        metavar="REPORT",
        help="run only the FAIL cases of an earlier report of the same sources (directory or report.json) and "
        "write the merged report: its other cases as they were, these as rerun now (env['rerun'] says so)",
    )
    ap.add_argument(
        "--jobs",
        default="auto",
        metavar="N|auto",
        help="worker processes sharing the device (conformance/run/parallel.py; a case is mostly host work, so N "
        "workers on one GPU run the matrix ~N times faster; with several visible GPUs the workers are spread "
        "over all of them); auto = half the cores, up to 8 per GPU, with CUDA, 1 without",
    )
    ap.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="run shard K of N of the selected cases (conformance/run/shard.py: deterministic, balanced by estimated "
        "cost; join the N reports with python -m flint_moe.conformance.merge)",
    )
    args = ap.parse_args(argv)  # fmt: skip

    profile = args.profile
    if profile == "auto":
        profile = "gpu" if torch.cuda.is_available() else "cpu"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.jobs != "auto" and not (args.jobs.isdigit() and int(args.jobs) >= 1):
        print(f"--jobs: expected a positive integer or auto, got {args.jobs!r}", file=sys.stderr)
        return 2
    given_inputs = None
    if args.checkpoint is not None or args.layer is not None:
        if args.checkpoint is None or args.layer is None:
            print("--checkpoint and --layer go together", file=sys.stderr)
            return 2
        from flint_moe.conformance.inputs.checkpoint import CHECKPOINT_ERRORS, checkpoint_error_line

        try:
            cases, given_inputs = checkpoint_selection(args.checkpoint, args.layer, profile, args.filter, device)
        except CHECKPOINT_ERRORS as e:
            print(checkpoint_error_line(args.checkpoint, args.layer, e), file=sys.stderr)
            return 2
    elif args.shape is not None or args.route is not None or args.tokens is not None:
        from flint_moe.conformance.selection import shape_route_selection

        try:
            cases = shape_route_selection(args.shape, args.route, profile, args.filter, args.tokens)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
    else:
        cases = select(profile, args.filter)
    prev = None
    if args.rerun_failed:
        from flint_moe.conformance.report.baseline import load_report
        from flint_moe.conformance.report.digest import source_digest

        try:
            prev, prev_path = load_report(args.rerun_failed, flag="--rerun-failed")
        except (FileNotFoundError, ValueError) as e:
            print(e, file=sys.stderr)
            return 2
        prev_sd = (prev.get("env") or {}).get("source_digest") or {}
        if prev_sd.get("digest") != source_digest().get("digest"):
            print(f"--rerun-failed {args.rerun_failed}: its sources ({prev_sd.get('digest')}) are not the current "
                  "sources: a merged report would mix kernels; run the whole profile", file=sys.stderr)  # fmt: skip
            return 2
        profile = (prev.get("env") or {}).get("profile") or profile
        failed = {c["case_id"] for c in prev["cases"] if c.get("verdict") == "FAIL"}
        if not failed:
            print(f"--rerun-failed {args.rerun_failed}: the report has no FAIL case, nothing to rerun")
            return 0
        cases = [c for c in select(profile, args.filter) if c.id in failed]
    shard = None
    if args.shard is not None:
        from flint_moe.conformance.run.shard import parse_shard, plan_shards, shard_record

        try:
            k, n = parse_shard(args.shard)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        if args.checkpoint is not None or args.rerun_failed:
            print("--shard splits the case matrix; it does not go with --checkpoint or --rerun-failed", file=sys.stderr)
            return 2
        if not cases:
            print(f"--shard {args.shard}: no case of profile {profile!r} matches filters {args.filter}",
                  file=sys.stderr)  # fmt: skip
            return 1
        selected = [c.id for c in cases]
        wants = (profile in GPU_PROFILES) if args.mutation is None else args.mutation
        shard = plan_shards(cases, n, mutation=wants)[k - 1]
        cases, shard_env = shard.cases, shard_record(shard, selected)
    console = Console(markup=False, emoji=False)  # paths, filters, report contents: printed as they are
    if not console.is_terminal:  # CI logs, pipes: wide enough for the summary table's case ids
        console = Console(width=max(console.width, 180), markup=False, emoji=False)
    if args.list:
        for c in cases:
            console.print(c.id, highlight=False, markup=False)
        return 0
    if not cases and shard is None:  # a shard may be empty (more shards than units of work)
        console.print(f"no case of profile {profile!r} matches filters {args.filter}", style="red", markup=False)
        return 1
    from flint_moe.conformance.selection import cpu_refusal

    refusal = None if torch.cuda.is_available() or args.force else cpu_refusal(profile, args.shape, cases)
    if refusal is not None:
        console.print(refusal, style="red", markup=False)
        return 2
    base = None
    if args.baseline:
        from flint_moe.conformance.report.baseline import load_report

        try:
            base = load_report(args.baseline)
        except (FileNotFoundError, ValueError) as e:
            print(e, file=sys.stderr)  # one line, never wrapped
            return 2
    env = environment()
    if base is not None:
        from flint_moe.conformance.report.baseline import check_same_device

        try:
            check_same_device(env, base[0], args.baseline)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
    env["profile"] = profile
    sel = (("--shape", args.shape), ("--route", args.route), ("--tokens", args.tokens))
    env["filters"] = list(args.filter) + [f"{flag}={v}" for flag, v in sel if v is not None]
    now = datetime.datetime.now(datetime.UTC)
    env["date_utc"] = now.isoformat(timespec="seconds")
    env["command"] = " ".join(["python -m flint_moe.conformance", *(sys.argv[1:] if argv is None else argv)])
    from flint_moe.conformance.inputs.cases import matrix

    env["cases_run"] = (
        f"{len(cases)} checkpoint cases" if args.checkpoint else f"{len(cases)} of {len(matrix(profile))}"
    )
    if shard is not None:
        env["shard"] = shard_env
        env["cases_run"] = (
            f"{len(cases)} (shard {shard.index}/{shard.count} of {shard_env['selection_size']} selected) "
            f"of {len(matrix(profile))}"
        )
    from flint_moe.conformance.run.outdir import OutDirError, new_run_id, prepare_staging, publish

    run_id = new_run_id(now, profile)
    out_dir = Path(args.out) if args.out else Path("reports") / run_id
    invariance = (profile in GPU_PROFILES) if args.invariance is None else bool(args.invariance)
    want_mutation = (profile in GPU_PROFILES) if args.mutation is None else args.mutation
    kind = run_kind(args, profile, invariance, want_mutation)
    if shard is not None:
        want_mutation = shard.mutation  # one shard runs the self-test
    try:
        staging = prepare_staging(out_dir, run_id, kind, args.overwrite)
    except OutDirError as e:
        print(e, file=sys.stderr)
        return 2
    console.print(f"backend: {env['backend']}; {len(cases)} cases ({profile}); report -> {out_dir}", markup=False)
    env["invariance"] = invariance
    env["black_box"] = bool(args.black_box)
    if args.checkpoint is not None:
        env["checkpoint"] = f"{args.checkpoint} layer {args.layer}"
    from flint_moe.conformance.run.parallel import default_jobs, run_parallel, visible_gpus

    n_gpus = len(visible_gpus()) if device.type == "cuda" else 0
    jobs = default_jobs(device.type, n_gpus) if args.jobs == "auto" else int(args.jobs)  # validated above
    if given_inputs is not None:
        jobs = 1  # checkpoint layers are loaded in this process
    env["jobs"] = jobs
    # SIGTERM (e.g. a CI time limit) stops the run between or inside cases; the report covers the cases done.
    old_term = signal.signal(signal.SIGTERM, stop_handler())
    stopped: list[str] = []
    mutation = None
    t_run = time.perf_counter()
    try:
        if jobs > 1:
            console.print(f"{jobs} worker processes on {device}" + (f" ({n_gpus} GPUs)" if n_gpus > 1 else ""))
            results, mutation, info = run_parallel(cases, jobs, str(device), console, invariance=invariance,
                                                   mutation=want_mutation, stopped=stopped, black_box=args.black_box,
                                                   profile=profile)  # fmt: skip
            env["parallel"] = info
        else:
            if want_mutation:
                mutation = _mutation(console)  # first: the self-test must not depend on how far cases get
            results = run_cases(cases, device, console, invariance=invariance, inputs=given_inputs, stopped=stopped,
                                black_box=args.black_box)  # fmt: skip
    except (RunStopped, KeyboardInterrupt) as e:  # stopped during the mutation self-test
        stopped.append(str(e) or "SIGINT")
        results = []
    finally:
        signal.signal(signal.SIGTERM, old_term)
    env["run_seconds"] = round(time.perf_counter() - t_run, 1)
    if stopped:
        env["incomplete"] = f"stopped by {stopped[0]} after {len(results)} of {len(cases)} selected cases"
        env["cases_run"] = f"{len(results)} (INCOMPLETE: {env['incomplete']}) of {len(matrix(profile))}"
    if prev is not None:
        results, mutation = _merge_rerun(prev, prev_path, results, mutation, env)
    gpu_path = Path(args.gpu_report)
    if not gpu_path.is_absolute() and not gpu_path.exists():
        gpu_path = repo_root() / gpu_path
    if env.get("gpu"):
        # A GPU run is itself the evidence for the sources it ran: its line says so (committed as reports/h200/,
        # it stays CURRENT until a kernel or golden-model source changes).
        from flint_moe.conformance.report.report import report_dict

        fresh = check_report(report_dict(results, env), current=env["source_digest"])
        fresh.line = fresh.line.replace("GPU REPORT CURRENT (", "GPU REPORT CURRENT (this GPU run: ", 1)
    else:
        fresh = check_report(gpu_path, current=env["source_digest"])
    diff = None
    if base is not None:
        from flint_moe.conformance.report.baseline import compare_reports
        from flint_moe.conformance.report.report import report_dict

        diff = compare_reports(report_dict(results, env), base[0], base[1])
    paths = write_report(
        results, env, staging, mutation=mutation, baseline=diff, gpu_report=fresh.to_json(), html=args.html
    )
    if not stopped:  # a complete run replaces --out; an INCOMPLETE one stays in the staging directory
        final = publish(staging, out_dir, run_id)
        paths = {k: final / p.name for k, p in paths.items()}
    from flint_moe.conformance.run.wall import process_seconds, wall_line

    t_done, age = time.perf_counter(), process_seconds()  # the console output below is not in the split
    console.print(summary_table(results, console.width))
    n_fail, n_nj = (sum((r["verdict"] if isinstance(r, dict) else r.verdict) == v for r in results) for v in _NOT_PASS)
    if mutation:
        from flint_moe.conformance.report.summary import mutation_line

        console.print(mutation_line(mutation), markup=False)
    if diff is not None:
        worse = sum(v["direction"] == "worse" for v in diff["verdict_changes"])
        n_cmp = diff.get("cases_compared")
        console.print(
            f"vs baseline {diff['other']}: {n_cmp if n_cmp is not None else '?'} cases compared, "
            f"{len(diff['verdict_changes'])} verdict changes ({worse} worse), "
            f"{len(diff['digest_changes'])} output digests changed", markup=False
        )  # fmt: skip
        if not n_cmp:
            console.print(f"no case of this run is in the baseline {diff['other']} (another profile or filter?): "
                          "nothing was compared", style="bold yellow", markup=False)  # fmt: skip
    console.print(f"{len(results)} cases, {n_fail} FAIL{f', {n_nj} NOT-JUDGED' * bool(n_nj)}; report: "
                  f"{', '.join(str(p) for p in paths.values())}", markup=False)  # fmt: skip
    console.print(f"pull-request summary: {paths['summary']} (the full tables: {paths['summary_full']})",
                  markup=False, highlight=False)  # fmt: skip
    report_s = t_done - t_run - env["run_seconds"]
    console.print(wall_line(age, t_run - t_main, env["run_seconds"], report_s), markup=False,
                  highlight=False)  # fmt: skip
    style = "bold green" if fresh.current else "bold yellow"
    console.print(fresh.line, style=style, markup=False, highlight=False, soft_wrap=True)  # one line, never wrapped
    if stopped:
        console.print(f"INCOMPLETE RUN: {env['incomplete']}; its report stays in {staging} ({out_dir} was not "
                      "replaced)", style="bold red", markup=False)  # fmt: skip
        return 1 if n_fail or n_nj else 3
    return 1 if n_fail or n_nj else 0


if __name__ == "__main__":
    sys.exit(main())
