"""The tensor-core path of the NVFP4 decode GEMVs (``MMA`` configurations of ``nvfp4_gate_up`` /
``nvfp4_down``): its generated inline PTX and its one K loop, ``mma_gemv``.

A program's rows form a [R, 4] tile whose default Triton layout puts 8 x 4 threads in a warp (lane = 4 g + c):
thread (g, c) holds chunk c (16 consecutive code bytes of each 64-byte K step) of RT rows. One inline-PTX
call per S steps loads the chunks, dequantises every weight exactly to bf16 as ``E2M1 * E4M3 * 2^-8``
(``mad.lo`` sign carry, two ``mul.rn.bf16x2``; rule step 5 up to a power of two) and feeds
``mma.sync.m16n8k16`` (bf16, fp32 accumulate): A = the weights of two of the thread's rows (MMA rows g,
g + 8), k-slots of the 4 chunk threads = 16 elements of the 4 chunks, B = the activations re-paired to match
(every column equal), C = D = the running row sum. So a row's accumulator is the chain of MMAs over its K
steps in increasing order, 8 per 16-byte chunk, each adding 16 exact products in the hardware's internal order
with truncating alignment; the result times 2^8 is g_acc / y_acc. No block regrouping: bound
``FP32_TRUNCATE`` (u = 2^-23, d = K), the rule's tensor-core model. ``SK`` > 1 splits K into parts summed by
different warps, added in a fixed order (``mma_sum_parts``). Under the interpreter ``_mma_shim`` does the same
loads and sums the exact products in fp32 (round to nearest). Not yet tested on this path: inf / NaN
activations (the tensor cores' handling of special values is not checked against the golden model).
"""

from __future__ import annotations

import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET, gdc_launch_dependents, gdc_wait
from flint_moe.kernels.nvfp4.decode_ptx import decode_e2m1
from flint_moe.kernels.nvfp4.scales import e4m3_to_f32, swizzled_scale_offsets

__all__ = [
    "MMA_SHAPES",
    "mma_ptx",
    "early_wait_ptx",
    "mma_rows",
    "mma_row_sums",
    "opaque_zero",
    "mma_tile_rows",
    "mma_gemv",
    "mma_sum_parts",
    "mma_part_bytes",
]

_INTERPRET = tl.constexpr(INTERPRET)

#: (RT, S) pairs of a launch configuration: RT rows per thread, S sub-steps of 64 bytes per call.
MMA_SHAPES = ((2, 2), (2, 4))


def mma_ptx(RT: int, S: int, PRED: bool, MODE: str = "full", FENCE: bool = False) -> str:
    """PTX body of one ``mma_rows`` call (see ``mma_rows``): RT rows of this thread, S sub-steps.

    ``MODE``: "full" loads and computes one step; "load" only loads a step's codes and scales and returns them
    (4 S code-word outputs and S scale outputs, RT each); "drain" computes a step whose codes and scales come
    in as inputs (after acc) without loading them (the two halves of ``EARLY``, see ``mma_gemv``).

    Operands: ``$0..$RT-1`` accumulators out (f32); inputs: RT code pointers (u8, 16-byte aligned), RT scale
    pointers (u8, 2-byte aligned: the two E4M3 bytes of the chunk's blocks are adjacent in the 128x4 swizzle),
    RT activation pointers (int32 words; only the first is used), RT accumulators in, and with ``PRED`` RT
    validity flags (only the first is used: 1 = the whole chunk, 2 = its first block only, 0 = nothing; what is
    not valid is not loaded and adds exact zeros). ``FENCE`` (MODE "full", no PRED): one more input, RT int32
    zeros that the compiler cannot see as constants (only the first is used); every code and scale word of the
    call is xor-ed together, ``and``-ed with that zero and ``or``-ed into the scale multiplier constant, so that
    ptxas must issue all of the call's code and scale loads before the first decode (without it, ptxas
    interleaves them with the arithmetic to save registers and only ~2 loads per thread are in flight). The
    values are unchanged (the or adds 0), hence the same bits.
    Per sub-step s (code bytes +64 s, scales +1024 s, activation words +64 s): 16 code bytes of each row
    (4 words = 32 E2M1 codes = 2 blocks), 16 activation words (32 bf16), 2 scale bytes per row.
    Decode of word w (nibbles n0..n7 at bits 4i, element i of the word): pair i = (n_i, n_{i+4}) is placed as
    a bf16x2 ``E2M1 * 2^-126`` (shift, and, and, ``mad.lo`` carries the sign to bit 15; the code 0.5 is a bf16
    subnormal), then ``mul.rn.bf16x2`` by the block multiplier ``Q = E4M3 * 2^118`` (built exactly from the
    scale byte: fields placed as ``E4M3 * 2^-120`` then two ``mul.rn.bf16x2`` by 2^119) gives the dequantised
    weight ``E2M1 * E4M3 * 2^-8`` exactly (at most 6 significant bits, magnitude in [2^-18, 10.5]).
    The activation words are re-paired with ``prmt`` as (x_i, x_{i+4}) to match. Two ``mma.sync.m16n8k16``
    (bf16 in, fp32 accumulate) per word and row pair: A = the pairs of the thread's two rows (MMA rows
    groupID and groupID + 8), B = the activation pairs (all 8 columns equal), C = D = the running sum.
    """
    assert RT % 2 == 0 and S >= 1 and MODE in ("full", "load", "drain")
    assert not PRED or MODE == "full"
    assert not FENCE or (MODE == "full" and not PRED)
    nc = 4 * S + S  # carried tensors: code words (s, w) at 4 s + w, then scales at 4 S + s
    n_out = (nc if MODE == "load" else 1) * RT
    ins = {"full": ["c", "s", "x", "a"], "load": ["c", "s"], "drain": ["x", "a"]}[MODE]
    if FENCE:
        ins = ins + ["z"]
    op = {name: [f"${n_out + k * RT + j}" for j in range(RT)] for k, name in enumerate(ins)}
    base_in = n_out + len(ins) * RT
    cp, sp = op.get("c"), op.get("s")
    xp = op["x"][0] if "x" in op else None
    ai = op.get("a")
    flag = f"${n_out + len(ins) * RT}"
    pre = "@pv " if PRED else ""
    L = ["{"]
    L.append(f".reg .b32 cw<{RT * S * 4}>, su<{RT * S}>, xw<16>, xq<16>, pp<32>, q0, q1, t, v, m, s, a, k119;")
    L.append(f".reg .b32 ncw<{RT * S * 4}>, nsu<{RT * S}>, fz;")
    L.append(f".reg .f32 d<{2 * RT}>;")
    if PRED:  # flag 0: nothing, 1: the whole chunk, 2: its first 8 bytes (one block) only
        L.append(".reg .pred pv, ph;")
        L.append(f"setp.ne.b32 pv, {flag}, 0;")
        L.append(f"setp.eq.b32 ph, {flag}, 1;")
    L.append("mov.b32 k119, 0x7B007B00;")
    if MODE == "drain":  # the carried step: input tensor 4 s + w (code words), 4 S + s (scales)
        base_c = base_in
        for s_ in range(S):
            for j in range(RT):
                for w in range(4):
                    L.append(f"mov.b32 cw{(j * S + s_) * 4 + w}, ${base_c + (4 * s_ + w) * RT + j};")
                L.append(f"mov.b32 su{j * S + s_}, ${base_c + (4 * S + s_) * RT + j};")
    if MODE != "load":
        for j in range(RT):  # D columns 2 tig and 2 tig + 1 of the thread's row j (equal: all B columns are x)
            L.append(f"mov.f32 d{2 * j}, {ai[j]};")
            L.append(f"mov.f32 d{2 * j + 1}, {ai[j]};")
    lc, ls = ("cw", "su") if MODE == "full" else ("ncw", "nsu")  # where this call's loads go
    for s in range(S if MODE != "drain" else 0):
        for j in range(RT):
            b = (j * S + s) * 4
            regs = f"{lc}{b}, {lc}{b + 1}, {lc}{b + 2}, {lc}{b + 3}"
            if PRED:
                L.append(f"mov.b32 cw{b}, 0; mov.b32 cw{b + 1}, 0; mov.b32 cw{b + 2}, 0; mov.b32 cw{b + 3}, 0;")
            L.append(f"{pre}ld.global.nc.L1::no_allocate.v4.b32 {{{regs}}}, [{cp[j]}+{64 * s}];")
            if PRED:
                L.append(f"@!ph mov.b32 cw{b + 2}, 0; @!ph mov.b32 cw{b + 3}, 0;")
    for s in range(S if MODE != "drain" else 0):
        for j in range(RT):
            if PRED:
                L.append(f"mov.b32 su{j * S + s}, 0;")
            L.append(f"{pre}ld.global.nc.u16 {ls}{j * S + s}, [{sp[j]}+{1024 * s}];")
            if PRED:
                L.append(f"@!ph and.b32 su{j * S + s}, su{j * S + s}, 255;")
    if FENCE:  # every code / scale word feeds k119 through an opaque zero: all loads issued before any decode
        words = [f"cw{i}" for i in range(RT * S * 4)] + [f"su{i}" for i in range(RT * S)]
        L.append(f"xor.b32 fz, {words[0]}, {words[1]};")
        L.extend(f"xor.b32 fz, fz, {wd};" for wd in words[2:])
        L.append(f"and.b32 fz, fz, {op['z'][0]};")
        L.append("or.b32 k119, k119, fz;")
    for s in range(S if MODE != "load" else 0):
        for h in range(4):
            regs = f"xw{4 * h}, xw{4 * h + 1}, xw{4 * h + 2}, xw{4 * h + 3}"
            if PRED:
                L.append(
                    f"mov.b32 xw{4 * h}, 0; mov.b32 xw{4 * h + 1}, 0; mov.b32 xw{4 * h + 2}, 0; "
                    f"mov.b32 xw{4 * h + 3}, 0;"
                )
            xpre = pre if h < 2 or not PRED else "@ph "
            L.append(f"{xpre}ld.global.nc.v4.b32 {{{regs}}}, [{xp}+{256 * s + 16 * h}];")
        for w in range(4):
            x0, x1, x2, x3 = (f"xw{4 * w + i}" for i in range(4))
            L.append(f"prmt.b32 xq{4 * w}, {x0}, {x2}, 0x5410;")
            L.append(f"prmt.b32 xq{4 * w + 1}, {x0}, {x2}, 0x7632;")
            L.append(f"prmt.b32 xq{4 * w + 2}, {x1}, {x3}, 0x5410;")
            L.append(f"prmt.b32 xq{4 * w + 3}, {x1}, {x3}, 0x7632;")
        for g in range(RT // 2):
            for rr in range(2):
                r = 2 * g + rr
                u = f"su{r * S + s}"
                L.append(f"prmt.b32 v, {u}, 0, 0x4140;")
                L.append("and.b32 m, v, 0x007F007F;")
                L.append("and.b32 s, v, 0x00800080;")
                L.append("shl.b32 m, m, 4;")
                L.append("mad.lo.u32 t, s, 256, m;")
                L.append("mul.rn.bf16x2 t, t, k119;")
                L.append("mul.rn.bf16x2 t, t, k119;")
                L.append("prmt.b32 q0, t, t, 0x1010;")
                L.append("prmt.b32 q1, t, t, 0x3232;")
                for w in range(4):
                    cw = f"cw{(r * S + s) * 4 + w}"
                    qq = "q0" if w < 2 else "q1"
                    for i, op in enumerate(
                        ("shl.b32 a, {}, 6;", "shl.b32 a, {}, 2;", "shr.b32 a, {}, 2;", "shr.b32 a, {}, 6;")
                    ):
                        dst = f"pp{rr * 16 + w * 4 + i}"
                        L.append(op.format(cw))
                        L.append("and.b32 v, a, 0x03C003C0;")
                        L.append("and.b32 s, a, 0x02000200;")
                        L.append(f"mad.lo.u32 {dst}, s, 63, v;")
                        L.append(f"mul.rn.bf16x2 {dst}, {dst}, {qq};")
            dd = f"d{4 * g}, d{4 * g + 1}, d{4 * g + 2}, d{4 * g + 3}"
            for w in range(4):
                for half in range(2):
                    i0, i1 = 2 * half, 2 * half + 1
                    a = (f"pp{w * 4 + i0}", f"pp{16 + w * 4 + i0}", f"pp{w * 4 + i1}", f"pp{16 + w * 4 + i1}")
                    L.append(
                        f"mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{dd}}}, "
                        f"{{{a[0]}, {a[1]}, {a[2]}, {a[3]}}}, {{xq{4 * w + i0}, xq{4 * w + i1}}}, {{{dd}}};"
                    )
    if MODE != "load":
        for j in range(RT):
            L.append(f"mov.f32 ${j}, d{2 * j};")
    if MODE == "load":
        o = 0
        for s_ in range(S):
            for j in range(RT):
                for w in range(4):
                    L.append(f"mov.b32 ${o + (4 * s_ + w) * RT + j}, ncw{(j * S + s_) * 4 + w};")
                L.append(f"mov.b32 ${o + (4 * S + s_) * RT + j}, nsu{j * S + s_};")
    L.append("}")
    return "\n".join(L)


_MMA_2_2 = tl.constexpr(mma_ptx(2, 2, False))
_MMA_2_4 = tl.constexpr(mma_ptx(2, 4, False))
_MMA_2_2F = tl.constexpr(mma_ptx(2, 2, False, FENCE=True))
_MMA_2_4F = tl.constexpr(mma_ptx(2, 4, False, FENCE=True))
_MMA_2_P = tl.constexpr(mma_ptx(2, 1, True))


@triton.jit
def _mma_shim(cptr, sptr, xptr, acc, flag, S: tl.constexpr):
    """INTERPRETER path of ``mma_rows``: the same loads through ``tl.load``; per (row, chunk) the exact
    dequantised products ``E2M1 * E4M3 * 2^-8 * x`` summed in fp32 (round to nearest, numpy order) into that
    chunk's column of ``acc`` (the GPU path puts the whole row sum in every column; ``mma_row_sums`` adds the
    columns here and takes column 0 there)."""
    for s in tl.static_range(S):
        b16 = tl.arange(0, 16)
        ok = (flag[:, :, None] == 1) | ((flag[:, :, None] == 2) & (b16[None, None, :] < 8))  # [R, 4, 16] bytes
        codes = tl.load(cptr[:, :, None] + (64 * s + b16)[None, None, :], mask=ok, other=0)
        lo, hi = decode_e2m1(codes)
        xw = tl.load(xptr[:, :, None] + (64 * s + b16)[None, None, :], mask=ok, other=0)
        xe = (xw << 16).to(tl.float32, bitcast=True)
        xo = (xw & -65536).to(tl.float32, bitcast=True)
        b2 = tl.arange(0, 2)
        s_ok = (flag[:, :, None] == 1) | ((flag[:, :, None] == 2) & (b2[None, None, :] < 1))
        sb = tl.load(sptr[:, :, None] + (1024 * s + b2)[None, None, :], mask=s_ok, other=0)
        sc = e4m3_to_f32(sb.to(tl.int32)) * 0.00390625  # 2^-8, exact
        # byte b of the chunk belongs to block b // 8
        sc16 = tl.reshape(tl.broadcast_to(sc[:, :, :, None], [sc.shape[0], sc.shape[1], 2, 8]), lo.shape)
        prod = lo * sc16 * xe + hi * sc16 * xo
        acc = acc + tl.sum(prod, axis=2)
    return acc


_CONS_2 = tl.constexpr(",".join(["=f"] * 2 + ["l"] * 6 + ["f"] * 2))
_CONS_2Z = tl.constexpr(",".join(["=f"] * 2 + ["l"] * 6 + ["f"] * 2 + ["r"] * 2))  # + flag or opaque zero


@triton.jit
def _asm4(asm: tl.constexpr, cptr, sptr, xptr, acc):
    return tl.inline_asm_elementwise(
        asm,
        _CONS_2,
        [cptr.to(tl.int64), sptr.to(tl.int64), xptr.to(tl.int64), acc],
        dtype=tl.float32,
        is_pure=False,
        pack=2,
    )


@triton.jit
def _asm4z(asm: tl.constexpr, cptr, sptr, xptr, acc, z):
    return tl.inline_asm_elementwise(
        asm,
        _CONS_2Z,
        [cptr.to(tl.int64), sptr.to(tl.int64), xptr.to(tl.int64), acc, z],
        dtype=tl.float32,
        is_pure=False,
        pack=2,
    )


@triton.jit
def mma_rows(cptr, sptr, xptr, acc, RT: tl.constexpr, S: tl.constexpr, FENCE: tl.constexpr = False, zero=0):
    """One call of the tensor-core GEMV step for a [R, 4] tile of (row, chunk) pointers (module docstring;
    PTX in ``mma_ptx``): returns ``acc`` plus ``S`` sub-steps of 64 code bytes per row.

    ``cptr`` uint8 pointers to the 16-byte chunk ``c`` (column) of each row, ``sptr`` uint8 pointers to the
    chunk's two E4M3 scale bytes, ``xptr`` int32 pointers to the chunk's 16 activation words, ``acc`` fp32
    [R, 4]. (RT, S) one of ``MMA_SHAPES``. GPU: requires the default blocked layout of a [R, 4] tensor
    (threads [8, 4] per warp, warps along the rows, RT = R / (8 * num_warps) rows per thread; checked on the
    TTGIR by tests/kernels), where every column then holds the row's running sum. ``FENCE`` (``zero``: int32
    [R, 4] zeros the compiler cannot fold): all code and scale loads of the call before its first decode
    (``mma_ptx``); same values.
    """
    if _INTERPRET:
        return _mma_shim(cptr, sptr, xptr, acc, tl.full(acc.shape, 1, tl.int32), S)
    else:
        tl.static_assert(RT == 2 and (S == 2 or S == 4), "mma_rows: (RT, S) must be one of MMA_SHAPES")
        if FENCE:
            if S == 2:
                return _asm4z(_MMA_2_2F, cptr, sptr, xptr, acc, zero)
            else:
                return _asm4z(_MMA_2_4F, cptr, sptr, xptr, acc, zero)
        elif S == 2:
            return _asm4(_MMA_2_2, cptr, sptr, xptr, acc)
        else:
            return _asm4(_MMA_2_4, cptr, sptr, xptr, acc)


@triton.jit
def mma_rows_tail(cptr, sptr, xptr, acc, flag):
    """``mma_rows`` with S = 1 for a partial last step (RT = 2): ``flag`` (int32 [R, 4]) 1 = the whole chunk,
    2 = its first 8 bytes (one block) only, 0 = nothing; the missing part loads nothing (codes, activations,
    scales) and adds exact zeros."""
    if _INTERPRET:
        return _mma_shim(cptr, sptr, xptr, acc, flag, 1)
    else:
        return _asm4z(_MMA_2_P, cptr, sptr, xptr, acc, flag)


# ``EARLY`` 1 (RT = 2, S = 2 or 4): the first call split into "load" (before ``griddepcontrol.wait``) and
# "drain" (after it), carrying 5 S int32 tensors (4 S code words, then S scale words; ``mma_ptx``).
_EARLY_LOAD = {s: tl.constexpr(mma_ptx(2, s, False, "load")) for s in (2, 4)}
_EARLY_DRAIN = {s: tl.constexpr(mma_ptx(2, s, False, "drain")) for s in (2, 4)}
_LOAD_CONS = {s: tl.constexpr(",".join(["=r"] * (10 * s) + ["l"] * 4)) for s in (2, 4)}
_DRAIN_CONS = {s: tl.constexpr(",".join(["=f"] * 2 + ["l"] * 2 + ["f"] * 2 + ["r"] * (10 * s))) for s in (2, 4)}


def early_wait_ptx(n: int) -> str:
    """PTX of ``_early_wait`` (``EARLY`` 1 of ``mma_gemv``), pack 2: outputs ``$0, $1`` (int32 0), inputs ``n``
    carried tensors then the opaque zero tensor (2 registers each). Every carried word is xor-ed together,
    ``and``-ed with the zero and compared with 0; ``griddepcontrol.wait`` runs under the negation of that (always
    true) predicate, so ptxas cannot sink the weight loads below the wait (without it, it does)."""
    ins = [f"${2 + i}" for i in range(2 * n)]
    z = f"${2 + 2 * n}"
    L = ["{", ".reg .b32 fz;", ".reg .pred pw;", f"xor.b32 fz, {ins[0]}, {ins[1]};"]
    L += [f"xor.b32 fz, fz, {r};" for r in ins[2:]]
    L += [f"and.b32 fz, fz, {z};", "setp.ne.b32 pw, fz, 0;", "@!pw griddepcontrol.wait;"]
    L += ["mov.b32 $0, 0;", "mov.b32 $1, 0;", "}"]
    return "\n".join(L)


_EARLY_WAIT = {s: tl.constexpr(early_wait_ptx(5 * s)) for s in (2, 4)}
_WAIT_CONS = {s: tl.constexpr(",".join(["=r"] * 2 + ["r"] * (10 * s + 2))) for s in (2, 4)}
_EARLY_LOAD_2, _EARLY_LOAD_4 = _EARLY_LOAD[2], _EARLY_LOAD[4]
_EARLY_DRAIN_2, _EARLY_DRAIN_4 = _EARLY_DRAIN[2], _EARLY_DRAIN[4]
_EARLY_WAIT_2, _EARLY_WAIT_4 = _EARLY_WAIT[2], _EARLY_WAIT[4]
_LOAD_CONS_2, _LOAD_CONS_4 = _LOAD_CONS[2], _LOAD_CONS[4]
_DRAIN_CONS_2, _DRAIN_CONS_4 = _DRAIN_CONS[2], _DRAIN_CONS[4]
_WAIT_CONS_2, _WAIT_CONS_4 = _WAIT_CONS[2], _WAIT_CONS[4]


@triton.jit
def _early_load(cptr, sptr, S: tl.constexpr):
    """The first call's codes and scales (``mma_ptx`` MODE "load"): a tuple of 5 S int32 [R, 4] tensors."""
    if S == 2:
        return tl.inline_asm_elementwise(
            _EARLY_LOAD_2, _LOAD_CONS_2, [cptr.to(tl.int64), sptr.to(tl.int64)],
            dtype=(tl.int32,) * 10, is_pure=False, pack=2,
        )  # fmt: skip
    else:
        return tl.inline_asm_elementwise(
            _EARLY_LOAD_4, _LOAD_CONS_4, [cptr.to(tl.int64), sptr.to(tl.int64)],
            dtype=(tl.int32,) * 20, is_pure=False, pack=2,
        )  # fmt: skip


@triton.jit
def _early_wait(carried, zero, S: tl.constexpr):
    """``griddepcontrol.wait`` after every word of ``carried`` arrived (``early_wait_ptx``)."""
    if S == 2:
        return tl.inline_asm_elementwise(
            _EARLY_WAIT_2, _WAIT_CONS_2, carried + (zero,), dtype=tl.int32, is_pure=False, pack=2
        )
    else:
        return tl.inline_asm_elementwise(
            _EARLY_WAIT_4, _WAIT_CONS_4, carried + (zero,), dtype=tl.int32, is_pure=False, pack=2
        )


@triton.jit
def _early_drain(xptr, acc, carried, S: tl.constexpr):
    """The first call computed from ``carried`` (``mma_ptx`` MODE "drain"): ``acc`` plus its MMAs."""
    if S == 2:
        return tl.inline_asm_elementwise(
            _EARLY_DRAIN_2, _DRAIN_CONS_2, (xptr.to(tl.int64), acc) + carried,
            dtype=tl.float32, is_pure=False, pack=2,
        )  # fmt: skip
    else:
        return tl.inline_asm_elementwise(
            _EARLY_DRAIN_4, _DRAIN_CONS_4, (xptr.to(tl.int64), acc) + carried,
            dtype=tl.float32, is_pure=False, pack=2,
        )  # fmt: skip


def mma_part_bytes(K: int, SK: int) -> int:
    """Code bytes of each of the first SK - 1 K-parts of ``mma_gemv`` (the last has the rest): K / SK when K is a
    multiple of 64 SK, else K / SK rounded up to a multiple of 64 (the parts start on 64-byte steps)."""
    return K // SK if K % (64 * SK) == 0 else -(-K // (64 * SK)) * 64


@triton.jit
def opaque_zero(v):
    """int32 0 that the compiler cannot fold (``mov.b32 $0, 0`` on the GPU): a loop starting at it has a run-time
    trip count, which keeps LLVM from unrolling a long constant-trip loop completely (code size). ``v``: any
    int32 scalar (a data dependency only)."""
    if _INTERPRET:
        return 0
    else:
        return tl.inline_asm_elementwise("mov.b32 $0, 0;", "=r,r", [v], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def mma_row_sums(acc):
    """[R] row sums of an ``mma_rows`` accumulator [R, 4], times 2^8 (undoes the weights' 2^-8; exact): GPU
    column 0 (every column holds the row sum), interpreter the sum of the 4 chunk columns."""
    if _INTERPRET:
        tot = tl.sum(acc, axis=1)
    else:
        col = tl.arange(0, 4)[None, :]
        tot = tl.sum(tl.where(col == 0, acc, 0.0), axis=1)
    return tot * 256.0


@triton.jit
def mma_tile_rows(R: tl.constexpr, NW: tl.constexpr, SK: tl.constexpr):
    """(i, h) int32 [R] of the tile rows of an ``mma_gemv`` tile with ``NW`` warps and ``SK`` K-parts: tile row
    r (warp w = (r // 8) % NW, lane group g = r % 8, repetition j = r // (8 NW)) computes K-part
    ``h = w // (NW / SK)`` of local row ``i = 8 (NW / SK) j + 8 (w % (NW / SK)) + g`` (R / SK local rows; all
    rows of one warp work on the same K-part, as the MMA needs)."""
    WR: tl.constexpr = NW // SK
    r = tl.arange(0, R)
    w = (r // 8) % NW
    h = w // WR
    i = 8 * WR * (r // (8 * NW)) + 8 * (w % WR) + r % 8
    return i, h


@triton.jit
def mma_gemv(
    c_base,
    row_off,
    s_base,
    srow,
    x_base,
    h,
    K: tl.constexpr,
    KP: tl.constexpr,
    R: tl.constexpr,
    RT: tl.constexpr,
    S: tl.constexpr,
    SK: tl.constexpr,
    SEED,
    FENCE: tl.constexpr = False,
    ZERO=0,
    EARLY: tl.constexpr = 0,
    ORDER_PTR=None,
    TRIGGER: tl.constexpr = False,
):
    """Tensor-core row sums of one tile (module docstring), the K loop of the path: fp32 [R], times 2^8 (exact).

    ``c_base`` uint8 pointer to the expert's codes, ``row_off`` int64 [R] byte offset of each tile row's
    physical row, ``s_base`` uint8 pointer to the expert's swizzled scales, ``srow`` int32 [R] physical row
    (for the swizzle), ``x_base`` int32 pointer to the activation row (bf16 pairs), ``h`` int32 [R] K-part of
    each tile row (``mma_tile_rows``), K code bytes per row (a multiple of 8). Part h covers bytes
    [h KS, min((h + 1) KS, K)) with ``KS = mma_part_bytes(K, SK)`` (K / SK when K is a multiple of 64 SK,
    else K / SK rounded up to a multiple of 64, so that only the last part is shorter; the launchers make sure
    it is not empty). Every part runs the full ``64 S``-byte calls that fit in the shortest (last) part, then
    64-byte calls up to its own end, the partial ones masked per chunk and per block (flag 1 = whole chunk,
    2 = its first block only, 0 = none): the same sequence of MMAs over the part's bytes in increasing order.
    ``SEED``: any int32 scalar (keeps the K loop's trip count opaque to LLVM, see ``opaque_zero``).
    ``FENCE`` (GPU; ``ZERO`` an int32 scalar 0 that the compiler cannot fold, e.g. ``min(expert id, 0)``):
    each full call issues all its code and scale loads before its first decode (``mma_ptx``); same values,
    same bits.
    ``EARLY`` (the caller has not yet passed ``griddepcontrol.wait``; this function does it, ``gdc_wait``):
    1 (GPU): the codes and scales of the first full call are loaded into registers (``mma_ptx`` MODE "load")
    before the wait, that call computed after it (MODE "drain"), the remaining calls as usual: the same MMA
    sequence, so the same bits. Only the weights (codes, scales) are touched before the wait; the activation
    row is read after it: ``ORDER_PTR`` (int32 pointer to a value >= 0, e.g. the expert id) is read with a
    volatile load after the wait and ``min(value, 0)`` (= 0) added to every activation pointer, so that ptxas
    cannot hoist an activation load (``ld.global.nc``, which it treats as read-only data) above
    ``griddepcontrol.wait``; ``TRIGGER``: ``griddepcontrol.launch_dependents`` right after the wait (as the
    kernels without EARLY do at their start). Interpreter: the wait (a no-op) first.
    """
    KS: tl.constexpr = K // SK if K % (64 * SK) == 0 else (K + 64 * SK - 1) // (64 * SK) * 64
    LAST: tl.constexpr = K - (SK - 1) * KS  # bytes of the last part (the others have KS)
    tl.static_assert(LAST > 0, "mma_gemv: the last K-part is empty (the launcher must lower SK)")
    STEP: tl.constexpr = 64 * S
    FULLM: tl.constexpr = LAST // STEP * STEP
    tig = tl.arange(0, 4)
    k_part = h * KS  # [R] first byte of each tile row's part
    k_len = tl.where(h == SK - 1, LAST, KS)  # [R] bytes of each tile row's part
    cptr = c_base + (row_off + k_part)[:, None] + (16 * tig)[None, :]
    sptr = s_base + swizzled_scale_offsets(srow[:, None], (2 * tig)[None, :] + (k_part // 8)[:, None], KP)
    xptr = x_base + k_part[:, None] + (16 * tig)[None, :]
    acc = tl.zeros([R, 4], dtype=tl.float32)
    zt = tl.zeros([R, 4], dtype=tl.int32) + ZERO  # the FENCE operand (unused otherwise)
    EARLY_REGS: tl.constexpr = EARLY == 1 and FULLM > 0 and not _INTERPRET
    K0: tl.constexpr = STEP if EARLY_REGS else 0  # first byte of the regular loop
    if EARLY_REGS:  # first full call's codes / scales before the wait, computed after it
        tl.static_assert(RT == 2 and (S == 2 or S == 4), "mma_gemv: EARLY 1 needs RT 2, S 2/4")
        carried = _early_load(cptr, sptr, S)
        _early_wait(carried, zt, S)  # the wait depends on the loaded words: loads issued before it
    elif EARLY > 0:
        gdc_wait()
    if EARLY > 0:  # activation addresses depend on a coherent load issued after the wait
        if TRIGGER:
            gdc_launch_dependents()
        xptr = xptr + tl.minimum(tl.load(ORDER_PTR, volatile=True), 0)
    if EARLY_REGS:  # the first call, from the registers loaded before the wait
        acc = _early_drain(xptr, acc, carried, S)
    for k0 in tl.range(opaque_zero(SEED) + K0, FULLM, STEP):
        acc = mma_rows(cptr + k0, sptr + (k0 // 64) * 1024, xptr + k0, acc, RT, S, FENCE, zt)
    for k0 in tl.range(FULLM, KS, 64):
        left = k_len[:, None] - k0 - 16 * tig[None, :] + 0 * srow[:, None]  # valid bytes from this chunk on
        flag = tl.where(left >= 16, 1, tl.where(left > 0, 2, 0))
        acc = mma_rows_tail(cptr + k0, sptr + (k0 // 64) * 1024, xptr + k0, acc, flag)
    return mma_row_sums(acc)


@triton.jit
def mma_sum_parts(tot, R: tl.constexpr, NW: tl.constexpr, SK: tl.constexpr):
    """[R / SK] sums over the K-parts of ``mma_gemv`` tile-row sums ``tot`` [R], indexed by local row i
    (``mma_tile_rows``), in a fixed order that does not depend on the layout: SK = 2: ``p0 + p1``; SK = 4:
    ``(p0 + p1) + (p2 + p3)`` (elementwise adds after ``tl.split``; SK = 1 returns ``tot``)."""
    if SK == 1:
        return tot
    else:
        tl.static_assert(SK == 2 or SK == 4, "mma_sum_parts: SK must be 1, 2 or 4")
        WR: tl.constexpr = NW // SK
        t3 = tl.permute(tl.reshape(tot, [R // (8 * NW), SK, 8 * WR]), (0, 2, 1))  # [.., 8 WR, SK]
        if SK == 2:
            a, b = tl.split(t3)
            s = a + b
        else:
            even, odd = tl.split(tl.reshape(t3, [R // (8 * NW), 8 * WR, 2, 2]))  # part h = 2 h1 + h0
            pair = even + odd  # [.., 2]: (p0 + p1, p2 + p3)
            lo, hi = tl.split(pair)
            s = lo + hi
        return tl.reshape(s, [R // SK])
