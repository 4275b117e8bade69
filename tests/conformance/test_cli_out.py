"""``--out``: checked before the first case (an existing file, a path under a file, a non-empty directory without
``--overwrite``, the committed GPU evidence from a run that is not a complete gpu-profile GPU run), unique run
ids, the staging directory renamed onto ``--out``, and paths printed literally by rich."""

from __future__ import annotations

import datetime
import json
import types

import pytest

from flint_moe.conformance import __main__ as cli
from flint_moe.conformance.run import outdir, runner
from flint_moe.conformance.run.outdir import RunKind, evidence_guard
from tests.conformance._report_data import ok_case

CASE = "nvfp4_decode/cpu-E6-H96-I64-k3/M1/gaussian/s0"


@pytest.fixture
def no_run(monkeypatch):
    monkeypatch.setattr(runner, "run_case", lambda *a, **k: pytest.fail("must not run cases"))


@pytest.fixture
def fake_run(monkeypatch):
    def run_case(case, device, counter=None, *, invariance=False, inputs=None, black_box=False):
        r = ok_case(int(case.M))
        r.case_id, r.path = case.id, case.path
        return r

    monkeypatch.setattr(runner, "run_case", run_case)


def _argv(out, *extra):
    return ["--profile", "cpu", "--filter", CASE, "--out", str(out), "--no-html", *extra]


def test_out_that_is_a_file_is_refused_before_running(tmp_path, no_run, capsys):
    f = tmp_path / "report.json"
    f.write_text("{}")
    assert cli.main(_argv(f)) == 2
    assert capsys.readouterr().err == f"--out {f}: exists and is not a directory\n"
    assert cli.main(_argv(f / "sub")) == 2
    assert capsys.readouterr().err == f"--out {f / 'sub'}: cannot be created: {f} is not a directory\n"
    assert f.read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_non_empty_out_needs_overwrite_and_keeps_other_files(tmp_path, fake_run, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("notes")
    (out / "report.html").write_text("stale")
    (out / "logs").mkdir()
    (out / "logs" / "run.log").write_text("log")
    assert cli.main(_argv(out)) == 2
    assert capsys.readouterr().err == f"--out {out}: directory not empty (pass --overwrite to replace its report)\n"
    assert cli.main(_argv(out, "--overwrite")) == 0
    # the report files are the new run's (no report.html: --no-html); the other files stay
    names = ["README.md", "logs", "report.json", "summary-full.md", "summary.md"]
    assert sorted(p.name for p in out.iterdir()) == names
    assert (out / "README.md").read_text() == "notes" and (out / "logs" / "run.log").read_text() == "log"
    assert [c["case_id"] for c in json.loads((out / "report.json").read_text())["cases"]] == [CASE]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or old directory left


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    """A repository root with committed evidence in reports/h200 and reports/gpu/h200-x."""
    root = tmp_path / "repo"
    for d in ("reports/h200", "reports/gpu/h200-x"):
        (root / d).mkdir(parents=True)
        (root / d / "report.json").write_text('{"cases": []}')
    monkeypatch.setattr(outdir, "_root", lambda: root)
    return root


def test_committed_evidence_is_refused_to_cpu_and_partial_runs(fake_root, tmp_path, no_run, monkeypatch, capsys):
    ev = fake_root / "reports" / "h200"
    (tmp_path / "link").symlink_to(ev)
    for out in (ev, fake_root / "reports/gpu/new", fake_root / "reports/gpu/h200-x", fake_root / "reports/x/../h200",
                tmp_path / "link", ev / "sub"):  # fmt: skip
        assert cli.main(_argv(out, "--overwrite")) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"--out {out}: refused: {ev if 'gpu' not in str(out) else fake_root / 'reports/gpu'} "
                              "holds committed GPU evidence, which only a complete gpu-profile run on a GPU may "
                              "replace (even with --overwrite); this run is a CPU run (Triton interpreter), profile "
                              f"'cpu', filtered ({CASE}), --no-html. Choose another --out.")  # fmt: skip
    monkeypatch.chdir(fake_root)
    assert cli.main(_argv("reports/h200")) == 2  # relative to the working directory, resolved
    assert capsys.readouterr().err.startswith(f"--out reports/h200: refused: {ev} holds committed GPU evidence")
    # a gpu-profile run on a GPU that is not complete is refused as well
    env = dict(cli.environment(), gpu="NVIDIA H200", backend="triton-cuda (NVIDIA H200)")
    monkeypatch.setattr(cli, "environment", lambda: dict(env))
    monkeypatch.setattr(cli, "_compiled_cuda", lambda: True)
    for extra, why in ((["--filter", "qwen3"], "filtered (qwen3), --no-mutation"),
                       (["--no-invariance"], "--no-invariance, --no-mutation")):  # fmt: skip
        assert cli.main(["--profile", "gpu", "--force", "--no-mutation", *extra, "--out", "reports/h200"]) == 2
        assert capsys.readouterr().err.endswith(f"; this run is {why}. Choose another --out.\n")
    assert (ev / "report.json").read_text() == '{"cases": []}' and sorted(p.name for p in ev.iterdir()) == [
        "report.json"
    ]


def test_evidence_guard_lets_a_complete_gpu_run_through(fake_root, tmp_path):
    complete = RunKind(gpu=True, profile="gpu")
    evidence_guard(fake_root / "reports/h200", complete)
    evidence_guard(fake_root / "reports/gpu/shard-merge", complete)
    evidence_guard(tmp_path / "elsewhere", RunKind(gpu=False, profile="cpu", partial=("--black-box",)))
    with pytest.raises(ValueError, match=r"this run is --rerun-failed\. Choose"):
        evidence_guard(fake_root / "reports/h200", RunKind(gpu=True, profile="gpu", partial=("--rerun-failed",)))


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, fake_run, monkeypatch):
    fixed = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)
    clock = types.SimpleNamespace(UTC=datetime.UTC, datetime=types.SimpleNamespace(now=lambda tz=None: fixed))
    monkeypatch.setattr(cli, "datetime", clock)
    monkeypatch.chdir(tmp_path)
    argv = ["--profile", "cpu", "--filter", CASE, "--no-html"]
    assert cli.main(argv) == 0 and cli.main(argv) == 0
    runs = sorted((tmp_path / "reports").iterdir())
    assert len(runs) == 2 and all(p.name.startswith("20261201T120000Z-cpu-") for p in runs)
    assert all((p / "report.json").is_file() for p in runs)


def test_markup_in_paths_is_printed_literally(tmp_path, fake_run, capsys):
    """A ``[/]`` in --out crashed rich's markup parser and ``[bold]`` was swallowed: both are printed as given."""
    out = tmp_path / "a[/]b[bold]c:smile:"
    assert cli.main(_argv(out)) == 0
    printed = capsys.readouterr().out
    assert f"report -> {out}\n" in printed and (out / "report.json").is_file()
