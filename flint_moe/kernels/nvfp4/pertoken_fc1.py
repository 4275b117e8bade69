"""Per-token NVFP4 x NVFP4 grouped FC1 + activation (docs/numerics.md "Per-token NVFP4 experts", P7-P9), then
the FC2 input re-quantized per (token, slot) row (P10) by the per-token quantizer kernel.

Both GEMM operands are NVFP4, and both decode exactly to bf16 (``E2M1 * E4M3``: at most 6 significant bits,
magnitudes in [2^-10, 2688]). The per-token quantizer writes the tokens' exact values once, bf16 [T, H]
(``pertoken_quant.launch_pertoken_quant`` with ``values``; the row scale ``d`` is not applied).
``_pertoken_fc1_kernel`` then runs the W4A16 grouped main loop
(``grouped_mainloop.k_loop``: the expert's FC1 codes and 128x4-swizzled scales decoded to bf16 in the loop,
``tl.dot`` with the bf16 token rows, wgmma with fp32 accumulation on sm_90): one program computes ``BC``
intermediate columns (gated: their up and gate rows) for one row block of one expert's (token, slot) pairs
(``moe_permute``'s schedule; pairs whose local expert is -1 are in no block). Epilogue: P8 ``h = RN(RN(acc *
alpha1_e) * d_t)`` (two ``mul.f32``), P9 squared ReLU ``RN(r * r)`` (``r = h`` where ``h > 0`` or NaN, else +0)
or SwiGLU (``_rule.swiglu_f32``), stored as fp32 (no bf16 rounding) in ``act`` [P, I], row = pair ``t * k + j``.
Taking the activations' values from the quantizer instead of decoding them in every column program leaves the
main loop exactly the W4A16 one (same operand values, same products, same order), at the cost of one bf16 write
and read of the operand.

P10 needs the amax of a whole row of I activations, which no FC1 program sees, so it is a second launch: the
per-token quantizer (``pertoken_quant.launch_pertoken_quant``, the same kernel as the routed input's, on fp32
rows) turns ``act`` into the FC2 input codes [P, Ip/2], row-major block-scale bytes [P, Ip/16], decode
scales ``d2`` [P] and the FC2 operand's exact values bf16 [P, I]. Rows of pairs that were not computed (empty
or non-local slots) hold unspecified values and are never read downstream.

Summation order of ``acc1`` (one (pair, column), length H; declared by ``kernels.orders.pertoken_orders``):
K steps of ``BK`` in increasing order, each one ``tl.dot`` (BK / 16 chained ``wgmma ... k16``) into the fp32
accumulator from +0; a partial last step adds exact zeros. No scale is applied inside the sum: the products are
of the decoded values, the fp32 scales multiply the accumulator (P8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels._rule import swiglu_f32
from flint_moe.kernels.audit.registry import DEFAULT_FORBID, register_audit
from flint_moe.kernels.nvfp4.grouped_gate_up import _cfg, default_warps
from flint_moe.kernels.nvfp4.grouped_mainloop import k_loop, k_loop_tail, row_block, tail_rows
from flint_moe.kernels.nvfp4.pertoken_quant import quantize_rows

__all__ = [
    "PERTOKEN_FC1_CONFIG",
    "launch_pertoken_fc1",
    "audit_specs",
]

#: Default launch configuration: ``BC`` intermediate columns per program (gated 32 or 64: a tile's up and gate
#: rows lie in one 128-row group of the interleave; non-gated 64 or 128: tiles of at least 64 weight rows, the
#: wgmma of the declared order, as in ``grouped_gate_up``; None = :func:`default_bc`),
#: ``BK`` K elements per main-loop step (a power of two >= 32; it changes the declared order), ``num_stages``;
#: ``num_warps`` None = ``grouped_gate_up.default_warps(BM)``;
#: ``SCALE_WORD`` (bool): the weight scales as one int32 word per row per 64 K (``grouped_mainloop.scale_words``;
#: BK a multiple of 64), the same scale values, hence the same bits (``routed_nvfp4_moe`` turns it on where
#: ``grouped_gate_up.grouped_config`` says so unless its config sets it).
PERTOKEN_FC1_CONFIG = {"BC": None, "BK": 64, "num_warps": None, "num_stages": 3, "SCALE_WORD": False}


def pertoken_launch_kwargs(cfg: dict, block_m: int, tap: bool, tail: int = 0) -> dict:
    """Launch keywords of both per-token GEMMs from a config checked by ``grouped_gate_up._cfg``: ``BM`` (the
    permutation's ``block_m``), ``TAIL`` (its ``tail``: 0 = one BM-pair accumulator per program), ``BK``,
    ``DECODE``, ``TAP``, ``SW`` (config ``SCALE_WORD``; ValueError unless BK is a multiple of 64), ``num_warps``
    (``default_warps(block_m)`` unless set), ``num_stages`` and ``launch_options()``."""
    bk = int(cfg["BK"])
    sw = bool(cfg.get("SCALE_WORD", False))
    if sw and bk % 64:
        raise ValueError(f"config SCALE_WORD needs BK a multiple of 64, got BK = {bk}")
    return {"BM": block_m, "TAIL": int(tail), "BK": bk, "DECODE": cfg["DECODE"], "TAP": tap, "SW": sw,
            "num_warps": int(cfg["num_warps"] or default_warps(block_m)), "num_stages": int(cfg["num_stages"]),
            **launch_options()}  # fmt: skip


def default_bc(gated: bool, block_m: int = 128) -> int:
    """Columns per program when the config leaves ``BC`` None: 128 weight rows per tile (gated: 64 up + 64
    gate), except gated row blocks of at most 32 pairs: 32 columns (64 weight rows), twice the programs over
    the expert's rows. Measured on the H200 (reports/gpu/nvfp4-pertoken/quantizer): DeepSeek-V3 M = 1024 (BM
    32) 5.33 -> 5.05 ms; at BM 128 (gpt-oss-120b M = 4096) BC 32 is 1.09x slower. Same bits (a column's sum does
    not depend on the tile)."""
    if gated:
        return 32 if block_m <= 32 else 64
    return 128


@triton.jit
def relu2_f32(h):
    """P9 squared ReLU: ``RN(r * r)``, ``r = h`` where ``h > 0`` or ``h`` is NaN, else +0 (``mul.f32``)."""
    r = tl.where((h > 0.0) | (h != h), h, 0.0)
    return r * r


@triton.jit
def _expert_rows(w_ptr, s_ptr, e, wrow, w_ok, N: tl.constexpr, KPAD: tl.constexpr):
    """Expert ``e``'s weight rows ``wrow`` (masked rows read row 0): int32 code-word pointers [ROWS], the
    expert's swizzled scale base and the clamped rows (:func:`expert_rows_acc`)."""
    wrow = tl.where(w_ok, wrow, 0)
    KW: tl.constexpr = KPAD // 8  # int32 code words per weight row
    KP: tl.constexpr = KPAD // 16
    w_row = w_ptr.to(tl.pointer_type(tl.int32)) + tl.multiple_of(e * (N * KW) + wrow.to(tl.int64) * KW, 4)
    return w_row, s_ptr + e * (N * KP), wrow


@triton.jit
def expert_rows_acc(w_ptr, s_ptr, a_ptr, e, wrow, w_ok, a_idx, r_ok, start, end, N: tl.constexpr, K: tl.constexpr,
                    KPAD: tl.constexpr, ROWS: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                    DECODE: tl.constexpr, SW: tl.constexpr = False):  # fmt: skip
    """The main loop of both per-token GEMMs: fp32 [ROWS, BM] from +0, ``grouped_mainloop.k_loop`` over expert
    ``e``'s physical weight rows ``wrow`` [ROWS] (``w_ok`` masks them; a masked row reads row 0) of an NVFP4
    matrix with N rows of KPAD codes each (int32 code words, 128x4-swizzled scales: ``RoutedNVFP4Weights``) and
    the bf16 activation rows ``a_idx`` [BM] of ``a_ptr`` (length K; ``r_ok`` masks the pairs); no step runs for
    an empty row block (``end <= start``). ``SW``: scales as int32 words (``grouped_mainloop.scale_words``)."""
    w_row, s_base, srow = _expert_rows(w_ptr, s_ptr, e, wrow, w_ok, N, KPAD)
    a_row = a_ptr + tl.multiple_of(a_idx * K, 16)
    acc = tl.zeros([ROWS, BM], dtype=tl.float32)
    if end > start:
        acc = k_loop(acc, w_row, s_base, a_row, srow, w_ok, r_ok, K, KPAD // 16, ROWS, BK, DECODE, SW)
    return acc


@triton.jit
def expert_rows_acc_tail(w_ptr, s_ptr, a_ptr, e, wrow, w_ok, a_idx, r_ok, a_idx_t, t_ok, start, end,
                         N: tl.constexpr, K: tl.constexpr, KPAD: tl.constexpr, ROWS: tl.constexpr, BM: tl.constexpr,
                         TAIL: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr, SW: tl.constexpr):  # fmt: skip
    """:func:`expert_rows_acc` on an expert-wide row block (``moe_permute(..., tail=TAIL)``): fp32 [ROWS, BM]
    over the pairs ``a_idx`` / ``r_ok`` and fp32 [ROWS, TAIL] over the tail pairs ``a_idx_t`` / ``t_ok``, both
    from +0; ``grouped_mainloop.k_loop_tail`` (one dequantised weight tile per K step feeding both MMAs) where the
    block has more than BM pairs, else ``k_loop`` for the first accumulator alone. Per output element the same
    K steps in the same order as :func:`expert_rows_acc` (the MMA's N, BM or TAIL, is not part of the order)."""
    w_row, s_base, srow = _expert_rows(w_ptr, s_ptr, e, wrow, w_ok, N, KPAD)
    a_row = a_ptr + tl.multiple_of(a_idx * K, 16)
    a_row_t = a_ptr + tl.multiple_of(a_idx_t * K, 16)
    acc = tl.zeros([ROWS, BM], dtype=tl.float32)
    acc_t = tl.zeros([ROWS, TAIL], dtype=tl.float32)
    if end - start > BM:
        acc, acc_t = k_loop_tail(acc, acc_t, w_row, s_base, a_row, a_row_t, srow, w_ok, r_ok, t_ok, K, KPAD // 16,
                                 ROWS, BK, DECODE, SW)  # fmt: skip
    elif end > start:
        acc = k_loop(acc, w_row, s_base, a_row, srow, w_ok, r_ok, K, KPAD // 16, ROWS, BK, DECODE, SW)
    return acc, acc_t


@triton.jit
def _fc1_epilogue(acc, pair, r_ok, alpha, xd_ptr, q, act_ptr, acc_ptr, h_ptr, INTER: tl.constexpr, TOPK: tl.constexpr,
                  GATED: tl.constexpr, BC: tl.constexpr, N: tl.constexpr, TAP: tl.constexpr):  # fmt: skip
    """P8-P9 of ``_pertoken_fc1_kernel`` for an accumulator [R, N] of the pairs ``pair`` (int64 [N], mask
    ``r_ok``): ``h = RN(RN(acc * alpha) * d_t)``, the activation, ``act`` stored (with TAP ``acc1`` and ``h``)."""
    N1: tl.constexpr = 2 * INTER if GATED else INTER
    d = tl.load(xd_ptr + pair // TOPK, mask=r_ok, other=1.0)
    cols = q * BC + tl.arange(0, BC)
    ok = (cols < INTER)[:, None] & r_ok[None, :]
    if GATED:
        acc_u, acc_g = tl.split(tl.permute(tl.reshape(acc, [2, BC, N]), (1, 2, 0)))
        h_u = (acc_u * alpha) * d[None, :]  # P8
        h_g = (acc_g * alpha) * d[None, :]
        a = swiglu_f32(h_g, h_u)  # P9
        if TAP:
            base = pair[None, :] * N1 + cols[:, None]
            tl.store(acc_ptr + base, acc_g, mask=ok)
            tl.store(acc_ptr + base + INTER, acc_u, mask=ok)
            tl.store(h_ptr + base, h_g, mask=ok)
            tl.store(h_ptr + base + INTER, h_u, mask=ok)
    else:
        h = (acc * alpha) * d[None, :]  # P8
        a = relu2_f32(h)  # P9
        if TAP:
            base = pair[None, :] * N1 + cols[:, None]
            tl.store(acc_ptr + base, acc, mask=ok)
            tl.store(h_ptr + base, h, mask=ok)
    tl.store(act_ptr + pair[None, :] * INTER + cols[:, None], a, mask=ok)


@triton.jit
def _pertoken_fc1_kernel(
    xq_ptr,  # bf16 [T, H]: the tokens' exact NVFP4 values (launch_pertoken_quant's values)
    xd_ptr,  # fp32 [T]: token decode scales d
    order_ptr,  # int32 [P]: pair ids sorted by local expert
    bexp_ptr,  # int32 [NB]
    bstart_ptr,  # int32 [NB]
    bend_ptr,  # int32 [NB]
    w_ptr,  # uint8 fc1_data [E, N1P, HP/2]
    s_ptr,  # uint8 fc1_scale_swizzled [E, N1P, HP/16]
    alpha_ptr,  # fp32 [E]
    act_ptr,  # fp32 [P, INTER] (out)
    acc_ptr,  # fp32 [P, N1] (out, TAP only): acc1, logical columns ([gate; up] when gated)
    h_ptr,  # fp32 [P, N1] (out, TAP only): h
    H: tl.constexpr,
    HP: tl.constexpr,
    IP: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    GATED: tl.constexpr,
    BM: tl.constexpr,
    TAIL: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    DECODE: tl.constexpr,
    TAP: tl.constexpr,
    SW: tl.constexpr,
):
    """act[p, n] for columns n in [q*BC, q*BC + BC) (n < INTER) of the pairs of row block b (module docstring).

    Grid ``(cdiv(INTER, BC), NB)``. Gated: tile row r < BC is the up row of column ``q*BC + r`` (physical row
    ``(n // 64) * 128 + n % 64``), r >= BC its gate row (+64); one accumulator [2 BC, BM] split in the
    epilogue, then SwiGLU. Non-gated: tile row r is physical row ``q*BC + r``, then squared ReLU. ``TAIL`` > 0:
    expert-wide row blocks of up to BM + TAIL pairs (``moe_permute(..., tail=TAIL)``), the pairs past the first
    BM in a second accumulator [R, TAIL] (:func:`expert_rows_acc_tail`), each with the same epilogue. ``SW``:
    the scales as int32 words. Neither changes a bit."""
    gdc_wait()
    gdc_launch_dependents()
    N1P: tl.constexpr = 2 * IP if GATED else IP
    R: tl.constexpr = 2 * BC if GATED else BC
    q = tl.program_id(0)
    b = tl.program_id(1)
    e, start, end, pos, r_ok = row_block(bexp_ptr, bstart_ptr, bend_ptr, b, BM)
    pair = tl.load(order_ptr + pos, mask=r_ok, other=0).to(tl.int64)
    tok = pair // TOPK
    r = tl.arange(0, R)
    rcol = q * BC + r % BC
    w_ok = rcol < INTER
    if GATED:
        prow = (rcol // 64) * 128 + rcol % 64 + (r // BC) * 64
    else:
        prow = rcol
    alpha = tl.load(alpha_ptr + e)
    if TAIL > 0:
        pair_t, t_ok, has_tail = tail_rows(order_ptr, start, end, BM, TAIL)
        pair_t = pair_t.to(tl.int64)
        acc, acc_t = expert_rows_acc_tail(w_ptr, s_ptr, xq_ptr, e, prow, w_ok, tok, r_ok, pair_t // TOPK, t_ok,
                                          start, end, N1P, H, HP, R, BM, TAIL, BK, DECODE, SW)  # fmt: skip
        _fc1_epilogue(acc, pair, r_ok, alpha, xd_ptr, q, act_ptr, acc_ptr, h_ptr, INTER, TOPK, GATED, BC, BM, TAP)
        if has_tail:
            _fc1_epilogue(acc_t, pair_t, t_ok, alpha, xd_ptr, q, act_ptr, acc_ptr, h_ptr, INTER, TOPK, GATED, BC,
                          TAIL, TAP)  # fmt: skip
    else:
        acc = expert_rows_acc(w_ptr, s_ptr, xq_ptr, e, prow, w_ok, tok, r_ok, start, end, N1P, H, HP, R, BM, BK,
                              DECODE, SW)  # fmt: skip
        _fc1_epilogue(acc, pair, r_ok, alpha, xd_ptr, q, act_ptr, acc_ptr, h_ptr, INTER, TOPK, GATED, BC, BM, TAP)


def launch_pertoken_fc1(
    x_values: torch.Tensor,
    x_token_scale: torch.Tensor,
    perm,
    weights,
    activation: str,
    *,
    taps: dict | None = None,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """P7-P10 for every pair of ``perm``: ``(act, a_codes, a_scale, a_token_scale, a_values)``.

    Args (checked by the caller, ``flint_moe.ops.routed_nvfp4_moe``): ``x_values`` bf16 [T, H] the tokens'
    exact NVFP4 values and ``x_token_scale`` fp32 [T] (``pertoken_quant.launch_pertoken_quant`` with values);
    ``perm`` = ``moe_permute(local ids int32 [T, k], E, BM, tail)`` (-1 = not computed here; ``tail`` > 0: the
    expert-wide row blocks, the same bits); ``weights``
    ``RoutedNVFP4Weights``; ``activation`` ``"relu2"`` (non-gated weights) or ``"swiglu"`` (gated).
    taps: None or a dict receiving ``fc1_acc`` and ``h`` fp32 [T, k, N1] (logical columns, [gate; up] when
        gated) and ``act`` fp32 [T, k, I]; rows of pairs not computed hold unspecified values.
    config: overrides of :data:`PERTOKEN_FC1_CONFIG` (and ``DECODE``); ``SCALE_WORD`` needs BK a multiple of 64.
    Returns:
        ``act`` fp32 [P, I]; FC2 input ``a_codes`` uint8 [P, Ip/2], ``a_scale`` uint8 [P, Ip/16] (row-major),
        ``a_token_scale`` fp32 [P] and ``a_values`` bf16 [P, I] (their exact values without the row scale)
        (P = T * k, row = pair ``t * k + j``).
    Raises:
        ValueError for a bad config.
    """
    t, k = perm.order.numel() // perm.top_k, perm.top_k
    h, hp = weights.hidden_size, weights.padded_hidden_size
    inter, ip = weights.intermediate_size, weights.padded_intermediate_size
    gated = bool(weights.gated)
    cfg = _cfg(config, PERTOKEN_FC1_CONFIG, "pertoken_fc1")
    bc = int(cfg["BC"] or default_bc(gated, perm.block_m))
    allowed = (32, 64) if gated else (64, 128)
    if bc not in allowed:
        raise ValueError(f"pertoken_fc1: config BC = {bc} must be {allowed[0]} or {allowed[1]} (tiles of >= 64 "
                         "weight rows)")  # fmt: skip
    dev = x_values.device
    p = t * k
    n1 = 2 * inter if gated else inter
    act = torch.empty((p, inter), dtype=torch.float32, device=dev)
    tap = taps is not None
    if tap:
        acc1 = torch.zeros((p, n1), dtype=torch.float32, device=dev)
        hbuf = torch.zeros_like(acc1)
    else:
        acc1 = hbuf = act  # never written
    if p > 0:
        grid = (triton.cdiv(inter, bc), perm.num_blocks)
        _pertoken_fc1_kernel[grid](
            x_values, x_token_scale, perm.order, perm.block_expert, perm.block_start, perm.block_end,
            weights.fc1_data, weights.fc1_scale_swizzled.view(torch.uint8), weights.fc1_alpha, act, acc1, hbuf,
            H=h, HP=hp, IP=ip, INTER=inter, TOPK=k, GATED=gated, BC=bc,
            **pertoken_launch_kwargs(cfg, perm.block_m, tap, perm.tail),
        )  # fmt: skip
    a_codes, a_scale, a_d, a_values = quantize_rows(act, ip, values=True)  # P10
    if tap:
        taps.update(fc1_acc=acc1.view(t, k, n1), h=hbuf.view(t, k, n1), act=act.view(t, k, inter))
    return act, a_codes, a_scale, a_d, a_values


#: (name, H, I, k, BM, gated, TAP) builds audited for sm_90: DeepSeek-V3 widths, both activations.
AUDIT_CASES = (
    ("swiglu.H7168.I2048.BM16", 7168, 2048, 8, 16, True, False),
    ("relu2.H7168.I2048.BM16", 7168, 2048, 8, 16, False, False),
    ("swiglu.H7168.I2048.BM64", 7168, 2048, 8, 64, True, False),
    ("swiglu.H7168.I2048.BM128", 7168, 2048, 8, 128, True, False),
    ("swiglu.H7168.I2048.BM128.tap", 7168, 2048, 8, 128, True, True),
    ("relu2.H7168.I2048.BM128", 7168, 2048, 8, 128, False, False),
    ("relu2.H2880.I2880.BM64", 2880, 2880, 4, 64, False, False),
)

#: (name, H, I, k, BM, TAIL, SCALE_WORD, gated, TAP) builds with the launch options audited for sm_90: the
#: defaults (``grouped_config``) at BM 128 and 256 (DeepSeek-V3 both activations, tapped; gpt-oss-120b
#: widths), each option alone, and the small-block expert-wide build of the CPU tests' shapes (BM 16, TAIL 16).
OPTION_AUDIT_CASES = (
    ("swiglu.H7168.I2048.BM128.T32.SW", 7168, 2048, 8, 128, 32, True, True, False),
    ("swiglu.H7168.I2048.BM128.T32.SW.tap", 7168, 2048, 8, 128, 32, True, True, True),
    ("relu2.H7168.I2048.BM128.T32.SW", 7168, 2048, 8, 128, 32, True, False, False),
    ("swiglu.H7168.I2048.BM256.T32.SW", 7168, 2048, 8, 256, 32, True, True, False),
    ("swiglu.H7168.I2048.BM128.T32", 7168, 2048, 8, 128, 32, False, True, False),
    ("swiglu.H7168.I2048.BM128.SW", 7168, 2048, 8, 128, 0, True, True, False),
    ("swiglu.H2880.I2880.BM128.T32.SW", 2880, 2880, 4, 128, 32, True, True, False),
    ("swiglu.H7168.I2048.BM16.T16.SW", 7168, 2048, 8, 16, 16, True, True, False),
    ("swiglu.H7168.I2048.BM32.T32.SW", 7168, 2048, 8, 32, 32, True, True, False),
)


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit of the FC1 kernel (``AUDIT_CASES``, and ``OPTION_AUDIT_CASES`` with the
    expert-wide row blocks and the scale words): wgmma (tensor cores), the PDL wait, the bf16 decode
    multiply, and for SwiGLU the pinned ``ex2.approx.ftz.f32`` / ``rcp.approx.ftz.f32``; no fused multiply-add
    (P8 and P9 are plain ``mul.f32``), no fp64, no approximate division."""
    sig = {"xq_ptr": "*bf16", "xd_ptr": "*fp32", "order_ptr": "*i32", "bexp_ptr": "*i32",
           "bstart_ptr": "*i32", "bend_ptr": "*i32", "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32",
           "act_ptr": "*fp32", "acc_ptr": "*fp32", "h_ptr": "*fp32"}  # fmt: skip
    cfg = PERTOKEN_FC1_CONFIG
    names = []
    cases = [(n, h, i, k, bm, 0, False, g, tap) for n, h, i, k, bm, g, tap in AUDIT_CASES] + list(OPTION_AUDIT_CASES)
    for name, h, i, k, bm, tail, sw, gated, tap in cases:
        ip = (i + 255) // 256 * 256
        hp = (h + 255) // 256 * 256
        consts = {"H": h, "HP": hp, "IP": ip, "INTER": i, "TOPK": k, "GATED": gated, "BM": bm, "TAIL": tail,
                  "BC": cfg["BC"] or default_bc(gated, bm), "BK": cfg["BK"], "DECODE": 3, "TAP": tap,
                  "SW": sw}  # fmt: skip
        require = ["wgmma.mma_async", "griddepcontrol.wait", "mul.rn.bf16x2"]
        if gated:
            require += ["ex2.approx.ftz.f32", "rcp.approx.ftz.f32"]
        options = {"num_warps": default_warps(bm), "num_stages": cfg["num_stages"]}
        names.append(register_audit(f"pertoken_fc1.{name}", _pertoken_fc1_kernel, sig, consts, require,
                                    (*DEFAULT_FORBID, "fma.rn.f32", "div.approx"), options=options).name)  # fmt: skip
    # P10: the per-token quantizer kernel on the fp32 FC2-input rows, writing their values (FC2's operand)
    from flint_moe.kernels.nvfp4.pertoken_quant import _pertoken_quant_kernel, chunk_and_warps

    qforbid = (*DEFAULT_FORBID, "rcp.approx", "div.approx", "mul.ftz", "fma.rn", "cvt.rn.satfinite.e4m3x2")
    for i, ip in ((2048, 2048), (2880, 3072)):
        chunk, warps = chunk_and_warps(ip)
        names.append(register_audit(
            f"pertoken_quant.fc2_input.I{i}", _pertoken_quant_kernel,
            {"x_ptr": "*fp32", "codes_ptr": "*u8", "scale_ptr": "*u8", "token_scale_ptr": "*fp32",
             "values_ptr": "*bf16"},
            {"H": i, "HP": ip, "CHUNK": chunk, "VALUES": True}, ["div.rn.f32", "griddepcontrol.wait"],
            qforbid, options={"num_warps": warps}).name)  # fmt: skip
    return names


audit_specs()
