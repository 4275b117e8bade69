"""Conformance reports: ``write_report(results, env, out_dir)`` -> report.json and summary.md (issue 5).

report.json (schema :data:`SCHEMA`): ``{"schema", "env", "totals", "cases": [CaseResult.to_json(), ...]}``,
each case with its per-stage metrics and verdicts and the SHA-256 of every output tensor (``digests``).
summary.md (for a pull request): the backend line first (on the CPU it says bit-exactness is not claimed:
the interpreter runs the golden model's emulations of the rounding instructions), a table path x shape x M
with verdict, exact %, max ulp, worst accumulation error and failures, then the details of each failure.
Each file must stay below :data:`MAX_BYTES`; the details are truncated to fit.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .compare import ACCUMULATION_STAGES, FAIL, VERDICT_ORDER, CaseResult

__all__ = ["SCHEMA", "MAX_BYTES", "write_report", "report_dict", "summary_markdown", "backend_line"]

SCHEMA = "flint-moe-conformance/1"
#: Every report file stays under 16 MiB.
MAX_BYTES = 16 * 2**20
#: Failing cases detailed in summary.md (the rest are only in the table and report.json).
MAX_DETAILED = 50


def backend_line(env: dict) -> str:
    """One prominent line naming the backend; on a CPU backend it says bit-exactness is not claimed."""
    backend = str(env.get("backend", "unknown"))
    gpu = env.get("gpu")
    low = backend.lower()
    if gpu and "cpu" not in low and "interpret" not in low:
        named = backend if str(gpu) in backend else f"{backend} ({gpu})"
        return (
            f"**Backend: {named}.** Bit-exactness of the rounding instructions is measured on "
            "this GPU."
        )
    return (
        f"**Backend: {backend}.** CPU run (Triton interpreter): the rounding instructions run the golden "
        "model's emulations, so bit-exactness is not claimed; run the `gpu` profile on the H200 for that."
    )


def report_dict(results: list[CaseResult], env: dict) -> dict:
    """The report.json content (JSON-ready)."""
    totals = Counter(r.verdict for r in results)
    return {
        "schema": SCHEMA,
        "env": dict(env),
        "totals": {v: int(totals.get(v, 0)) for v in VERDICT_ORDER} | {"cases": len(results)},
        "cases": [r.to_json() for r in results],
    }


def _fmt(v, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def _row(r: CaseResult) -> str:
    n = sum(s.elements for s in r.stages)
    ex = sum(s.exact for s in r.stages)
    pct = f"{100.0 * ex / n:.2f}" if n else "-"
    bits = [s.max_ulp for s in r.stages if s.kind == "bits" and s.max_ulp is not None]
    accs = [s for s in r.stages if s.stage in ACCUMULATION_STAGES and s.max_bound_fraction is not None]
    worst = max(accs, key=lambda s: s.max_bound_fraction, default=None)
    acc = "-" if worst is None else f"{_fmt(worst.max_err_ulps)} ulp ({_fmt(worst.max_bound_fraction)} bound)"
    failures = ", ".join(f"{s.stage}:{s.mismatches}" for s in r.stages if s.verdict == FAIL) or "-"
    shape = r.meta.get("shape", "-")
    m = r.meta.get("M", "-")
    return (
        f"| {r.path} | {shape} | {m} | `{r.case_id}` | **{r.verdict}** | {pct} "
        f"| {_fmt(max(bits, default=None))} | {acc} | {r.warnings} | {failures} | {_inv_cell(r)} |"
    )


def _inv_cell(r: CaseResult) -> str:
    if not r.invariance:
        return "-"
    short = {"PASS": "ok", "FAIL": "FAIL", "SKIP": "skip", "MEASURED": "meas"}
    return " ".join(f"{i.name.split('_')[0]}:{short.get(i.outcome, i.outcome)}" for i in r.invariance)


def _invariance_section(results: list[CaseResult]) -> list[str]:
    rows = [r for r in results if r.invariance]
    if not rows:
        return []
    lines = ["## Invariances", "",
             "determinism, row independence and CUDA-graph replay are required (a FAIL fails the case); batch "
             "invariance (each token alone vs in the batch) is measured.", ""]  # fmt: skip
    fails = [(r, i) for r in rows for i in r.invariance if i.outcome == "FAIL"]
    lines += [f"- `{r.case_id}` **{i.name} FAIL**: {i.note}" for r, i in fails] or ["No required invariance failed."]
    batch = [(r, i) for r in rows for i in r.invariance if i.name == "batch_invariance" and i.outcome == "MEASURED"]
    if batch:
        eq = sum(i.details.get("rows_equal", 0) for _, i in batch)
        tot = sum(i.details.get("rows", 0) for _, i in batch)
        lines += ["", f"Batch invariance: {eq} of {tot} token rows bitwise equal alone vs in the batch "
                  f"({len(batch)} cases)."]  # fmt: skip
        lines += [f"- `{r.case_id}`: {i.note}" for r, i in batch if i.details.get("rows_differing")]
    skips = sorted({f"{i.name}: {i.note}" for r in rows for i in r.invariance if i.outcome == "SKIP"
                    and i.name == "cuda_graph"})  # fmt: skip
    lines += [f"- skipped {s}" for s in skips]
    return lines + [""]


def _warn_text(worst: list[dict]) -> str:
    return "; ".join(f"{w['index']}: {w['err_ulps']:.3g} ulp, {w['ratio']:.3g}x estimate" for w in worst)


def _details(r: CaseResult) -> list[str]:
    lines = [f"### `{r.case_id}`: {r.verdict}", ""]
    for d in r.diagnosis:
        lines.append(f"- **diagnosis**: {d}")
    for i in r.invariance:
        if i.outcome == "FAIL":
            lines.append(f"- **invariance {i.name}** FAIL: {i.note}")
    for s in r.stages:
        if s.verdict != FAIL and not s.warnings:
            continue
        lines.append(
            f"- **{s.stage}** {s.verdict}: {s.mismatches} of {s.elements} elements; "
            f"max ulp {_fmt(s.max_ulp)}; first failing {s.first_failures}"
            + (f"; note: {s.note}" if s.note else "")
        )
        if s.kind == "accumulation" and s.max_bound_fraction is not None:
            lines.append(
                f"  - model {s.model}: max |kernel-exact| {_fmt(s.max_err_ulps)} ulp = "
                f"{_fmt(s.max_bound_fraction)} x bound; WARNING elements {s.warnings}"
                + (f", worst {_warn_text(s.worst_warnings)}" if s.worst_warnings else "")
            )
    return lines + [""]


def _run_line(env: dict) -> str:
    """Date, coverage, commit and command of the run (what a reviewer needs to reproduce it)."""
    parts = []
    if env.get("date_utc"):
        parts.append(f"run {env['date_utc']}")
    if env.get("cases_run"):
        parts.append(f"cases {env['cases_run']} of profile `{env.get('profile', '?')}`")
    parts.append(f"commit `{env.get('git_commit') or 'unknown'}`")
    if env.get("command"):
        parts.append(f"command `{env['command']}`")
    return "Run: " + "; ".join(parts) + "."


def summary_markdown(results: list[CaseResult], env: dict) -> str:
    """The summary.md text."""
    totals = Counter(r.verdict for r in results)
    lines = [
        "# flint-moe conformance",
        "",
        backend_line(env),
        "",
        _run_line(env),
        "",
        "Totals: "
        + ", ".join(f"{v} {totals.get(v, 0)}" for v in VERDICT_ORDER)
        + f" (of {len(results)} cases)",
        "",
        "| path | shape | M | case | verdict | exact % | max ulp | worst accumulation | warnings "
        "| failures | invariances |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_row(r) for r in results]
    lines += [
        "",
        "exact %: elements bitwise equal to the golden value over all stages (accumulations: to RN32 of the "
        "exact sum); max ulp: order-free stages; worst accumulation: max |kernel - exact| in fp32 ulps "
        "and as a fraction of the certified bound; failures: stage:count.",
        "",
    ]
    lines += _invariance_section(results)
    failing = [r for r in results if r.verdict == FAIL or r.warnings]
    lines += ["## Failures", ""]
    if not failing:
        lines += ["None.", ""]
    for r in failing[:MAX_DETAILED]:
        lines += _details(r)
    if len(failing) > MAX_DETAILED:
        lines += [f"... and {len(failing) - MAX_DETAILED} more (see report.json).", ""]
    env_lines = [f"- {k}: {v}" for k, v in env.items()]
    return "\n".join(lines + ["## Environment", ""] + env_lines) + "\n"


def write_report(results: list[CaseResult], env: dict, out_dir) -> dict[str, Path]:
    """Write report.json and summary.md into ``out_dir`` (created if needed).

    Returns ``{"json": Path, "summary": Path}``. Raises ValueError if a file would reach 16 MiB (report.json:
    the caller should split the run; summary.md is truncated automatically first).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = json.dumps(report_dict(results, env), indent=1, allow_nan=False)
    if len(data.encode()) >= MAX_BYTES:
        raise ValueError(
            f"report.json would be {len(data.encode())} bytes (limit {MAX_BYTES}); split the run"
        )
    md = summary_markdown(results, env)
    if len(md.encode()) >= MAX_BYTES:
        md = md.encode()[: MAX_BYTES - 200].decode(errors="ignore") + "\n\n(truncated: see report.json)\n"
    paths = {"json": out / "report.json", "summary": out / "summary.md"}
    paths["json"].write_text(data)
    paths["summary"].write_text(md)
    return paths
