"""Shared pieces of the BF16 decode kernel tests (interpreter and GPU): bitwise comparison, the replay of the
kernels' documented summation order, and random experts in the TRT-LLM BF16 layout."""

from __future__ import annotations

import torch

from flint_moe.layouts import pad_intermediate_bf16, to_trtllm_bf16, trtllm_bf16_row_maps
from flint_moe.reference.layouts import decode_trtllm_bf16


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def assert_same(kernel: torch.Tensor, golden: torch.Tensor, what: str) -> None:
    """Bitwise equality (on the CPU), except that NaN positions must match and NaN bits are not compared
    (rule "Special values")."""
    kernel, golden = kernel.cpu(), golden.cpu()
    assert kernel.dtype == golden.dtype and kernel.shape == golden.shape, what
    kn, gn = torch.isnan(kernel.float()), torch.isnan(golden.float())
    assert torch.equal(kn, gn), f"{what}: NaN positions differ"
    diff = (_bits(kernel) != _bits(golden)) & ~kn
    assert not bool(diff.any()), f"{what}: {int(diff.sum())} elements differ, first at {diff.nonzero()[0].tolist()}"


def replay_order(w: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The kernels' documented summation order (flint_moe/kernels/bf16/gemv.py), replayed in fp32 on the
    tensors' device.

    ``w`` fp32 [R, K] (bf16 values), ``v`` fp32 [K] (bf16 values) -> fp32 [R]. Lane l = h % 64 adds its
    terms in increasing h from +0 with fma; products of two bf16 values are exact in fp32 (asserted below for
    finite data: no underflow), so ``fma(w, v, p) == p + RN(w * v)`` and plain fp32 adds replay it. Then the
    neighbour-first pairwise tree over the 64 lanes.
    """
    prod = w * v
    fin = torch.isfinite(prod)
    exact = prod.double()[fin] == (w.double() * v.double())[fin]
    assert bool(exact.all()), "replay_order: a product is inexact in fp32 (underflow); pick other data"
    p = torch.zeros(w.shape[0], 64, dtype=torch.float32, device=w.device)
    for b in range(w.shape[1] // 64):
        p = p + prod[:, 64 * b : 64 * b + 64]
    while p.shape[1] > 1:
        p = p[:, 0::2] + p[:, 1::2]
    return p[:, 0]


def trtllm_experts(gen, e: int, h: int, i: int, pad_to: int | None, gate: tuple, up: tuple, w2_scale: float) -> dict:
    """Random [gate; up] and down experts (gate = randn * gate[0] + gate[1], up likewise, w2 = randn *
    ``w2_scale``, drawn from ``gen`` on its device in that order), padded to a multiple of ``pad_to`` when given,
    in the TRT-LLM BF16 layout: dict with ``E``, ``H``, ``I``, ``Ip``, ``g1``, ``g2``, ``maps`` (row maps),
    ``golden`` (the logical experts read back, I columns) and ``padded`` (the same with the Ip padded columns;
    ``golden`` itself when Ip = I)."""
    dev = gen.device
    w_gate = torch.randn(e, i, h, generator=gen, device=dev) * gate[0] + gate[1]
    w_up = torch.randn(e, i, h, generator=gen, device=dev) * up[0] + up[1]
    w13 = torch.cat([w_gate, w_up], dim=1).to(torch.bfloat16)
    del w_gate, w_up
    w2 = (torch.randn(e, h, i, generator=gen, device=dev) * w2_scale).to(torch.bfloat16)
    ip = i
    if pad_to is not None:
        w13, w2, ip = pad_intermediate_bf16(w13, w2, pad_to)
    g1, g2 = to_trtllm_bf16(w13, w2)
    del w13, w2
    golden = decode_trtllm_bf16(g1, g2, intermediate=i)
    return dict(
        E=e, H=h, I=i, Ip=ip, g1=g1, g2=g2, maps=trtllm_bf16_row_maps(h, ip, dev), golden=golden,
        padded=decode_trtllm_bf16(g1, g2) if ip != i else golden,
    )  # fmt: skip
