"""Split-K partial GEMV of the low-latency decode block (rule step 5 for gate/up and down, routed and shared) and
the block's two CuTe DSL host functions: gate/up (partial + ``ll_gate_up``'s ``finish``) and down (routed and
shared partials + ``ll_down``'s ``combine``). Each selected expert's weight rows are read from memory once for
every token of the step that selected it (docs/kernels/ll-block.md, sections 7-8). Compiled for sm_90a and its
PTX audited on the CPU; bitwise on the H200 against the golden model (tests/ops/test_moe_ll_gpu.py).

Declared summation order (``kernels.orders.ll_expert_order``): lane l of split s takes the 16-element blocks
s * BPS + l, + 32, ... below (s + 1) * BPS and below the valid length (BPS = ceil(K / 16 / S); the last split may
hold fewer), per block ``acc = fma.rn.f32(x_h, w_h, acc)`` for h ascending from +0, then the xor 16, 8, 4, 2, 1
butterfly with ``add.rn.f32``; lane 0 writes the row's partial to the fp32 workspace [P, S, N] that
``finish`` / ``combine`` sum over s in increasing order. The work mapping and the instructions:

- grid (N / WARPS, S, G), one warp per row: G = P pairs for the routed experts, 1 for the shared expert. The CTA
  of pair q works only when q is the first pair that selected expert ``ids[q]``; it then finds every pair of that
  expert (at most one per token: a token selects an expert once) by warp ballots over ``ids`` and accumulates
  all of them (up to 8, the block's token limit) from one read of the weights. The shared expert's single CTA
  column takes all M tokens. The other CTAs of a duplicated expert exit at once.
- loads: the 16 codes of a block as one 64-bit ``ld.global.nc.v2.u32`` (a warp reads 256 contiguous bytes),
  the 16 bf16 inputs of a block as two 128-bit ``ld.global.nc.v4.u32`` per token (so the inputs and the code
  words must start on 16-byte boundaries: the launcher checks).
- decode (exact): two codes at once as an f16x2 holding ``e2m1 * 2^-14`` (bit moves; exponent-0 codes are f16
  subnormals, which f16 arithmetic keeps), ``mul.rn.f16x2`` by 2^14 then by the block's scale (E4M3 -> f16x2
  by ``cvt.rn.f16x2.e4m3x2``; E2M1 x E4M3 has at most 5 significant bits and lies in [2^-10, 2688], so both
  products are exact in f16), then ``cvt.f32.f16``: the fp32 ``mul.rn(e2m1, e4m3)``, signed zeros included.
- lane tails and padding columns: an idle lane reads block 0 of its row and keeps its sum (``select``).
- the token count selects one of four unrolled bodies (1, 2, 4 or 8 token slots; unused slots of a body compute
  on token 0's row and store nothing).

Limits: as ``ll_gate_up.GateUpSpec`` / ``ll_down.DownSpec`` (K a multiple of 16, any S the plan takes), at most
8 tokens (``LL_MOE_MAX_TOKENS``) and 16 selected experts per token (pairs <= 128).
"""

from __future__ import annotations

import functools
import tempfile
import types

from flint_moe.kernels.cute import ll_down, ll_gate_up
from flint_moe.kernels.cute.ll_down import DownSpec
from flint_moe.kernels.cute.ll_gate_up import FINISH_THREADS, WARPS, GateUpSpec, cute_available

__all__ = [
    "AUDIT_SPECS", "MAX_TOKENS", "PTX_FORBID", "PTX_REQUIRE", "audit_down", "audit_gate_up", "compile_down",
    "compile_gate_up",
]  # fmt: skip

#: Token slots of the widest body (the block's token limit).
MAX_TOKENS = 8
#: Bodies compiled per specialisation: token slots 1, 2, 4, 8 (a step of M tokens runs the smallest >= count).
_BODIES = (1, 2, 4, 8)
#: 2^14 as f16x2 (both halves): undoes the f16 placement of an E2M1 code.
_F16X2_2P14 = 0x74007400

#: PTX every build must contain (rule step 5 exact decode, fma chain and tree, the vector loads, the global scale
#: and bf16 rounding of finish / combine, PDL); the routed builds also the ballot, gate/up also ex2 / rcp
#: (:func:`audit_gate_up`); forbidden: ``ll_gate_up.PTX_FORBID``.
PTX_REQUIRE = (
    "fma.rn.f32", "mul.rn.f32", "mul.rn.f16x2", "cvt.rn.f16x2.e4m3x2", "cvt.f32.f16", "ld.global.nc.v2.u32",
    "ld.global.nc.v4.u32", "shfl.sync.bfly.b32", "vote.sync.ballot.b32", "add.rn.f32", "cvt.rn.bf16.f32",
    "griddepcontrol.wait", "griddepcontrol.launch_dependents",
)  # fmt: skip
PTX_FORBID = ll_gate_up.PTX_FORBID


@functools.cache
def _dsl() -> types.SimpleNamespace:
    """Define the partial kernel and the two host functions once (module globals, as ``ll_gate_up._dsl``)."""
    base = ll_gate_up._dsl()
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T, dsl_user_op

    add_rn, fma_rn, bits_f32 = base.add_rn, base.fma_rn, base.bits_f32
    _finish_kernel = base._finish_kernel
    _combine_kernel = ll_down._dsl().combine

    def _inline(ret, vals, asm, cons, *, side=False, loc=None, ip=None):
        return llvm.inline_asm(
            ret, vals, asm, cons, has_side_effects=side, is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip,
        )  # fmt: skip

    def _i32(v, loc=None, ip=None):
        return Int32(v).ir_value(loc=loc, ip=ip)

    def _i64(v, loc=None, ip=None):
        return Int64(v).ir_value(loc=loc, ip=ip)

    @dsl_user_op
    def ld_nc_v2(addr, *, loc=None, ip=None):
        """Two int32 words at the 8-byte-aligned global byte address ``addr`` (Int64), one 64-bit load."""
        st = llvm.StructType.get_literal([T.i32(), T.i32()])
        r = _inline(st, [_i64(addr, loc, ip)], "ld.global.nc.v2.u32 {$0, $1}, [$2];", "=r,=r,l", loc=loc, ip=ip)
        return [Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(2)]

    @dsl_user_op
    def ld_nc_v4(addr, *, loc=None, ip=None):
        """Four int32 words at the 16-byte-aligned global byte address ``addr`` (Int64), one 128-bit load."""
        st = llvm.StructType.get_literal([T.i32()] * 4)
        asm = "ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];"
        r = _inline(st, [_i64(addr, loc, ip)], asm, "=r,=r,=r,=r,l", loc=loc, ip=ip)
        return [Int32(llvm.extractvalue(T.i32(), r, [i], loc=loc, ip=ip)) for i in range(4)]

    @dsl_user_op
    def scale_f16x2(s, *, loc=None, ip=None):
        """The E4M3 byte ``s`` (bits 0-7) as f16x2 (both halves), exact: ``cvt.rn.f16x2.e4m3x2``."""
        asm = "{ .reg .b16 t; and.b32 $0, $1, 255; mul.lo.u32 $0, $0, 257; cvt.u16.u32 t, $0; " \
              "cvt.rn.f16x2.e4m3x2 $0, t; }"  # fmt: skip
        return Int32(_inline(T.i32(), [_i32(s, loc, ip)], asm, "=&r,r", loc=loc, ip=ip))

    @dsl_user_op
    def pair_f32(h, sc2, *, loc=None, ip=None):
        """(low, high) fp32 of f16x2 ``h`` (two codes as ``e2m1 * 2^-14``) times 2^14 times ``sc2``: exact."""
        st = llvm.StructType.get_literal([T.f32(), T.f32()])
        asm = (
            "{ .reg .b32 t, c; .reg .b16 lo, hi; mov.b32 c, " + str(_F16X2_2P14) + "; mul.rn.f16x2 t, $2, c; "
            "mul.rn.f16x2 t, t, $3; mov.b32 {lo, hi}, t; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }"
        )
        r = _inline(st, [_i32(h, loc, ip), _i32(sc2, loc, ip)], asm, "=f,=f,r,r", loc=loc, ip=ip)
        return [Float32(llvm.extractvalue(T.f32(), r, [i], loc=loc, ip=ip)) for i in range(2)]

    @dsl_user_op
    def st_f32_if(addr, v, pred, *, loc=None, ip=None):
        """``st.global.f32 [addr], v`` when the Int32 ``pred`` is non-zero (a predicated store, no branch)."""
        asm = "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p st.global.f32 [$0], $1; }"
        vals = [_i64(addr, loc, ip), Float32(v).ir_value(loc=loc, ip=ip), _i32(pred, loc, ip)]
        llvm.inline_asm(res=None, operands_=vals, asm_string=asm, constraints="l,f,r,~{memory}", has_side_effects=True,
                        asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)

    def sel(c, a, b):
        return cutlass.select_(c, a, b)

    def decode_block(word0, word1, sc2):
        """The 16 fp32 weights of a block from its two code words (element 8 * half + n: nibble n of word half)."""
        w = [None] * 16
        for half, word in enumerate((word0, word1)):
            for n in range(4):
                sh_m, sh_s = 9 - 4 * n, 12 - 4 * n
                mag = (word << sh_m) if sh_m >= 0 else (word >> -sh_m)
                sgn = word << sh_s
                h = (mag & 0x0E000E00) | (sgn & Int32(-2147450880))  # 0x80008000
                lo, hi = pair_f32(h, sc2)
                w[8 * half + n], w[8 * half + n + 4] = lo, hi
        return w

    def x_block(x_base, xr, blk, kdim):
        """The 16 inputs of block ``blk`` of row ``xr`` (bf16 widened exactly to fp32), two 128-bit loads."""
        addr = x_base + (Int64(xr) * kdim + Int64(blk) * 16) * 2
        words = ld_nc_v4(addr) + ld_nc_v4(addr + 16)
        out = []
        for v in words:
            out += [bits_f32(v << 16), bits_f32(v & Int32(-65536))]  # 0xFFFF0000
        return out

    def body(nt, x_base, w_base, sf, ws_base, e, row, s, lane, slots, xrows, cnt, K, N, KV, S):
        """Accumulate ``nt`` token slots of one row (module docstring), then the butterfly and the stores."""
        bps = (K // 16 + S - 1) // S
        mp, kp = ll_gate_up.scale_block_shape(N, K)
        w_row = ll_gate_up.codes_row_word(e, row, N, K)
        sf_row = ll_gate_up.scale_row_byte(e, row, mp, kp)
        exact = KV == K and bps * S == K // 16  # every lane of every step holds a valid block
        acc = [Float32(0.0) for _ in range(nt)]
        for j in range((bps + 31) // 32):
            jb = j * 32 + lane
            blk = s * bps + jb
            tail = not exact or (j + 1) * 32 > bps
            ok = None
            if tail:
                ok = (jb < bps) & (blk * 16 < KV)
                blk = sel(ok, blk, s * 0)  # an idle lane reads block 0 of its row and keeps its sum
                blk = Int32(blk)
            c0, c1 = ld_nc_v2(w_base + (Int64(w_row) + Int64(blk) * 2) * 4)
            sc2 = scale_f16x2(Int32(sf[sf_row + ll_gate_up.scale_block_byte(blk)]))
            wv = decode_block(c0, c1, sc2)
            for t in range(nt):
                xv = x_block(x_base, xrows[t], blk, K)
                a = acc[t]
                for h in range(16):
                    a = fma_rn(xv[h], wv[h], a)
                acc[t] = Float32(sel(ok, a, acc[t])) if tail else a
        for t in range(nt):
            a = acc[t]
            for lvl in range(5):
                a = add_rn(a, cute.arch.shuffle_sync_bfly(a, offset=16 >> lvl))
            dst = ws_base + (Int64(slots[t]) * S + s) * (N * 4) + Int64(row) * 4
            st_f32_if(dst, a, Int32(sel((lane == 0) & (cnt > t), 1, 0)))

    @cute.kernel
    def _partial_kernel(
        x: cute.Tensor,  # bf16 [rows of K] (flat): the tokens' xn (gate/up), the pairs' act (down), shared act
        ids: cute.Tensor,  # int32 [P]
        w: cute.Tensor,  # int32 [E * N * K / 8]
        sf: cute.Tensor,  # uint8 [E * Mp * Kp]
        ws: cute.Tensor,  # fp32 [P * S * N]
        pairs: Int32,  # P (routed) or M (shared)
        K: cutlass.Constexpr,
        N: cutlass.Constexpr,
        KV: cutlass.Constexpr,
        S: cutlass.Constexpr,
        TOPK: cutlass.Constexpr,
        ROUTED: cutlass.Constexpr,
        X_BY_PAIR: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        rt, s, q = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32
        row = rt * WARPS + warp
        cute.arch.griddepcontrol_wait()
        x_base = x.iterator.toint()
        w_base = w.iterator.toint()
        ws_base = ws.iterator.toint()
        e = Int32(0)
        first = Int32(1)
        cnt = pairs
        slots = [Int32(0) for _ in range(MAX_TOKENS)]
        xrows = [Int32(0) for _ in range(MAX_TOKENS)]
        if cutlass.const_expr(ROUTED):
            e = ids[q]
            groups = (MAX_TOKENS * TOPK + 31) // 32
            masks = []
            ranks = []
            dup = Int32(0)
            below = Int32(0)
            for g in cutlass.range_constexpr(groups):
                p = lane + 32 * g
                inb = p < pairs
                v = Int32(ids[Int32(sel(inb, p, 0))])
                m = inb & (v == e)
                masks.append(cute.arch.vote_ballot_sync(m))
                dup = dup | cute.arch.vote_ballot_sync(m & (p < q))
            lt = (Int32(1) << lane) - 1
            cnt = Int32(0)
            for g in cutlass.range_constexpr(groups):
                ranks.append(Int32(sel(masks[g] & (Int32(1) << lane) != 0,
                                       below + cute.arch.popc(masks[g] & lt), -1)))  # fmt: skip
                below = below + cute.arch.popc(masks[g])
            cnt = below
            first = Int32(sel(dup == 0, 1, 0))
            for c in cutlass.range_constexpr(MAX_TOKENS):
                pc = Int32(0)
                for g in cutlass.range_constexpr(groups):
                    bal = cute.arch.vote_ballot_sync(ranks[g] == c)
                    low = bal & (0 - bal)
                    pc = pc + Int32(sel(bal != 0, 32 * g + cute.arch.popc(low - 1), 0))
                slots[c] = pc
                xrows[c] = pc if X_BY_PAIR else pc // TOPK
        else:
            for c in cutlass.range_constexpr(MAX_TOKENS):
                slots[c] = Int32(sel(c < cnt, c, 0))
                xrows[c] = slots[c]
        if first != 0:
            if cnt <= 1:
                body(1, x_base, w_base, sf, ws_base, e, row, s, lane, slots, xrows, cnt, K, N, KV, S)
            elif cnt <= 2:
                body(2, x_base, w_base, sf, ws_base, e, row, s, lane, slots, xrows, cnt, K, N, KV, S)
            elif cnt <= 4:
                body(4, x_base, w_base, sf, ws_base, e, row, s, lane, slots, xrows, cnt, K, N, KV, S)
            else:
                body(8, x_base, w_base, sf, ws_base, e, row, s, lane, slots, xrows, cnt, K, N, KV, S)
        cute.arch.griddepcontrol_launch_dependents()

    @cute.jit
    def _gate_up_host(
        x: cute.Tensor, ids: cute.Tensor, w: cute.Tensor, sf: cute.Tensor, gs: cute.Tensor, ws: cute.Tensor,
        act: cute.Tensor, g_tap: cute.Tensor, u_tap: cute.Tensor, pairs: Int32, top_k: Int32,
        H: cutlass.Constexpr, IP: cutlass.Constexpr, S: cutlass.Constexpr, ROUTED: cutlass.Constexpr,
        TAP: cutlass.Constexpr, TOPK: cutlass.Constexpr, stream: cuda.CUstream,
    ):  # fmt: skip
        _partial_kernel(x, ids, w, sf, ws, pairs, H, 2 * IP, H, S, TOPK, ROUTED, False).launch(
            grid=[2 * IP // WARPS, S, pairs if ROUTED else 1], block=[32 * WARPS, 1, 1], stream=stream, use_pdl=True
        )
        _finish_kernel(ws, ids, gs, act, g_tap, u_tap, IP, S, ROUTED, TAP).launch(
            grid=[(IP + FINISH_THREADS - 1) // FINISH_THREADS, pairs, 1], block=[FINISH_THREADS, 1, 1],
            stream=stream, use_pdl=True,
        )  # fmt: skip

    @cute.jit
    def _down_host(
        act: cute.Tensor, sact: cute.Tensor, ids: cute.Tensor, tw: cute.Tensor, w2: cute.Tensor,
        sf2: cute.Tensor, gs2: cute.Tensor, sw2: cute.Tensor, ssf2: cute.Tensor, gs_s: cute.Tensor,
        ws_r: cute.Tensor, ws_s: cute.Tensor, out: cute.Tensor, acc_tap: cute.Tensor, y_tap: cute.Tensor,
        sacc_tap: cute.Tensor, sy_tap: cute.Tensor, tokens: Int32, H: cutlass.Constexpr, IP: cutlass.Constexpr,
        IV: cutlass.Constexpr, SI: cutlass.Constexpr, TOPK: cutlass.Constexpr, S: cutlass.Constexpr,
        SS: cutlass.Constexpr, TAP: cutlass.Constexpr, stream: cuda.CUstream,
    ):  # fmt: skip
        _partial_kernel(act, ids, w2, sf2, ws_r, tokens * TOPK, IP, H, IV, S, TOPK, True, True).launch(
            grid=[H // WARPS, S, tokens * TOPK], block=[32 * WARPS, 1, 1], stream=stream, use_pdl=True
        )
        _partial_kernel(sact, ids, sw2, ssf2, ws_s, tokens, SI, H, SI, SS, 1, False, True).launch(
            grid=[H // WARPS, SS, 1], block=[32 * WARPS, 1, 1], stream=stream, use_pdl=True
        )
        _combine_kernel(
            ws_r, ws_s, ids, tw, gs2, gs_s, out, acc_tap, y_tap, sacc_tap, sy_tap, H, TOPK, S, SS, TAP
        ).launch(
            grid=[(H + FINISH_THREADS - 1) // FINISH_THREADS, tokens, 1], block=[FINISH_THREADS, 1, 1],
            stream=stream, use_pdl=True,
        )  # fmt: skip

    globals().update({n: v for n, v in locals().items() if not n.startswith("__")})
    return types.SimpleNamespace(cute=cute, cuda=cuda, gate_up=_gate_up_host, down=_down_host)


#: The block's shapes with a shared expert, per host function (name -> spec): DeepSeek-V3 (and Kimi-K2's 384
#: experts), GLM-4.5, Ling-mini-2.0 with K-splits each shape allows, a padded intermediate (I = 960 of Ip = 1024),
#: GLM-4.5-Air's down (I = SI = 1408: 88 blocks, a lane tail); the conformance launches are audited besides.
AUDIT_SPECS = {
    "gate_up": {
        "dsv3.routed.S2": GateUpSpec(7168, 2048, 256, 2, True, 8),
        "dsv3.shared.S7": GateUpSpec(7168, 2048, 1, 7, False, 1),
        "kimi.routed.S2": GateUpSpec(7168, 2048, 384, 2, True, 8),
        "glm45.routed.S2": GateUpSpec(5120, 1536, 160, 2, True, 8),
        "glm45.shared.S5": GateUpSpec(5120, 1536, 1, 5, False, 1),
        "ling.routed.S4": GateUpSpec(2048, 512, 256, 4, True, 8),
        "ling.shared.S4": GateUpSpec(2048, 512, 1, 4, False, 1),
        "glm45.routed.S3": GateUpSpec(5120, 1536, 160, 3, True, 8),  # 107 blocks per split: a lane tail
    },
    "down": {
        "dsv3.S4": DownSpec(7168, 2048, 2048, 2048, 256, 8, 4, 4),
        "kimi.S2": DownSpec(7168, 2048, 2048, 2048, 384, 8, 2, 2),
        "glm45.S3": DownSpec(5120, 1536, 1536, 1536, 160, 8, 3, 3),
        "ling.S1": DownSpec(2048, 512, 512, 512, 256, 8, 1, 1),
        "padded.S1": DownSpec(2048, 1024, 960, 512, 16, 4, 1, 1),
        "glm45air.S1": DownSpec(4096, 1408, 1408, 1408, 128, 8, 1, 1),  # K / 16 = 88 blocks: a lane tail
    },
}


def compile_gate_up(spec: GateUpSpec, pairs: int = 8, *, tap: bool = False, arch: str = "sm_90a"):
    """Compile the gate/up host function (partial + finish) of ``spec`` for ``arch`` (no GPU needed) with
    placeholder CPU tensors of the right dtypes and sizes for ``pairs`` rows; returns the compiled function
    (``.artifacts.PTX`` holds the PTX, ``.artifacts.CUBIN`` the cubin). RuntimeError without nvidia-cutlass-dsl."""
    ok, why = cute_available()
    if not ok:
        raise RuntimeError(why)
    import torch
    from cutlass.cute.runtime import from_dlpack

    ns = _dsl()
    h, ip, e, s = spec.hidden, spec.inter, spec.experts, spec.splits
    mp, kp = ll_gate_up.scale_block_shape(2 * ip, h)
    z = torch.zeros
    t = [z(pairs * h, dtype=torch.bfloat16), z(pairs, dtype=torch.int32), z(e * 2 * ip * h // 8, dtype=torch.int32),
         z(e * mp * kp, dtype=torch.uint8), torch.ones(e), z(pairs * s * 2 * ip), z(pairs * ip, dtype=torch.int16),
         z(pairs * ip), z(pairs * ip)]  # fmt: skip
    args = [from_dlpack(v).mark_layout_dynamic() for v in t]
    with tempfile.TemporaryDirectory(prefix="flint-cute-") as d:
        opts = f"--gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {d}"
        return ns.cute.compile(
            ns.gate_up, *args, pairs, spec.top_k, h, ip, s, spec.routed, tap, spec.top_k, ns.cuda.CUstream(0),
            options=opts,
        )


def compile_down(spec: DownSpec, tokens: int = 1, *, tap: bool = False, arch: str = "sm_90a"):
    """Compile the down host function (routed and shared partials + combine) of ``spec`` for ``arch`` with
    placeholder CPU tensors for ``tokens`` tokens; returns the compiled function (``.artifacts.PTX`` /
    ``.artifacts.CUBIN``). RuntimeError without nvidia-cutlass-dsl."""
    ok, why = cute_available()
    if not ok:
        raise RuntimeError(why)
    import torch
    from cutlass.cute.runtime import from_dlpack

    ns = _dsl()
    h, ip, si, e, k = spec.hidden, spec.inter, spec.shared_inter, spec.experts, spec.top_k
    s, ss, m = spec.splits, spec.shared_splits, tokens
    mp, kp = ll_gate_up.scale_block_shape(h, ip)
    z = torch.zeros
    t = [
        z(m * k * ip, dtype=torch.bfloat16), z(m * si, dtype=torch.bfloat16), z(m * k, dtype=torch.int32),
        z(m * k), z(e * h * ip // 8, dtype=torch.int32), z(e * mp * kp, dtype=torch.uint8), z(e),
        z(h * si // 8, dtype=torch.int32), z(h * si // 16, dtype=torch.uint8), z(1), z(m * k * s * h), z(m * ss * h),
        z(m * h, dtype=torch.int16), z(m * k * h), z(m * k * h, dtype=torch.int16), z(m * h),
        z(m * h, dtype=torch.int16),
    ]  # fmt: skip
    args = [from_dlpack(v).mark_layout_dynamic() for v in t]
    with tempfile.TemporaryDirectory(prefix="flint-cute-") as d:
        opts = f"--gpu-arch {arch} --keep-ptx --keep-cubin --dump-dir {d}"
        return ns.cute.compile(
            ns.down, *args, m, h, ip, spec.valid_inter, si, k, s, ss, tap, ns.cuda.CUstream(0), options=opts
        )


def audit_gate_up(spec: GateUpSpec, *, tap: bool = False) -> list[str]:
    """Problems of the gate/up build's sm_90a PTX against :data:`PTX_REQUIRE` (the ballot for a routed spec only)
    plus ``ex2.approx.ftz.f32`` / ``rcp.approx.ftz.f32``, and :data:`PTX_FORBID` (empty: passes)."""
    from flint_moe.kernels.audit.ptx import audit_ptx

    req = PTX_REQUIRE if spec.routed else tuple(r for r in PTX_REQUIRE if r != "vote.sync.ballot.b32")
    fn = compile_gate_up(spec, tap=tap)
    return audit_ptx(fn.artifacts.PTX, req + ("ex2.approx.ftz.f32", "rcp.approx.ftz.f32"), PTX_FORBID)


def audit_down(spec: DownSpec, *, tap: bool = False) -> list[str]:
    """Problems of the down build's sm_90a PTX against :data:`PTX_REQUIRE` / :data:`PTX_FORBID` (empty: passes)."""
    from flint_moe.kernels.audit.ptx import audit_ptx

    return audit_ptx(compile_down(spec, tap=tap).artifacts.PTX, PTX_REQUIRE, PTX_FORBID)
