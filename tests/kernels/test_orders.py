"""Summation-order declarations of the kernels (flint_moe.kernels.orders): valid for every configuration and
shape the harness uses, and the hand-derived facts of the sm_90 builds they encode."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from flint_moe.conformance.inputs.cases import PATH_CONFIGS, SHAPES
from flint_moe.conformance.run.paths import kernel_configs
from flint_moe.kernels import orders as K
from flint_moe.reference.orders import OrderError, check_order, replay_dot
from flint_moe.shapes import MODEL_SHAPES

_SIZES = sorted({(s.H, s.I) for s in SHAPES.values()} | {(s.hidden, s.intermediate) for s in MODEL_SHAPES.values()})


def _exact_stand_in(acc, a, b, *, instruction):
    return (acc.double() + (a.double() * b.double()).sum(-1)).float()


def _json_round_trip(o):
    assert json.loads(json.dumps(o)) == o
    check_order(json.loads(json.dumps(o)))


@pytest.mark.parametrize("config", sorted(PATH_CONFIGS["nvfp4_decode"]))
def test_nvfp4_decode_orders_every_config_and_shape(config):
    over = kernel_configs("nvfp4_decode", config)
    for h, i in _SIZES:
        if h % 32 or i % 16:
            continue
        for m in (1, 8, 9):
            o = K.nvfp4_decode_orders(h, i, M=m, gate_up=over.get("gate_up"), down=over.get("down"))
            assert o["gate_up"]["length"] == h and o["down"]["length"] == i
            assert o["router"]["length"] == h
            assert o["router"]["kernel"] == ("router_gemv_topk" if m <= 8 else "router_gemm")
            for stage in ("gate_up", "down", "router"):
                _json_round_trip(o[stage])


def test_nvfp4_tuned_configs_are_declared():
    from flint_moe.kernels.nvfp4 import tuned

    for name in ("GATE_UP", "GATE_UP_CUDA_CORE", "GATE_UP_MMA"):
        for h, _ in _SIZES:
            if h % 32 == 0:
                check_order(K.nvfp4_gate_up_order({"SK": 1, **getattr(tuned, name)}, h))
    for name in ("DOWN", "DOWN_CUDA_CORE", "DOWN_MMA"):
        for _, i in _SIZES:
            if i % 16 == 0:
                check_order(K.nvfp4_down_order({"SK": 1, "SPLIT": True, **getattr(tuned, name)}, i))
    for (h, _), over in tuned.GATE_UP_BY_SHAPE.items():
        check_order(K.nvfp4_gate_up_order({**tuned.GATE_UP, **over}, h))
    for (_, i), over in tuned.DOWN_BY_SHAPE.items():
        check_order(K.nvfp4_down_order({**tuned.DOWN, **over}, i))


def test_bf16_and_grouped_orders_every_shape():
    for cfg in PATH_CONFIGS["bf16_decode"]:
        kernel_configs("bf16_decode", cfg)  # the BF16 order does not depend on the configuration
    for h, i in _SIZES:
        ip = -(-i // 64) * 64
        if h % 64 == 0:
            o = K.bf16_decode_orders(h, ip)
            for stage in ("router", "gate_up", "down"):
                _json_round_trip(o[stage])
        else:
            with pytest.raises(OrderError, match="multiple of 64"):
                K.bf16_gate_up_order(None, h)
        for cfg in PATH_CONFIGS["nvfp4_grouped"]:
            if h % 32 == 0 and i % 16 == 0:
                o = K.nvfp4_grouped_orders(h, i, M=64, config=kernel_configs("nvfp4_grouped", cfg))
                assert o["router"]["kernel"] == "router_gemm"
                assert o["gate_up"]["length"] == h and o["down"]["length"] == i
                _json_round_trip(o["gate_up"])
                _json_round_trip(o["down"])


def test_grouped_order_is_one_k16_chain_padded_to_the_k_step():
    from flint_moe.kernels.audit.registry import collect_audit_specs

    # the default K step (64, or 128 where K is a multiple of 128) pads K to the same length
    for k in (7168, 2048, 1536):
        o = K.nvfp4_grouped_order(None, k)
        assert o == K.nvfp4_grouped_order({"BK": 128}, k) == K.nvfp4_grouped_order({"BK": 64}, k)
        assert o["axes"] == [["k16", k // 16], ["slot", 16]] and o["part_length"] == k
    assert K.nvfp4_grouped_order(None, 2880)["part_length"] == 2880
    assert K.nvfp4_grouped_order({"BK": 128}, 2880)["part_length"] == 2944  # 4 k16 steps of zero products
    assert K.nvfp4_grouped_order({"BK": 64}, 208)["axes"][0] == ["k16", 16]
    specs = collect_audit_specs()
    bk = {n: s.constexprs["BK"] for n, s in specs.items() if n.startswith("nvfp4_grouped_") and "BM" in n}
    assert bk["nvfp4_grouped_gate_up.H7168.I2048.BM128"] == bk["nvfp4_grouped_down.H7168.I2048.BM128"] == 128
    assert bk["nvfp4_grouped_gate_up.H7168.I2048.BM128.tap"] == 128
    assert bk["nvfp4_grouped_gate_up.H7168.I2048.BM64"] == bk["nvfp4_grouped_down.H7168.I2048.BM256"] == 64
    assert bk["nvfp4_grouped_gate_up.H2880.I2880.BM128"] == bk["nvfp4_grouped_down.H2880.I2880.BM128"] == 64


def test_effective_split_matches_the_launchers():
    from flint_moe.kernels.nvfp4.config import _mma_launch

    for kbytes in (16, 24, 48, 64, 96, 128, 192, 256, 320, 384, 1024, 1440, 3584):
        for sk, nw in ((1, 4), (2, 2), (2, 4), (4, 4)):
            assert K.effective_split(sk, nw, kbytes) == _mma_launch(sk, nw, kbytes)


def test_mma_decode_order_parts_and_k_slots():
    # DeepSeek-V3 gate/up default: SK = 4 over 3584 code bytes -> 4 parts of 896 bytes = 1792 elements
    o = K.nvfp4_gate_up_order({"MMA": True, "SK": 4, "num_warps": 4}, 7168)
    assert o["parts"] == [[0, 1792], [1792, 3584], [3584, 5376], [5376, 7168]]
    assert o["operands"] == {"w_scale_log2": -8, "w_dtype": "bf16"}
    assert [s["op"] for s in o["program"]] == ["mma_chain", "add_zero", "scale", "tree"]
    # a shape whose last part would be empty: H = 96 (48 bytes) runs with SK = 1, padded to one 64-byte step
    o96 = K.nvfp4_gate_up_order({"MMA": True, "SK": 4, "num_warps": 4}, 96)
    assert o96["parts"] == [[0, 96]] and o96["part_length"] == 128
    # I = 2880 with SK = 4: 1440 bytes -> parts of 384 bytes, the last 288
    o2880 = K.nvfp4_down_order({"MMA": True, "SK": 4, "num_warps": 4}, 2880)
    assert o2880["parts"] == [[0, 768], [768, 1536], [1536, 2304], [2304, 2880]] and o2880["part_length"] == 768

    calls = []

    def recording(acc, a, b, *, instruction):
        calls.append((a.float() * 256, b.float(), instruction))
        return _exact_stand_in(acc, a, b, instruction=instruction)

    o256 = K.nvfp4_gate_up_order({"MMA": True, "SK": 1, "num_warps": 4}, 256)
    w = torch.arange(256, dtype=torch.float32)[None]  # weight = its own index (bf16-exact after 2^-8)
    x = torch.ones(1, 256)
    replay_dot(o256, w, x, mma=recording)
    assert len(calls) == 16 and {c[2] for c in calls} == {"mma.sync.m16n8k16"}
    # from mma_ptx: thread c (chunk c, 32 elements) puts pair (n_i, n_{i+4}) of word w in A regs; MMA (w, half)
    # takes pairs i = 2 half (k slots 2c, 2c + 1) and 2 half + 1 (slots 2c + 8, 2c + 9):
    # slot 2c <- 32c + 8w + 2half, 2c+1 <- +4, 2c+8 <- +1, 2c+9 <- +5
    first = [0, 4, 32, 36, 64, 68, 96, 100, 1, 5, 33, 37, 65, 69, 97, 101]
    for n, (a, _, _) in enumerate(calls):
        step, wd, half = n // 8, (n % 8) // 2, n % 2
        want = [128 * step + 8 * wd + 2 * half + v for v in first]
        assert a[0].tolist() == want, n


def _cuda_core_by_loops(vals, scales, x):
    """g_acc of the CUDA-core path for one row, by plain loops over the sm_90 layout of the aligned build
    (BKB = 512): lane L of the row's warp holds code bytes 16 L .. 16 L + 15 of a step, i.e. blocks 2 L and
    2 L + 1 whole, in two accumulators; a block's 16 products are added in the thread in element order, the
    partial enters ``fma(partial, scale, acc)``; at the end each lane adds its two accumulators, then the
    lanes are summed by xor 16, 8, 4, 2, 1 (the value of lane 0 is returned)."""
    f = np.float32
    k = len(vals)
    steps = -(-k // 1024)
    acc = [[f(0.0), f(0.0)] for _ in range(32)]
    for st in range(steps):
        for lane in range(32):
            for s in range(2):
                blk = 64 * st + 2 * lane + s
                part = None
                for q in range(16):
                    e = 16 * blk + q
                    p = f(vals[e] * x[e]) if e < k else f(0.0)  # exact: E2M1 times bf16
                    part = p if part is None else f(part + p)
                sc = scales[blk] if blk < k // 16 else 0.0
                acc[lane][s] = f(np.float64(part) * np.float64(sc) + np.float64(acc[lane][s]))  # one rounding
    lanes = [f(acc[lane][0] + acc[lane][1]) for lane in range(32)]
    for d in (16, 8, 4, 2, 1):
        lanes = [f(lanes[i] + lanes[i ^ d]) for i in range(32)]
    return lanes[0]


@pytest.mark.parametrize("nw, k", [(2, 2048), (4, 1536), (1, 1024), (8, 3072), (4, 1040)])
def test_cuda_core_order_equals_the_layout_loops(nw, k):
    """The declared CUDA-core order (both kernels; it does not depend on the warps, which split the rows)
    against the loops, with a partial last step for k = 1536 and 1040."""
    g = torch.Generator().manual_seed(nw + k)
    e2m1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    vals = e2m1[torch.randint(0, 16, (k,), generator=g)]
    scales = 2.0 ** torch.randint(-6, 6, (k // 16,), generator=g).float()
    x = (torch.randn(k, generator=g) * 2.0 ** torch.randint(-8, 8, (k,), generator=g)).bfloat16().float()
    want = float(_cuda_core_by_loops(vals.tolist(), scales.tolist(), x.tolist()))
    o_dn = K.nvfp4_down_order({"MMA": False, "BKB": 512, "num_warps": nw, "BH": 16}, k)
    assert replay_dot(o_dn, vals, x, block_scales=scales).item() == want
    if k % 32 == 0:
        o_gu = K.nvfp4_gate_up_order({"MMA": False, "BKB": 512, "num_warps": nw, "BN": 8}, k)
        assert o_gu["axes"] == o_dn["axes"] and o_gu["program"] == o_dn["program"]
        assert replay_dot(o_gu, vals, x, block_scales=scales).item() == want


def test_cuda_core_order_differs_from_a_lane_split_block():
    """The loops are not order-blind: summing each block as 8 lane pairs with xor 4, 2, 1 (the layout of a
    build without the 16-byte alignment specialisation) changes the result on this row."""
    f = np.float32
    g = torch.Generator().manual_seed(5)
    k = 1024
    e2m1 = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
    vals = e2m1[torch.randint(0, 14, (k,), generator=g)].tolist()
    x = (torch.randn(k, generator=g) * 2.0 ** torch.randint(-12, 12, (k,), generator=g)).bfloat16().float().tolist()
    scales = [1.0] * (k // 16)
    o = K.nvfp4_down_order({"MMA": False, "BKB": 512, "num_warps": 4, "BH": 16}, k)
    got = replay_dot(o, torch.tensor(vals), torch.tensor(x), block_scales=torch.tensor(scales)).item()
    assert got == float(_cuda_core_by_loops(vals, scales, x))
    differs = 0
    for blk in range(k // 16):
        prods = [f(vals[16 * blk + q] * x[16 * blk + q]) for q in range(16)]
        pairs = [f(prods[2 * i] + prods[2 * i + 1]) for i in range(8)]
        for d in (4, 2, 1):
            pairs = [f(pairs[i] + pairs[i ^ d]) for i in range(8)]
        seq = prods[0]
        for q in range(1, 16):
            seq = f(seq + prods[q])
        differs += int(pairs[0] != seq)
    assert differs > 0


def test_router_and_lane_orders():
    o = K.router_order(7168, M=1)
    assert o["axes"] == [["step", 7], ["lane", 1024]]
    assert K.router_order(2880, M=8)["axes"] == [["step", 3], ["lane", 1024]]
    assert K.router_order(96, M=1)["axes"] == [["step", 1], ["lane", 128]]  # next power of two, padded
    gemm = K.router_order(7168, M=9)  # the tensor-core router GEMM: 112 K steps of 64 = 4 chained k16 steps
    assert gemm["kernel"] == "router_gemm" and gemm["axes"] == [["step", 112], ["k16", 4], ["slot", 16]]
    assert K.router_order(100, M=9)["part_length"] == 128  # H zero-padded to a multiple of BK
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 96, generator=g).bfloat16().float()
    w = torch.randn(2, 96, generator=g).bfloat16().float()
    f = np.float32
    got = replay_dot(K.router_order(96), w, x)
    for r in range(2):
        lanes = [f(f(0.0) + f(w[r, h] * x[r, h])) if h < 96 else f(0.0) for h in range(128)]
        while len(lanes) > 1:
            lanes = [f(lanes[2 * i] + lanes[2 * i + 1]) for i in range(len(lanes) // 2)]
        assert got[r].item() == float(lanes[0])


def test_undeclared_configurations_raise():
    with pytest.raises(OrderError, match="BKB = 512"):
        K.nvfp4_gate_up_order({"MMA": False, "BKB": 256, "num_warps": 2}, 7168)
    with pytest.raises(OrderError, match="BKB = 512"):
        K.nvfp4_gate_up_order({"MMA": False, "BKB": 512, "num_warps": 2, "WORDS": True}, 7168)
    with pytest.raises(OrderError, match="SPLIT = False"):
        K.nvfp4_down_order({"MMA": False, "BKB": 512, "num_warps": 4, "SPLIT": False}, 2048)
    with pytest.raises(OrderError, match="1, 2, 4 or 8 warps"):
        K.nvfp4_gate_up_order({"MMA": False, "BKB": 512, "num_warps": 16, "BN": 8}, 7168)
    with pytest.raises(OrderError, match="rows a multiple of num_warps"):  # 2 rows on 4 warps
        K.nvfp4_gate_up_order({"MMA": False, "BKB": 512, "num_warps": 4, "BN": 1}, 7168)
    with pytest.raises(OrderError, match="rows a multiple of num_warps"):
        K.nvfp4_down_order({"MMA": False, "BKB": 512, "num_warps": 8, "BH": 4}, 2048)
    with pytest.raises(OrderError, match="needs the launch configuration's BN"):
        K.nvfp4_gate_up_order({"MMA": False, "BKB": 512, "num_warps": 2}, 7168)
    with pytest.raises(OrderError, match="multiple of 32"):
        K.nvfp4_gate_up_order({"MMA": True, "SK": 1, "num_warps": 4}, 7160)
