"""The warp-specialised Gluon grouped GEMM prototype (benchmarks/prototypes/gluon_ws_grouped.py) on the CPU: its sm_90a
builds compile (compiled in a fresh interpreter without TRITON_INTERPRET), fit one CTA's shared memory, and their
consumers' K loop issues one K step of 128 as 8 HGMMA with one wgmma wait, waits and arrives on mbarriers, keeps the
weights in registers and writes no register of an in-flight HGMMA. Its
bits against the package kernels are a GPU run (``--gpu``)."""

from __future__ import annotations

from benchmarks.prototypes.gluon_ws_grouped import WS_ROWS, ws_stages

_SCRIPT = r"""
import json
from benchmarks.prototypes.gluon_ws_grouped import sass_report
print(json.dumps(sass_report()))
"""


def test_ring_depth():
    # per slot: 128 rows x (64 B codes + 8 B scales) + (BM + TAIL) x 256 B tokens; 224 KiB minus the epilogue's
    # scratch (gate/up: fp32 [128, BM]; down: 16 KiB): BM 128 -> (229376 - 65536) / 41984 = 3.9;
    # BM 128 + 32 -> (229376 - 65536) / 50176 = 3.3; down BM 128 + 32 -> (229376 - 16384) / 50176 = 4.2
    assert ws_stages(128) == 3 and ws_stages(16) == 6 and ws_stages(128, 32) == 3 and WS_ROWS == 128
    assert ws_stages(128, 32, gate_up=False) == 4


def test_builds():
    from tests.kernels._sm90_build import run_build_script

    for r in run_build_script(_SCRIPT, timeout=900):
        assert r["smem"] <= 227 * 1024 and r["spills"] == 0, r
        # the consumers' K loop: one K step of 128 = 2 halves x 4 HGMMA, one wgmma wait, the mbarrier wait and
        # arrive, no shared-memory store or ldmatrix (the weights stay in registers), no CTA-wide barrier besides
        # the partition's two
        loop = r["loop"]
        assert loop["hgmma"] == 8 and loop["waits"] == 1, loop
        assert loop["sts"] == 0 and loop["ldsm"] == 0 and loop["bar_sync"] <= 2 and loop["syncs"] >= 2, loop
        assert r["inflight_writes"] == 0, r
