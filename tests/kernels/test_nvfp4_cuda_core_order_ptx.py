"""The CUDA-core path's summation order, read from the sm_90 PTX of the build that runs (CPU, no GPU needed).

``flint_moe.kernels.orders`` declares the CUDA-core order of ``nvfp4_gate_up`` / ``nvfp4_down`` (BKB = 512):
lane L holds blocks 2L and 2L + 1 of a K step whole, a block's 16 products are chained in the thread in element
order, ``fma(partial, scale, acc)`` per slot, then the two slots are added and the lanes summed by xor 16, 8, 4,
2, 1. That holds for the build Triton makes at launch, where every 16-byte-aligned pointer argument is
specialised (``tt.divisibility = 16``); this test compiles that build (in a subprocess without
TRITON_INTERPRET, as tests/kernels/test_nvfp4_mma_layout.py does) for gate/up (BN 8, 2 warps) and down (BH 16,
4 warps), both with full steps and a partial last step, and checks, on the TTGIR, the layout of the product
tile and, on the PTX, every block chain: which code nibble and which activation half each ``mul`` / ``fma``
takes, in which order, and the shuffle sequence of the final sum.
"""

from __future__ import annotations

import re

from tests.kernels._sm90_build import PREAMBLE, run_build_script

BACKEND = "any"

_SCRIPT = PREAMBLE + r"""


def build(K, sig, ce, nw):
    full = {a: ("constexpr" if a in ce else sig[a]) for a in K.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(K.arg_names) if a in sig}
    src = ASTSource(fn=K, signature=full, constexprs=ce, attrs=attrs)
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": nw, "num_stages": 1, "enable_fp_fusion": True})
    return {"ttgir": c.asm["ttgir"], "ptx": c.asm["ptx"]}


out = []
ce = dict(H=2880, IP=1088, INTER=1040, TOPK=4, BN=8, BKB=512, MMA=False, RT=2, S=4, SK=1, NW=2, FENCE=False,
          TAP=True)
# chains in the PTX text: gate/up the K loop's body (2 steps, 2 slots of each of the thread's 8 rows) and the
# partial step (416 of 512 bytes: both slots); down the one full step and the partial step, of which only
# slot 0 of lane 0 holds codes (8 of 512 bytes; slot 1's activations are a constant 0 there)
out.append(dict(kernel="gate_up", nw=2, rows=16, chains=32, **build(G._nvfp4_gate_up_kernel, GSIG, ce, 2)))
ce = dict(H=2880, IP=1088, INTER=1040, TOPK=4, BH=16, BKB=512, MMA=False, RT=2, S=4, SK=1, NW=4, FENCE=False,
          TAP=True, EARLY=0)
out.append(dict(kernel="down", nw=4, rows=16, chains=12, **build(D._nvfp4_down_split_kernel, DSIG, ce, 4)))
print(json.dumps(out))
"""

_REG = r"%r\d+"
#: decode asm (fp16 fields): the ``cvt.f32.f16`` outputs in text order are the elements (2 j: low nibble of
#: byte j, 2 j + 1: high nibble) 0, 4, 2, 6, 1, 5, 3, 7 of the 4 code bytes of the input word (shift 9 places
#: nibbles 0 and 4, shift 5 nibbles 1 and 5, shift 1 nibbles 2 and 6, shift -3 nibbles 3 and 7; h0 first).
_CVT_ELEMENTS = (0, 4, 2, 6, 1, 5, 3, 7)


def _chains(ptx: str) -> tuple[list[list[tuple[int, int]]], list[str]]:
    """Every block chain of the thread: a ``mul.f32`` of a decoded code and an activation half followed by
    ``fma.rn.f32`` links, as lists of (element of the code word group, element of the activation words), both
    within the thread's 32 elements of a step; and the names of the instructions that consume finished chains.
    Code words: each ``ld.global.v4.b32`` / pair of ``ld.global.v2.b32`` is one row's 16 bytes; activation
    words: each ``ld.global.nc.v4.b32`` holds 4 of the thread's 16 words (8 elements)."""
    lines = [ln.strip() for ln in ptx.splitlines()]
    val: dict[str, tuple] = {}
    n_x = n_v2 = 0
    i = 0
    while i < len(lines):
        ln = lines[i]
        if m := re.match(rf"@%p\d+ ld\.global\.v4\.b32 \{{ ({_REG}), ({_REG}), ({_REG}), ({_REG}) \}}", ln):
            for q, r in enumerate(m.groups()):
                val[r] = ("cw", q)
        elif m := re.match(rf"@%p\d+ ld\.global\.v2\.b32 \{{ ({_REG}), ({_REG}) \}}", ln):
            for q, r in enumerate(m.groups()):
                val[r] = ("cw", 2 * (n_v2 % 2) + q)
            n_v2 += 1
        elif m := re.match(rf"ld\.global\.nc\.v4\.b32 \{{({_REG}), ({_REG}), ({_REG}), ({_REG})\}}", ln):
            for q, r in enumerate(m.groups()):
                val[r] = ("xw", (4 * n_x + q) % 16)
            n_x += 1
        elif m := re.match(rf"shl\.b32 a, ({_REG}), 9;", ln):
            word = val[m.group(1)]
            assert word[0] == "cw", ln
            outs = []
            while not lines[i].startswith("}"):
                if mm := re.match(rf"cvt\.f32\.f16 ({_REG}), h[01];", lines[i]):
                    outs.append(mm.group(1))
                i += 1
            assert len(outs) == 8
            for e, r in zip(_CVT_ELEMENTS, outs, strict=True):
                val[r] = ("c", 8 * word[1] + e)
        elif m := re.match(rf"(?:mov\.b32|selp\.b32) \t({_REG}), ({_REG})(?:, 0, %p\d+)?;", ln):
            if m.group(2) in val:
                val[m.group(1)] = val[m.group(2)]
        elif m := re.match(rf"shl\.b32 \t({_REG}), ({_REG}), 16;", ln):
            if val.get(m.group(2), ("",))[0] == "xw":
                val[m.group(1)] = ("x", 2 * val[m.group(2)][1])
        elif m := re.match(rf"and\.b32 \t({_REG}), ({_REG}), -65536;", ln):
            if val.get(m.group(2), ("",))[0] == "xw":
                val[m.group(1)] = ("x", 2 * val[m.group(2)][1] + 1)
        elif m := re.match(rf"mul\.f32 \t({_REG}), ({_REG}), ({_REG});", ln):
            a, b = val.get(m.group(2)), val.get(m.group(3))
            if a and b and {a[0], b[0]} == {"c", "x"}:
                c, x = (a, b) if a[0] == "c" else (b, a)
                val[m.group(1)] = ("chain", [(c[1], x[1])])
        elif m := re.match(rf"fma\.rn\.f32 \t({_REG}), ({_REG}), ({_REG}), ({_REG});", ln):
            a, b, acc = val.get(m.group(2)), val.get(m.group(3)), val.get(m.group(4))
            if a and b and acc and acc[0] == "chain" and {a[0], b[0]} == {"c", "x"}:
                c, x = (a, b) if a[0] == "c" else (b, a)
                val[m.group(1)] = ("chain", acc[1] + [(c[1], x[1])])
        i += 1
    done = {r: v[1] for r, v in val.items() if v[0] == "chain" and len(v[1]) == 16}
    users = []
    for r in done:
        for ln in lines:
            parts = ln.replace(",", " ").replace(";", " ").split()
            if r in parts[2:]:
                users.append(parts[0])
    return list(done.values()), users


def test_cuda_core_order_in_the_aligned_sm90_build():
    specs = run_build_script(_SCRIPT, timeout=900)
    assert [s["kernel"] for s in specs] == ["gate_up", "down"]
    for spec in specs:
        what, nw = spec["kernel"], spec["nw"]
        ir = spec["ttgir"]
        layouts = dict(re.findall(r"^(#\w+) = (#ttg\.blocked<\{[^}]*\}>)", ir, re.M))
        # the block reduction's operand: [rows, 64 blocks, 16], 2 whole blocks per lane, warps on the rows
        red = r"\"tt\.reduce\"\(%\w+\) <\{axis = 2 : i32\}>.*?: \(tensor<(\d+)x64x16xf32, (#\w+)>\)"
        tiles = re.findall(red, ir, re.S)
        assert tiles, what
        for n, lay in tiles:
            assert int(n) == spec["rows"], (what, n)
            assert layouts[lay] == (
                "#ttg.blocked<{sizePerThread = [1, 2, 16], threadsPerWarp = [1, 32, 1], "
                f"warpsPerCTA = [{nw}, 1, 1], order = [2, 1, 0]}}>"
            ), (what, layouts[lay])
        chains, users = _chains(spec["ptx"])
        rows_per_thread = spec["rows"] // nw
        assert len(chains) == spec["chains"], (what, len(chains))
        for ch in chains:
            assert all(c == x for c, x in ch), (what, ch)  # code element q meets activation element q
            order = [c % 16 for c, _ in ch]
            # element order; the first two exact products may come in either order (the same bits)
            assert sorted(order[:2]) == [0, 1] and order[2:] == list(range(2, 16)), (what, order)
            assert len({c // 16 for c, _ in ch}) == 1, (what, ch)  # one block per chain
        assert set(users) == {"fma.rn.f32"}, (what, set(users))  # each partial enters fma(partial, scale, acc)
        shfl = [int(m) for m in re.findall(r"shfl\.sync\.bfly\.b32 \t%r\d+, %r\d+, (\d+), 31, -1;", spec["ptx"])]
        assert shfl == [16, 8, 4, 2, 1] * rows_per_thread, (what, shfl)
