"""The figures of report.html (matplotlib's object API only: ``Figure`` + Agg canvas, no pyplot, no global
backend change), drawn at :data:`DPI` with constrained layout so that colour bars, legends and labels stay
inside the image.

- :func:`overview_fig`: per path, verdict counts per token count M and a verdict matrix (shape | data profile x
  M) with a colour legend (one patch per verdict, grey for no case).
- :func:`ulp_fig`: per path, one ulp histogram per stage (per-element where the stages carry ``ulp_hist``, else
  the per-case maxima) and the accumulation error as a fraction of the certified bound.
- :func:`heat_fig`: per case, one token x column mismatch heatmap per FAIL / EXPLAINED stage and end to end,
  each with a colour bar counting the mismatching elements per map cell and axes named after the stage's
  dimensions (e.g. "token m x slot j (row m*k + j)" against "hidden h (0..H-1)").

Every text is drawn literally (:func:`literal_text`: no mathtext, no TeX), so a ``$`` in a case id or shape
stays as it is. Inputs are report.json case dicts; optional fields are read with defaults.
"""

from __future__ import annotations

import contextlib
import math

__all__ = ["DPI", "literal_text", "overview_fig", "ulp_fig", "heat_fig", "heat_panels", "axis_labels", "COLORS"]

#: Resolution of every PNG (figure inches x DPI = pixels).
DPI = 80
COLORS = {"EXACT": "#2e7d32", "WITHIN-BOUND": "#0288d1", "EXPLAINED": "#f9a825", "FAIL": "#c62828"}
_NO_CASE = "#e0e0e0"
_LABEL, _TICK, _TITLE = 10, 9, 11


def _num(v):
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


@contextlib.contextmanager
def literal_text():
    """matplotlib settings for every figure of the page, creation to PNG: text drawn literally (no mathtext
    parsing of ``$...$``, no TeX), restored on exit."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False, "text.usetex": False}):
        yield


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), layout="constrained")


def overview_fig(path: str, cases: list[dict], verdicts):
    """Verdicts per M (stacked bars) and the worst verdict per shape | data profile x M, with a legend."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    ms = sorted({int(c.get("meta", {}).get("M", 0)) for c in cases})
    rows = sorted(
        {(str(c.get("meta", {}).get("shape", "?")), str(c.get("meta", {}).get("profile", "?"))) for c in cases}
    )
    fig = _figure(15, max(3.6, 1.6 + 0.24 * len(rows)))
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.7])
    bottom = [0] * len(ms)
    for v in verdicts:
        cnt = [sum(1 for c in cases if int(c.get("meta", {}).get("M", 0)) == m and c["verdict"] == v) for m in ms]
        if any(cnt):
            ax1.bar([str(m) for m in ms], cnt, bottom=bottom, color=COLORS.get(v, "#777"), label=v)
            bottom = [b + n for b, n in zip(bottom, cnt, strict=True)]
    from matplotlib.ticker import MaxNLocator

    ax1.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax1.set_xlabel("tokens M", fontsize=_LABEL)
    ax1.set_ylabel("cases", fontsize=_LABEL)
    ax1.tick_params(labelsize=_TICK)
    ax1.set_title(f"{path}: verdicts per M", fontsize=_TITLE)
    if ax1.get_legend_handles_labels()[0]:
        ax1.legend(fontsize=_TICK, title="verdict", title_fontsize=_TICK)
    rank = {v: i for i, v in enumerate(verdicts)}
    grid = [[-1] * len(ms) for _ in rows]  # worst verdict over seeds / configurations; -1 = no case
    for c in cases:
        meta = c.get("meta", {})
        r = rows.index((str(meta.get("shape", "?")), str(meta.get("profile", "?"))))
        j = ms.index(int(meta.get("M", 0)))
        grid[r][j] = max(grid[r][j], rank.get(c["verdict"], len(verdicts) - 1))
    cmap = ListedColormap([_NO_CASE] + [COLORS.get(v, "#777") for v in verdicts])
    ax2.imshow([[g + 1 for g in row] for row in grid], cmap=cmap, vmin=0, vmax=len(verdicts), aspect="auto",
               interpolation="nearest")  # fmt: skip
    ax2.set_xticks(range(len(ms)), [str(m) for m in ms], fontsize=_TICK)
    ax2.set_yticks(range(len(rows)), [f"{s} | {p}" for s, p in rows], fontsize=_TICK - 1)
    ax2.set_xlabel("tokens M", fontsize=_LABEL)
    ax2.set_ylabel("shape | data profile", fontsize=_LABEL)
    ax2.set_title("worst verdict per shape | data profile and M", fontsize=_TITLE)
    handles = [Patch(color=COLORS.get(v, "#777"), label=v) for v in verdicts]
    handles.append(Patch(color=_NO_CASE, label="no case"))
    ax2.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=_TICK, title="colour",
               title_fontsize=_TICK, borderaxespad=0)  # fmt: skip
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


def _log_y(ax) -> None:
    """Log-scale y axis with plain tick labels (1, 10, 100; matplotlib's default ones are mathtext, which
    :func:`literal_text` would show as raw ``$\\mathdefault{10^{1}}$``)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def ulp_fig(path: str, cases: list[dict]):
    """Per stage: per-element ulp histogram (summed ulp_hist) or per-case maxima; accumulation bound fractions.
    None when no case has a stage."""
    from matplotlib.ticker import MaxNLocator

    from flint_moe.conformance.report.maps import ULP_BIN_LABELS

    stage_names = []
    for c in cases:
        for s in c.get("stages", []):
            if s.get("stage") not in stage_names and s.get("stage") != "ids":
                stage_names.append(s.get("stage"))
    if any((c.get("end_to_end") or {}).get("elements") for c in cases):
        stage_names.append("end_to_end")
    if not stage_names:
        return None
    n = len(stage_names) + 1
    cols = 3
    fig = _figure(15, 3.3 * math.ceil(n / cols))
    axes = fig.subplots(math.ceil(n / cols), cols, squeeze=False).reshape(-1)
    for ax, name in zip(axes, stage_names, strict=False):
        hists, maxima = [], []
        for c in cases:
            s = (c.get("end_to_end") if name == "end_to_end"
                 else next((x for x in c.get("stages", []) if x.get("stage") == name), None))  # fmt: skip
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
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=_TICK - 1)
        ax.tick_params(axis="y", labelsize=_TICK - 1)
        if any(counts):
            _log_y(ax)
        ax.set_title(f"{name}: ulp distance", fontsize=_LABEL)
        ax.set_xlabel("ulp distance bin", fontsize=_TICK)
        ax.set_ylabel(what, fontsize=_TICK)
    ax = axes[len(stage_names)]
    for st in ("router_acc", "gate_acc", "up_acc", "down_acc"):
        fr = [_num(s.get("max_bound_fraction")) for c in cases for s in c.get("stages", []) if s.get("stage") == st]
        fr = [max(f, 1e-12) for f in fr if f is not None and not math.isnan(f) and not math.isinf(f)]
        if fr:
            ax.hist([math.log10(f) for f in fr], bins=20, histtype="step", linewidth=1.5, label=st)
    ax.set_title("accumulation |err| / bound (max per case)", fontsize=_LABEL)
    ax.set_xlabel("log10 of the fraction of the bound (0 = at the bound)", fontsize=_TICK)
    ax.set_ylabel("cases", fontsize=_TICK)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=_TICK - 1)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=_TICK - 1, title="stage", title_fontsize=_TICK - 1)
    for extra in axes[n:]:
        extra.set_visible(False)
    fig.suptitle(f"{path}: ulp histograms", fontsize=_TITLE + 1)
    return fig


_STAGE_DIMS = {
    "router_acc": ("M", "E"), "logits": ("M", "E"), "ids": ("M", "k"), "weights": ("M", "k"),
    "gate_acc": ("Mk", "I"), "up_acc": ("Mk", "I"), "act": ("Mk", "I"), "down_acc": ("Mk", "H"),
    "y": ("Mk", "H"), "out": ("M", "H"),
}  # fmt: skip
_COLUMN_NAMES = {"E": "expert e", "k": "slot j", "I": "intermediate i", "H": "hidden h"}


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


def axis_labels(name: str, canvas: tuple[int, int] | None) -> tuple[str, str]:
    """(x label, y label) of a heatmap of stage ``name`` (``"out"`` for end to end) on ``canvas`` (rows, cols)."""
    dims = _STAGE_DIMS.get(name, ("M", "H"))
    rows, cols = canvas if canvas else (None, None)
    x = _COLUMN_NAMES.get(dims[1], "column") + (f" (0..{cols - 1})" if cols else "")
    y = "token m x slot j (row m*k + j)" if dims[0] == "Mk" else "token m"
    return x, y + (f", {rows} rows" if rows else "")


def _flat(idx: list[int], meta: dict) -> tuple[int, int]:
    if len(idx) == 3:
        return idx[0] * int(meta.get("k") or 1) + idx[1], idx[2]
    if len(idx) == 2:
        return idx[0], idx[1]
    return 0, idx[0] if idx else 0


def heat_panels(c: dict) -> list[tuple[str, dict | None, list, tuple | None, str]]:
    """(title, map or None, fallback coordinates, canvas, stage) per panel of one case."""
    meta = c.get("meta", {})
    panels = []
    for s in c.get("stages", []):
        if s.get("verdict") in ("FAIL", "EXPLAINED") and (s.get("map") or s.get("first_failures")):
            panels.append((f"{s.get('stage')} {s.get('verdict')} ({s.get('mismatches', 0)} elements)", s.get("map"),
                           [_flat(i, meta) for i in s.get("first_failures") or [] if i],
                           _canvas(str(s.get("stage")), meta), str(s.get("stage"))))  # fmt: skip
    e = c.get("end_to_end") or {}
    if e.get("differing"):
        canvas = _canvas("out", meta)
        first = [tuple(i) for i in e.get("first_differences") or [] if len(i) == 2]
        panels.append((f"end to end: {e['differing']} differing", e.get("map"), first, canvas, "out"))
        same = e.get("unexplained") == e.get("differing") and e.get("map") and not e.get("unexplained_map")
        if e.get("unexplained") and not same:  # (every differing element unexplained: the panel above says it)
            first = [tuple(i) for i in e.get("first_failures") or [] if len(i) == 2]
            panels.append((f"end to end: {e['unexplained']} unexplained", e.get("unexplained_map"), first, canvas,
                           "out"))  # fmt: skip
    return panels


def heat_fig(c: dict):
    """The mismatch heatmaps of one case (None when it has nothing to draw): up to two panels a row, 6.4 x 3.8
    inches each, a colour bar per map."""
    from matplotlib.ticker import MaxNLocator

    from flint_moe.conformance.report.maps import map_dense

    panels = heat_panels(c)
    if not panels:
        return None
    rows_e2e = (c.get("end_to_end") or {}).get("rows") or []
    n = len(panels) + (1 if rows_e2e and not (c.get("end_to_end") or {}).get("map") else 0)
    cols = min(2, n)
    fig = _figure(7.4 * cols if cols > 1 else 10.0, 0.6 + 3.8 * math.ceil(n / cols))
    axes = fig.subplots(math.ceil(n / cols), cols, squeeze=False).reshape(-1)
    for ax, (title, m, coords, canvas, stage) in zip(axes, panels, strict=False):
        if m and m.get("grid") and m["grid"][0] and m["grid"][1]:
            R, N = m["shape"]
            im = ax.imshow(map_dense(m), aspect="auto", interpolation="nearest", cmap="magma_r", vmin=0,
                           extent=(0, N, R, 0))  # fmt: skip
            cb = fig.colorbar(im, ax=ax, shrink=0.95)
            cb.set_label(f"mismatching elements per cell ({m['cell'][0]} x {m['cell'][1]})", fontsize=_TICK)
            cb.ax.tick_params(labelsize=_TICK - 1)
            cb.ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        else:
            if canvas:
                ax.set_xlim(-0.5, canvas[1] - 0.5)
                ax.set_ylim(canvas[0] - 0.5, -0.5)
            if coords:
                ax.scatter([x for _, x in coords], [r for r, _ in coords], marker="s", color=COLORS["FAIL"], s=18,
                           label="first recorded mismatches")  # fmt: skip
                ax.legend(fontsize=_TICK - 1, loc="upper right")
            ax.text(0.01, 0.02, "no map in the report: first recorded coordinates only", transform=ax.transAxes,
                    fontsize=_TICK - 1, color="#555")  # fmt: skip
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=_TICK)
        ax.set_title(title, fontsize=_LABEL)
        x, y = axis_labels(stage, canvas)
        ax.set_xlabel(x, fontsize=_LABEL)
        ax.set_ylabel(y, fontsize=_LABEL)
    used = len(panels)
    if used < n:
        ax = axes[used]
        ax.barh([r["row"] for r in rows_e2e], [r.get("differing", 0) for r in rows_e2e], color=COLORS["EXPLAINED"],
                label="differing")  # fmt: skip
        ax.barh([r["row"] for r in rows_e2e], [r.get("unexplained", 0) for r in rows_e2e], color=COLORS["FAIL"],
                label="unexplained")  # fmt: skip
        ax.invert_yaxis()
        ax.set_title("end to end: differing elements per token row", fontsize=_LABEL)
        ax.set_xlabel("elements", fontsize=_LABEL)
        ax.set_ylabel("token m", fontsize=_LABEL)
        ax.legend(fontsize=_TICK - 1)
        used += 1
    for extra in axes[used:]:
        extra.set_visible(False)
    fig.suptitle(f"{c['case_id']}: {c['verdict']}", fontsize=_TITLE)
    return fig
