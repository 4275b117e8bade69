"""conformance/run/simulate.py: the planner's hand-out replayed on hand-made units, its lower bounds, the CLI on a
report's measured costs; conformance/run/wall.py: the wall-time line."""

from __future__ import annotations

import json

import pytest

from flint_moe.conformance.inputs.cases import Case, matrix
from flint_moe.conformance.run.parallel import Unit
from flint_moe.conformance.run.simulate import main, memory_shares, simulate
from flint_moe.conformance.run.wall import process_seconds, wall_line

GIB = 1 << 30


def _unit(uid, seconds, gib, case=None):
    return Unit(uid, "cases", [(uid, case)] if case is not None else [], float(seconds), int(gib * GIB))


def test_memory_waits_and_bounds_by_hand():
    # budget 12 GiB, 3 workers: units of 10 s at 5, 5 and 8 GiB. The first two start at 0 (10 GiB); the third
    # (5 + 5 + 8 > 12) waits for them and runs 10..20. Bounds: work 30 / 3 = 10 s, memory
    # (10*5 + 10*5 + 10*8) / 12 = 15 s, longest 10 s.
    units = [_unit(0, 10, 5), _unit(1, 10, 5), _unit(2, 10, 8)]
    s = simulate(units, 3, 12 * GIB)
    assert s.makespan == 20.0 and s.busy == [20.0, 10.0, 0.0]  # worker 0 takes the third unit when it frees
    assert [(t, w, u.uid) for t, w, u in s.starts] == [(0.0, 0, 0), (0.0, 1, 1), (10.0, 0, 2)]
    assert (s.work_bound, s.memory_bound, s.longest) == (10.0, 15.0, 10.0)


def test_longest_first_and_a_unit_over_the_budget_runs_alone():
    # 2 workers, budget 10 GiB: 7 s (2 GiB), 5 s (20 GiB: over the budget, alone), 3 s (2 GiB), in that order.
    # t=0: the 7 s unit on worker 0; the 20 GiB unit does not fit beside it, the 3 s one does (worker 1, 0..3);
    # t=3: worker 1 idle, 20 GiB still does not fit; t=7: nothing runs, it starts alone: 7..12.
    s = simulate([_unit(0, 7, 2), _unit(1, 5, 20), _unit(2, 3, 2)], 2, 10 * GIB)
    assert [(t, w, u.uid) for t, w, u in s.starts] == [(0.0, 0, 0), (0.0, 1, 2), (7.0, 0, 1)]
    assert s.makespan == 12.0
    # the memory bound caps a unit's bytes at the budget (it runs alone): (7*2 + 5*10 + 3*2) / 10 = 7 s
    assert s.memory_bound == 7.0 and simulate([_unit(0, 10, 20)], 1, 10 * GIB).memory_bound == 10.0
    with pytest.raises(ValueError, match="jobs and budget must be >= 1"):
        simulate([], 0, GIB)
    assert simulate([], 4, GIB).makespan == 0.0


def test_memory_shares_by_path_and_shape():
    a = Case.make("nvfp4_grouped", "deepseek-v3", 64, "gaussian")
    b = Case.make("bf16_decode", "deepseek-v3", 1, "gaussian")
    units = [_unit(0, 10, 4, a), _unit(1, 2, 50, b), _unit(2, 5, 4, a), Unit(3, "mutation", [], 25.0, 0)]
    shares = memory_shares(units)
    assert shares == {"nvfp4_grouped/deepseek-v3": 60.0, "bf16_decode/deepseek-v3": 100.0, "mutation": 0.0}


def test_cli_on_a_report(tmp_path, capsys):
    """Two gpu-profile cases measured (one of them dropped with --without), the rest estimated; no measured cost
    or no budget: exit 2 with one line."""
    cases = matrix("gpu")
    a, b = cases[0], cases[1]
    env = {"gpu": "NVIDIA H200", "profile": "gpu", "invariance": True, "black_box": False,
           "parallel": {"device_memory_budget_bytes": 100 * GIB, "jobs": 3}}  # fmt: skip
    measured = [
        {"case_id": c.id, "meta": {"seconds": sec, "peak_reserved_bytes": 3 * GIB}} for c, sec in ((a, 9.0), (b, 4.0))
    ]
    rep = {"env": env, "cases": measured}
    path = tmp_path / "report.json"
    path.write_text(json.dumps(rep))
    assert main(["--report", str(path), "--without", b.id]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{len(cases) - 1} cases ({len(cases) - 2} without a measured cost)")
    assert "3 workers, budget 100.0 GiB" in out and "simulated makespan" in out and "memory-time" in out
    path.write_text(json.dumps({**rep, "env": {**env, "parallel": {}}}))
    assert main(["--report", str(path)]) == 2
    assert "no env.parallel budget recorded" in capsys.readouterr().err
    assert main(["--report", str(path), "--budget-gib", "50"]) == 0
    assert "8 workers, budget 50.0 GiB" in capsys.readouterr().out  # no jobs recorded: the H200 runs' 8
    assert main(["--report", str(path), "--budget-gib", "50", "--order", "area"]) == 0
    assert "simulated makespan" in capsys.readouterr().out
    assert main(["--report", str(path), "--jobs", "0"]) == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err
    path.write_text(json.dumps({**rep, "env": {**env, "gpu": None}}))
    assert main(["--report", str(path)]) == 2
    assert "no measured costs of a GPU run of profile gpu" in capsys.readouterr().err


def test_wall_line():
    assert wall_line(347.0, 4.0, 308.7, 12.5) == (
        "wall 347.0 s: start-up 21.8 s, set-up 4.0 s, cases 308.7 s, report 12.5 s"
    )
    assert wall_line(None, 1.0, 2.0, 3.0) == "wall: set-up 1.0 s, cases 2.0 s, report 3.0 s"
    age = process_seconds()
    assert age is None or age >= 0.0
