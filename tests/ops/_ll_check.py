"""Golden-model checks of the decode block op ``flint_moe_ll`` (shared by its GPU tests).

Weights: random NVFP4 routed experts in ``FlintMoEWeights`` (``tests.kernels._nvfp4_check.make_weights``) and
a shared expert as two FlashInfer-prepared linears (row-major codes, scales swizzled by the layout code), bound
into ``LLMoEWeights``. The golden side reads them back through its independent decoders
(``reference.layouts.experts_from_cutedsl``, ``unswizzle_scales``).

``check_block`` uses teacher forcing: every order-free stage is recomputed by the golden model from the op's
own taps of the stage before and compared bit for bit; every fp32 accumulator must equal the golden replay
of its declared order (``kernels.orders.ll_block_orders`` / ``ll_block_extra_orders``) on the tapped
operands, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint_moe.kernels.orders import ll_block_extra_orders, ll_block_orders
from flint_moe.layouts import swizzle_block_scales
from flint_moe.layouts.ll_weights import LLMoEWeights
from flint_moe.reference.combine import add_shared, combine_fp32
from flint_moe.reference.decode_block import eps_fp32, residual_add, rmsnorm_apply
from flint_moe.reference.experts import apply_global_scale, down_output, replay_experts, swiglu
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.layouts import experts_from_cutedsl, unswizzle_scales
from flint_moe.reference.orders import replay_dot
from flint_moe.reference.weights import NVFP4Experts, NVFP4Linear
from tests.kernels._nvfp4_check import make_weights, same
from tests.kernels._router_check import check_route

FP8 = torch.float8_e4m3fn
EPS = 1e-6


@dataclass(frozen=True)
class Block:
    """A layer's weights for the op (``w``) and for the golden model (``experts``, ``shared_w13``,
    ``shared_w2``), plus its shapes."""

    w: LLMoEWeights
    experts: NVFP4Experts
    shared_w13: NVFP4Linear
    shared_w2: NVFP4Linear
    top_k: int
    inter: int
    padded_inter: int
    shared_inter: int


def _scales(shape, g: torch.Generator) -> torch.Tensor:
    b = torch.randint(50, 64, shape, generator=g) & 0x7F
    sign = torch.randint(0, 2, shape, generator=g) << 7
    return (b | sign).to(torch.uint8).view(FP8)


def _linear(n: int, k: int, g: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    swizzled = swizzle_block_scales(_scales((n, k // 16), g)[None])[0]  # [n, k / 16]: no padding
    gs = torch.tensor(float(torch.rand((), generator=g)) * 2.0**-6 + 2.0**-8, dtype=torch.float32)
    return codes.to(device), swizzled.view(torch.uint8).to(device), gs.to(device)


def make_block(E, H, I, SI, k, *, pad_to=None, seed=0, device="cuda") -> Block:  # noqa: E741, N803
    """Random weights of one layer (E experts, hidden H, intermediate I stored padded to ``pad_to``, shared
    SI, top_k ``k``) on ``device``."""
    g = torch.Generator().manual_seed(seed + 77)
    ex = make_weights(E, H, I, seed=seed, pad_to=pad_to, device=device)
    router = (torch.randn(E, H, generator=g) * 0.05).to(torch.bfloat16).to(device)
    c13, s13, g13 = _linear(2 * SI, H, g, device)
    c2, s2, g2 = _linear(H, SI, g, device)
    w = LLMoEWeights(router, ex, c13, s13, g13, c2, s2, g2)
    lin13 = NVFP4Linear(c13, unswizzle_scales(s13[None], 2 * SI, H // 16)[0], g13)
    lin2 = NVFP4Linear(c2, unswizzle_scales(s2[None], H, SI // 16)[0], g2)
    return Block(w, experts_from_cutedsl(ex), lin13, lin2, k, I, ex.intermediate_size, SI)


def make_block_inputs(M: int, H: int, *, seed: int = 0, device="cuda"):
    """attn_out, residual bf16 [M, H], ln_weight bf16 [H]."""
    g = torch.Generator().manual_seed(seed + 5)
    attn = torch.randn(M, H, generator=g).to(torch.bfloat16)
    res = (torch.randn(M, H, generator=g) * 4).to(torch.bfloat16)
    lnw = (torch.rand(H, generator=g) * 1.5 + 0.25).to(torch.bfloat16)
    return attn.to(device), res.to(device), lnw.to(device)


def _replay(order: dict, x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 [m, N]: the declared order replayed on bf16 ``x`` [m, K] and the NVFP4 weight [N, K]."""
    return replay_experts(order, [x], [codes], [scale])[0]


def check_block(b: Block, attn, res, lnw, taps: dict, out: torch.Tensor, residual_out: torch.Tensor) -> None:
    """Assert every stage of the op's ``taps`` against the golden model (module docstring)."""
    w, k, I, SI = b.w, b.top_k, b.inter, b.shared_inter  # noqa: E741, N806
    H = w.hidden_size  # noqa: N806
    M = attn.shape[0]  # noqa: N806
    t = taps
    o = ll_block_orders(H, I, SI, Ip=b.padded_inter, top_k=k, E=w.num_experts)
    x = ll_block_extra_orders(H, I, SI, Ip=b.padded_inter, top_k=k, E=w.num_experts)
    # step 11
    s = residual_add(attn, res)
    assert same(residual_out, to_bf16(s)) and same(t["residual_out"], residual_out), "residual_out"
    assert same(t["sumsq"], replay_dot(x["sumsq"], s, s)), "sumsq: declared order not followed"
    assert same(t["xn"], rmsnorm_apply(s, t["sumsq"], lnw, eps_fp32(EPS))), "xn != golden RMSNorm of the taps"
    xn = t["xn"]
    # steps 1-4
    acc = replay_dot(o["router"], w.router_weight.float(), xn.float()[:, None, :])
    assert same(t["router_acc"], acc), "router_acc: declared order not followed"
    check_route(xn, w.router_weight, k, t["ids"], t["weights"], t)
    ids, tw = t["ids"], t["weights"]
    ex = b.experts
    # routed steps 5-8, per pair
    for m in range(M):
        for j in range(k):
            e = int(ids[m, j])
            gu = _replay(o["gate_up"], xn[m : m + 1], ex.w13[e], ex.w13_scale[e])[0]
            assert same(t["gate_acc"][m, j], gu[:I]), f"gate_acc (token {m}, slot {j}): declared order not followed"
            assert same(t["up_acc"][m, j], gu[I:]), f"up_acc (token {m}, slot {j}): declared order not followed"
            gs1, gs2 = ex.w13_gs[e : e + 1], ex.w2_gs[e : e + 1]
            act = swiglu(apply_global_scale(t["gate_acc"][m, j], gs1), apply_global_scale(t["up_acc"][m, j], gs1))
            assert same(t["act"][m, j], act), f"act (token {m}, slot {j}) != golden SwiGLU of the taps"
            dn = _replay(o["down"], t["act"][m, j][None].contiguous(), ex.w2[e], ex.w2_scale[e])[0]
            assert same(t["down_acc"][m, j], dn), f"down_acc (token {m}, slot {j}): declared order not followed"
            assert same(t["y"][m, j], down_output(t["down_acc"][m, j], gs2)), f"y (token {m}, slot {j})"
    # shared expert steps 5-8
    sh13, sh2 = b.shared_w13, b.shared_w2
    sgu = _replay(x["shared_gate_up"], xn, sh13.codes, sh13.block_scale)
    assert same(t["shared_gate_acc"], sgu[:, :SI]), "shared_gate_acc: declared order not followed"
    assert same(t["shared_up_acc"], sgu[:, SI:]), "shared_up_acc: declared order not followed"
    sg = apply_global_scale(t["shared_gate_acc"], sh13.global_scale)
    su = apply_global_scale(t["shared_up_acc"], sh13.global_scale)
    assert same(t["shared_act"], swiglu(sg, su)), "shared_act != golden SwiGLU of the taps"
    sdn = _replay(x["shared_down"], t["shared_act"], sh2.codes, sh2.block_scale)
    assert same(t["shared_down_acc"], sdn), "shared_down_acc: declared order not followed"
    assert same(t["shared_y"], down_output(t["shared_down_acc"], sh2.global_scale)), "shared_y"
    # steps 9-10
    routed = to_bf16(combine_fp32(tw, t["y"]))
    assert same(t["out"], out) and same(out, add_shared(routed, t["shared_y"])), "out != golden combine of the taps"
