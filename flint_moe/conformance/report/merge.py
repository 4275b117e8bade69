"""Join the reports of a sharded conformance run (``--shard K/N``, :mod:`flint_moe.conformance.run.shard`) into one.

    python -m flint_moe.conformance.merge DIR... --out DIR [--overwrite] [--no-html] [--gpu-report REPORT]

Each DIR is a shard's report directory (or its report.json). The merge refuses (one line on stderr, exit 2):
a report that is not a shard report, shards of different source digests, profiles, filters, invariance or
black-box settings, shard counts or selections, a shard given twice, cases in more than one shard, and a
shard whose cases are not the ones its record names; it names every missing shard. The merged report lists
the cases in the selection's matrix order, takes the mutation self-test from the shard that ran it, records
the shards under ``env["merged"]`` (index, date, command, wall seconds, GPU, jobs, directory) and their
longest wall time as ``run_seconds``; it is INCOMPLETE when a shard was. A merged complete gpu-profile run on a
GPU is the GPU evidence exactly as a single run is (same freshness check, same ``--out`` guard). Exit status as
the CLI's: 1 on any FAIL, 3 when incomplete, else 0.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

__all__ = ["MergeError", "merge_reports", "main"]

#: env keys that must agree between the shards of one run.
_SAME = ("profile", "filters", "invariance", "black_box", "checkpoint", "backend")


class MergeError(ValueError):
    """The shard reports cannot be merged (one line naming the shard directories and the reason)."""


def _shard_of(rep: dict, where: str) -> dict:
    sh = (rep.get("env") or {}).get("shard")
    if not isinstance(sh, dict) or not all(
        isinstance(sh.get(k), int) for k in ("index", "count", "selection_size")
    ) or not isinstance(sh.get("cases"), list) or not isinstance(sh.get("selection_digest"), str):
        raise MergeError(f"{where}: not a shard report (no env.shard record: run with --shard K/N)")
    return sh


def merge_reports(reports: list[tuple[dict, str]]) -> tuple[list[dict], dict, dict | None]:
    """``reports``: (report dict, its path) of every shard. Returns (cases in selection order, merged env,
    mutation report or None). Raises MergeError (see the module docstring)."""
    from flint_moe.conformance.run.shard import selection_digest

    if not reports:
        raise MergeError("merge: no shard report given")
    shards = [(_shard_of(rep, where), rep, where) for rep, where in reports]
    first_sh, first, first_where = shards[0]
    fenv = first.get("env") or {}
    digest = (fenv.get("source_digest") or {}).get("digest")
    for sh, rep, where in shards[1:]:
        env = rep.get("env") or {}
        if (env.get("source_digest") or {}).get("digest") != digest:
            raise MergeError(
                f"{where}: sources {(env.get('source_digest') or {}).get('digest')} differ from {first_where}'s "
                f"{digest}: shards of different kernels cannot be merged"
            )
        for key in _SAME:
            if env.get(key) != fenv.get(key):
                raise MergeError(f"{where}: {key} {env.get(key)!r} differs from {first_where}'s {fenv.get(key)!r}")
        for key in ("count", "selection_digest", "selection_size"):
            if sh[key] != first_sh[key]:
                raise MergeError(
                    f"{where}: shard {key} {sh[key]!r} differs from {first_where}'s {first_sh[key]!r}: "
                    "not shards of one selection"
                )
    count = first_sh["count"]
    seen: dict[int, str] = {}
    owner: dict[str, str] = {}
    for sh, rep, where in shards:
        if not 1 <= sh["index"] <= count:
            raise MergeError(f"{where}: shard index {sh['index']} outside 1..{count}")
        if sh["index"] in seen:
            raise MergeError(f"{where}: shard {sh['index']}/{count} given twice (also {seen[sh['index']]})")
        seen[sh["index"]] = where
        ids = [c.get("case_id") for c in rep["cases"]]
        if not set(ids) <= set(sh["cases"]):
            extra = sorted(set(ids) - set(sh["cases"]))
            raise MergeError(f"{where}: cases outside its shard record: {', '.join(map(str, extra[:5]))}")
        for i in ids:
            if i in owner:
                raise MergeError(f"{where}: case {i} is also in {owner[i]}: overlapping shards")
            owner[i] = where
    missing = sorted(set(range(1, count + 1)) - set(seen))
    if missing:
        raise MergeError(
            f"merge: shard{'s' if len(missing) > 1 else ''} {', '.join(f'{k}/{count}' for k in missing)} missing "
            f"(given: {', '.join(f'{k}/{count}' for k in sorted(seen))})"
        )
    from flint_moe.conformance.inputs.cases import PROFILES, matrix

    if fenv.get("profile") not in PROFILES:
        raise MergeError(f"{first_where}: profile {fenv.get('profile')!r}: only matrix runs are sharded")
    rank = {c.id: i for i, c in enumerate(matrix(fenv["profile"]))}
    named = [i for sh, _, _ in shards for i in sh["cases"]]
    unknown = sorted(i for i in named if i not in rank)
    if unknown:
        raise MergeError(f"merge: cases not in the {fenv['profile']} matrix: {', '.join(unknown[:5])}")
    selection = sorted(named, key=rank.__getitem__)
    if len(selection) != first_sh["selection_size"] or selection_digest(selection) != first_sh["selection_digest"]:
        raise MergeError(
            f"merge: the shards name {len(selection)} cases that are not the selection they were cut from "
            f"({first_sh['selection_size']} cases): shards of different matrices?"
        )
    by_id = {c["case_id"]: c for _, rep, _ in shards for c in rep["cases"]}
    cases = sorted(by_id.values(), key=lambda c: rank[c["case_id"]])
    mutation = None
    for _sh, rep, where in shards:
        if rep.get("mutation") is not None:
            if mutation is not None:
                raise MergeError(f"{where}: a second mutation self-test (one shard runs it)")
            mutation = rep["mutation"]
    env = {k: v for k, v in fenv.items() if k not in ("shard", "parallel", "incomplete")}
    env["merged"] = [
        {
            "index": sh["index"],
            "count": count,
            "dir": where,
            "date_utc": (rep.get("env") or {}).get("date_utc"),
            "command": (rep.get("env") or {}).get("command"),
            "run_seconds": (rep.get("env") or {}).get("run_seconds"),
            "gpu": (rep.get("env") or {}).get("gpu"),
            "jobs": (rep.get("env") or {}).get("jobs"),
            "cases": len(rep["cases"]),
        }
        for sh, rep, where in sorted(shards, key=lambda s: s[0]["index"])
    ]
    secs = [m["run_seconds"] for m in env["merged"] if isinstance(m["run_seconds"], (int, float))]
    env["run_seconds"] = max(secs) if secs else None
    gpus = {m["gpu"] for m in env["merged"]}
    env["gpu"] = fenv.get("gpu") if len(gpus) == 1 else ", ".join(sorted(map(str, gpus)))
    incomplete = [
        f"shard {sh['index']}/{count}: {(rep.get('env') or {})['incomplete']}"
        for sh, rep, _ in shards
        if (rep.get("env") or {}).get("incomplete")
    ]
    short = [f"shard {sh['index']}/{count} ran {len(rep['cases'])} of {len(sh['cases'])}"
             for sh, rep, _ in shards if len(rep["cases"]) < len(sh["cases"])]  # fmt: skip
    if incomplete or short:
        env["incomplete"] = "; ".join(incomplete or short)
    env["cases_run"] = f"{len(cases)} of {len(rank)} (merged from {count} shards)" + (
        f" (INCOMPLETE: {env['incomplete']})" if env.get("incomplete") else ""
    )
    return cases, env, mutation


def main(argv: list[str] | None = None) -> int:
    """CLI (module docstring). Returns the exit status."""
    from flint_moe.conformance.inputs.cases import GPU_PROFILES
    from flint_moe.conformance.report.baseline import load_report
    from flint_moe.conformance.report.digest import DEFAULT_GPU_REPORT, check_report, repo_root, source_digest
    from flint_moe.conformance.report.report import report_dict, write_report
    from flint_moe.conformance.run.outdir import RunKind, check_out, evidence_guard, new_run_id, publish, staging_dir

    ap = argparse.ArgumentParser(prog="python -m flint_moe.conformance.merge", description=__doc__.split("\n")[0])
    ap.add_argument("shards", nargs="+", metavar="DIR", help="shard report directories (or their report.json)")
    ap.add_argument("--out", required=True, help="directory of the merged report")
    ap.add_argument("--overwrite", action="store_true", help="replace the report in a non-empty --out")
    ap.add_argument("--html", action=argparse.BooleanOptionalAction, default=True, help="write report.html")
    ap.add_argument("--gpu-report", default=DEFAULT_GPU_REPORT, metavar="REPORT",
                    help=f"committed GPU report whose freshness the summary names (default {DEFAULT_GPU_REPORT})")
    args = ap.parse_args(argv)  # fmt: skip
    try:
        reports = [load_report(d, flag="merge") for d in args.shards]
        cases, env, mutation = merge_reports(reports)
        gpu_profile = env.get("profile") in GPU_PROFILES
        partial = tuple(
            why
            for why, bad in (
                ("incomplete", bool(env.get("incomplete"))),
                (f"filtered ({', '.join(map(str, env.get('filters') or []))})", bool(env.get("filters"))),
                ("--black-box", bool(env.get("black_box"))),
                ("--no-invariance", gpu_profile and env.get("invariance") is False),
                ("no mutation self-test", gpu_profile and mutation is None),
                ("--no-html", not args.html),
            )
            if bad
        )
        kind = RunKind(gpu=bool(env.get("gpu")), profile=str(env.get("profile")), partial=partial)
        evidence_guard(args.out, kind)
        check_out(args.out, args.overwrite)
    except (FileNotFoundError, ValueError) as e:  # MergeError and OutDirError are ValueErrors
        print(str(e), file=sys.stderr)
        return 2
    now = datetime.datetime.now(datetime.UTC)
    env["merged_utc"] = now.isoformat(timespec="seconds")
    env["command"] = " ".join(["python -m flint_moe.conformance.merge", *(sys.argv[1:] if argv is None else argv)])
    run_id = new_run_id(now, f"{env.get('profile')}-merged")
    if env.get("gpu"):
        fresh = check_report(report_dict(cases, env), current=(env.get("source_digest") or source_digest()))
        fresh.line = fresh.line.replace("GPU REPORT CURRENT (", "GPU REPORT CURRENT (this GPU run: ", 1)
    else:
        gpu_path = Path(args.gpu_report)
        if not gpu_path.is_absolute() and not gpu_path.exists():
            gpu_path = repo_root() / gpu_path
        fresh = check_report(gpu_path)
    stage = staging_dir(args.out, run_id)
    write_report(cases, env, stage, mutation=mutation, gpu_report=fresh.to_json(), html=args.html)
    out = publish(stage, args.out, run_id)
    from flint_moe.conformance.judge.results import fail_counts

    n_fail, n_nj = fail_counts(cases)
    n_fail += n_nj  # a NOT-JUDGED case is no pass either
    print(f"{len(cases)} cases from {len(reports)} shards, {n_fail - n_nj} FAIL{f', {n_nj} NOT-JUDGED' * bool(n_nj)}; "
          f"report: {out}")
    print(fresh.line)
    if env.get("incomplete"):
        print(f"INCOMPLETE MERGE: {env['incomplete']}")
        return 1 if n_fail else 3
    return 1 if n_fail else 0

