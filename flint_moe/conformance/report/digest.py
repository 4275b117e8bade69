"""Source digest of the kernels and the golden model, and the freshness check of a committed GPU report.

:func:`source_digest` hashes every file under :data:`DIGEST_DIRS` (``flint_moe/kernels``, ``flint_moe/ops``,
``flint_moe/reference``, the code the harness's paths also run: ``flint_moe/layouts`` (the stored
weights the kernels read) and ``flint_moe/modules`` (the module paths), and the case matrix definition:
``flint_moe/conformance/inputs`` (cases, data profiles, routing); data files included; ``__pycache__`` and
``*.pyc`` excluded) and the files of :data:`DIGEST_FILES` (``flint_moe/shapes.py``, the model shapes the matrix
is made of) with SHA-256:

- a ``.py`` file is hashed in a normalised form, so that comments, docstrings, blank lines and formatting do
  not count: it is parsed with :mod:`ast`, the docstrings (a string constant as the first statement of the
  module, a class or a function) are dropped, and the tree is written out by :func:`_canonical`, a
  serializer of node types and field values that skips location attributes, ``None`` and empty-list fields
  and ``Constant.kind``, and merges the literal pieces of f-strings, so that the same code gives the same
  text on Python 3.11 (CI), 3.12 (the H200) and 3.13, whose ASTs differ only by such empty fields (e.g. 3.12's
  ``type_params``) and f-string piece splits (checked on 3.11.7, 3.12.1, 3.13.0). A file that does not parse is
  hashed as its raw bytes (prefixed ``raw:``).
- any other file (``reference/data/*.npz``, ``*.json``) is hashed as raw bytes.

The digest of the whole set is SHA-256 over the sorted lines ``<relative path> <file digest>\\n``; the
per-file digests are kept, so a check can say which files changed.

``python -m flint_moe.conformance.digest --check reports/h200/report.json`` prints one loud line:
``GPU REPORT CURRENT (...)``, ``GPU REPORT STALE since <files> changed (...)``, or ``GPU REPORT MISSING
(...)``; a CURRENT or STALE line of a gpu-profile report ends with the gpu-matrix cases the report lacks
(``; not run on the GPU: shape <new shape> xN, <path> xN (of N gpu cases)``: a shape added to
``flint_moe/shapes.py`` is named there), and exits 0 (``--strict``: 1 unless current). ``--print`` writes the
current digest as JSON.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
from pathlib import Path

__all__ = [
    "ALGORITHM",
    "DIGEST_DIRS",
    "DIGEST_FILES",
    "DEFAULT_GPU_REPORT",
    "normalized_source",
    "file_digest",
    "source_digest",
    "Freshness",
    "check_report",
    "main",
]

#: Name of the normalisation + hashing scheme; a report made with another one is reported stale.
ALGORITHM = "sha256/ast-canonical-v2"
#: Directories (relative to the repository root) whose files make up the digest.
DIGEST_DIRS = (
    "flint_moe/kernels", "flint_moe/ops", "flint_moe/reference", "flint_moe/layouts", "flint_moe/modules",
    "flint_moe/conformance/inputs",
)  # fmt: skip
#: Single files (relative to the repository root) that are part of the digest too.
DIGEST_FILES = ("flint_moe/shapes.py",)
#: Where the lead commits the latest H200 run.
DEFAULT_GPU_REPORT = "reports/h200/report.json"
#: Files named in the stale line before "and N more".
MAX_NAMED = 6

_SKIP_FIELDS = frozenset({"kind", "type_comment"})


def repo_root() -> Path:
    """The directory holding the ``flint_moe`` package (the repository root in a checkout)."""
    return Path(__file__).resolve().parents[3]


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                if isinstance(body[0].value.value, str):
                    node.body = body[1:] or ([ast.Pass()] if not isinstance(node, ast.Module) else [])
    return tree


def _fstring_parts(values: list) -> list:
    """f-string parts with adjacent literal pieces merged and empty ones dropped (Python 3.12.1 adds an empty
    ``Constant('')`` after a nested format field that 3.11 and 3.13 do not)."""
    out: list = []
    for v in values:
        if isinstance(v, ast.Constant) and isinstance(v.value, str):
            if not v.value:
                continue
            if out and isinstance(out[-1], ast.Constant) and isinstance(out[-1].value, str):
                out[-1] = ast.Constant(out[-1].value + v.value)
                continue
        out.append(v)
    return out


def _canonical(node) -> str:
    """Version-stable text of an AST: ``Type(field=value, ...)`` without locations, None/empty fields."""
    if isinstance(node, ast.JoinedStr):
        return f"JoinedStr(values={_canonical(_fstring_parts(node.values))})"
    if isinstance(node, ast.AST):
        parts = []
        for name in node._fields:
            if name in _SKIP_FIELDS:
                continue
            v = getattr(node, name, None)
            if v is None or (isinstance(v, list) and not v):
                continue
            parts.append(f"{name}={_canonical(v)}")
        return f"{type(node).__name__}({','.join(parts)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(v) for v in node) + "]"
    return f"{type(node).__name__}:{node!r}"


def normalized_source(text: str) -> str:
    """Canonical text of Python source ``text`` without comments, docstrings and formatting.

    Raises SyntaxError if ``text`` does not parse."""
    return _canonical(_strip_docstrings(ast.parse(text)))


def file_digest(path: Path) -> str:
    """SHA-256 (hex) of one file: normalised source for ``.py`` files that parse, raw bytes otherwise."""
    data = Path(path).read_bytes()
    if Path(path).suffix == ".py":
        try:
            data = ("py:" + normalized_source(data.decode("utf-8"))).encode()
        except (SyntaxError, UnicodeDecodeError, ValueError):
            data = b"raw:" + data
    return hashlib.sha256(data).hexdigest()


def _files(root: Path, dirs, files=()) -> list[Path]:
    out = [root / f for f in files if (root / f).is_file()]
    for d in dirs:
        base = root / d
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
                out.append(p)
    return out


def source_digest(root: Path | str | None = None, dirs=DIGEST_DIRS, files=DIGEST_FILES) -> dict:
    """Digest of the kernels', golden model's and case matrix's sources under ``root`` (default: this checkout):
    every file under ``dirs`` and each of ``files`` that exists.

    Returns ``{"algorithm": ALGORITHM, "digest": hex, "dirs": [...], "files": {relpath: hex}}`` with POSIX
    relative paths. Raises FileNotFoundError if none of ``dirs`` exists under ``root``."""
    root = repo_root() if root is None else Path(root)
    if not any((root / d).is_dir() for d in dirs):
        raise FileNotFoundError(f"source_digest: none of {list(dirs)} exists under {root}")
    files = _files(root, dirs, files)
    if not files:
        raise FileNotFoundError(f"source_digest: none of {list(dirs)} exists under {root}")
    per = {p.relative_to(root).as_posix(): file_digest(p) for p in files}
    total = hashlib.sha256("".join(f"{k} {v}\n" for k, v in sorted(per.items())).encode()).hexdigest()
    return {"algorithm": ALGORITHM, "digest": total, "dirs": list(dirs), "files": per}


class Freshness:
    """Outcome of :func:`check_report`: ``status`` ("CURRENT" | "STALE" | "MISSING" | "NOT-EVIDENCE": the
    sources match but the report is not a complete, unfiltered gpu-profile GPU run with 0 FAIL), ``line`` (the loud
    one-line message), ``changed`` / ``added`` / ``removed`` (relative paths vs the report's digest)."""

    def __init__(self, status: str, line: str, changed=(), added=(), removed=()):
        self.status, self.line = status, line
        self.changed, self.added, self.removed = list(changed), list(added), list(removed)

    @property
    def current(self) -> bool:
        return self.status == "CURRENT"

    def to_json(self) -> dict:
        return {"status": self.status, "line": self.line, "changed": self.changed, "added": self.added,
                "removed": self.removed}  # fmt: skip

    def __repr__(self) -> str:
        return f"Freshness({self.status!r}, {self.line!r})"


def _stamp(env: dict, dig: dict | None, totals: dict | None = None) -> str:
    bits = [f"commit {str(env.get('git_commit') or 'unknown')[:12]}"]
    if env.get("date_utc"):
        bits.append(f"run {env['date_utc']}")
    if env.get("gpu"):
        bits.append(str(env["gpu"]))
    if isinstance(totals, dict) and "cases" in totals:
        prof = f" ({env['profile']} profile)" if env.get("profile") else ""
        bits.append(f"{totals['cases']} cases{prof}, {totals.get('FAIL', 0)} FAIL")
    if env.get("incomplete"):
        bits.append(f"INCOMPLETE: {env['incomplete']}")
    if dig and dig.get("digest"):
        bits.append(f"sources {dig['digest'][:12]}")
    return ", ".join(bits)


def _display(p: Path) -> str:
    try:
        return p.resolve().relative_to(repo_root()).as_posix()
    except ValueError:
        return str(p)


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:MAX_NAMED])
    return shown + (f" and {len(paths) - MAX_NAMED} more" if len(paths) > MAX_NAMED else "")


def _not_evidence(env: dict, totals: dict | None) -> list[str]:
    """Why a report of the current sources still is not the GPU evidence (fields a report lacks are not held
    against it): not run on a GPU, another profile, filtered, a checkpoint or black-box run, incomplete, or with
    FAIL or NOT-JUDGED cases."""
    why = []
    if "gpu" in env and not env["gpu"]:
        why.append("not run on a GPU")
    if env.get("profile") not in (None, "gpu"):
        why.append(f"profile {env['profile']!r}")
    if env.get("filters"):
        why.append("filtered (" + ", ".join(map(str, env["filters"])) + ")")
    if env.get("checkpoint"):
        why.append(f"a checkpoint run ({env['checkpoint']})")
    if env.get("black_box"):
        why.append("black-box mode (no stage verdicts)")
    if env.get("incomplete"):
        why.append("incomplete")
    shard = env.get("shard")
    if shard:
        where = f"{shard.get('index')}/{shard.get('count')}" if isinstance(shard, dict) else "?"
        why.append(f"shard {where} of a run (merge the shards)")
    if isinstance(totals, dict) and totals.get("FAIL"):
        why.append(f"{totals['FAIL']} FAIL")
    if isinstance(totals, dict) and totals.get("NOT-JUDGED"):
        why.append(f"{totals['NOT-JUDGED']} NOT-JUDGED")
    return why


def _coverage(data: dict) -> str:
    """``"; not run on the GPU: shape <name> x<n>, ..., <path> x<n>, ... (of N gpu cases)"`` for the gpu-profile
    cases missing from the report (the matrix grew since it ran): first per shape of which the report has no
    case at all (a shape added since), then the others per path; or "" (also without torch: this module stays
    standard library)."""
    if (data.get("env") or {}).get("profile") != "gpu" or not isinstance(data.get("cases"), list):
        return ""
    try:
        from flint_moe.conformance.inputs.cases import matrix
    except ImportError:
        return ""
    have = {c.get("case_id") for c in data["cases"] if isinstance(c, dict)}
    have_shapes = {str(i).split("/")[1] for i in have if isinstance(i, str) and i.count("/") >= 2}
    want = matrix("gpu")
    missing: dict[str, int] = {}
    for c in want:
        if c.id not in have:
            key = f"shape {c.shape}" if c.shape not in have_shapes else c.path
            missing[key] = missing.get(key, 0) + 1
    missing = dict(sorted(missing.items(), key=lambda kv: not kv[0].startswith("shape ")))  # new shapes first
    if not missing:
        return ""
    return (
        "; not run on the GPU: " + ", ".join(f"{p} x{n}" for p, n in missing.items()) + f" (of {len(want)} gpu cases)"
    )


def check_report(report: Path | str | dict | None = None, current: dict | None = None) -> Freshness:
    """Is the GPU report ``report`` (a report.json path, a report directory, or its loaded dict; default
    :data:`DEFAULT_GPU_REPORT` under the repository root) current for the sources digested by ``current``
    (default :func:`source_digest`)? Never raises for a missing or unreadable report: that is MISSING."""
    if report is None:
        report = repo_root() / DEFAULT_GPU_REPORT
    where = "given report"
    if isinstance(report, dict):
        data = report
    else:
        p = Path(report)
        if p.is_dir():
            p = p / "report.json"
        where = _display(p)
        if not p.is_file():
            return Freshness(
                "MISSING",
                f"GPU REPORT MISSING (no committed GPU report at {where}: run the gpu profile on the H200, "
                "scripts/h200.sh, and commit its report.json and summary.md there)",
            )
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            return Freshness("MISSING", f"GPU REPORT MISSING ({where} unreadable: {e})")
    env = data.get("env", {}) if isinstance(data, dict) else {}
    env = env if isinstance(env, dict) else {}  # a tampered report: judged as carrying no digest
    totals = data.get("totals") if isinstance(data, dict) else None
    dig = env.get("source_digest")
    cur = source_digest() if current is None else current
    if not isinstance(dig, dict) or not isinstance(dig.get("files"), dict):
        return Freshness(
            "STALE", f"GPU REPORT STALE since an unknown change: {where} carries no source digest ({_stamp(env, None)})"
        )
    if dig.get("algorithm") != cur["algorithm"]:
        return Freshness(
            "STALE",
            f"GPU REPORT STALE since the digest algorithm changed ({dig.get('algorithm')} -> {cur['algorithm']}; "
            f"{_stamp(env, dig)})",
        )
    old, new = dig["files"], cur["files"]
    changed = sorted(f for f in old.keys() & new.keys() if old[f] != new[f])
    added = sorted(new.keys() - old.keys())
    removed = sorted(old.keys() - new.keys())
    if not (changed or added or removed) and dig.get("digest") == cur["digest"]:
        why = _not_evidence(env, totals)
        if why:
            return Freshness(
                "NOT-EVIDENCE",
                f"GPU REPORT NOT EVIDENCE ({'; '.join(why)}: only a complete, unfiltered gpu-profile run on a GPU "
                f"with 0 FAIL is; {_stamp(env, dig, totals)}; sources unchanged)",
            )
        return Freshness(
            "CURRENT",
            f"GPU REPORT CURRENT ({_stamp(env, dig, totals)}; {len(new)} source files unchanged{_coverage(data)})",
        )
    what = [f"{f} changed" for f in changed] + [f"{f} added" for f in added] + [f"{f} removed" for f in removed]
    return Freshness(
        "STALE",
        f"GPU REPORT STALE since {_names(what)} ({_stamp(env, dig, totals)}; now sources {cur['digest'][:12]}"
        f"{_coverage(data)})",
        changed,
        added,
        removed,
    )


def main(argv: list[str] | None = None) -> int:
    """CLI: ``--check [REPORT]`` prints the freshness line (exit 0; ``--strict``: 1 unless CURRENT);
    ``--print`` prints the current source digest as JSON."""
    ap = argparse.ArgumentParser(prog="python -m flint_moe.conformance.digest", description=__doc__.split("\n")[0])
    ap.add_argument("--check", nargs="?", const=DEFAULT_GPU_REPORT, metavar="REPORT",
                    help=f"report.json (or its directory) to check (default {DEFAULT_GPU_REPORT})")  # fmt: skip
    ap.add_argument("--strict", action="store_true", help="exit 1 when the report is stale or missing")
    ap.add_argument("--print", dest="show", action="store_true", help="print the current digest as JSON")
    args = ap.parse_args(argv)
    if args.show:
        print(json.dumps(source_digest(), indent=1))
    if args.check is not None or not args.show:
        target = Path(args.check or DEFAULT_GPU_REPORT)
        if not target.is_absolute() and not target.exists():
            target = repo_root() / target
        fresh = check_report(target)
        bar = "=" * min(120, max(40, len(fresh.line)))
        print(f"{bar}\n{fresh.line}", flush=True)  # the loud line is the last one printed
        return 1 if (args.strict and not fresh.current) else 0
    return 0

