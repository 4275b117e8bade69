"""conformance/run/parallel.py: units, memory-aware picking, and a two-worker run equal to the serial run."""

from __future__ import annotations

import torch

from flint_moe.conformance.inputs.cases import Case, matrix
from flint_moe.conformance.inputs.profiles import weight_key
from flint_moe.conformance.run import parallel
from flint_moe.conformance.run.parallel import GOLDEN_ALLOWANCE, Unit, estimate_bytes, pick_unit, plan_units


def test_units_group_cases_by_weights_in_matrix_order():
    cases = matrix("cpu")
    units = plan_units(cases, max_cases=3, max_seconds=1e9, mutation=True)
    assert sum(u.kind == "mutation" for u in units) == 1
    seen = []
    for u in units:
        if u.kind != "cases":
            continue
        assert 1 <= len(u.cases) <= 3
        keys = {weight_key(c) for _, c in u.cases}
        assert len(keys) == 1
        pos = [p for p, _ in u.cases]
        assert pos == sorted(pos)
        assert all(cases[p] is c for p, c in u.cases)
        seen += pos
    assert sorted(seen) == list(range(len(cases)))  # every case exactly once
    secs = [u.seconds for u in units]
    assert secs == sorted(secs, reverse=True)
    # pieces of one weight key: consecutive members of that key (cases with that key, in order, cut by 3)
    by_key: dict = {}
    for p, c in enumerate(cases):
        by_key.setdefault(weight_key(c), []).append(p)
    pieces = sorted(tuple(p for p, _ in u.cases) for u in units if u.kind == "cases")
    want = sorted(tuple(v[i : i + 3]) for v in by_key.values() for i in range(0, len(v), 3))
    assert pieces == want


def test_pick_unit_respects_the_memory_budget():
    big, mid, small = Unit(0, "cases", nbytes=70), Unit(1, "cases", nbytes=40), Unit(2, "cases", nbytes=10)
    pending = [big, mid, small]
    assert pick_unit(pending, [70], 100) is small  # big (140) and mid (110) do not fit beside 70
    assert pending == [big, mid]
    assert pick_unit(pending, [70, 40], 100) is None
    assert pick_unit(pending, [], 50) is big  # nothing running: the longest unit runs alone even if too big
    assert pick_unit(pending, [10], 50) is mid and pending == []


def test_estimate_bytes_of_the_decode_block():
    """ll_block / ll_module hold NVFP4 weights (codes + one E4M3 scale per 16), not BF16: the routed experts
    twice and the shared expert [2 SI, H] + [H, SI] with a swizzled copy of its scales."""
    p = 256 * 3 * 512 * 2048  # Ling-mini-2.0: E 256, I 512, H 2048
    shared = 3 * 512 * 2048  # SI 512
    for path in ("ll_block", "ll_module"):
        case = Case.make(path, "ling-mini-2.0", 1, "gaussian")
        assert estimate_bytes(case) == int(2 * 0.5625 * p) + int(0.625 * shared) + GOLDEN_ALLOWANCE
        assert estimate_bytes(case) == 905_969_664 + 1_966_080 + GOLDEN_ALLOWANCE


def test_estimate_bytes_by_path():
    bf16 = Case.make("bf16_decode", "deepseek-v3", 1, "gaussian")
    nv = Case.make("nvfp4_decode", "deepseek-v3", 1, "gaussian")
    p = 256 * 3 * 2048 * 7168  # E * (gate + up + down) * I * H
    assert estimate_bytes(bf16) == 4 * p + GOLDEN_ALLOWANCE  # bf16 stack + TRT-LLM copy, 2 bytes each
    assert estimate_bytes(nv) == int(2 * p * (0.5 + 1 / 16)) + GOLDEN_ALLOWANCE  # codes + E4M3 scales, twice
    padded = Case.make("nvfp4_decode", "gpt-oss-120b-p128", 1, "gaussian")
    assert estimate_bytes(padded) == int(2 * 128 * 3 * 2944 * 2880 * 0.5625) + GOLDEN_ALLOWANCE  # I 2880 -> 2944


def test_two_workers_equal_the_serial_run():
    from flint_moe.conformance.run.runner import run_case

    cases = [c for c in matrix("cpu") if c.id.endswith("/M1/gaussian/s0")][:2]
    assert len(cases) == 2 and cases[0].path != cases[1].path
    res, mut, info = parallel.run_parallel(cases, 2, "cpu", invariance=False)
    assert mut is None and info["jobs"] == 2 and info["units"] == 2
    assert [r["case_id"] for r in res] == [c.id for c in cases]
    # the timeline: each unit once, on a worker, handed out before it was reported done, its first case named
    assert info["timeline_fields"] == list(parallel.TIMELINE_FIELDS)
    rows = [dict(zip(info["timeline_fields"], e, strict=True)) for e in info["timeline"]]
    assert sorted(r["uid"] for r in rows) == [0, 1] and {r["worker"] for r in rows} <= {0, 1}
    assert all(0.0 <= r["start_s"] <= r["end_s"] for r in rows)
    assert sorted(r["first_case"] for r in rows) == sorted(c.id for c in cases)
    dev = torch.device("cpu")
    for case, got in zip(cases, res, strict=True):
        want = run_case(case, dev).to_json()
        assert got["verdict"] == want["verdict"]
        assert got["digests"] == want["digests"]  # bitwise the same outputs and taps
        assert [s["verdict"] for s in got["stages"]] == [s["verdict"] for s in want["stages"]]


def test_units_split_by_estimated_seconds():
    big = Case.make("nvfp4_grouped", "deepseek-v3", 2048, "gaussian")
    small = [Case.make("nvfp4_grouped", "deepseek-v3", m, "gaussian") for m in (1, 2)]
    est = {c.id: parallel.estimate_seconds(c) for c in [*small, big]}
    assert est[big.id] > 20.0 and est[small[0].id] + est[small[1].id] < 20.0  # hand check of the estimates
    units = plan_units([small[0], big, small[1]], max_cases=8, max_seconds=20.0)
    assert sorted([p for p, _ in u.cases] for u in units) == [[0], [1], [2]]  # the long case splits the run
    units = plan_units([small[0], small[1], big], max_cases=8, max_seconds=20.0)
    assert sorted([p for p, _ in u.cases] for u in units) == [[0, 1], [2]]


def test_decode_block_cases_are_one_unit_per_shape():
    # the CuTe DSL builds compile once per worker process: every block case of a shape in one unit, whatever the
    # estimates, cases sharing weights adjacent; the other paths split as before
    cases = [c for c in matrix("gpu") if c.path in parallel.COMPILE_ONCE_PATHS]
    assert {c.path for c in cases} == {"ll_block", "ll_module"} and len({c.shape for c in cases}) >= 4
    other = [Case.make("nvfp4_grouped", "deepseek-v3", m, "gaussian") for m in (1, 2)]
    units = plan_units(other + cases, max_cases=2, max_seconds=0.1)
    by_shape = {}
    for u in units:
        shapes = {c.shape for _, c in u.cases}
        assert len(shapes) == 1
        paths = {c.path for _, c in u.cases}
        if paths <= set(parallel.COMPILE_ONCE_PATHS):
            (shape,) = shapes
            assert shape not in by_shape  # one unit per shape
            by_shape[shape] = [c for _, c in u.cases]
        else:
            assert len(u.cases) == 1  # max_seconds 0.1 splits the others case by case
    assert {s: len(v) for s, v in by_shape.items()} == {s: sum(c.shape == s for c in cases) for s in by_shape}
    assert sum(len(v) for v in by_shape.values()) == len(cases)
    for members in by_shape.values():  # each weight key's cases adjacent, in matrix order
        keys = [weight_key(c) for c in members]
        assert all(k not in keys[:i] or keys[i - 1] == k for i, k in enumerate(keys))


def test_visible_gpus_and_slots(monkeypatch):
    assert parallel.visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3,,GPU-ab12"}) == ["2", "3", "GPU-ab12"]
    assert parallel.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert parallel.visible_gpus({}, device_count=4) == ["0", "1", "2", "3"]
    assert parallel.gpu_slots(6, 4) == [0, 1, 2, 3, 0, 1]
    assert parallel.gpu_slots(3, 1) == [0, 0, 0] == parallel.gpu_slots(3, 0)
    assert parallel.default_jobs("cpu", 8) == 1
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 128)
    assert parallel.default_jobs("cuda") == 8 and parallel.default_jobs("cuda", 2) == 16
    assert parallel.default_jobs("cuda", 8) == 64
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 16)
    assert parallel.default_jobs("cuda", 4) == 8


def test_visible_to_children_sets_and_restores(monkeypatch, tmp_path):
    """A worker is spawned while CUDA_VISIBLE_DEVICES names only its GPU (the child sees that value); the
    parent's value comes back."""
    import multiprocessing as mp
    import os

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    seen = tmp_path / "seen.txt"
    ctx = mp.get_context("spawn")
    with parallel.visible_to_children("5"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
        p = ctx.Process(target=os.system, args=(f'printf %s "$CUDA_VISIBLE_DEVICES" > {seen}',))
        p.start()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5"
    p.join(60)
    assert p.exitcode == 0 and seen.read_text() == "5"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with parallel.visible_to_children("1"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    with parallel.visible_to_children(None):
        assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_measured_costs_replace_the_estimates(tmp_path):
    """A GPU report's seconds and peak reserved bytes plan the units of the cases it has (the others keep the
    model); a CPU report, a missing file and junk give no measurements."""
    import json

    a, b, c = (Case.make("nvfp4_grouped", "deepseek-v3", m, "gaussian") for m in (1, 2, 3))
    gib = 1 << 30
    rep = {"env": {"gpu": "NVIDIA H200", "profile": "gpu", "invariance": True, "black_box": False}, "cases": [
        {"case_id": a.id, "meta": {"seconds": 30.0, "peak_reserved_bytes": 10 * gib}},
        {"case_id": b.id, "meta": {"seconds": 4.0}},  # an older report: seconds only
        {"case_id": "junk", "meta": {"seconds": "slow"}},
    ]}  # fmt: skip
    path = tmp_path / "report.json"
    path.write_text(json.dumps(rep))
    measured = parallel.measured_costs(path)
    assert measured == {a.id: (30.0, 10 * gib), b.id: (4.0, None)}
    units = plan_units([a, b, c], max_cases=8, max_seconds=20.0, measured=measured)
    by_first = {u.cases[0][1].id: u for u in units}
    # a alone (30 s measured > 20); b and c together: 4 s measured + c's estimate
    assert sorted([p for p, _ in u.cases] for u in units) == [[0], [1, 2]]
    assert by_first[a.id].seconds == 2.0 + 30.0
    assert by_first[b.id].seconds == 2.0 + 4.0 + parallel.estimate_seconds(c)
    assert by_first[a.id].nbytes == int(parallel.MEASURED_MARGIN * (10 * gib + parallel.CONTEXT_BYTES))
    assert by_first[b.id].nbytes == max(estimate_bytes(b), estimate_bytes(c))  # no peak measured for them
    assert units[0] is by_first[a.id]  # longest first, by the measured seconds
    path.write_text(json.dumps({**rep, "env": {**rep["env"], "gpu": None}}))
    assert parallel.measured_costs(path) == {}
    path.write_text("{not json")
    assert parallel.measured_costs(path) == {} == parallel.measured_costs(tmp_path / "missing.json")
    assert parallel.measured_costs(None) == {}


def _report(tmp_path, env: dict, cases: list) -> str:
    import json

    path = tmp_path / "report.json"
    path.write_text(json.dumps({"env": env, "cases": cases}))
    return str(path)


def test_measured_costs_only_from_a_report_of_this_kind(tmp_path):
    """Only a report of the same profile and GPU, with the invariances and not black-box, plans a run; cases retried
    after running out of device memory are left out."""
    env = {"gpu": "NVIDIA H200", "profile": "gpu", "invariance": True, "black_box": False}
    cases = [
        {"case_id": "a", "meta": {"seconds": 3.0, "peak_reserved_bytes": 7}},
        {"case_id": "b", "meta": {"seconds": 40.0, "peak_reserved_bytes": 9, "oom_retries": 2}},
        {"case_id": "c", "verdict": "NOT-JUDGED", "meta": {"oom_attempts": 4}},
        {"case_id": "d", "meta": {"seconds": 1.5}},
    ]
    path = _report(tmp_path, env, cases)
    assert parallel.measured_costs(path, profile="gpu", gpu="NVIDIA H200") == {"a": (3.0, 7), "d": (1.5, None)}
    assert parallel.measured_costs(path, profile="cpu", gpu="NVIDIA H200") == {}
    assert parallel.measured_costs(path, profile="gpu", gpu="NVIDIA H100 80GB HBM3") == {}
    for change in ({"invariance": False}, {"invariance": None}, {"black_box": True}, {"profile": "cpu"}):
        path = _report(tmp_path, {**env, **change}, cases)
        assert parallel.measured_costs(path, profile="gpu", gpu="NVIDIA H200") == {}, change


def test_worker_clears_every_cache_after_a_unit(monkeypatch):
    """At the end of each unit a worker empties the inputs' caches and the module paths' loaded modules."""
    import queue

    from flint_moe.conformance.inputs import block, pertoken, profiles
    from flint_moe.conformance.run import paths

    caches = (profiles._cache, block._cache, pertoken._cache, paths._MODULE, paths._BF16_MODULE, paths._LL_MODULE)
    for c in caches:
        c["probe"] = object()
    tasks, results = queue.Queue(), queue.Queue()
    tasks.put(Unit(0, "cases"))
    tasks.put(None)
    monkeypatch.setattr(parallel.signal, "signal", lambda *a: None)  # the worker's SIGINT handler: not in pytest
    parallel._worker(0, tasks, results, False, "cpu")
    assert results.get_nowait()[:3] == ("done", 0, 0)
    assert [len(c) for c in caches] == [0] * 6
