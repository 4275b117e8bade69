"""Router GEMM for many tokens (rule step 1 for M > ``ROUTE_GEMV_MAX_TOKENS``): fp32 sums ``x . Wr^T`` on the
tensor cores, in one declared order.

``launch_router_gemm(x, router_weight) -> fp32 [M, E]``; ``flint_moe.ops.route`` feeds the result to the top-k
kernel (``flint_moe.kernels.router._topk_kernel``), which rounds it to bf16 (the rest of step 1) and runs steps
2-4. bf16 x bf16 products are exact in fp32, so the only freedom of step 1 is the summation, and this kernel
fixes it (a library fp32 GEMM sums in an order that it neither documents nor keeps across shapes).

Program (i, j) of the grid ``(cdiv(M, BM), cdiv(E, BE))`` owns the tile of tokens ``[i*BM, i*BM + BM)`` and
experts ``[j*BE, j*BE + BE)``. Summation order of one sum (token t, expert e), declared as data by
``flint_moe.kernels.orders.router_order``: the K axis (H, zero-padded up to a multiple of ``BK``) is walked in
steps of ``BK`` elements in increasing order; each step is one ``tl.dot`` that the sm_90 backend lowers to
``BK / 16`` chained ``wgmma.mma_async ... m64nNk16.f32.bf16.bf16`` instructions in increasing k, each adding 16
exact products to the fp32 accumulator (from +0) with the tensor core's truncating alignment
(``flint_moe.reference.mma``). Masked rows (t >= M), experts (e >= E) and the padded K tail load exact zeros.

Interpreter (``TRITON_INTERPRET=1``): the bf16 ``tl.dot`` of Triton 3.6's interpreter multiplies bit patterns, so
the operands are widened to fp32 (exactly) and the dot is numpy's fp32 matmul: right values up to the summation
order, which the CPU judges by the golden model's any-order bound only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flint_moe.kernels._launch import INTERPRET, gdc_launch_dependents, gdc_wait, launch_options
from flint_moe.kernels.audit.registry import register_audit

__all__ = ["ROUTER_GEMM_CONFIG", "launch_router_gemm", "audit_specs"]

_INTERPRET = tl.constexpr(INTERPRET)

#: Launch configuration: BM tokens x BE experts per program, BK elements of H per K step, num_warps. Only BK
#: (the K step, a multiple of 16) takes part in the summation order; BM, BE and num_warps change no bit.
ROUTER_GEMM_CONFIG = {"BM": 64, "BE": 64, "BK": 64, "num_warps": 4}


@triton.jit
def _router_gemm_kernel(
    x_ptr,  # bf16 [M, H]
    w_ptr,  # bf16 [E, H]
    acc_ptr,  # fp32 [M, E] (out)
    M,
    E,
    H: tl.constexpr,
    BM: tl.constexpr,
    BE: tl.constexpr,
    BK: tl.constexpr,
):
    """acc[t, e] = sum_h x[t, h] * Wr[e, h]: K steps of BK in increasing order, one ``tl.dot`` each (module
    docstring: the summation order)."""
    gdc_wait()
    gdc_launch_dependents()
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    re = tl.program_id(1) * BE + tl.arange(0, BE)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    e_ok = re < E
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * H
    w_cols = w_ptr + re.to(tl.int64)[None, :] * H
    acc = tl.zeros([BM, BE], dtype=tl.float32)
    for k0 in range(0, H, BK):
        kk = k0 + rk
        k_ok = kk < H
        a = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)  # [BM, BK]
        b = tl.load(w_cols + kk[:, None], mask=k_ok[:, None] & e_ok[None, :], other=0.0)  # [BK, BE]
        if _INTERPRET:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    out = acc_ptr + rm.to(tl.int64)[:, None] * E + re[None, :]
    tl.store(out, acc, mask=m_ok[:, None] & e_ok[None, :])


def _block_e(e: int, be: int) -> int:
    """Experts per program: BE, or the next power of two >= E (at least 16, the dot's smallest N) if smaller."""
    return max(16, min(be, triton.next_power_of_2(e)))


def launch_router_gemm(x: torch.Tensor, router_weight: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """fp32 router sums of x bf16 [M, H] and router_weight bf16 [E, H] (contiguous, same CUDA device, or CPU
    under ``TRITON_INTERPRET=1``) -> a new fp32 [M, E]. Inputs are assumed valid (``flint_moe.ops.route`` checks
    them) and never modified. ``config``: overrides of :data:`ROUTER_GEMM_CONFIG`."""
    cfg = {**ROUTER_GEMM_CONFIG, **(config or {})}
    m, h = x.shape
    e = router_weight.shape[0]
    acc = torch.empty((m, e), dtype=torch.float32, device=x.device)
    if m and e:
        be = _block_e(e, cfg["BE"])
        grid = (triton.cdiv(m, cfg["BM"]), triton.cdiv(e, be))
        _router_gemm_kernel[grid](
            x, router_weight, acc, m, e,
            H=h, BM=cfg["BM"], BE=be, BK=cfg["BK"], num_warps=cfg["num_warps"], **launch_options(),
        )  # fmt: skip
    return acc


#: (name, E, H) audited: DeepSeek-V3 / Kimi-K2 (E 256 / 384, H 7168), Qwen3-Next (E 512, H 2048), gpt-oss (E 128,
#: H 2880), Mixtral (E 8, H 4096: the smallest expert tile).
AUDIT_SHAPES = (("E256_H7168", 256, 7168), ("E512_H2048", 512, 2048), ("E128_H2880", 128, 2880), ("E8_H4096", 8, 4096))


def audit_specs() -> None:
    """Register the router GEMM specialisations of AUDIT_SHAPES: wgmma present (tensor cores), PDL wait."""
    cfg = ROUTER_GEMM_CONFIG
    for name, e, h in AUDIT_SHAPES:
        register_audit(
            f"router_gemm.{name}",
            _router_gemm_kernel,
            {"x_ptr": "*bf16", "w_ptr": "*bf16", "acc_ptr": "*fp32", "M": "i32", "E": "i32"},
            {"H": h, "BM": cfg["BM"], "BE": _block_e(e, cfg["BE"]), "BK": cfg["BK"]},
            ["wgmma.mma_async", "griddepcontrol.wait"],
            options={"num_warps": cfg["num_warps"]},
        )


audit_specs()
