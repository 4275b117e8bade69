"""Grouped order replay (flint_moe.reference.orders_batched, reference.experts.replay_experts): for every
declared order form, the experts replayed together give bit for bit what one expert at a time gives
(``orders.replay_matmul``, itself checked against hand-derived fp32 orders in test_orders.py)."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels import orders as K
from flint_moe.reference import experts as X
from flint_moe.reference.mma import mma_bf16_f32
from flint_moe.reference.orders import OrderError, replay_matmul
from flint_moe.reference.orders_batched import is_chain_order, replay_matmuls

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def _bits(t: torch.Tensor) -> list:
    return t.view(torch.int32).flatten().tolist()


def _operands(n: int, k: int, ms, seed: int):
    g = torch.Generator().manual_seed(seed)
    ws = [E2M1[torch.randint(0, 16, (n, k), generator=g)] for _ in ms]
    sc = [torch.exp2(torch.randint(-6, 4, (n, k // 16), generator=g).float()) for _ in ms]
    xs = [
        (torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-20, 20, (m, 1), generator=g).float()))
        .to(torch.bfloat16)
        .float()
        for m in ms
    ]
    return xs, ws, sc


ORDERS = {
    "grouped BK64": (K.nvfp4_grouped_order(None, 256), True),
    "grouped BK128, K padded": (K.nvfp4_grouped_order({"BK": 128}, 208), True),
    "mma decode SK1": (K._mma_decode("nvfp4_gate_up", 1024, 1, 4), True),
    "mma decode SK2": (K._mma_decode("nvfp4_gate_up", 1024, 2, 4), True),
    "mma decode SK4": (K._mma_decode("nvfp4_gate_up", 1024, 4, 4), True),
    "mma decode SK2, short last part": (K._mma_decode("nvfp4_down", 704, 2, 4), True),
    "router GEMM": (K.router_order(96, 16), True),
    "cuda-core decode": (K._cuda_core_decode("g", 1024, {"BKB": 512, "num_warps": 2, "BN": 1}, "BN", 2), False),
    "lane chains": (K.bf16_gate_up_order(None, 128), False),
}


@pytest.mark.parametrize("name", sorted(ORDERS))
def test_grouped_equals_one_expert_at_a_time(name: str) -> None:
    order, chain = ORDERS[name]
    assert is_chain_order(order) is chain
    k = order["length"]
    blocks = k % 16 == 0 and order.get("operands", {}).get("w_dtype") != "bf16" or "mma decode" in name
    xs, ws, sc = _operands(24, k, [1, 3, 0, 2, 1], seed=len(name))
    got = replay_matmuls(order, xs, ws, block_scales=sc if blocks else None)
    for x, w, s, r in zip(xs, ws, sc, got, strict=True):
        assert r.shape == (x.shape[0], 24)
        if x.shape[0]:
            assert _bits(r) == _bits(replay_matmul(order, x, w, block_scales=s if blocks else None))


def test_injected_tensor_core_step_sees_broadcast_operands() -> None:
    order = K.nvfp4_grouped_order(None, 64)
    xs, ws, sc = _operands(8, 64, [2, 1], seed=3)
    shapes = []

    def step(acc, a, b, *, instruction):
        shapes.append((tuple(acc.shape), tuple(a.shape), tuple(b.shape), instruction))
        return mma_bf16_f32(acc, a, b, instruction=instruction)

    got = replay_matmuls(order, xs, ws, block_scales=sc, mma=step)
    assert shapes[0] == ((2, 2, 8), (2, 2, 8, 16), (2, 2, 8, 16), "wgmma.m64nNk16") and len(shapes) == 4
    for x, w, s, r in zip(xs, ws, sc, got, strict=True):
        assert _bits(r) == _bits(replay_matmul(order, x, w, block_scales=s))


def test_replay_experts_equals_the_single_expert_replay() -> None:
    """Against ``orders.replay_matmul`` on the dequantised weights (``dequant_nvfp4``: E2M1 x E4M3, exact in
    fp32) and on the BF16 weights, one expert at a time; the accumulate functions' ``replay`` is this too."""
    g = torch.Generator().manual_seed(1)
    n, k = 32, 256
    codes = [torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g) for _ in range(4)]
    scales = [torch.randint(0x20, 0x40, (n, k // 16), dtype=torch.uint8, generator=g) for _ in range(4)]
    xs = [torch.randn(m, k, generator=g).to(torch.bfloat16) for m in (1, 0, 3, 2)]
    for order in (K.nvfp4_grouped_order(None, k), K._mma_decode("g", k, 2, 4)):
        got = X.replay_experts(order, xs, codes, scales)
        for x, c, s, r in zip(xs, codes, scales, got, strict=True):
            if x.shape[0]:
                want = replay_matmul(order, x.float(), X.dequant_nvfp4(c, s))
                assert _bits(r) == _bits(want)
                assert _bits(X.gate_up_accumulate(x, c, s, order=order).replay) == _bits(want)
            else:
                assert r.shape == (0, n)
    w = [torch.randn(n, 96, generator=g).to(torch.bfloat16) for _ in range(3)]
    xb = [torch.randn(m, 96, generator=g).to(torch.bfloat16) for m in (2, 1, 3)]
    order = K.router_order(96, 16)
    for x, ww, r in zip(xb, w, X.replay_experts(order, xb, w), strict=True):
        assert _bits(r) == _bits(replay_matmul(order, x.float(), ww.float()))
    lanes = K.router_order(96, 1)  # the router GEMV: 128 lanes, K padded to 128
    for x, ww, r in zip(xb, w, X.replay_experts(lanes, xb, w), strict=True):
        assert _bits(r) == _bits(replay_matmul(lanes, x.float(), ww.float()))
        assert _bits(X.gate_up_accumulate_bf16(x, ww, order=lanes).replay) == _bits(r)
    with pytest.raises(ValueError, match="one entry per expert, got 3, 2, None"):
        X.replay_experts(order, xb, w[:2])
    with pytest.raises(TypeError, match=r"weights\[1\]"):
        X.replay_experts(order, xb, [w[0], w[1].float(), w[2]])


def test_bad_lists_are_refused() -> None:
    order = K.nvfp4_grouped_order(None, 64)
    xs, ws, _ = _operands(8, 64, [1, 1], seed=5)
    with pytest.raises(OrderError, match="one entry per expert"):
        replay_matmuls(order, xs, ws[:1])
    with pytest.raises(OrderError, match=r"ws\[1\]: expected a 2-d tensor \[rows, 64\]"):
        replay_matmuls(order, xs, [ws[0], ws[1][:, :32]])
    with pytest.raises(OrderError, match="same row count"):
        replay_matmuls(order, xs, [ws[0], ws[1][:4]])
    with pytest.raises(OrderError, match="block_scales"):
        replay_matmuls(order, xs, ws, block_scales=[None])
    with pytest.raises(OrderError, match="not exactly representable"):
        replay_matmuls(order, [xs[0] + 1e-3, xs[1]], ws)
