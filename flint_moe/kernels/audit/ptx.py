"""Compile a kernel specialisation for sm_90 on the CPU and check its PTX.

``run_audit(name)`` compiles one registered specialisation (``flint_moe.kernels.audit.registry``) for sm_90
(``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``; Triton bundles ptxas) and returns the
list of problems. Under ``TRITON_INTERPRET=1`` ``@triton.jit`` builds interpreter objects that cannot be
compiled, so the audit test runs ``python -m flint_moe.kernels.audit audit NAME`` in a subprocess with
``TRITON_INTERPRET`` removed from its environment.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import triton

from flint_moe.kernels.audit.registry import DEFAULT_FORBID, collect_audit_specs

__all__ = ["compile_ptx_sm90", "audit_ptx", "run_audit"]


def compile_ptx_sm90(
    kernel: Any, signature: dict[str, str], constexprs: dict[str, Any], options: dict[str, Any] | None = None
) -> str:
    """PTX of ``kernel`` specialised by ``signature`` / ``constexprs``, compiled for sm_90 without a GPU, with
    its pointer arguments specialised as 16-byte aligned as a launch on torch tensors specialises them.

    Raises ``RuntimeError`` when ``kernel`` is an interpreter object (TRITON_INTERPRET=1 at import):
    compile in
    a process without that variable (``python -m flint_moe.kernels.audit audit NAME``).
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):
        raise RuntimeError(
            f"compile_ptx_sm90: {getattr(kernel, '__name__', kernel)!r} is not a JITFunction "
            "(was it imported "
            "with TRITON_INTERPRET=1?); run `python -m flint_moe.kernels.audit audit NAME` without it"
        )
    sig: dict[str, str] = {}
    for arg in kernel.arg_names:
        if arg in constexprs:
            sig[arg] = "constexpr"
        elif arg in signature:
            sig[arg] = signature[arg]
        else:
            raise ValueError(f"compile_ptx_sm90: argument {arg!r} of {kernel.__name__} has no type or value")
    opts = {"num_warps": 4, **(options or {}), "enable_fp_fusion": True}
    # the build a launch runs: Triton specialises a pointer argument whose address is 16-byte aligned (every
    # torch allocation, and the ops refuse others) as tt.divisibility = 16, which changes vector widths
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kernel.arg_names) if sig[a].startswith("*")}
    if kernel.is_gluon():  # a Gluon kernel (triton.experimental.gluon): its own AST source, same compiler
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn=kernel, signature=sig, constexprs=dict(constexprs), attrs=attrs)
    else:
        src = ASTSource(fn=kernel, signature=sig, constexprs=dict(constexprs), attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    return compiled.asm["ptx"]


def _instruction_lines(ptx: str) -> list[str]:
    lines = []
    for raw in ptx.splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line or line.startswith(".") or line.endswith(":") or line in ("{", "}"):
            continue
        lines.append(line)
    return lines


def audit_ptx(ptx: str, require: Sequence[Any], forbid: Sequence[str] = DEFAULT_FORBID) -> list[str]:
    """Problems of ``ptx`` against ``require`` / ``forbid`` (see ``AuditSpec``); empty when it passes.

    Comments and directives (``.reg``, ``.loc``, ...) are ignored.
    """
    lines = _instruction_lines(ptx)
    text = "\n".join(lines)
    problems = []
    for req in require:
        alts = req if isinstance(req, tuple) else (req,)
        if not any(a in text for a in alts):
            problems.append(f"required instruction missing: {' or '.join(alts)}")
    for fb in forbid:
        if fb.startswith("re:"):
            pat = re.compile(fb[3:])
            hits = [ln for ln in lines if pat.search(ln)]
        else:
            hits = [ln for ln in lines if fb in ln]
        if hits:
            problems.append(f"forbidden {fb!r} present ({len(hits)}x), e.g. {hits[0]!r}")
    return problems

def run_audit(name: str) -> list[str]:
    """Compile registered specialisation ``name`` for sm_90 and return its audit problems (empty = pass)."""
    specs = collect_audit_specs()
    if name not in specs:
        raise KeyError(f"run_audit: no audit specialisation named {name!r}")
    s = specs[name]
    ptx = compile_ptx_sm90(s.kernel, s.signature, s.constexprs, s.options)
    return audit_ptx(ptx, s.require, s.forbid)
