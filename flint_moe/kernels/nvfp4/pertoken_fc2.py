"""Per-token NVFP4 x NVFP4 grouped FC2 (docs/numerics.md "Per-token NVFP4 experts", P11) and the combine (P12).

``_pertoken_fc2_kernel``: one program computes ``BH`` hidden rows of ``y`` for one row block of one expert's
(token, slot) pairs (``moe_permute``'s schedule): the FC2 input's exact values (bf16 [P, I], written by the
per-token quantizer beside ``pertoken_fc1``'s codes [P, Ip/2] and row-major block scales [P, Ip/16]) times the
expert's FC2 rows (``RoutedNVFP4Weights.fc2_data``, 128x4-swizzled scales, decoded in the loop) on the tensor
cores, the W4A16 grouped main loop (``grouped_mainloop.k_loop``);
epilogue ``y = RN(acc2 * alpha2_e)`` (``mul.f32``), stored fp32 [P, H].

``_pertoken_combine_kernel``: per token t (rows below ``token_capacity``), ``acc = +0``; for j = 0..k-1 in
selection order, where the slot's local expert is not -1: ``w_j = RN(p[t, j] * d2[t, j])`` (``mul.f32``),
``acc = fma(w_j, y_j, acc)`` (``fma.rn.f32``); ``out[t] = bf16(acc)`` (``cvt.rn.bf16.f32``). A slot of -1
(empty, or another rank's expert) adds nothing: its ``y`` row is never read.

Summation order of ``acc2`` (one (pair, row), length I; ``kernels.orders.pertoken_fc2_order``): K steps of
``BK`` in increasing order, each one ``tl.dot`` (BK / 16 chained ``wgmma ... k16``) from +0; a partial last
step adds exact zeros; padded columns past I are never read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels._rule import bf16_rn, fma_rn
from flint_moe.kernels.audit.registry import BF16_CVT, DEFAULT_FORBID, register_audit
from flint_moe.kernels.nvfp4.grouped_gate_up import _cfg, default_warps
from flint_moe.kernels.nvfp4.grouped_mainloop import row_block, tail_rows
from flint_moe.kernels.nvfp4.pertoken_fc1 import (
    OPTION_AUDIT_CASES as FC1_OPTION_AUDIT_CASES,
    expert_rows_acc,
    expert_rows_acc_tail,
    pertoken_launch_kwargs,
)

__all__ = ["PERTOKEN_FC2_CONFIG", "PERTOKEN_COMBINE_BLOCK", "launch_pertoken_fc2_combine", "audit_specs"]

#: Default launch configuration: ``BH`` hidden rows per program (a power of two >= 64), ``BK`` K elements per
#: main-loop step (a power of two >= 32; it changes the declared order), ``num_stages``; ``num_warps`` None =
#: ``grouped_gate_up.default_warps(BM)``; ``SCALE_WORD`` as in ``pertoken_fc1.PERTOKEN_FC1_CONFIG``.
PERTOKEN_FC2_CONFIG = {"BH": 128, "BK": 64, "num_warps": None, "num_stages": 3, "SCALE_WORD": False}

#: Hidden columns per combine program.
PERTOKEN_COMBINE_BLOCK = 1024


@triton.jit
def _pertoken_fc2_kernel(
    aq_ptr,  # bf16 [P, INTER]: the FC2 input's exact values (launch_pertoken_fc1's a_values)
    order_ptr,  # int32 [P]
    bexp_ptr,  # int32 [NB]
    bstart_ptr,  # int32 [NB]
    bend_ptr,  # int32 [NB]
    w_ptr,  # uint8 fc2_data [E, HP, IP/2]
    s_ptr,  # uint8 fc2_scale_swizzled [E, HP, IP/16]
    alpha_ptr,  # fp32 [E]
    y_ptr,  # fp32 [P, H] (out)
    acc_ptr,  # fp32 [P, H] (out, TAP only)
    H: tl.constexpr,
    HP: tl.constexpr,
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
    """y[p, h] = RN(acc2[p, h] * alpha2[e]) for rows h in [q*BH, q*BH + BH) (h < H) of the pairs of row block
    b; grid ``(cdiv(H, BH), NB)`` (module docstring). ``TAIL`` > 0: expert-wide row blocks of up to BM + TAIL
    pairs, those past the first BM in a second accumulator [BH, TAIL] (``pertoken_fc1.expert_rows_acc_tail``);
    ``SW``: the scales as int32 words. Neither changes a bit."""
    gdc_wait()
    gdc_launch_dependents()
    q = tl.program_id(0)
    b = tl.program_id(1)
    e, start, end, pos, r_ok = row_block(bexp_ptr, bstart_ptr, bend_ptr, b, BM)
    pair = tl.load(order_ptr + pos, mask=r_ok, other=0).to(tl.int64)
    h = q * BH + tl.arange(0, BH)
    h_ok = h < H
    alpha = tl.load(alpha_ptr + e)
    if TAIL > 0:
        pair_t, t_ok, has_tail = tail_rows(order_ptr, start, end, BM, TAIL)
        pair_t = pair_t.to(tl.int64)
        acc, acc_t = expert_rows_acc_tail(w_ptr, s_ptr, aq_ptr, e, h, h_ok, pair, r_ok, pair_t, t_ok, start, end,
                                          HP, INTER, IP, BH, BM, TAIL, BK, DECODE, SW)  # fmt: skip
        _fc2_epilogue(acc, pair, r_ok, alpha, h, h_ok, y_ptr, acc_ptr, H, TAP)
        if has_tail:
            _fc2_epilogue(acc_t, pair_t, t_ok, alpha, h, h_ok, y_ptr, acc_ptr, H, TAP)
    else:
        acc = expert_rows_acc(w_ptr, s_ptr, aq_ptr, e, h, h_ok, pair, r_ok, start, end, HP, INTER, IP, BH, BM, BK,
                              DECODE, SW)  # fmt: skip
        _fc2_epilogue(acc, pair, r_ok, alpha, h, h_ok, y_ptr, acc_ptr, H, TAP)


@triton.jit
def _fc2_epilogue(acc, pair, r_ok, alpha, h, h_ok, y_ptr, acc_ptr, H: tl.constexpr, TAP: tl.constexpr):
    """P11 of ``_pertoken_fc2_kernel`` for an accumulator [BH, N] of the pairs ``pair`` (int64 [N], mask
    ``r_ok``) and hidden rows ``h`` (mask ``h_ok``): ``y = RN(acc * alpha)`` stored (with TAP the accumulator)."""
    y = acc * alpha  # P11
    off = pair[None, :] * H + h[:, None]
    ok = h_ok[:, None] & r_ok[None, :]
    tl.store(y_ptr + off, y, mask=ok)
    if TAP:
        tl.store(acc_ptr + off, acc, mask=ok)


@triton.jit
def _pertoken_combine_kernel(
    loc_ptr,  # int32 [T, TOPK]: local expert of each slot, -1 = adds nothing
    p_ptr,  # fp32 or bf16 [T, TOPK]: routing weights
    d2_ptr,  # fp32 [T * TOPK]: FC2 input decode scales
    y_ptr,  # fp32 [T * TOPK, H]
    out_ptr,  # bf16 [T, H] (out; rows below the launched T only)
    w_ptr,  # fp32 [T, TOPK] (out, TAP only): w_j, +0 for a slot that adds nothing
    H: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK: tl.constexpr,
    TAP: tl.constexpr,
):
    """P12 for token ``program_id(0)``, columns [q*BLOCK, q*BLOCK + BLOCK) (module docstring)."""
    gdc_wait()
    gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    q = tl.program_id(1)
    h = q * BLOCK + tl.arange(0, BLOCK)
    h_ok = h < H
    acc = tl.full([BLOCK], 0.0, tl.float32)
    for j in tl.static_range(0, TOPK):
        p = t * TOPK + j
        used = tl.load(loc_ptr + p) >= 0
        w = tl.load(p_ptr + p).to(tl.float32) * tl.load(d2_ptr + p)
        y = tl.load(y_ptr + p * H + h, mask=h_ok & used, other=0.0)
        acc = tl.where(used, fma_rn(tl.broadcast_to(w, [BLOCK]), y, acc), acc)
        if TAP:
            if q == 0:
                tl.store(w_ptr + p, tl.where(used, w, 0.0))
    tl.store(out_ptr + t * H + h, bf16_rn(acc), mask=h_ok)


def launch_pertoken_fc2_combine(
    a_values: torch.Tensor,
    a_token_scale: torch.Tensor,
    local_ids: torch.Tensor,
    probabilities: torch.Tensor,
    perm,
    weights,
    out: torch.Tensor,
    *,
    taps: dict | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """P11-P12: fill ``out`` rows [0, T) from the FC2 input of ``pertoken_fc1.launch_pertoken_fc1``.

    Args (checked by the caller, ``flint_moe.ops.routed_nvfp4_moe``): ``a_values`` bf16 [P, I] (the FC2 input's
    exact values), ``a_token_scale`` fp32 [P] (P = T * k); ``local_ids`` int32 [T, k] (-1 = adds nothing);
    ``probabilities`` fp32 or bf16 [T, k] contiguous; ``perm`` = ``moe_permute(local_ids, E, BM, tail)`` (the one
    FC1 used; ``tail`` > 0: expert-wide row blocks, the same bits); ``weights``
    ``RoutedNVFP4Weights``; ``out`` bf16, its first T rows contiguous [T, H] (rows past T are not touched).
    taps: None or a dict receiving ``fc2_acc`` and ``y`` fp32 [T, k, H] (rows of pairs not computed hold
        unspecified values) and ``w`` fp32 [T, k].
    config: overrides of :data:`PERTOKEN_FC2_CONFIG` (and ``DECODE``); ``SCALE_WORD`` needs BK a multiple of 64.
    Returns ``out``. Raises ValueError for a bad config.
    """
    t, k = local_ids.shape
    h, hp = weights.hidden_size, weights.padded_hidden_size
    inter, ip = weights.intermediate_size, weights.padded_intermediate_size
    cfg = _cfg(config, PERTOKEN_FC2_CONFIG, "pertoken_fc2")
    bh = int(cfg["BH"])
    if bh < 64 or bh & (bh - 1):
        raise ValueError(f"pertoken_fc2: config BH = {bh} must be a power of two >= 64")
    dev = a_values.device
    p = t * k
    y = torch.empty((p, h), dtype=torch.float32, device=dev)
    tap = taps is not None
    acc2 = torch.zeros((p, h), dtype=torch.float32, device=dev) if tap else y
    wbuf = torch.zeros((t, k), dtype=torch.float32, device=dev) if tap else y
    if p > 0:
        _pertoken_fc2_kernel[(triton.cdiv(h, bh), perm.num_blocks)](
            a_values, perm.order, perm.block_expert, perm.block_start, perm.block_end, weights.fc2_data,
            weights.fc2_scale_swizzled.view(torch.uint8), weights.fc2_alpha, y, acc2,
            H=h, HP=hp, IP=ip, INTER=inter, BH=bh, **pertoken_launch_kwargs(cfg, perm.block_m, tap, perm.tail),
        )  # fmt: skip
        _pertoken_combine_kernel[(t, triton.cdiv(h, PERTOKEN_COMBINE_BLOCK))](
            local_ids, probabilities, a_token_scale, y, out, wbuf,
            H=h, TOPK=k, BLOCK=PERTOKEN_COMBINE_BLOCK, TAP=tap, num_warps=4, **launch_options(),
        )  # fmt: skip
    if tap:
        taps.update(fc2_acc=acc2.view(t, k, h), y=y.view(t, k, h), w=wbuf)
    return out


#: (name, H, I, BM, TAP) builds of the FC2 kernel audited for sm_90.
AUDIT_CASES = (
    ("H7168.I2048.BM16", 7168, 2048, 16, False),
    ("H7168.I2048.BM64", 7168, 2048, 64, False),
    ("H7168.I2048.BM128", 7168, 2048, 128, False),
    ("H7168.I2048.BM128.tap", 7168, 2048, 128, True),
    ("H2880.I2880.BM64", 2880, 2880, 64, False),
)

#: (name, H, I, BM, TAIL, SCALE_WORD, TAP) builds of the FC2 kernel with the launch options audited for sm_90:
#: those of ``pertoken_fc1.OPTION_AUDIT_CASES``' SwiGLU builds (FC2 has no activation), in the same order.
OPTION_AUDIT_CASES = tuple(
    (name.removeprefix("swiglu."), h, i, bm, tail, sw, tap)
    for name, h, i, _k, bm, tail, sw, gated, tap in FC1_OPTION_AUDIT_CASES
    if gated
)


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of the FC2 kernel (``AUDIT_CASES`` and ``OPTION_AUDIT_CASES``: wgmma, the PDL
    wait, the bf16 decode multiply; no fused multiply-add: P11 is one ``mul.f32``) and of the combine kernel
    (``fma.rn.f32``, ``cvt.rn.bf16.f32``; both routing-weight dtypes)."""
    sig = {"aq_ptr": "*bf16", "order_ptr": "*i32", "bexp_ptr": "*i32", "bstart_ptr": "*i32",
           "bend_ptr": "*i32", "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32", "y_ptr": "*fp32",
           "acc_ptr": "*fp32"}  # fmt: skip
    cfg = PERTOKEN_FC2_CONFIG
    forbid = (*DEFAULT_FORBID, "fma.rn.f32", "div.approx")
    names = []
    cases = [(n, h, i, bm, 0, False, tap) for n, h, i, bm, tap in AUDIT_CASES] + list(OPTION_AUDIT_CASES)
    for name, h, i, bm, tail, sw, tap in cases:
        consts = {"H": h, "HP": (h + 255) // 256 * 256, "IP": (i + 255) // 256 * 256, "INTER": i, "BM": bm,
                  "TAIL": tail, "BH": cfg["BH"], "BK": cfg["BK"], "DECODE": 3, "TAP": tap, "SW": sw}  # fmt: skip
        options = {"num_warps": default_warps(bm), "num_stages": cfg["num_stages"]}
        names.append(register_audit(f"pertoken_fc2.{name}", _pertoken_fc2_kernel, sig, consts,
                                    ["wgmma.mma_async", "griddepcontrol.wait", "mul.rn.bf16x2"], forbid,
                                    options=options).name)  # fmt: skip
    for h, k, pdt in ((7168, 8, "*fp32"), (7168, 8, "*bf16"), (2880, 4, "*fp32")):
        name = f"pertoken_combine.H{h}.k{k}.{pdt[1:]}"
        register_audit(
            name,
            _pertoken_combine_kernel,
            {"loc_ptr": "*i32", "p_ptr": pdt, "d2_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*bf16",
             "w_ptr": "*fp32"},
            {"H": h, "TOPK": k, "BLOCK": PERTOKEN_COMBINE_BLOCK, "TAP": False},
            [BF16_CVT, "fma.rn.f32", "mul.f32", "griddepcontrol.wait"],
            options={"num_warps": 4},
        )  # fmt: skip
        names.append(name)
    return names


audit_specs()
