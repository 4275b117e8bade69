"""The warp-specialised Gluon gate/up prototype (benchmarks/prototypes/gluon_ws_gate_up.py) on the CPU: its sm_90a
builds compile (compiled in a fresh interpreter without TRITON_INTERPRET), fit one CTA's shared memory, issue one
K step of 128 as 8 HGMMA with A from registers in the consumers, and write no register of an in-flight HGMMA. Its
bits against the package kernels are a GPU run (``--gpu``)."""

from __future__ import annotations

from benchmarks.prototypes.gluon_ws_gate_up import WS_ROWS, ws_stages

_SCRIPT = r"""
import json
from benchmarks.prototypes.gluon_ws_gate_up import sass_report
print(json.dumps(sass_report()))
"""


def test_ring_depth():
    # per slot: 128 rows x (64 B codes + 8 B scales) + BM x 256 B tokens; 224 KiB minus the [128, BM] fp32 scratch
    assert ws_stages(128) == 3 and ws_stages(16) == 6 and WS_ROWS == 128


def test_builds():
    from tests.kernels._sm90_build import run_build_script

    for r in run_build_script(_SCRIPT, timeout=900):
        assert r["smem"] <= 227 * 1024, r
        assert r["hgmma"] == 8 and r["inflight_writes"] == 0, r
        assert r["cp_async"] > 0, r
