"""NVFP4 decode down GEMV over a token's k experts + combine + shared add (rule steps 5, 8, 9, 10).

Production path (``SPLIT``, default): ``_nvfp4_down_split_kernel``, one program per (token, selected expert,
BH-row block) computing ``y_j``; the last of a row block's k programs to finish (arrival counter) does the
combine in selection order, so the bits equal the sequential kernel's below (which stays as ``SPLIT=False``).

Sequential kernel (``SPLIT=False``): one program computes ``BH`` hidden rows of one token: for each selected
expert j (selection order) the down projection of that pair's activation row through ``FlintMoEWeights.w2``
(uint8 [E, H, Ip/2]) and its
128x4-swizzled E4M3 scales, ``y_j = bf16(RN(y_acc * w2_alpha[e]))``, the combine
``acc = fma(tw_j, y_j, acc)``, then ``out = bf16(RN(fp32(bf16(acc)) + fp32(shared)))``.
Seed: ``_down_gemv_kernel`` of ``vllm.models.flint.ops.moe`` (semantics only; this kernel adds the exact
sm_90 E2M1 decode, the block grouping, the rule's rounding points, a documented summation order, taps,
64-bit offsets and H, I not powers of two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET, check_op_tensor, gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels._rule import bf16_rn
from flint_moe.kernels.audit.registry import BF16_CVT, register_audit
from flint_moe.kernels.nvfp4.gemv import (
    block_partials,
    code_partials,
    e4m3_to_f32,
    load_bytes,
    load_codes,
    load_words,
    mma_gemv,
    mma_sum_parts,
    mma_tile_rows,
    swizzled_scale_offsets,
)
from flint_moe.kernels.nvfp4.tuned import DOWN as _TUNED_DOWN, DOWN_BY_SHAPE as _TUNED_DOWN_BY_SHAPE

__all__ = ["DOWN_CONFIG", "nvfp4_down", "default_config", "accumulation_model", "audit_specs"]

#: Launch configuration: ``BH`` hidden rows per program, ``BKB`` code bytes of a row per K step (a power of
#: two >= 32; fixes the summation order, see the kernel docstring), ``num_warps``, ``PREFETCH`` (register
#: double buffer of codes + scales), ``SPLIT`` (one program per (pair, row block)), ``COMBINE`` (1: the last
#: arriving program combines; 0: a separate combine launch), ``WORDS`` (split kernel only: codes loaded and
#: carried as int32 words, decoded 8 codes per asm; same values). Only ``BKB`` changes bits.
#: ``MMA``, ``RT``, ``S``, ``SK``, ``LATE``, ``PF``, ``L2PF``: the tensor-core path as in ``GATE_UP_CONFIG``
#: (BH * SK = 8 * num_warps * RT). ``RB`` (tensor-core path): row blocks per program, one after the other;
#: ``EARLY`` (tensor-core path): 1 / 2 read the first call's weights (into registers / L2) before
#: ``griddepcontrol.wait`` (see ``_nvfp4_down_split_kernel``; scheduling only, same bits); ``MAXNREG``
#: (tensor-core path): a register cap per thread for ptxas (0 = none; e.g. 72 keeps 28 one-warp programs per
#: SM). The CUDA-core path ignores RB, EARLY and MAXNREG (as FENCE and L2PF). The tuned values
#: (``nvfp4_tuned.DOWN``) override the base values below, and
#: ``nvfp4_tuned.DOWN_BY_SHAPE[(H, I)]`` those at one shape (``default_config``).
DOWN_CONFIG = {
    "BH": 16, "BKB": 512, "num_warps": 4, "PREFETCH": True, "SPLIT": True, "COMBINE": 1, "WORDS": False,
    "MMA": False, "RT": 2, "S": 2, "SK": 1, "LATE": False, "PF": False, "L2PF": 0,
    "FENCE": False, "RB": 1, "EARLY": 0, "MAXNREG": 0,
}  # fmt: skip
DOWN_CONFIG.update(_TUNED_DOWN)


def _check_down_overrides() -> None:
    from flint_moe.kernels.nvfp4.gate_up import _check_shape_overrides

    _check_shape_overrides(DOWN_CONFIG, _TUNED_DOWN_BY_SHAPE, "nvfp4_tuned.DOWN_BY_SHAPE")


_check_down_overrides()


def default_config(H: int, I: int) -> dict:
    """The launch configuration ``nvfp4_down`` uses at hidden size ``H`` and valid intermediate size ``I`` when
    no ``config`` is given (``config`` keys override it): ``DOWN_CONFIG`` updated with
    ``nvfp4_tuned.DOWN_BY_SHAPE[(H, I)]`` if present (a pure function of the shape; never changes ``MMA``)."""
    return {**DOWN_CONFIG, **_TUNED_DOWN_BY_SHAPE.get((int(H), int(I)), {})}


@triton.jit
def _nvfp4_down_kernel(
    act_ptr,  # int32 [M * TOPK, INTER / 2]: act (bf16 [M * TOPK, INTER]) as bf16 pairs
    ids_ptr,  # int32 [M * TOPK]
    tw_ptr,  # fp32 [M * TOPK]: routing weights (bf16 values)
    w_ptr,  # uint8 w2 [E, H, IP / 2]
    s_ptr,  # uint8 w2 scales, 128x4 swizzle [E, roundup(H, 128), KP]
    alpha_ptr,  # fp32 [E]
    shared_ptr,  # bf16 [M, H]
    out_ptr,  # bf16 [M, H] (out)
    dacc_ptr,  # fp32 [M * TOPK, H] (out, TAP only): y_acc
    y_ptr,  # bf16 [M * TOPK, H] (out, TAP only): y
    H: tl.constexpr,
    IP: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BH: tl.constexpr,
    BKB: tl.constexpr,
    ASM: tl.constexpr,
    DECODE: tl.constexpr,
    PREFETCH: tl.constexpr,
    TAP: tl.constexpr,
):
    """out[t, h] = bf16(RN(fp32(bf16(acc)) + shared[t, h])), acc = fma(tw_j, y_j, acc) for j = 0..TOPK-1.

    Grid ``(M, cdiv(H, BH))``: program (t, q) handles token t, rows h in [q*BH, q*BH + BH) (masked at H).
    ``y_j = bf16(RN(y_acc_j * gs2[e_j]))`` (rule step 8, ``mul.f32`` then ``cvt.rn.bf16.f32``); combine: rule
    step 9 (``fma.rn.f32`` from acc = +0, selection order), step 10 (``cvt.rn.bf16.f32``, ``add.f32``,
    ``cvt.rn.bf16.f32``).

    Summation order of y_acc (one row h of expert e_j, length INTER over the activation; element i, block
    b = i // 16, byte i // 2; padded columns i >= INTER are never read): a K step covers ``BKB`` bytes
    (``BKB / 8`` blocks); a thread holds 16 consecutive bytes (blocks 2L, 2L + 1 of the step, lane L =
    0..BKB/16 - 1) and one fp32 accumulator per block slot. Per block: ``s = sum_{q=0..15} E2M1(code) * act``
    sequentially in element order (exact products), then ``acc[slot] = fma(s, scale_b, acc[slot])`` from +0,
    steps in increasing order (a partial last step adds exact zeros for its missing blocks); then ``tl.sum``
    over the slots: each thread adds its two slots, then a butterfly across the ``BKB / 16`` lanes (xor 16, 8,
    4, 2, 1 as far as the lanes span). Bound: block model (B = 16) of ``flint_moe.reference.exact``.
    """
    gdc_wait()
    gdc_launch_dependents()
    IB: tl.constexpr = INTER // 2  # valid code bytes (and act bf16 pairs) per row
    IPB: tl.constexpr = IP // 2  # stored code bytes per row
    KP: tl.constexpr = (IP // 16 + 3) // 4 * 4
    MP: tl.constexpr = (H + 127) // 128 * 128
    t = tl.program_id(0)
    q = tl.program_id(1)
    h = q * BH + tl.arange(0, BH)
    h_ok = h < H
    hc = tl.where(h_ok, h, 0)
    NB: tl.constexpr = BKB // 8
    FULL: tl.constexpr = IB // BKB * BKB  # bytes covered by full K steps
    s_off = swizzled_scale_offsets(hc[:, None], tl.arange(0, NB)[None, :], KP)  # scale offsets of step 0
    out = tl.zeros([BH], dtype=tl.float32)
    for j in tl.range(0, TOPK):
        p = t * TOPK + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        w_row = w_ptr + e * (H * IPB) + hc.to(tl.int64) * IPB
        s_row = s_ptr + e * (MP * KP)
        a_row = act_ptr + p.to(tl.int64) * IB
        acc = tl.full([BH, NB], 0.0, tl.float32)
        ar = tl.arange(0, BKB)
        if PREFETCH and FULL > 0:
            codes = tl.load(w_row[:, None] + ar[None, :], mask=h_ok[:, None], other=0)
            sb = load_bytes(s_row + s_off + 0, h_ok[:, None], ASM)
            for k0 in tl.range(BKB, FULL, BKB):
                codes_n = tl.load(w_row[:, None] + (k0 + ar)[None, :], mask=h_ok[:, None], other=0)
                sb_n = load_bytes(s_row + s_off + (k0 // 32) * 512, h_ok[:, None], ASM)
                xw = load_words(a_row + (k0 - BKB) + ar, ar >= 0, ASM)
                part = block_partials(codes, xw, BH, BKB, DECODE)
                acc = tl.fma(part, e4m3_to_f32(sb), acc)
                codes = codes_n
                sb = sb_n
            xw = load_words(a_row + (FULL - BKB) + ar, ar >= 0, ASM)
            part = block_partials(codes, xw, BH, BKB, DECODE)
            acc = tl.fma(part, e4m3_to_f32(sb), acc)
        else:
            for k0 in tl.range(0, FULL, BKB):
                codes = tl.load(w_row[:, None] + (k0 + ar)[None, :], mask=h_ok[:, None], other=0)
                sb = load_bytes(s_row + s_off + (k0 // 32) * 512, h_ok[:, None], ASM)
                xw = load_words(a_row + k0 + ar, ar >= 0, ASM)
                part = block_partials(codes, xw, BH, BKB, DECODE)
                acc = tl.fma(part, e4m3_to_f32(sb), acc)
        if FULL < IB:  # partial last step: masked groups read clamped (in-bounds) addresses and are zeroed
            kb = FULL + ar
            cb = FULL // 8 + tl.arange(0, NB)
            k_ok = kb < IB
            c_ok = cb < IB // 8
            codes = tl.load(w_row[:, None] + kb[None, :], mask=h_ok[:, None] & k_ok[None, :], other=0)
            xw = load_words(a_row + kb % IB, k_ok, ASM)
            sb = load_bytes(
                s_row + swizzled_scale_offsets(hc[:, None], (cb % (IB // 8))[None, :], KP),
                h_ok[:, None] & c_ok[None, :],
                ASM,
            )
            part = block_partials(codes, xw, BH, BKB, DECODE)
            acc = tl.fma(part, e4m3_to_f32(sb), acc)
        y_acc = tl.sum(acc, axis=1)
        gs = tl.load(alpha_ptr + e)
        y = bf16_rn(y_acc * gs)
        tw = tl.load(tw_ptr + p)
        out = tl.fma(tl.zeros([BH], dtype=tl.float32) + tw, y.to(tl.float32), out)
        if TAP:
            tap_off = p.to(tl.int64) * H + h
            tl.store(dacc_ptr + tap_off, y_acc, mask=h_ok)
            tl.store(y_ptr + tap_off, y, mask=h_ok)
    routed = bf16_rn(out)
    o_off = t.to(tl.int64) * H + h
    sh = tl.load(shared_ptr + o_off, mask=h_ok, other=0.0)
    res = bf16_rn(routed.to(tl.float32) + sh.to(tl.float32))
    tl.store(out_ptr + o_off, res, mask=h_ok)


@triton.jit
def _combine_rows(
    t, h, h_ok, tw_ptr, y_ptr, shared_ptr, out_ptr, H: tl.constexpr, TOPK: tl.constexpr, CG: tl.constexpr
):
    """Rule steps 9-10 for token t, rows h: acc = fma(tw_j, y_j, acc) for j = 0..TOPK-1 from +0 (selection
    order), out = bf16(RN(fp32(bf16(acc)) + fp32(shared))). ``CG``: read y through L2 only (``ld.global.cg``;
    y was written by other programs of the same launch)."""
    out = tl.full(h.shape, 0.0, tl.float32)
    for j in tl.static_range(0, TOPK):
        p = t * TOPK + j
        if CG:
            y = tl.load(y_ptr + p.to(tl.int64) * H + h, mask=h_ok, other=0.0, cache_modifier=".cg")
        else:
            y = tl.load(y_ptr + p.to(tl.int64) * H + h, mask=h_ok, other=0.0)
        tw = tl.load(tw_ptr + p)
        out = tl.fma(tl.full(h.shape, 0.0, tl.float32) + tw, y.to(tl.float32), out)
    routed = bf16_rn(out)
    o_off = t.to(tl.int64) * H + h
    sh = tl.load(shared_ptr + o_off, mask=h_ok, other=0.0)
    res = bf16_rn(routed.to(tl.float32) + sh.to(tl.float32))
    tl.store(out_ptr + o_off, res, mask=h_ok)


@triton.jit
def _nvfp4_down_split_kernel(
    act_ptr,  # int32 [M * TOPK, INTER / 2]: act (bf16 [M * TOPK, INTER]) as bf16 pairs
    ids_ptr,  # int32 [M * TOPK]
    tw_ptr,  # fp32 [M * TOPK]: routing weights (bf16 values)
    w_ptr,  # uint8 w2 [E, H, IP / 2]
    s_ptr,  # uint8 w2 scales, 128x4 swizzle [E, roundup(H, 128), KP]
    alpha_ptr,  # fp32 [E]
    shared_ptr,  # bf16 [M, H]
    out_ptr,  # bf16 [M, H] (out, COMBINE == 1 only)
    dacc_ptr,  # fp32 [M * TOPK, H] (out, TAP only): y_acc
    y_ptr,  # bf16 [M * TOPK, H] (out): y of every pair
    cnt_ptr,  # int32 [M * cdiv(cdiv(H, BH), RB)] arrival counters, 0 on entry and on exit (COMBINE == 1 only)
    H: tl.constexpr,
    IP: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BH: tl.constexpr,
    BKB: tl.constexpr,
    ASM: tl.constexpr,
    DECODE: tl.constexpr,
    PREFETCH: tl.constexpr,
    WORDS: tl.constexpr,
    MMA: tl.constexpr,
    RT: tl.constexpr,
    S: tl.constexpr,
    SK: tl.constexpr,
    NW: tl.constexpr,
    LATE: tl.constexpr,
    PF: tl.constexpr,
    L2PF: tl.constexpr,
    FENCE: tl.constexpr,
    COMBINE: tl.constexpr,
    TAP: tl.constexpr,
    RB: tl.constexpr = 1,
    EARLY: tl.constexpr = 0,
):
    """y[p, h] = bf16(RN(y_acc * gs2[e_p])) for one (token, selected expert) pair p and BH rows; with
    ``COMBINE == 1`` the last of a row block's TOPK programs to finish also does rule steps 9-10 for it.

    Grid ``(M * TOPK, cdiv(H, BH))``: program (p, q) handles pair p = t * TOPK + j, rows h in
    [q*BH, q*BH + BH) (masked at H). y_acc: the summation order of ``_nvfp4_down_kernel`` (the same K loop,
    then ``tl.sum``), so y is bit-identical to that kernel's. Combine (``_combine_rows``):
    ``acc = fma(tw_j, y_j, acc)`` for j = 0..TOPK-1 in selection order from +0, the rule's fixed order; which
    program does it (the last to arrive, found with an ``atom.acq_rel.gpu`` counter per (t, q) after a CTA
    barrier) changes no bit. The counter is reset to 0 by that program. ``COMBINE == 0``: y only; the
    launcher runs ``_nvfp4_combine_kernel`` next.

    ``MMA`` (tensor cores, ``nvfp4.gemv.mma_rows``): y_acc without block regrouping, as the gate/up kernel's
    ``MMA`` path: weights dequantised exactly to bf16 ``E2M1 * E4M3 * 2^-8``, products with act accumulated by
    chained ``mma.sync.m16n8k16`` (fp32, from +0; per 64-byte K step 8 MMAs per 16-byte chunk, the hardware's
    order and truncating alignment inside each), K steps in increasing order, ``y_acc = acc * 2^8`` (exact).
    ``SK`` > 1: K split into SK parts (different warps; ``mma_part_bytes(INTER / 2, SK)`` bytes each, the last
    one the rest), part sums added as ``p0 + p1`` /
    ``(p0 + p1) + (p2 + p3)``. Bound: ``FP32_TRUNCATE``
    (u = 2^-23, d = INTER). The combine is unchanged. ``LATE``: ``griddepcontrol.launch_dependents`` after the
    K loop instead of at the start (scheduling only).

    ``RB`` (tensor-core path): each program handles RB consecutive row blocks q = RB q' + r (r = 0..RB-1, grid
    ``(M * TOPK, cdiv(cdiv(H, BH), RB))``), one after the other with the same per-row K loop; one arrival
    counter per (t, q'), the last arriver combines all RB * BH rows (the same per-row combine): same bits.
    ``EARLY`` (tensor-core path; ``mma_gemv``): the expert id (``ld.global.cg``) and the weights of the first
    row block's first call (1: into registers; 2: L2 prefetch of its rows) are read before
    ``griddepcontrol.wait``, everything else after it. Same bits. Valid only when the ids were written by a
    grid that completed before this launch could start: the case when the preceding kernel (the gate/up GEMV,
    whose ids come from the router) triggers its dependents only after its own ``griddepcontrol.wait``
    (docs/kernels/nvfp4-decode.md, the down tuning with ``EARLY``).
    """
    EARLY_ON: tl.constexpr = MMA and EARLY > 0
    if not EARLY_ON:  # else in the first mma_gemv, after the early loads (and the trigger right after it)
        gdc_wait()
        if not LATE:
            gdc_launch_dependents()
    IB: tl.constexpr = INTER // 2  # valid code bytes (and act bf16 pairs) per row
    IPB: tl.constexpr = IP // 2  # stored code bytes per row
    KP: tl.constexpr = (IP // 16 + 3) // 4 * 4
    MP: tl.constexpr = (H + 127) // 128 * 128
    NQ: tl.constexpr = (H + BH - 1) // BH
    NQR: tl.constexpr = (NQ + RB - 1) // RB  # counters per token
    p = tl.program_id(0)
    q = tl.program_id(1)  # with RB > 1: the group of row blocks RB q .. RB q + RB - 1
    t = p // TOPK
    if EARLY_ON:  # before the wait: through L2 only (written by the router, a grid completed before this launch)
        e = tl.load(ids_ptr + p, cache_modifier=".cg").to(tl.int64)
    else:
        e = tl.load(ids_ptr + p).to(tl.int64)
    s_row = s_ptr + e * (MP * KP)
    a_row = act_ptr + p.to(tl.int64) * IB
    if MMA:  # tile of BH * SK rows: (local row i, K-part), NW warps, RT rows per thread
        TR: tl.constexpr = BH * SK
        i, kpart = mma_tile_rows(TR, NW, SK)
        for r in tl.static_range(RB):
            qr = q * RB + r
            hi = qr * BH + i
            hci = tl.where(hi < H, hi, 0)  # rows past H read row 0 (stores are masked)
            tt = mma_gemv(
                w_ptr + e * (H * IPB),
                hci.to(tl.int64) * IPB,
                s_row,
                hci,
                a_row,
                kpart,
                IB,
                KP,
                TR,
                RT,
                S,
                SK,
                p,
                PF,
                L2PF,
                FENCE,
                tl.minimum(e.to(tl.int32), 0),  # ids are >= 0: an opaque zero for FENCE
                EARLY if r == 0 else 0,  # the first row block passes the wait (EARLY)
                ids_ptr + p,  # EARLY: re-read after the wait, orders the activation loads after it
                r == 0 and not LATE,  # EARLY: launch_dependents right after the wait
            )
            y_acc = mma_sum_parts(tt, TR, NW, SK)
            if r < RB - 1:  # every row block but the last: its y now (the last one's below)
                hr = qr * BH + tl.arange(0, BH)
                yr = bf16_rn(y_acc * tl.load(alpha_ptr + e))
                tl.store(y_ptr + p.to(tl.int64) * H + hr, yr, mask=hr < H)
                if TAP:
                    tl.store(dacc_ptr + p.to(tl.int64) * H + hr, y_acc, mask=hr < H)
        h = (q * RB + RB - 1) * BH + tl.arange(0, BH)
        h_ok = h < H
    else:
        tl.static_assert(RB == 1, "nvfp4_down: RB > 1 needs MMA")
        h = q * BH + tl.arange(0, BH)
        h_ok = h < H
        hc = tl.where(h_ok, h, 0)
        w_row = w_ptr + e * (H * IPB) + hc.to(tl.int64) * IPB
        NB: tl.constexpr = BKB // 8
        FULL: tl.constexpr = IB // BKB * BKB  # bytes covered by full K steps
        s_off = swizzled_scale_offsets(hc[:, None], tl.arange(0, NB)[None, :], KP)  # scale offsets of step 0
        acc = tl.full([BH, NB], 0.0, tl.float32)
        ar = tl.arange(0, BKB)
        if WORDS:  # codes as int32 words (IPB is a multiple of 32: every row starts 16-byte aligned)
            w_off = tl.multiple_of(e * (H * IPB // 4) + hc.to(tl.int64) * (IPB // 4), 4)
            w_row = w_ptr.to(tl.pointer_type(tl.int32)) + w_off
        if PREFETCH and FULL > 0:
            codes = load_codes(w_row, 0, h_ok, BKB, WORDS)
            sb = load_bytes(s_row + s_off + 0, h_ok[:, None], ASM)
            for k0 in tl.range(BKB, FULL, BKB):
                codes_n = load_codes(w_row, k0, h_ok, BKB, WORDS)
                sb_n = load_bytes(s_row + s_off + (k0 // 32) * 512, h_ok[:, None], ASM)
                xw = load_words(a_row + (k0 - BKB) + ar, ar >= 0, ASM)
                part = code_partials(codes, xw, BH, BKB, DECODE, WORDS)
                acc = tl.fma(part, e4m3_to_f32(sb), acc)
                codes = codes_n
                sb = sb_n
            xw = load_words(a_row + (FULL - BKB) + ar, ar >= 0, ASM)
            part = code_partials(codes, xw, BH, BKB, DECODE, WORDS)
            acc = tl.fma(part, e4m3_to_f32(sb), acc)
        else:
            for k0 in tl.range(0, FULL, BKB):
                codes = load_codes(w_row, k0, h_ok, BKB, WORDS)
                sb = load_bytes(s_row + s_off + (k0 // 32) * 512, h_ok[:, None], ASM)
                xw = load_words(a_row + k0 + ar, ar >= 0, ASM)
                part = code_partials(codes, xw, BH, BKB, DECODE, WORDS)
                acc = tl.fma(part, e4m3_to_f32(sb), acc)
        if FULL < IB:  # partial last step: masked groups read clamped (in-bounds) addresses and are zeroed
            kb = FULL + ar
            cb = FULL // 8 + tl.arange(0, NB)
            k_ok = kb < IB
            c_ok = cb < IB // 8
            if WORDS:
                kw = FULL // 4 + tl.arange(0, BKB // 4)
                codes = tl.load(w_row[:, None] + kw[None, :], mask=h_ok[:, None] & (kw < IB // 4)[None, :], other=0)
            else:
                codes = tl.load(w_row[:, None] + kb[None, :], mask=h_ok[:, None] & k_ok[None, :], other=0)
            xw = load_words(a_row + kb % IB, k_ok, ASM)
            sb = load_bytes(
                s_row + swizzled_scale_offsets(hc[:, None], (cb % (IB // 8))[None, :], KP),
                h_ok[:, None] & c_ok[None, :],
                ASM,
            )
            part = code_partials(codes, xw, BH, BKB, DECODE, WORDS)
            acc = tl.fma(part, e4m3_to_f32(sb), acc)
        y_acc = tl.sum(acc, axis=1)
    if LATE:
        gdc_launch_dependents()
    gs = tl.load(alpha_ptr + e)
    y = bf16_rn(y_acc * gs)
    y_off = p.to(tl.int64) * H + h
    tl.store(y_ptr + y_off, y, mask=h_ok)
    if TAP:
        tl.store(dacc_ptr + y_off, y_acc, mask=h_ok)
    if COMBINE == 1:
        tl.debug_barrier()  # every thread's y stores precede the release below
        c_ptr = cnt_ptr + t * NQR + q
        arrived = tl.atomic_add(c_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == TOPK - 1:
            tl.atomic_xchg(c_ptr, 0, sem="relaxed", scope="gpu")
            for r in tl.static_range(RB):
                hr = (q * RB + r) * BH + tl.arange(0, BH)
                _combine_rows(t, hr, hr < H, tw_ptr, y_ptr, shared_ptr, out_ptr, H, TOPK, True)


@triton.jit
def _nvfp4_combine_kernel(tw_ptr, y_ptr, shared_ptr, out_ptr, H: tl.constexpr, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    """Rule steps 9-10 (``_combine_rows``) for token ``program_id(0)``, rows ``[q*BLOCK, q*BLOCK + BLOCK)``."""
    gdc_wait()
    gdc_launch_dependents()
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    _combine_rows(t, h, h < H, tw_ptr, y_ptr, shared_ptr, out_ptr, H, TOPK, False)


def accumulation_model(config: dict | None = None):
    """The summation model that bounds y_acc of ``nvfp4_down`` with ``config`` (overrides of ``DOWN_CONFIG``):
    ``block_model(16)`` for the CUDA-core path, ``FP32_TRUNCATE`` for the tensor-core path (``MMA``)."""
    from flint_moe.reference.exact import FP32_TRUNCATE, block_model

    cfg = {**DOWN_CONFIG, **(config or {})}
    return FP32_TRUNCATE if cfg["MMA"] else block_model(16)


def _check_rb_early(cfg: dict, mma: bool, rt: int, sub: int) -> tuple[int, int, int]:
    """(RB, EARLY, MAXNREG) of ``cfg`` as launched, after checks: RB an integer >= 1, EARLY 0, 1 or 2 (1 only with
    RT = 2, S = 2 or 4 and neither PF nor L2PF), MAXNREG 0 or in [24, 255]. Tensor-core options: the CUDA-core
    path runs with (1, 0, 0) whatever they are (as it ignores FENCE and L2PF)."""
    rb, early, maxnreg = int(cfg["RB"]), int(cfg["EARLY"]), int(cfg["MAXNREG"])
    if rb < 1:
        raise ValueError(f"config RB: {rb} must be >= 1 (row blocks per program)")
    if early not in (0, 1, 2):
        raise ValueError(f"config EARLY: {early} must be 0, 1 or 2")
    if maxnreg and not 24 <= maxnreg <= 255:
        raise ValueError(f"config MAXNREG: {maxnreg} must be 0 (none) or in [24, 255]")
    if not mma:
        return 1, 0, 0
    if early == 1 and (rt != 2 or sub not in (2, 4) or bool(cfg["PF"]) or int(cfg["L2PF"])):
        raise ValueError(f"config EARLY: 1 needs RT = 2 and S = 2 or 4 without PF and L2PF, got RT = {rt}, S = {sub}")
    return rb, early, maxnreg


_COUNTERS: dict = {}


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters (>= n) for the split down kernel, one buffer per device, kept between
    calls (the kernel leaves them at 0). Launches using it must be serialized on one stream (as the router's
    counter); allocated on first use, i.e. outside a CUDA-graph capture when the op is warmed up first."""
    key = str(device)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1 << 14), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def nvfp4_down(
    act: torch.Tensor,
    ids: torch.Tensor,
    tw: torch.Tensor,
    weights,
    shared_output: torch.Tensor,
    *,
    taps: dict | None = None,
    config: dict | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rule steps 8-10: out bf16 [M, H] from act bf16 [M * k, I] (``nvfp4_gate_up``), ids, tw and shared.

    Args:
        act: bf16 [M * k, I] contiguous (I = ``weights.valid_intermediate``).
        ids: int32 [M, k]; tw: fp32 [M, k] holding bf16 values (rule step 4); both contiguous.
        weights: ``FlintMoEWeights`` (w2 uint8 [E, H, Ip/2], swizzled scales, w2_alpha fp32 [E]).
        shared_output: bf16 [M, H] contiguous (the shared expert's output, rule step 10).
        taps: if a dict, compiled with ``TAP=True``: ``taps["down_acc"]`` fp32 [M, k, H] (before the global
            scale), ``taps["y"]`` bf16 [M, k, H], ``taps["out"]`` bf16 [M, H].
        config: overrides of ``DOWN_CONFIG`` (``BH``, ``BKB``, ``num_warps``, ``DECODE``, ``ASM``).
        out: None (a new tensor is returned) or a bf16 [M, H] contiguous tensor written and returned (it must
            not overlap any input: the op checks that, ``ops._checks.check_out``).

    Raises:
        TypeError / ValueError naming the offending tensor.

    With ``EARLY`` (tensor-core config), ``ids`` is read before the kernel's ``griddepcontrol.wait``: it must
    have been written by a grid that completed before the previous kernel on the stream let this one launch, as
    in ``nvfp4_gate_up`` -> ``nvfp4_down`` (gate/up triggers its dependents only after its own wait, i.e. after
    the router, or whatever wrote ``ids``, completed); ``act``, ``tw`` and ``shared_output`` are read after it.
    """
    from flint_moe.kernels.nvfp4.gate_up import _config, _decode_defaults, _weights_common

    E, H, IP, INTER = _weights_common(weights)
    dev = weights.w2.device
    check_op_tensor("ids", ids, dtype=torch.int32, shape=(None, None), device=dev)
    M, top_k = ids.shape
    check_op_tensor("tw", tw, dtype=torch.float32, shape=(M, top_k), device=dev)
    check_op_tensor("act", act, dtype=torch.bfloat16, shape=(M * top_k, INTER), device=dev)
    check_op_tensor("shared_output", shared_output, dtype=torch.bfloat16, shape=(M, H), device=dev)
    cfg = _config(config, default_config(H, INTER), "nvfp4_down")
    asm, decode = _decode_defaults(cfg, dev)
    bh, bkb = int(cfg["BH"]), int(cfg["BKB"])
    if bh <= 0 or bh & (bh - 1):
        raise ValueError(f"config BH: {bh} must be a power of two")
    if bkb < 32 or bkb & (bkb - 1):
        raise ValueError(f"config BKB: {bkb} must be a power of two >= 32")
    if out is None:
        out = torch.empty((M, H), dtype=torch.bfloat16, device=dev)
    check_op_tensor("out", out, dtype=torch.bfloat16, shape=(M, H), device=dev)
    tap = taps is not None
    if tap:
        dacc = torch.empty((M * top_k, H), dtype=torch.float32, device=dev)
        y = torch.empty((M * top_k, H), dtype=torch.bfloat16, device=dev)
    else:
        dacc, y = out, out  # never written
    split, combine, prefetch = bool(cfg["SPLIT"]), int(cfg["COMBINE"]), bool(cfg["PREFETCH"])
    mma, rt, sub, sk = bool(cfg["MMA"]), int(cfg["RT"]), int(cfg["S"]), int(cfg["SK"])
    nw = int(cfg["num_warps"])
    if mma:
        from flint_moe.kernels.nvfp4.gate_up import _check_mma, _check_pf

        if not split:
            raise ValueError("config MMA: needs SPLIT (the tensor-core path is in the split kernel)")
        sk, nw = _check_mma(rt, sub, sk, nw, bh, INTER // 2, "BH", "BH")
        _check_pf(bool(cfg["PF"]), rt, sub, int(cfg["L2PF"]), bool(cfg["FENCE"]))
    if combine not in (0, 1):
        raise ValueError(f"config COMBINE: must be 0 or 1, got {combine}")
    rb, early, maxnreg = _check_rb_early(cfg, mma, rt, sub)
    cap = {"maxnreg": maxnreg} if maxnreg and not INTERPRET else {}
    if M > 0 and split:
        nq = triton.cdiv(triton.cdiv(H, bh), rb)
        if not tap:
            y = torch.empty((M * top_k, H), dtype=torch.bfloat16, device=dev)
        cnt = _counters(dev, M * nq) if combine == 1 else y
        _nvfp4_down_split_kernel[(M * top_k, nq)](
            act.view(torch.int32),
            ids,
            tw,
            weights.w2,
            weights.w2_sf_swizzled.view(torch.uint8),
            weights.w2_alpha,
            shared_output,
            out,
            dacc,
            y,
            cnt,
            H=H,
            IP=IP,
            INTER=INTER,
            TOPK=top_k,
            BH=bh,
            BKB=bkb,
            ASM=asm,
            DECODE=decode,
            PREFETCH=prefetch,
            WORDS=bool(cfg["WORDS"]),
            MMA=mma,
            RT=rt,
            S=sub,
            SK=sk,
            NW=nw,
            LATE=bool(cfg["LATE"]),
            PF=bool(cfg["PF"]),
            L2PF=int(cfg["L2PF"]) if mma else 0,
            FENCE=bool(cfg["FENCE"]) and mma,
            COMBINE=combine,
            TAP=tap,
            RB=rb,
            EARLY=early,
            num_warps=nw,
            num_stages=1,
            **cap,
            **launch_options(),
        )
        if combine == 0:
            _nvfp4_combine_kernel[(M, triton.cdiv(H, 1024))](
                tw, y, shared_output, out, H=H, TOPK=top_k, BLOCK=1024, num_warps=4, **launch_options()
            )
    elif M > 0:
        grid = (M, triton.cdiv(H, bh))
        _nvfp4_down_kernel[grid](
            act.view(torch.int32),
            ids,
            tw,
            weights.w2,
            weights.w2_sf_swizzled.view(torch.uint8),
            weights.w2_alpha,
            shared_output,
            out,
            dacc,
            y,
            H=H,
            IP=IP,
            INTER=INTER,
            TOPK=top_k,
            BH=bh,
            BKB=bkb,
            ASM=asm,
            DECODE=decode,
            PREFETCH=prefetch,
            TAP=tap,
            num_warps=int(cfg["num_warps"]),
            num_stages=1,
            **launch_options(),
        )
    if tap:
        taps["down_acc"] = dacc.view(M, top_k, H)
        taps["y"] = y.view(M, top_k, H)
        taps["out"] = out
    return out


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of every (H, I) of the conformance matrix and of every shape with its own
    tuned defaults (production builds with ``default_config(H, I)`` and the K-split / warps the launcher runs
    there; the tapped build too for DeepSeek-V3, H 7168 x I 2048)."""
    from flint_moe.kernels.nvfp4.gate_up import AUDIT_SHAPES, MMA_PTX, _check_mma

    names = []
    sig = {
        "act_ptr": "*i32",
        "ids_ptr": "*i32",
        "tw_ptr": "*fp32",
        "w_ptr": "*u8",
        "s_ptr": "*u8",
        "alpha_ptr": "*fp32",
        "shared_ptr": "*bf16",
        "out_ptr": "*bf16",
        "dacc_ptr": "*fp32",
        "y_ptr": "*bf16",
        "cnt_ptr": "*i32",
    }
    from flint_moe.kernels.nvfp4 import tuned as nvfp4_tuned

    # the default at every shape; the other measured path (a conformance launch configuration,
    # cases.PATH_CONFIGS) at DeepSeek-V3
    shapes = AUDIT_SHAPES + sorted(set(_TUNED_DOWN_BY_SHAPE) - set(AUDIT_SHAPES))  # + shapes with their own defaults
    runs = [(h, i, default_config(h, i), "") for h, i in shapes]
    runs.append((7168, 2048, {**default_config(7168, 2048), **nvfp4_tuned.DOWN_CUDA_CORE}, ".cuda_core"))
    for h, i, cfg, suffix in runs:
        ip = (i + 63) // 64 * 64
        sk, nw = int(cfg["SK"]), int(cfg["num_warps"])
        rb, early, maxnreg = _check_rb_early(cfg, bool(cfg["MMA"]), int(cfg["RT"]), int(cfg["S"]))
        if cfg["MMA"]:  # the K-split and warps the launcher uses at this shape
            sk, nw = _check_mma(cfg["RT"], cfg["S"], sk, nw, cfg["BH"], i // 2, "BH", "BH")
        for tap in (False, True) if (h, i) == (7168, 2048) else (False,):
            name = f"nvfp4_down.H{h}.I{i}{suffix}{'.tap' if tap else ''}"
            register_audit(
                name,
                _nvfp4_down_split_kernel,
                sig,
                {
                    "H": h,
                    "IP": ip,
                    "INTER": i,
                    "TOPK": 8,
                    "BH": cfg["BH"],
                    "BKB": cfg["BKB"],
                    "ASM": True,
                    "DECODE": 2,
                    "PREFETCH": cfg["PREFETCH"],
                    "WORDS": cfg["WORDS"],
                    "MMA": cfg["MMA"],
                    "RT": cfg["RT"],
                    "S": cfg["S"],
                    "SK": sk,
                    "NW": nw,
                    "LATE": cfg["LATE"],
                    "PF": cfg["PF"],
                    "L2PF": cfg["L2PF"] if cfg["MMA"] else 0,
                    "FENCE": bool(cfg["FENCE"]) and cfg["MMA"],
                    "COMBINE": cfg["COMBINE"],
                    "TAP": tap,
                    "RB": rb,
                    "EARLY": early,
                },
                [
                    BF16_CVT,
                    "fma.rn.f32",
                    *(MMA_PTX if cfg["MMA"] else ["mul.rn.f16x2"]),
                    "griddepcontrol.wait",
                    "atom.global.gpu.acq_rel.add",
                ],
                options={"num_warps": nw, "num_stages": 1, **({"maxnreg": maxnreg} if maxnreg else {})},
            )
            names.append(name)
    return names


audit_specs()
