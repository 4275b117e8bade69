"""BF16 decode gate/up GEMV + SwiGLU on TRT-LLM BlockMajorK weights (rule steps 6-7, "BF16 experts").

One program computes ``BN`` intermediate columns of one (token, selected expert) pair: the gate rows and the
up rows of those columns, read in place from ``g1`` through the logical -> physical row map of
``flint_moe.layouts.trtllm_bf16_row_maps``; then the rule's SwiGLU epilogue in fp32 and one bf16 rounding.
Seed: ``_gate_up_gemv_bf16_kernel`` of ``vllm.models.flint.ops.moe`` (semantics only; this kernel adds the
rule's PTX instructions, a documented summation order, taps, 64-bit offsets and H not a power of two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import check_op_tensor, check_taps, gdc_launch_dependents, gdc_wait
from flint_moe.kernels._rule import SWIGLU_C, swiglu
from flint_moe.kernels.audit.registry import BF16_CVT
from flint_moe.kernels.bf16 import gemv
from flint_moe.kernels.bf16.gemv import LANES, checked_row, sum64_pairwise, trtllm_row

__all__ = ["GATE_UP_CONFIG", "SWIGLU_C", "bf16_gate_up", "launch_bf16_gate_up", "check_g1", "audit_specs"]

#: Default launch configuration: ``BN`` intermediate columns per program (a divisor of 64), ``num_warps``,
#: ``UNROLL`` (unroll factor of the K loop). None of them changes a bit of the result (the summation order is
#: fixed per row, see ``flint_moe.kernels.bf16.gemv``); they only trade parallelism for memory-level
#: parallelism. Chosen for the H200 by ``benchmarks/bench_decode_bf16.py``.
GATE_UP_CONFIG = {"BN": 8, "num_warps": 2, "UNROLL": 4}



@triton.jit
def _bf16_gate_up_kernel(
    x_ptr,  # bf16 [M, H]
    ids_ptr,  # int32 [M * TOPK]: selected expert of pair p = t * TOPK + j
    w_ptr,  # bf16 g1 [E, H / 64, 2 * INTER, 64] (TRT-LLM BlockMajorK, rows permuted)
    map_ptr,  # int32 [2 * INTER]: logical [gate; up] row -> physical row m of g1[e, :, m, :]
    act_ptr,  # bf16 [M * TOPK, INTER] (out)
    gacc_ptr,  # fp32 [M * TOPK, INTER] (out, TAP only): g_acc
    uacc_ptr,  # fp32 [M * TOPK, INTER] (out, TAP only): u_acc
    H: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BN: tl.constexpr,
    UNROLL: tl.constexpr,
    TAP: tl.constexpr,
):
    """act[p, n] = bf16(RN(u * RN(g * rcp(RN(ex2(RN(g * c)) + 1))))), g / u = fp32 dot products.

    Grid ``(M * TOPK, INTER // BN)``; program (p, q) handles pair ``p = t * TOPK + j`` (token t, expert
    ``e = ids[p]``) and logical intermediate columns ``n = q * BN .. q * BN + BN - 1``.

    Rule step 6 (BF16): ``g_acc[n] = sum_h Wg[n, h] * x[t, h]`` and ``u_acc[n]`` likewise (logical rows n and
    INTER + n of [gate; up], physical rows ``map[n]``, ``map[INTER + n]``), fp32; ``g = g_acc``,
    ``u = u_acc`` (no global scale). Summation order (both sums, every n): lane ``l = h % 64`` accumulates
    ``h = l, l + 64, ...`` in increasing h with ``fma.rn.f32`` from +0, then a neighbour-first pairwise tree
    over the 64 lanes (``flint_moe.kernels.bf16.gemv``). Lane l of block b is ``g1[e, b, m, l]`` (the
    128-byte block row), which is why the lane split is the layout's own.

    Rule step 7: ``a = RN(g * c)`` (``mul.f32``, c = 0xBFB8AA3B), ``p = ex2.approx.ftz.f32(a)``,
    ``d = RN(p + 1)``, ``r = rcp.approx.ftz.f32(d)``, ``act = bf16(RN(u * RN(g * r)))``
    (``cvt.rn.bf16.f32``); the instructions come from ``flint_moe.kernels._rule`` (interpreter shims call
    the golden model's emulations). No add is fed by a multiply here, so FP fusion cannot merge roundings.

    Row map: a loaded ``map[n]`` / ``map[INTER + n]`` outside [0, 2 * INTER) is replaced by the layout's
    own row (``trtllm_row(2n + 1)`` / ``trtllm_row(2n)``, ``bf16.gemv.checked_row``), so no map value
    reads outside g1; an in-range value is used as given.

    With ``TAP`` the raw accumulators ``g_acc`` / ``u_acc`` (the last order-dependent values) are stored too.
    Offsets: the expert base and token rows are 64-bit; offsets inside one expert are 32-bit (one expert
    holds < 2^31 elements, checked by the launcher). Waits on the previous grid (PDL) before any memory
    access.
    """
    gdc_wait()
    gdc_launch_dependents()
    p = tl.program_id(0).to(tl.int64)
    q = tl.program_id(1)
    t = p // TOPK
    e = tl.load(ids_ptr + p).to(tl.int64)
    NB: tl.constexpr = H // 64
    ROWS: tl.constexpr = 2 * INTER
    cols = q * BN + tl.arange(0, BN)
    # a map value outside [0, 2 * INTER) reads the layout's own row instead (never outside g1)
    row_g = checked_row(tl.load(map_ptr + cols), trtllm_row(2 * cols + 1), ROWS).to(tl.int64)
    row_u = checked_row(tl.load(map_ptr + INTER + cols), trtllm_row(2 * cols), ROWS).to(tl.int64)
    lane = tl.arange(0, 64)
    off_g = row_g[:, None] * 64 + lane[None, :]
    off_u = row_u[:, None] * 64 + lane[None, :]
    w_e = w_ptr + e * (NB * ROWS * 64)
    x_t = x_ptr + t * H
    x_off = tl.full([BN, 1], 0, tl.int32) + lane[None, :]  # [BN, 64]: lane index in every row
    acc_g = tl.full([BN, 64], 0.0, tl.float32)
    acc_u = tl.full([BN, 64], 0.0, tl.float32)
    for b in tl.range(0, NB, loop_unroll_factor=UNROLL):
        # x loaded as a [BN, 64] tile (every row the same 64 values) so that it arrives in the weight tile's
        # register layout: a [64] load broadcast afterwards costs a shared-memory round trip per K step.
        xb = tl.load(x_t + b * 64 + x_off).to(tl.float32)
        w_b = w_e + b * (ROWS * 64)  # within one expert: < 2^31 elements (checked by the launcher)
        wg = tl.load(w_b + off_g).to(tl.float32)
        wu = tl.load(w_b + off_u).to(tl.float32)
        acc_g = tl.fma(wg, xb, acc_g)
        acc_u = tl.fma(wu, xb, acc_u)
    g = sum64_pairwise(acc_g, BN)
    u = sum64_pairwise(acc_u, BN)
    out_off = p * INTER + cols
    if TAP:
        tl.store(gacc_ptr + out_off, g)
        tl.store(uacc_ptr + out_off, u)
    act = swiglu(g, u)
    tl.store(act_ptr + out_off, act)


def check_g1(w13: torch.Tensor, hidden: int, device: torch.device) -> tuple[int, int]:
    """Validate a TRT-LLM BF16 g1 tensor for hidden size ``hidden``; returns (E, Ip)."""
    check_op_tensor("w13", w13, dtype=torch.bfloat16, device=device)
    if w13.dim() != 4 or w13.shape[3] != LANES or w13.shape[1] * LANES != hidden:
        raise ValueError(
            f"w13: expected the TRT-LLM BF16 BlockMajorK layout [E, H/64, 2I, 64] with H = {hidden}, "
            f"got shape {tuple(w13.shape)} (convert with flint_moe.layouts.to_trtllm_bf16)"
        )
    n_exp, two_i = int(w13.shape[0]), int(w13.shape[2])
    if two_i <= 0 or two_i % (2 * LANES):
        raise ValueError(f"w13: 2I = {two_i} must be a positive multiple of 128 (I a multiple of 64)")
    if two_i * hidden >= 2**31:
        raise ValueError(f"w13: one expert holds {two_i * hidden} elements, more than the kernel's 2^31 - 1")
    return n_exp, two_i // 2


def bf16_gate_up(
    x: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, map13: torch.Tensor,
    *, taps: dict | None = None, config: dict | None = None, check: bool = True,
) -> torch.Tensor:
    """Rule steps 6-7 (BF16 experts) for every (token, selected expert): ``act`` bf16 [M, k, Ip].

    Args:
        x: bf16 [M, H] activations (contiguous), H a multiple of 64.
        ids: int32 [M, k] selected experts (contiguous), every value in [0, E) (not checked on the device:
            ``route`` produces them).
        w13: bf16 g1 [E, H/64, 2Ip, 64] (``flint_moe.layouts.to_trtllm_bf16``), Ip a multiple of 64
            (a padded intermediate size works: padded rows are zero and give act = 0).
        map13: int32 [2Ip] from ``trtllm_bf16_row_maps(H, Ip)`` (logical [gate; up] row -> physical row).
            A value outside [0, 2Ip) reads the layout's own row instead (never outside ``w13``); in-range
            values are used as given (``flint_moe_bf16_decode`` checks them).
        taps: if a dict, the tapped build runs and stores ``gate_acc`` / ``up_acc`` fp32 [M, k, Ip] (raw
            accumulators, before any rounding) and ``act`` bf16 [M, k, Ip] into it.
        config: launch overrides (``GATE_UP_CONFIG`` keys); never change the result.
        check: False skips the tensor checks, for a caller that made them (``launch_bf16_gate_up``); the config
            and ``taps`` are checked either way.

    Returns: new bf16 tensor [M, k, Ip]. Inputs are never modified.
    Raises: TypeError (dtype) / ValueError (shape, contiguity, device, config) naming the argument.
    PTX: ``fma.rn.f32``, ``ex2.approx.ftz.f32``, ``rcp.approx.ftz.f32``, ``cvt.rn.bf16.f32``; PDL on the GPU.
    """
    if check:
        check_op_tensor("x", x, dtype=torch.bfloat16)
        if x.dim() != 2:
            raise ValueError(f"x: expected [M, H], got shape {tuple(x.shape)}")
        m_tok, hidden = int(x.shape[0]), int(x.shape[1])
        dev = x.device
        if hidden <= 0 or hidden % LANES:
            raise ValueError(f"x: hidden size H = {hidden} must be a positive multiple of 64")
        check_op_tensor("ids", ids, dtype=torch.int32, device=dev)
        if ids.dim() != 2 or ids.shape[0] != m_tok or ids.shape[1] < 1:
            raise ValueError(f"ids: expected [M = {m_tok}, k >= 1], got shape {tuple(ids.shape)}")
        _, inter = check_g1(w13, hidden, dev)
        check_op_tensor("map13", map13, dtype=torch.int32, shape=(2 * inter,), device=dev)
    m_tok, hidden = int(x.shape[0]), int(x.shape[1])
    dev = x.device
    top_k = int(ids.shape[1])
    inter = int(w13.shape[2]) // 2
    cfg = gemv.tile_config(config, GATE_UP_CONFIG, "BN")
    act = torch.empty((m_tok, top_k, inter), dtype=torch.bfloat16, device=dev)
    tap = check_taps(taps)
    if tap:
        g_acc = torch.empty((m_tok, top_k, inter), dtype=torch.float32, device=dev)
        u_acc = torch.empty_like(g_acc)
    else:
        g_acc = u_acc = act  # never written (TAP=False)
    if m_tok == 0:
        return act
    grid = (m_tok * top_k, inter // cfg["BN"])
    _bf16_gate_up_kernel[grid](
        x, ids, w13, map13, act, g_acc, u_acc, **gemv.gemv_launch_kwargs(hidden, inter, top_k, cfg, "BN", tap)
    )
    if tap:
        taps.update(gate_acc=g_acc, up_acc=u_acc, act=act)
    return act


def launch_bf16_gate_up(*args, **kwargs) -> torch.Tensor:
    """``bf16_gate_up(..., check=False)``. On arguments already checked by the caller (the op
    ``flint_moe_bf16_decode``: its inputs at its boundary, ``ids`` from ``route``): no tensor checks here; the
    config and ``taps`` are checked."""
    return bf16_gate_up(*args, check=False, **kwargs)


REQUIRE = [BF16_CVT, "rcp.approx.ftz.f32", "ex2.approx.ftz.f32", "fma.rn.f32"]


#: Launch configurations besides the default that the conformance matrix runs
#: (flint_moe/conformance/inputs/cases.py PATH_CONFIGS["bf16_decode"]), audited at the first gemv.AUDIT_SHAPES entry.
AUDIT_CONFIGS = ({"BN": 4, "num_warps": 1, "UNROLL": 8},)


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit specialisations (every ``gemv.AUDIT_SHAPES`` entry, TAP off and on)."""
    sig = {"x_ptr": "*bf16", "ids_ptr": "*i32", "w_ptr": "*bf16", "map_ptr": "*i32", "act_ptr": "*bf16",
        "gacc_ptr": "*fp32", "uacc_ptr": "*fp32"}
    return gemv.register_gemv_audits(
        "bf16_gate_up", _bf16_gate_up_kernel, sig, GATE_UP_CONFIG, "BN", REQUIRE, AUDIT_CONFIGS
    )


audit_specs()
