"""summary.md (for a pull request) and the cells the console table and report.html share with it.

summary.md: the backend line first (on the CPU it says bit-exactness is not claimed: the interpreter runs the
golden model's emulations of the rounding instructions), the run line, the GPU-report freshness line, totals
and the mutation kill rate, a table path x shape x M with verdict, exact %, max ulp, worst accumulation error
and failures, then the details of each failure (first coordinates, diagnosis), the EXPLAINED differences, the
invariance and batch-invariance findings, the mutation results and the changes vs a baseline
(:func:`flint_moe.conformance.report.baseline.baseline_markdown`).

Every function here takes CaseResult objects or their ``to_json()`` dicts (e.g. a loaded report.json), and
reads the optional keys (``mode``, ``end_to_end``, ``warnings``, stage ``map``) with defaults. Every string
reaches the Markdown through :func:`flint_moe.conformance.report.markdown.md`.
"""

from __future__ import annotations

import re
from collections import Counter

from flint_moe.conformance.judge.results import ACCUMULATION_STAGES, FAIL, VERDICT_ORDER
from flint_moe.conformance.report.baseline import baseline_markdown
from flint_moe.conformance.report.markdown import md

__all__ = [
    "summary_markdown",
    "backend_line",
    "case_dicts",
    "exact_percent",
    "freshness_line",
    "mutation_line",
]

MAX_DETAILED = 50
EXPLAINED = "EXPLAINED"
BLACK_BOX = "black-box"


def backend_line(env: dict, *, markdown: bool = True) -> str:
    """One prominent line naming the backend; on a CPU backend it says bit-exactness is not claimed.
    ``markdown``: the summary.md form (bold, escaped by :func:`md`), else plain text."""
    backend = str(env.get("backend", "unknown"))
    gpu = env.get("gpu")
    low = backend.lower()
    if gpu and "cpu" not in low and "interpret" not in low:
        named = backend if str(gpu) in backend else f"{backend} ({gpu})"
        rest = "Bit-exactness of the rounding instructions is measured on this GPU."
    else:
        named = backend
        rest = ("CPU run (Triton interpreter): the rounding instructions run the golden model's emulations, so "
                "bit-exactness is not claimed; run the {gpu} profile on the H200 for that.")  # fmt: skip
    if not markdown:
        return f"Backend: {named}. " + rest.format(gpu="gpu")
    return f"**Backend: {md(named)}.** " + rest.format(gpu="`gpu`")


def case_dicts(results) -> list[dict]:
    """``results`` (CaseResult objects or their to_json() dicts) as JSON dicts, in order."""
    return [r if isinstance(r, dict) else r.to_json() for r in results]


def _warnings(c: dict) -> int:
    w = c.get("warnings")
    return int(w) if isinstance(w, (int, float)) else sum(int(s.get("warnings") or 0) for s in c.get("stages", []))


def _mode(c: dict) -> str:
    return str(c.get("mode") or "taps")


def _e2e(c: dict) -> dict | None:
    e = c.get("end_to_end")
    return e if isinstance(e, dict) else None


def _num(v):
    """A JSON metric as float (the strings "inf"/"nan" of results._json_safe), None stays None."""
    if v is None:
        return None
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return float(v)


def _fmt(v, spec: str = ".3g") -> str:
    v = _num(v) if isinstance(v, str) else v
    if v is None:
        return "-"
    return format(v, spec) if isinstance(v, float) else str(v)


def exact_percent(c: dict) -> float | None:
    """Elements bitwise equal to the golden value over all stages, in percent (black-box cases: over the
    end-to-end output); None when nothing was compared."""
    stages = c.get("stages", [])
    n = sum(int(s.get("elements") or 0) for s in stages)
    ex = sum(int(s.get("exact") or 0) for s in stages)
    e = _e2e(c)
    if not stages and e and e.get("elements"):
        n, ex = int(e["elements"]), int(e["elements"]) - int(e.get("differing") or 0)
    return 100.0 * ex / n if n else None


def _max_ulp(c: dict):
    bits = [_num(s.get("max_ulp")) for s in c.get("stages", []) if s.get("kind") == "bits"]
    bits = [b for b in bits if b is not None]
    e = _e2e(c)
    if e is not None and _num(e.get("max_ulp")) is not None:
        bits.append(_num(e.get("max_ulp")))
    return max(bits, default=None)


def _worst_acc(c: dict) -> str:
    accs = [
        s
        for s in c.get("stages", [])
        if s.get("stage") in ACCUMULATION_STAGES and _num(s.get("max_bound_fraction")) is not None
    ]
    worst = max(accs, key=lambda s: _num(s["max_bound_fraction"]), default=None)
    if worst is None:
        return "-"
    return f"{_fmt(_num(worst.get('max_err_ulps')))} ulp ({_fmt(_num(worst['max_bound_fraction']))} bound)"


def _e2e_cell(c: dict) -> str:
    e = _e2e(c)
    if e is None:
        return "-"
    v = e.get("verdict", "?")
    diff = int(e.get("differing") or 0)
    if not diff:
        return str(v)
    return f"{v} {diff} diff, {int(e.get('unexplained') or 0)} unexpl."


def _case_failures(c: dict) -> str:
    """Markdown: the failing stages with their counts, end to end, and the failed invariances."""
    out = [f"{md(s['stage'])}:{md(s.get('mismatches', 0))}" for s in c.get("stages", []) if s.get("verdict") == FAIL]
    e = _e2e(c)
    if e is not None and e.get("verdict") == FAIL:
        out.append(f"end-to-end:{int(e.get('unexplained') or 0)}")
    out += [md(i["name"]) for i in c.get("invariance") or [] if i.get("outcome") == "FAIL"]
    return ", ".join(out)


def _group_key(c: dict) -> tuple[str, str, str]:
    meta = c.get("meta", {})
    label = f" ({BLACK_BOX})" if _mode(c) == BLACK_BOX else ""
    return f"{md(c.get('path', '-'))}{label}", md(meta.get("shape", "-")), md(meta.get("M", "-"))


def _case_tail(c: dict) -> str:
    """The case id after path/shape/M (data profile and seed), or the whole id when it has another form."""
    parts = str(c["case_id"]).split("/")
    return "/".join(parts[3:]) if len(parts) > 3 else str(c["case_id"])


_INV_RANK = {"SKIP": 0, "PASS": 1, "MEASURED": 2, "FAIL": 3}
_INV_SHORT = {"PASS": "ok", "FAIL": "FAIL", "SKIP": "skip", "MEASURED": "meas"}


def _inv_cell(group: list[dict]) -> str:
    """Worst outcome per invariance over the group's cases (FAIL with its count)."""
    worst: dict[str, str] = {}
    fails: Counter = Counter()
    for c in group:
        for i in c.get("invariance") or []:
            name, o = i["name"], i.get("outcome", "?")
            if _INV_RANK.get(o, 3) >= _INV_RANK.get(worst.get(name, "SKIP"), 0):
                worst[name] = o
            fails[name] += o == "FAIL"
    if not worst:
        return "-"
    return " ".join(
        f"{md(n.split('_')[0])}:{md(_INV_SHORT.get(o, o))}" + (f"({fails[n]})" if o == "FAIL" else "")
        for n, o in worst.items()
    )


def _group_row(key: tuple[str, str, str], group: list[dict]) -> str:
    """One table row for the cases of one path x shape x M (all data profiles and seeds)."""
    verdicts = Counter(c["verdict"] for c in group)
    known = [v for v in VERDICT_ORDER if v in verdicts]
    worst = known[-1] if known else sorted(verdicts)[-1]
    unknown = [v for v in verdicts if v not in VERDICT_ORDER]
    if unknown:
        worst = sorted(unknown)[0]
    verdict = f"**{md(worst)}**"
    if len(verdicts) > 1:
        verdict += " (" + ", ".join(f"{verdicts[v]} {md(v)}" for v in [*VERDICT_ORDER, *unknown] if v in verdicts) + ")"
    n = ex = 0
    for c in group:
        pct = exact_percent(c)
        stages = c.get("stages", [])
        if stages:
            n += sum(int(s.get("elements") or 0) for s in stages)
            ex += sum(int(s.get("exact") or 0) for s in stages)
        elif pct is not None:
            e = _e2e(c) or {}
            n += int(e.get("elements") or 0)
            ex += int(e.get("elements") or 0) - int(e.get("differing") or 0)
    ulps = [u for u in (_max_ulp(c) for c in group) if u is not None]
    accs = [
        (s, c)
        for c in group
        for s in c.get("stages", [])
        if s.get("stage") in ACCUMULATION_STAGES and _num(s.get("max_bound_fraction")) is not None
    ]
    acc = "-"
    if accs:
        s, _ = max(accs, key=lambda sc: _num(sc[0]["max_bound_fraction"]))
        acc = f"{md(s['stage'])} {_fmt(_num(s.get('max_err_ulps')))} ulp ({_fmt(_num(s['max_bound_fraction']))} bound)"
    e2e = [e for e in (_e2e(c) for c in group) if e is not None]
    e2e_cell = "-"
    if e2e:
        ev = Counter(str(e.get("verdict")) for e in e2e)
        ew = [v for v in VERDICT_ORDER if v in ev]
        e2e_cell = ew[-1] if ew else ", ".join(md(v) for v in ev)
        diff = sum(int(e.get("differing") or 0) for e in e2e)
        if diff:
            e2e_cell += f" {diff} diff, {sum(int(e.get('unexplained') or 0) for e in e2e)} unexpl."
    failing = [f"{md(_case_tail(c), code=True)} {_case_failures(c)}" for c in group if c["verdict"] == FAIL]
    fail_cell = ", ".join(failing[:4]) + (f" and {len(failing) - 4} more" if len(failing) > 4 else "")
    return (
        f"| {key[0]} | {key[1]} | {key[2]} | {len(group)} | {verdict} | {f'{100.0 * ex / n:.2f}' if n else '-'} "
        f"| {_fmt(max(ulps, default=None))} | {acc} | {e2e_cell} | {sum(_warnings(c) for c in group)} "
        f"| {fail_cell or '-'} | {_inv_cell(group)} |"
    )


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
                f"  - model {md(s.get('model'))}: max |kernel-exact| {_fmt(_num(s.get('max_err_ulps')))} ulp = "
                f"{_fmt(_num(s.get('max_bound_fraction')))} x bound; WARNING elements {md(s.get('warnings', 0))}"
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


def mutation_line(mutation: dict | None) -> str | None:
    """One line with the mutation kill rate, plain text (None when the run did not measure it)."""
    if not mutation:
        return None
    total = int(mutation.get("total") or 0)
    killed = int(mutation.get("killed") or 0)
    named = mutation.get("named")
    rate = _num(mutation.get("kill_rate"))
    missed = [r.get("fault") for r in mutation.get("results") or [] if not (r.get("killed") and r.get("named", True))]
    text = f"Mutation kill rate: {_fmt(rate * 100 if rate is not None else None, '.1f')}% ({killed} of {total} "
    text += "catalogued faults failed the case" + (
        f", {int(named)} named by the diagnosis" if named is not None else ""
    )
    text += ")"
    text += f"; missed: {', '.join(str(m) for m in missed)}." if missed else "; every catalogued fault caught."
    untested = mutation.get("untested") or []
    text += f" Catalogued faults without a mutation: {', '.join(map(str, untested))}." if untested else ""
    sb = mutation.get("sub_bound")
    if isinstance(sb, dict) and sb.get("total"):
        r, b = _num(sb.get("replay_kill_rate")), _num(sb.get("bound_kill_rate"))
        text += (
            f" Sub-bound faults ({int(sb['total'])} mutants, {int(sb.get('within_bound') or 0)} inside the"
            f" any-order bound): killed by the order replay {_fmt(r * 100 if r is not None else None, '.1f')}%,"
            f" by the bound alone {_fmt(b * 100 if b is not None else None, '.1f')}%."
        )
    return text


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


def freshness_line(gpu_report: dict | None) -> str | None:
    """The GPU-report freshness line in bold, Markdown (None when not checked)."""
    if not gpu_report or not gpu_report.get("line"):
        return None
    return f"**{md(gpu_report['line'])}**"


def _run_line(env: dict) -> str:
    """Date, coverage, commit and command of the run (what a reviewer needs to reproduce it)."""
    parts = []
    if env.get("date_utc"):
        parts.append(md(env["date_utc"]))
    if env.get("cases_run"):
        parts.append(f"cases {md(env['cases_run'])} of profile {md(env.get('profile', '?'), code=True)}")
    dirty = env.get("git_dirty")
    parts.append(f"commit {md(env.get('git_commit') or 'unknown', code=True)}"
                 + (f" plus local changes to {len(dirty)} files" if dirty else ""))  # fmt: skip
    sd = env.get("source_digest")
    if isinstance(sd, dict) and sd.get("digest"):
        parts.append(f"sources {md(str(sd['digest'])[:12], code=True)}")
    if env.get("command"):
        parts.append(f"command {md(env['command'], code=True)}")
    return "Run: " + "; ".join(parts) + "."


def _env_lines(env: dict) -> list[str]:
    out = []
    for k, v in env.items():
        if k == "source_digest" and isinstance(v, dict):
            n, dirs = len(v.get("files") or {}), ", ".join(v.get("dirs") or [])
            v = f"{v.get('digest')} ({v.get('algorithm')}, {n} files under {dirs})"
        out.append(f"- {md(k)}: {md(v)}")
    return out


def summary_markdown(results, env: dict, *, mutation=None, baseline=None, gpu_report=None) -> str:
    """The summary.md text (``results``: CaseResults or their JSON dicts; the optional dicts as in
    :func:`report_dict`)."""
    cases = case_dicts(results)
    totals = Counter(c["verdict"] for c in cases)
    lines = ["# flint-moe conformance", "", backend_line(env), "", _run_line(env), ""]
    if env.get("incomplete"):
        lines += [f"**INCOMPLETE RUN: {md(env['incomplete'])}** (the cases below are the ones that ran)", ""]
    fl = freshness_line(gpu_report)
    if fl:
        lines += [fl, ""]
    lines.append("Totals: " + ", ".join(f"{v} {totals.get(v, 0)}" for v in VERDICT_ORDER) + f" (of {len(cases)} cases)")
    n_bb = sum(_mode(c) == BLACK_BOX for c in cases)
    if n_bb:
        lines[-1] += f"; {n_bb} {BLACK_BOX} (end to end only, no taps)"
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
        "the golden value over all stages (accumulations: to RN32 of the exact sum); max ulp: order-free stages "
        "and the end-to-end output; worst accumulation: the largest max |kernel - exact| as a fraction of the "
        "certified bound (with its fp32 ulps); end to end: the returned output vs the golden model run on its "
        "own (differing / unexplained elements); failures: failing case (profile/seed) with stage:count.",
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
