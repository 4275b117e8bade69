"""report.html: one self-contained page of plots for a conformance run.

``write_html(report, path)`` renders a report.json dict (``report.report_dict``) into one HTML file with the
figures embedded as base64 PNGs (no external file, no script):

- per-path overviews: verdict counts per token count M, and a verdict matrix (shape / data profile x M);
- ulp histograms per path and stage: per-element histograms where the stages carry ``ulp_hist``
  (``maps.ulp_histogram``), else the per-case maxima (``max_ulp``; accumulations: ``max_err_ulps``), plus the
  observed accumulation error as a fraction of the certified bound;
- mismatch heatmaps token x hidden for every FAIL and EXPLAINED case (up to :data:`MAX_HEATMAP_CASES`): from
  the stages' and the end-to-end result's ``map`` (``maps.mismatch_map``); without one, the recorded
  first coordinates are drawn (and the per-row counts of ``end_to_end.rows``);
- the case table and the full summary.md text.

matplotlib is optional (extra ``report``): without it the page holds the tables and says how to get the plots.
Only matplotlib's object API is used (``Figure`` + Agg canvas): no pyplot, no global backend change. The file
stays under ``max_bytes`` (default 16 MiB): figures that would not fit are left out, and the page says how
many. ``python -m flint_moe.conformance.report.html REPORT_JSON [--out report.html]`` re-renders a saved report.

Every string of the report (case ids, verdicts, paths, notes, env values) is written through ``html.escape``
(attribute values quoted), and the figures are drawn with mathtext and TeX off (``text.parse_math`` and
``text.usetex`` False for every text artist, :func:`_literal_text`), so a ``$`` in a title or a label is drawn
as it is and never parsed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import html as _h
import io
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

__all__ = ["write_html", "render_html", "have_matplotlib", "MAX_HEATMAP_CASES", "main"]

#: FAIL / EXPLAINED cases drawn as heatmaps (the rest are listed).
MAX_HEATMAP_CASES = 60
#: Bytes kept free for the tables and text when figures are added: min(2 MiB, max_bytes / 8).
_TEXT_RESERVE = 2 * 2**20
_COLORS = {"EXACT": "#2e7d32", "WITHIN-BOUND": "#0288d1", "EXPLAINED": "#f9a825", "FAIL": "#c62828"}
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


def _num(v):
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


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

    def add(self, fig, dpi: int = 72) -> str | None:
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


@contextlib.contextmanager
def _literal_text():
    """matplotlib settings for every figure of the page, creation to PNG: text drawn literally (no mathtext
    parsing of ``$...$``, no TeX), restored on exit."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        yield


def _img(uri: str | None, alt: str) -> str:
    if uri is None:
        return f"<p class=\"note\">(figure '{_h.escape(alt)}' left out: size budget)</p>"
    return f'<img src="{uri}" alt="{_h.escape(alt)}">'


# ------------------------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------------------------


def _overview_fig(path: str, cases: list[dict], verdicts):
    from matplotlib.figure import Figure

    ms = sorted({int(c.get("meta", {}).get("M", 0)) for c in cases})
    rows = sorted(
        {(str(c.get("meta", {}).get("shape", "?")), str(c.get("meta", {}).get("profile", "?"))) for c in cases}
    )
    fig = Figure(figsize=(11, max(2.6, 0.8 + 0.18 * len(rows))))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
    bottom = [0] * len(ms)
    for v in verdicts:
        cnt = [sum(1 for c in cases if int(c.get("meta", {}).get("M", 0)) == m and c["verdict"] == v) for m in ms]
        if any(cnt):
            ax1.bar([str(m) for m in ms], cnt, bottom=bottom, color=_COLORS.get(v, "#777"), label=v)
            bottom = [b + n for b, n in zip(bottom, cnt, strict=True)]
    ax1.set_xlabel("tokens M")
    ax1.set_ylabel("cases")
    ax1.set_title(f"{path}: verdicts per M")
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend(fontsize=7)
    # verdict matrix: worst verdict over seeds / repeats in each cell; -1 = no case.
    rank = {v: i for i, v in enumerate(verdicts)}
    grid = [[-1] * len(ms) for _ in rows]
    for c in cases:
        meta = c.get("meta", {})
        r = rows.index((str(meta.get("shape", "?")), str(meta.get("profile", "?"))))
        j = ms.index(int(meta.get("M", 0)))
        grid[r][j] = max(grid[r][j], rank.get(c["verdict"], len(verdicts) - 1))
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap(["#eeeeee"] + [_COLORS.get(v, "#777") for v in verdicts])
    ax2.imshow([[g + 1 for g in row] for row in grid], cmap=cmap, vmin=0, vmax=len(verdicts), aspect="auto",
               interpolation="nearest")  # fmt: skip
    ax2.set_xticks(range(len(ms)), [str(m) for m in ms], fontsize=7)
    ax2.set_yticks(range(len(rows)), [f"{s} | {p}" for s, p in rows], fontsize=6)
    ax2.set_xlabel("tokens M")
    ax2.set_title("worst verdict: shape | data profile x M (grey: no case)", fontsize=9)
    h = fig.get_figheight()
    fig.subplots_adjust(left=0.05, right=0.99, bottom=0.6 / h, top=1 - 0.35 / h, wspace=0.5)
    return fig


def _log2_bins(vals: list[float]) -> tuple[list[str], list[int]]:
    """Counts of non-negative values in bins 0, 1, [2,4), ... (same bins as maps.ulp_histogram)."""
    from flint_moe.conformance.report.maps import ULP_BIN_LABELS, ULP_BINS

    counts = [0] * ULP_BINS
    for v in vals:
        b = 0 if v <= 0 else (ULP_BINS - 1 if math.isinf(v) else min(ULP_BINS - 1, int(math.floor(math.log2(v))) + 1))
        counts[b] += 1
    return list(ULP_BIN_LABELS), counts


def _trim(labels, counts):
    hi = max((i for i, c in enumerate(counts) if c), default=0)
    return labels[: hi + 1], counts[: hi + 1]


def _ulp_fig(path: str, cases: list[dict]):
    """Per stage: per-element ulp histogram (summed ulp_hist) or per-case maxima; accumulation bound fractions."""
    from matplotlib.figure import Figure

    from flint_moe.conformance.report.maps import ULP_BIN_LABELS

    stage_names = []
    for c in cases:
        for s in c.get("stages", []):
            if s["stage"] not in stage_names and s.get("stage") != "ids":
                stage_names.append(s["stage"])
    if any((c.get("end_to_end") or {}).get("elements") for c in cases):
        stage_names.append("end_to_end")
    if not stage_names:
        return None
    n = len(stage_names) + 1
    cols = 4
    fig = Figure(figsize=(12, 2.4 * math.ceil(n / cols)))
    axes = fig.subplots(math.ceil(n / cols), cols, squeeze=False).reshape(-1)
    for ax, name in zip(axes, stage_names, strict=False):
        hists, maxima = [], []
        for c in cases:
            s = (
                c.get("end_to_end")
                if name == "end_to_end"
                else next((x for x in c.get("stages", []) if x["stage"] == name), None)
            )
            if not s:
                continue
            if s.get("ulp_hist"):
                hists.append(s["ulp_hist"])
            v = _num(s.get("max_err_ulps")) if s.get("kind") == "accumulation" else _num(s.get("max_ulp"))
            if v is not None and not math.isnan(v):
                maxima.append(v)
        if hists:
            counts = [sum(h[i] for h in hists) for i in range(len(hists[0]))]
            labels, counts = _trim(list(ULP_BIN_LABELS), counts)
            what = "elements"
        else:
            labels, counts = _trim(*_log2_bins(maxima))
            what = "cases (max per case)"
        ax.bar(range(len(counts)), counts, color="#455a64")
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=6)
        if any(counts):
            ax.set_yscale("log")
        ax.set_title(f"{name}: ulp distance", fontsize=8)
        ax.set_ylabel(what, fontsize=7)
    # accumulation error as a fraction of the certified bound (per case maximum), log10 bins.
    ax = axes[len(stage_names)]
    for st in ("router_acc", "gate_acc", "up_acc", "down_acc"):
        fr = [_num(s.get("max_bound_fraction")) for c in cases for s in c.get("stages", []) if s["stage"] == st]
        fr = [max(f, 1e-12) for f in fr if f is not None and not math.isnan(f) and not math.isinf(f)]
        if fr:
            ax.hist([math.log10(f) for f in fr], bins=20, histtype="step", label=st)
    ax.set_title("accumulation |err| / bound (log10, max per case)", fontsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)
    for extra in axes[n:]:
        extra.set_visible(False)
    fig.suptitle(f"{path}: ulp histograms", fontsize=10)
    h = fig.get_figheight()
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.75 / h, top=1 - 0.5 / h, wspace=0.3, hspace=1.1 / 2.4 * 2)
    return fig


_STAGE_DIMS = {
    "router_acc": ("M", "E"), "logits": ("M", "E"), "ids": ("M", "k"), "weights": ("M", "k"),
    "gate_acc": ("Mk", "I"), "up_acc": ("Mk", "I"), "act": ("Mk", "I"), "down_acc": ("Mk", "H"),
    "y": ("Mk", "H"), "out": ("M", "H"),
}  # fmt: skip


def _canvas(name: str, meta: dict) -> tuple[int, int] | None:
    dims = _STAGE_DIMS.get(name, ("M", "H"))
    M, k = int(meta.get("M") or 0), int(meta.get("k") or 1)
    rows = M * k if dims[0] == "Mk" else M
    col = dims[1]
    cols = meta.get(col)
    if col == "I" and meta.get("pad_to"):
        p = int(meta["pad_to"])
        cols = -(-int(cols) // p) * p if cols else cols
    if col == "k":
        cols = k
    return (rows, int(cols)) if rows and cols else None


def _flat(idx: list[int], name: str, meta: dict) -> tuple[int, int]:
    if len(idx) == 3:
        return idx[0] * int(meta.get("k") or 1) + idx[1], idx[2]
    if len(idx) == 2:
        return idx[0], idx[1]
    return 0, idx[0] if idx else 0


def _heat_panels(c: dict) -> list[tuple[str, dict | None, list, tuple | None]]:
    """(title, map or None, fallback coordinates, canvas) per panel of one case."""
    meta = c.get("meta", {})
    panels = []
    for s in c.get("stages", []):
        if s.get("verdict") in ("FAIL", "EXPLAINED") and (s.get("map") or s.get("first_failures")):
            panels.append((f"{s['stage']} {s['verdict']} ({s.get('mismatches', 0)} elements)", s.get("map"),
                           [_flat(i, s["stage"], meta) for i in s.get("first_failures") or [] if i],
                           _canvas(s["stage"], meta)))  # fmt: skip
    e = c.get("end_to_end") or {}
    if e.get("differing"):
        canvas = _canvas("out", meta)
        panels.append((f"end to end: {e['differing']} differing", e.get("map"),
                       [tuple(i) for i in e.get("first_differences") or [] if len(i) == 2], canvas))  # fmt: skip
        same = e.get("unexplained") == e.get("differing") and e.get("map") and not e.get("unexplained_map")
        if e.get("unexplained") and not same:  # (every differing element unexplained: the panel above says it)
            panels.append((f"end to end: {e['unexplained']} unexplained", e.get("unexplained_map"),
                           [tuple(i) for i in e.get("first_failures") or [] if len(i) == 2], canvas))  # fmt: skip
    return panels


def _heat_fig(c: dict):
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from flint_moe.conformance.report.maps import map_dense

    panels = _heat_panels(c)
    if not panels:
        return None
    rows_e2e = (c.get("end_to_end") or {}).get("rows") or []
    n = len(panels) + (1 if rows_e2e and not (c.get("end_to_end") or {}).get("map") else 0)
    cols = min(3, n)
    fig = Figure(figsize=(4.2 * cols, 3.0 * math.ceil(n / cols)))
    axes = fig.subplots(math.ceil(n / cols), cols, squeeze=False).reshape(-1)
    for ax, (title, m, coords, canvas) in zip(axes, panels, strict=False):
        if m and m.get("grid") and m["grid"][0] and m["grid"][1]:
            R, N = m["shape"]
            im = ax.imshow(map_dense(m), aspect="auto", interpolation="nearest", cmap="magma_r", vmin=0,
                           extent=(0, N, R, 0))  # fmt: skip
            fig.colorbar(im, ax=ax, fraction=0.046, label=f"per {m['cell'][0]}x{m['cell'][1]} cell")
        else:
            if canvas:
                ax.set_xlim(-0.5, canvas[1] - 0.5)
                ax.set_ylim(canvas[0] - 0.5, -0.5)
            if coords:
                ax.scatter([x for _, x in coords], [r for r, _ in coords], marker="s", color="#c62828", s=14)
            ax.text(0.02, 0.02, "first recorded coordinates only", transform=ax.transAxes, fontsize=6, color="#555")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("hidden / column index", fontsize=7)
        ax.set_ylabel("token (x slot)", fontsize=7)
    used = len(panels)
    if used < n:
        ax = axes[used]
        ax.barh([r["row"] for r in rows_e2e], [r.get("differing", 0) for r in rows_e2e], color="#f9a825",
                label="differing")  # fmt: skip
        ax.barh([r["row"] for r in rows_e2e], [r.get("unexplained", 0) for r in rows_e2e], color="#c62828",
                label="unexplained")  # fmt: skip
        ax.invert_yaxis()
        ax.set_title("end to end: differing elements per token row", fontsize=8)
        ax.legend(fontsize=6)
        used += 1
    for extra in axes[used:]:
        extra.set_visible(False)
    fig.suptitle(f"{c['case_id']}: {c['verdict']}", fontsize=9)
    h = fig.get_figheight()
    fig.subplots_adjust(left=0.08, right=0.92, bottom=0.5 / h, top=1 - 0.55 / h, wspace=0.5, hspace=0.6)
    return fig


# ------------------------------------------------------------------------------------------------------------
# Page
# ------------------------------------------------------------------------------------------------------------

_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1400px} table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px} .note{color:#666;font-size:12px} img{max-width:100%}
.v-EXACT{color:#2e7d32}.v-WITHIN-BOUND{color:#0288d1}.v-EXPLAINED{color:#b8860b}.v-FAIL{color:#c62828;font-weight:bold}
.loud{font-weight:bold;font-size:15px;padding:6px;border:2px solid #333;display:inline-block}"""


def _case_table(cases: list[dict]) -> str:
    from flint_moe.conformance.report.summary import _e2e_cell, _max_ulp, _warnings, _worst_acc, exact_percent

    out = ["<table><tr><th>case</th><th>mode</th><th>verdict</th><th>exact %</th><th>max ulp</th>"
           "<th>worst accumulation</th><th>end to end</th><th>warnings</th><th>failing stages</th>"
           "<th>diagnosis</th></tr>"]  # fmt: skip
    for c in cases:
        pct = exact_percent(c)
        mu = _max_ulp(c)
        failing = ", ".join(s["stage"] for s in c.get("stages", []) if s.get("verdict") == "FAIL") or "-"
        diag = "; ".join(d.split(":")[0] for d in c.get("diagnosis") or []) or "-"
        v = c["verdict"]
        out.append(
            f"<tr><td><code>{_h.escape(c['case_id'])}</code></td><td>{_h.escape(str(c.get('mode') or 'taps'))}</td>"
            f"<td class='v-{_h.escape(v)}'>{_h.escape(v)}</td><td>{'-' if pct is None else f'{pct:.2f}'}</td>"
            f"<td>{'-' if mu is None else f'{mu:.3g}'}</td><td>{_h.escape(_worst_acc(c))}</td>"
            f"<td>{_h.escape(_e2e_cell(c))}</td><td>{_warnings(c)}</td><td>{_h.escape(failing)}</td>"
            f"<td>{_h.escape(diag)}</td></tr>"
        )
    return "\n".join(out + ["</table>"])


def _plot_sections(cases: list[dict], verdicts, budget: int, max_bytes: int) -> list[str]:
    """The figure sections of the page (overviews, ulp histograms, heatmaps) within ``budget`` bytes of
    images, all drawn under :func:`_literal_text`."""
    figs = _Figs(budget)
    by_path = defaultdict(list)
    for c in cases:
        by_path[c.get("path", "?")].append(c)
    body = ["<h2>Per-path overview</h2>"]
    with _literal_text():
        for path, cs in by_path.items():
            body.append(
                f"<h3>{_h.escape(path)}</h3>" + _img(figs.add(_overview_fig(path, cs, verdicts)), f"{path} overview")
            )
        body.append(
            '<h2>ulp histograms</h2><p class="note">Per-element histograms where the stages carry '
            "<code>ulp_hist</code>; otherwise the per-case maxima. Bins: 0, 1, [2,4), [4,8), ...</p>"
        )
        for path, cs in by_path.items():
            fig = _ulp_fig(path, cs)
            if fig is not None:
                body.append(f"<h3>{_h.escape(path)}</h3>" + _img(figs.add(fig), f"{path} ulp"))
        # every FAIL first (they must never fall past the cap), then the EXPLAINED cases in report order
        bad = [c for c in cases if c["verdict"] == "FAIL"] + [c for c in cases if c["verdict"] == "EXPLAINED"]
        body.append("<h2>Mismatch heatmaps (FAIL and EXPLAINED cases)</h2>")
        if not bad:
            body.append("<p>No FAIL or EXPLAINED case.</p>")
        for c in bad[:MAX_HEATMAP_CASES]:
            fig = _heat_fig(c)
            if fig is not None:
                body.append(f"<h3><code>{_h.escape(c['case_id'])}</code></h3>" + _img(figs.add(fig), c["case_id"]))
    if len(bad) > MAX_HEATMAP_CASES:
        body.append(f'<p class="note">{len(bad) - MAX_HEATMAP_CASES} more FAIL/EXPLAINED cases not drawn.</p>')
    if figs.dropped:
        body.append(f'<p class="note">{figs.dropped} figures left out to keep this file under {max_bytes} bytes.</p>')
    return body


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
    tail = [
        "<h2>Cases</h2>", _case_table(cases),
        "<h2>summary-full.md</h2><details><summary>full text</summary><pre>", _h.escape(md), "</pre></details>",
    ]  # fmt: skip
    text_bytes = sum(len(s.encode()) for s in head + tail) + 4096
    if not plots:
        body = [f'<p class="loud">{GET_MATPLOTLIB}</p>']
    else:
        body = _plot_sections(cases, verdicts, max(0, max_bytes - text_bytes - min(_TEXT_RESERVE, max_bytes // 8)),
                              max_bytes)  # fmt: skip
    return "\n".join(head + body + tail + ["</body></html>"]) + "\n"


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
