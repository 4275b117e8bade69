"""scripts/h200_pending.py (on the CPU under Triton's interpreter, tests/conftest.py): a per-token case id runs
through the gpu profile's judge and its report is written into ``--out``; a run stopped by SIGTERM writes the report
of what it did, marked incomplete with the phase it was stopped in, into its staging directory (``--out`` is left
as it was), and exits 3, or 1 when a case FAILed; a mutation killed but not named by the diagnosis exits 1."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import flint_moe.conformance.run.runner as runner
from flint_moe.conformance.inputs import cases as C
from flint_moe.conformance.judge import mutation as mut
from flint_moe.conformance.judge.results import CaseResult, StageResult

ROOT = Path(__file__).resolve().parents[2]
CASE = "nvfp4_pertoken_swiglu/pt-cpu-E5-H160-I176-P256-k3/M5/gaussian/s0"
CASE2 = "nvfp4_pertoken_swiglu/pt-cpu-E5-H160-I176-P256-k3/M3/gaussian/s0"
N_SWIGLU_MUTS = sum(m.path == "nvfp4_pertoken_swiglu" for m in mut.MUTATIONS)


def _script():
    spec = importlib.util.spec_from_file_location("h200_pending", ROOT / "scripts" / "h200_pending.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _staged(tmp_path) -> dict:
    (partial,) = tmp_path.glob(".rep.partial-*")
    return json.loads((partial / "report.json").read_text())


def _fake_cases(monkeypatch, verdicts: list[str], stop_after: int | None = None):
    """run_cases giving ``verdicts`` in order; with ``stop_after`` it records a SIGTERM after that many cases."""

    def run_cases(cases, device, console=None, *, invariance=False, stopped=None, **kw):
        n = len(cases) if stop_after is None else stop_after
        if stop_after is not None:
            stopped.append("SIGTERM")
        done = zip(cases[:n], verdicts, strict=True)
        return [CaseResult(c.id, c.path, v, [StageResult("out", "bits", v)]) for c, v in done]

    monkeypatch.setattr(runner, "run_cases", run_cases)


@pytest.fixture
def pending(monkeypatch):
    """The swiglu per-token path pending: its catalogued mutations run after the cases."""
    monkeypatch.setattr(C, "GPU_PENDING_PATHS", ("nvfp4_pertoken_swiglu",))


def test_case_report(tmp_path):
    out = tmp_path / "rep"
    rc = _script().main(["--out", str(out), "--case", CASE, "--no-mutation", "--no-invariance", "--jobs", "1"])
    rep = json.loads((out / "report.json").read_text())
    assert rc == 0
    assert [c["case_id"] for c in rep["cases"]] == [CASE] and rep["cases"][0]["verdict"] == "EXACT"
    assert rep["env"]["filters"][0] == "pending paths" and "incomplete" not in rep["env"]
    assert (out / "summary.md").exists() and list(tmp_path.glob(".rep.partial-*")) == []


def test_stopped_run_writes_what_it_has(tmp_path, monkeypatch):
    def stopped_at_once(cases, device, console=None, *, invariance=False, stopped=None, **kw):
        stopped.append("SIGTERM")  # what run_cases records when timeout's SIGTERM arrives before any case ends
        return []

    monkeypatch.setattr(runner, "run_cases", stopped_at_once)
    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.json").write_text("{}")  # an earlier complete report stays as it was
    rc = _script().main(["--out", str(out), "--case", CASE, "--jobs", "1"])
    rep = _staged(tmp_path)
    assert rc == 3
    assert rep["cases"] == [] and rep["env"]["incomplete"] == "stopped by SIGTERM after 0 of 1 cases"
    assert rep["env"]["cases_run"].startswith("0 (INCOMPLETE: stopped by SIGTERM after 0 of 1 cases) of 1 ")
    assert rep.get("mutation") is None  # no mutations after a stop
    assert (out / "report.json").read_text() == "{}"


def test_fail_and_stop_exits_1(tmp_path, monkeypatch, pending, capsys):
    _fake_cases(monkeypatch, ["FAIL"], stop_after=1)
    rc = _script().main(["--out", str(tmp_path / "rep"), "--case", CASE, "--case", CASE2, "--jobs", "1"])
    rep = _staged(tmp_path)
    assert rc == 1  # a FAIL outranks the stop
    assert [c["verdict"] for c in rep["cases"]] == ["FAIL"]
    assert rep["env"]["incomplete"] == "stopped by SIGTERM after 1 of 2 cases"
    assert rep.get("mutation") is None and not (tmp_path / "rep").exists()
    assert "INCOMPLETE RUN: stopped by SIGTERM after 1 of 2 cases; its report stays in" in capsys.readouterr().out


def test_stop_during_the_mutations(tmp_path, monkeypatch, pending):
    _fake_cases(monkeypatch, ["EXACT", "EXACT"])
    seen = []

    def stopped(muts, device=None):
        seen.extend(m.path for m in muts)
        raise runner.RunStopped("SIGTERM")

    monkeypatch.setattr(mut, "run_mutations", stopped)
    rc = _script().main(["--out", str(tmp_path / "rep"), "--case", CASE, "--case", CASE2, "--jobs", "1"])
    rep = _staged(tmp_path)
    assert rc == 3
    assert seen == ["nvfp4_pertoken_swiglu"] * N_SWIGLU_MUTS
    assert [c["verdict"] for c in rep["cases"]] == ["EXACT", "EXACT"]
    assert rep["env"]["incomplete"] == "stopped by SIGTERM during the mutations (after all 2 cases)"
    assert rep.get("mutation") is None and not (tmp_path / "rep").exists()


def _mutation_results(named: bool):
    muts = [m for m in mut.MUTATIONS if m.path == "nvfp4_pertoken_swiglu"]
    return [mut.MutationResult(m.fault, m.path, m.case_id, m.injection, killed=True, named=named or i > 0,
                               verdict="FAIL") for i, m in enumerate(muts)]  # fmt: skip


@pytest.mark.parametrize("named, rc", [(True, 0), (False, 1)])
def test_mutations_must_be_killed_and_named(tmp_path, monkeypatch, pending, named, rc):
    _fake_cases(monkeypatch, ["EXACT"])
    monkeypatch.setattr(mut, "run_mutations", lambda muts, device=None: _mutation_results(named))
    out = tmp_path / "rep"
    assert _script().main(["--out", str(out), "--case", CASE, "--jobs", "1"]) == rc
    rep = json.loads((out / "report.json").read_text())  # complete: published
    n = N_SWIGLU_MUTS
    assert (rep["mutation"]["killed"], rep["mutation"]["named"], rep["mutation"]["total"]) == (n, n - (not named), n)


def test_mutation_error_exits_1(tmp_path, monkeypatch, pending):
    _fake_cases(monkeypatch, ["EXACT"])

    def boom(muts, device=None):
        raise RuntimeError("no CuTe DSL")

    monkeypatch.setattr(mut, "run_mutations", boom)
    out = tmp_path / "rep"
    assert _script().main(["--out", str(out), "--case", CASE, "--jobs", "1"]) == 1
    assert json.loads((out / "report.json").read_text())["mutation"] == {"error": "RuntimeError: no CuTe DSL"}


def test_evidence_dir_refused(tmp_path, monkeypatch, capsys):
    from flint_moe.conformance.run import outdir

    monkeypatch.setattr(outdir, "_root", lambda: tmp_path)  # the evidence directory of a stand-in repository
    out = tmp_path / "reports" / "h200"
    assert _script().main(["--out", str(out), "--case", CASE, "--jobs", "1"]) == 2
    assert "refused" in capsys.readouterr().err and not out.exists() and list(tmp_path.glob("**/report.json")) == []
