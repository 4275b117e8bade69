"""The sm_90 PTX audit registry: the specialisations the kernel modules register, and the instruction sets
the rule requires or forbids.

Kernel modules call ``register_audit(...)`` from a module-level ``audit_specs()`` function that they run at
import. ``collect_audit_specs()`` imports every module of ``flint_moe.kernels`` (its subpackages included)
and returns the registry. ``flint_moe.kernels.audit.ptx`` compiles and checks them; the command line is
``python -m flint_moe.kernels.audit list | audit NAME...``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AuditSpec",
    "AUDIT_REGISTRY",
    "DEFAULT_FORBID",
    "BF16_CVT",
    "EXPF_LIBDEVICE",
    "register_audit",
    "collect_audit_specs",
]


#: ``require`` entry for the rule's bf16 conversion: either form satisfies it.
BF16_CVT: tuple[str, ...] = ("cvt.rn.bf16.f32", "cvt.rn.bf16x2.f32")
#: Forbidden by default: approximate division, and any fp64 instruction
#: (``re:`` = regex on instruction lines).
DEFAULT_FORBID: tuple[str, ...] = (
    "div.full.f32",
    r"re:^\s*(@!?%p\d+\s+)?[a-z][a-z0-9_]*(\.[a-z0-9_]+)*\.f64\b",
)


@dataclass(frozen=True)
class AuditSpec:
    """One kernel specialisation to compile for sm_90 and audit.

    ``signature``: argument name -> Triton type string (``"*fp32"``, ``"i32"``, ...); constexpr arguments
    may be left out (they are filled from ``constexprs``). ``require``: each entry a string that must occur
    in the PTX instructions, or a tuple of alternatives (one must occur). ``forbid``: strings that must not
    occur; an entry ``"re:PATTERN"`` is a regex searched on each instruction line. ``options``: compile
    options (num_warps, ...); ``enable_fp_fusion`` is always True.
    """

    name: str
    kernel: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    require: tuple[Any, ...]
    forbid: tuple[str, ...] = DEFAULT_FORBID
    options: dict[str, Any] = field(default_factory=dict)


#: name -> AuditSpec, filled by the kernel modules' ``audit_specs()`` at import.
AUDIT_REGISTRY: dict[str, AuditSpec] = {}


def register_audit(
    name: str,
    kernel: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    require: Sequence[Any],
    forbid: Sequence[str] = DEFAULT_FORBID,
    *,
    options: dict[str, Any] | None = None,
) -> AuditSpec:
    """Register a specialisation for the sm_90 PTX audit (idempotent for the same kernel and arguments).

    Raises ``ValueError`` when ``name`` is already registered with a different kernel or arguments.
    """
    spec = AuditSpec(
        name=name,
        kernel=kernel,
        signature=dict(signature),
        constexprs=dict(constexprs),
        require=tuple(tuple(r) if isinstance(r, (list, tuple)) else r for r in require),
        forbid=tuple(forbid),
        options=dict(options or {}),
    )
    old = AUDIT_REGISTRY.get(name)
    if old is not None and (
        getattr(old.kernel, "fn", old.kernel) is not getattr(kernel, "fn", kernel)
        or (old.signature, old.constexprs, old.require, old.forbid, old.options)
        != (spec.signature, spec.constexprs, spec.require, spec.forbid, spec.options)
    ):
        raise ValueError(f"register_audit: name {name!r} is already registered with different arguments")
    AUDIT_REGISTRY[name] = spec
    return spec


def collect_audit_specs() -> dict[str, AuditSpec]:
    """Import every module of ``flint_moe.kernels`` and its subpackages (running each ``audit_specs()``);
    return the registry."""
    import flint_moe.kernels as pkg

    infos = pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}.")
    for name in sorted(i.name for i in infos if not i.name.endswith(".__main__")):
        mod = importlib.import_module(name)
        hook = getattr(mod, "audit_specs", None)
        if callable(hook):
            hook()
    return dict(AUDIT_REGISTRY)


#: The instructions of libdevice ``__nv_expf`` (ftz) as Triton 3.6 links it: a round-down fma, then ex2.
EXPF_LIBDEVICE: tuple[str, ...] = ("fma.rm.ftz.f32", "ex2.approx.ftz.f32")
