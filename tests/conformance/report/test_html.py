"""report.html (flint_moe.conformance.report.html): figures embedded, heatmaps for FAIL / EXPLAINED cases, size
bounded, and a page that says how to get the plots when matplotlib is missing."""

from __future__ import annotations

import base64
import json
import re

import pytest

from flint_moe.conformance.report import html as hp
from flint_moe.conformance.report.report import report_dict, write_report
from tests.conformance._report_data import MUTATION, results

ENV = {"backend": "triton-interpreter (CPU)", "git_commit": "abc"}
FRESH = {"status": "MISSING", "line": "GPU REPORT MISSING (no committed GPU report at reports/h200/report.json)"}
PNG = b"\x89PNG\r\n\x1a\n"


def _imgs(text: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)]


@pytest.fixture(scope="module")
def report():
    return report_dict(results(), ENV, mutation=MUTATION, gpu_report=FRESH)


@pytest.fixture(scope="module")
def full_html(report):
    pytest.importorskip("matplotlib")
    return hp.render_html(report)


def test_figures_and_sections(full_html):
    text = full_html
    imgs = _imgs(text)
    # 2 paths x (overview + ulp histograms) + heatmaps of the 1 FAIL and the 1 EXPLAINED case.
    assert len(imgs) == 6 and all(i.startswith(PNG) for i in imgs)
    assert text.count("<h3 id='heat-") == 2
    assert ("<h3 id='heat-1'><code>nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0</code> <a href='#case-1'>(table "
            "row)</a></h3>") in text  # fmt: skip
    assert "<h3 id='heat-3'><code>bf16_decode/cpu-E6-H192-I192-k3/M2/asymmetric/s0</code>" in text
    assert f'<p class="loud">{FRESH["line"]}</p>' in text
    assert "Mutation kill rate: 50.0%" in text and "left out" not in text
    assert "<td class='v-FAIL'>FAIL</td>" in text and "<td>black-box</td>" in text
    assert 'src="http' not in text and "<script" not in text  # self-contained


def test_size_bound_drops_figures(report, full_html):
    full = full_html
    tables_only = hp.render_html(report, plots=False)
    # Budget for about half of the figures: limit - text - limit // 8 (the text reserve) = figures / 2.
    figures = len(full.encode()) - len(tables_only.encode())
    limit = int((len(tables_only.encode()) + 4096 + figures / 2) * 8 / 7)
    small = hp.render_html(report, max_bytes=limit)
    assert len(small.encode()) < limit
    assert 0 < len(_imgs(small)) < 6
    m = re.search(r"(\d+) figures left out to keep this file under (\d+) bytes", small)
    assert m and int(m.group(1)) == 6 - len(_imgs(small)) and int(m.group(2)) == limit


def test_without_matplotlib(report, monkeypatch, tmp_path):
    monkeypatch.setattr(hp, "have_matplotlib", lambda: False)
    text = hp.render_html(report)
    assert _imgs(text) == [] and "pip install 'flint-moe[report]'" in text
    assert "nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0" in text  # the case table is still there
    p = write_report(results(), ENV, tmp_path)["html"]
    assert p.name == "report.html" and "pip install 'flint-moe[report]'" in p.read_text()


def test_write_report_html_under_16_mib(tmp_path):
    pytest.importorskip("matplotlib")
    paths = write_report(results(), ENV, tmp_path, mutation=MUTATION, gpu_report=FRESH)
    assert set(paths) == {"json", "summary", "summary_full", "html"}
    for p in paths.values():
        assert 0 < p.stat().st_size < 16 * 2**20
    assert len(_imgs(paths["html"].read_text())) == 6


def test_case_ids_are_escaped():
    rep = report_dict(results()[:1], ENV)
    rep["cases"][0]["case_id"] = "<b>x</b>"
    text = hp.render_html(rep, plots=False)
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt;" in text


def test_rerender_cli(tmp_path, report, capsys, monkeypatch):
    monkeypatch.setattr(hp, "have_matplotlib", lambda: False)  # tables only: fast
    (tmp_path / "report.json").write_text(json.dumps(report))
    assert hp.main([str(tmp_path)]) == 0
    assert "nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0" in (tmp_path / "report.html").read_text()
    assert "wrote" in capsys.readouterr().out
    out = tmp_path / "elsewhere.html"
    assert hp.main([str(tmp_path / "report.json"), "--out", str(out)]) == 0 and out.exists()


def test_heatmap_panels_use_maps_and_flatten_coordinates():
    from flint_moe.conformance.report.figures import axis_labels, heat_panels
    from tests.conformance._report_data import black_box_explained, fail_case

    ((title, m, coords, canvas, stage),) = heat_panels(fail_case())
    # act [M=3, k=3, I=64]: rows are token x slot (m * k + j), columns the intermediate index.
    assert title == "act FAIL (2 elements)" and canvas == (9, 64) and coords == [(1, 2), (6, 63)] and stage == "act"
    assert m["shape"] == [9, 64] and m["cells"] == [[1, 2, 1], [6, 63, 1]]
    assert axis_labels(stage, canvas) == ("intermediate i (0..63)", "token m x slot j (row m*k + j), 9 rows")
    bb = black_box_explained()
    ((title, m, coords, canvas, stage),) = heat_panels(bb)
    assert title == "end to end: 4 differing" and canvas == (2, 192) and m["total"] == 4
    assert axis_labels(stage, canvas) == ("hidden h (0..191)", "token m, 2 rows")
    assert axis_labels("router_acc", (3, 6)) == ("expert e (0..5)", "token m, 3 rows")
    bb["end_to_end"].update(unexplained=1, first_failures=[[1, 191]])  # 1 of 4 unexplained, no unexplained_map
    panels = heat_panels(bb)
    assert [p[0] for p in panels] == ["end to end: 4 differing", "end to end: 1 unexplained"]
    assert panels[1][1] is None and panels[1][2] == [(1, 191)]  # drawn from the recorded coordinates


def test_fail_heatmaps_are_drawn_explained_sampled(report, monkeypatch):
    """With no room for EXPLAINED heatmaps the FAIL case's is still drawn, even though an EXPLAINED case comes
    first in the report; the EXPLAINED case is listed with a link to its table row."""
    pytest.importorskip("matplotlib")
    cases = sorted(report["cases"], key=lambda c: c["verdict"] != "EXPLAINED")  # EXPLAINED cases first
    report = {**report, "cases": cases}
    order = [c["verdict"] for c in cases if c["verdict"] in ("FAIL", "EXPLAINED")]
    assert order.index("EXPLAINED") < order.index("FAIL")
    monkeypatch.setattr(hp, "MAX_EXPLAINED_DRAWN", 0)
    text = hp.render_html(report)
    i_fail = next(i for i, c in enumerate(cases) if c["verdict"] == "FAIL")
    i_expl = next(i for i, c in enumerate(cases) if c["verdict"] == "EXPLAINED")
    assert text.count("<h3 id='heat-") == 1 and f"<h3 id='heat-{i_fail}'><code>{cases[i_fail]['case_id']}" in text
    assert (f"<h3 id='not-drawn'>EXPLAINED cases not drawn (1)</h3><ul><li><a href='#case-{i_expl}'><code>"
            f"{cases[i_expl]['case_id']}</code></a></li></ul>") in text  # fmt: skip


def test_strings_of_a_tampered_report_appear_as_text():
    """A verdict, path, backend or freshness line holding HTML is escaped everywhere on the page (the totals
    line, the case table, the headings), with every attribute value quoted."""
    img = "<img src=x onerror=alert(1)>"
    rep = report_dict(results()[:2], dict(ENV, backend="<b>cpu</b>"), gpu_report={"line": "<i>GPU</i>"})
    rep["cases"][0]["verdict"] = img
    rep["cases"][1]["path"] = "p'><script>"
    text = hp.render_html(rep, plots=False)
    assert "<img" not in text and "<b>" not in text and "<i>" not in text and "<script" not in text
    assert "<span class='v-&lt;img src=x onerror=alert(1)&gt;'>&lt;img src=x onerror=alert(1)&gt; 1</span>" in text
    assert "<td class='v-&lt;img src=x onerror=alert(1)&gt;'>&lt;img src=x onerror=alert(1)&gt;</td>" in text
    assert '<p class="loud">&lt;i&gt;GPU&lt;/i&gt;</p>' in text
    assert "<p>Backend: &lt;b&gt;cpu&lt;/b&gt;. CPU run" in text
    assert re.findall(r"<\w+ \w+=(?!['\"])", text) == []  # no unquoted attribute value


def test_dollar_signs_in_titles_and_labels_are_drawn_literally():
    """Case ids, paths and shapes go into figure titles and tick labels: ``$x$``, a lone ``$`` and text that is
    no valid mathtext (``$a^^b$``) are drawn as they are, never parsed."""
    pytest.importorskip("matplotlib")
    from matplotlib.text import Text

    rep = report_dict(results()[:2], ENV)
    for c in rep["cases"]:
        c["path"] = "path $x$ $"
        c["meta"]["shape"] = "$\\alpha^^b$"
    rep["cases"][1]["case_id"] = "$a^^b$ / $x$ / $"
    text = hp.render_html(rep)
    assert len(_imgs(text)) == 3  # overview, ulp histograms, the FAIL case's heatmap
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    with hp._literal_text():
        fig = hp._heat_fig(rep["cases"][1])
        FigureCanvasAgg(fig).draw()  # tick labels are made here
        texts = [t for t in fig.findobj(Text) if t.get_text()]
        assert any(t.get_text() == "$a^^b$ / $x$ / $: FAIL" for t in texts)
        assert all(not t.get_parse_math() and not t.get_usetex() for t in texts)


def test_rerender_cli_refuses_a_malformed_report(tmp_path, capsys):
    rep = report_dict(results()[:1], ENV)
    rep["cases"][0]["stages"][1]["ulp_hist"] = [1, 2, 3]  # the histograms would index past its end
    (tmp_path / "report.json").write_text(json.dumps(rep))
    assert hp.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"{tmp_path}: {tmp_path / 'report.json'} is not a readable conformance report: field "
        "cases[0].stages[1].ulp_hist: expected a list of 33, got a list of 3\n"
    )
    assert not (tmp_path / "report.html").exists()


def test_case_table_first_failures_first_with_plot_links(full_html):
    text = full_html
    table = text.split("<h2 id='cases'>Cases, failures first</h2>")[1].split("</table>")[0]
    assert text.index("<h2 id='cases'>") < text.index("<img")  # the table sits above every figure
    # report order: ok(1) 0, FAIL 1, ok(2) 2, black-box EXPLAINED 3, ok bf16 4 -> FAIL, EXPLAINED, then the rest
    assert re.findall(r"<tr id='case-(\d+)'", table) == ["1", "3", "0", "2", "4"]
    fail_row = table.split("<tr id='case-1' class='r-FAIL'>")[1].split("</tr>")[0]
    # the worst accumulation names its stage and leads with the fraction of its bound
    assert "<td>gate_acc 50% of its bound (40 ulp)</td>" in fail_row
    assert ("<td><a href='#heat-1'>heatmap</a> <a href='#path-0'>overview</a> <a href='#ulp-0'>ulp</a></td>"
            in fail_row)  # fmt: skip
    assert "<a href='#heat-0'>" not in table  # a WITHIN-BOUND case has no heatmap
    for anchor in ("heat-1", "heat-3", "path-0", "path-1", "ulp-0", "ulp-1"):
        assert f"id='{anchor}'" in text, anchor


def test_every_fail_is_drawn_and_explained_are_sampled_round_robin(report, monkeypatch):
    """70 FAIL cases (more than any cap) are all drawn; of 5 + 2 EXPLAINED cases on two paths 3 are drawn: the
    most differing of each path first, alternating paths; the other 4 are listed."""
    pytest.importorskip("matplotlib")
    import copy

    from matplotlib.figure import Figure

    monkeypatch.setattr(hp, "_heat_fig", lambda c: Figure(figsize=(1, 1)))  # cheap figures: only which are drawn
    monkeypatch.setattr(hp, "MAX_EXPLAINED_DRAWN", 3)
    fail = next(c for c in report["cases"] if c["verdict"] == "FAIL")
    expl = next(c for c in report["cases"] if c["verdict"] == "EXPLAINED")
    cases = []
    for n in range(70):
        cases.append(dict(copy.deepcopy(fail), case_id=f"f{n}"))
    for n, (path, diff) in enumerate([("a", 1), ("a", 9), ("a", 5), ("a", 2), ("a", 3), ("b", 4), ("b", 7)]):
        c = copy.deepcopy(expl)
        c.update(case_id=f"e{n}", path=path)
        c["end_to_end"]["differing"] = diff
        cases.append(c)
    text = hp.render_html({**report, "cases": cases})
    drawn = re.findall(r"<h3 id='heat-(\d+)'>", text)
    # e1 (a, 9), e6 (b, 7), e2 (a, 5): indices 70 + n
    assert drawn == [str(i) for i in range(70)] + ["71", "76", "72"]
    listed = re.findall(r"<li><a href='#case-(\d+)'>", text)
    assert listed == ["70", "73", "74", "75"]
    assert "Every FAIL case and 3 of the 7 EXPLAINED cases" in text


def test_figures_have_colour_bars_legends_and_plain_tick_labels(report):
    """Heatmaps carry a labelled colour bar, the overview a colour legend naming every verdict and 'no case',
    and no tick label is raw mathtext."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from flint_moe.conformance.report import figures

    cases = report["cases"]
    with figures.literal_text():
        heat = figures.heat_fig(cases[1])
        over = figures.overview_fig("nvfp4_decode", cases[:3], ("WITHIN-BOUND", "EXPLAINED", "FAIL"))
        ulp = figures.ulp_fig("nvfp4_decode", cases[:3])
        for fig in (heat, over, ulp):
            FigureCanvasAgg(fig).draw()
    labels = [a.get_ylabel() for a in heat.axes]
    assert "mismatching elements per cell (1 x 1)" in labels  # the colour bar's axis
    legend = [t.get_text() for t in over.axes[1].get_legend().get_texts()]
    assert legend == ["WITHIN-BOUND", "EXPLAINED", "FAIL", "no case"]
    texts = [t.get_text() for fig in (heat, over, ulp) for t in fig.findobj(Text)]
    assert texts and not any("mathdefault" in t for t in texts)
    assert heat.get_figwidth() * figures.DPI >= 800  # one panel: at least 800 px wide
