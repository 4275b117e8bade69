"""python -m flint_moe.conformance end to end with the kernel runs replaced by hand-built results: the three
report files, --baseline, the GPU-report freshness line (last line of the output and in summary.md), exit
status 1 on any FAIL, 2 for an unusable baseline."""

from __future__ import annotations

import json
import re

import pytest

from flint_moe.conformance import __main__ as cli
from flint_moe.conformance.report.digest import source_digest
from flint_moe.conformance.run import runner
from tests.conformance._report_data import ok_case

CASE = "nvfp4_decode/cpu-E6-H96-I64-k3/M1/gaussian/s0"


@pytest.fixture
def fake_run(monkeypatch):
    """run_case returns ok_case (ids of the real matrix), FAIL for ids in the first set returned, and raises
    for ids in the second."""
    fail: set[str] = set()
    raise_: set[str] = set()

    def run_case(case, device, counter=None, *, invariance=False, inputs=None, black_box=False):
        if case.id in raise_:
            raise RuntimeError("illegal memory access (simulated)")
        r = ok_case(int(case.M))
        r.case_id, r.path = case.id, case.path
        if case.id in fail:
            r.verdict = "FAIL"
            r.stages[1].verdict, r.stages[1].mismatches = "FAIL", 1
        return r

    monkeypatch.setattr(runner, "run_case", run_case)
    return fail, raise_


def _argv(tmp_path, *extra):
    return ["--profile", "cpu", "--filter", CASE, "--out", str(tmp_path / "out"), *extra]


def test_reports_freshness_and_baseline(tmp_path, fake_run, capsys, monkeypatch):
    from flint_moe.conformance.report import digest

    fixed = source_digest()  # one snapshot: the run must not see a source edited meanwhile (shared checkouts)
    monkeypatch.setattr(digest, "source_digest", lambda *a, **k: fixed)
    gpu = tmp_path / "h200" / "report.json"
    gpu.parent.mkdir()
    gpu.write_text(json.dumps({"env": {"source_digest": fixed, "git_commit": "c0ffee"}, "cases": []}))
    base = tmp_path / "base"
    base.mkdir()
    old = {"schema": "x", "env": {"git_commit": "old"}, "cases": [
        {"case_id": CASE, "verdict": "FAIL", "digests": {"out": "9" * 64, "taps.y": "a" * 64}}]}  # fmt: skip
    (base / "report.json").write_text(json.dumps(old))
    rc = cli.main(_argv(tmp_path, "--baseline", str(base), "--gpu-report", str(gpu)))
    assert rc == 0
    out_lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert out_lines[-1].startswith("GPU REPORT CURRENT (commit c0ffee")  # the run ends with the loud line
    assert any(
        "vs baseline" in ln and "1 verdict changes (0 worse), 1 output digests changed" in ln for ln in out_lines
    )
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json", "summary-full.md", "summary.md"]
    data = json.loads((out / "report.json").read_text())
    assert data["env"]["source_digest"] == fixed
    assert data["gpu_report"]["status"] == "CURRENT"
    b = data["baseline"]
    assert b["verdict_changes"] == [{"case_id": CASE, "before": "FAIL", "after": "WITHIN-BOUND", "direction": "better"}]
    assert [(d["output"], d["before"][:1], d["after"][:1]) for d in b["digest_changes"]] == [("out", "9", "0")]
    md = (out / "summary.md").read_text()
    assert "**GPU REPORT CURRENT (commit c0ffee" in md and "Vs baseline " in md
    assert "## Changes vs baseline" in (out / "summary-full.md").read_text()


def test_missing_gpu_report_is_said(tmp_path, fake_run, capsys):
    assert cli.main(_argv(tmp_path, "--gpu-report", str(tmp_path / "none" / "report.json"), "--no-html")) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("GPU REPORT MISSING (no committed GPU report")
    assert not (tmp_path / "out" / "report.html").exists()
    assert "**GPU REPORT MISSING" in (tmp_path / "out" / "summary.md").read_text()


def test_fail_exits_1(tmp_path, fake_run):
    fake_run[0].add(CASE)
    assert cli.main(_argv(tmp_path, "--no-html")) == 1
    assert json.loads((tmp_path / "out" / "report.json").read_text())["totals"]["FAIL"] == 1


def test_bad_baseline_exits_2_before_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "run_case", lambda *a, **k: pytest.fail("must not run cases"))
    assert cli.main(_argv(tmp_path, "--baseline", str(tmp_path / "nothing"))) == 2
    assert "no report.json there" in capsys.readouterr().err


def test_gpu_run_is_its_own_evidence(tmp_path, fake_run, monkeypatch, capsys):
    env = cli.environment()
    monkeypatch.setattr(cli, "environment", lambda: dict(env, gpu="NVIDIA H200", backend="triton-cuda (NVIDIA H200)"))
    assert cli.main(_argv(tmp_path, "--no-html", "--gpu-report", str(tmp_path / "none.json"))) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # a GPU run is judged by itself, and a filtered cpu-profile run is not the evidence
    assert last.startswith("GPU REPORT NOT EVIDENCE (profile 'cpu'; filtered (") and "1 cases (cpu profile)" in last


def test_mutation_flag_puts_the_kill_rate_in_the_report(tmp_path, fake_run, monkeypatch, capsys):
    from flint_moe.conformance.judge import mutation
    from tests.conformance._report_data import MUTATION

    monkeypatch.setattr(mutation, "self_test", lambda *a, **k: dict(MUTATION))
    assert cli.main(_argv(tmp_path, "--no-html", "--mutation")) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["mutation"] == MUTATION
    assert "Mutation kill rate: 50.0% (3 of 4" in (tmp_path / "out" / "summary.md").read_text()
    assert "Mutation kill rate: 50.0%" in capsys.readouterr().out
    assert cli.main(_argv(tmp_path, "--no-html", "--overwrite")) == 0  # cpu profile: mutation testing off by default
    assert "mutation" not in json.loads((tmp_path / "out" / "report.json").read_text())


def test_a_case_that_raises_is_a_fail_and_the_run_goes_on(tmp_path, fake_run, capsys):
    other = "nvfp4_decode/cpu-E6-H96-I64-k3/M3/heavy_tailed/s0"
    fake_run[1].add(CASE)
    argv = ["--profile", "cpu", "--filter", "cpu-E6-H96-I64-k3/M", "--out", str(tmp_path / "out"), "--no-html"]
    assert cli.main(argv) == 1
    cases = {c["case_id"]: c for c in json.loads((tmp_path / "out" / "report.json").read_text())["cases"]}
    assert cases[CASE]["verdict"] == "FAIL" and cases[other]["verdict"] == "WITHIN-BOUND"
    assert cases[CASE]["stages"] == [
        dict(
            cases[CASE]["stages"][0],
            stage="run",
            verdict="FAIL",
            note="raised RuntimeError: illegal memory access (simulated)",
        )
    ]
    assert "RuntimeError" in capsys.readouterr().out  # the traceback is printed
    md = (tmp_path / "out" / "summary-full.md").read_text()
    assert "- **run** FAIL: 0 of 0 elements; max ulp -; first failing []; note: raised RuntimeError" in md
    assert "no catalogued fault" not in md  # the diagnosis did not run
    short = (tmp_path / "out" / "summary.md").read_text()
    assert f"- **the run raised RuntimeError: illegal memory access (simulated)**: `{CASE}` (run:0)" in short


def test_rerun_failed_reruns_only_the_fails_and_merges(tmp_path, fake_run, monkeypatch):
    from flint_moe.conformance.report import digest

    fixed = source_digest()
    monkeypatch.setattr(digest, "source_digest", lambda *a, **k: fixed)
    other = "nvfp4_decode/cpu-E6-H96-I64-k3/M3/heavy_tailed/s0"
    fake_run[1].add(CASE)  # the first run: CASE raises (e.g. out of memory)
    first = tmp_path / "first"
    argv = ["--profile", "cpu", "--filter", "cpu-E6-H96-I64-k3/M", "--no-html"]
    assert cli.main([*argv, "--out", str(first)]) == 1
    before = json.loads((first / "report.json").read_text())
    assert {c["case_id"]: c["verdict"] for c in before["cases"]}[CASE] == "FAIL"
    fake_run[1].clear()
    ran = []
    real = runner.run_case
    monkeypatch.setattr(runner, "run_case", lambda case, *a, **k: ran.append(case.id) or real(case, *a, **k))
    second = tmp_path / "second"
    assert cli.main(["--rerun-failed", str(first), "--no-html", "--out", str(second)]) == 0
    assert ran == [CASE]  # only the failing case ran again
    after = json.loads((second / "report.json").read_text())
    assert [c["case_id"] for c in after["cases"]] == [c["case_id"] for c in before["cases"]]
    got = {c["case_id"]: c for c in after["cases"]}
    assert got[CASE]["verdict"] == "WITHIN-BOUND" and got[other] == {c["case_id"]: c for c in before["cases"]}[other]
    assert after["env"]["rerun"]["rerun_cases"] == [CASE]
    assert after["totals"]["FAIL"] == 0 and after["totals"]["cases"] == len(before["cases"])
    md = (second / "summary.md").read_text()
    assert "FAIL cases of the run of" in md
    assert f"s to rerun its 1 FAIL cases (1 worker process): `{CASE}`" in (second / "summary-full.md").read_text()


def test_rerun_failed_refuses_other_sources(tmp_path, monkeypatch, capsys):
    rep = tmp_path / "old"
    rep.mkdir()
    (rep / "report.json").write_text(json.dumps({"env": {"source_digest": {"digest": "0" * 64}}, "cases": []}))
    monkeypatch.setattr(runner, "run_case", lambda *a, **k: pytest.fail("must not run cases"))
    assert cli.main(["--rerun-failed", str(rep), "--out", str(tmp_path / "o")]) == 2
    assert "not the current sources" in capsys.readouterr().err


def test_cli_refusals_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "run_case", lambda *a, **k: pytest.fail("must not run cases"))
    assert cli.main(["--profile", "cpu", "--jobs", "abc", "--out", str(tmp_path / "o")]) == 2
    assert cli.main(["--profile", "cpu", "--jobs", "0", "--list"]) == 2
    err = capsys.readouterr().err
    assert "--jobs: expected a positive integer or auto, got 'abc'" in err and "got '0'" in err
    assert cli.main(["--checkpoint", str(tmp_path / "nothing"), "--layer", "3", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"--checkpoint {tmp_path / 'nothing'} --layer 3: ") and "Traceback" not in err


def test_rerun_failed_without_fails_says_so(tmp_path, fake_run, monkeypatch, capsys):
    from flint_moe.conformance.report import digest

    fixed = source_digest()
    monkeypatch.setattr(digest, "source_digest", lambda *a, **k: fixed)
    assert cli.main(_argv(tmp_path, "--no-html")) == 0
    capsys.readouterr()
    monkeypatch.setattr(runner, "run_case", lambda *a, **k: pytest.fail("must not run cases"))
    assert cli.main(["--rerun-failed", str(tmp_path / "out"), "--out", str(tmp_path / "o2")]) == 0
    assert "the report has no FAIL case, nothing to rerun" in capsys.readouterr().out


def test_baseline_with_no_common_case_is_said(tmp_path, fake_run, capsys):
    base = tmp_path / "base"
    base.mkdir()
    other = {"schema": "x", "env": {}, "cases": [{"case_id": "bf16_decode/x/M1/gaussian/s0", "verdict": "EXACT"}]}
    (base / "report.json").write_text(json.dumps(other))
    assert cli.main(_argv(tmp_path, "--no-html", "--baseline", str(base))) == 0
    out = capsys.readouterr().out
    assert "0 cases compared" in out and "nothing was compared" in out


def test_black_box_flag_runs_cases_without_taps(tmp_path, capsys):
    """--black-box: the real run of one cpu case, judged end to end only (report mode "black-box", no stages),
    recorded in env; such a report is never the GPU evidence."""
    from flint_moe.conformance.report.digest import check_report

    assert cli.main(_argv(tmp_path, "--black-box", "--no-html")) == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["env"]["black_box"] is True
    (c,) = data["cases"]
    assert c["case_id"] == CASE and c["mode"] == "black-box" and c["stages"] == []
    assert c["verdict"] in ("EXACT", "EXPLAINED") and c["end_to_end"]["mode"] == "black-box"
    data["env"].update(profile="gpu", gpu="NVIDIA H200", filters=[])  # even were it a gpu run
    assert "black-box mode" in check_report(data, current=data["env"]["source_digest"]).line


def test_malformed_baseline_or_rerun_report_exits_2_before_running(tmp_path, monkeypatch, capsys):
    """A report whose fields have the wrong types (here: ``cases`` of ints, a digest that is a number) is
    refused in one line naming the file and the field, before the first case runs."""
    monkeypatch.setattr(runner, "run_case", lambda *a, **k: pytest.fail("must not run cases"))
    base = tmp_path / "base"
    base.mkdir()
    (base / "report.json").write_text(json.dumps({"env": {}, "cases": [1, 2]}))
    assert cli.main(_argv(tmp_path, "--baseline", str(base))) == 2
    assert capsys.readouterr().err == (
        f"--baseline {base}: {base / 'report.json'} is not a conformance report: field cases[0]: "
        "expected an object, got the integer 1\n"
    )
    bad = {"env": {}, "cases": [{"case_id": CASE, "verdict": "FAIL", "digests": {"out": 3}}]}
    (base / "report.json").write_text(json.dumps(bad))
    assert cli.main(["--rerun-failed", str(base), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (
        f"--rerun-failed {base}: {base / 'report.json'} is not a conformance report: field cases[0].digests['out']: "
        "expected a string, got the integer 3\n"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def test_tampered_reports_reach_the_pages_as_text(tmp_path, fake_run, monkeypatch, capsys):
    """Strings of a --baseline report and of a --rerun-failed report (whose cases the merged report keeps) are
    escaped in summary.md and report.html and printed literally to the console."""
    from flint_moe.conformance.report import digest

    fixed = source_digest()
    monkeypatch.setattr(digest, "source_digest", lambda *a, **k: fixed)
    img = "<img src=x onerror=alert(1)>"
    fake_run[0].add(CASE)
    first = tmp_path / "first"
    argv = ["--profile", "cpu", "--filter", "cpu-E6-H96-I64-k3/M", "--no-mutation"]
    assert cli.main([*argv, "--no-html", "--out", str(first)]) == 1
    rep = json.loads((first / "report.json").read_text())
    kept = [c for c in rep["cases"] if c["case_id"] != CASE]
    kept[0]["verdict"] = img
    kept[1]["verdict"] = "[bold]odd[/]"
    kept[2]["diagnosis"] = ["[red]d[/]: why"]
    (first / "report.json").write_text(json.dumps(rep))
    fake_run[0].clear()
    capsys.readouterr()
    second = tmp_path / "second"
    assert cli.main(["--rerun-failed", str(first), "--out", str(second), "--baseline", str(first)]) == 0
    printed = capsys.readouterr().out
    assert "[bold]odd[/]" in printed and img in printed and "[red]d[/]" in printed  # the summary table, as they are
    html = (second / "report.html").read_text()
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    md = (second / "summary.md").read_text()
    assert re.findall(r"(?<!\\)<img", md) == [] and r"\<img src=x onerror=alert(1)\>" in md
    assert r"\[bold\]odd\[/\]" in md
    # vs the baseline (the first run): the rerun case got better
    assert f"| `{CASE}` | FAIL | **WITHIN-BOUND** | better |" in (second / "summary-full.md").read_text()


def test_cpu_run_refuses_a_gpu_baseline_before_running(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "run_case", lambda *a, **k: pytest.fail("must not run cases"))
    base = tmp_path / "h200"
    base.mkdir()
    gpu_env = {"gpu": "NVIDIA H200", "backend": "triton-cuda (NVIDIA H200)"}
    (base / "report.json").write_text(json.dumps({"schema": "x", "env": gpu_env, "cases": []}))
    assert cli.main(_argv(tmp_path, "--baseline", str(base))) == 2
    err = capsys.readouterr().err
    assert err == (
        f"--baseline {base}: that is a GPU report (triton-cuda (NVIDIA H200)); a CPU run can only be diffed against "
        "a CPU run (the two share no case and no rounding: nothing would be compared); pass the report of an "
        "earlier CPU run\n"
    )
    assert not (tmp_path / "out").exists()


def test_gpu_run_refuses_a_cpu_baseline(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "run_case", lambda *a, **k: pytest.fail("must not run cases"))
    env = cli.environment()
    monkeypatch.setattr(cli, "environment", lambda: dict(env, gpu="NVIDIA H200", backend="triton-cuda (NVIDIA H200)"))
    base = tmp_path / "cpu"
    base.mkdir()
    (base / "report.json").write_text(json.dumps({"schema": "x", "env": {"gpu": None}, "cases": []}))
    assert cli.main(_argv(tmp_path, "--baseline", str(base))) == 2
    assert "that is a CPU report (cpu); a GPU run can only be diffed against a GPU run" in capsys.readouterr().err



@pytest.mark.parametrize("state", ["current", "stale"])
def test_run_line_equals_the_standalone_check(tmp_path, fake_run, capsys, monkeypatch, state):
    """The run's last line and ``python -m flint_moe.conformance.digest --check REPORT`` print the same
    freshness line (incl. the gpu cases the report lacks), for a current and for a stale report."""
    from flint_moe.conformance.inputs.cases import matrix
    from flint_moe.conformance.report import digest

    fixed = source_digest()
    monkeypatch.setattr(digest, "source_digest", lambda *a, **k: fixed)
    old = fixed
    if state == "stale":
        old = json.loads(json.dumps(fixed))
        old["files"]["flint_moe/shapes.py"] = "0" * 64
        old["digest"] = "1" * 64
    gpu = tmp_path / "h200" / "report.json"
    gpu.parent.mkdir()
    lacking = [{"case_id": c.id} for c in matrix("gpu") if c.path != "nvfp4_dispatch"]
    gpu.write_text(json.dumps({"env": {"source_digest": old, "git_commit": "c0ffee", "profile": "gpu",
                                       "gpu": "NVIDIA H200"}, "totals": {"cases": len(lacking), "FAIL": 0},
                               "cases": lacking}))  # fmt: skip
    assert cli.main(_argv(tmp_path, "--no-html", "--gpu-report", str(gpu))) == 0
    run_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert digest.main(["--check", str(gpu)]) == 0
    check_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert run_line == check_line
    assert run_line.startswith("GPU REPORT " + state.upper())
    n = sum(c.path == "nvfp4_dispatch" for c in matrix("gpu"))
    assert run_line.endswith(f"; not run on the GPU: nvfp4_dispatch x{n} (of {len(matrix('gpu'))} gpu cases))")


def test_shape_and_route_options(tmp_path, fake_run, capsys):
    """--shape runs any shape (E,H,I,k[,SI] or a name), --route forces the routing; the ids rebuild; the run is
    marked as a selection (never the GPU evidence)."""
    from flint_moe.conformance.inputs.cases import Case

    assert cli.main(["--profile", "cpu", "--shape", "6,96,64,3,32", "--route", "count=2@2", "--list"]) == 0
    ids = capsys.readouterr().out.split()
    # both sides of the shape's decode limit, 2 (ops.decode_max_tokens(6, 3) = 6 // 3); M = 1 cannot send 2 tokens:
    # left out
    assert ids == [
        "nvfp4_decode/E6-H96-I64-k3/M2/gaussian/s0/r-count-2-2",
        "nvfp4_grouped/E6-H96-I64-k3/M3/gaussian/s0/r-count-2-2",
        "nvfp4_grouped/E6-H96-I64-k3/M64/gaussian/s0/r-count-2-2",
        "nvfp4_dispatch/E6-H96-I64-k3/M2/gaussian/s0/r-count-2-2",
        "nvfp4_dispatch/E6-H96-I64-k3/M3/gaussian/s0/r-count-2-2",
    ]  # fmt: skip
    assert all(Case.from_id(i).id == i for i in ids)
    assert cli.main(["--profile", "cpu", "--filter", "tied_logits", "--route", "last", "--list"]) == 0
    assert capsys.readouterr().out.split() == []  # tied_logits sets the routing itself
    argv = ["--profile", "cpu", "--shape", "cpu-E6-H96-I64-k3", "--filter", "nvfp4_dispatch/", "--filter", "M3",
            "--route", "experts=4", "--out", str(tmp_path / "out"), "--no-html"]  # fmt: skip
    assert cli.main(argv) == 0
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [c["case_id"] for c in data["cases"]] == ["nvfp4_dispatch/cpu-E6-H96-I64-k3/M3/gaussian/s0/r-experts-4"]
    assert data["env"]["filters"] == ["nvfp4_dispatch/", "M3", "--shape=cpu-E6-H96-I64-k3", "--route=experts=4"]
    capsys.readouterr()
    for bad, why in (
        (["--shape", "6,96"], "shape '6,96': expected a model name"),
        (["--route", "first=2"], "route 'first=2': expected experts=E1"),
        (["--route", "experts=9", "--filter", "cpu-E6-H96-I64-k3"], "--route experts=9: no selected case can hold it"),
    ):
        assert cli.main(["--profile", "cpu", "--list", *bad]) == 2
        assert capsys.readouterr().err.startswith(why)


@pytest.mark.parametrize(
    "text, why",
    [
        ("6,100,64,3", "H = 100 must be a multiple of 32"),
        ("6,112,64,3", "H = 112 must be a multiple of 32"),
        ("6,96,40,3", "I = 40 must be a multiple of 16"),
        ("6,96,48,3", "I = 48 must be a multiple of 64, or padded (a sizes name with -P64, e.g. E6-H96-I48-P64-k3)"),
        ("E6-H96-I48-P32-k3", "pad_to = 32 must be a multiple of 64"),
        ("20,96,64,17", "top_k = 17 must be at most 16"),
    ],
)
def test_shape_no_path_can_hold_is_refused(text, why, capsys):
    """--shape with sizes the NVFP4 layouts or kernels refuse exits 2 before the first case, naming the limit
    (instead of a case that FAILs with the layout's traceback)."""
    assert cli.main(["--profile", "cpu", "--list", "--shape", text]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"--shape {text}: the NVFP4 layouts and kernels cannot hold it: {why}"


def test_shape_problem_agrees_with_the_layouts():
    """Independent side: the production layout and the decode kernels' size check accept exactly the shapes
    shape_problem passes (E, k within the router's limits); every model shape and its scaled-down copy passes."""
    import torch

    from flint_moe.conformance.selection import shape_problem, shape_spec
    from flint_moe.kernels.nvfp4.gate_up import decode_sizes
    from flint_moe.layouts import FlintMoEWeights
    from flint_moe.shapes import MODEL_SHAPES

    for s in MODEL_SHAPES.values():
        assert shape_problem(shape_spec(s.name)) is None, s.name
        assert shape_problem(shape_spec(f"cpu-{s.name}")) is None, s.name
    fp8 = torch.float8_e4m3fn
    for h, i, pad in [(96, 64, None), (100, 64, None), (112, 64, None), (128, 64, None), (96, 40, None),
                      (96, 48, None), (96, 48, 64), (96, 48, 128), (96, 80, 64), (160, 192, None)]:  # fmt: skip
        spec = shape_spec(f"E2-H{h}-I{i}" + (f"-P{pad}" if pad else "") + "-k1")
        try:
            w = FlintMoEWeights.from_modelopt(
                torch.zeros(2, 2 * i, h // 2, dtype=torch.uint8), torch.ones(2, 2 * i, h // 16).to(fp8),
                torch.ones(2, 2), torch.zeros(2, h, i // 2, dtype=torch.uint8), torch.ones(2, h, i // 16).to(fp8),
                torch.ones(2), pad_intermediate_to=pad,
            )  # fmt: skip
            decode_sizes(w)
            held = True
        except ValueError:
            held = False
        assert held == (shape_problem(spec) is None), (h, i, pad, shape_problem(spec))


def test_real_size_shape_without_cuda_needs_force(tmp_path, fake_run, capsys, monkeypatch):
    """Without CUDA a --shape above 1 GiB of bf16 weights is refused before the first case (exit 2, naming its
    scaled-down copy); --force runs it; --list and the scaled-down copy are never refused."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    argv = ["--profile", "cpu", "--shape", "qwen3-30b-a3b", "--filter", "nvfp4_decode/", "--filter", "M1/",
            "--out", str(out), "--no-html"]  # fmt: skip
    assert cli.main(argv) == 2
    # 3 x 128 x 2048 x 768 bf16 values = 1,207,959,552 bytes > 2**30 = 1,073,741,824
    assert capsys.readouterr().out.split("\n")[0].startswith(
        "--shape qwen3-30b-a3b: a real-size layer (E=128, H=2048, I=768: 1.2 GB of bf16 weights) would run under "
        "the Triton interpreter without CUDA"
    )
    assert not out.exists()
    capsys.readouterr()
    assert cli.main(["--profile", "cpu", "--list", "--shape", "qwen3-30b-a3b"]) == 0
    assert cli.main(["--profile", "cpu", "--shape", "9000,256,256,3", "--filter", "M1/", "--out", str(out),
                     "--no-html"]) == 2  # fmt: skip
    assert "Run a smaller shape, or pass --force to run it anyway." in " ".join(capsys.readouterr().out.split())
    assert cli.main([*argv, "--force"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert [c["case_id"] for c in data["cases"]] == ["nvfp4_decode/qwen3-30b-a3b/M1/gaussian/s0"]


def test_every_model_shape_needs_force_on_the_cpu_and_its_copy_does_not():
    from flint_moe.conformance.selection import CPU_SHAPE_MAX_BYTES, cpu_size_problem, shape_cases, shape_spec
    from flint_moe.shapes import MODEL_SHAPES

    for name, s in MODEL_SHAPES.items():
        assert 6 * s.num_experts * s.hidden * s.intermediate > CPU_SHAPE_MAX_BYTES == 2**30
        assert f"Run its scaled-down copy, --shape cpu-{name}," in cpu_size_problem(name, shape_cases(shape_spec(name)))
        assert cpu_size_problem(f"cpu-{name}", shape_cases(shape_spec(f"cpu-{name}"))) is None
    # 6 x 96 x 1024 x 1024 = 603,979,776 bytes: within the limit; 6 x 96 x 2048 x 1024 = 2**30 + 2**30 / 8: above
    assert cpu_size_problem("96,1024,1024,3", shape_cases(shape_spec("96,1024,1024,3"))) is None
    assert cpu_size_problem("96,2048,1024,3", shape_cases(shape_spec("96,2048,1024,3"))) is not None


def test_tokens_option(tmp_path, fake_run, capsys):
    """--tokens runs the selected cases at other token counts: nvfp4_decode up to 32 tokens only, the BF16 decode
    paths up to 8, the grouped and dispatch paths at any count; filters see the new ids; the run records it as a
    selection."""
    argv = ["--profile", "cpu", "--shape", "cpu-E6-H96-I64-k3", "--tokens", "8,128,8", "--route", "count=128@5"]
    assert cli.main([*argv, "--list"]) == 0
    assert capsys.readouterr().out.split() == [  # M = 8 cannot send 128 tokens; decode paths take no M = 128
        "nvfp4_grouped/cpu-E6-H96-I64-k3/M128/gaussian/s0/r-count-128-5",
        "nvfp4_dispatch/cpu-E6-H96-I64-k3/M128/gaussian/s0/r-count-128-5",
    ]
    assert cli.main(["--profile", "cpu", "--shape", "6,96,64,3", "--tokens", "3,9", "--filter", "M3/", "--list"]) == 0
    assert capsys.readouterr().out.split() == [  # H = 96: no bf16_decode; dispatch M 2 and 3 both become M 3
        "nvfp4_decode/E6-H96-I64-k3/M3/gaussian/s0",
        "nvfp4_grouped/E6-H96-I64-k3/M3/gaussian/s0",
        "nvfp4_dispatch/E6-H96-I64-k3/M3/gaussian/s0",
    ]
    out = tmp_path / "out"
    assert cli.main([*argv, "--filter", "nvfp4_dispatch", "--out", str(out), "--no-html"]) == 0
    data = json.loads((out / "report.json").read_text())
    assert [c["case_id"] for c in data["cases"]] == ["nvfp4_dispatch/cpu-E6-H96-I64-k3/M128/gaussian/s0/r-count-128-5"]
    assert data["env"]["filters"] == ["nvfp4_dispatch", "--shape=cpu-E6-H96-I64-k3", "--route=count=128@5",
                                      "--tokens=8,128,8"]  # fmt: skip
    capsys.readouterr()
    for bad in ("0", "65537", "8,x", ""):
        assert cli.main(["--profile", "cpu", "--list", "--tokens", bad]) == 2
        assert capsys.readouterr().err.strip() == f"--tokens {bad}: expected token counts M[,M...], each in [1, 65536]"


def test_summary_table_never_wraps_a_case_id():
    """A case id is what --filter takes: on a console at least twice as wide as the id, the other columns fold
    and the id stays on one line; on a narrower one it folds like the rest."""
    from rich.console import Console

    r = ok_case(6)
    r.case_id = "nvfp4_grouped/deepseek-v3/M256/gaussian/s0/r-count-128-5/c-classic"
    r.diagnosis = ["gate_up_swapped: matches the reference with gate/up swapped (SwiGLU(up, gate))"]
    for width, whole in ((140, True), (110, False)):  # the id has 67 characters
        console = Console(width=width, record=True, color_system=None)
        console.print(cli.summary_table([r], console.width))
        lines = console.export_text().splitlines()
        assert any(r.case_id in ln for ln in lines) == whole
        assert max(len(ln) for ln in lines) <= width
