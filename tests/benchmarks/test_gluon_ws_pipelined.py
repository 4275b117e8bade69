"""The pipelined warp-specialised prototype (benchmarks/prototypes/gluon_ws_pipelined.py) on the CPU: ``rebound``
rebinds only the names it is given; the sm_90a builds of every variant (bodies of 2 and 4 K steps, the swizzled
gate/up scratch, both) compile (in a fresh interpreter without TRITON_INTERPRET) with the package builds' shared
memory, no spill, and no write to a register of an in-flight HGMMA, the pipelined waits leaving one half's groups
in flight. Bits and times against the package kernels are a GPU run (``--gpu``)."""

from __future__ import annotations

import pytest

_SCRIPT = r"""
import json
from benchmarks.prototypes.gluon_ws_pipelined import sass_report
print(json.dumps(sass_report()))
"""


def _scale(x, k=2):
    return k * x * FACTOR  # noqa: F821  (FACTOR: a global of this module only in its rebound copies)


def test_rebound_binds_only_the_named_globals():
    from benchmarks.prototypes.gluon_ws_pipelined import rebound, variant

    three, five = rebound(_scale, FACTOR=3), rebound(_scale, FACTOR=5)
    assert (three(7), five(7), three(7, k=1)) == (42, 70, 21)
    assert "FACTOR" not in globals()  # the module itself is untouched
    with pytest.raises(NameError):
        _scale(1)
    with pytest.raises(ValueError, match="unroll: a body of at least 2 K steps"):
        variant(1)


def test_rebound_launchers_keep_the_package_signature():
    """The copies keep keyword defaults (``stages``, ``persistent``) and the kernel's constexpr parameters, which
    Triton reads from the annotations: a copy without them fails to bind its layout arguments at launch."""
    from benchmarks.prototypes.gluon_ws_pipelined import VARIANTS, variant
    from flint_moe.kernels.nvfp4 import grouped_gluon_ws as pkg

    for name, args in VARIANTS.items():
        v = variant(*args)
        assert v.gate_up.__kwdefaults__ == pkg.launch_ws_gate_up.__kwdefaults__ == {"stages": None, "persistent": True}
        assert v.down.__kwdefaults__ == pkg.launch_ws_down.__kwdefaults__, name
        consts = [(p.name, p.is_constexpr) for p in v.kernel.params]
        assert consts == [(p.name, p.is_constexpr) for p in pkg._ws_grouped_kernel.params], name
        assert sum(c for _, c in consts) >= 8, consts


def test_builds():
    from benchmarks.prototypes.gluon_ws_pipelined import VARIANTS
    from tests.kernels._sm90_build import run_build_script

    rows = run_build_script(_SCRIPT, timeout=900)
    by = {(r["build"], r["kind"], r["BM"], r["TAIL"]): r for r in rows}
    builds = {(k, bm, tail) for _, k, bm, tail in by}
    assert builds == {("gate_up", 128, 32), ("down", 128, 32), ("gate_up", 128, 0), ("gate_up", 16, 0)}
    for kind, bm, tail in builds:
        base = by[("package", kind, bm, tail)]
        for name in VARIANTS:
            r = by[(name, kind, bm, tail)]
            assert r["smem"] == base["smem"] and r["spills"] == 0 == base["spills"], r
            assert r["inflight_writes"] == 0 == base["inflight_writes"], r
        # the swizzled scratch changes the gate/up epilogue only: the same K loop (up to the register allocation's
        # few moves); its loads become ldmatrix
        swz = by[("swizzled epilogue", kind, bm, tail)]
        k_swz, k_base = swz["loops"][0], base["loops"][0]
        assert {**k_swz, "instr": 0} == {**k_base, "instr": 0} and abs(k_swz["instr"] - k_base["instr"]) <= 8
        assert (sum(loop["ldsm"] for loop in swz["loops"]) > 0) == (kind == "gate_up"), swz["loops"]
        assert sum(loop["ldsm"] for loop in base["loops"]) == 0, base["loops"]
        # the unroll-2 body: two K steps (16 HGMMA per accumulator tile), the waits of the pipeline (after the first
        # half-pair, twice in the second step, the final full wait): 4, against the package's one per step
        body = min((loop for loop in by[("unroll 2", kind, bm, tail)]["loops"] if loop["hgmma"] % 16 == 0),
                   key=lambda loop: loop["instr"])  # fmt: skip
        step = min(by[("package", kind, bm, tail)]["loops"], key=lambda loop: loop["instr"])
        assert body["hgmma"] == 2 * step["hgmma"] and body["waits"] == 4 and step["waits"] == 1, (body, step)
        assert body["sts"] == 0 == body["ldsm"], body  # the weights stay in registers
