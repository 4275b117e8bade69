"""BF16 decode down GEMV over a token's k experts + combine + shared add (rule steps 8-10, "BF16 experts").

One program computes ``BH`` output features of one token: for each selected expert in selection order the
down GEMV over the intermediate size, read in place from the TRT-LLM BlockMajorK ``g2`` through the output
row map of ``flint_moe.layouts.trtllm_bf16_row_maps``, its bf16 rounding, and the sequential fma combine;
then the bf16 routed value and the shared-expert add. Seed: ``_down_gemv_bf16_kernel`` of
``vllm.models.flint.ops.moe`` (semantics only; this kernel adds the rule's explicit fma combine, a documented
summation order, taps, 64-bit offsets and I / H not powers of two).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import check_op_tensor, check_taps, gdc_launch_dependents, gdc_wait
from flint_moe.kernels._rule import bf16_rn, combine_fma, shared_add
from flint_moe.kernels.audit.registry import BF16_CVT
from flint_moe.kernels.bf16 import gemv
from flint_moe.kernels.bf16.gemv import LANES, checked_row, sum64_pairwise, trtllm_row

__all__ = ["DOWN_CONFIG", "bf16_down_combine", "launch_bf16_down_combine", "check_g2", "audit_specs"]

#: Default launch configuration: ``BH`` output features per program (a power of two dividing 64),
#: ``num_warps``, ``UNROLL`` (unroll factor of the K loop). None of them changes a bit of the result.
DOWN_CONFIG = {"BH": 4, "num_warps": 1, "UNROLL": 4}


@triton.jit
def _bf16_down_combine_kernel(
    act_ptr,  # bf16 [M * TOPK, INTER]
    ids_ptr,  # int32 [M * TOPK]
    tw_ptr,  # fp32 [M * TOPK]: routing weights (bf16 values, rule step 4)
    w_ptr,  # bf16 g2 [E, INTER / 64, H, 64] (TRT-LLM BlockMajorK, rows shuffled)
    map_ptr,  # int32 [H]: output row h -> physical row m of g2[e, :, m, :]
    shared_ptr,  # bf16 [M, H]
    out_ptr,  # bf16 [M, H] (out)
    dacc_ptr,  # fp32 [M * TOPK, H] (out, TAP only): y_acc
    y_ptr,  # bf16 [M * TOPK, H] (out, TAP only): y
    H: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BH: tl.constexpr,
    UNROLL: tl.constexpr,
    TAP: tl.constexpr,
):
    """out[t, h] = bf16(RN(fp32(bf16(acc)) + fp32(shared[t, h]))), acc = fma chain of tw_j * y_j.

    Grid ``(M, H // BH)``; program (t, q) handles token t and output features
    ``h = q * BH .. q * BH + BH - 1``.

    Rule step 8 (BF16), for j = 0 .. TOPK - 1, ``e = ids[t, j]``: ``y_acc[h] = sum_i W2[h, i] * act[t, j, i]``
    (physical row ``map[h]``), fp32; ``y = bf16(y_acc)`` (``cvt.rn.bf16.f32``). Summation order (every h, j):
    lane ``l = i % 64`` accumulates ``i = l, l + 64, ...`` in increasing i with ``fma.rn.f32`` from +0, then a
    neighbour-first pairwise tree over the 64 lanes (``flint_moe.kernels.bf16.gemv``).

    Rule step 9: ``acc = +0``; for j = 0 .. TOPK - 1 in selection order: ``acc = fma(tw_j, y_j, acc)``
    (``tl.fma`` -> ``fma.rn.f32``, one rounding; sequential, bit-exact); ``routed = bf16(acc)``.
    Rule step 10: ``out = bf16(RN(fp32(routed) + fp32(shared)))`` (``add.rn.f32``, not fed by a multiply).

    Row map: a loaded ``map[h]`` outside [0, H) is replaced by the layout's own row ``trtllm_row(h)``
    (``bf16.gemv.checked_row``), so no map value reads outside g2; an in-range value is used as given.

    With ``TAP`` the raw accumulators ``y_acc`` and the per-expert ``y`` are stored too. Offsets: the expert
    base and token rows are 64-bit, offsets inside one expert 32-bit (< 2^31 elements, checked by the
    launcher). Waits on the previous grid (PDL) before any memory access.
    """
    gdc_wait()
    gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    q = tl.program_id(1)
    NB: tl.constexpr = INTER // 64
    rows = q * BH + tl.arange(0, BH)
    # a map value outside [0, H) reads the layout's own row instead (never outside g2)
    prow = checked_row(tl.load(map_ptr + rows), trtllm_row(rows), H)
    lane = tl.arange(0, 64)
    w_off = prow[:, None] * 64 + lane[None, :]  # inside one expert (int32)
    a_off = tl.full([BH, 1], 0, tl.int32) + lane[None, :]  # [BH, 64]: lane index in every row
    comb = tl.full([BH], 0.0, tl.float32)
    for j in tl.static_range(TOPK):
        p = t * TOPK + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        tw = tl.load(tw_ptr + p + tl.full([BH], 0, tl.int32))  # broadcast [BH]
        w_e = w_ptr + e * (NB * H * 64)
        a_p = act_ptr + p * INTER
        acc = tl.full([BH, 64], 0.0, tl.float32)
        for b in tl.range(0, NB, loop_unroll_factor=UNROLL):
            # act loaded as a [BH, 64] tile (rows identical) in the weight tile's layout (no shared-memory
            # round trip per K step, unlike a [64] load broadcast afterwards).
            ab = tl.load(a_p + b * 64 + a_off).to(tl.float32)
            wb = tl.load(w_e + b * (H * 64) + w_off).to(tl.float32)
            acc = tl.fma(wb, ab, acc)
        y_acc = sum64_pairwise(acc, BH)
        y = bf16_rn(y_acc)
        if TAP:
            tl.store(dacc_ptr + p * H + rows, y_acc)
            tl.store(y_ptr + p * H + rows, y)
        comb = combine_fma(comb, tw, y)
    routed = bf16_rn(comb)
    sh = tl.load(shared_ptr + t * H + rows).to(tl.float32)
    out = shared_add(routed, sh)
    tl.store(out_ptr + t * H + rows, out)


def check_g2(w2: torch.Tensor, hidden: int, inter: int, n_exp: int | None, device: torch.device) -> None:
    """Validate a TRT-LLM BF16 g2 tensor [E, Ip/64, H, 64] (E checked when ``n_exp`` is given)."""
    check_op_tensor("w2", w2, dtype=torch.bfloat16, device=device)
    n_exp = n_exp if n_exp is not None else (int(w2.shape[0]) if w2.dim() == 4 else -1)
    expected = (n_exp, inter // LANES, hidden, LANES)
    if tuple(w2.shape) != expected:
        raise ValueError(
            f"w2: expected the TRT-LLM BF16 BlockMajorK layout [E, I/64, H, 64] = {expected}, got shape "
            f"{tuple(w2.shape)} (convert with flint_moe.layouts.to_trtllm_bf16)"
        )
    if hidden * inter >= 2**31:
        raise ValueError(f"w2: one expert holds {hidden * inter} elements, more than the kernel's 2^31 - 1")


def bf16_down_combine(
    act: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w2: torch.Tensor, map2: torch.Tensor,
    shared_output: torch.Tensor,
    *, taps: dict | None = None, config: dict | None = None, out: torch.Tensor | None = None, check: bool = True,
) -> torch.Tensor:
    """Rule steps 8-10 (BF16 experts): ``out`` bf16 [M, H] from the SwiGLU outputs of the k selected experts.

    Args:
        act: bf16 [M, k, Ip] (``bf16_gate_up``), contiguous; Ip a multiple of 64.
        ids: int32 [M, k] selected experts in selection order (values in [0, E), not checked on the device).
        weights: fp32 [M, k] routing weights holding bf16 values (rule step 4).
        w2: bf16 g2 [E, Ip/64, H, 64] (``flint_moe.layouts.to_trtllm_bf16``).
        map2: int32 [H] from ``trtllm_bf16_row_maps(H, Ip)`` (output row -> physical row). A value outside
            [0, H) reads the layout's own row instead (never outside ``w2``); in-range values are used as
            given (``flint_moe_bf16_decode`` checks them).
        shared_output: bf16 [M, H] shared-expert output (rule step 10), ready on the current stream.
        taps: if a dict, the tapped build runs and stores ``down_acc`` fp32 [M, k, H] (raw y_acc), ``y`` bf16
            [M, k, H] and ``out`` bf16 [M, H] into it.
        config: launch overrides (``DOWN_CONFIG`` keys); never change the result.
        out: None, or a bf16 [M, H] contiguous tensor written and returned (no overlap with any input: the op
            checks that, ``ops._checks.check_out``).
        check: False skips the tensor checks, for a caller that made them (``launch_bf16_down_combine``); the config
            and ``taps`` are checked either way.

    Returns: new bf16 tensor [M, H], or ``out``. Inputs are never modified.
    Raises: TypeError (dtype) / ValueError (shape, contiguity, device, config) naming the argument.
    PTX: ``fma.rn.f32``, ``cvt.rn.bf16.f32``, ``add.rn.f32``; PDL on the GPU.
    """
    if check:
        check_op_tensor("act", act, dtype=torch.bfloat16)
        if act.dim() != 3:
            raise ValueError(f"act: expected [M, k, I], got shape {tuple(act.shape)}")
        m_tok, top_k, inter = (int(s) for s in act.shape)
        dev = act.device
        if top_k < 1 or inter <= 0 or inter % LANES:
            raise ValueError(f"act: need k >= 1 and I a positive multiple of 64, got shape {tuple(act.shape)}")
        check_op_tensor("ids", ids, dtype=torch.int32, shape=(m_tok, top_k), device=dev)
        check_op_tensor("weights", weights, dtype=torch.float32, shape=(m_tok, top_k), device=dev)
        check_op_tensor("shared_output", shared_output, dtype=torch.bfloat16, device=dev)
        if shared_output.dim() != 2 or shared_output.shape[0] != m_tok:
            raise ValueError(f"shared_output: expected [M = {m_tok}, H], got shape {tuple(shared_output.shape)}")
        hidden = int(shared_output.shape[1])
        if hidden <= 0 or hidden % LANES:
            raise ValueError(f"shared_output: hidden size H = {hidden} must be a positive multiple of 64")
        check_g2(w2, hidden, inter, None, dev)
        check_op_tensor("map2", map2, dtype=torch.int32, shape=(hidden,), device=dev)
    m_tok, top_k, inter = (int(s) for s in act.shape)
    dev = act.device
    hidden = int(shared_output.shape[1])
    cfg = gemv.tile_config(config, DOWN_CONFIG, "BH")
    if out is None:
        out = torch.empty((m_tok, hidden), dtype=torch.bfloat16, device=dev)
    check_op_tensor("out", out, dtype=torch.bfloat16, shape=(m_tok, hidden), device=dev)
    tap = check_taps(taps)
    if tap:
        d_acc = torch.empty((m_tok, top_k, hidden), dtype=torch.float32, device=dev)
        y = torch.empty((m_tok, top_k, hidden), dtype=torch.bfloat16, device=dev)
    else:
        d_acc, y = out, out  # never written (TAP=False)
    if m_tok > 0:
        _bf16_down_combine_kernel[(m_tok, hidden // cfg["BH"])](
            act, ids, weights, w2, map2, shared_output, out, d_acc, y,
            **gemv.gemv_launch_kwargs(hidden, inter, top_k, cfg, "BH", tap),
        )
    if tap:
        taps.update(down_acc=d_acc, y=y, out=out)
    return out


def launch_bf16_down_combine(*args, **kwargs) -> torch.Tensor:
    """``bf16_down_combine(..., check=False)``. On arguments already checked by the caller (the op
    ``flint_moe_bf16_decode``: its inputs at its boundary, ``ids`` / ``weights`` from ``route``, ``act`` from
    ``launch_bf16_gate_up``): no tensor checks here; the config and ``taps`` are checked."""
    return bf16_down_combine(*args, check=False, **kwargs)


REQUIRE = [BF16_CVT, "fma.rn.f32"]


#: Launch configurations besides the default that the conformance matrix runs
#: (flint_moe/conformance/inputs/cases.py PATH_CONFIGS["bf16_decode"]), audited at the first gemv.AUDIT_SHAPES entry.
AUDIT_CONFIGS = ({"BH": 8, "UNROLL": 8},)


def audit_specs() -> list[str]:
    """Register the sm_90 PTX audit specialisations (every ``gemv.AUDIT_SHAPES`` entry, TAP off and on)."""
    sig = {"act_ptr": "*bf16", "ids_ptr": "*i32", "tw_ptr": "*fp32", "w_ptr": "*bf16", "map_ptr": "*i32",
        "shared_ptr": "*bf16", "out_ptr": "*bf16", "dacc_ptr": "*fp32", "y_ptr": "*bf16"}
    return gemv.register_gemv_audits(
        "bf16_down_combine", _bf16_down_combine_kernel, sig, DOWN_CONFIG, "BH", REQUIRE, AUDIT_CONFIGS
    )


audit_specs()
