"""report.json and the report files (flint_moe.conformance.report.report): content, optional blocks and the
16 MiB limit (compact, then without maps, then an error)."""

from __future__ import annotations

import json

import pytest

from flint_moe.conformance.report import report as rp
from tests.conformance._report_data import MUTATION, ok_case, results

ENV = {"backend": "triton-interpreter (CPU)", "git_commit": "abc123", "date_utc": "2026-11-29T20:00:00+00:00",
       "cases_run": "5 of 20", "profile": "cpu", "command": "python -m flint_moe.conformance",
       "source_digest": {"algorithm": "sha256/ast-canonical-v1", "digest": "0123456789abcdef" * 4, "dirs": ["a"],
                         "files": {"a/x.py": "1" * 64}}}  # fmt: skip
FRESH = {"status": "STALE", "line": "GPU REPORT STALE since flint_moe/kernels/router.py changed (commit x)"}


def test_report_dict_and_files(tmp_path):
    base = {
        "other": "x",
        "verdict_changes": [],
        "digest_changes": [],
        "cases_compared": 0,
        "unchanged_cases": 0,
        "outputs_only_here": [],
        "outputs_only_there": [],
        "cases_only_here": [],
        "cases_only_there": [],
    }
    paths = rp.write_report(results(), ENV, tmp_path, mutation=MUTATION, baseline=base, gpu_report=FRESH, html=False)
    assert set(paths) == {"json", "summary", "summary_full"} and not (tmp_path / "report.html").exists()
    data = json.loads(paths["json"].read_text())
    assert data["schema"] == rp.SCHEMA
    assert data["totals"] == {"EXACT": 0, "WITHIN-BOUND": 3, "EXPLAINED": 1, "FAIL": 1, "cases": 5}
    assert data["mutation"] == MUTATION and data["baseline"] == base and data["gpu_report"] == FRESH
    assert data["env"]["source_digest"]["digest"] == ENV["source_digest"]["digest"]
    assert data["cases"][1]["stages"][1]["map"]["total"] == 2
    assert "## Changes vs baseline `x`" in paths["summary_full"].read_text()
    assert "Vs baseline `x`: 0 cases compared, 0 verdict changes (0 worse), 0 output digests changed." in (
        paths["summary"].read_text()
    )
    assert "mutation" not in rp.report_dict([ok_case()], ENV)


def test_oversized_report_json_compacts_then_drops_maps_then_raises(tmp_path, monkeypatch):
    rep = rp.report_dict(results(), ENV)
    indented = len(json.dumps(rep, indent=1).encode())
    compact = len(json.dumps(rep, separators=(",", ":")).encode())
    assert compact < indented
    monkeypatch.setattr(rp, "MAX_BYTES", compact + 1)
    text = rp.write_report(results(), ENV, tmp_path, html=False)["json"].read_text()
    assert len(text.encode()) == compact and json.loads(text) == rep  # same content, no indentation
    monkeypatch.setattr(rp, "MAX_BYTES", compact - 1)
    data = json.loads(rp.write_report(results(), ENV, tmp_path, html=False)["json"].read_text())
    assert data["trimmed"].startswith("mismatch maps and ulp histograms dropped")
    assert data["cases"][1]["stages"][1]["map"] is None and data["cases"][3]["end_to_end"]["map"] is None
    assert data["cases"][1]["stages"][1]["mismatches"] == 2  # the metrics stay
    monkeypatch.setattr(rp, "MAX_BYTES", 1000)
    with pytest.raises(ValueError, match="even without maps"):
        rp.write_report(results(), ENV, tmp_path, html=False)
