"""scripts/h200_pending.py (on the CPU under Triton's interpreter, tests/conftest.py): a per-token case id runs
through the gpu profile's judge and its report is written; a run stopped by SIGTERM still writes the report of
the cases done, marked incomplete, and exits 3."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASE = "nvfp4_pertoken_swiglu/pt-cpu-E5-H160-I176-P256-k3/M5/gaussian/s0"


def _script():
    spec = importlib.util.spec_from_file_location("h200_pending", ROOT / "scripts" / "h200_pending.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_case_report(tmp_path):
    rc = _script().main(["--out", str(tmp_path), "--case", CASE, "--no-mutation", "--no-invariance", "--jobs", "1"])
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rc == 0
    assert [c["case_id"] for c in rep["cases"]] == [CASE] and rep["cases"][0]["verdict"] == "EXACT"
    assert rep["env"]["filters"][0] == "pending paths" and "incomplete" not in rep["env"]
    assert (tmp_path / "summary.md").exists()


def test_stopped_run_writes_what_it_has(tmp_path, monkeypatch):
    import flint_moe.conformance.run.runner as runner

    def stopped_at_once(cases, device, console=None, *, invariance=False, stopped=None, **kw):
        stopped.append("SIGTERM")  # what run_cases records when timeout's SIGTERM arrives before any case ends
        return []

    monkeypatch.setattr(runner, "run_cases", stopped_at_once)
    rc = _script().main(["--out", str(tmp_path), "--case", CASE, "--jobs", "1"])
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rc == 3
    assert rep["cases"] == [] and rep["env"]["incomplete"] == "stopped by SIGTERM after 0 of 1 cases"
    assert rep.get("mutation") is None  # no mutations after a stop
