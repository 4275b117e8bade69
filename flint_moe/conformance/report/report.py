"""Conformance reports: ``write_report(results, env, out_dir, ...)`` -> report.json, summary.md, summary-full.md,
report.html (:data:`REPORT_FILES`).

report.json (schema :data:`SCHEMA`): ``{"schema", "env", "totals", "cases": [CaseResult.to_json(), ...]}``,
each case with its per-stage metrics and verdicts and the SHA-256 of every output tensor (``digests``); the
env carries the git commit and ``source_digest`` (:mod:`flint_moe.conformance.report.digest`); optional top-level
keys ``"mutation"`` (``mutation.mutation_report``), ``"baseline"`` (``baseline.compare_reports``) and
``"gpu_report"`` (freshness of the committed GPU report, ``digest.Freshness.to_json``).

summary.md (the short pull-request summary) and summary-full.md (every table):
:mod:`flint_moe.conformance.report.summary`. report.html: :mod:`flint_moe.conformance.report.html`. Each file
must stay below :data:`MAX_BYTES`; summary-full.md details are truncated to fit.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from flint_moe.conformance.judge.results import NOT_JUDGED, VERDICT_ORDER
from flint_moe.conformance.report.summary import FULL_SUMMARY_FILE, SUMMARY_FILE, case_dicts, summary_markdown
from flint_moe.conformance.report.summary_full import full_summary_markdown

__all__ = ["SCHEMA", "MAX_BYTES", "REPORT_FILES", "write_report", "report_dict"]

SCHEMA = "flint-moe-conformance/1"
#: Every report file stays under 16 MiB.
MAX_BYTES = 16 * 2**20
#: The files :func:`write_report` writes (report.html only with ``html=True``).
REPORT_FILES = ("report.json", SUMMARY_FILE, FULL_SUMMARY_FILE, "report.html")


def report_dict(results, env: dict, *, mutation=None, baseline=None, gpu_report=None) -> dict:
    """The report.json content (JSON-ready). ``mutation``, ``baseline``, ``gpu_report``: optional dicts put
    under those top-level keys (absent when None)."""
    cases = case_dicts(results)
    totals = Counter(c["verdict"] for c in cases)
    out = {
        "schema": SCHEMA,
        "env": dict(env),
        # NOT-JUDGED (out of device memory on every attempt) only when a case is
        "totals": {v: int(totals.get(v, 0)) for v in VERDICT_ORDER}
        | ({NOT_JUDGED: int(totals[NOT_JUDGED])} if totals.get(NOT_JUDGED) else {})
        | {"cases": len(cases)},
        "cases": cases,
    }
    for key, val in (("mutation", mutation), ("baseline", baseline), ("gpu_report", gpu_report)):
        if val is not None:
            out[key] = val
    return out


def _strip_maps(rep: dict) -> None:
    for c in rep["cases"]:
        for s in [*c.get("stages", []), *([c["end_to_end"]] if isinstance(c.get("end_to_end"), dict) else [])]:
            for key in ("map", "unexplained_map", "ulp_hist"):
                if s.get(key) is not None:
                    s[key] = None


def _fit_json(rep: dict) -> str:
    """report.json text under MAX_BYTES: indented; else compact; else compact without the mismatch maps and
    ulp histograms (``rep["trimmed"]`` says so; ``rep`` is modified). Raises ValueError if even that is too
    big (split the run with --filter)."""
    data = json.dumps(rep, indent=1, allow_nan=False)
    if len(data.encode()) < MAX_BYTES:
        return data
    data = json.dumps(rep, separators=(",", ":"), allow_nan=False)
    if len(data.encode()) < MAX_BYTES:
        return data
    _strip_maps(rep)
    rep["trimmed"] = "mismatch maps and ulp histograms dropped to keep report.json under 16 MiB"
    data = json.dumps(rep, separators=(",", ":"), allow_nan=False)
    if len(data.encode()) >= MAX_BYTES:
        raise ValueError(
            f"report.json would be {len(data.encode())} bytes even without maps (limit {MAX_BYTES}); split the run"
        )
    return data


def write_report(
    results, env: dict, out_dir, *, mutation=None, baseline=None, gpu_report=None, html: bool = True
) -> dict[str, Path]:
    """Write report.json, summary.md (short), summary-full.md and (``html``) report.html into ``out_dir``
    (created if needed).

    Returns ``{"json": Path, "summary": Path, "summary_full": Path, "html": Path}``. report.json is written
    compact, then without the mismatch maps and ulp histograms, when it would otherwise reach 16 MiB; ValueError
    if still too big (the caller should split the run); summary-full.md is truncated and report.html drops
    figures to fit.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rep = report_dict(results, env, mutation=mutation, baseline=baseline, gpu_report=gpu_report)
    data = _fit_json(rep)
    kw = dict(mutation=mutation, baseline=baseline, gpu_report=gpu_report)
    short = summary_markdown(rep["cases"], env, **kw)
    full = full_summary_markdown(rep["cases"], env, **kw)
    if len(full.encode()) >= MAX_BYTES:
        full = full.encode()[: MAX_BYTES - 200].decode(errors="ignore") + "\n\n(truncated: see report.json)\n"
    paths = {"json": out / "report.json", "summary": out / SUMMARY_FILE, "summary_full": out / FULL_SUMMARY_FILE}
    paths["json"].write_text(data)
    paths["summary"].write_text(short)
    paths["summary_full"].write_text(full)
    if html:
        from flint_moe.conformance.report.html import write_html

        paths["html"] = write_html(rep, out / "report.html", max_bytes=MAX_BYTES)
    return paths
