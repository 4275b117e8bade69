"""A case that runs out of device memory on every attempt is NOT-JUDGED: neither a pass nor a FAIL of the kernel.
The parallel workers retry it (``parallel._run_with_retries``), the serial runner reports it at once; the report
counts it apart (totals, summary, not evidence) and the CLI exits 1."""

from __future__ import annotations

import json

import torch

import flint_moe.conformance.__main__ as cli
import flint_moe.conformance.run.runner as runner
from flint_moe.conformance.inputs.cases import Case
from flint_moe.conformance.judge.results import NOT_JUDGED, CaseResult, StageResult
from flint_moe.conformance.report.digest import _not_evidence
from flint_moe.conformance.report.report import report_dict
from flint_moe.conformance.run import parallel

CASE = Case.from_id("nvfp4_decode/cpu-E6-H96-I64-k3/M1/gaussian/s0")
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


def _ooms(n: int | None):
    """run_case raising out of memory on the first ``n`` calls (None: always), then EXACT."""
    calls = []

    def run_case(case, device, counter=None, *, invariance=False, inputs=None, black_box=False):
        calls.append(case.id)
        if n is None or len(calls) <= n:
            raise torch.OutOfMemoryError(OOM)
        return CaseResult(case.id, case.path, "EXACT", [StageResult("out", "bits", "EXACT")], meta={})

    return run_case, calls


def test_retries_exhausted_by_oom_are_not_judged(monkeypatch):
    monkeypatch.setattr(parallel.time, "sleep", lambda s: None)
    run_case, calls = _ooms(None)
    r = parallel._run_with_retries(CASE, torch.device("cpu"), None, True, run_case, runner.raised_result)
    assert len(calls) == parallel.OOM_ATTEMPTS == 4
    assert r.verdict == NOT_JUDGED and [(s.stage, s.verdict) for s in r.stages] == [("run", NOT_JUDGED)]
    assert r.stages[0].note == f"not judged: out of device memory on 4 attempts: {OOM}"
    assert r.meta["oom_attempts"] == 4


def test_oom_then_success_is_judged(monkeypatch):
    monkeypatch.setattr(parallel.time, "sleep", lambda s: None)
    run_case, calls = _ooms(2)
    r = parallel._run_with_retries(CASE, torch.device("cpu"), None, True, run_case, runner.raised_result)
    assert len(calls) == 3 and r.verdict == "EXACT" and r.meta == {"oom_retries": 2}


def test_other_errors_stay_a_fail():
    r = runner.raised_result(CASE, ValueError("bad inputs"))
    assert r.verdict == "FAIL" and r.stages[0].note == "raised ValueError: bad inputs"
    assert "oom_attempts" not in r.meta


def test_serial_run_reports_oom_not_judged(monkeypatch):
    run_case, _ = _ooms(None)
    monkeypatch.setattr(runner, "run_case", run_case)
    (r,) = runner.run_cases([CASE], torch.device("cpu"))
    assert r.verdict == NOT_JUDGED
    assert r.stages[0].note == f"not judged: out of device memory on 1 attempt: {OOM}"


def test_report_counts_not_judged_apart():
    ok = CaseResult("a", "p", "EXACT", [StageResult("out", "bits", "EXACT")])
    nj = runner.raised_result(CASE, torch.OutOfMemoryError(OOM))
    totals = report_dict([ok, nj], {})["totals"]
    assert totals == {"EXACT": 1, "WITHIN-BOUND": 0, "EXPLAINED": 0, "FAIL": 0, NOT_JUDGED: 1, "cases": 2}
    assert "NOT-JUDGED" not in report_dict([ok], {})["totals"]  # reports without one keep their totals
    assert _not_evidence({"gpu": True, "profile": "gpu"}, totals) == ["1 NOT-JUDGED"]


def test_cli_exits_1_on_not_judged(tmp_path, monkeypatch, capsys):
    run_case, calls = _ooms(None)
    monkeypatch.setattr(runner, "run_case", run_case)
    out = tmp_path / "rep"
    rc = cli.main(["--profile", "cpu", "--filter", CASE.id, "--out", str(out), "--no-html", "--no-mutation"])
    assert rc == 1 and calls == [CASE.id]
    rep = json.loads((out / "report.json").read_text())
    assert [c["verdict"] for c in rep["cases"]] == [NOT_JUDGED] and rep["totals"][NOT_JUDGED] == 1
    assert "1 cases, 0 FAIL, 1 NOT-JUDGED; report:" in capsys.readouterr().out.replace("\n", "")
    summary = (out / "summary.md").read_text()
    assert "Totals: EXACT 0, WITHIN-BOUND 0, EXPLAINED 0, FAIL 0, NOT-JUDGED 1 (of 1 cases)" in summary
    assert f"**1 NOT-JUDGED** (out of device memory on every attempt; not a pass): `{CASE.id}`" in summary
