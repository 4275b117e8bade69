"""A conformance run stopped by SIGTERM (a CI time limit) still writes its report, marked INCOMPLETE, covering
the cases done; exit status 3."""

from __future__ import annotations

import json
import os
import signal

import flint_moe.conformance.__main__ as cli
import flint_moe.conformance.runner as runner


def test_sigterm_mid_run_writes_an_incomplete_report(tmp_path, monkeypatch) -> None:
    from flint_moe.conformance.compare import CaseResult, StageResult

    calls = []

    def run_case(case, device, counter=None, *, invariance=False, inputs=None, black_box=False):
        calls.append(case.id)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises inside this case
        return CaseResult(case.id, case.path, "EXACT", [StageResult("out", "bits", "EXACT")], meta={})

    monkeypatch.setattr(runner, "run_case", run_case)
    out = tmp_path / "rep"
    rc = cli.main(["--profile", "cpu", "--out", str(out), "--no-html", "--no-mutation"])
    assert rc == 3
    assert len(calls) == 2  # stopped inside the second case: it is not reported, the run went no further
    rep = json.loads((out / "report.json").read_text())
    assert [c["case_id"] for c in rep["cases"]] == calls[:1]
    n = len(cli.select("cpu", []))
    assert rep["env"]["incomplete"] == f"stopped by SIGTERM after 1 of {n} selected cases"
    assert "INCOMPLETE RUN: stopped by SIGTERM after 1 of" in (out / "summary.md").read_text()
    assert signal.getsignal(signal.SIGTERM) is not runner._stop  # the handler is removed after the run
