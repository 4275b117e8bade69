"""report.html: one self-contained page for a conformance run, failures first.

``write_html(report, path)`` renders a report.json dict (``report.report_dict``) into one HTML file with the
figures embedded as base64 PNGs (no external file, no script). From the top:

- backend, freshness line, totals, mutation kill rate, and links to the sections;
- the case table, failures first (FAIL, then EXPLAINED, WITHIN-BOUND, EXACT): verdict, exact %, max ulp, worst
  accumulation (its stage and its error as a fraction of the certified bound), end to end, failing stages,
  diagnosis, and links to the case's heatmap, its path's overview and its ulp histograms (row anchor
  ``case-<i>``, ``i`` the case's index in the report);
- per-path overviews (:func:`figures.overview_fig`: verdicts per M, verdict matrix with a colour legend);
- ulp histograms per path and stage (:func:`figures.ulp_fig`);
- mismatch heatmaps (:func:`figures.heat_fig`, colour bar per map, axes named after the stage's dimensions) of
  every FAIL case and a sample of at most :data:`MAX_EXPLAINED_DRAWN` EXPLAINED cases (round robin over the
  paths, most differing output elements first), then a list of links to the EXPLAINED cases not drawn;
- the summary-full.md text.

matplotlib is optional (extra ``report``): without it the page holds the tables and says how to get the plots.
The file stays under ``max_bytes`` (default 16 MiB): the FAIL heatmaps get the byte budget first, then the
overviews and histograms, then the EXPLAINED sample; figures that would not fit are left out, and the page
says how many. ``python -m flint_moe.conformance.report.html REPORT_JSON [--out report.html]`` re-renders a
saved report.

Every string of the report (case ids, verdicts, paths, notes, env values) is written through ``html.escape``
(attribute values quoted), and the figures are drawn with mathtext and TeX off (:func:`figures.literal_text`),
so a ``$`` in a title or a label is drawn as it is and never parsed.
"""

from __future__ import annotations

import argparse
import base64
import html as _h
import io
import sys
from collections import Counter, defaultdict
from pathlib import Path

from flint_moe.conformance.report.figures import (
    DPI,
    heat_fig as _heat_fig,
    literal_text as _literal_text,
    overview_fig as _overview_fig,
    ulp_fig as _ulp_fig,
)

__all__ = ["write_html", "render_html", "have_matplotlib", "MAX_EXPLAINED_DRAWN", "main"]

#: EXPLAINED cases drawn as heatmaps (every FAIL case is drawn; the other EXPLAINED cases are listed).
MAX_EXPLAINED_DRAWN = 24
#: Bytes kept free for the tables and text when figures are added: min(2 MiB, max_bytes / 8).
_TEXT_RESERVE = 2 * 2**20
_ORDER = ("EXACT", "WITHIN-BOUND", "EXPLAINED", "FAIL")
GET_MATPLOTLIB = (
    "Plots need matplotlib, which is not installed: <code>pip install 'flint-moe[report]'</code> (or "
    "<code>pip install matplotlib</code>), then re-render this page with "
    "<code>python -m flint_moe.conformance.report.html report.json</code>."
)


def have_matplotlib() -> bool:
    """True when matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _verdicts(report: dict) -> tuple[str, ...]:
    seen = {c.get("verdict") for c in report.get("cases", [])}
    return tuple(v for v in _ORDER if v in seen or v in report.get("totals", {})) + tuple(
        sorted(v for v in seen if v not in _ORDER)
    )


class _Figs:
    """PNG figures as data URIs, within a byte budget."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self.dropped = 0

    def add(self, fig, dpi: int = DPI) -> str | None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        if self.used + len(uri) + 200 > self.budget:
            self.dropped += 1
            return None
        self.used += len(uri) + 200
        return uri


def _img(uri: str | None, alt: str) -> str:
    if uri is None:
        return f"<p class=\"note\">(figure '{_h.escape(alt)}' left out: size budget)</p>"
    return f'<img src="{uri}" alt="{_h.escape(alt)}">'


# ------------------------------------------------------------------------------------------------------------
# Page
# ------------------------------------------------------------------------------------------------------------

_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1400px} table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top} th{background:#f3f3f3;position:sticky;top:0}
.note{color:#555;font-size:13px} img{max-width:100%;height:auto;display:block}
.v-EXACT{color:#2e7d32}.v-WITHIN-BOUND{color:#0288d1}.v-EXPLAINED{color:#b8860b}.v-FAIL{color:#c62828;font-weight:bold}
tr.r-FAIL{background:#fdecea} tr:target{outline:3px solid #1565c0} h3:target{background:#e3f2fd}
.loud{font-weight:bold;font-size:15px;padding:6px;border:2px solid #333;display:inline-block}
nav a{margin-right:1em}"""


def _rank(verdict) -> int:
    """Sort key of the case table: FAIL (and any verdict the harness does not know) first, EXACT last."""
    order = {"FAIL": 0, "EXPLAINED": 1, "WITHIN-BOUND": 2, "EXACT": 3}
    return order.get(verdict, 0)


def _case_table(cases: list[dict], links: dict[int, list[str]] | None = None) -> str:
    """The case table, failures first (then EXPLAINED, WITHIN-BOUND, EXACT; report order within a verdict).
    Row ``i`` (the case's index in the report) has the anchor ``case-i``; ``links[i]``: its plot links (HTML)."""
    from flint_moe.conformance.report.summary import _e2e_cell, _max_ulp, _warnings, _worst_acc, exact_percent

    out = ["<table><tr><th>case</th><th>mode</th><th>verdict</th><th>exact %</th><th>max ulp</th>"
           "<th>worst accumulation (stage, fraction of its bound)</th><th>end to end</th><th>warnings</th>"
           "<th>failing stages</th><th>diagnosis</th><th>plots</th></tr>"]  # fmt: skip
    for i in sorted(range(len(cases)), key=lambda i: _rank(cases[i].get("verdict"))):
        c = cases[i]
        pct = exact_percent(c)
        mu = _max_ulp(c)
        failing = ", ".join(str(s.get("stage")) for s in c.get("stages", []) if s.get("verdict") == "FAIL") or "-"
        diag = "; ".join(str(d).split(":")[0] for d in c.get("diagnosis") or []) or "-"
        v = str(c["verdict"])
        row_class = " class='r-FAIL'" if _rank(v) == 0 else ""
        plots = " ".join((links or {}).get(i, [])) or "-"
        out.append(
            f"<tr id='case-{i}'{row_class}><td><code>{_h.escape(str(c['case_id']))}</code></td>"
            f"<td>{_h.escape(str(c.get('mode') or 'taps'))}</td>"
            f"<td class='v-{_h.escape(v)}'>{_h.escape(v)}</td><td>{'-' if pct is None else f'{pct:.2f}'}</td>"
            f"<td>{'-' if mu is None else f'{mu:.3g}'}</td><td>{_h.escape(_worst_acc(c))}</td>"
            f"<td>{_h.escape(_e2e_cell(c))}</td><td>{_warnings(c)}</td><td>{_h.escape(failing)}</td>"
            f"<td>{_h.escape(diag)}</td><td>{plots}</td></tr>"
        )
    return "\n".join(out + ["</table>"])


def _explained_sample(cases: list[dict]) -> list[int]:
    """Indices of the EXPLAINED cases to draw: at most :data:`MAX_EXPLAINED_DRAWN`, taken round robin over the
    paths, each path's cases by most differing output elements first (ties: report order)."""
    by_path: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(cases):
        if c.get("verdict") == "EXPLAINED":
            by_path[str(c.get("path", "?"))].append(i)
    queues = [sorted(ix, key=lambda i: -int((cases[i].get("end_to_end") or {}).get("differing") or 0))
              for ix in by_path.values()]  # fmt: skip
    picked: list[int] = []
    while len(picked) < MAX_EXPLAINED_DRAWN and any(queues):
        for q in queues:
            if q and len(picked) < MAX_EXPLAINED_DRAWN:
                picked.append(q.pop(0))
    return picked


def _plots(cases: list[dict], verdicts, budget: int, max_bytes: int) -> tuple[list[str], dict[int, list[str]]]:
    """The figure sections (overviews, ulp histograms, heatmaps) within ``budget`` bytes of images, and each
    case's plot links for the case table. The byte budget is spent on every FAIL case's heatmap first, then the
    overviews and histograms, then the sampled EXPLAINED cases; all drawn under :func:`_literal_text`."""
    figs = _Figs(budget)
    by_path: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(cases):
        by_path[str(c.get("path", "?"))].append(i)
    path_id = {p: n for n, p in enumerate(by_path)}
    fails = [i for i, c in enumerate(cases) if _rank(c.get("verdict")) == 0]
    sample = _explained_sample(cases)
    heat: dict[int, str] = {}
    with _literal_text():
        for i in fails:
            fig = _heat_fig(cases[i])
            if fig is not None:
                heat[i] = _img(figs.add(fig), str(cases[i]["case_id"]))
        over = {p: _img(figs.add(_overview_fig(p, [cases[i] for i in ix], verdicts)), f"{p} overview")
                for p, ix in by_path.items()}  # fmt: skip
        ulp = {}
        for p, ix in by_path.items():
            fig = _ulp_fig(p, [cases[i] for i in ix])
            if fig is not None:
                ulp[p] = _img(figs.add(fig), f"{p} ulp")
        for i in sample:
            fig = _heat_fig(cases[i])
            if fig is not None:
                heat[i] = _img(figs.add(fig), str(cases[i]["case_id"]))
    links: dict[int, list[str]] = {}
    for i, c in enumerate(cases):
        n = path_id[str(c.get("path", "?"))]
        links[i] = ([f"<a href='#heat-{i}'>heatmap</a>"] if i in heat else []) + [
            f"<a href='#path-{n}'>overview</a>"] + ([f"<a href='#ulp-{n}'>ulp</a>"] if str(c.get("path", "?")) in ulp
                                                    else [])  # fmt: skip
    body = ["<h2 id='overview'>Per-path overview</h2>"]
    body += [f"<h3 id='path-{path_id[p]}'>{_h.escape(p)}</h3>" + img for p, img in over.items()]
    body.append("<h2 id='ulp'>ulp histograms</h2><p class=\"note\">Per-element histograms where the stages carry "
                "<code>ulp_hist</code>; otherwise the per-case maxima. Bins: 0, 1, [2,4), [4,8), ...</p>")  # fmt: skip
    body += [f"<h3 id='ulp-{path_id[p]}'>{_h.escape(p)}</h3>" + img for p, img in ulp.items()]
    explained = [i for i, c in enumerate(cases) if c.get("verdict") == "EXPLAINED"]
    which = "Every FAIL case"
    if explained:
        which += (f" and {len(sample)} of the {len(explained)} EXPLAINED cases (round robin over the paths, most "
                  "differing output elements first)")  # fmt: skip
    body.append(f"<h2 id='heatmaps'>Mismatch heatmaps</h2><p class=\"note\">{which}; rows are tokens (x expert "
                "slot), columns the stage's last dimension, colour the mismatching elements per map cell.</p>")
    if not fails and not explained:
        body.append("<p>No FAIL or EXPLAINED case.</p>")
    for i in [*fails, *sample]:
        if i in heat:
            body.append(f"<h3 id='heat-{i}'><code>{_h.escape(str(cases[i]['case_id']))}</code> "
                        f"<a href='#case-{i}'>(table row)</a></h3>" + heat[i])  # fmt: skip
    rest = [i for i in explained if i not in heat]
    if rest:
        body.append(f"<h3 id='not-drawn'>EXPLAINED cases not drawn ({len(rest)})</h3><ul>"
                    + "".join(f"<li><a href='#case-{i}'><code>{_h.escape(str(cases[i]['case_id']))}</code></a></li>"
                              for i in rest) + "</ul>")  # fmt: skip
    if figs.dropped:
        body.append(f'<p class="note">{figs.dropped} figures left out to keep this file under {max_bytes} bytes.</p>')
    return body, links


def render_html(report: dict, *, max_bytes: int = 16 * 2**20, plots: bool | None = None) -> str:
    """The report.html text of a report.json dict. ``plots``: None = when matplotlib is importable;
    False = tables only (the page then says how to get the plots)."""
    from flint_moe.conformance.report.summary import backend_line, mutation_line
    from flint_moe.conformance.report.summary_full import full_summary_markdown

    env = report.get("env", {})
    cases = report.get("cases", [])
    verdicts = _verdicts(report)
    totals = Counter(c["verdict"] for c in cases)
    plots = have_matplotlib() if plots is None else plots
    md = full_summary_markdown(cases, env, mutation=report.get("mutation"), baseline=report.get("baseline"),
                          gpu_report=report.get("gpu_report"))  # fmt: skip
    head = [
        "<!doctype html><html><head><meta charset='utf-8'><title>flint-moe conformance</title>",
        f"<style>{_CSS}</style></head><body><h1>flint-moe conformance</h1>",
        f"<p>{_h.escape(backend_line(env, markdown=False))}</p>",
    ]
    fresh = report.get("gpu_report") or {}
    if fresh.get("line"):
        head.append(f'<p class="loud">{_h.escape(str(fresh["line"]))}</p>')
    head.append(
        "<p>Totals: " + ", ".join(f"<span class='v-{_h.escape(v)}'>{_h.escape(v)} {totals.get(v, 0)}</span>"
                                  for v in verdicts)
        + f" (of {len(cases)} cases)</p>"
    )  # fmt: skip
    ml = mutation_line(report.get("mutation"))
    if ml:
        head.append(f"<p>{_h.escape(ml)}</p>")
    head.append("<nav><a href='#cases'>cases (failures first)</a>"
                + ("<a href='#overview'>per-path overview</a><a href='#ulp'>ulp histograms</a>"
                   "<a href='#heatmaps'>mismatch heatmaps</a>" if plots else "")
                + "<a href='#summary-full'>summary-full.md</a></nav>")  # fmt: skip
    tail = ["<h2 id='summary-full'>summary-full.md</h2><details><summary>full text</summary><pre>", _h.escape(md),
            "</pre></details>"]  # fmt: skip
    # the table's size with its plot links (at most ~150 bytes a row) is known before the figures are drawn
    table_bytes = len(_case_table(cases).encode()) + 150 * len(cases)
    text_bytes = sum(len(s.encode()) for s in head + tail) + table_bytes + 4096
    links: dict[int, list[str]] = {}
    if not plots:
        body = [f'<p class="loud">{GET_MATPLOTLIB}</p>']
    else:
        body, links = _plots(cases, verdicts, max(0, max_bytes - text_bytes - min(_TEXT_RESERVE, max_bytes // 8)),
                             max_bytes)  # fmt: skip
    table = ["<h2 id='cases'>Cases, failures first</h2>", _case_table(cases, links)]
    return "\n".join(head + table + body + tail + ["</body></html>"]) + "\n"


def write_html(report: dict, path, *, max_bytes: int = 16 * 2**20, plots: bool | None = None) -> Path:
    """Render ``report`` (report.json dict) to ``path``; returns the Path. Raises ValueError if even the
    page without figures would reach ``max_bytes``."""
    text = render_html(report, max_bytes=max_bytes, plots=plots)
    if len(text.encode()) >= max_bytes:
        text = render_html(report, max_bytes=max_bytes, plots=False)
        if len(text.encode()) >= max_bytes:
            raise ValueError(f"report.html would be {len(text.encode())} bytes (limit {max_bytes})")
    p = Path(path)
    p.write_text(text)
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m flint_moe.conformance.report.html REPORT_JSON [--out FILE]``: re-render report.html (exit 2, one
    line on stderr, for a file that is not a conformance report: ``schema.validate_report``)."""
    import json

    from flint_moe.conformance.report.schema import validate_report

    ap = argparse.ArgumentParser(
        prog="python -m flint_moe.conformance.report.html", description="re-render report.html"
    )
    ap.add_argument("report", help="report.json (or its directory)")
    ap.add_argument("--out", default=None, help="output file (default: report.html beside report.json)")
    args = ap.parse_args(argv)
    src = Path(args.report)
    if src.is_dir():
        src = src / "report.json"
    try:
        rep = json.loads(src.read_text())
        validate_report(rep)
    except (OSError, ValueError) as e:
        print(f"{args.report}: {src} is not a readable conformance report: {e}", file=sys.stderr)
        return 2
    out = write_html(rep, Path(args.out) if args.out else src.with_name("report.html"))
    how = "yes" if have_matplotlib() else "no: pip install matplotlib"
    print(f"wrote {out} ({out.stat().st_size} bytes; plots: {how})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
