"""The package's module structure: every module of ``flint_moe.conformance`` imports in a fresh interpreter, the
import graph between its modules (every ``import`` statement, also those inside functions and under
``TYPE_CHECKING``, read with :mod:`ast`) has no circle, and every module stays under 600 lines.

With an acyclic graph no import order can meet a half-initialised module, so one fresh interpreter importing
every module in turn covers each module's own import.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flint_moe.conformance as pkg

PKG = "flint_moe.conformance"
ROOT = Path(pkg.__file__).resolve().parent
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PKG, *parts])


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_package(name: str, mods: dict[str, Path]) -> bool:
    return mods[name].name == "__init__.py"


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is a module of the package, or None."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        cand = ".".join(parts[:n])
        if cand in mods:
            return cand
    return None


def import_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """{module: modules of the package it imports}, from every Import / ImportFrom node of its source (relative
    imports resolved; ``from P import m`` counts as importing module ``P.m`` when that is a module). A module
    importing itself (``audit.py`` re-imports itself under ``python -m`` so that the kernels' registry is
    shared) is no circle between modules and gives no edge."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        here = name if _is_package(name, mods) else name.rsplit(".", 1)[0]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base]) if base else ".".join(anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                r = _resolve(t, mods) if t.startswith(PKG) else None
                if r is not None and r != name:
                    out.add(r)
        edges[name] = out
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [m0, m1, ..., m0], or None when the graph is acyclic (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    for start in sorted(edges):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(edges.get(nxt, ())))))
    return None


def test_find_cycle_on_hand_made_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a"}}) is None


def test_import_edges_resolve_relative_lazy_and_submodule_imports(tmp_path, monkeypatch):
    root = tmp_path / "flint_moe" / "conformance"
    (root / "room").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "room" / "__init__.py").write_text("")
    (root / "room" / "a.py").write_text("from . import b\n\ndef f():\n    from flint_moe.conformance.top import x\n")
    (root / "room" / "b.py").write_text("import flint_moe.conformance.room.c as c\nimport os\n")
    (root / "room" / "c.py").write_text("from flint_moe.conformance.room import a\nfrom ..top import y\n")
    (root / "top.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .room.b import z\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", root)
    mods = _modules()
    edges = import_edges(mods)
    p = PKG + "."
    assert edges[p + "room.a"] == {p + "room.b", p + "top"}
    assert edges[p + "room.b"] == {p + "room.c"}
    assert edges[p + "room.c"] == {p + "room.a", p + "top"}
    assert edges[p + "top"] == {p + "room.b"}
    assert find_cycle(edges) == [p + "room.a", p + "room.b", p + "room.c", p + "room.a"]


def test_module_graph_is_acyclic():
    mods = _modules()
    edges = import_edges(mods)
    assert {PKG + ".judge.stages", PKG + ".report.report", PKG + ".inputs.cases"} <= set(mods)
    assert PKG + ".judge.explain" in edges[PKG + ".judge.stages"]  # the graph sees imports
    cycle = find_cycle(edges)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", sorted(_modules()))
def test_module_is_short(name):
    n = len(_modules()[name].read_text().splitlines())
    assert n < MAX_LINES, f"{name}: {n} lines (limit {MAX_LINES}: split it)"


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(_modules())
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\nprint(len(sys.argv) - 1)"
    env = dict(os.environ)
    env.setdefault("TRITON_INTERPRET", "1")
    proc = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip() == str(len(names))
