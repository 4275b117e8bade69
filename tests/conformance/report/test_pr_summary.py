"""The short summary.md (flint_moe.conformance.report.summary.summary_markdown): header lines, every FAIL led by
its diagnosis, one row per path, the 60-line limit with many failures, the fraction-led accumulation text, and
the two files written side by side."""

from __future__ import annotations

import copy

from flint_moe.conformance.report import report as rp, summary as sm
from flint_moe.conformance.run import outdir
from tests.conformance._report_data import MUTATION, fail_case, ok_case, results

ENV = {"backend": "triton-interpreter (CPU)", "git_commit": "abc123", "date_utc": "2026-11-29T20:00:00+00:00",
       "cases_run": "5 of 20", "profile": "cpu", "command": "python -m flint_moe.conformance"}  # fmt: skip
FRESH = {"status": "STALE", "line": "GPU REPORT STALE since flint_moe/kernels/router.py changed (commit x)"}
FAIL_ID = "nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0"


def _fails(n: int, diagnoses: int, path: str = "nvfp4_decode") -> list[dict]:
    """``n`` FAIL cases of ``path``, case i diagnosed as fault ``f{i % diagnoses}``."""
    out = []
    for i in range(n):
        c = copy.deepcopy(fail_case())
        c["case_id"] = f"{path}/cpu-E6-H96-I64-k3/M3/tied_logits/s{i}"
        c["path"] = path
        c["diagnosis"] = [f"f{i % diagnoses}: matches the reference with fault {i % diagnoses}"]
        out.append(c)
    return out


def test_bound_text_leads_with_the_fraction():
    assert sm.bound_text({"max_bound_fraction": 0.0081, "max_err_ulps": 1410.0}) == "0.81% of its bound (1.41e+03 ulp)"
    assert sm.bound_text({"max_bound_fraction": 2.5, "max_err_ulps": 3.0}) == "250% of its bound (3 ulp)"
    assert sm.bound_text({"max_bound_fraction": "inf", "max_err_ulps": "inf"}) == "inf% of its bound (inf ulp)"
    assert sm.bound_text({"max_err_ulps": 3.0}) == "-"


def test_short_summary_lines():
    text = sm.summary_markdown(results(), ENV, mutation=MUTATION, gpu_report=FRESH)
    lines = text.splitlines()
    assert lines[0] == "# flint-moe conformance" and lines[2].startswith("**Backend: triton-interpreter (CPU).**")
    assert lines[4].startswith("Run: 2026-11-29T20:00:00+00:00; cases 5 of 20 of profile `cpu`; commit `abc123`")
    assert lines[6] == "**GPU REPORT STALE since flint\\_moe/kernels/router.py changed (commit x)**"
    assert lines[8] == "Totals: EXACT 0, WITHIN-BOUND 3, EXPLAINED 1, FAIL 1 (of 5 cases); 1 black-box (end to end " \
        "only, no taps)"  # fmt: skip
    assert lines[10].startswith("Mutation kill rate: 50.0% (3 of 4")
    at = lines.index("## FAIL (1)")
    # the diagnosis first, then the case, then its failing stage and invariance
    assert lines[at + 2] == f"- **act\\_rounded\\_twice**: `{FAIL_ID}` (act:2, row\\_independence)"
    at = lines.index("## Paths")
    assert lines[at + 2] == "| path | cases | worst verdict | exact % | max ulp | worst accumulation | FAIL |"
    # nvfp4_decode: ok_case(1), fail_case(), ok_case(2): exact (5 + 96) + 1074 + (10 + 192) of
    # (6 + 96) + 1152 + (12 + 192); max ulp 3 (act); worst accumulation gate_acc at 0.5 of its bound.
    assert lines[at + 4 :] == [
        f"| nvfp4\\_decode | 3 | **FAIL** (2 WITHIN-BOUND, 1 FAIL) | {100 * 1377 / 1458:.2f} | 3 "
        "| gate\\_acc 50% of its bound (40 ulp) | 1 |",
        f"| bf16\\_decode (black-box) | 1 | **EXPLAINED** | {100 * 380 / 384:.2f} | 1 | - | 0 |",
        f"| bf16\\_decode | 1 | **WITHIN-BOUND** | {100 * 101 / 102:.2f} | 0 "
        "| router\\_acc 1.25% of its bound (1.5 ulp) | 0 |",
        "",
        sm.PATH_LEGEND,
        "",
        "Full tables (path x shape x M, failure details, explained differences, invariances, mutation results): "
        "summary-full.md; every case: report.json, report.html.",
    ]
    assert "## Failures" not in text and "## Environment" not in text  # those are in summary-full.md


def test_no_fail_says_none():
    text = sm.summary_markdown([ok_case(1)], {"backend": "cpu"})
    assert "## FAIL (0)\n\nNone.\n" in text


def test_every_fail_gets_a_line_while_they_fit():
    fails = _fails(20, diagnoses=20)
    text = sm.summary_markdown([*fails, ok_case(1)], ENV)
    lines = text.splitlines()
    assert len(lines) <= sm.MAX_SUMMARY_LINES
    for i in range(20):
        assert f"- **f{i}**: `nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s{i}` (act:2, row\\_independence)" in lines


def test_many_fails_are_grouped_by_diagnosis_within_60_lines():
    fails = _fails(300, diagnoses=3) + _fails(5, diagnoses=1, path="bf16_decode")
    lines = sm.summary_markdown([*fails, ok_case(1)], ENV, mutation=MUTATION, gpu_report=FRESH).splitlines()
    assert len(lines) <= sm.MAX_SUMMARY_LINES
    assert "## FAIL (305)" in lines
    # f0: cases 0, 3, 6, ... of nvfp4 (100) plus all 5 bf16 cases; f1, f2: 100 each
    assert "- **f0**: 105 cases: `nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0`, " \
        "`nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s3`, `nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s6` " \
        "and 102 more" in lines  # fmt: skip
    assert sum(ln.startswith("- **f1**: 100 cases: ") or ln.startswith("- **f2**: 100 cases: ") for ln in lines) == 2


def test_too_many_diagnoses_still_count_every_fail():
    fails = _fails(200, diagnoses=100)
    lines = sm.summary_markdown(fails, ENV, mutation=MUTATION, gpu_report=FRESH).splitlines()
    assert len(lines) == sm.MAX_SUMMARY_LINES
    grouped = [ln for ln in lines if ln.startswith("- **f")]
    shown = sum(int(ln.split("**: ")[1].split(" case")[0]) for ln in grouped)
    last = next(ln for ln in lines if ln.startswith("- ... "))
    assert last == f"- ... {200 - shown} more FAIL cases under {100 - len(grouped)} more diagnoses (summary-full.md)"
    assert shown == 2 * len(grouped)  # every diagnosis holds 2 cases


def test_baseline_in_one_line():
    base = {"other": "reports/old", "cases_compared": 4, "digest_changes": [{}, {}],
            "verdict_changes": [{"direction": "worse"}, {"direction": "better"}, {"direction": "worse"}]}  # fmt: skip
    text = sm.summary_markdown([ok_case(1)], ENV, baseline=base)
    assert ("Vs baseline `reports/old`: 4 cases compared, 3 verdict changes (2 worse), 2 output digests changed."
            in text.splitlines())  # fmt: skip


def test_both_files_written_and_listed(tmp_path):
    paths = rp.write_report(results(), ENV, tmp_path, mutation=MUTATION, gpu_report=FRESH, html=False)
    assert paths["summary"] == tmp_path / "summary.md" and paths["summary_full"] == tmp_path / "summary-full.md"
    assert paths["summary"].read_text() == sm.summary_markdown(results(), ENV, mutation=MUTATION, gpu_report=FRESH)
    full = paths["summary_full"].read_text()
    assert full.startswith("# flint-moe conformance: full tables") and "## Failures" in full
    # the run publishes exactly the files the report writes
    assert outdir.REPORT_FILES == rp.REPORT_FILES
