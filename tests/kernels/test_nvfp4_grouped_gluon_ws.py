"""The warp-specialised Gluon grouped GEMMs (config ``ENGINE`` 'gluon_ws') on the CPU: sm_90a builds (no GPU
needed), the ring depth and the launch checks.

The builds the launchers take for DeepSeek-V3 (gate/up BM 128, 16 and 128 + 32; down BM 128 + 32): they fit one CTA's
shared memory without spilling, and the consumers' K loop issues a body of two K steps of 128 as 16 HGMMA with four
wgmma waits (every half's dequantisation but the body's first under the previous half's wgmma), waits and arrives on
mbarriers, keeps the weights in registers (no STS / LDSM) and writes no register of an in-flight HGMMA; the gate/up
epilogue's scratch store and loads compile to the vector widths and instruction counts that benchmarks.smem_banks models
(its wavefront counts rest on them). Bitwise equality with the Triton kernels is a GPU test
(test_nvfp4_grouped_gluon_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.nvfp4.grouped_gluon_ws import WS_ROWS, check_ws_launch, ws_stages
from flint_moe.kernels.nvfp4.permute import moe_permute

_BUILDS = [(128, 0, True), (16, 0, True), (128, 32, True), (128, 32, False)]

_SCRIPT = r"""
import collections, inspect, json, re
from benchmarks.sass_grouped_nvfp4 import _opcode, _resources, hgmma_loops, inflight_register_writes, sass_of
from flint_moe.kernels.nvfp4 import grouped_gluon
from flint_moe.kernels.nvfp4.grouped_gluon_ws import compile_ws_sm90
src, first = inspect.getsourcelines(grouped_gluon._gate_up_store.fn)
EPI = {first + i for i, line in enumerate(src) if "epi_s.store(" in line or ".load(epi_l)" in line}

def epilogue_shared_ops(ptx):
    # PTX shared-memory instructions whose innermost source line is the scratch store / loads of _gate_up_store
    files = {m[1]: m[2] for m in re.finditer(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.M)}
    ops, here = collections.Counter(), False
    for line in ptx.splitlines():
        m = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)", line)
        if m:
            here = files.get(m[1], "").endswith("grouped_gluon.py") and int(m[2]) in EPI
            continue
        op = re.match(r"\s*(ld\.shared\S*|st\.shared\S*|ldmatrix\S*)", line)
        if here and op:
            ops[op[1]] += 1
    return dict(ops)

out = []
for bm, tail, gate_up in BUILDS:
    c = compile_ws_sm90(7168, 2048, 8, bm, tail, gate_up=gate_up)
    sass = sass_of(c.asm["cubin"])
    loops = []
    for body in sorted(hgmma_loops(sass), key=len):
        ops = [_opcode(t) for t in body]
        loops.append({name: sum(o.startswith(prefix) for o in ops)
                      for name, prefix in (("hgmma", "HGMMA"), ("waits", "WARPGROUP.DEPBAR"), ("bar_sync", "BAR.SYNC"),
                                           ("syncs", "SYNCS"), ("sts", "STS"), ("ldsm", "LDSM"))})
    res = {k: v for k, v in _resources(c).items() if k != "tma"}
    out.append({**res, "loops": loops, "inflight": len(inflight_register_writes(sass)),
                "epilogue": epilogue_shared_ops(c.asm["ptx"]) if gate_up else {}})
print(json.dumps(out))
"""


def test_ring_depth():
    # per slot: 128 rows x (64 B codes + 8 B scales) + (BM + TAIL) x 256 B tokens; 224 KiB minus the epilogue's
    # scratch (gate/up: fp32 [128, max(BM, TAIL)]; down: 16 KiB): BM 128 -> (229376 - 65536) / 41984 = 3.9;
    # BM 128 + 32 -> (229376 - 65536) / 50176 = 3.3; BM 128 + 64 -> 163840 / 58368 = 2.8; down BM 128 + 32 ->
    # (229376 - 16384) / 50176 = 4.2; BM 16 -> (229376 - 8192) / 13312 = 16.6, capped at 6
    assert ws_stages(128) == 3 and ws_stages(16) == 6 and ws_stages(128, 32) == 3 and WS_ROWS == 128
    assert ws_stages(128, 64) == 2 and ws_stages(128, 32, gate_up=False) == 4


def test_launch_checks():
    """Without an sm_90 GPU (here: the CPU, or the interpreter) every launch is refused, naming why; the engine
    name is accepted by both GEMMs' config check."""
    from flint_moe.kernels.nvfp4.grouped_down import GROUPED_DOWN_CONFIG
    from flint_moe.kernels.nvfp4.grouped_gate_up import GROUPED_GATE_UP_CONFIG, _cfg

    ids = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match="config ENGINE 'gluon_ws' needs an sm_90 GPU"):
        check_ws_launch("op", moe_permute(ids, 4, 16), 128)
    assert _cfg({"ENGINE": "gluon_ws"}, GROUPED_GATE_UP_CONFIG, "x")["ENGINE"] == "gluon_ws"
    assert _cfg({"ENGINE": "gluon_ws"}, GROUPED_DOWN_CONFIG, "x")["ENGINE"] == "gluon_ws"
    with pytest.raises(ValueError, match="ENGINE must be one of"):
        _cfg({"ENGINE": "gluon-ws"}, GROUPED_DOWN_CONFIG, "nvfp4_grouped_down")
    # without an sm_90 GPU every launch takes the Triton kernels by default
    from flint_moe.kernels.nvfp4.grouped_gate_up import default_engine

    assert default_engine(moe_permute(ids, 4, 128, 32), 7168) == "triton"
    assert default_engine(moe_permute(ids, 4, 16), 7168) == "triton"


def test_default_engine_on_an_h200(monkeypatch):
    """The engine per launch where an sm_90 GPU is present (faked: capability (9, 0), no interpreter; a
    permutation stand-in on device ``cuda``): warp-specialised at BM 128 with a tail and K a multiple of 128, Gluon
    at BM 16 with K a multiple of 64 and at least two K steps, else Triton."""
    from types import SimpleNamespace

    from flint_moe.kernels import _launch
    from flint_moe.kernels.nvfp4.grouped_gate_up import default_engine

    monkeypatch.setattr(_launch, "INTERPRET", False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    def perm(bm, tail=0):
        return SimpleNamespace(order=SimpleNamespace(device=torch.device("cuda")), block_m=bm, tail=tail)

    assert default_engine(perm(128, 32), 7168) == "gluon_ws" and default_engine(perm(128, 64), 2048) == "gluon_ws"
    assert default_engine(perm(128, 32), 2880) == "triton"  # K not a multiple of 128
    assert default_engine(perm(128), 7168) == "triton"  # no tail
    assert default_engine(perm(16), 7168) == "gluon" and default_engine(perm(16, 16), 2880) == "gluon"
    assert default_engine(perm(16), 128) == "triton"  # one K step of 128
    assert default_engine(perm(16), 96) == "triton"  # K not a multiple of 64
    assert default_engine(perm(32, 32), 7168) == "triton" and default_engine(perm(256, 32), 7168) == "triton"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (10, 0))
    assert default_engine(perm(128, 32), 7168) == "triton" and default_engine(perm(16), 7168) == "triton"


def test_ring_depth_checked():
    """An explicit ring depth that does not fit 224 KiB raises ValueError naming the range (BM 128 + 64 gate/up:
    2 x 58368 + 65536 = 182272 B fits, 3 slots 240640 B do not)."""
    from flint_moe.kernels.nvfp4.grouped_gluon_ws import _meta, ws_stage_bytes

    assert ws_stage_bytes(128, 64) == (58368, 65536)
    assert _meta(128, 64, 2)["STAGES"] == 2
    with pytest.raises(ValueError, match="num_stages = 3 needs 2 .. 2 ring slots at BM 128 \\+ tail 64"):
        _meta(128, 64, 3)
    assert _meta(128, 64, 3, gate_up=False)["STAGES"] == 3  # down: 3 x 58368 + 16384 B


def test_builds():
    """sm_90a builds compiled in a fresh interpreter without TRITON_INTERPRET (see the module docstring)."""
    from ._sm90_build import run_build_script

    res = run_build_script(f"BUILDS = {_BUILDS!r}\n" + _SCRIPT, timeout=900)
    for (bm, tail, gate_up), r in zip(_BUILDS, res, strict=True):
        name = f"{'gate_up' if gate_up else 'down'} BM {bm} TAIL {tail}"
        assert r["smem"] <= 227 * 1024 and r["spills"] == 0, (name, r)
        # the consumers' K loops (with a tail: one per kind of block) are the loops around HGMMA without shared-memory
        # stores or ldmatrix (the weights stay in registers; the tile loop holds the epilogue's scratch copies): a
        # body of WS_UNROLL = 2 K steps of 128 = 2 x 2 halves x 4 HGMMA (and as many on the tail rows), 4 wgmma
        # waits (after the first half, twice in the second step, the final full one), the mbarrier waits and
        # arrives (2 + 2), the partition's barriers (at most 5: Triton's membar around the chained mbarrier
        # operations), no write to a register of an in-flight HGMMA. K = 7168 / 2048 are 56 / 16 steps: no
        # one-step loop for the steps left over.
        k_loops = [loop for loop in r["loops"] if loop["sts"] == 0 and loop["ldsm"] == 0]
        assert [loop["hgmma"] for loop in k_loops] == [16, 32][: 2 if tail else 1], (name, r["loops"])
        assert len(r["loops"]) > len(k_loops), (name, r["loops"])
        for loop in k_loops:
            assert loop["waits"] == 4 and loop["bar_sync"] <= 5 and loop["syncs"] >= 4, (name, loop)
        assert r["inflight"] == 0, (name, r)
        if gate_up:  # the scratch copies are the ones benchmarks.smem_banks models (vector width, count)
            assert r["epilogue"] == _modelled_epilogue(bm, tail), (name, r["epilogue"])


def _modelled_epilogue(bm: int, tail: int) -> dict:
    """PTX shared-memory instructions per thread of the gate/up epilogue's scratch (main block and tail) as
    benchmarks.smem_banks counts them for the kernels' layout (``CURRENT``): the stores ``st.shared[.v<vec>].b32``;
    the loads of the column-major scratch, 32 consecutive words per column, compile to ``ldmatrix.x4`` (4 words per
    thread each: a quarter of the modelled scalar loads)."""
    from benchmarks.smem_banks import CURRENT, epilogue_table

    ops: dict = {}
    for n in (bm, tail) if tail else (bm,):
        row = next(row for row in epilogue_table(n) if row["scratch"] == CURRENT)
        store = row["store"]
        st = f"st.shared.{f'v{store.vec}.' if store.vec > 1 else ''}b32"
        ops[st] = ops.get(st, 0) + store.instructions
        for ld in row["loads"]:
            assert ld.vec == 1 and ld.instructions % 4 == 0, ld
            name = "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
            ops[name] = ops.get(name, 0) + ld.instructions // 4
    return ops


_ODD_SCRIPT = r"""
import json
from benchmarks.sass_grouped_nvfp4 import _resources, inflight_register_writes, sass_of
from flint_moe.kernels.nvfp4.grouped_gluon_ws import compile_ws_sm90
out = []
for gate_up in (True, False):
    c = compile_ws_sm90(1152, 384, 4, 128, 32, gate_up=gate_up)
    out.append({**{k: v for k, v in _resources(c).items() if k != "tma"},
                "inflight": len(inflight_register_writes(sass_of(c.asm["cubin"])))})
print(json.dumps(out))
"""


def test_builds_with_steps_left_over():
    """K steps not a multiple of the loop body (gate/up K = 1152: 9 steps, 4 bodies and one step alone; down
    K = 384: 3 steps): both builds fit, spill nothing and write no register of an in-flight HGMMA."""
    from ._sm90_build import run_build_script

    for r in run_build_script(_ODD_SCRIPT, timeout=900):
        assert r["smem"] <= 227 * 1024 and r["spills"] == 0 and r["inflight"] == 0, r
