"""SASS instruction mix of the decode block's CuTe DSL partial kernel, on the CPU (no GPU needed).

Compiles the routed gate/up and the down host functions of a shape for sm_90a (``ll_partial.compile_gate_up`` /
``compile_down``: what the PTX audit compiles), disassembles the cubin with Triton's bundled ``cuobjdump -sass``
(``sass_grouped_nvfp4.sass_of``) and counts the partial kernel's instructions per opcode, split by the pipe
that issues them on sm_90: the integer / logic ALU pipe (LOP3, SHF, IADD3, LEA, PRMT, ISETP, SEL, ...: half the
FMA pipe's rate) and the FMA pipe (FFMA, FMUL, FADD, IMAD, and the packed f16 HFMA2 / HMUL2 / HADD2). The
kernel holds four bodies (1, 2, 4 and 8 token slots), so the counts are of all four together; ``FFMA`` counts
15 slots x the elements one lane takes per row, which makes ``ALU / FFMA`` the ALU instructions per weight
element and token slot.

``python -m benchmarks.sass_ll_partial [--shape H,I,E,k]`` (default DeepSeek-V3: 7168, 2048, 256, 8; K-splits
as ``ll_launch.ll_plan`` chooses them) prints one table row per build. Needs nvidia-cutlass-dsl (the ``cute``
extra). docs/kernels/ll-block.md (section 9) reads the result.
"""

from __future__ import annotations

import argparse
import collections

from benchmarks.sass_grouped_nvfp4 import _instructions, _opcode, sass_of

__all__ = ["ALU_PIPE", "FMA_PIPE", "partial_mix", "main"]

#: Opcodes issued by the integer / logic ALU pipe on sm_90.
ALU_PIPE = ("LOP3", "SHF", "IADD3", "LEA", "PRMT", "ISETP", "SEL", "MOV", "FSEL", "VIADD", "POPC", "FLO", "BMSK",
            "SGXT", "IMNMX", "PLOP3", "VOTE", "F2FP", "IABS")  # fmt: skip
#: Opcodes issued by the FMA pipe (fp32 and packed f16 arithmetic, integer multiply-add).
FMA_PIPE = ("FFMA", "FMUL", "FADD", "IMAD", "HMUL2", "HFMA2", "HADD2", "IMUL")


def partial_mix(sass: str) -> collections.Counter:
    """Opcode (without modifiers) -> count over every partial-kernel function in ``sass`` (a down build holds
    two: the routed and the shared partial)."""
    mix: collections.Counter = collections.Counter()
    for block in sass.split("Function : ")[1:]:
        if "partial_kernel" not in block.split("\n", 1)[0]:
            continue
        for _, text in _instructions(block):
            mix[_opcode(text).split(".")[0]] += 1
    return mix


def _row(name: str, fn) -> dict:
    mix = partial_mix(sass_of(fn.artifacts.CUBIN))
    alu = sum(v for k, v in mix.items() if k in ALU_PIPE)
    fma = sum(v for k, v in mix.items() if k in FMA_PIPE)
    return dict(build=name, total=sum(mix.values()), alu=alu, fma=fma, ffma=mix["FFMA"],
                top=", ".join(f"{k} {v}" for k, v in mix.most_common(10)))  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="7168,2048,256,8", help="H,I,E,k (the shared intermediate = I)")
    a = ap.parse_args(argv)
    from flint_moe.kernels.cute import ll_launch, ll_partial

    h, i, e, k = (int(v) for v in a.shape.split(","))
    plan = ll_launch.plan_shapes(h, i, i, i, e, k)
    gu, dn = plan.gate_up_spec(), plan.down_spec()
    rows = [_row(f"routed gate/up {gu}", ll_partial.compile_gate_up(gu)),
            _row(f"down (routed + shared) {dn}", ll_partial.compile_down(dn))]  # fmt: skip
    print("| build | instructions | ALU pipe | FMA pipe | FFMA | ALU / FFMA | most frequent |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['build']} | {r['total']} | {r['alu']} | {r['fma']} | {r['ffma']} | {r['alu'] / r['ffma']:.2f} | "
              f"{r['top']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
