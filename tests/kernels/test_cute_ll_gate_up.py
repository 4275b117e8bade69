"""The CuTe DSL gate/up GEMV of the decode block (flint_moe/kernels/cute/ll_gate_up.py): its specialisations
compiled for sm_90a on the CPU (no GPU needed) and their PTX audited; the spec's limits. Whether the kernels
compute the right values is not checked here: CuTe DSL has no CPU interpreter (GPU run pending)."""

from __future__ import annotations

import pytest

from flint_moe.kernels.cute.ll_gate_up import AUDIT_SPECS, GateUpSpec, audit_gate_up, cute_available

BACKEND = "any"

needs_cute = pytest.mark.skipif(not cute_available()[0], reason="the cute extra (nvidia-cutlass-dsl) is not installed")


@needs_cute
@pytest.mark.parametrize("name", sorted(AUDIT_SPECS))
def test_sm90_ptx_has_the_pinned_instructions(name: str) -> None:
    assert audit_gate_up(AUDIT_SPECS[name]) == []


@needs_cute
def test_tap_build_ptx() -> None:
    assert audit_gate_up(AUDIT_SPECS["ling.routed.S4"], tap=True) == []


def test_spec_limits() -> None:
    with pytest.raises(ValueError, match=r"hidden 7168 must be a positive multiple of 16 \* 32 \* splits \(2048\)"):
        GateUpSpec(7168, 2048, 256, 4, True)
    with pytest.raises(ValueError, match=r"intermediate 96 must be a positive multiple of 64"):
        GateUpSpec(2048, 96, 8, 1, True)
    with pytest.raises(ValueError, match=r"experts 4 must be >= 1 \(1 for the shared expert\)"):
        GateUpSpec(2048, 512, 4, 1, False)
