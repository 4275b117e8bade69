"""report.json structure checks (flint_moe.conformance.report.schema): a report as report.py writes it passes; a field
of the wrong type is named by its path in a one-line error."""

from __future__ import annotations

import copy
import json

import pytest

from flint_moe.conformance.report.report import report_dict
from flint_moe.conformance.report.schema import ReportSchemaError, validate_report
from tests.conformance._report_data import MUTATION, results

ENV = {"backend": "cpu", "git_commit": None, "profile": "cpu", "filters": [], "run_seconds": 1.5, "jobs": 1,
       "source_digest": {"algorithm": "a", "digest": "d", "dirs": ["x"], "files": {"x/a.py": "1"}}}  # fmt: skip
BASE = {"other": "o", "cases_compared": 1, "unchanged_cases": 0, "digest_changes": [], "outputs_only_here": [],
        "outputs_only_there": [], "cases_only_here": [], "cases_only_there": [], "sources_changed": None,
        "verdict_changes": [{"case_id": "c", "before": "EXACT", "after": "FAIL", "direction": "worse"}]}  # fmt: skip


def _report() -> dict:
    rep = report_dict(results(), ENV, mutation=MUTATION, baseline=BASE, gpu_report={"status": "MISSING", "line": "x"})
    return json.loads(json.dumps(rep))  # as loaded from report.json


def test_a_written_report_passes():
    validate_report(_report())
    validate_report({"cases": []})  # fields an older report lacks are not required


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(cases=[1, 2]), "field cases[0]: expected an object, got the integer 1"),
        (lambda r: r.update(cases={}), "field cases: expected a list, got an object"),
        (lambda r: r["cases"][1].update(case_id=7), "field cases[1].case_id: expected a string, got the integer 7"),
        (lambda r: r["cases"][0].pop("verdict"), "field cases[0].verdict: missing"),
        (lambda r: r["cases"][0].update(digests={"out": 5}),
         "field cases[0].digests['out']: expected a string, got the integer 5"),
        (lambda r: r["cases"][0].update(digests=["x"]), "field cases[0].digests: expected an object, got a list of 1"),
        (lambda r: r["cases"][2]["stages"][0].update(elements="many"),
         "field cases[2].stages[0].elements: expected an integer, got the string 'many'"),
        (lambda r: r["cases"][1]["stages"][1].update(max_ulp=True),
         'field cases[1].stages[1].max_ulp: expected a number (or "inf", "-inf", "nan"), got a boolean'),
        (lambda r: r["cases"][1]["stages"][1]["map"].update(grid=[65, 1]),
         "field cases[1].stages[1].map.grid: expected at most [64, 128], got the integer 65"),
        (lambda r: r["cases"][1]["stages"][1]["map"]["cells"].append([9, 0, 1]),
         "field cases[1].stages[1].map.cells[2]: expected a cell inside the grid [9, 64], got the integer 9"),
        (lambda r: r["cases"][1]["stages"][1].update(ulp_hist=[1, 2]),
         "field cases[1].stages[1].ulp_hist: expected a list of 33, got a list of 2"),
        (lambda r: r["cases"][1]["invariance"][0].update(name=None),
         "field cases[1].invariance[0].name: expected a string, got null"),
        (lambda r: r["cases"][3]["end_to_end"].update(causes={"interval": "4"}),
         "field cases[3].end_to_end.causes['interval']: expected an integer, got the string '4'"),
        (lambda r: r["cases"][0]["meta"].update(M="1"),
         "field cases[0].meta.M: expected an integer, got the string '1'"),
        (lambda r: r.update(env=[]), "field env: expected an object, got a list of 0"),
        (lambda r: r["env"].update(profile="tpu"),
         "field env.profile: expected 'cpu' or 'gpu' or 'gpu-full', got the string 'tpu'"),
        (lambda r: r["env"]["source_digest"].update(files=["x"]),
         "field env.source_digest.files: expected an object, got a list of 1"),
        (lambda r: r["env"]["source_digest"].update(digest=3),
         "field env.source_digest.digest: expected a string, got the integer 3"),
        (lambda r: r["env"].update(filters="bf16"), "field env.filters: expected a list, got the string 'bf16'"),
        (lambda r: r["mutation"]["results"][0].update(diagnosis=[1]),
         "field mutation.results[0].diagnosis[0]: expected a string, got the integer 1"),
        (lambda r: r["baseline"]["verdict_changes"][0].pop("after"),
         "field baseline.verdict_changes[0].after: missing"),
        (lambda r: r.update(totals=None), "field totals: expected an object, got null"),
    ],
)  # fmt: skip
def test_a_wrong_field_is_named(edit, message):
    rep = _report()
    edit(rep)
    with pytest.raises(ReportSchemaError) as e:
        validate_report(rep)
    assert str(e.value) == message and "\n" not in str(e.value)


def test_top_level_must_be_an_object_and_input_is_not_modified():
    with pytest.raises(ReportSchemaError, match=r"^field \(top level\): expected an object, got a list of 0$"):
        validate_report([])
    rep = _report()
    before = copy.deepcopy(rep)
    validate_report(rep)
    assert rep == before


def test_the_message_stays_one_short_line():
    """A long or multi-line value is shown as a repr cut at 40 characters; a long key likewise."""
    bad = {"cases": [{"case_id": "c", "verdict": "E", "meta": {"M": "x\n" * 50}}]}
    with pytest.raises(ReportSchemaError) as e:
        validate_report(bad)
    assert str(e.value) == "field cases[0].meta.M: expected an integer, got the string '" + "x\\n" * 20 + "'..."
    bad = {"cases": [{"case_id": "c", "verdict": "E", "digests": {"k\n" * 30: 1}}]}
    with pytest.raises(ReportSchemaError) as e:
        validate_report(bad)
    assert str(e.value) == "field cases[0].digests['" + "k\\n" * 20 + "']: expected a string, got the integer 1"
