"""``python -m flint_moe.kernels.audit list`` | ``audit NAME...``: the registered specialisations, or their
sm_90 PTX audit (prints JSON; exit 1 on problems, 2 on misuse)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from flint_moe.kernels._launch import INTERPRET
from flint_moe.kernels.audit.ptx import run_audit
from flint_moe.kernels.audit.registry import collect_audit_specs


def _main(argv: Sequence[str]) -> int:
    """``python -m flint_moe.kernels.audit list`` | ``audit NAME...`` (prints JSON; exit 1 on problems)."""
    if not argv or argv[0] not in ("list", "audit"):
        print("usage: python -m flint_moe.kernels.audit list | audit NAME...", file=sys.stderr)
        return 2
    if argv[0] == "list":
        print(json.dumps(sorted(collect_audit_specs())))
        return 0
    if INTERPRET:
        print("audit: unset TRITON_INTERPRET (the audit compiles real PTX)", file=sys.stderr)
        return 2
    result = {n: run_audit(n) for n in argv[1:]}
    print(json.dumps(result))
    return 1 if any(result.values()) else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
