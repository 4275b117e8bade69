"""The tensor-core path's thread mapping, checked on the sm_90 TTGIR (CPU, no GPU needed).

``nvfp4.mma.mma_rows`` hands each thread's (row, chunk) pointers to an inline-PTX ``mma.sync`` that assumes
the default blocked layout of a [R, 4] tile: 8 x 4 threads per warp (lane = 4 * row group + chunk), warps along
the rows, one element per thread and repetition. Triton chooses that layout itself; this test compiles the
MMA specialisations the benchmarks and defaults use (in a subprocess without TRITON_INTERPRET, as
tests/kernels/test_ptx_audit.py does; two with the load fence ``FENCE``, the tuned down default with
``EARLY`` loads and ``maxnreg`` 72) and
asserts the layout of every
tensor entering the MMA asm, so a Triton upgrade that changed it fails here instead of producing wrong sums on
the GPU.
"""

from __future__ import annotations

import re

from tests.kernels._sm90_build import PREAMBLE, run_build_script

BACKEND = "any"

_SCRIPT = PREAMBLE + r"""


def ttgir(K, sig, ce, nw, maxnreg=0):
    full = {a: ("constexpr" if a in ce else sig[a]) for a in K.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(K.arg_names) if a in sig}
    src = ASTSource(fn=K, signature=full, constexprs=ce, attrs=attrs)
    opts = {"num_warps": nw, "num_stages": 1, "enable_fp_fusion": True}
    if maxnreg:
        opts["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ttgir"]


out = []
for nw, rt, s, sk, fe in ((2, 2, 4, 1, 0), (1, 2, 2, 1, 0), (8, 2, 4, 4, 0), (4, 2, 2, 4, 1), (4, 2, 4, 4, 1)):
    bn = 8 * nw * rt // (2 * sk)
    ce = dict(H=7168, IP=2048, INTER=2048, TOPK=8, BN=bn, BKB=512, MMA=True, RT=rt, S=s, SK=sk, NW=nw,
              FENCE=bool(fe), TAP=False)
    out.append(dict(kernel="gate_up", nw=nw, rt=rt, sk=sk, ttgir=ttgir(G._nvfp4_gate_up_kernel, GSIG, ce, nw)))
# the last one: the tuned down default (early weight loads before griddepcontrol.wait, 72 registers)
for nw, rt, s, sk, fe, early, mr in ((1, 2, 4, 1, 0, 0, 0), (4, 2, 2, 4, 0, 0, 0), (1, 2, 4, 1, 1, 0, 0),
                                     (1, 2, 4, 1, 0, 1, 72)):
    ce = dict(H=7168, IP=2048, INTER=2048, TOPK=8, BH=8 * nw * rt // sk, BKB=512, MMA=True, RT=rt, S=s, SK=sk,
              NW=nw, FENCE=bool(fe), TAP=False, EARLY=early)
    ir = ttgir(D._nvfp4_down_split_kernel, DSIG, ce, nw, mr)
    out.append(dict(kernel="down", nw=nw, rt=rt, sk=sk, ttgir=ir))
print(json.dumps(out))
"""


def test_mma_asm_operands_have_the_assumed_layout():
    specs = run_build_script(_SCRIPT, timeout=600)
    assert len(specs) == 9
    for spec in specs:
        ir = spec["ttgir"]
        layouts = dict(re.findall(r"^(#\w+) = (#ttg\.blocked<\{[^}]*\}>)", ir, re.M))
        mma_ops = [line for line in ir.splitlines() if "elementwise_inline_asm" in line and "mma.sync" in line]
        assert mma_ops, f"{spec['kernel']}: no MMA asm in the TTGIR"
        rows = 8 * spec["nw"] * spec["rt"]
        want = (
            "#ttg.blocked<{sizePerThread = [1, 1], threadsPerWarp = [8, 4], "
            f"warpsPerCTA = [{spec['nw']}, 1], order = [1, 0]}}>"
        )
        for line in mma_ops:
            types = re.findall(r"tensor<(\d+)x4x\w+, (#\w+)>", line)
            assert types, line[:200]
            for n, lay in types:
                assert int(n) == rows, (spec["kernel"], n, rows)
                assert layouts[lay] == want, (spec["kernel"], layouts[lay])
