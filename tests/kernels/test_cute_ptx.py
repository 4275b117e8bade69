"""The CuTe DSL kernels of the decode block (gate/up: flint_moe/kernels/cute/ll_gate_up.py; down + combine:
flint_moe/kernels/cute/ll_down.py): every audit specialisation compiled for sm_90a on the CPU (no GPU needed)
and its PTX checked against the pinned rule instructions, and the tap build of one shape of each."""

from __future__ import annotations

import pytest

from flint_moe.kernels.cute import ll_down, ll_gate_up

BACKEND = "any"

needs_cute = pytest.mark.skipif(
    not ll_gate_up.cute_available()[0], reason="the cute extra (nvidia-cutlass-dsl) is not installed"
)

#: kernel -> (its audit specs, its audit function, the spec whose tap build is audited)
_AUDITS = {
    "gate_up": (ll_gate_up.AUDIT_SPECS, ll_gate_up.audit_gate_up, "ling.routed.S4"),
    "down": (ll_down.AUDIT_SPECS, ll_down.audit_down, "ling.S1"),
}


@needs_cute
@pytest.mark.parametrize("kernel,name", [(k, n) for k, (specs, _, _) in _AUDITS.items() for n in sorted(specs)])
def test_sm90_ptx_has_the_pinned_instructions(kernel: str, name: str) -> None:
    specs, audit, _ = _AUDITS[kernel]
    assert audit(specs[name]) == []


@needs_cute
@pytest.mark.parametrize("kernel", sorted(_AUDITS))
def test_tap_build_ptx(kernel: str) -> None:
    specs, audit, tap_spec = _AUDITS[kernel]
    assert audit(specs[tap_spec], tap=True) == []
