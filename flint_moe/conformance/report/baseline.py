"""``--baseline OTHER``: what changed between two conformance reports.

:func:`compare_reports` ``(current, other) -> dict`` lists, case by case (matched by case id):

- verdict changes (``{"case_id", "before", "after", "direction"}``; direction ``"worse"`` / ``"better"`` by
  ``results.VERDICT_ORDER``, ``"changed"`` for a verdict either side does not know),
- every output whose SHA-256 digest changed (``{"case_id", "output", "before", "after"}``; outputs are the
  keys of ``CaseResult.digests``: ``out`` and ``taps.<name>``), and outputs present on one side only,
- cases present on one side only, and the source files whose digest changed between the two runs
  (``env.source_digest``, :mod:`flint_moe.conformance.report.digest`).

``OTHER`` is a report directory or a report.json path (:func:`load_report`). :func:`check_same_device` refuses a
baseline run on the other kind of device (a CPU run against a GPU report: other case ids and other rounding, so
nothing would be compared). :func:`baseline_markdown` renders the result for the summaries. Both reports are
only read.
"""

from __future__ import annotations

import json
from pathlib import Path

from flint_moe.conformance.judge.results import VERDICT_ORDER

__all__ = ["load_report", "check_same_device", "run_device", "compare_reports", "baseline_markdown", "MAX_LISTED"]

#: Digest changes listed in summary.md (all of them are in report.json).
MAX_LISTED = 100


def load_report(where, flag: str = "--baseline") -> tuple[dict, str]:
    """Load ``where`` (a report directory holding report.json, or a report.json path) and check its structure
    (``schema.validate_report``: the types of every field the readers of a loaded report use).

    Returns ``(report dict, path string)``. Raises FileNotFoundError (nothing there) or ValueError (not a
    conformance report: unreadable JSON, no ``"cases"`` list, or a field of the wrong type); the one-line
    message starts with ``flag`` (the CLI argument that named the report) and ``where`` and names the file and
    the field."""
    from flint_moe.conformance.report.schema import validate_report

    p = Path(where)
    if p.is_dir():
        p = p / "report.json"
    if not p.is_file():
        raise FileNotFoundError(f"{flag} {where}: no report.json there")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{flag} {where}: {p} is unreadable ({e})") from e
    except ValueError as e:
        raise ValueError(f"{flag} {where}: {p} is not valid JSON ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise ValueError(f"{flag} {where}: {p} is not a conformance report (no 'cases' list)")
    try:
        validate_report(data)
    except ValueError as e:
        raise ValueError(f"{flag} {where}: {p} is not a conformance report: {e}") from e
    return data, str(p)


def run_device(env: dict) -> str:
    """``"gpu"`` for a report env naming a GPU (``env["gpu"]`` set by a CUDA run), else ``"cpu"`` (the Triton
    interpreter)."""
    return "gpu" if (env or {}).get("gpu") else "cpu"


def check_same_device(current_env: dict, other: dict, where, flag: str = "--baseline") -> None:
    """Refuse to diff a CPU run against a GPU report, or a GPU run against a CPU report.

    ``current_env``: this run's env; ``other``: the loaded baseline report dict; ``where``: how it was named.
    A CPU run (Triton interpreter, small cpu-profile shapes, the golden model's emulations of the rounding
    instructions) and a GPU run share no case and no meaningful digest, so the diff would compare nothing.
    Raises ValueError with a one-line message starting with ``flag`` and ``where``."""
    here, there = run_device(current_env), run_device(other.get("env") or {})
    if here == there:
        return
    backend = (other.get("env") or {}).get("backend") or there
    raise ValueError(
        f"{flag} {where}: that is a {there.upper()} report ({backend}); a {here.upper()} run can only be diffed "
        f"against a {here.upper()} run (the two share no case and no rounding: nothing would be compared); pass "
        f"the report of an earlier {here.upper()} run"
    )


def _direction(before: str, after: str) -> str:
    if before in VERDICT_ORDER and after in VERDICT_ORDER:
        return "worse" if VERDICT_ORDER.index(after) > VERDICT_ORDER.index(before) else "better"
    return "changed"


def _cases(report: dict) -> dict[str, dict]:
    return {str(c.get("case_id")): c for c in report.get("cases", [])}


def compare_reports(current: dict, other: dict, other_path: str = "") -> dict:
    """Differences of report ``current`` against the baseline ``other`` (both report.json dicts).

    Returns ``{"other": other_path, "other_commit", "other_date", "other_backend", "cases_compared",
    "verdict_changes": [...], "digest_changes": [...], "outputs_only_here": [...], "outputs_only_there": [...],
    "cases_only_here": [ids], "cases_only_there": [ids], "unchanged_cases": int, "sources_changed": [paths]
    | None}`` (None: a side has no source digest). Order: the current report's case order."""
    cur, old = _cases(current), _cases(other)
    verdicts, digests, only_here, only_there = [], [], [], []
    unchanged = 0
    for cid, c in cur.items():
        o = old.get(cid)
        if o is None:
            continue
        same = True
        if c.get("verdict") != o.get("verdict"):
            same = False
            before, after = str(o.get("verdict")), str(c.get("verdict"))
            verdicts.append({"case_id": cid, "before": before, "after": after, "direction": _direction(before, after)})
        cd, od = c.get("digests") or {}, o.get("digests") or {}
        for name in sorted(cd.keys() | od.keys()):
            if name not in od:
                only_here.append({"case_id": cid, "output": name})
            elif name not in cd:
                only_there.append({"case_id": cid, "output": name})
            elif cd[name] != od[name]:
                digests.append({"case_id": cid, "output": name, "before": od[name], "after": cd[name]})
            else:
                continue
            same = False
        unchanged += same
    sources = None
    a = (current.get("env") or {}).get("source_digest")
    b = (other.get("env") or {}).get("source_digest")
    if isinstance(a, dict) and isinstance(b, dict) and isinstance(a.get("files"), dict):
        fa, fb = a["files"], b.get("files") or {}
        sources = sorted(f for f in fa.keys() | fb.keys() if fa.get(f) != fb.get(f))
    env_o = other.get("env") or {}
    return {
        "other": other_path,
        "other_commit": env_o.get("git_commit"),
        "other_date": env_o.get("date_utc"),
        "other_backend": env_o.get("backend"),
        "cases_compared": sum(cid in old for cid in cur),
        "verdict_changes": verdicts,
        "digest_changes": digests,
        "outputs_only_here": only_here,
        "outputs_only_there": only_there,
        "cases_only_here": [cid for cid in cur if cid not in old],
        "cases_only_there": [cid for cid in old if cid not in cur],
        "unchanged_cases": unchanged,
        "sources_changed": sources,
    }


def baseline_markdown(diff: dict, limit: int = MAX_LISTED) -> list[str]:
    """summary.md lines of a :func:`compare_reports` result (the digest list cut at ``limit`` entries); every
    string of ``diff`` goes through ``report.md`` (no Markdown markup from a baseline's content)."""
    from flint_moe.conformance.report.markdown import md

    who = md(diff.get("other") or "baseline", code=True)
    meta = [f"commit {md(diff.get('other_commit') or 'unknown', code=True)}"]
    if diff.get("other_date"):
        meta.append(f"run {md(diff['other_date'])}")
    lines = [f"## Changes vs baseline {who}", "", f"Baseline: {', '.join(meta)}; {md(diff['cases_compared'])} "
             f"cases compared, {md(diff['unchanged_cases'])} with identical verdicts and output digests.",
             ""]  # fmt: skip
    if diff.get("other_backend"):
        lines[-2] += f" Baseline backend: {md(diff['other_backend'])}."
    src = diff.get("sources_changed")
    if src is not None:
        changed = ", ".join(md(f) for f in src) or "none"
        lines += [f"Kernel / golden-model sources changed since the baseline: {changed}.", ""]
    vc = diff["verdict_changes"]
    lines += [f"Verdict changes: {len(vc)}" + ("." if not vc else ":"), ""]
    if vc:
        lines += ["| case | before | after | |", "|---|---|---|---|"]
        lines += [f"| {md(v['case_id'], code=True)} | {md(v['before'])} | **{md(v['after'])}** | "
                  f"{md(v['direction'])} |" for v in vc]  # fmt: skip
        lines.append("")
    dc = diff["digest_changes"]
    lines += [f"Outputs whose digest changed: {len(dc)}" + ("." if not dc else ":"), ""]
    for d in dc[:limit]:
        lines.append(f"- {md(d['case_id'], code=True)} {md(d['output'])}: {md(str(d['before'])[:12], code=True)} -> "
                     f"{md(str(d['after'])[:12], code=True)}")  # fmt: skip
    if len(dc) > limit:
        lines.append(f"- ... and {len(dc) - limit} more (report.json `baseline.digest_changes`)")
    for key, what in (("outputs_only_here", "only in this run"), ("outputs_only_there", "only in the baseline")):
        if diff[key]:
            lines.append(f"- outputs {what}: "
                         + ", ".join(f"{md(d['case_id'], code=True)} {md(d['output'])}" for d in diff[key][:20]))
    for key, what in (("cases_only_here", "only in this run"), ("cases_only_there", "only in the baseline")):
        if diff[key]:
            ids = diff[key]
            more = f" and {len(ids) - 20} more" if len(ids) > 20 else ""
            lines.append(f"- cases {what} ({len(ids)}): " + ", ".join(md(i, code=True) for i in ids[:20]) + more)
    return lines + [""]
