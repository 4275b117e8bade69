"""Source digest (flint_moe.conformance.report.digest): comments, docstrings and formatting do not count, code does;
the freshness check names the changed files; a missing GPU report is said clearly."""

from __future__ import annotations

import hashlib
import json

import pytest

from flint_moe.conformance.report import digest as dg

BASE = '''"""Module docstring."""

import torch


def gate(x, y):
    """Gate docstring."""
    # a comment
    return x * y + 1


class K:
    """Class docstring."""

    def f(self):
        """Only a docstring."""
'''

# Same code: other comments / docstrings / blank lines / formatting.
SAME = """import torch  # trailing comment
def gate(x,   y):
    # another comment
    return (x * y + 1)
class K:
    def f(self):
        pass
"""

CODE_EDITS = [
    BASE.replace("x * y + 1", "x * y + 2"),  # a constant
    BASE.replace("x * y + 1", "y * x + 1"),  # operand order (rounding order matters)
    BASE.replace("def gate(x, y)", "def gate(y, x)"),  # argument order
    BASE.replace('"""Only a docstring."""', 'return "Only a docstring."'),  # a string that is no docstring
]


def _tree(tmp_path, text: str, data: bytes = b"\x00\x01table"):
    for d in dg.DIGEST_DIRS:
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    (tmp_path / "flint_moe/kernels/k.py").write_text(text)
    (tmp_path / "flint_moe/ops/op.py").write_text("def op(x):\n    return x\n")
    (tmp_path / "flint_moe/reference/data").mkdir(exist_ok=True)
    (tmp_path / "flint_moe/reference/data/t.npz").write_bytes(data)
    return dg.source_digest(tmp_path)


def test_comments_docstrings_and_formatting_do_not_count(tmp_path):
    assert dg.normalized_source(BASE) == dg.normalized_source(SAME)
    a = _tree(tmp_path / "a", BASE)
    b = _tree(tmp_path / "b", SAME)
    assert a["digest"] == b["digest"] and a["files"] == b["files"]


@pytest.mark.parametrize("edited", CODE_EDITS)
def test_code_edits_change_the_digest(tmp_path, edited):
    assert dg.normalized_source(BASE) != dg.normalized_source(edited)
    a = _tree(tmp_path / "a", BASE)
    b = _tree(tmp_path / "b", edited)
    assert a["digest"] != b["digest"]
    assert [f for f in a["files"] if a["files"][f] != b["files"][f]] == ["flint_moe/kernels/k.py"]


def test_data_files_are_raw_bytes_and_the_total_is_independent(tmp_path):
    a = _tree(tmp_path / "a", BASE, data=b"abc")
    assert a["files"]["flint_moe/reference/data/t.npz"] == hashlib.sha256(b"abc").hexdigest()
    b = _tree(tmp_path / "b", BASE, data=b"abd")
    assert a["digest"] != b["digest"]
    # The total digest is SHA-256 over the sorted "path digest" lines, recomputed here independently.
    lines = "".join(f"{k} {a['files'][k]}\n" for k in sorted(a["files"]))
    assert a["digest"] == hashlib.sha256(lines.encode()).hexdigest()
    assert sorted(a["files"]) == [
        "flint_moe/kernels/k.py", "flint_moe/ops/op.py", "flint_moe/reference/data/t.npz",
    ]  # fmt: skip


def test_unparsable_python_is_hashed_raw(tmp_path):
    p = tmp_path / "bad.py"
    p.write_bytes(b"def (:\n")
    assert dg.file_digest(p) == hashlib.sha256(b"raw:def (:\n").hexdigest()


def test_pycache_is_ignored(tmp_path):
    a = _tree(tmp_path, BASE)
    (tmp_path / "flint_moe/kernels/__pycache__").mkdir()
    (tmp_path / "flint_moe/kernels/__pycache__/k.cpython-311.pyc").write_bytes(b"junk")
    assert dg.source_digest(tmp_path) == a


def test_no_source_dirs_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="flint_moe/kernels"):
        dg.source_digest(tmp_path)


def _report(tmp_path, dig, **env):
    p = tmp_path / "h200" / "report.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"schema": "x", "env": {"source_digest": dig, "git_commit": "abc123def456789", **env}}))
    return p


def test_check_current_stale_missing(tmp_path):
    old = _tree(tmp_path / "old", BASE)
    rep = _report(tmp_path, old, date_utc="2026-11-29T10:00:00+00:00")
    same = _tree(tmp_path / "same", SAME)
    fresh = dg.check_report(rep, current=same)
    assert fresh.status == "CURRENT" and fresh.line.startswith("GPU REPORT CURRENT (commit abc123def456")
    assert "2026-11-29T10:00:00+00:00" in fresh.line
    with_totals = {"env": {"source_digest": old, "profile": "gpu", "gpu": "NVIDIA H200"},
                   "totals": {"cases": 418, "FAIL": 0}}  # fmt: skip
    assert dg.check_report(with_totals, current=same).line == (
        f"GPU REPORT CURRENT (commit unknown, NVIDIA H200, 418 cases (gpu profile), 0 FAIL, sources "
        f"{old['digest'][:12]}; 3 source files unchanged)"
    )

    new = _tree(tmp_path / "new", CODE_EDITS[0])
    (tmp_path / "new/flint_moe/ops/op2.py").write_text("X = 1\n")
    (tmp_path / "new/flint_moe/ops/op.py").unlink()
    new = dg.source_digest(tmp_path / "new")
    stale = dg.check_report(rep.parent, current=new)  # a directory works too
    assert stale.status == "STALE"
    assert stale.changed == ["flint_moe/kernels/k.py"]
    assert stale.added == ["flint_moe/ops/op2.py"] and stale.removed == ["flint_moe/ops/op.py"]
    assert stale.line.startswith(
        "GPU REPORT STALE since flint_moe/kernels/k.py changed, flint_moe/ops/op2.py added, "
        "flint_moe/ops/op.py removed ("
    )

    missing = dg.check_report(tmp_path / "nope" / "report.json", current=new)
    assert missing.status == "MISSING" and missing.line.startswith("GPU REPORT MISSING (no committed GPU report")


def test_check_without_digest_or_other_algorithm_is_stale(tmp_path):
    cur = _tree(tmp_path / "t", BASE)
    assert dg.check_report({"env": {}}, current=cur).line.startswith("GPU REPORT STALE since an unknown change")
    other = dict(cur, algorithm="sha256/other")
    assert "digest algorithm changed" in dg.check_report({"env": {"source_digest": other}}, current=cur).line


def test_cli_prints_the_line_and_strict_exit(tmp_path, capsys, monkeypatch):
    fixed = dg.source_digest()  # one snapshot of the real checkout (others may edit it meanwhile)
    monkeypatch.setattr(dg, "source_digest", lambda *a, **k: fixed)
    missing = str(tmp_path / "none.json")
    assert dg.main(["--check", missing]) == 0
    assert "GPU REPORT MISSING" in capsys.readouterr().out
    assert dg.main(["--check", missing, "--strict"]) == 1
    rep = _report(tmp_path, dg.source_digest())  # the real checkout's sources
    assert dg.main(["--check", str(rep), "--strict"]) == 0
    assert "GPU REPORT CURRENT" in capsys.readouterr().out


def test_real_checkout_digest_covers_the_code_the_harness_runs():
    d = dg.source_digest()
    tops = {f.split("/")[1] for f in d["files"]}
    assert tops == {"kernels", "ops", "reference", "layouts", "modules", "conformance", "shapes.py"}
    assert any(f.startswith("flint_moe/reference/data/") for f in d["files"])
    # the case matrix definition: the model shapes and the case / data-profile / routing modules
    assert {"flint_moe/shapes.py", "flint_moe/conformance/inputs/cases.py", "flint_moe/conformance/inputs/profiles.py",
            "flint_moe/conformance/inputs/routing.py"} <= set(d["files"])  # fmt: skip
    assert not any(f.startswith(("flint_moe/conformance/judge", "flint_moe/conformance/report")) for f in d["files"])


def test_a_new_shape_makes_the_report_stale_and_names_its_missing_cases(tmp_path, monkeypatch):
    """Adding a shape to flint_moe/shapes.py changes the digest (STALE since flint_moe/shapes.py changed) and the
    line names the new shape's gpu cases the report lacks."""
    import shutil

    from flint_moe.conformance.inputs import cases as C

    root = tmp_path / "repo"
    for rel in (*dg.DIGEST_DIRS, *dg.DIGEST_FILES):
        src = dg.repo_root() / rel
        if src.is_dir():
            shutil.copytree(src, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, root / rel)
    before = dg.source_digest(root)
    gpu = C.matrix("gpu")
    report = {"env": {"source_digest": before, "profile": "gpu", "gpu": "NVIDIA H200"}, "totals": {"FAIL": 0},
              "cases": [{"case_id": c.id} for c in gpu]}  # fmt: skip
    assert dg.check_report(report, current=before).status == "CURRENT"
    shapes = root / "flint_moe/shapes.py"
    line = '        MoEShape("ling-mini-2.0", 256, 2048, 512, 8, 512),\n'
    text = shapes.read_text()
    assert line in text
    shapes.write_text(text.replace(line, line + '        MoEShape("new-model", 96, 3136, 1344, 6, 1344),\n'))
    after = dg.source_digest(root)
    # the matrix as it would be with the new shape (this process imported the unedited module)
    new = C.ShapeSpec("new-model", 96, 3136, 1344, 6)
    monkeypatch.setattr(C, "REAL_SHAPES", (*C.REAL_SHAPES, new))
    monkeypatch.setitem(C.SHAPES, new.name, new)
    n_new = sum(c.shape == "new-model" for c in C.matrix("gpu"))
    assert n_new >= 4
    fresh = dg.check_report(report, current=after)
    assert fresh.status == "STALE" and fresh.changed == ["flint_moe/shapes.py"]
    assert fresh.line.startswith("GPU REPORT STALE since flint_moe/shapes.py changed (")
    assert fresh.line.endswith(f"; not run on the GPU: shape new-model x{n_new} (of {len(gpu) + n_new} gpu cases))")


# Constructs whose ASTs differ between Python versions (f-string pieces, 3.12's type_params, match, walrus...).
VERSIONED = '''
"""doc"""
from __future__ import annotations
import torch as t
@dec(1)
class A(B, metaclass=M):
    x: int = 0
    def f(self, a, /, b=2, *c, d, **e) -> "A":
        """doc"""
        y = f"{a!r:>{b}} {{lit}} {c[0]:.3g} " f'{d["k"]}' "plain"
        if (n := len(c)) > 1 and not d:
            return [i ** 2 for i in range(n) if i % 2] or {k: v for k, v in e.items()}
        match a:
            case [1, *rest]: return rest
            case {"k": v} | {"j": v}: return v
            case _: pass
        z = lambda q=1, *r: q@r
        async def g():
            async with w as u:
                await u
        del y
        return b"\\x00" + rb"\\d" + 0x1F.bit_length().__str__().encode() + 1_000j.imag.hex().encode(), ..., None, z
'''


def test_canonical_text_is_python_version_stable():
    # The same SHA-256 was obtained with this normalisation on CPython 3.11.7, 3.12.1 and 3.13.0 (3.12.1 alone
    # splits the f-string format spec with an extra empty piece); a drift on another version fails here.
    got = hashlib.sha256(dg.normalized_source(VERSIONED).encode()).hexdigest()
    assert got == "bd84aef8a290ed7d8786a2890711fbe758c36d82b33cb6b089002b70260930cd"
    assert dg.ALGORITHM == "sha256/ast-canonical-v2"


def test_report_of_current_sources_that_is_not_the_evidence(tmp_path):
    cur = _tree(tmp_path / "t", BASE)
    full = {"source_digest": cur, "profile": "gpu", "gpu": "NVIDIA H200", "filters": []}
    assert dg.check_report({"env": full, "totals": {"FAIL": 0}}, current=cur).status == "CURRENT"
    for change, why in (
        ({"gpu": None, "profile": "cpu"}, "not run on a GPU; profile 'cpu'"),
        ({"filters": ["bf16"]}, "filtered (bf16)"),
        ({"incomplete": "stopped by SIGTERM after 3 of 9 selected cases"}, "incomplete"),
        ({"black_box": True}, "black-box mode (no stage verdicts)"),
    ):
        f = dg.check_report({"env": dict(full, **change), "totals": {"FAIL": 0}}, current=cur)
        assert f.status == "NOT-EVIDENCE" and not f.current
        assert f.line.startswith(f"GPU REPORT NOT EVIDENCE ({why}: only a complete, unfiltered gpu-profile run")
    f = dg.check_report({"env": full, "totals": {"FAIL": 2}}, current=cur)
    assert f.status == "NOT-EVIDENCE" and f.line.startswith("GPU REPORT NOT EVIDENCE (2 FAIL:")


def test_current_line_names_gpu_cases_the_report_lacks():
    from flint_moe.conformance.inputs.cases import matrix

    cur = dg.source_digest()
    cases = matrix("gpu")
    env = {"source_digest": cur, "profile": "gpu", "gpu": "NVIDIA H200"}
    every = {"env": env, "totals": {"FAIL": 0}, "cases": [{"case_id": c.id} for c in cases]}
    assert "not run on the GPU" not in dg.check_report(every, current=cur).line
    lacking = dict(every, cases=[{"case_id": c.id} for c in cases if c.path != "bf16_module"])
    n = sum(c.path == "bf16_module" for c in cases)
    line = dg.check_report(lacking, current=cur).line
    assert line.endswith(f"; not run on the GPU: bf16_module x{n} (of {len(cases)} gpu cases))")


@pytest.mark.parametrize("env", [["not", "an", "object"], "text", 3, None])
def test_tampered_env_is_stale_not_a_crash(tmp_path, env):
    """A report whose env is not an object (a tampered --gpu-report) is STALE with a reason, never a crash."""
    p = tmp_path / "report.json"
    p.write_text(json.dumps({"env": env, "cases": []}))
    fresh = dg.check_report(p)
    assert fresh.status == "STALE" and "carries no source digest" in fresh.line
