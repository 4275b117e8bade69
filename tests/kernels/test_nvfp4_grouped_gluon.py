"""The Gluon grouped GEMMs on the CPU: sm_90a builds (no GPU needed) and the launch checks.

The SASS of every build the launchers take for the real shapes: the main loop issues HGMMA with the A operand
from registers and no shared-memory store (the dequantised weights never leave the registers), one CTA barrier
per K step; registers and shared memory fit two CTAs per SM. Bad configurations raise ValueError naming the
constraint. Bitwise equality with the Triton kernels is a GPU test (test_nvfp4_grouped_gluon_gpu.py).
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.nvfp4.grouped_gluon import GLUON_ROWS, check_gluon_launch, gluon_bk, gluon_stages
from flint_moe.kernels.nvfp4.permute import moe_permute


def test_bk_and_stages():
    assert gluon_bk(7168) == 128 and gluon_bk(2880) == 64 and gluon_bk(1536) == 128
    # BK 128: 64 rows x (64 B codes + 8 B scales) + 128 pairs x 256 B tokens = 36.5 KiB per stage; 110 KiB hold 3
    assert gluon_stages(128, 128) == 3 and gluon_stages(160, 128) == 2
    assert gluon_stages(128, 64) == 4 and gluon_stages(16, 128) == 4 and GLUON_ROWS == 64


def test_launch_checks():
    """Without an sm_90 GPU (here: the CPU, or the interpreter) the Gluon GEMMs refuse every launch, naming why."""
    ids = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match="config ENGINE 'gluon' needs an sm_90 GPU"):
        check_gluon_launch("op", moe_permute(ids, 4, 16), 128)


def test_engine_config_checked():
    from flint_moe.kernels.nvfp4.grouped_gate_up import GROUPED_GATE_UP_CONFIG, _cfg

    with pytest.raises(ValueError, match="ENGINE"):
        _cfg({"ENGINE": "cuda"}, GROUPED_GATE_UP_CONFIG, "nvfp4_grouped_gate_up")
    assert _cfg({"ENGINE": "gluon"}, GROUPED_GATE_UP_CONFIG, "x")["ENGINE"] == "gluon"


_BUILDS = [("gate_up", 7168, 2048, 8, 128, 0), ("down", 7168, 2048, 8, 128, 0), ("gate_up", 7168, 2048, 8, 16, 0),
           ("down", 2880, 2880, 4, 64, 0), ("gate_up", 7168, 2048, 8, 128, 32),
           ("down", 7168, 2048, 8, 16, 16)]  # fmt: skip

_SCRIPT = r"""
import json
from benchmarks.sass_grouped_nvfp4 import hgmma_loops, inflight_register_writes, sass_of
from flint_moe.kernels.nvfp4.grouped_gluon import compile_gluon_sm90
res = []
for kind, H, I, k, bm, tail in BUILDS:
    c = compile_gluon_sm90(kind, H, I, k, bm, tail=tail)
    sass = sass_of(c.asm["cubin"])
    res.append({"loops": hgmma_loops(sass), "shared": c.metadata.shared, "inflight": inflight_register_writes(sass)})
print(json.dumps(res))
"""


def test_main_loop_keeps_weights_in_registers():
    """sm_90a SASS of the launchers' builds (compiled in a fresh interpreter without TRITON_INTERPRET): a K loop
    of BK / 16 HGMMA.64xBMx16 per K step with the A operand in registers (with a tail: a second loop, for the
    blocks that have one, adding BK / 16 HGMMA.64xTAILx16 on the same A registers), no STS / LDSM (the weights
    never go through shared memory), at most 2 CTA barriers per step, <= 113 KiB of shared memory (two CTAs per
    SM), no instruction writing the A or accumulator registers of an HGMMA before the wait that covers it, and at
    most one wgmma wait per accumulator per K step. The decode's instruction budget per K step, per thread (64 rows x
    BK codes over 128 threads: BK / 4 A registers): one PRMT per A register (the byte select; no scale duplication),
    two HMUL2 per A register (2^126, the scale) plus two per scale word of each of the thread's two rows
    (BK / 64 words: the exact 2^120), and every scale multiply takes its scale as a broadcast half (.H0_H0 / .H1_H1)."""
    from ._sm90_build import run_build_script

    res = run_build_script(f"BUILDS = {_BUILDS!r}\n" + _SCRIPT, timeout=900)
    for (kind, H, I, _k, bm, tail), r in zip(_BUILDS, res, strict=True):  # noqa: E741, N806
        name = f"{kind} BM {bm} TAIL {tail}"
        steps = gluon_bk(H if kind == "gate_up" else I) // 16
        assert r["inflight"] == [], (name, r["inflight"][:2])
        assert r["shared"] <= 113 * 1024, name
        loops = sorted(r["loops"], key=len)
        assert len(loops) == (2 if tail else 1), name
        for body, shapes in zip(loops, [[bm], [bm, tail]], strict=False):
            ops = [line.split()[1] if line.startswith("@") else line.split()[0] for line in body]
            hgmma = [line for line in body if line.startswith("HGMMA")]
            want = sorted(f"HGMMA.64x{n}x16.F32.BF16" for n in shapes for _ in range(steps))
            assert sorted(h.split()[0] for h in hgmma) == want, (name, hgmma[:2])
            assert all(h.split(",")[1].strip().startswith("R") for h in hgmma)  # A from registers, not gdesc
            assert not any(o.startswith(("STS", "LDSM")) for o in ops), name
            assert sum(o.startswith("BAR.SYNC") for o in ops) <= 2, name
            # at most one wgmma wait per accumulator per K step (ptxas serialises the HGMMAs with more waits when a
            # register of an in-flight HGMMA would be written)
            assert sum(o.startswith("WARPGROUP.DEPBAR") for o in ops) <= len(shapes), name
            hmul2 = [line for line in body if line.split()[0].startswith("HMUL2")]
            assert sum(o.startswith("PRMT") for o in ops) == steps * 4, name  # steps = BK / 16: BK / 4 A registers
            assert len(hmul2) == steps * 8 + 2 * 2 * (steps // 4), name
            assert sum(".H0_H0" in h or ".H1_H1" in h for h in hmul2) == steps * 4, name


def _sass(*lines: str) -> str:
    return "\n".join(f"        /*{16 * i:04x}*/                   {t} ;" for i, t in enumerate(lines))


def test_inflight_register_check():
    """The SASS check flags a write to an in-flight HGMMA's A quad or accumulator before the covering wait (all
    groups, or all but the N youngest), through an unconditional branch, and nothing after the wait or to other
    registers."""
    from benchmarks.sass_grouped_nvfp4 import inflight_register_writes

    hg = "HGMMA.64x16x16.F32.BF16 R24, R40, gdesc[UR8], R24, gsb0"
    wait = "WARPGROUP.DEPBAR.LE gsb0, 0x0"
    assert inflight_register_writes(_sass(hg, "PRMT R43, R3, 0x4440, R5", wait)) == [(hg, "PRMT R43, R3, 0x4440, R5")]
    assert inflight_register_writes(_sass(hg, "FADD R31, R1, R2", wait)) == [(hg, "FADD R31, R1, R2")]  # acc R24..31
    assert inflight_register_writes(_sass(hg, "LDS.128 R36, [R2]", "BRA 0x40", "NOP", wait)) == []  # R36..39
    imad = "IMAD R40, R1, R2, RZ"
    assert inflight_register_writes(_sass(hg, "BRA 0x30", wait, imad)) == [(hg, imad)]
    assert inflight_register_writes(_sass(hg, wait, "IMAD R40, R1, R2, RZ", "FADD R24, R1, R2")) == []
    assert inflight_register_writes(_sass(hg, "LDS.128 R37, [R2]", wait)) == [(hg, "LDS.128 R37, [R2]")]
    # the taken side of a predicated branch, a predicate destination before the register one, a label-only branch
    assert inflight_register_writes(_sass(hg, "@P0 BRA 0x40", wait, "EXIT", imad)) == [(hg, imad)]
    lop = "LOP3.LUT P0, R41, R9, 0x1, RZ, 0xc0, !PT"
    assert inflight_register_writes(_sass(hg, lop, wait)) == [(hg, lop)]
    assert inflight_register_writes(_sass(hg, "BRA `(.L_x_1)", wait)) == [(hg, "BRA `(.L_x_1)")]
    # a predicated wait does not cover; EXIT ends the path
    assert inflight_register_writes(_sass(hg, "@P1 " + wait, imad)) == [(hg, imad)]
    assert inflight_register_writes(_sass(hg, "EXIT", imad)) == []
    # a wait that leaves N groups in flight retires the groups committed before the last N: one younger group
    # (hg2, gsb0: its own commit) after hg's lets "wait 0x1" retire hg but not hg2 (A R44..47)
    hg2 = "HGMMA.64x16x16.F32.BF16 R32, R44, gdesc[UR8], R32, gsb0"
    wait1 = "WARPGROUP.DEPBAR.LE gsb0, 0x1"
    assert inflight_register_writes(_sass(hg, hg2, wait1, imad)) == []
    assert inflight_register_writes(_sass(hg, hg2, wait1, "IMAD R45, R1, R2, RZ")) == [(hg2, "IMAD R45, R1, R2, RZ")]
    assert inflight_register_writes(_sass(hg, wait1, imad)) == [(hg, imad)]  # no younger group: hg still in flight
    # an HGMMA without gsb0 belongs to the group the next gsb0 closes: that commit is its own, not a younger one
    open_hg = "HGMMA.64x16x16.F32.BF16 R24, R40, gdesc[UR8], R24"
    assert inflight_register_writes(_sass(open_hg, hg2, wait1, imad)) == [(open_hg, imad)]
    assert inflight_register_writes(_sass(open_hg, hg2, wait, imad)) == []


_RING_SCRIPT = r"""
import json, re
from flint_moe.kernels.nvfp4.grouped_gluon import compile_gluon_sm90
ptx = {I: compile_gluon_sm90("down", 1024, I, 8, 16).asm["ptx"] for I in (256, 2048)}
print(json.dumps({I: len(re.findall(r"cp\.async\.c[ag]\.shared", p)) for I, p in ptx.items()}))
"""


def test_short_k_loop_reads_nothing_past_its_last_step():
    """A K loop shorter than the ring: the down GEMM at I = 256 runs 2 K steps of 128 on a ring of
    ``gluon_stages(16, 128)`` = 4 slots. Its prologue issues the copies of steps 0 and 1 only (step 2 would read
    16 B-aligned code words past the last weight row: an illegal address at the last expert). In PTX, with c the
    ``cp.async`` copies of one step: I = 2048 (16 steps) has 3 prologue steps and one refill in the loop, 4c;
    I = 256 has 2c (both steps in the prologue, the loop's refills statically out of range)."""
    from ._sm90_build import run_build_script

    counts = {int(k): v for k, v in run_build_script(_RING_SCRIPT, timeout=600).items()}
    assert gluon_stages(16, 128) == 4 and gluon_bk(256) == 128
    c = counts[2048] // 4
    assert c > 0 and counts[2048] == 4 * c and counts[256] == 2 * c, counts
