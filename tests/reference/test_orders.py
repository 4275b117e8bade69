"""Summation-order replay (flint_moe.reference.orders) against hand-derived fp32 evaluations."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from flint_moe.reference.orders import FORMAT, OrderError, check_order, order_summary, replay_dot, replay_matmul

f32 = np.float32


def _order(k, axes, program, parts=None, plen=None, operands=None):
    d = {"format": FORMAT, "length": k, "parts": parts or [[0, k]], "part_length": plen or k,
         "axes": axes, "program": program}  # fmt: skip
    if operands:
        d["operands"] = operands
    return d


def _sequential(k):
    return _order(k, [["step", k], ["lane", 1]], [
        {"op": "fma_chain", "axis": "step", "init": "zero"},
        {"op": "tree", "axis": "lane", "shape": "adjacent"},
    ])  # fmt: skip


def _tree(k, shape):
    return _order(k, [["step", 1], ["lane", k]], [
        {"op": "fma_chain", "axis": "step", "init": "zero"},
        {"op": "tree", "axis": "lane", "shape": shape},
    ])  # fmt: skip


def _exact_stand_in(acc, a, b, *, instruction):
    """Tensor-core stand-in: the exact sum (float64; the test data keep it exact), then one rounding."""
    return (acc.double() + (a.double() * b.double()).sum(-1)).float()


# Eight terms whose left-to-right, pairwise (neighbours first) and butterfly (halves first) fp32 sums are three
# different numbers: big terms cancel at different moments, so the small ones are absorbed differently.
TERMS8 = [3.0, 3.0, -1.0, -(2.0**24), 1.0, -(2.0**24), 2.0**25, -(2.0**24)]


def _np_left_to_right(t):
    acc = f32(0.0)
    for v in t:
        acc = f32(acc + f32(v))
    return acc


def _np_pairwise(t):
    v = [f32(a) for a in t]
    while len(v) > 1:
        v = [f32(v[2 * i] + v[2 * i + 1]) for i in range(len(v) // 2)]
    return v[0]


def _np_butterfly(t):
    v = [f32(a) for a in t]
    while len(v) > 1:
        h = len(v) // 2
        v = [f32(v[i] + v[i + h]) for i in range(h)]
    return v[0]


def test_three_orders_three_results():
    w = torch.tensor(TERMS8, dtype=torch.float32)
    x = torch.ones(8, dtype=torch.float32)
    want = {
        "seq": _np_left_to_right(TERMS8),
        "adjacent": _np_pairwise(TERMS8),
        "halves": _np_butterfly(TERMS8),
    }
    assert len({float(v) for v in want.values()}) == 3
    got = {
        "seq": replay_dot(_sequential(8), w, x),
        "adjacent": replay_dot(_tree(8, "adjacent"), w, x),
        "halves": replay_dot(_tree(8, "halves"), w, x),
    }
    for k in want:
        assert got[k].dtype == torch.float32
        assert got[k].item() == float(want[k]), k
    # by hand. Left to right: 3, 6, 5, 5 - 2^24, 6 - 2^24, 6 - 2^25 (ulp 2: exact), 6, 6 - 2^24 -> all exact:
    assert want["seq"] == f32(6 - 2.0**24)
    # neighbours: 6, -1 - 2^24 -> -2^24 (tie, even), 1 - 2^24, 2^24; then 6 - 2^24, 1; then 7 - 2^24
    assert want["adjacent"] == f32(7 - 2.0**24)
    # halves: 3 + 1 = 4, 3 - 2^24, 2^25 - 1 -> 2^25 (tie, even), -2^25; then 2^25 + 4, -3 * 2^24 - 3 ->
    # -3 * 2^24 - 4 (ulp 4); then 8 - 2^24
    assert want["halves"] == f32(8 - 2.0**24)


def test_fma_one_rounding_not_two():
    # a * b + c with exact value 1 + 2^-23 + 2^-24 - 2^-56: just below the tie between 1 + 2^-23 and
    # 1 + 2^-22, so RN32 is 1 + 2^-23. Rounding the exact sum to float64 first lands on the tie and then on
    # the even neighbour 1 + 2^-22 (double rounding); RN(RN(a * b) + c) gives 1 + 2^-22 as well.
    a = 2.0**-24 * (1 + 2.0**-16)
    b = 1 - 2.0**-16
    c = 1 + 2.0**-23
    w = torch.tensor([c, a], dtype=torch.float32)
    x = torch.tensor([1.0, b], dtype=torch.float32)
    got = replay_dot(_sequential(2), w, x).item()
    assert got == 1 + 2.0**-23
    assert float(f32(f32(a * b) + f32(c))) == 1 + 2.0**-22  # the two-rounding evaluation differs
    assert float(f32(np.float64(a) * np.float64(b) + np.float64(c))) == 1 + 2.0**-22


def test_same_inputs_two_declarations_differ_bitwise():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 256, generator=g).bfloat16().float()
    x = torch.randn(64, 256, generator=g).bfloat16().float()
    a = replay_dot(_tree(256, "adjacent"), w, x)
    b = replay_dot(_tree(256, "halves"), w, x)
    assert (a.view(torch.int32) != b.view(torch.int32)).any()


def test_exact_terms_equal_the_exact_sum_for_every_order():
    g = torch.Generator().manual_seed(5)
    k = 512
    w = torch.randint(-8, 9, (16, k), generator=g).float()
    x = torch.randint(-8, 9, (16, k), generator=g).float()
    exact = (w.double() * x.double()).sum(-1).float()
    scales = torch.full((16, k // 16), 2.0)
    orders = [
        _sequential(k),
        _tree(k, "adjacent"),
        _tree(k, "halves"),
        _order(k, [["step", 4], ["rep", 2], ["w", 2], ["g", 2], ["i", 4], ["j", 4]], [
            {"op": "fma_chain", "axis": "j", "init": "first"},
            {"op": "tree", "axis": "i", "shape": "halves"},
            {"op": "scale_fma_chain", "axis": "step"},
            {"op": "add_chain", "axis": "rep", "init": "first"},
            {"op": "tree", "axis": "g", "shape": "halves"},
            {"op": "tree", "axis": "w", "shape": "adjacent"},
        ]),
        _order(k, [["step", 2], ["k16", 16], ["slot", 16]], [
            {"op": "mma_chain", "chain": ["step", "k16"], "slots": ["slot"], "instruction": "wgmma.m64nNk16"},
            {"op": "add_zero"}, {"op": "scale", "log2": 3},
        ], parts=[[0, 300], [300, 512]], plen=512, operands={"w_scale_log2": -3, "w_dtype": "bf16"}),
    ]  # fmt: skip
    orders[-1]["program"].append({"op": "tree", "axis": "part", "shape": "adjacent"})
    for o in orders:
        got = replay_dot(o, w, x, block_scales=scales, mma=_exact_stand_in)
        assert torch.equal(got, 2 * exact), order_summary(o)


def test_block_regrouping_by_hand():
    # one row, K = 32 (two blocks), one step: s_b = sum of the block's E2M1 * x, acc = fma(s_b, scale_b, +0)
    # per slot, then slot 0 + slot 1. Scales 2^-3 and 3; products chosen exact.
    o = _order(32, [["step", 1], ["slot", 2], ["pos", 16]], [
        {"op": "fma_chain", "axis": "pos", "init": "first"},
        {"op": "scale_fma_chain", "axis": "step"},
        {"op": "tree", "axis": "slot", "shape": "adjacent"},
    ])  # fmt: skip
    codes = torch.tensor([0.5, -1.0, 6.0, 0.0] * 8)
    x = torch.tensor([2.0, 1.5, -0.25, 4.0] * 8)
    s = torch.tensor([0.125, 3.0])
    # block sums: 4 * (1 - 1.5 - 1.5 + 0) = -8 each; -8 * 0.125 + -8 * 3 = -1 - 24 = -25
    assert replay_dot(o, codes, x, block_scales=s).item() == -25.0
    with pytest.raises(OrderError, match="block_scales: required"):
        replay_dot(o, codes, x)


def test_signed_zero_add_zero_and_padding():
    o = _order(2, [["step", 1], ["lane", 2]], [
        {"op": "fma_chain", "axis": "step", "init": "first"},
        {"op": "tree", "axis": "lane", "shape": "adjacent"},
    ])  # fmt: skip
    w, x = torch.tensor([-0.0, -0.0]), torch.tensor([1.0, 1.0])
    r = replay_dot(o, w, x)
    assert r.item() == 0.0 and torch.signbit(r)  # -0 + -0 = -0
    o2 = copy.deepcopy(o)
    o2["program"].append({"op": "add_zero"})
    r2 = replay_dot(o2, w, x)
    assert r2.item() == 0.0 and not torch.signbit(r2)
    # a padded chain: the kernel's extra +0 * +0 product turns -0 into +0 (fma(+0, +0, -0) = +0)
    o3 = _order(2, [["step", 4], ["lane", 1]], [
        {"op": "fma_chain", "axis": "step", "init": "first"},
        {"op": "tree", "axis": "lane", "shape": "adjacent"},
    ], plen=4)  # fmt: skip
    r3 = replay_dot(o3, w, x)
    assert r3.item() == 0.0 and not torch.signbit(r3)


def test_mma_chain_order_and_operands():
    calls = []

    def recording(acc, a, b, *, instruction):
        calls.append((a.float().clone(), b.float().clone(), instruction))
        return _exact_stand_in(acc, a, b, instruction=instruction)

    k = 64
    o = _order(k, [["step", 2], ["hi", 2], ["lo", 16]], [
        {"op": "mma_chain", "chain": ["step", "hi"], "slots": ["lo"], "instruction": "mma.sync.m16n8k16"},
    ], operands={"w_scale_log2": -8, "w_dtype": "bf16"})  # fmt: skip
    w = torch.arange(k, dtype=torch.float32)[None]
    x = torch.ones(1, k)
    got = replay_dot(o, w, x, mma=recording)
    assert got.item() == sum(range(k)) / 256
    assert [c[2] for c in calls] == ["mma.sync.m16n8k16"] * 4
    for i, (a, _b, _) in enumerate(calls):
        assert torch.equal(a[0] * 256, torch.arange(16 * i, 16 * i + 16, dtype=torch.float32))
    with pytest.raises(OrderError, match="not exactly representable in torch.bfloat16"):
        replay_dot(o, w + 2.0**-7, x, mma=recording)


def test_replay_matmul_matches_rows():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 128, generator=g).bfloat16()
    w = torch.randn(5, 128, generator=g).bfloat16()
    o = _tree(128, "halves")
    m = replay_matmul(o, x, w)
    for i in range(3):
        for j in range(5):
            want = _np_butterfly((w[j].double() * x[i].double()).numpy())  # bf16 products exact in fp32
            assert m[i, j].item() == float(want)


def _good():
    return _order(32, [["step", 2], ["lane", 16]], [
        {"op": "fma_chain", "axis": "step", "init": "zero"},
        {"op": "tree", "axis": "lane", "shape": "adjacent"},
    ])  # fmt: skip


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda o: o.update(format="other/1"), "format must be"),
        (lambda o: o.update(length=0), "length must be an int >= 1"),
        (lambda o: o.update(parts=[[0, 16], [17, 32]]), "must start at 16"),
        (lambda o: o.update(parts=[[0, 16]]), "parts end at 16, not at length = 32"),
        (lambda o: o.update(axes=[["step", 3], ["lane", 16]]), "multiply to 48, not part_length = 32"),
        (lambda o: o.update(axes=[["lane", 2], ["lane", 16]]), "repeated or reserved"),
        (lambda o: o["program"].pop(), "leaves axes unreduced: \\['lane'\\]"),
        (lambda o: o["program"].insert(0, {"op": "tree", "axis": "lane", "shape": "adjacent"}), "needs fp32 values"),
        (lambda o: o["program"].append({"op": "fma_chain", "axis": "lane", "init": "zero"}), "needs the products"),
        (lambda o: o["program"].__setitem__(1, {"op": "tree", "axis": "lane", "shape": "zigzag"}), "shape must be"),
        (lambda o: o["program"].__setitem__(1, {"op": "tree", "axis": "nope", "shape": "halves"}), "not a live axis"),
        (lambda o: o["program"].__setitem__(0, {"op": "spin", "axis": "step"}), "unknown stage"),
        (lambda o: o["program"].__setitem__(0, {"op": "fma_chain", "axis": "step"}), "init must be"),
        (lambda o: o.update(operands={"w_scale_log2": 0.5}), "w_scale_log2 must be an int"),
        (lambda o: o.update(length=torch.tensor(32)), "not JSON-serialisable|length must be"),
    ],
)
def test_validator_errors(mutate, message):
    o = _good()
    check_order(o)
    mutate(o)
    with pytest.raises(OrderError, match=message):
        check_order(o)


def test_validator_structural_errors():
    with pytest.raises(OrderError, match="None"):
        check_order(None)
    tree3 = _order(24, [["step", 8], ["lane", 3]], [
        {"op": "fma_chain", "axis": "step", "init": "zero"},
        {"op": "tree", "axis": "lane", "shape": "halves"},
    ])  # fmt: skip
    with pytest.raises(OrderError, match="size 3, not a power of two"):
        check_order(tree3)
    mma8 = _order(16, [["c", 2], ["s", 8]], [
        {"op": "mma_chain", "chain": ["c"], "slots": ["s"], "instruction": "mma.sync.m16n8k16"},
    ])  # fmt: skip
    with pytest.raises(OrderError, match="span 8 positions, not 16"):
        check_order(mma8)
    mma8["program"][0]["instruction"] = "hmma"
    with pytest.raises(OrderError, match="instruction must be one of"):
        check_order(mma8)
    blk = _order(32, [["step", 2], ["pos", 16]], [
        {"op": "fma_chain", "axis": "step", "init": "zero"},
        {"op": "scale_fma_chain", "axis": "pos"},
    ])  # fmt: skip
    with pytest.raises(OrderError, match="innermost axes spanning one block"):
        check_order(blk)
    with pytest.raises(OrderError, match="does not match the order's length 32"):
        replay_dot(_good(), torch.ones(31), torch.ones(31))
    with pytest.raises(TypeError, match="w: expected a floating-point tensor"):
        replay_dot(_good(), torch.ones(32, dtype=torch.int32), torch.ones(32))


# ---------------------------------------------------------------------------------------------------------
# the golden model's entry points
# ---------------------------------------------------------------------------------------------------------


def _lanes(k, lanes):
    return _order(k, [["step", k // lanes], ["lane", lanes]], [
        {"op": "fma_chain", "axis": "step", "init": "zero"},
        {"op": "tree", "axis": "lane", "shape": "adjacent"},
    ])  # fmt: skip


def _blocks(k):
    return _order(k, [["step", k // 32], ["slot", 2], ["pos", 16]], [
        {"op": "fma_chain", "axis": "pos", "init": "first"},
        {"op": "scale_fma_chain", "axis": "step"},
        {"op": "tree", "axis": "slot", "shape": "halves"},
    ])  # fmt: skip


def test_moe_bf16_follows_declared_orders():
    import flint_moe.reference as R

    torch.manual_seed(11)
    m, e, h, i, k = 3, 4, 128, 64, 2
    x = torch.randn(m, h).bfloat16()
    wr = torch.randn(e, h).bfloat16()
    ex = R.BF16Experts(torch.randn(e, 2 * i, h).bfloat16(), torch.randn(e, h, i).bfloat16())
    base = R.moe_bf16(x, wr, ex, k)
    assert base.router_acc.replay is None and base.gate_acc.replay is None
    orders = {"router": _lanes(h, 16), "gate_up": _lanes(h, 64), "down": _lanes(128, 64)}  # down: I padded to 128
    res = R.moe_bf16(x, wr, ex, k, orders=orders)
    # the any-order exact values do not move; the accumulators are the replays
    assert torch.equal(res.router_acc.exact, base.router_acc.exact)
    assert torch.equal(res.router_acc.replay, replay_matmul(orders["router"], x, wr))
    for t in range(m):
        for j in range(k):
            ei = int(res.ids[t, j])
            g = replay_matmul(orders["gate_up"], x[t : t + 1], ex.w13[ei, :i])[0]
            assert torch.equal(res.gate_acc.replay[t, j], g)
            assert torch.equal(res.g[t, j], g)  # BF16: g = g_acc
            a = torch.nn.functional.pad(res.act[t, j].float(), (0, 64))[None]
            d = replay_matmul(orders["down"], a, torch.nn.functional.pad(ex.w2[ei].float(), (0, 64)))[0]
            assert torch.equal(res.down_acc.replay[t, j], d)
    with pytest.raises(ValueError, match="orders: expected a dict with keys among"):
        R.moe_bf16(x, wr, ex, k, orders={"gate": orders["router"]})
    with pytest.raises(OrderError, match="format"):
        R.moe_bf16(x, wr, ex, k, orders={"router": {"format": "x"}})


def test_nvfp4_gate_up_block_order_replay():
    import flint_moe.reference as R
    from flint_moe.reference.experts import gate_up_accumulate

    g = torch.Generator().manual_seed(2)
    m, h, n = 2, 64, 6
    x = torch.randn(m, h, generator=g).bfloat16()
    codes = torch.randint(0, 256, (n, h // 2), generator=g, dtype=torch.uint8)
    scale = torch.randint(0, 0x7F, (n, h // 16), generator=g, dtype=torch.uint8)
    acc = gate_up_accumulate(x, codes, scale, order=_blocks(h))
    # independent evaluation: E2M1 values by table, the block partials and scale fmas in numpy float32
    # (every E2M1 x bf16 product and every partial here is exact or rounded by a single fp32 add)
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    sv = R.e4m3_to_float(scale).float()
    for t in range(m):
        for r in range(n):
            vals = []
            for b in range(h // 2):
                vals += [e2m1[int(codes[r, b]) & 15], e2m1[int(codes[r, b]) >> 4]]
            slots = [np.float32(0.0), np.float32(0.0)]
            for step in range(h // 32):
                for sl in range(2):
                    blk = step * 2 + sl
                    s = np.float32(vals[16 * blk] * float(x[t, 16 * blk]))
                    for q in range(1, 16):
                        s = np.float32(s + np.float32(vals[16 * blk + q] * float(x[t, 16 * blk + q])))
                    # fma(s, scale, acc): s * scale (<= 28 bits) + acc is exact in float64 at these magnitudes
                    slots[sl] = np.float32(np.float64(s) * np.float64(sv[r, blk]) + np.float64(slots[sl]))
            want = np.float32(slots[0] + slots[1])
            assert acc.replay[t, r].item() == float(want), (t, r)
    assert torch.equal(acc.exact, gate_up_accumulate(x, codes, scale).exact)


def test_moe_nvfp4_uses_the_replay_downstream():
    import flint_moe.reference as R
    from flint_moe.reference.experts import down_accumulate, gate_up_accumulate

    g = torch.Generator().manual_seed(9)
    e, h, i, m, k = 4, 512, 256, 2, 2
    pick = torch.tensor([0x28, 0x30, 0x38, 0xB0, 0x34, 0x2C], dtype=torch.uint8)
    ex = R.NVFP4Experts(
        torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, generator=g),
        pick[torch.randint(0, 6, (e, 2 * i, h // 16), generator=g)],
        torch.rand(e, generator=g) + 0.5,
        torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, generator=g),
        pick[torch.randint(0, 6, (e, h, i // 16), generator=g)],
        torch.rand(e, generator=g) + 0.5,
    )
    x = torch.randn(m, h, generator=g).bfloat16()
    wr = torch.randn(e, h, generator=g).bfloat16()
    orders = {"router": None, "gate_up": _blocks(h), "down": _blocks(i)}
    res = R.moe_nvfp4(x, wr, ex, k, orders=orders)
    assert res.router_acc.replay is None  # undeclared: the default policy (RN32 of the exact sum)
    # the data make the block order differ from RN32 of the exact sum somewhere, so g below tells them apart
    assert (res.gate_acc.replay != res.gate_acc.exact.float()).any()
    for t in range(m):
        for j in range(k):
            ei = int(res.ids[t, j])
            gu = gate_up_accumulate(x[t : t + 1], ex.w13[ei], ex.w13_scale[ei], order=orders["gate_up"])
            assert torch.equal(res.gate_acc.replay[t, j], gu.replay[0, :i])
            assert torch.equal(res.up_acc.replay[t, j], gu.replay[0, i:])
            assert torch.equal(res.g[t, j], gu.replay[0, :i] * ex.w13_gs[ei])  # step 6 applied to the replay
            dn = down_accumulate(res.act[t, j][None], ex.w2[ei], ex.w2_scale[ei], order=orders["down"])
            assert torch.equal(res.down_acc.replay[t, j], dn.replay[0])
