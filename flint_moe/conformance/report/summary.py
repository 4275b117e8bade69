"""summary.md (the short text a reviewer pastes into a pull request), summary-full.md (every table), and the
cells the console table and report.html share with them.

summary.md (:func:`summary_markdown`, at most :data:`MAX_SUMMARY_LINES` lines): the backend line (on the CPU it
says bit-exactness is not claimed: the interpreter runs the golden model's emulations of the rounding
instructions), the run line, the GPU-report freshness line, totals with the mutation kill rate, every FAIL case
led by its diagnosis (grouped by diagnosis when one line each would not fit), one row per path with its worst
verdict, and the changes vs a baseline in one line.

summary-full.md: :mod:`flint_moe.conformance.report.summary_full`, built from the cells here. A worst
accumulation reads as its stage and its error led by the fraction of the certified bound
("down_acc 0.81% of its bound (1.41e+03 ulp)", :func:`bound_text`).

Every function here takes CaseResult objects or their ``to_json()`` dicts (e.g. a loaded report.json), and
reads the optional keys (``mode``, ``end_to_end``, ``warnings``, stage ``map`` and any stage field a newer
judge adds) with defaults. Every string reaches the Markdown through
:func:`flint_moe.conformance.report.markdown.md`.
"""

from __future__ import annotations

from collections import Counter

from flint_moe.conformance.judge.results import ACCUMULATION_STAGES, FAIL, NOT_JUDGED, VERDICT_ORDER
from flint_moe.conformance.report.markdown import md

__all__ = [
    "SUMMARY_FILE",
    "FULL_SUMMARY_FILE",
    "MAX_SUMMARY_LINES",
    "summary_markdown",
    "bound_text",
    "backend_line",
    "case_dicts",
    "exact_percent",
    "freshness_line",
    "mutation_line",
]

#: The short PR summary and the file with the full tables, written side by side.
SUMMARY_FILE = "summary.md"
FULL_SUMMARY_FILE = "summary-full.md"
#: summary.md never has more lines than this.
MAX_SUMMARY_LINES = 60
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
        if (s.get("stage") in ACCUMULATION_STAGES or s.get("kind") == "accumulation")
        and _num(s.get("max_bound_fraction")) is not None
    ]
    worst = max(accs, key=lambda s: _num(s["max_bound_fraction"]), default=None)
    if worst is None:
        return "-"
    return f"{worst['stage']} {bound_text(worst)}"


def bound_text(s: dict) -> str:
    """An accumulation stage's worst error led by its fraction of the certified bound, plain text:
    ``"0.81% of its bound (1.41e+03 ulp)"`` for ``max_bound_fraction`` 0.0081 and ``max_err_ulps`` 1410
    (``"-"`` without a fraction). Above 100% the stage FAILs."""
    frac = _num(s.get("max_bound_fraction"))
    if frac is None:
        return "-"
    return f"{_fmt(frac * 100.0)}% of its bound ({_fmt(_num(s.get('max_err_ulps')))} ulp)"


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


def _group_cells(key: tuple[str, str, str], group: list[dict]) -> list[str]:
    """The Markdown cells of one table row for the cases of one path x shape x M (all data profiles and seeds):
    path, shape, M, cases, verdict, exact %, max ulp, worst accumulation, end to end, warnings, failures,
    invariances."""
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
        if (s.get("stage") in ACCUMULATION_STAGES or s.get("kind") == "accumulation")
        and _num(s.get("max_bound_fraction")) is not None
    ]
    acc = "-"
    if accs:
        s, _ = max(accs, key=lambda sc: _num(sc[0]["max_bound_fraction"]))
        acc = f"{md(s['stage'])} {md(bound_text(s))}"
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
    return [key[0], key[1], key[2], str(len(group)), verdict, f"{100.0 * ex / n:.2f}" if n else "-",
            _fmt(max(ulps, default=None)), acc, e2e_cell, str(sum(_warnings(c) for c in group)), fail_cell or "-",
            _inv_cell(group)]  # fmt: skip


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
    changes = f" plus local changes to {len(dirty)} file{'s' if len(dirty) != 1 else ''}" if dirty else ""
    parts.append(f"commit {md(env.get('git_commit') or 'unknown', code=True)}{changes}")
    sd = env.get("source_digest")
    if isinstance(sd, dict) and sd.get("digest"):
        parts.append(f"sources {md(str(sd['digest'])[:12], code=True)}")
    if env.get("command"):
        parts.append(f"command {md(env['command'], code=True)}")
    return "Run: " + "; ".join(parts) + "."


def _header(cases: list[dict], env: dict, gpu_report, title: str) -> list[str]:
    """Title, backend, run line, INCOMPLETE and freshness lines, totals (shared by both summaries)."""
    totals = Counter(c["verdict"] for c in cases)
    lines = [title, "", backend_line(env), "", _run_line(env), ""]
    if env.get("incomplete"):
        lines += [f"**INCOMPLETE RUN: {md(env['incomplete'])}** (the cases below are the ones that ran)", ""]
    fl = freshness_line(gpu_report)
    if fl:
        lines += [fl, ""]
    lines.append("Totals: " + ", ".join(f"{v} {totals.get(v, 0)}" for v in VERDICT_ORDER)
                 + (f", {NOT_JUDGED} {totals[NOT_JUDGED]}" if totals.get(NOT_JUDGED) else "")
                 + f" (of {len(cases)} cases)")  # fmt: skip
    n_bb = sum(_mode(c) == BLACK_BOX for c in cases)
    if n_bb:
        lines[-1] += f"; {n_bb} {BLACK_BOX} (end to end only, no taps)"
    nj = [c["case_id"] for c in cases if c["verdict"] == NOT_JUDGED]
    if nj:
        shown = ", ".join(md(i, code=True) for i in nj[:8]) + (f" and {len(nj) - 8} more" if len(nj) > 8 else "")
        lines += ["", f"**{len(nj)} {NOT_JUDGED}** (out of device memory on every attempt; not a pass): {shown}"]
    return lines


def _fail_reason(c: dict) -> str:
    """Markdown: what a FAIL case matches, first (the diagnosis names; else why there is none)."""
    names = [md(str(d).split(":")[0]) for d in c.get("diagnosis") or []]
    if names:
        return "; ".join(names)
    raised = [s for s in c.get("stages", []) if s.get("stage") == "run" and s.get("verdict") == FAIL]
    if raised:
        note = str(raised[0].get("note") or "?")
        return f"the run raised {md(note.removeprefix('raised '))}"
    stage_failed = any(s.get("verdict") == FAIL and s.get("stage") != "run" for s in c.get("stages", []))
    if _mode(c) == BLACK_BOX:
        return "no diagnosis (black-box: end to end only)"
    if stage_failed:
        return "no catalogued fault reproduces the kernel's output"
    inv = [md(i.get("name")) for i in c.get("invariance") or [] if i.get("outcome") == "FAIL"]
    if inv:
        return "invariance " + ", ".join(inv) + " failed"
    return "no diagnosis"


def _fail_lines(fails: list[dict], budget: int) -> list[str]:
    """Every FAIL led by its diagnosis in at most ``budget`` lines: one line per case when they fit, else one
    line per diagnosis (its case count and first ids), else the first diagnoses and a pointer to the rest."""
    per_case = [f"- **{_fail_reason(c)}**: {md(c['case_id'], code=True)} ({_case_failures(c) or 'FAIL'})"
                for c in fails]  # fmt: skip
    if len(per_case) <= budget:
        return per_case
    groups: dict[str, list[dict]] = {}
    for c in fails:
        groups.setdefault(_fail_reason(c), []).append(c)
    ordered = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    shown = ordered if len(ordered) <= budget else ordered[: max(budget - 1, 0)]
    out = []
    for reason, cs in shown:
        ids = ", ".join(md(c["case_id"], code=True) for c in cs[:3])
        more = f" and {len(cs) - 3} more" if len(cs) > 3 else ""
        out.append(f"- **{reason}**: {len(cs)} case{'s' if len(cs) != 1 else ''}: {ids}{more}")
    if len(shown) < len(ordered):
        rest = len(fails) - sum(len(cs) for _, cs in shown)
        out.append(f"- ... {rest} more FAIL cases under {len(ordered) - len(shown)} more diagnoses "
                   f"({FULL_SUMMARY_FILE})")  # fmt: skip
    return out


#: The line under summary.md's path table: what its columns measure.
PATH_LEGEND = (
    "exact %: elements bitwise equal to the golden value over all stages (accumulations: to RN32 of the exact "
    "sum); max ulp: order-free stages and the end-to-end output; worst accumulation: the largest "
    "|kernel - exact| of a long fp32 sum as a percentage of its certified bound (its fp32 ulps in brackets)."
)


def _path_rows(cases: list[dict]) -> list[str]:
    """One table row per path (black-box runs labelled): cases, worst verdict with the counts, exact %, max ulp,
    worst accumulation (stage, fraction of its bound), FAIL cases."""
    groups: dict[str, list[dict]] = {}
    for c in cases:
        groups.setdefault(_group_key(c)[0], []).append(c)
    rows = ["| path | cases | worst verdict | exact % | max ulp | worst accumulation | FAIL |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for key, group in groups.items():
        cells = _group_cells((key, "", ""), group)
        n_fail = sum(c["verdict"] == FAIL for c in group)
        rows.append(f"| {key} | {len(group)} | {cells[4]} | {cells[5]} | {cells[6]} | {cells[7]} | {n_fail} |")
    return rows


def summary_markdown(results, env: dict, *, mutation=None, baseline=None, gpu_report=None) -> str:
    """The summary.md text: the short pull-request summary, at most :data:`MAX_SUMMARY_LINES` lines
    (``results``: CaseResults or their JSON dicts; the optional dicts as in
    :func:`flint_moe.conformance.report.report.report_dict`). The full tables are
    :func:`flint_moe.conformance.report.summary_full.full_summary_markdown`'s."""
    cases = case_dicts(results)
    lines = _header(cases, env, gpu_report, "# flint-moe conformance")
    ml = mutation_line(mutation)
    if ml:
        lines.append("")
        lines.append(md(ml))
    if baseline is not None:
        vc = baseline.get("verdict_changes") or []
        worse = sum(v.get("direction") == "worse" for v in vc)
        lines += ["", f"Vs baseline {md(baseline.get('other', '?'), code=True)}: "
                  f"{md(baseline.get('cases_compared', '?'))} cases compared, {len(vc)} verdict changes ({worse} "
                  f"worse), {len(baseline.get('digest_changes') or [])} output digests changed."]  # fmt: skip
    tail = ["", "## Paths", "", *_path_rows(cases), "", PATH_LEGEND, "",
            f"Full tables (path x shape x M, failure details, explained differences, invariances, mutation "
            f"results): {FULL_SUMMARY_FILE}; every case: report.json, report.html."]  # fmt: skip
    fails = [c for c in cases if c["verdict"] == FAIL]
    head = ["", f"## FAIL ({len(fails)})", ""]
    budget = MAX_SUMMARY_LINES - len(lines) - len(head) - len(tail)
    body = _fail_lines(fails, max(budget, 1)) if fails else ["None."]
    out = lines + head + body + tail
    if len(out) > MAX_SUMMARY_LINES:  # more paths than the budget (never with the shipped paths)
        out = out[: MAX_SUMMARY_LINES - 1] + [f"(cut at {MAX_SUMMARY_LINES} lines: see {FULL_SUMMARY_FILE})"]
    return "\n".join(out) + "\n"

