"""summary.md content from hand-built CaseResults (flint_moe.conformance.report.summary): the table values,
failure details, invariance findings, mutation kill rate, black-box label, EXPLAINED section and the GPU-report
freshness line."""

from __future__ import annotations

from flint_moe.conformance.report import summary as sm, summary_full as sf
from tests.conformance._report_data import MUTATION, black_box_explained, fail_case, ok_case, results

ENV = {"backend": "triton-interpreter (CPU)", "git_commit": "abc123", "date_utc": "2026-11-29T20:00:00+00:00",
       "cases_run": "5 of 20", "profile": "cpu", "command": "python -m flint_moe.conformance",
       "source_digest": {"algorithm": "sha256/ast-canonical-v1", "digest": "0123456789abcdef" * 4, "dirs": ["a"],
                         "files": {"a/x.py": "1" * 64}}}  # fmt: skip
FRESH = {"status": "STALE", "line": "GPU REPORT STALE since flint_moe/kernels/router.py changed (commit x)"}


def _table_rows(md: str) -> dict[tuple[str, str, str], list[str]]:
    """The main table (the lines after its header up to the first blank line), keyed by (path, shape, M)."""
    lines = md.splitlines()
    start = lines.index(next(ln for ln in lines if ln.startswith("| path | shape | M | cases |"))) + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("| "):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[tuple(cells[:3])] = cells[3:]
    return rows


def test_table_values():
    md = sf.full_summary_markdown(results(), ENV, mutation=MUTATION, gpu_report=FRESH)
    rows = _table_rows(md)
    assert len(rows) == 5
    ok = rows[("nvfp4\\_decode", "cpu-E6-H96-I64-k3", "1")]
    # 1 case; exact %: (5 + 96) of (6 + 96) elements; max ulp over bits stages: 0; worst accumulation router_acc.
    assert ok == ["1", "**WITHIN-BOUND**", f"{100 * 101 / 102:.2f}", "0",
                  "router\\_acc 1.25% of its bound (1.5 ulp)", "-", "0", "-", "-"]  # fmt: skip
    bad = rows[("nvfp4\\_decode", "cpu-E6-H96-I64-k3", "3")]
    # exact %: (500 + 574) of 1152; failures: the case's profile/seed with act:2 and the failed invariance.
    assert bad[:7] == ["1", "**FAIL**", f"{100 * 1074 / 1152:.2f}", "3", "gate\\_acc 50% of its bound (40 ulp)", "-",
                       "1"]  # fmt: skip
    assert bad[7] == "`tied_logits/s0` act:2, row\\_independence"
    assert bad[8] == "determinism:ok row:FAIL(1) batch:meas"
    bb = rows[("bf16\\_decode (black-box)", "cpu-E6-H192-I192-k3", "2")]
    # black-box: exact % over the end-to-end output (380 of 384), labelled in the path column.
    assert bb[1] == "**EXPLAINED**" and bb[2] == f"{100 * 380 / 384:.2f}" and bb[5] == "EXPLAINED 4 diff, 0 unexpl."
    assert "Totals: EXACT 0, WITHIN-BOUND 3, EXPLAINED 1, FAIL 1 (of 5 cases); 1 black-box" in md


def test_table_aggregates_path_shape_m():
    more = [ok_case(3), fail_case(), ok_case(3, seed=1)]
    more[2].stages[0].max_bound_fraction = 0.75  # the worst accumulation of the group, below in ulps
    more[2].stages[0].max_err_ulps = 7.0
    rows = _table_rows(sf.full_summary_markdown(more, {}))
    assert list(rows) == [("nvfp4\\_decode", "cpu-E6-H96-I64-k3", "3")]
    row = rows[("nvfp4\\_decode", "cpu-E6-H96-I64-k3", "3")]
    # exact %: (15 + 288) * 2 + 500 + 574 of (18 + 288) * 2 + 1152.
    assert row[:5] == ["3", "**FAIL** (2 WITHIN-BOUND, 1 FAIL)", f"{100 * (606 + 1074) / (612 + 1152):.2f}", "3",
                       "router\\_acc 75% of its bound (7 ulp)"]  # fmt: skip
    assert row[6:] == ["1", "`tied_logits/s0` act:2, row\\_independence", "determinism:ok row:FAIL(1) batch:meas"]


def test_header_lines_in_order():
    md = sf.full_summary_markdown(results(), ENV, mutation=MUTATION, gpu_report=FRESH)
    lines = md.splitlines()
    assert lines[0] == "# flint-moe conformance: full tables"
    assert lines[2].startswith("**Backend: triton-interpreter (CPU).**")
    assert lines[4] == (
        "Run: 2026-11-29T20:00:00+00:00; cases 5 of 20 of profile `cpu`; commit `abc123`; sources "
        "`0123456789ab`; command `python -m flint_moe.conformance`."
    )
    assert lines[6] == "**GPU REPORT STALE since flint\\_moe/kernels/router.py changed (commit x)**"
    assert lines[10] == (
        "Mutation kill rate: 50.0% (3 of 4 catalogued faults failed the case, 2 named by the diagnosis); "
        "missed: act\\_rounded\\_twice, no\\_epsilon."
    )
    # the env's source digest is one line, not the per-file dict
    assert "- source\\_digest: " + "0123456789abcdef" * 4 + " (sha256/ast-canonical-v1, 1 file: under a)" in lines


def test_env_digest_line_names_the_files_outside_the_directories():
    """The digest's single files (flint_moe/shapes.py) are named beside its directories, never hidden in the count."""
    files = {"p/k/a.py": "1", "p/r/b.py": "2", "p/shapes.py": "3", "p/kx.py": "4"}
    env = {"source_digest": {"digest": "d" * 64, "algorithm": "alg", "dirs": ["p/k", "p/r"], "files": files}}
    assert sf._env_lines(env) == [
        "- source\\_digest: " + "d" * 64 + " (alg, 4 files: under p/k, p/r, and p/shapes.py, p/kx.py)"
    ]


def test_failure_details_invariances_and_explained():
    md = sf.full_summary_markdown(results(), ENV, mutation=MUTATION)
    fails = md.split("## Failures")[1].split("## Explained differences")[0]
    assert "### `nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0`: FAIL" in fails
    assert "- **diagnosis**: act\\_rounded\\_twice: matches the reference with act rounded twice" in fails
    assert "- **act** FAIL: 2 of 576 elements; max ulp 3; first failing [[0, 1, 2], [2, 0, 63]]" in fails
    assert "WARNING elements 1, worst [1, 2, 3]: 40 ulp, 12.5x estimate" in fails
    assert "- **invariance row\\_independence** FAIL: row 1 differs in out" in fails
    assert fails.count("### ") == 1  # only the failing case (no other has warnings)
    expl = md.split("## Explained differences")[1].split("## Invariances")[0]
    assert "1 case(s) differ" in expl and ": interval 4." in expl
    assert "- `bf16_decode/cpu-E6-H192-I192-k3/M2/asymmetric/s0`: 4 of 384 elements, max ulp 1, interval 4" in expl
    inv = md.split("## Invariances")[1].split("## Mutation testing")[0]
    assert "**row\\_independence FAIL**: row 1 differs in out" in inv
    assert "Batch invariance: 1 of 3 token rows bitwise equal alone vs in the batch (1 cases)." in inv
    mut = md.split("## Mutation testing")[1].split("## Environment")[0]
    assert "| no\\_epsilon | path | `c2` | **no** | **no** | WITHIN-BOUND | - |" in mut
    assert "| gate\\_up\\_swapped | weights | `c1` | yes | yes | FAIL | gate\\_up\\_swapped |" in mut


def test_no_failures_no_optional_sections():
    md = sf.full_summary_markdown([ok_case(1)], {"backend": "cpu"})
    assert "## Failures\n\nNone." in md
    for absent in ("## Explained", "## Invariances", "## Mutation", "## Changes vs baseline", "GPU REPORT"):
        assert absent not in md


def test_end_to_end_failure_details_rendered():
    c = black_box_explained()
    c["verdict"] = "FAIL"
    c["end_to_end"].update(verdict="FAIL", explained=3, unexplained=1, first_failures=[[1, 191]],
                           failure_details=[{"index": [1, 191], "kernel": 1.5, "golden": 1.25, "lo": 1.0,
                                             "hi": 1.375, "why": "outside the propagated interval"}])  # fmt: skip
    md = sf.full_summary_markdown([c], {"backend": "cpu"})
    row = _table_rows(md)[("bf16\\_decode (black-box)", "cpu-E6-H192-I192-k3", "2")]
    assert row[1] == "**FAIL**" and row[7] == "`asymmetric/s0` end-to-end:1"
    assert "- **end to end** (black-box) FAIL: 4 of 384 output elements differ" in md
    assert "3 explained, 1 unexplained" in md and "first unexplained: [[1, 191]]" in md
    assert "[1, 191]: kernel 1.5, golden 1.25, interval [1, 1.38]: outside the propagated interval" in md


def test_invariance_only_failure_claims_no_diagnosis():
    c = ok_case(2).to_json()
    c["verdict"] = "FAIL"
    c["invariance"] = [{"name": "determinism", "required": True, "outcome": "FAIL", "note": "run 2 differs"}]
    md = sf.full_summary_markdown([c], {"backend": "cpu"})
    assert "- **invariance determinism** FAIL: run 2 differs" in md and "no catalogued fault" not in md
    c["stages"][1]["verdict"] = "FAIL"
    assert "- **diagnosis**: no catalogued fault reproduces the kernel's output" in sf.full_summary_markdown([c], {})


def test_mutation_line_all_caught_and_untested():
    caught = [{"fault": f, "killed": True, "named": True} for f in ("a", "b")]
    m = {"killed": 2, "named": 2, "total": 2, "kill_rate": 1.0, "untested": ["nibble_swap"], "results": caught}
    assert sm.mutation_line(m) == (
        "Mutation kill rate: 100.0% (2 of 2 catalogued faults failed the case, 2 named by the diagnosis); every "
        "catalogued fault caught. Catalogued faults without a mutation: nibble_swap."
    )
    assert sm.mutation_line(None) is None


def test_run_line_says_when_the_checkout_had_local_changes():
    from flint_moe.conformance.report.summary import _run_line

    line = _run_line({"git_commit": "abc123", "git_dirty": ["a", "b"]})
    assert "commit `abc123` plus local changes to 2 files" in line
    one = _run_line({"git_commit": "abc123", "git_dirty": ["a"]})
    assert one.endswith("commit `abc123` plus local changes to 1 file.")
    assert "local changes" not in _run_line({"git_commit": "abc123", "git_dirty": []})
    assert "local changes" not in _run_line({"git_commit": "abc123", "git_dirty": None})


def test_strings_from_a_loaded_report_make_no_markdown():
    """Every string field of a (tampered) report reaches summary.md escaped: a table row stays one row of 12
    cells, and no raw HTML tag, link or emphasis survives."""
    import re

    c = fail_case()
    c.update(case_id="nvfp4_decode/s|x/M3/p`q/s0\n# h", path="p|[l](u)", diagnosis=["*bold*: [x](javascript:1)"])
    c["meta"].update(shape="sh|ape")
    c["stages"][1].update(stage="a_ct|", note="n<b>")
    c["invariance"][1].update(name="row_|x", note="</td>")
    odd = dict(ok_case(1).to_json(), verdict="<img src=x onerror=alert(1)>")
    env = {"backend": "cpu <b>", "git_commit": "c`1", "command": "x | y", "filters": ["[/]"], "incomplete": "**x**"}
    md = sf.full_summary_markdown([c, odd], env, gpu_report={"line": "GPU REPORT <i>x</i>"})
    assert re.findall(r"(?<!\\)[<>]", md) == [] and re.findall(r"(?<!\\)\]\(", md) == []
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("| path")]
    assert rows == [
        rf"| p\|\[l\](u) | sh\|ape | 3 | 1 | **FAIL** | {100 * 1074 / 1152:.2f} | 3 "
        r"| gate\_acc 50% of its bound (40 ulp) | - | 1 | p\`q/s0 \# h a\_ct\|:2, row\_\|x "
        r"| determinism:ok row:FAIL(1) batch:meas |",
        rf"| nvfp4\_decode | cpu-E6-H96-I64-k3 | 1 | 1 | **\<img src=x onerror=alert(1)\>** | {100 * 101 / 102:.2f} "
        r"| 0 | router\_acc 1.25% of its bound (1.5 ulp) | - | 0 | - | - |",
    ]
    assert r"### nvfp4\_decode/s\|x/M3/p\`q/s0 \# h: FAIL" in md
    assert r"- **diagnosis**: \*bold\*: \[x\](javascript:1)" in md and r"; note: n\<b\>" in md
    assert r"**Backend: cpu \<b\>.**" in md and r"commit c\`1; command x \| y." in md
    assert r"**INCOMPLETE RUN: \*\*x\*\*** (the cases" in md and r"**GPU REPORT \<i\>x\</i\>**" in md
    assert r"- filters: \['\[/\]'\]" in md
