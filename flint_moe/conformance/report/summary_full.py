"""summary-full.md: every table and detail of a conformance run (the short summary.md is
:func:`flint_moe.conformance.report.summary.summary_markdown`'s).

The same header as summary.md, then a table path x shape x M with verdict, exact %, max ulp, worst accumulation
(its stage and its error led by the fraction of the certified bound, :func:`summary.bound_text`), end to end,
warnings, failures and invariances; the details of each failure (first coordinates, diagnosis), the EXPLAINED
differences, the invariance and batch-invariance findings, the mutation results, the changes vs a baseline
(:func:`flint_moe.conformance.report.baseline.baseline_markdown`) and the environment. Inputs as in
:mod:`flint_moe.conformance.report.summary`; every string goes through
:func:`flint_moe.conformance.report.markdown.md`.
"""

from __future__ import annotations

import re
from collections import Counter

from flint_moe.conformance.judge.results import FAIL
from flint_moe.conformance.report.baseline import baseline_markdown
from flint_moe.conformance.report.markdown import md
from flint_moe.conformance.report.summary import (
    BLACK_BOX,
    EXPLAINED,
    _e2e,
    _fmt,
    _group_cells,
    _group_key,
    _header,
    _mode,
    _num,
    _warnings,
    bound_text,
    case_dicts,
    mutation_line,
)

__all__ = ["full_summary_markdown", "MAX_DETAILED"]

#: At most this many failing cases and EXPLAINED cases are detailed (the rest: report.json).
MAX_DETAILED = 50


def _group_row(key: tuple[str, str, str], group: list[dict]) -> str:
    """One table row for the cases of one path x shape x M (all data profiles and seeds)."""
    return "| " + " | ".join(_group_cells(key, group)) + " |"


def _table(cases: list[dict]) -> list[str]:
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for c in cases:
        groups.setdefault(_group_key(c), []).append(c)
    lines = [
        "| path | shape | M | cases | verdict | exact % | max ulp | worst accumulation | end to end | warnings "
        "| failures | invariances |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    return lines + [_group_row(k, g) for k, g in groups.items()]


def _invariance_section(cases: list[dict]) -> list[str]:
    rows = [c for c in cases if c.get("invariance")]
    if not rows:
        return []
    lines = ["## Invariances", "",
             "the production build (no taps) equal to the tapped build, determinism, row independence and "
             "CUDA-graph replay are required (a FAIL fails the case); batch "
             "invariance (each token alone vs in the batch) is measured.", ""]  # fmt: skip
    fails = [(c, i) for c in rows for i in c["invariance"] if i.get("outcome") == "FAIL"]
    lines += [
        f"- {md(c['case_id'], code=True)} **{md(i['name'])} FAIL**: {md(i.get('note', ''))}" for c, i in fails
    ] or ["No required invariance failed."]
    batch = [
        (c, i)
        for c in rows
        for i in c["invariance"]
        if i["name"] == "batch_invariance" and i.get("outcome") == "MEASURED"
    ]
    if batch:
        eq = sum(int((i.get("details") or {}).get("rows_equal", 0)) for _, i in batch)
        tot = sum(int((i.get("details") or {}).get("rows", 0)) for _, i in batch)
        lines += ["", f"Batch invariance: {eq} of {tot} token rows bitwise equal alone vs in the batch "
                  f"({len(batch)} cases)."]  # fmt: skip
        lines += [
            f"- {md(c['case_id'], code=True)}: {md(i.get('note', ''))}"
            for c, i in batch
            if (i.get("details") or {}).get("rows_differing")
        ]
    skips = sorted({f"{md(i['name'])}: {md(i.get('note', ''))}" for c in rows for i in c["invariance"]
                    if i.get("outcome") == "SKIP" and i["name"] == "cuda_graph"})  # fmt: skip
    lines += [f"- skipped {s}" for s in skips]
    return lines + [""]


_COORDS = re.compile(r"[\[\]0-9, -]*")


def _coords(v) -> str:
    """Markdown of a coordinate list (``[[0, 1], [2, 3]]``: digits, brackets and commas only, as is; anything
    else through :func:`md`)."""
    text = str(v)
    return text if _COORDS.fullmatch(text) else md(text)


def _warn_text(worst: list[dict]) -> str:
    return "; ".join(
        f"{_coords(w['index'])}: {_fmt(_num(w['err_ulps']))} ulp, {_fmt(_num(w['ratio']))}x estimate" for w in worst
    )


def _e2e_lines(e: dict) -> list[str]:
    out = [
        f"- **end to end** ({md(e.get('mode', 'taps'))}) {md(e.get('verdict'))}: {int(e.get('differing') or 0)} of "
        f"{int(e.get('elements') or 0)} output elements differ from the golden model run on its own, "
        f"{int(e.get('explained') or 0)} explained, {int(e.get('unexplained') or 0)} unexplained; "
        f"max ulp {_fmt(_num(e.get('max_ulp')))}"
        + (f"; NaN position mismatches {md(e['nan_mismatches'])}" if e.get("nan_mismatches") else "")
        + (f"; signed-zero mismatches {md(e['signed_zero_mismatches'])}" if e.get("signed_zero_mismatches") else "")
    ]
    if e.get("causes"):
        out.append("  - explained by: " + ", ".join(f"{md(k)} {md(v)}" for k, v in e["causes"].items()))
    if e.get("first_failures"):
        out.append(f"  - first unexplained: {_coords(e['first_failures'])}")
    elif e.get("first_differences"):
        out.append(f"  - first differing: {_coords(e['first_differences'])}")
    for d in (e.get("failure_details") or [])[:5]:
        lo_hi = ""
        if d.get("lo") is not None or d.get("hi") is not None:
            lo_hi = f", interval [{_fmt(_num(d.get('lo')))}, {_fmt(_num(d.get('hi')))}]"
        out.append(
            f"  - {_coords(d.get('index'))}: kernel {_fmt(_num(d.get('kernel')), '.6g')}, golden "
            f"{_fmt(_num(d.get('golden')), '.6g')}{lo_hi}: {md(d.get('why', ''))}"
        )
    if e.get("note"):
        out.append(f"  - note: {md(e['note'])}")
    return out


def _details(c: dict) -> list[str]:
    label = f" ({BLACK_BOX})" if _mode(c) == BLACK_BOX else ""
    lines = [f"### {md(c['case_id'], code=True)}{label}: {md(c['verdict'])}", ""]
    for d in c.get("diagnosis") or []:
        lines.append(f"- **diagnosis**: {md(d)}")
    stage_failed = any(s.get("verdict") == FAIL and s.get("stage") != "run" for s in c.get("stages", []))
    if stage_failed and not c.get("diagnosis") and _mode(c) != BLACK_BOX:
        lines.append("- **diagnosis**: no catalogued fault reproduces the kernel's output")
    for i in c.get("invariance") or []:
        if i.get("outcome") == "FAIL":
            lines.append(f"- **invariance {md(i['name'])}** FAIL: {md(i.get('note', ''))}")
    for s in c.get("stages", []):
        if s.get("verdict") != FAIL and not s.get("warnings"):
            continue
        lines.append(
            f"- **{md(s['stage'])}** {md(s['verdict'])}: {md(s.get('mismatches', 0))} of {md(s.get('elements', 0))} "
            f"elements; max ulp {_fmt(_num(s.get('max_ulp')))}; first failing {_coords(s.get('first_failures', []))}"
            + (f"; note: {md(s['note'])}" if s.get("note") else "")
        )
        if s.get("kind") == "accumulation" and _num(s.get("max_bound_fraction")) is not None:
            lines.append(
                f"  - model {md(s.get('model'))}: max |kernel-exact| at {md(bound_text(s))}; WARNING elements "
                f"{md(s.get('warnings', 0))}"
                + (f", worst {_warn_text(s['worst_warnings'])}" if s.get("worst_warnings") else "")
            )
    e = _e2e(c)
    if e is not None and (e.get("verdict") != "EXACT" or c.get("verdict") == FAIL):
        lines += _e2e_lines(e)
    return lines + [""]


def _explained_section(cases: list[dict]) -> list[str]:
    ex = [c for c in cases if c.get("verdict") == EXPLAINED]
    if not ex:
        return []
    causes = Counter()
    for c in ex:
        causes.update((_e2e(c) or {}).get("causes") or {})
    lines = ["## Explained differences", "",
             f"{len(ex)} case(s) differ from the golden model run on its own only where an upstream accumulation "
             "(or a tie within bounds) explains it" + (": " + ", ".join(f"{md(k)} {v}" for k, v in causes.most_common())
                                                       if causes else "") + ".", ""]  # fmt: skip
    for c in ex[:MAX_DETAILED]:
        e = _e2e(c) or {}
        lines.append(
            f"- {md(c['case_id'], code=True)}: {int(e.get('differing') or 0)} of {int(e.get('elements') or 0)} "
            f"elements, max ulp {_fmt(_num(e.get('max_ulp')))}"
            + (", " + ", ".join(f"{md(k)} {md(v)}" for k, v in e["causes"].items()) if e.get("causes") else "")
            + (f"; first {_coords(e['first_differences'][:3])}" if e.get("first_differences") else "")
        )
    if len(ex) > MAX_DETAILED:
        lines.append(f"- ... and {len(ex) - MAX_DETAILED} more (report.json)")
    return lines + [""]


def _mutation_section(mutation: dict | None) -> list[str]:
    if not mutation:
        return []
    lines = ["## Mutation testing", "", md(mutation_line(mutation)), ""]
    res = mutation.get("results") or []
    if res:
        lines += [
            "| fault | injection | case | killed | named | verdict | diagnosis |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in res:
            diag = "; ".join(md(d.split(":")[0]) for d in r.get("diagnosis") or []) or "-"
            lines.append(
                f"| {md(r.get('fault'))} | {md(r.get('injection', '-'))} | {md(r.get('case_id', '-'), code=True)} "
                f"| {'yes' if r.get('killed') else '**no**'} | {'yes' if r.get('named') else '**no**'} "
                f"| {md(r.get('verdict', '-'))} | {diag} |"
            )
    return lines + [""]


def _env_lines(env: dict) -> list[str]:
    out = []
    for k, v in env.items():
        if k == "source_digest" and isinstance(v, dict):
            files, dirs = list(v.get("files") or {}), list(v.get("dirs") or [])
            alone = [f for f in files if not any(f.startswith(d.rstrip("/") + "/") for d in dirs)]
            n = f"{len(files)} file{'s' if len(files) != 1 else ''}"
            v = (f"{v.get('digest')} ({v.get('algorithm')}, {n}: under {', '.join(dirs)}"
                 + (f", and {', '.join(alone)}" if alone else "") + ")")  # fmt: skip
        out.append(f"- {md(k)}: {md(v)}")
    return out


def full_summary_markdown(results, env: dict, *, mutation=None, baseline=None, gpu_report=None) -> str:
    """The summary-full.md text: every table and detail (arguments as :func:`summary_markdown`)."""
    cases = case_dicts(results)
    lines = _header(cases, env, gpu_report, "# flint-moe conformance: full tables")
    phases: dict[str, float] = {}
    for c in cases:
        for k, v in ((c.get("meta") or {}).get("phase_seconds") or {}).items():
            phases[k] = phases.get(k, 0.0) + float(v)
    if env.get("run_seconds") is not None:
        jobs = env.get("jobs") or 1
        what = "cases and mutation self-test" if mutation else "cases"
        line = (f"Wall time: {md(env['run_seconds'])} s ({what}; {md(jobs)} worker process"
                f"{'es' if jobs != 1 else ''} on the device)")  # fmt: skip
        rr = env.get("rerun")
        if isinstance(rr, dict):
            pj = rr.get("previous_jobs") or 1
            again = rr.get("rerun_cases") or []
            line = (f"Wall time: {md(rr.get('previous_run_seconds'))} s for the run of {md(rr.get('previous_run'))} "
                    f"({md(pj)} worker process{'es' if pj != 1 else ''}), then {md(env['run_seconds'])} s to rerun "
                    f"its {len(again)} FAIL cases ({md(jobs)} worker process{'es' if jobs != 1 else ''}): "
                    + ", ".join(md(c, code=True) for c in again))  # fmt: skip
        lines += ["", line]
    if phases:
        by = ", ".join(f"{md(k)} {v:.1f}" for k, v in phases.items())
        lines += ["", f"Time by phase (s, summed over cases): {by}"]
    ml = mutation_line(mutation)
    lines += ["", md(ml), ""] if ml else [""]
    lines += _table(cases)
    lines += [
        "",
        "One row per path x shape x M over its cases (data profiles x seeds; each case is in report.json and "
        "report.html). verdict: the worst, with the counts when they differ; exact %: elements bitwise equal to "
        "the golden value over all stages (accumulations: to the replay of the declared order where the stage "
        "replays one, on every row of a case that replays all rows; else to RN32 of the exact sum); max ulp: "
        "order-free stages and the end-to-end output; worst accumulation: the largest max |kernel - exact| as a "
        "fraction of the certified bound (with its fp32 ulps); end to end: the returned output vs the golden model "
        "run on its own (differing / unexplained elements); failures: failing case (profile/seed) with stage:count.",
        "",
    ]
    failing = [c for c in cases if c["verdict"] == FAIL or _warnings(c)]
    lines += ["## Failures", ""]
    if not failing:
        lines += ["None.", ""]
    for c in failing[:MAX_DETAILED]:
        lines += _details(c)
    if len(failing) > MAX_DETAILED:
        lines += [f"... and {len(failing) - MAX_DETAILED} more (see report.json).", ""]
    lines += _explained_section(cases)
    lines += _invariance_section(cases)
    lines += _mutation_section(mutation)
    if baseline is not None:
        lines += baseline_markdown(baseline)
    return "\n".join(lines + ["## Environment", ""] + _env_lines(env)) + "\n"
