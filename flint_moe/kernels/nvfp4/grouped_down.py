"""NVFP4 grouped down GEMM (rule steps 5, 8) + combine and shared add (steps 9-10) for larger batches.

``_grouped_down_kernel``: one program computes ``BH`` hidden rows of ``y`` for one row block of one expert's
(token, slot) pairs (``moe_permute``'s schedule): ``FlintMoEWeights.w2`` codes and E4M3 block scales
dequantised to bf16 in the main loop (exact), ``tl.dot`` with the pairs' bf16 activation rows (fp32
accumulation on the tensor cores), epilogue ``y = bf16(RN(y_acc * w2_alpha[e]))`` (rule step 8).
``_grouped_combine_kernel``: per token, ``acc = fma(tw_j, y_j, acc)`` for j = 0..k-1 in selection order from
+0, then ``out = bf16(RN(fp32(bf16(acc)) + fp32(shared)))``: the decode path's combine (``nvfp4_down``'s
``_combine_rows``), the same order and instructions, so the combine never breaks batch invariance across the
decode / grouped threshold of ``ops.flint_moe`` (``ops.decode_max_tokens``; the accumulators may: their
summation orders differ).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import check_op_tensor, gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels._rule import bf16_rn, combine_fma, global_scale, shared_add
from flint_moe.kernels.audit.registry import BF16_CVT, register_audit
from flint_moe.kernels.nvfp4.grouped_gate_up import (
    _cfg,
    _check_perm,
    default_bk,
    default_engine,
    default_warps,
    grouped_launch_kwargs,
)
from flint_moe.kernels.nvfp4.grouped_mainloop import k_loop, k_loop_tail, row_block, tail_rows

__all__ = [
    "accumulation_model",
    "GROUPED_DOWN_CONFIG",
    "COMBINE_BLOCK",
    "default_bh",
    "nvfp4_grouped_down",
    "launch_grouped_down",
    "audit_specs",
]

#: Default launch configuration: ``BH`` hidden rows per program (a power of two >= 64; None = ``default_bh(BM)``),
#: ``BK`` K elements per main-loop step (a power of two >= 32; None = ``grouped_gate_up.default_bk(BM, I)``),
#: ``num_stages``; ``num_warps`` None = ``default_warps(BM)`` (``BM`` comes from the permutation); ``SCALE_WORD``
#: as in ``grouped_gate_up.GROUPED_GATE_UP_CONFIG``.
GROUPED_DOWN_CONFIG = {"BH": None, "BK": None, "num_warps": None, "num_stages": 3, "SCALE_WORD": False,
                       "ENGINE": None, "PERSISTENT": True}  # fmt: skip


def default_bh(block_m: int) -> int:
    """128 hidden rows per program (two 64-row wgmma per K step; ptxas -v: <= 133 registers for BM <= 128,
    no spill). ``block_m`` is accepted for tuning by row-block size."""
    del block_m
    return 128


#: Hidden rows per combine program.
COMBINE_BLOCK = 1024


@triton.jit
def _grouped_down_kernel(
    act_ptr,  # bf16 [P, INTER], row = pair id
    order_ptr,  # int32 [P]
    bexp_ptr,  # int32 [NB]
    bstart_ptr,  # int32 [NB]
    bend_ptr,  # int32 [NB]
    w_ptr,  # uint8 w2 [E, H, IP / 2]
    s_ptr,  # uint8 w2 scales, 128x4 swizzle [E, roundup(H, 128), KP]
    alpha_ptr,  # fp32 [E]
    y_ptr,  # bf16 [P, H] (out), row = pair id
    dacc_ptr,  # fp32 [P, H] (out, TAP only)
    H: tl.constexpr,
    IP: tl.constexpr,
    INTER: tl.constexpr,
    BM: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    DECODE: tl.constexpr,
    TAP: tl.constexpr,
    SW: tl.constexpr,
):
    """y[p, h] = bf16(RN(y_acc[p, h] * gs2[e])) (rule step 8) for the pairs of row block b, rows h.

    Grid ``(cdiv(H, BH), NB)``: program (q, b) handles rows h in [q*BH, q*BH + BH) (masked at H) of the pairs
    ``order[block_start[b]:block_end[b]]`` of expert ``block_expert[b]``.

    Summation order of y_acc (one (pair, row), length I over the activation; padded columns i >= I are never
    read): K steps of ``BK`` elements in increasing order, each one ``tl.dot`` (dequantised bf16 weights,
    exact; bf16 activations; exact products) accumulated into fp32 from +0 by the tensor cores (sm_90 wgmma:
    the hardware's internal order, truncating alignment); a partial last step adds exact zeros. Bound:
    ``flint_moe.reference.exact.FP32_TRUNCATE`` (plain any-order model, u = 2^-23, d = I). Interpreter:
    numpy fp32 matmul per step.
    """
    gdc_wait()
    gdc_launch_dependents()
    IPB: tl.constexpr = IP // 2
    KP: tl.constexpr = (IP // 16 + 3) // 4 * 4
    MP: tl.constexpr = (H + 127) // 128 * 128
    q = tl.program_id(0)
    b = tl.program_id(1)
    e, start, end, pos, r_ok = row_block(bexp_ptr, bstart_ptr, bend_ptr, b, BM)
    pair = tl.load(order_ptr + pos, mask=r_ok, other=0).to(tl.int64)
    h = q * BH + tl.arange(0, BH)
    h_ok = h < H
    hc = tl.where(h_ok, h, 0)
    # codes as int32 words (Ip / 2 is a multiple of 32 bytes: every row starts 16-byte aligned)
    w_row = w_ptr.to(tl.pointer_type(tl.int32)) + tl.multiple_of(e * (H * IPB // 4) + hc.to(tl.int64) * (IPB // 4), 4)
    s_base = s_ptr + e * (MP * KP)
    a_row = act_ptr + tl.multiple_of(pair * INTER, 16)
    acc = tl.zeros([BH, BM], dtype=tl.float32)
    if end > start:
        acc = k_loop(acc, w_row, s_base, a_row, hc, h_ok, r_ok, INTER, KP, BH, BK, DECODE, SW)
    gs = tl.load(alpha_ptr + e)
    y = bf16_rn(global_scale(acc, gs))
    off = pair[None, :] * H + h[:, None]
    ok = h_ok[:, None] & r_ok[None, :]
    tl.store(y_ptr + off, y, mask=ok)
    if TAP:
        tl.store(dacc_ptr + off, acc, mask=ok)


@triton.jit
def _down_epilogue(acc, pair, r_ok, gs, h, h_ok, y_ptr, dacc_ptr, H: tl.constexpr, TAP: tl.constexpr):
    """The down epilogue of ``_grouped_down_kernel`` for an accumulator [BH, N] of the pairs ``pair`` (int64 [N],
    mask ``r_ok``) and hidden rows ``h`` (mask ``h_ok``): ``y = bf16(RN(acc * gs))`` (rule step 8), stored with
    the accumulator under TAP."""
    y = bf16_rn(global_scale(acc, gs))
    off = pair[None, :] * H + h[:, None]
    ok = h_ok[:, None] & r_ok[None, :]
    tl.store(y_ptr + off, y, mask=ok)
    if TAP:
        tl.store(dacc_ptr + off, acc, mask=ok)


@triton.jit
def _grouped_down_rows_kernel(
    act_ptr,  # bf16 [P, INTER], row = pair id
    order_ptr,  # int32 [P]
    bexp_ptr,  # int32 [NB]
    bstart_ptr,  # int32 [NB]
    bend_ptr,  # int32 [NB]: at most BM + TAIL pairs after bstart
    w_ptr,  # uint8 w2 [E, H, IP / 2]
    s_ptr,  # uint8 w2 scales, 128x4 swizzle [E, roundup(H, 128), KP]
    alpha_ptr,  # fp32 [E]
    y_ptr,  # bf16 [P, H] (out), row = pair id
    dacc_ptr,  # fp32 [P, H] (out, TAP only)
    H: tl.constexpr,
    IP: tl.constexpr,
    INTER: tl.constexpr,
    BM: tl.constexpr,
    TAIL: tl.constexpr,
    BH: tl.constexpr,
    BK: tl.constexpr,
    DECODE: tl.constexpr,
    TAP: tl.constexpr,
    SW: tl.constexpr,
):
    """``_grouped_down_kernel`` on expert-wide row blocks (``moe_permute(ids, E, BM, tail=TAIL)``: up to
    ``BM + TAIL`` pairs per block): the first BM pairs in an fp32 accumulator [BH, BM], the next (at most TAIL)
    in one [BH, TAIL] whose MMAs run only when the block has more than BM pairs; each K step's dequantised
    weight tile feeds both. Per (pair, row) the same computation as ``_grouped_down_kernel``: K steps of ``BK``
    in increasing order (``tl.dot``, exact products, fp32 from +0 on the tensor cores; the MMA's N is the
    row-block size, which the declared order does not depend on), then rule step 8. Bound ``FP32_TRUNCATE``
    (u = 2^-23, d = I)."""
    gdc_wait()
    gdc_launch_dependents()
    IPB: tl.constexpr = IP // 2
    KP: tl.constexpr = (IP // 16 + 3) // 4 * 4
    MP: tl.constexpr = (H + 127) // 128 * 128
    q = tl.program_id(0)
    b = tl.program_id(1)
    e, start, end, pos, r_ok = row_block(bexp_ptr, bstart_ptr, bend_ptr, b, BM)
    pair = tl.load(order_ptr + pos, mask=r_ok, other=0).to(tl.int64)
    pair_t, t_ok, has_tail = tail_rows(order_ptr, start, end, BM, TAIL)
    pair_t = pair_t.to(tl.int64)
    h = q * BH + tl.arange(0, BH)
    h_ok = h < H
    hc = tl.where(h_ok, h, 0)
    w_row = w_ptr.to(tl.pointer_type(tl.int32)) + tl.multiple_of(e * (H * IPB // 4) + hc.to(tl.int64) * (IPB // 4), 4)
    s_base = s_ptr + e * (MP * KP)
    a_row = act_ptr + tl.multiple_of(pair * INTER, 16)
    a_row_t = act_ptr + tl.multiple_of(pair_t * INTER, 16)
    acc = tl.zeros([BH, BM], dtype=tl.float32)
    acc_t = tl.zeros([BH, TAIL], dtype=tl.float32)
    if has_tail:
        acc, acc_t = k_loop_tail(acc, acc_t, w_row, s_base, a_row, a_row_t, hc, h_ok, r_ok, t_ok, INTER, KP, BH, BK,
                                 DECODE, SW)  # fmt: skip
    elif end > start:
        acc = k_loop(acc, w_row, s_base, a_row, hc, h_ok, r_ok, INTER, KP, BH, BK, DECODE, SW)
    gs = tl.load(alpha_ptr + e)
    _down_epilogue(acc, pair, r_ok, gs, h, h_ok, y_ptr, dacc_ptr, H, TAP)
    if has_tail:
        _down_epilogue(acc_t, pair_t, t_ok, gs, h, h_ok, y_ptr, dacc_ptr, H, TAP)


@triton.jit
def _grouped_combine_kernel(
    tw_ptr,  # fp32 [M * TOPK]: routing weights (bf16 values)
    y_ptr,  # bf16 [M * TOPK, H]
    shared_ptr,  # bf16 [M, H]
    out_ptr,  # bf16 [M, H] (out)
    H: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Rule steps 9-10 for token ``program_id(0)``, rows [q*BLOCK, q*BLOCK + BLOCK): ``acc = fma(tw_j, y_j,
    acc)`` for j = 0..TOPK-1 from +0 (``fma.rn.f32``, selection order), ``out = bf16(RN(fp32(bf16(acc)) +
    fp32(shared)))`` (``cvt.rn.bf16.f32``, ``add.f32``, ``cvt.rn.bf16.f32``)."""
    gdc_wait()
    gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    h_ok = h < H
    out = tl.full([BLOCK], 0.0, tl.float32)
    for j in tl.static_range(0, TOPK):
        p = t * TOPK + j
        y = tl.load(y_ptr + p * H + h, mask=h_ok, other=0.0)
        tw = tl.load(tw_ptr + p)
        out = combine_fma(out, tl.full([BLOCK], 0.0, tl.float32) + tw, y)
    routed = bf16_rn(out)
    sh = tl.load(shared_ptr + t * H + h, mask=h_ok, other=0.0)
    res = shared_add(routed, sh)
    tl.store(out_ptr + t * H + h, res, mask=h_ok)


def nvfp4_grouped_down(
    act: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, perm, weights, shared_output: torch.Tensor,
    *, taps: dict | None = None, config: dict | None = None, out: torch.Tensor | None = None, check: bool = True,
) -> torch.Tensor:
    """Rule steps 8-10: out bf16 [M, H] from act bf16 [M * k, I] (``nvfp4_grouped_gate_up``), grouped by expert.

    Args:
        act: bf16 [M * k, I] contiguous (row = pair t * k + j; I = ``weights.valid_intermediate``).
        ids: int32 [M, k]; tw: fp32 [M, k] holding bf16 values (rule step 4); both contiguous.
        perm: ``moe_permute(ids, E, block_m, tail)`` (the same one the gate/up GEMM used; ``tail`` > 0 launches
            the expert-wide row-block build ``_grouped_down_rows_kernel``, the same bits as tail = 0).
        weights: ``FlintMoEWeights`` (w2 uint8 [E, H, Ip/2], swizzled E4M3 scales, w2_alpha fp32 [E]).
        shared_output: bf16 [M, H] contiguous (rule step 10).
        taps: if a dict, the tapped build stores ``down_acc`` fp32 [M, k, H] (before the global scale),
            ``y`` bf16 [M, k, H] and ``out`` bf16 [M, H].
        config: overrides of ``GROUPED_DOWN_CONFIG`` (``BH``, ``BK`` (None: ``default_bk(BM, I)``), ``num_warps``,
            ``num_stages``, ``SCALE_WORD``, ``DECODE``, ``ENGINE``: see ``GROUPED_GATE_UP_CONFIG``).
        out: None, or a bf16 [M, H] contiguous tensor the combine writes and that is returned (no overlap with
            any input: the op checks that, ``ops._checks.check_out``).
        check: False skips the tensor checks, for a caller that made them (``launch_grouped_down``); the config
            is checked either way.
    Returns: a new bf16 [M, H] tensor, or ``out`` (inputs never modified).
    Raises: TypeError / ValueError naming the bad argument.
    """
    if check:
        from flint_moe.kernels.nvfp4.down_combine import check_down_inputs

        E, M, top_k = check_down_inputs(act, ids, tw, shared_output, weights)
        _check_perm(perm, M, top_k, E, weights.w2.device)
    from flint_moe.kernels.nvfp4.gate_up import decode_sizes

    E, H, IP, INTER = decode_sizes(weights)
    dev = weights.w2.device
    M, top_k = ids.shape
    P = M * top_k
    cfg = _cfg(config, GROUPED_DOWN_CONFIG, "nvfp4_grouped_down")
    bh = int(cfg["BH"] or default_bh(perm.block_m))
    if bh < 64 or bh & (bh - 1):
        raise ValueError(f"nvfp4_grouped_down: config BH = {bh} must be a power of two >= 64")
    if out is None:
        out = torch.empty((M, H), dtype=torch.bfloat16, device=dev)
    check_op_tensor("out", out, dtype=torch.bfloat16, shape=(M, H), device=dev)
    y = torch.empty((P, H), dtype=torch.bfloat16, device=dev)
    tap = taps is not None
    dacc = torch.empty((P, H), dtype=torch.float32, device=dev) if tap else y
    if P > 0:
        engine = cfg["ENGINE"] or default_engine(perm, INTER)
        if engine in ("gluon", "gluon_ws"):
            _launch_gluon(engine, act, perm, weights, y, dacc, H, IP, INTER, tap,
                          (config or {}).get("num_stages"), bool(cfg["PERSISTENT"]))  # fmt: skip
        else:
            kw = grouped_launch_kwargs(cfg, perm.block_m, tap, INTER)
            kernel = _grouped_down_kernel
            if perm.tail:  # expert-wide row blocks: BM + tail pairs per program
                kernel, kw = _grouped_down_rows_kernel, {**kw, "TAIL": perm.tail}
            kernel[(triton.cdiv(H, bh), perm.num_blocks)](
                act, perm.order, perm.block_expert, perm.block_start, perm.block_end, weights.w2,
                weights.w2_sf_swizzled.view(torch.uint8), weights.w2_alpha, y, dacc, H=H, IP=IP, INTER=INTER, BH=bh,
                **kw,
            )  # fmt: skip
        _grouped_combine_kernel[(M, triton.cdiv(H, COMBINE_BLOCK))](
            tw, y, shared_output, out, H=H, TOPK=top_k, BLOCK=COMBINE_BLOCK, num_warps=4, **launch_options()
        )
    if tap:
        taps.update(down_acc=dacc.view(M, top_k, H), y=y.view(M, top_k, H), out=out)
    return out


def _launch_gluon(engine, act, perm, weights, y, dacc, H, IP, INTER, tap, stages, persistent) -> None:  # noqa: N803
    """The down GEMM by a Gluon kernel (config ENGINE 'gluon': ``grouped_gluon``; 'gluon_ws': ``grouped_gluon_ws``)."""
    from flint_moe.kernels.nvfp4 import grouped_gluon, grouped_gluon_ws

    if engine == "gluon":
        check, launch = grouped_gluon.check_gluon_launch, grouped_gluon.launch_gluon_down
    else:
        check, launch = grouped_gluon_ws.check_ws_launch, grouped_gluon_ws.launch_ws_down
    check("nvfp4_grouped_down", perm, INTER)
    extra = {"persistent": persistent} if engine == "gluon_ws" else {}
    launch(act, perm, weights.w2, weights.w2_sf_swizzled.view(torch.uint8), weights.w2_alpha, y, dacc,
           H=H, IP=IP, INTER=INTER, TAP=tap, stages=stages, **extra)  # fmt: skip


def launch_grouped_down(*args, **kwargs) -> torch.Tensor:
    """``nvfp4_grouped_down(..., check=False)``. On arguments already checked by the caller (the op
    ``flint_moe.ops.flint_moe_grouped``: its inputs at its boundary, ``ids`` / ``tw`` from ``route``, ``perm`` from
    ``moe_permute``, ``act`` from ``launch_grouped_gate_up``): no tensor checks here; the config is checked
    (ValueError)."""
    return nvfp4_grouped_down(*args, check=False, **kwargs)


def accumulation_model(config: dict | None = None):
    """Summation model of y_acc for every launch configuration: ``FP32_TRUNCATE`` (tensor-core
    accumulation, any order; kernel docstring). ``config`` is accepted for symmetry with the decode kernels."""
    del config
    from flint_moe.reference.exact import FP32_TRUNCATE

    return FP32_TRUNCATE


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of the grouped down kernel (the real shapes' specialisations, the tapped
    DeepSeek-V3 build), of its expert-wide row-block build (``grouped_gate_up.ROWS_AUDIT_CASES``), of its
    ``SCALE_WORD`` builds (``grouped_gate_up.SCALE_WORD_AUDIT_CASES``) and of the combine kernel (k = 8 and 4)."""
    from flint_moe.kernels.nvfp4.grouped_gate_up import (
        grouped_audit_runs,
        grouped_rows_audit_runs,
        grouped_sw_audit_runs,
    )

    sig = {"act_ptr": "*bf16", "order_ptr": "*i32", "bexp_ptr": "*i32", "bstart_ptr": "*i32", "bend_ptr": "*i32",
        "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32", "y_ptr": "*bf16", "dacc_ptr": "*fp32"}
    require = [BF16_CVT, "mul.rn.bf16x2", "wgmma.mma_async", "griddepcontrol.wait"]
    cfg = GROUPED_DOWN_CONFIG
    names = []
    for h, i, ip, _k, bm, suffix, tap in grouped_audit_runs():
        consts = {"H": h, "IP": ip, "INTER": i, "BM": bm, "BH": default_bh(bm), "BK": cfg["BK"] or default_bk(bm, i),
                  "DECODE": 3, "TAP": tap, "SW": False}  # fmt: skip
        options = {"num_warps": default_warps(bm), "num_stages": cfg["num_stages"]}
        names.append(register_audit("nvfp4_grouped_down" + suffix, _grouped_down_kernel, sig, consts, require,
                                    options=options).name)  # fmt: skip
    for h, i, ip, _k, bm, tail, suffix, tap in grouped_rows_audit_runs():
        consts = {"H": h, "IP": ip, "INTER": i, "BM": bm, "TAIL": tail, "BH": default_bh(bm),
                  "BK": cfg["BK"] or default_bk(bm, i), "DECODE": 3, "TAP": tap, "SW": False}  # fmt: skip
        options = {"num_warps": default_warps(bm), "num_stages": cfg["num_stages"]}
        names.append(register_audit("nvfp4_grouped_down_rows" + suffix, _grouped_down_rows_kernel, sig, consts,
                                    require, options=options).name)  # fmt: skip
    for h, i, ip, _k, bm, tail, suffix in grouped_sw_audit_runs():
        consts = {"H": h, "IP": ip, "INTER": i, "BM": bm, "BH": default_bh(bm), "BK": cfg["BK"] or default_bk(bm, i),
                  "DECODE": 3, "TAP": False, "SW": True}  # fmt: skip
        kernel, base = _grouped_down_kernel, "nvfp4_grouped_down"
        if tail:
            kernel, base, consts = _grouped_down_rows_kernel, base + "_rows", {**consts, "TAIL": tail}
        options = {"num_warps": default_warps(bm), "num_stages": cfg["num_stages"]}
        names.append(register_audit(base + suffix, kernel, sig, consts, require, options=options).name)
    for h, k in ((7168, 8), (2880, 4)):
        name = f"nvfp4_grouped_combine.H{h}.k{k}"
        register_audit(
            name,
            _grouped_combine_kernel,
            {"tw_ptr": "*fp32", "y_ptr": "*bf16", "shared_ptr": "*bf16", "out_ptr": "*bf16"},
            {"H": h, "TOPK": k, "BLOCK": COMBINE_BLOCK},
            [BF16_CVT, "fma.rn.f32", "griddepcontrol.wait"],
            options={"num_warps": 4},
        )
        names.append(name)
    return names


audit_specs()
