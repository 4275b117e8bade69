"""The low-latency decode block's first kernel: residual add + RMSNorm (rule step 11) fused with the router
GEMV and top-k (steps 1-4).

``_ll_router_kernel``, grid (M, NP) with NP = ceil(E / EB), the router GEMV kernel's grid
(``flint_moe.kernels.router``): program (t, p) of token t

1. reads the token's ``attn_out`` and ``residual`` rows (bf16 [H] each), forms ``s_h = RN(a_h + r_h)`` (fp32)
   and its sum of squares (order below), then ``inv = rsqrt.approx.ftz.f32(RN(div_rn(sumsq, H) + eps))``
   with ``eps`` fp32 (``rsqrt_approx_ftz`` of ``kernels/_rule.py``);
2. in a second pass over H computes ``xn_h = bf16(RN(RN(s_h * inv) * w_ln_h))`` chunk by chunk and feeds it
   straight into the router sums of experts [p*EB, p*EB + EB) (the router kernel's lane order, below);
   program (t, 0) also stores ``residual_out = bf16(s)`` and ``xn`` (what the expert kernels read);
3. ends as the router GEMV kernel ends (``router._logits_then_last_topk``): bf16 logits, a ticket from the
   token's counter (``make_route_counter``; same protocol, a counter may be shared with ``route``), and the
   program with the token's last ticket runs the top-k and renormalisation (``router._topk_row``).

Every program of a token computes ``s``, the sum of squares, ``inv`` and ``xn`` itself, by the same
instructions in the same order, so they all hold the same bits; nothing is exchanged between programs
before the top-k. Each program reads the two rows twice and ln_weight once (10 H bytes, mostly from L2); the
router weight, E x H x 2 bytes, is read once in all.

Summation orders (the only order-dependent values):
- Sum of squares (tap ``sumsq``, fp32 [M]), with BH = BLOCK_H lanes and C = ceil(H / BH) chunks: lane j holds
      q_j = fma(s_{j+(C-1)BH}, s_{j+(C-1)BH}, ... fma(s_{j+BH}, s_{j+BH}, fma(s_j, s_j, +0)) ...)
  (sequential over chunks; ``s_h = +0`` for the padding h >= H), one ``fma.rn.f32`` per step on the GPU.
  Triton's interpreter evaluates ``tl.fma`` as an fp32 multiply then an fp32 add (two roundings); ``s_h^2``
  is not exact in fp32, so CPU and GPU values may differ in the last bits (both are checked against the
  golden model's bound; the CPU tests also replay the interpreter's order exactly). The BH lane values are
  then combined by the router's balanced pairwise tree over adjacent lanes (``router._lane_tree``), log2(BH)
  levels of one fp32 RN addition each.
- Router sums (tap ``router_acc``, fp32 [M, E]): exactly the router GEMV kernel's order (its module
  docstring) with ``x = xn``: per lane sequential ``fma`` over chunks of BH (bf16 x bf16 products, exact in
  fp32 unless they underflow), then the same pairwise tree.

Taps (``taps`` dict -> TAP=True build, which only adds the ``sumsq`` and ``router_acc`` stores):
``residual_out`` bf16 [M, H], ``sumsq`` fp32 [M], ``xn`` bf16 [M, H], ``router_acc`` fp32 [M, E], ``logits``
bf16 [M, E], ``ids`` int32 [M, k], ``weights`` fp32 [M, k] (bf16 values).

Limits: the router GEMV kernel's (1 <= k <= min(E, 16), E <= 32768), H < 2^24, M <= ``ROUTE_GEMV_MAX_TOKENS``
(the counter's length).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import gdc_wait, launch_options
from flint_moe.kernels._rule import bf16_rn, div_rn, rsqrt_approx_ftz
from flint_moe.kernels.audit.registry import BF16_CVT, DEFAULT_FORBID, EXPF_LIBDEVICE, register_audit
from flint_moe.kernels.router import _lane_tree, _logits_then_last_topk, router_config

__all__ = ["LL_ROUTER_TAPS", "launch_ll_router", "ll_router_config", "audit_specs"]

#: Tap names filled by :func:`launch_ll_router` with ``taps``.
LL_ROUTER_TAPS = ("residual_out", "sumsq", "xn", "router_acc", "logits", "ids", "weights")
_NUM_WARPS = 4


@triton.jit
def _residual_sum(a_row, r_row, hh, hmask):
    """Rule step 11's ``s = RN(a + r)`` (fp32) of one chunk (+0 at the masked lanes); both passes call it."""
    a = tl.load(a_row + hh, mask=hmask, other=0.0).to(tl.float32)
    r = tl.load(r_row + hh, mask=hmask, other=0.0).to(tl.float32)
    return a + r


@triton.jit
def _ll_router_kernel(
    attn_ptr,  # bf16 [M, H]
    res_ptr,  # bf16 [M, H]
    lnw_ptr,  # bf16 [H]
    res_out_ptr,  # bf16 [M, H]: residual_out = bf16(s), written by program (t, 0)
    xn_ptr,  # bf16 [M, H]: the normalised input, written by program (t, 0)
    w_ptr,  # bf16 [E, H]
    logits_ptr,  # bf16 [M, E] (workspace; the `logits` tap)
    ids_ptr,  # int32 [M, TOPK]
    tw_ptr,  # fp32 [M, TOPK]
    counter_ptr,  # int32 [>= M]
    acc_ptr,  # fp32 [M, E] (router_acc tap; written only when TAP)
    sumsq_ptr,  # fp32 [M] (sumsq tap; written only when TAP)
    eps,  # fp32 (an fp32 value)
    E,
    H: tl.constexpr,
    EB: tl.constexpr,
    BLOCK_H: tl.constexpr,
    LOG_BH: tl.constexpr,
    EP2: tl.constexpr,
    IDXB: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,
    TAP: tl.constexpr,
):
    """Step 11 on token t = program_id(0)'s row, then the router sums of experts [p*EB, +EB), p =
    program_id(1), and the token's top-k in its last program (module docstring: orders, counter)."""
    t = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    NP = tl.num_programs(1)
    gdc_wait()
    offs_h = tl.arange(0, BLOCK_H)
    a_row = attn_ptr + t * H
    r_row = res_ptr + t * H
    # pass 1: sum of squares of s = RN(a + r), lane-sequential fma, then the pairwise tree
    q = tl.full([BLOCK_H], 0.0, tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hh = h0 + offs_h
        hmask = hh < H
        sv = _residual_sum(a_row, r_row, hh, hmask)
        q = tl.fma(sv, sv, q)
    sumsq = _lane_tree(tl.reshape(q, [1, BLOCK_H]), 1, LOG_BH)  # fp32 [1]
    hv = tl.full([1], H, tl.float32)  # exact: H < 2^24
    inv = rsqrt_approx_ftz(div_rn(sumsq, hv) + eps)  # fp32 [1]
    if TAP:
        if p == 0:
            tl.store(sumsq_ptr + t + tl.arange(0, 1), sumsq)
    # pass 2: xn chunk by chunk, straight into the router sums
    offs_e = p * EB + tl.arange(0, EB)
    emask = offs_e < E
    w_rows = w_ptr + offs_e.to(tl.int64)[:, None] * H
    acc = tl.full([EB, BLOCK_H], 0.0, tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hh = h0 + offs_h
        hmask = hh < H
        sv = _residual_sum(a_row, r_row, hh, hmask)
        lw = tl.load(lnw_ptr + hh, mask=hmask, other=0.0).to(tl.float32)
        xn = bf16_rn((sv * inv) * lw)
        if p == 0:
            tl.store(res_out_ptr + t * H + hh, bf16_rn(sv), mask=hmask)
            tl.store(xn_ptr + t * H + hh, xn, mask=hmask)
        wv = tl.load(w_rows + hh[None, :], mask=emask[:, None] & hmask[None, :], other=0.0).to(tl.float32)
        acc += wv * xn.to(tl.float32)[None, :]
    sums = _lane_tree(acc, EB, LOG_BH)
    _logits_then_last_topk(
        sums, offs_e, emask, t, NP, E, logits_ptr, ids_ptr, tw_ptr, counter_ptr, acc_ptr, EP2, IDXB, TOPK, TOPK_P2, TAP
    )


def ll_router_config(num_experts: int, hidden: int, top_k: int) -> dict[str, int]:
    """Compile-time parameters for (E, H, k): the router GEMV kernel's (``router.router_config``: EB, BLOCK_H,
    LOG_BH, EP2, IDXB, TOPK_P2), so both kernels sum the router logits in the same order."""
    return router_config(num_experts, hidden, top_k)


def launch_ll_router(
    attn_out: torch.Tensor, residual: torch.Tensor, ln_weight: torch.Tensor, eps: float, router_weight: torch.Tensor,
    top_k: int, counter: torch.Tensor, *, taps: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Residual add + RMSNorm + router GEMV + top-k in one launch.

    Args: ``attn_out``, ``residual`` bf16 [M, H] contiguous (only read); ``ln_weight`` bf16 [H]; ``eps`` a
    Python float holding an fp32 value (``reference.decode_block.eps_fp32``); ``router_weight`` bf16 [E, H]
    contiguous; ``top_k`` in [1, min(E, 16)]; ``counter`` int32 [>= M] from ``make_route_counter``. Inputs are
    assumed valid (the op checks them).

    Returns ``(ids int32 [M, k], weights fp32 [M, k] (bf16 values), xn bf16 [M, H], residual_out bf16 [M,
    H])``, new tensors. With ``taps``: fills :data:`LL_ROUTER_TAPS` (module docstring).
    """
    m, h = attn_out.shape
    e = router_weight.shape[0]
    dev = attn_out.device
    cfg = ll_router_config(e, h, top_k)
    ids = torch.empty((m, top_k), dtype=torch.int32, device=dev)
    tw = torch.empty((m, top_k), dtype=torch.float32, device=dev)
    xn = torch.empty((m, h), dtype=torch.bfloat16, device=dev)
    res_out = torch.empty((m, h), dtype=torch.bfloat16, device=dev)
    logits = torch.empty((m, e), dtype=torch.bfloat16, device=dev)
    tap = taps is not None
    acc = torch.empty((m, e), dtype=torch.float32, device=dev) if tap else logits
    sumsq = torch.empty((m,), dtype=torch.float32, device=dev) if tap else logits
    if m:
        grid = (m, triton.cdiv(e, cfg["EB"]))
        _ll_router_kernel[grid](
            attn_out, residual, ln_weight, res_out, xn, router_weight, logits, ids, tw, counter, acc, sumsq,
            float(eps), e, H=h, TOPK=top_k, TAP=tap, num_warps=_NUM_WARPS, **cfg, **launch_options(),
        )  # fmt: skip
    if tap:
        taps.update(residual_out=res_out, sumsq=sumsq, xn=xn, router_acc=acc, logits=logits, ids=ids, weights=tw)
    return ids, tw, xn, res_out


# ---------------------------------------------------------------------------------------------------------
# sm_90 PTX audit: the block's shapes with a shared expert (DeepSeek-V3, Kimi-K2, GLM-4.5, Ling-mini-2.0)
# ---------------------------------------------------------------------------------------------------------

#: (name, E, H, k). The TAP build is audited for the first shape only (it differs by two stores).
AUDIT_SHAPES = (
    ("E256_H7168_k8", 256, 7168, 8),
    ("E384_H7168_k8", 384, 7168, 8),
    ("E160_H5120_k8", 160, 5120, 8),
    ("E256_H2048_k8", 256, 2048, 8),
)

_REQUIRE = [
    BF16_CVT, "rsqrt.approx.ftz.f32", "div.rn.f32", *EXPF_LIBDEVICE, "griddepcontrol.wait",
    "griddepcontrol.launch_dependents", "atom.global.gpu.acq_rel.add", "fma.rn.f32",
]  # fmt: skip
#: Beyond the default (div.full.f32, fp64): a non-approximate or non-ftz square root / reciprocal square root
#: would mean the rule's rsqrt.approx.ftz.f32 was replaced.
_FORBID = [*DEFAULT_FORBID, r"re:\bsqrt\.", r"re:\brsqrt\.approx\.f32\b"]


def audit_specs() -> None:
    """Register the block router's specialisations of AUDIT_SHAPES (production; TAP for the first)."""
    for i, (name, e, h, k) in enumerate(AUDIT_SHAPES):
        cfg = ll_router_config(e, h, k)
        for tap in (False, True) if i == 0 else (False,):
            register_audit(
                f"ll_router.{name}" + ("_tap" if tap else ""),
                _ll_router_kernel,
                {
                    "attn_ptr": "*bf16",
                    "res_ptr": "*bf16",
                    "lnw_ptr": "*bf16",
                    "res_out_ptr": "*bf16",
                    "xn_ptr": "*bf16",
                    "w_ptr": "*bf16",
                    "logits_ptr": "*bf16",
                    "ids_ptr": "*i32",
                    "tw_ptr": "*fp32",
                    "counter_ptr": "*i32",
                    "acc_ptr": "*fp32" if tap else "*bf16",
                    "sumsq_ptr": "*fp32" if tap else "*bf16",
                    "eps": "fp32",
                    "E": "i32",
                },  # fmt: skip
                {**cfg, "H": h, "TOPK": k, "TAP": tap},
                _REQUIRE,
                _FORBID,
                options={"num_warps": _NUM_WARPS},
            )


audit_specs()
