"""A conformance run stopped by SIGTERM (a CI time limit) still writes its report, marked INCOMPLETE, covering
the cases done, into its staging directory ``.<out>.partial-<run id>`` (printed), never onto ``--out``: an
interrupted rerun leaves the complete report there as it was; exit status 3."""

from __future__ import annotations

import json
import os
import signal

import flint_moe.conformance.__main__ as cli
import flint_moe.conformance.run.runner as runner


def _stop_at(monkeypatch, n: int | None) -> list:
    """run_case returns EXACT; the n-th call sends SIGTERM to this process (None: never). Returns the calls."""
    from flint_moe.conformance.judge.results import CaseResult, StageResult

    calls = []

    def run_case(case, device, counter=None, *, invariance=False, inputs=None, black_box=False):
        calls.append(case.id)
        if len(calls) == n:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises inside this case
        return CaseResult(case.id, case.path, "EXACT", [StageResult("out", "bits", "EXACT")], meta={})

    monkeypatch.setattr(runner, "run_case", run_case)
    return calls


def test_sigterm_mid_run_writes_an_incomplete_report(tmp_path, monkeypatch, capsys) -> None:
    calls = _stop_at(monkeypatch, 2)
    out = tmp_path / "rep"
    rc = cli.main(["--profile", "cpu", "--out", str(out), "--no-html", "--no-mutation"])
    assert rc == 3
    assert len(calls) == 2  # stopped inside the second case: it is not reported, the run went no further
    assert not out.exists()  # an INCOMPLETE report is never published
    (partial,) = tmp_path.glob(".rep.partial-*")
    assert str(partial) in capsys.readouterr().out.replace("\n", "")  # the console names where it is
    out = partial
    rep = json.loads((out / "report.json").read_text())
    assert [c["case_id"] for c in rep["cases"]] == calls[:1]
    n = len(cli.select("cpu", []))
    assert rep["env"]["incomplete"] == f"stopped by SIGTERM after 1 of {n} selected cases"
    assert "INCOMPLETE RUN: stopped by SIGTERM after 1 of" in (out / "summary.md").read_text()
    assert signal.getsignal(signal.SIGTERM) is not runner._stop  # the handler is removed after the run


def test_interrupted_rerun_keeps_the_complete_report(tmp_path, monkeypatch) -> None:
    """A complete report in --out survives a later run (with --overwrite) that SIGTERM stops: byte for byte."""
    out = tmp_path / "rep"
    argv = ["--profile", "cpu", "--filter", "cpu-E6-H96-I64-k3/M", "--out", str(out), "--no-html"]
    _stop_at(monkeypatch, None)
    assert cli.main(argv) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "incomplete" not in json.loads(before["report.json"])["env"]
    _stop_at(monkeypatch, 2)
    assert cli.main([*argv, "--overwrite"]) == 3
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (partial,) = tmp_path.glob(".rep.partial-*")
    assert json.loads((partial / "report.json").read_text())["env"]["incomplete"].startswith("stopped by SIGTERM")
    _stop_at(monkeypatch, None)
    assert cli.main([*argv, "--overwrite"]) == 0  # a complete rerun replaces it; nothing is left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == [partial.name, "rep"]
    env = json.loads((out / "report.json").read_text())["env"]
    assert env["command"].endswith("--no-html --overwrite") and "incomplete" not in env
