"""The CuTe DSL kernels of the decode block (flint_moe/kernels/cute/ll_partial.py's two host functions: gate/up =
partial + ll_gate_up.py's finish; down = partials + ll_down.py's combine): every audit specialisation compiled
for sm_90a on the CPU (no GPU needed) and its PTX checked against the pinned rule instructions, the exact
decode and the vector loads, the tap build of one shape of each, and every (kernel, spec, tap) the conformance
cases launch (conformance/audit_block.py), checked against what the launchers really compile."""

from __future__ import annotations

import pytest

from flint_moe.conformance.audit_block import block_launches, case_launches
from flint_moe.kernels.cute import ll_gate_up, ll_partial

BACKEND = "any"

needs_cute = pytest.mark.skipif(
    not ll_gate_up.cute_available()[0], reason="the cute extra (nvidia-cutlass-dsl) is not installed"
)

#: kernel -> (its audit specs, its audit function, the spec whose tap build is audited)
_AUDITS = {
    "gate_up": (ll_partial.AUDIT_SPECS["gate_up"], ll_partial.audit_gate_up, "ling.routed.S4"),
    "down": (ll_partial.AUDIT_SPECS["down"], ll_partial.audit_down, "ling.S1"),
}


def test_audit_lists() -> None:
    """Both builds must show the exact decode, the vector loads and the rule's pinned instructions; gate/up also
    the SwiGLU's ``ex2`` / ``rcp``; the forbidden list is the one of every CuTe kernel of the block."""
    for need in ("mul.rn.f16x2", "cvt.rn.f16x2.e4m3x2", "cvt.f32.f16", "ld.global.nc.v2.u32", "ld.global.nc.v4.u32",
                 "fma.rn.f32", "mul.rn.f32", "add.rn.f32", "cvt.rn.bf16.f32", "shfl.sync.bfly.b32",
                 "vote.sync.ballot.b32", "griddepcontrol.wait", "griddepcontrol.launch_dependents"):  # fmt: skip
        assert need in ll_partial.PTX_REQUIRE
    assert ll_partial.PTX_FORBID == ll_gate_up.PTX_FORBID


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


#: Every (kernel, spec, tap) the conformance cases launch (gpu and cpu profiles, the pending paths, the mutation
#: self-test on CUDA): conformance/audit_block.py.
_LAUNCHES = sorted(block_launches(), key=lambda k: (k[0], repr(k[1]), k[2]))


def _launch_id(key) -> str:
    kernel, spec, tap = key
    return f"{kernel}-{'-'.join(str(v) for v in vars(spec).values())}-{'tap' if tap else 'prod'}"


@needs_cute
@pytest.mark.parametrize("key", _LAUNCHES, ids=[_launch_id(k) for k in _LAUNCHES])
def test_every_conformance_launch_is_audited(key) -> None:
    kernel, spec, tap = key
    audit = ll_partial.audit_gate_up if kernel == "gate_up" else ll_partial.audit_down
    assert audit(spec, tap=tap) == []


def test_block_launches_cover_the_conformance_block_cases() -> None:
    """Every shape of the block's cases has its three kernels in both builds, and DeepSeek-V3's are the plan a
    hand count gives: 2 * 2048 = 4096 gate/up rows in CTAs of 4 warps (one row each) = 1024 CTAs per split, at
    least the 528 targeted, so 1 split; down: 7168 rows, 1792 CTAs, 1 split."""
    from flint_moe.conformance.inputs.block import BLOCK_PATHS
    from flint_moe.conformance.inputs.cases import matrix, pending_gpu_cases
    from flint_moe.kernels.cute.ll_down import DownSpec
    from flint_moe.kernels.cute.ll_gate_up import GateUpSpec
    from flint_moe.kernels.cute.ll_launch import SPLIT_TARGET_CTAS, WARPS

    launches = block_launches()
    shapes = {c.shape for c in matrix("gpu") + pending_gpu_cases() if c.path in BLOCK_PATHS}
    assert shapes == {"deepseek-v3", "kimi-k2", "glm-4.5", "ling-mini-2.0"}
    for tap in (True, False):
        assert all(sum(k[2] == tap and k[0] == kern for k in launches) >= len(shapes) for kern in ("gate_up", "down"))
    assert 4096 // WARPS >= SPLIT_TARGET_CTAS and 7168 // WARPS >= SPLIT_TARGET_CTAS  # one split is enough
    dsv3 = [k for k, ids in launches.items() if any(i.startswith("ll_block/deepseek-v3/") for i in ids)]
    assert set(dsv3) == {
        (kern, spec, tap)
        for kern, spec in (
            ("gate_up", GateUpSpec(7168, 2048, 256, 1, True, 8)),
            ("gate_up", GateUpSpec(7168, 2048, 1, 1, False, 1)),
            ("down", DownSpec(7168, 2048, 2048, 2048, 256, 8, 1, 1)),
        )
        for tap in (True, False)
    }


def test_case_launches_are_what_the_launchers_compile(monkeypatch) -> None:
    """The launchers' own compile keys, recorded in place of ``ll_launch._run`` (the kernels' work done by the
    CPU model of tests/ops/_ll_emulate.py) while the block path runs a case tapped and untapped, equal
    ``case_launches`` of that case in both builds."""
    import torch

    from flint_moe.conformance.inputs.block import build_block_inputs
    from flint_moe.conformance.inputs.cases import Case
    from flint_moe.conformance.run.paths import path_for
    from flint_moe.kernels.cute import ll_launch
    from flint_moe.ops import make_route_counter
    from tests.ops import _ll_emulate

    seen = set()

    def record(kind, spec, tap, *args):
        seen.add((kind, spec, bool(tap)))
        return _ll_emulate.run(kind, spec, tap, *args)

    monkeypatch.setattr(ll_launch, "_run", record)
    monkeypatch.setattr(ll_launch, "ll_experts_status", lambda device: (True, "CPU model"))
    case = Case.make("ll_block", "cpu-deepseek-v3", 2, "gaussian")
    inputs = build_block_inputs(case, torch.device("cpu"))
    path = path_for(case)
    for taps in ({}, None):
        path.fn(inputs, make_route_counter("cpu"), taps)
    assert seen == {(k, s, tap) for k, s in case_launches(case) for tap in (True, False)}
