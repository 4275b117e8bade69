"""--baseline: verdict changes and every output whose digest changed (flint_moe.conformance.report.baseline)."""

from __future__ import annotations

import copy
import json

import pytest

from flint_moe.conformance.report.baseline import baseline_markdown, compare_reports, load_report
from flint_moe.conformance.report.report import report_dict
from tests.conformance._report_data import black_box_explained, fail_case, ok_case


def _pair():
    env = {"git_commit": "new", "source_digest": {"files": {"k/a.py": "1", "k/b.py": "2"}}}
    old_env = {"git_commit": "old", "date_utc": "2026-11-28T00:00:00+00:00", "backend": "triton-cuda (H200)",
               "source_digest": {"files": {"k/a.py": "1", "k/b.py": "0", "k/c.py": "3"}}}  # fmt: skip
    cur = report_dict([ok_case(1), fail_case(), ok_case(2, seed=1), black_box_explained()], env)
    old = copy.deepcopy(cur)
    old["env"] = old_env
    # case 0: unchanged. case 1 (FAIL now): was WITHIN-BOUND with another out digest. case 2: same verdict,
    # its taps.y digest differs and an output only the baseline had. case 3: only in this run. One old-only case.
    old["cases"][1]["verdict"] = "WITHIN-BOUND"
    old["cases"][1]["digests"]["out"] = "0" * 64
    old["cases"][2]["digests"]["taps.y"] = "b" * 64
    old["cases"][2]["digests"]["taps.gone"] = "c" * 64
    del old["cases"][3]
    old["cases"].append(dict(old["cases"][0], case_id="bf16_decode/old-only/M1/gaussian/s0"))
    return cur, old


def test_compare_reports_lists_every_change():
    cur, old = _pair()
    d = compare_reports(cur, old, "reports/base/report.json")
    assert d["other"] == "reports/base/report.json" and d["other_commit"] == "old"
    assert d["cases_compared"] == 3 and d["unchanged_cases"] == 1
    assert d["verdict_changes"] == [
        {"case_id": "nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0", "before": "WITHIN-BOUND", "after": "FAIL",
         "direction": "worse"}
    ]  # fmt: skip
    assert d["digest_changes"] == [
        {"case_id": "nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0", "output": "out", "before": "0" * 64,
         "after": "f" * 64},
        {"case_id": "nvfp4_decode/cpu-E6-H96-I64-k3/M2/gaussian/s1", "output": "taps.y", "before": "b" * 64,
         "after": "a" * 64},
    ]  # fmt: skip
    assert d["outputs_only_there"] == [
        {"case_id": "nvfp4_decode/cpu-E6-H96-I64-k3/M2/gaussian/s1", "output": "taps.gone"}
    ]
    assert d["outputs_only_here"] == []
    assert d["cases_only_here"] == ["bf16_decode/cpu-E6-H192-I192-k3/M2/asymmetric/s0"]
    assert d["cases_only_there"] == ["bf16_decode/old-only/M1/gaussian/s0"]
    assert d["sources_changed"] == ["k/b.py", "k/c.py"]


def test_direction_better_and_unknown():
    cur, old = _pair()
    cur["cases"][1]["verdict"] = "EXACT"
    assert compare_reports(cur, old)["verdict_changes"][0]["direction"] == "better"
    cur["cases"][1]["verdict"] = "CRASHED"
    assert compare_reports(cur, old)["verdict_changes"][0]["direction"] == "changed"


def test_identical_reports_have_no_changes():
    cur, _ = _pair()
    d = compare_reports(cur, copy.deepcopy(cur))
    assert d["verdict_changes"] == d["digest_changes"] == d["cases_only_here"] == d["cases_only_there"] == []
    assert d["unchanged_cases"] == d["cases_compared"] == 4 and d["sources_changed"] == []


def test_markdown():
    cur, old = _pair()
    lines = baseline_markdown(compare_reports(cur, old, "base"), limit=1)
    text = "\n".join(lines)
    assert lines[0] == "## Changes vs baseline `base`"
    assert "Baseline: commit `old`, run 2026-11-28T00:00:00+00:00; 3 cases compared, 1 with identical" in text
    assert "Kernel / golden-model sources changed since the baseline: k/b.py, k/c.py." in text
    assert "| `nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0` | WITHIN-BOUND | **FAIL** | worse |" in text
    assert "Outputs whose digest changed: 2:" in text
    assert "- `nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0` out: `000000000000` -> `ffffffffffff`" in text
    assert "- ... and 1 more (report.json `baseline.digest_changes`)" in text
    assert "- cases only in this run (1): `bf16_decode/cpu-E6-H192-I192-k3/M2/asymmetric/s0`" in text


def test_load_report(tmp_path):
    cur, _ = _pair()
    (tmp_path / "r").mkdir()
    (tmp_path / "r/report.json").write_text(json.dumps(cur))
    data, where = load_report(tmp_path / "r")
    assert data == cur and where.endswith("r/report.json")
    assert load_report(tmp_path / "r/report.json")[0] == cur
    with pytest.raises(FileNotFoundError, match="no report.json"):
        load_report(tmp_path / "missing")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_report(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"schema": "x"}))
    with pytest.raises(ValueError, match="no 'cases' list"):
        load_report(tmp_path / "other.json")


def test_load_report_checks_the_structure(tmp_path):
    """A report whose fields have the wrong types is refused on load, naming the argument, the file and the
    field (what compare_reports and the --rerun-failed merge would otherwise trip over after the run)."""
    cur, _ = _pair()
    bad = tmp_path / "r" / "report.json"
    bad.parent.mkdir()
    for edit, field in (
        (lambda r: r.update(cases=[1, 2]), "field cases[0]: expected an object, got the integer 1"),
        (lambda r: r["cases"][0].update(digests={"out": None}), "field cases[0].digests['out']: expected a string"),
        (lambda r: r["env"]["source_digest"].update(files=[]), "field env.source_digest.files: expected an object"),
    ):
        rep = copy.deepcopy(cur)
        edit(rep)
        bad.write_text(json.dumps(rep))
        with pytest.raises(ValueError) as e:
            load_report(tmp_path / "r", flag="--rerun-failed")
        msg = str(e.value)
        assert msg.startswith(f"--rerun-failed {tmp_path / 'r'}: {bad} is not a conformance report: {field}")
        assert "\n" not in msg


def test_markdown_escapes_the_baseline_strings():
    cur, old = _pair()
    old["cases"][1]["verdict"] = "<img src=x onerror=alert(1)>"
    old["env"].update(git_commit="a|b", backend="*x*")
    d = compare_reports(cur, old, "base|dir")
    text = "\n".join(baseline_markdown(d))
    assert text.startswith("## Changes vs baseline base\\|dir\n")
    assert "Baseline: commit a\\|b, run 2026-11-28T00:00:00+00:00;" in text and "Baseline backend: \\*x\\*." in text
    assert (
        "| `nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0` | \\<img src=x onerror=alert(1)\\> | **FAIL** "
        "| changed |" in text
    )


def test_check_same_device():
    from flint_moe.conformance.report.baseline import check_same_device, run_device

    gpu = {"env": {"gpu": "NVIDIA H200", "backend": "triton-cuda (NVIDIA H200)"}, "cases": []}
    cpu = {"env": {"gpu": None, "backend": "triton-interpreter (CPU)"}, "cases": []}
    assert [run_device(r["env"]) for r in (gpu, cpu)] == ["gpu", "cpu"] and run_device({}) == "cpu"
    check_same_device(cpu["env"], cpu, "a")  # same kind: no error
    check_same_device(gpu["env"], gpu, "a")
    with pytest.raises(ValueError, match=r"^--baseline reports/h200: that is a GPU report \(triton-cuda \(NVIDIA "
                       r"H200\)\); a CPU run can only be diffed against a CPU run"):  # fmt: skip
        check_same_device(cpu["env"], gpu, "reports/h200")
    with pytest.raises(ValueError, match=r"^--baseline x: that is a CPU report \(triton-interpreter \(CPU\)\); a GPU "
                       r"run can only be diffed against a GPU run"):  # fmt: skip
        check_same_device(gpu["env"], cpu, "x")
