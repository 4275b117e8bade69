"""conformance.merge: shard reports joined into one equal the unsharded report up to timing fields, run ids and
command lines; every refusal (not a shard, other sources / profile / filters, a shard twice, overlapping
cases, missing shards) is one line and exit 2; a merged complete gpu-profile run is the GPU evidence as a
single run is, a lone shard never."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from flint_moe.conformance import __main__ as cli
from flint_moe.conformance.report import merge
from flint_moe.conformance.report.digest import check_report, source_digest

FILTER = ["--profile", "cpu", "--filter", "/M1/", "--filter", "/cpu-E", "--no-html"]  # 3 small cases, 3 weight sets
TIMING = {"seconds", "phase_seconds"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    assert cli.main([*FILTER, "--out", str(root / "all")]) == 0
    for k in (1, 2):
        assert cli.main([*FILTER, "--shard", f"{k}/2", "--out", str(root / f"s{k}")]) == 0
    return root


def _load(d: Path) -> dict:
    return json.loads((d / "report.json").read_text())


def _strip(case: dict) -> dict:
    c = copy.deepcopy(case)
    for k in TIMING:
        c.get("meta", {}).pop(k, None)
    return c


def test_shards_cover_the_selection(runs):
    a, s1, s2 = _load(runs / "all"), _load(runs / "s1"), _load(runs / "s2")
    ids = [c["case_id"] for c in a["cases"]]
    got = [c["case_id"] for c in s1["cases"]] + [c["case_id"] for c in s2["cases"]]
    assert sorted(got) == sorted(ids) and len(ids) == 3
    for s, k in ((s1, 1), (s2, 2)):
        sh = s["env"]["shard"]
        assert sh["index"] == k and sh["count"] == 2 and sh["selection_size"] == 3
        assert sh["cases"] == [c["case_id"] for c in s["cases"]]
    assert check_report(s1).status == "NOT-EVIDENCE"


def test_merged_equals_unsharded(runs, tmp_path, capsys):
    out = tmp_path / "merged"
    assert merge.main([str(runs / "s2"), str(runs / "s1"), "--out", str(out), "--no-html"]) == 0
    m, a = _load(out), _load(runs / "all")
    assert [c["case_id"] for c in m["cases"]] == [c["case_id"] for c in a["cases"]]  # matrix order
    assert [_strip(c) for c in m["cases"]] == [_strip(c) for c in a["cases"]]
    assert m["totals"] == a["totals"]
    skip = {"date_utc", "command", "run_seconds", "cases_run", "merged", "merged_utc", "shard"}
    assert {k: v for k, v in m["env"].items() if k not in skip} == {
        k: v for k, v in a["env"].items() if k not in skip
    }
    assert [s["index"] for s in m["env"]["merged"]] == [1, 2] and "shard" not in m["env"]
    assert m["env"]["cases_run"] == "3 of " + a["env"]["cases_run"].split(" of ")[1] + " (merged from 2 shards)"
    assert (out / "summary.md").is_file() and (out / "summary-full.md").is_file()
    assert "3 cases from 2 shards, 0 FAIL" in capsys.readouterr().out


def _refused(capsys, *args) -> str:
    assert merge.main([*map(str, args), "--no-html"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    return err


def _write(tmp_path: Path, name: str, rep: dict) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "report.json").write_text(json.dumps(rep))
    return d


def test_refusals(runs, tmp_path, capsys):
    s1, s2 = runs / "s1", runs / "s2"
    out = tmp_path / "out"
    assert "shard 2/2 missing" in _refused(capsys, s1, "--out", out)
    assert "given twice" in _refused(capsys, s1, s1, "--out", out)
    assert "not a shard report" in _refused(capsys, runs / "all", s1, "--out", out)
    other = _load(s2)
    other["env"]["source_digest"] = {**other["env"]["source_digest"], "digest": "0" * 64}
    assert "differ from" in _refused(capsys, s1, _write(tmp_path, "digest", other), "--out", out)
    other = _load(s2)
    other["env"]["filters"] = ["/M2/"]
    assert "filters" in _refused(capsys, s1, _write(tmp_path, "filters", other), "--out", out)
    other = _load(s2)
    other["env"]["profile"] = "gpu"
    assert "profile" in _refused(capsys, s1, _write(tmp_path, "profile", other), "--out", out)
    overlap = _load(s2)  # shard 2 also claims a case of shard 1
    first = _load(s1)["cases"][0]
    overlap["cases"].append(first)
    overlap["env"]["shard"]["cases"].append(first["case_id"])
    assert "overlapping shards" in _refused(capsys, s1, _write(tmp_path, "overlap", overlap), "--out", out)
    other = _load(s2)
    other["env"]["shard"]["count"] = 3
    assert "count" in _refused(capsys, s1, _write(tmp_path, "count", other), "--out", out)
    assert "no report.json" in _refused(capsys, s1, tmp_path / "nothing", "--out", out)
    assert not out.exists()  # nothing written by a refused merge


def test_merge_refuses_committed_evidence_for_a_cpu_merge(runs, capsys):
    err = _refused(capsys, runs / "s1", runs / "s2", "--out", "reports/h200")
    assert "committed GPU evidence" in err


def test_merged_gpu_run_is_evidence():
    """A merged complete gpu-profile GPU run of the current sources is CURRENT; one shard of it is not."""
    env = {"gpu": "NVIDIA H200", "profile": "gpu", "filters": [], "source_digest": source_digest()}
    shard = {"index": 1, "count": 2, "selection_digest": "x", "selection_size": 2, "cases": [], "mutation": True}
    single = {"env": {**env, "shard": shard}, "totals": {"FAIL": 0}, "cases": []}
    assert check_report(single).status == "NOT-EVIDENCE"
    assert "shard 1/2" in check_report(single).line
    merged = {"env": {**env, "merged": [{"index": 1}, {"index": 2}]}, "totals": {"FAIL": 0}, "cases": []}
    assert check_report(merged).status == "CURRENT"
