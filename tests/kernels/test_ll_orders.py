"""The declared orders of the decode block's CuTe expert kernels (flint_moe/kernels/orders.py
``ll_expert_order``, ``ll_block_orders``, ``ll_block_extra_orders``) replayed by the golden model against a
straightforward emulation of the kernel's loops (K-splits, 32 lanes each chaining its blocks' 16 elements by
fma, the xor butterfly with lane 0's value stored, the split partials added from split 0), bit for bit, on
random rows and on hand-built rows whose value changes with the lane tree's shape or the split count."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flint_moe.kernels.orders import ll_block_extra_orders, ll_block_orders, ll_expert_order, ll_router_orders
from flint_moe.reference.orders import OrderError, check_order, replay_dot

BACKEND = "any"


def _fma(a, b, c) -> np.float32:
    # exact in float64 for the data below (few significant bits, exponents within 2^-12 .. 2^30): one rounding
    return np.float32(float(a) * float(b) + float(c))


def emulate(x: np.ndarray, w: np.ndarray, K: int, valid: int, S: int) -> np.float32:  # noqa: N803
    """The ``partial`` kernel's loops for one row, then ``finish``'s split sum, in fp32 (module docstring)."""
    bps = -(-(K // 16) // S)  # blocks per split, the last split may hold fewer
    partials = []
    for s in range(S):
        lanes = []
        for lane in range(32):
            acc = np.float32(0.0)
            for j in range(-(-bps // 32)):
                blk = s * bps + j * 32 + lane
                if j * 32 + lane >= bps or blk * 16 >= valid:
                    continue
                for e in range(16):
                    acc = _fma(x[blk * 16 + e], w[blk * 16 + e], acc)
            lanes.append(acc)
        for off in (16, 8, 4, 2, 1):  # shfl.sync.bfly: lane l adds lane l ^ off's value
            lanes = [np.float32(float(lanes[lane]) + float(lanes[lane ^ off])) for lane in range(32)]
        assert len({float(v) for v in lanes}) == 1  # every lane holds the same value; lane 0's is stored
        partials.append(lanes[0])
    total = partials[0]
    for p in partials[1:]:
        total = np.float32(float(total) + float(p))
    return total


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.choice([1.0, 1.5, -1.0, 2.0**12, -(2.0**12), 1.5 * 2.0**-10, 3.0], size=n)  # bf16 values
    w = rng.choice([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], size=n) * rng.choice([1.0, -1.0, 16.0, -16.0], size=n)
    return x.astype(np.float32), w.astype(np.float32)


@pytest.mark.parametrize(("K", "valid", "S"), [(1024, 1024, 2), (2048, 2048, 4), (1536, 1536, 1), (1024, 448, 2),
                                               (2048, 1280, 2), (1408, 1408, 1), (5120, 5120, 3), (1408, 1120, 3),
                                               (320, 288, 1), (1152, 1152, 2)])  # fmt: skip
def test_declared_order_is_the_kernels(K: int, valid: int, S: int) -> None:  # noqa: N803
    x, w = _data(valid, K + valid + S)
    order = ll_expert_order("ll_down", K, valid, S)
    got = replay_dot(order, torch.from_numpy(w), torch.from_numpy(x)).item()
    assert got == float(emulate(x, w, K, valid, S))


def _one_hot(K: int, values: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:  # noqa: N803
    x, w = np.zeros(K, dtype=np.float32), np.ones(K, dtype=np.float32)
    for h, v in values.items():
        x[h] = v
    return x, w


def _replay(order, x, w) -> float:
    return replay_dot(check_order(order), torch.from_numpy(w), torch.from_numpy(x)).item()


def test_hand_built_rows_tell_the_orders_apart() -> None:
    # lane values v0 = 2^24 (block 0), v1 = 1 (block 1), v16 = -2^24 (block 16), one split: the butterfly adds
    # v0 + v16 = 0 first (total 1); an adjacent-pair tree adds v0 + v1 = 2^24 (tie to even) first (total 0)
    x, w = _one_hot(512, {0: 2.0**24, 16: 1.0, 256: -(2.0**24)})
    order = ll_expert_order("k", 512, 512, 1)
    assert _replay(order, x, w) == float(emulate(x, w, 512, 512, 1)) == 1.0
    adj = {**order, "program": [order["program"][0], {**order["program"][1], "shape": "adjacent"}]}
    assert _replay(adj, x, w) == 0.0
    # two splits: split 0 holds 2^24 (lane 0) and 1 (lane 1): 2^24 after its tree; split 1 holds -2^24: total 0.
    # One split: lane 0 chains blocks 0 and 32 (2^24 - 2^24 = 0), lane 1 holds 1: total 1
    x, w = _one_hot(1024, {0: 2.0**24, 16: 1.0, 512: -(2.0**24)})
    assert _replay(ll_expert_order("k", 1024, 1024, 2), x, w) == float(emulate(x, w, 1024, 1024, 2)) == 0.0
    assert _replay(ll_expert_order("k", 1024, 1024, 1), x, w) == float(emulate(x, w, 1024, 1024, 1)) == 1.0


def test_parts_beyond_the_valid_length_are_dropped() -> None:
    o = ll_expert_order("ll_down", 1024, 448, 2)  # split 1 covers columns 512..1023: all padding
    assert o["length"] == 448 and o["parts"] == [[0, 448]] and o["part_length"] == 512
    assert [st["op"] for st in o["program"]] == ["fma_chain", "tree"]
    o = ll_expert_order("ll_down", 2048, 1280, 2)
    assert o["parts"] == [[0, 1024], [1024, 1280]] and o["axes"] == [["j", 2], ["lane", 32], ["e", 16]]
    assert o["program"][-1] == {"op": "add_chain", "axis": "part", "init": "first"}


def test_limits() -> None:
    with pytest.raises(OrderError, match=r"splits S = 65 must be an int in \[1, K / 16 = 64\]"):
        ll_expert_order("k", 1024, 1024, 65)
    with pytest.raises(OrderError, match=r"reduction length must be a positive int multiple of 16, got 1000"):
        ll_expert_order("k", 1000, 992, 1)
    with pytest.raises(OrderError, match=r"valid length 1040 exceeds K = 1024"):
        ll_expert_order("k", 1024, 1040, 1)
    with pytest.raises(ValueError, match=r"hidden size H = 2312 must be a positive multiple of 16"):
        ll_block_orders(2312, 512, 512)


def test_block_orders_follow_the_ops_splits() -> None:
    o = ll_block_orders(2048, 384, 512, Ip=512, top_k=4, E=8)  # gate/up S = 4 (1024 CTAs), down S = 1
    assert set(o) == {"router", "gate_up", "down"}
    assert o["router"] == ll_router_orders(2048)["router"]
    assert o["gate_up"] == ll_expert_order("ll_gate_up", 2048, 2048, 4)
    assert o["down"] == ll_expert_order("ll_down", 512, 384, 1)
    x = ll_block_extra_orders(2048, 384, 512, Ip=512)
    assert set(x) == {"sumsq", "shared_gate_up", "shared_down"}
    assert x["sumsq"] == ll_router_orders(2048)["sumsq"]
    assert x["shared_gate_up"] == ll_expert_order("ll_shared_gate_up", 2048, 2048, 4)
    assert x["shared_down"] == ll_expert_order("ll_shared_down", 512, 512, 1)
    d = ll_block_orders(7168, 2048, 2048)
    assert len(d["gate_up"]["parts"]) == 1 and d["down"]["length"] == 2048
    # GLM-4.5-Air's I = 1408 (88 blocks): one split, 3 lane steps, the last with 24 lanes
    d = ll_block_orders(4096, 1408, 1408)
    assert d["down"]["parts"] == [[0, 1408]] and d["down"]["axes"] == [["j", 3], ["lane", 32], ["e", 16]]
