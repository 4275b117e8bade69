"""SASS instruction mix of the grouped NVFP4 GEMMs' main loop, on the CPU (no GPU needed).

Compiles ``_grouped_gate_up_kernel`` / ``_grouped_down_kernel`` for sm_90 exactly as the PTX audit does
(``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``, pointer arguments specialised 16-byte
aligned as a launch on torch tensors specialises them), disassembles the cubin with Triton's bundled
``cuobjdump -sass`` and counts, inside the main K loop (the backward branch whose body holds the HGMMAs),
the instructions per opcode and per HGMMA. Also reports registers per thread, spills, shared memory and the
``cp.async`` / TMA pipeline.

``python -m benchmarks.sass_grouped_nvfp4 [--only gate_up|down] [--dump DIR]`` prints one table row per build
(DeepSeek-V3 H = 7168, I = 2048, k = 8 unless ``--shape H,I,k``); ``--dump`` writes each build's SASS.
docs/kernels/nvfp4-grouped.md ("Tensor-core efficiency: where the time goes") reads the result.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import subprocess
import tempfile

__all__ = ["compile_sm90", "sass_of", "hgmma_loops", "main_loop", "loop_mix", "BUILDS"]

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")

#: (kernel, BM, BK, num_stages, name[, TAIL[, SW]]); num_warps from the kernels' default_warps(BM), BH from
#: default_bh; TAIL > 0: the expert-wide row-block build (two main loops: with the tail accumulator, and without);
#: SW: the scales as one word per row per 64 K (config ``SCALE_WORD``).
BUILDS = [
    ("gate_up", 128, 64, 3, "gate/up BM128 BK64"),
    ("gate_up", 128, 128, 3, "gate/up BM128 BK128"),
    ("gate_up", 64, 64, 3, "gate/up BM64 BK64"),
    ("gate_up", 256, 64, 3, "gate/up BM256 BK64"),
    ("gate_up", 16, 64, 3, "gate/up BM16 BK64"),
    ("gate_up", 64, 128, 3, "gate/up BM64 BK128"),
    ("gate_up", 128, 64, 4, "gate/up BM128 BK64 4 stages"),
    ("gate_up", 256, 128, 3, "gate/up BM256 BK128"),
    ("gate_up", 16, 128, 3, "gate/up BM16 BK128"),
    ("down", 128, 64, 3, "down BM128 BK64"),
    ("down", 128, 128, 3, "down BM128 BK128"),
    ("down", 64, 64, 3, "down BM64 BK64"),
    ("down", 256, 64, 3, "down BM256 BK64"),
    ("down", 16, 64, 3, "down BM16 BK64"),
    ("down", 64, 128, 3, "down BM64 BK128"),
    ("down", 256, 128, 3, "down BM256 BK128"),
    ("down", 16, 128, 3, "down BM16 BK128"),
    ("gate_up", 128, 128, 3, "gate/up rows BM128+32 BK128", 32),
    ("down", 128, 128, 3, "down rows BM128+32 BK128", 32),
    ("gate_up", 256, 64, 3, "gate/up rows BM256+32 BK64", 32),
    ("down", 256, 64, 3, "down rows BM256+32 BK64", 32),
    ("gate_up", 128, 64, 3, "gate/up BM128 BK64 SW", 0, True),
    ("gate_up", 256, 64, 3, "gate/up BM256 BK64 SW", 0, True),
    ("down", 256, 64, 3, "down BM256 BK64 SW", 0, True),
    ("gate_up", 16, 64, 3, "gate/up BM16 BK64 SW", 0, True),
    ("gate_up", 256, 64, 3, "gate/up rows BM256+32 BK64 SW", 32, True),
    ("down", 256, 64, 3, "down rows BM256+32 BK64 SW", 32, True),
]


def _tool(name: str) -> str:
    import triton

    return str(pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def compile_sm90(kind: str, bm: int, bk: int, stages: int, H: int = 7168, I: int = 2048, k: int = 8,  # noqa: E741
                 tail: int = 0, sw: bool = False):  # fmt: skip
    """The compiled sm_90 kernel (``triton.compile`` result) of the grouped gate/up (``kind`` "gate_up") or down
    ("down") production build (TAP off, DECODE 3) at (H, I, k) with row block ``bm``, K step ``bk``; ``tail`` > 0:
    the expert-wide row-block build (``_grouped_gate_up_rows_kernel`` / ``_grouped_down_rows_kernel``, blocks of
    ``bm + tail`` pairs); ``sw``: the scales loaded as one word per row per 64 K (config ``SCALE_WORD``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from flint_moe.kernels.nvfp4 import grouped_down as gd, grouped_gate_up as gu

    ip = (I + 63) // 64 * 64
    if kind == "gate_up":
        kern = gu._grouped_gate_up_kernel
        sig = {"x_ptr": "*bf16", "order_ptr": "*i32", "bexp_ptr": "*i32", "bstart_ptr": "*i32", "bend_ptr": "*i32",
               "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32", "act_ptr": "*bf16", "gacc_ptr": "*fp32",
               "uacc_ptr": "*fp32"}  # fmt: skip
        consts = {"H": H, "IP": ip, "INTER": I, "TOPK": k, "BM": bm, "BC": gu.GROUPED_GATE_UP_CONFIG["BC"], "BK": bk,
                  "DECODE": 3, "TAP": False, "SW": sw}  # fmt: skip
        if tail:
            kern, consts = gu._grouped_gate_up_rows_kernel, {**consts, "TAIL": tail}
    elif kind == "down":
        kern = gd._grouped_down_kernel
        sig = {"act_ptr": "*bf16", "order_ptr": "*i32", "bexp_ptr": "*i32", "bstart_ptr": "*i32", "bend_ptr": "*i32",
               "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32", "y_ptr": "*bf16", "dacc_ptr": "*fp32"}  # fmt: skip
        consts = {"H": H, "IP": ip, "INTER": I, "BM": bm, "BH": gd.default_bh(bm), "BK": bk, "DECODE": 3, "TAP": False,
                  "SW": sw}  # fmt: skip
        if tail:
            kern, consts = gd._grouped_down_rows_kernel, {**consts, "TAIL": tail}
    else:
        raise ValueError(f"compile_sm90: kind must be 'gate_up' or 'down', got {kind!r}")
    full = {a: ("constexpr" if a in consts else sig[a]) for a in kern.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(kern.arg_names) if full[a].startswith("*")}
    src = ASTSource(fn=kern, signature=full, constexprs=consts, attrs=attrs)
    opts = {"num_warps": gu.default_warps(bm), "num_stages": stages, "enable_fp_fusion": True}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def sass_of(cubin: bytes) -> str:
    """``cuobjdump -sass`` of a cubin (Triton's bundled CUDA 12.8 tool)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        return subprocess.run([_tool("cuobjdump"), "-sass", path], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)


def _instructions(sass: str) -> list[tuple[int, str]]:
    out = []
    for line in sass.splitlines():
        m = _LINE.search(line)
        if m and not m.group(2).startswith("/*"):
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def hgmma_loops(sass: str) -> list[list[str]]:
    """The instructions of every backward-branch loop that holds HGMMA instructions and no other such loop
    (the K loops; the expert-wide row-block build has two), in address order."""
    ins = _instructions(sass)
    loops = []
    for addr, text in ins:
        m = re.search(r"BRA\S*\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if m is None or not _opcode(text).startswith("BRA"):
            continue
        tgt = int(m.group(1), 16)
        if tgt >= addr:
            continue
        body = [t for a, t in ins if tgt <= a <= addr]
        if any(_opcode(t).startswith("HGMMA") for t in body):
            loops.append((tgt, addr, body))
    inner = [b for t, a, b in loops if not any(t <= t2 and a2 <= a and (t2, a2) != (t, a) for t2, a2, _ in loops)]
    if not inner:
        raise RuntimeError("hgmma_loops: no backward branch around an HGMMA")
    return inner


#: Opcodes that write no general register (their first operand is a source, a predicate or an address).
_NO_REG_DEST = ("ST", "BAR", "BRA", "BRX", "JMX", "HGMMA", "WARPGROUP", "DEPBAR", "LDGSTS", "RED", "EXIT", "ISETP",
                "FSETP", "PLOP", "NOP", "LDGDEPBAR", "WARPSYNC", "U", "BSSY", "BSYNC", "CALL", "RET", "MEMBAR",
                "FENCE", "SYNCS.EXCH", "SYNCS.PHASECHK", "R2UR")  # fmt: skip
#: A predicate destination written before the register one (``SHFL.BFLY PT, R9, ..``, ``LOP3.LUT P0, R11, ..``).
_PRED_DEST = re.compile(r"\s*!?U?P(?:T|\d+)\s*,")
_HGMMA = re.compile(r"HGMMA\.64x(\d+)x\d+\.(F32|F16)\S*\s+R(\d+),\s*(?:R(\d+)|gdesc)")
#: An unpredicated wgmma wait (``wgmma.wait_group N``): at most N committed groups left in flight.
_WAIT = re.compile(r"(?:@PT\s+)?WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)")
#: The operand that marks the HGMMA closing a wgmma group (its commit); groups counted up to _MAX_GROUPS.
_GROUP_COMMIT, _MAX_GROUPS = "gsb0", 8


def _width(op: str) -> int:
    """Registers a result of opcode ``op`` occupies."""
    parts = op.split(".")
    if ".128" in op or (parts[0] == "LDSM" and parts[-1] == "4"):
        return 4
    if ".64" in op or (parts[0] == "LDSM" and parts[-1] == "2") or op.startswith(("IMAD.WIDE", "SYNCS.ARRIVE")):
        return 2
    if parts[0] in ("DADD", "DMUL", "DFMA", "CS2R") or "F64" in parts[1:2]:
        return 2
    return 1


def _written_regs(text: str) -> set[int]:
    """General registers an instruction writes: its first register operand after any predicate destinations and,
    for 64 / 128-bit results, the next ones."""
    op = _opcode(text)
    if op.startswith(_NO_REG_DEST):
        return set()
    rest = text.split(op, 1)[1]
    while (p := _PRED_DEST.match(rest)) is not None:
        rest = rest[p.end() :]
    m = re.match(r"\s*R(\d+)\b", rest)
    if m is None:
        return set()
    return set(range(int(m.group(1)), int(m.group(1)) + _width(op)))


def inflight_register_writes(sass: str) -> list[tuple[str, str]]:
    """Every write to a register that an issued HGMMA still reads or accumulates into (A quad ``Ra..Ra+3`` when A
    comes from registers, accumulator ``Rd..`` of N / 2 fp32 or N / 4 fp16 registers), on every path from the
    HGMMA (both ways at a predicated branch, through unconditional ones, ending at ``EXIT``) up to an unpredicated
    ``WARPGROUP.DEPBAR.LE gsb0, N`` that retires it: its own group closed (the HGMMA carrying ``gsb0``, the
    group's commit) and at least N groups committed after it on that path (N = 0: the wait for every committed
    group). PTX leaves those registers undefined to change before that wait; ptxas renames such a write or adds a
    wait before it (a hand-written violation compiled that way), so on ptxas output this guards the tool chain, and
    the count of waits per K step (the CPU test) catches the serialisation it falls back to. A branch without an
    address counts as a write. Pairs (HGMMA, offending instruction); [] for a correct build."""
    ins = _instructions(sass)
    at = {a: i for i, (a, _) in enumerate(ins)}
    bad = []
    for i, (_, text) in enumerate(ins):
        m = _HGMMA.match(text)
        if m is None:
            continue
        n, acc = int(m.group(1)), int(m.group(3))
        live = set(range(acc, acc + n // (2 if m.group(2) == "F32" else 4)))
        if m.group(4):
            live |= set(range(int(m.group(4)), int(m.group(4)) + 4))
        # (instruction, groups committed after this HGMMA's own group on the path; -1 while its group is open)
        todo, seen = [(i + 1, 0 if _GROUP_COMMIT in text else -1)], set()
        while todo:
            j, younger = todo.pop()
            if (j, younger) in seen or j >= len(ins):
                continue
            seen.add((j, younger))
            t = ins[j][1]
            op, predicated = _opcode(t), t.startswith("@") and not t.startswith("@PT ")
            wait = _WAIT.match(t)
            if (wait and younger >= int(wait.group(1), 16)) or (op == "EXIT" and not predicated):
                continue
            if op.startswith(("BRA", "JMP")):
                target = re.search(r"0x([0-9a-f]+)\s*$", t)
                if target is None:
                    bad.append((text, t))
                    continue
                todo.append((at.get(int(target.group(1), 16), len(ins)), younger))
                if predicated or op != "BRA":  # may fall through (BRA.U / BRA.DIV carry their own predicate)
                    todo.append((j + 1, younger))
                continue
            if op.startswith("HGMMA"):
                if _GROUP_COMMIT in t:
                    younger = min(younger + 1, _MAX_GROUPS)
            elif _written_regs(t) & live:
                bad.append((text, t))
                break
            todo.append((j + 1, younger))
    return bad


def main_loop(sass: str) -> list[str]:
    """The instructions of the innermost backward-branch loop that holds HGMMA instructions (the K loop; of
    several, the shortest)."""
    return min(hgmma_loops(sass), key=len)


def _opcode(text: str) -> str:
    words = text.split()
    if words[0].startswith("@"):
        words = words[1:]
    return words[0]


_GROUPS = [
    ("HGMMA", lambda o: o.startswith("HGMMA")),
    ("HMMA", lambda o: o.startswith("HMMA")),
    ("WARPGROUP/ARRIVE", lambda o: o.startswith(("WARPGROUP", "WARPSYNC"))),
    ("LOP3", lambda o: o.startswith("LOP3")),
    ("PRMT", lambda o: o.startswith("PRMT")),
    ("HMUL2/HFMA2/HADD2", lambda o: o.startswith(("HMUL2", "HFMA2", "HADD2"))),
    ("IMAD/IADD/LEA", lambda o: o.startswith(("IMAD", "IADD", "LEA", "IABS", "IMNMX"))),
    ("SHF/SHL/SHR", lambda o: o.startswith(("SHF", "SHL", "SHR"))),
    ("MOV/SEL", lambda o: o.startswith(("MOV", "UMOV", "SEL", "F2FP", "R2UR", "S2R", "CS2R", "S2UR"))),
    ("ISETP/PLOP", lambda o: o.startswith(("ISETP", "PLOP3", "FSETP", "P2R", "R2P"))),
    ("F-ops (FMUL/FFMA/I2F/F2F)", lambda o: o.startswith(("FMUL", "FFMA", "FADD", "I2F", "F2F", "F2I"))),
    ("STS", lambda o: o.startswith("STS")),
    ("LDS/LDSM", lambda o: o.startswith(("LDS", "LDSM"))),
    ("LDGSTS (cp.async)", lambda o: o.startswith("LDGSTS")),
    ("LDGDEPBAR/DEPBAR", lambda o: o.startswith(("LDGDEPBAR", "DEPBAR"))),
    ("LDG", lambda o: o.startswith("LDG") and not o.startswith(("LDGSTS", "LDGDEPBAR"))),
    ("UTMALDG (TMA)", lambda o: o.startswith("UTMA")),
    ("BAR/SYNCS", lambda o: o.startswith(("BAR", "SYNCS", "MEMBAR", "FENCE"))),
    ("uniform (U*)", lambda o: o.startswith("U") and not o.startswith("UTMA")),
    ("BRA/other", lambda o: True),
]


def loop_mix(body: list[str]) -> dict:
    """Counts per opcode group, the raw opcode counter, and the HGMMA shapes of a loop body."""
    ops = collections.Counter(_opcode(t) for t in body)
    groups = collections.Counter()
    for op, n in ops.items():
        for g, pred in _GROUPS:
            if pred(op):
                groups[g] += n
                break
    shapes = collections.Counter(_opcode(t) for t in body if _opcode(t).startswith("HGMMA"))
    # A operand from registers: "HGMMA.64xNx16.F32.BF16 Rd, Ra, gdesc[...]"; from shared memory: "gdesc[...], gdesc"
    a_regs = sum(1 for t in body if _opcode(t).startswith("HGMMA") and re.search(r"HGMMA\S*\s+R\d+,\s*R\d+", t))
    return {"ops": ops, "groups": groups, "shapes": shapes, "a_from_regs": a_regs, "total": len(body), "body": body}


#: sm_90 per-SM resources of the model: 4 warp schedulers (one instruction per clock each), dense bf16 MMA
#: 2048 multiply-adds per clock (989 TFLOP/s at 132 SMs and 1.83 GHz), shared memory 128 B per clock,
#: 65536 registers, 228 KiB shared memory (1 KiB reserved per CTA), 64 warps.
SCHEDULERS, MAC_PER_CLK, SMEM_B_PER_CLK = 4, 2048, 128


def _smem_bytes_per_thread(body: list[str]) -> dict:
    """Shared-memory bytes per thread per loop iteration by kind (cp.async fill, LDS, STS, LDSM); predicated-off
    (``@!PT``) instructions excluded."""
    width = {"128": 16, "64": 8}
    out = collections.Counter()
    for t in body:
        if t.startswith("@!PT"):
            continue
        op = _opcode(t)
        parts = op.split(".")
        if op.startswith("LDGSTS"):
            out["cp.async"] += width.get(parts[-1], 4)
        elif op.startswith("LDSM"):
            out["LDSM"] += {"4": 16, "2": 8}.get(parts[-1], 4)
        elif parts[0] in ("LDS", "STS"):
            out[parts[0]] += width.get(parts[-1], 4)
    return out


def step_model(kind: str, bm: int, bk: int, res: dict, mix: dict, cols: int | None = None) -> dict:
    """Per CTA and K step: MMA cycles at the dense bf16 rate, issue cycles (warps x loop instructions / 4
    schedulers), shared-memory bytes (cp.async fill, LDS, STS, LDSM per thread x threads, plus the wgmma B
    operand: each warpgroup reads the [cols, BK] bf16 token tile) and cycles at 128 B/clk, CTAs per SM.
    ``cols``: the token columns the loop's MMAs cover (BM, or BM + TAIL in the loop with the tail
    accumulator); the budget is the mean N / 2 of the loop's HGMMAs."""
    from flint_moe.kernels.nvfp4.grouped_gate_up import default_warps

    warps = default_warps(bm)
    cols = cols or bm
    rows = 128  # gate/up: 2 * BC = 128 [up; gate] rows; down: BH = 128 hidden rows
    mma = rows * cols * bk / MAC_PER_CLK
    issue = warps * mix["total"] / SCHEDULERS
    per_thread = _smem_bytes_per_thread(mix["body"])
    b_operand = (warps // 4) * cols * bk * 2
    smem = sum(per_thread.values()) * 32 * warps + b_operand
    regs_cta = -(-max(res["regs"], 1) // 8) * 8 * 32 * warps
    ctas = min(65536 // regs_cta, (228 * 1024) // (res["smem"] + 1024), 64 // warps, 32)
    n_mma = sum(mix["shapes"].values())
    n_sum = sum(int(shape.split(".")[1].split("x")[1]) * n for shape, n in mix["shapes"].items())
    return {"mma": mma, "issue": issue, "smem_bytes": smem, "smem": smem / SMEM_B_PER_CLK, "ctas": ctas,
            "per_hgmma": mix["total"] / max(n_mma, 1), "budget": n_sum / 2 / max(n_mma, 1),
            "per_thread": dict(per_thread), "b_operand": b_operand}  # fmt: skip


def _resources(compiled) -> dict:
    """Registers, local memory (spills) and stack from ``cuobjdump -res-usage``; shared memory from Triton's
    metadata; the pipeline's copy instructions from the PTX."""
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
        path = f.name
    try:
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", path], capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    use = dict(re.findall(r"(REG|STACK|LOCAL|SHARED):(\d+)", res.stdout))
    return {
        "regs": int(use.get("REG", -1)),
        "spills": int(use.get("LOCAL", 0)) + int(use.get("STACK", 0)),
        "smem": compiled.metadata.shared,
        "cp_async": ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
        "tma": ptx.count("cp.async.bulk.tensor"),
    }


#: Gluon builds (``--gluon``; ``grouped_gluon``, config ENGINE 'gluon'): (kind, BM, TAIL, name); BK, ring depth
#: and warps are the launchers' (``gluon_bk``, ``gluon_stages``, ``GLUON_WARPS``).
GLUON_BUILDS = [
    ("gate_up", 128, 0, "gluon gate/up BM128"),
    ("gate_up", 128, 32, "gluon gate/up BM128+32"),
    ("down", 128, 0, "gluon down BM128"),
    ("down", 128, 32, "gluon down BM128+32"),
    ("gate_up", 16, 0, "gluon gate/up BM16"),
    ("down", 16, 0, "gluon down BM16"),
]


def gluon_main(H: int, I: int, k: int) -> list:  # noqa: E741, N803
    """``--gluon``: registers, shared memory and the main loop's mix per HGMMA of every ``GLUON_BUILDS`` build
    (printed as a markdown table; returned as rows)."""
    from flint_moe.kernels.nvfp4.grouped_gluon import compile_gluon_sm90

    rows = []
    print("| build | regs | smem KiB | loop instr | HGMMA | instr / HGMMA | STS | LDS | LDGSTS | BAR |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for kind, bm, tail, name in GLUON_BUILDS:
        c = compile_gluon_sm90(kind, H, I, k, bm, tail=tail)
        res = _resources(c)
        mix = loop_mix(max(hgmma_loops(sass_of(c.asm["cubin"])), key=len))
        n = sum(mix["shapes"].values())
        g = mix["groups"]
        shapes = ", ".join(f"{v} x {s_.split('.')[1]}" for s_, v in mix["shapes"].items())
        print(f"| {name} | {res['regs']} | {res['smem'] / 1024:.0f} | {mix['total']} | {shapes} | "
              f"{mix['total'] / n:.1f} | {g.get('STS', 0)} | {g.get('LDS/LDSM', 0)} | "
              f"{g.get('LDGSTS (cp.async)', 0)} | {g.get('BAR/SYNCS', 0)} |")  # fmt: skip
        rows.append({"build": name, **res, "mix": dict(g), "hgmma": n})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["gate_up", "down"])
    p.add_argument("--shape", default="7168,2048,8", help="H,I,k")
    p.add_argument("--dump", help="write each build's SASS here")
    p.add_argument("--builds", help="comma-separated indices into BUILDS")
    p.add_argument("--markdown", action="store_true", help="end with the summary tables in markdown")
    p.add_argument("--gluon", action="store_true", help="the Gluon GEMMs' builds (GLUON_BUILDS) instead")
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("sass_grouped_nvfp4: unset TRITON_INTERPRET (the sm_90 build is compiled, not interpreted)")
    H, I, k = (int(v) for v in a.shape.split(","))  # noqa: E741
    if a.gluon:
        gluon_main(H, I, k)
        return 0
    sel = range(len(BUILDS)) if not a.builds else [int(v) for v in a.builds.split(",")]
    rows = []
    for idx in sel:
        kind, bm, bk, stages, name, *extra = BUILDS[idx]
        tail = extra[0] if extra else 0
        sw = bool(extra[1]) if len(extra) > 1 else False
        if a.only and kind != a.only:
            continue
        c = compile_sm90(kind, bm, bk, stages, H, I, k, tail=tail, sw=sw)
        sass = sass_of(c.asm["cubin"])
        if a.dump:
            d = pathlib.Path(a.dump)
            d.mkdir(parents=True, exist_ok=True)
            tag = f"{f'.T{tail}' if tail else ''}{'.SW' if sw else ''}"
            (d / f"{kind}.BM{bm}.BK{bk}.S{stages}{tag}.sass").write_text(sass)
        res = _resources(c)
        if tail:  # the loop with the tail accumulator (more HGMMAs) and the one without
            loops = sorted(hgmma_loops(sass), key=len, reverse=True)
            named = [(f"{name} [tail]", loops[0], bm + tail), (f"{name} [no tail]", loops[-1], bm)]
        else:
            named = [(name, main_loop(sass), bm)]
        for lname, body, cols in named:
            mix = loop_mix(body)
            n_mma = sum(mix["shapes"].values())
            print(f"## {lname}: {res['regs']} regs, {res['spills']} spills, {res['smem']} B smem, "
                  f"cp.async {res['cp_async']} / TMA {res['tma']} in PTX; loop {mix['total']} instr, "
                  f"{n_mma} HGMMA {dict(mix['shapes'])} (A from registers: {mix['a_from_regs']})")  # fmt: skip
            for g, n in sorted(mix["groups"].items(), key=lambda t: -t[1]):
                print(f"   {g:28s} {n:5d}  {n / max(n_mma, 1):7.2f} / HGMMA")
            print("   opcodes:", ", ".join(f"{o} {n}" for o, n in mix["ops"].most_common()))
            m = step_model(kind, bm, bk, res, mix, cols)
            rows.append((lname, res, mix, n_mma, m))
            print(f"   per CTA-step: MMA {m['mma']:.0f} clk, issue {m['issue']:.0f} clk, shared memory "
                  f"{m['smem_bytes'] / 1024:.0f} KiB = {m['smem']:.0f} clk {m['per_thread']} + B "
                  f"{m['b_operand']} B; {m['ctas']} CTAs/SM")  # fmt: skip
    if a.markdown:
        _markdown(rows)
    return 0


_COLS = ["LOP3", "PRMT", "HMUL2/HFMA2/HADD2", "IMAD/IADD/LEA", "SHF/SHL/SHR", "MOV/SEL", "ISETP/PLOP",
         "F-ops (FMUL/FFMA/I2F/F2F)", "uniform (U*)", "LDS/LDSM", "STS", "LDGSTS (cp.async)", "LDG", "BAR/SYNCS",
         "WARPGROUP/ARRIVE", "LDGDEPBAR/DEPBAR", "BRA/other"]  # fmt: skip


def _markdown(rows) -> None:
    print()
    print("| build | regs | spill | smem KiB | CTAs/SM | loop instr | HGMMA / warp | instr / HGMMA | budget N/2 |"
          " issue / MMA | smem KiB / step | smem / MMA |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    for name, res, mix, _n, m in rows:
        shape = ", ".join(f"{n} x {s.split('.')[1]}" for s, n in mix["shapes"].items())
        print(f"| {name} | {res['regs']} | {res['spills']} | {res['smem'] / 1024:.0f} | {m['ctas']} | {mix['total']} | "
              f"{shape} | {m['per_hgmma']:.1f} | {m['budget']:.0f} | {m['issue'] / m['mma']:.2f} | "
              f"{m['smem_bytes'] / 1024:.0f} | {m['smem'] / m['mma']:.2f} |")  # fmt: skip
    print()
    short = [c.split(" ")[0] for c in _COLS]
    print("| build (per HGMMA) | " + " | ".join(short) + " |")
    print("|---|" + "---:|" * len(_COLS))
    for name, _res, mix, n_mma, _m in rows:
        print(f"| {name} | " + " | ".join(f"{mix['groups'].get(c, 0) / n_mma:.2f}" for c in _COLS) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
