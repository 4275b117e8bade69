"""BF16 TRT-LLM-layout decode kernels under Triton's interpreter (CPU CI), against the golden model.

Shapes are small but keep the production divisibility: H and I odd multiples of 64 (like H = 2880 = 45 * 64,
I = 704 = 11 * 64, read as is) and an intermediate size padded by ``pad_intermediate_bf16`` (like 2880 ->
2944 for FlashInfer's launcher); E not a power of two; gate and up drawn from different distributions so a
gate/up swap cannot pass.

What is checked (docs/ARCHITECTURE.md section 2, taps): every accumulator tap within the golden model's certified bound
(``flint_moe.reference.check_accumulator``; weights read back through
``reference.layouts.decode_trtllm_bf16``) and bit-equal to a replay of the order the kernel documents
(``flint_moe.kernels.bf16.gemv``); every order-free step (SwiGLU, y, combine, shared add) bit-equal to the
golden model fed the kernel's own taps; tapped build == production build; launch configuration never
changes a bit; inputs never modified; bad inputs raise clear errors. Bit-exactness of the rounding
instructions themselves is a GPU claim
(test_bf16_decode_gpu.py); here the interpreter shims run the golden emulations.
"""

from __future__ import annotations

import importlib.util
import math
from unittest import mock

import pytest
import torch
import triton
import triton.language as tl

from flint_moe import reference as R
from flint_moe.kernels.bf16.down_combine import bf16_down_combine
from flint_moe.kernels.bf16.gate_up import bf16_gate_up
from flint_moe.kernels.bf16.gemv import trtllm_row
from flint_moe.layouts import to_trtllm_bf16, trtllm_bf16_row_maps
from flint_moe.reference.layouts import decode_trtllm_bf16

from ._bf16_check import _bits, assert_same, replay_order, trtllm_experts

BACKEND = "interpreter"

#: (name, E, H, I, pad_to, k, M): logical I, padded to a multiple of pad_to when given.
SHAPES = [
    ("H192-I192", 6, 192, 192, None, 3, 2),
    ("H320-I96pad128", 5, 320, 96, 128, 2, 3),
]


# --------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------


def make_case(e: int, h: int, i: int, pad_to: int | None, k: int, m: int, seed: int) -> dict:
    """Random experts ([gate; up], gate and up asymmetric) in the TRT-LLM layout, tokens, routing, shared."""
    gen = torch.Generator().manual_seed(seed)
    c = trtllm_experts(gen, e, h, i, pad_to, gate=(0.05, 0.01), up=(0.25, -0.03), w2_scale=0.05)
    x = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(m)]).to(torch.int32)
    tw = R.round_bf16(torch.rand(m, k, generator=gen) * 0.5 + 0.01)
    shared = (torch.randn(m, h, generator=gen) * 0.1).to(torch.bfloat16)
    return dict(c, k=k, M=m, x=x, ids=ids, tw=tw, shared=shared)


def run_kernels(c: dict, taps: dict | None, gate_up_config=None, down_config=None) -> tuple:
    act = bf16_gate_up(c["x"], c["ids"], c["g1"], c["maps"][0], taps=taps, config=gate_up_config)
    out = bf16_down_combine(act, c["ids"], c["tw"], c["g2"], c["maps"][1], c["shared"], taps=taps, config=down_config)
    return act, out


# Fewer, larger programs keep the interpreter fast; test_config_never_changes_a_bit covers the defaults.
FAST = (dict(BN=64, num_warps=4), dict(BH=64, num_warps=4))


@pytest.fixture(scope="module", params=SHAPES, ids=[s[0] for s in SHAPES])
def case(request) -> dict:
    _, e, h, i, pad_to, k, m = request.param
    c = make_case(e, h, i, pad_to, k, m, seed=hash(request.param[0]) % 1000)
    c["taps"] = {}
    c["act"], c["out"] = run_kernels(c, c["taps"], *FAST)
    return c


# --------------------------------------------------------------------------------------------------------
# numerics
# --------------------------------------------------------------------------------------------------------


def test_layout_roundtrip_sanity(case) -> None:
    """The golden weights are the layout's logical experts (guards the test data, not the kernels)."""
    w = case["golden"]
    assert w.w13.shape == (case["E"], 2 * case["I"], case["H"]) and w.w2.shape == (
        case["E"],
        case["H"],
        case["I"],
    )


def test_gate_up_accumulators(case) -> None:
    """gate_acc / up_acc: within the certified bound, bit-equal to the documented order, not swapped."""
    taps, i = case["taps"], case["I"]
    for t in range(case["M"]):
        for j in range(case["k"]):
            e = int(case["ids"][t, j])
            acc = R.gate_up_accumulate_bf16(case["x"][t : t + 1], case["golden"].w13[e])
            g, u = taps["gate_acc"][t, j, :i][None], taps["up_acc"][t, j, :i][None]
            assert bool(R.check_accumulator(g, acc[:, :i]).all()), (t, j)
            assert bool(R.check_accumulator(u, acc[:, i:]).all()), (t, j)
            # the check has teeth: swapped gate/up taps fail it
            assert not bool(R.check_accumulator(u, acc[:, :i]).all())
            w13p, ip = case["padded"].w13[e].float(), case["Ip"]
            xt = case["x"][t].float()
            assert_same(taps["gate_acc"][t, j], replay_order(w13p[:ip], xt), f"gate_acc order ({t},{j})")
            assert_same(taps["up_acc"][t, j], replay_order(w13p[ip:], xt), f"up_acc order ({t},{j})")


def test_swiglu_exact_from_taps(case) -> None:
    """act == golden step 7 (BF16 rule: g = g_acc, u = u_acc) on the kernel's own accumulators, bitwise."""
    taps = case["taps"]
    assert taps["act"] is case["act"]
    gold = R.swiglu(taps["gate_acc"].contiguous(), taps["up_acc"].contiguous())
    assert_same(case["act"], gold, "act")
    if case["Ip"] > case["I"]:  # padded columns: zero weights -> g = u = 0 -> act = +0
        assert not bool(_bits(case["act"][:, :, case["I"] :]).any())


def test_down_accumulators(case) -> None:
    """down_acc: within the bound of the golden down GEMV on the kernel's act; bit-equal to the documented
    order."""
    taps, i = case["taps"], case["I"]
    for t in range(case["M"]):
        for j in range(case["k"]):
            e = int(case["ids"][t, j])
            a = case["act"][t, j]
            acc = R.down_accumulate_bf16(a[:i][None], case["golden"].w2[e])
            assert bool(R.check_accumulator(taps["down_acc"][t, j][None], acc).all()), (t, j)
            rep = replay_order(case["padded"].w2[e].float(), a.float())
            assert_same(taps["down_acc"][t, j], rep, f"down_acc order ({t},{j})")


def test_y_and_combine_exact_from_taps(case) -> None:
    """y == bf16(y_acc); out == bf16(RN(bf16(fma chain of tw_j * y_j) + shared)), bit for bit."""
    taps = case["taps"]
    assert_same(taps["y"], R.down_output_bf16(taps["down_acc"]), "y")
    gold = R.add_shared(R.combine(case["tw"], taps["y"]), case["shared"])
    assert taps["out"] is case["out"]
    assert_same(case["out"], gold, "out")


def test_other_config_gives_the_same_bits(case) -> None:
    """Tapped build with another launch configuration: the same act, out and tap bits."""
    taps2: dict = {}
    alt = (dict(BN=16, num_warps=1, UNROLL=1), dict(BH=32, num_warps=2, UNROLL=3))
    act, out = run_kernels(case, taps2, *alt)
    for key in ("gate_acc", "up_acc", "down_acc", "y"):
        assert_same(taps2[key], case["taps"][key], key)
    assert_same(act, case["act"], "act")
    assert_same(out, case["out"], "out")


def test_production_build_with_default_config_equals_tapped() -> None:
    """Production build (TAP off, GATE_UP_CONFIG / DOWN_CONFIG) == tapped build (another configuration)."""
    c = make_case(3, 128, 128, None, 2, 2, seed=5)
    taps: dict = {}
    act_t, out_t = run_kernels(c, taps, *FAST)
    act, out = run_kernels(c, None)
    assert_same(act, act_t, "act")
    assert_same(out, out_t, "out")
    assert_same(out_t, R.add_shared(R.combine(c["tw"], taps["y"]), c["shared"]), "out from taps")


# --------------------------------------------------------------------------------------------------------
# special values, inputs untouched
# --------------------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_special_values_follow_the_golden_model() -> None:
    """inf in x, NaN and inf in weights, a zero routing weight: NaN positions and bits as the rule says."""
    c = make_case(4, 128, 64, None, 2, 2, seed=7)
    x = c["x"].clone()
    x[0, 5] = math.inf
    w13 = decode_trtllm_bf16(c["g1"], c["g2"]).w13.clone()
    w2 = decode_trtllm_bf16(c["g1"], c["g2"]).w2.clone()
    e1 = int(c["ids"][1, 0])
    w13[e1, 3, 70] = math.nan  # gate row 3
    w13[e1, 64 + 9, 11] = -math.inf  # up row 9
    w2[e1, 17, 5] = math.nan
    g1, g2 = to_trtllm_bf16(w13, w2)
    c.update(x=x, g1=g1, g2=g2)
    tw = c["tw"].clone()
    tw[1, 1] = 0.0
    c["tw"] = tw
    taps: dict = {}
    act, out = run_kernels(c, taps, *FAST)
    for t in range(2):
        for j in range(2):
            e = int(c["ids"][t, j])
            acc = R.gate_up_accumulate_bf16(x[t : t + 1], w13[e])
            assert bool(R.check_accumulator(taps["gate_acc"][t, j][None], acc[:, :64]).all())
            assert bool(R.check_accumulator(taps["up_acc"][t, j][None], acc[:, 64:]).all())
            dacc = R.down_accumulate_bf16(act[t, j][None], w2[e])
            assert bool(R.check_accumulator(taps["down_acc"][t, j][None], dacc).all())
    assert bool(torch.isnan(act.float()).any()) and bool(torch.isnan(out.float()).any())
    assert_same(act, R.swiglu(taps["gate_acc"], taps["up_acc"]), "act")
    assert_same(taps["y"], R.down_output_bf16(taps["down_acc"]), "y")
    assert_same(out, R.add_shared(R.combine(tw, taps["y"]), c["shared"]), "out")


def test_inputs_are_not_modified(case) -> None:
    names = ("x", "ids", "tw", "g1", "g2", "shared")
    before = {n: case[n].clone() for n in names}
    maps = [m.clone() for m in case["maps"]]
    run_kernels(case, {}, *FAST)
    for n in names:
        assert torch.equal(
            _bits(case[n]) if case[n].is_floating_point() else case[n],
            _bits(before[n]) if before[n].is_floating_point() else before[n],
        ), n
    assert all(torch.equal(a, b) for a, b in zip(maps, case["maps"], strict=True))


# --------------------------------------------------------------------------------------------------------
# bad inputs
# --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small() -> dict:
    return make_case(3, 128, 64, None, 2, 1, seed=3)


def test_gate_up_rejects_bad_inputs(small) -> None:
    c = small
    x, ids, g1, m13 = c["x"], c["ids"], c["g1"], c["maps"][0]
    with pytest.raises(TypeError, match="^x: dtype"):
        bf16_gate_up(x.float(), ids, g1, m13)
    with pytest.raises(ValueError, match="^x: must be contiguous"):
        bf16_gate_up(torch.cat([x, x], 1)[:, ::2], ids, g1, m13)
    with pytest.raises(TypeError, match="^ids: dtype"):
        bf16_gate_up(x, ids.long(), g1, m13)
    with pytest.raises(ValueError, match="^ids: expected"):
        bf16_gate_up(x, ids[:, :0], g1, m13)
    logical = decode_trtllm_bf16(c["g1"], c["g2"]).w13
    with pytest.raises(ValueError, match="^w13: expected the TRT-LLM BF16 BlockMajorK layout"):
        bf16_gate_up(x, ids, logical, m13)
    with pytest.raises(ValueError, match="^map13: dimension 0"):
        bf16_gate_up(x, ids, g1, m13[:-2].contiguous())
    with pytest.raises(ValueError, match="^x: hidden size"):
        bf16_gate_up(x[:, :96].contiguous(), ids, g1, m13)
    with pytest.raises(ValueError, match="^map13: must be on"):
        bf16_gate_up(x, ids, g1, m13.to("meta"))
    with pytest.raises(ValueError, match="^config: BN"):
        bf16_gate_up(x, ids, g1, m13, config=dict(BN=3))
    with pytest.raises(ValueError, match="^config: unknown"):
        bf16_gate_up(x, ids, g1, m13, config=dict(BK=64))
    with pytest.raises(TypeError, match="^taps:"):
        bf16_gate_up(x, ids, g1, m13, taps=[])


def test_down_rejects_bad_inputs(small) -> None:
    c = small
    act = torch.zeros(1, 2, 64, dtype=torch.bfloat16)
    args = dict(act=act, ids=c["ids"], weights=c["tw"], w2=c["g2"], map2=c["maps"][1], shared_output=c["shared"])

    def call(**kw):
        return bf16_down_combine(**{**args, **kw})

    with pytest.raises(TypeError, match="^weights: dtype"):
        call(weights=c["tw"].to(torch.bfloat16))
    with pytest.raises(ValueError, match="^weights: dimension 1"):
        call(weights=c["tw"][:, :1].contiguous())
    with pytest.raises(ValueError, match="^act: expected"):
        call(act=act[0])
    with pytest.raises(ValueError, match="^w2: expected the TRT-LLM BF16 BlockMajorK layout"):
        call(w2=decode_trtllm_bf16(c["g1"], c["g2"]).w2)
    with pytest.raises(ValueError, match="^w2: expected"):
        call(act=torch.zeros(1, 2, 128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="^shared_output: expected"):
        call(shared_output=torch.zeros(2, 128, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="^shared_output: dtype"):
        call(shared_output=c["shared"].float())
    with pytest.raises(ValueError, match="^map2: dimension 0"):
        call(map2=c["maps"][1][:-2].contiguous())
    with pytest.raises(ValueError, match="^config: BH"):
        call(config=dict(BH=128))


# --------------------------------------------------------------------------------------------------------
# row maps: every loaded value checked against the closed form, clamped into range, recorded
# --------------------------------------------------------------------------------------------------------


@triton.jit
def _trtllm_row_probe(out_ptr, N: tl.constexpr):
    j = tl.arange(0, N)
    tl.store(out_ptr + j, trtllm_row(j))


@pytest.mark.parametrize("h,ip", [(2048, 768), (2880, 2880), (2880, 2944), (7168, 2048), (5120, 704), (192, 192)])
def test_closed_form_is_the_layouts_row_map(h, ip) -> None:
    """``bf16.gemv.trtllm_row`` (what the kernels compare with) is ``trtllm_bf16_row_maps`` at every audited
    shape: map2[h] = row(h), map13[n] = row(2n + 1) (gate), map13[Ip + n] = row(2n) (up)."""
    n_max = 1 << (max(2 * ip, h) - 1).bit_length()
    rows = torch.empty(n_max, dtype=torch.int32)
    _trtllm_row_probe[(1,)](rows, N=n_max)
    m13, m2 = trtllm_bf16_row_maps(h, ip)
    n = torch.arange(ip)
    assert torch.equal(m2, rows[:h])
    assert torch.equal(m13[:ip], rows[2 * n + 1]) and torch.equal(m13[ip:], rows[2 * n])


def _maps_with(c: dict, i13: dict, i2: dict) -> tuple:
    m13, m2 = (m.clone() for m in c["maps"])
    for i, v in i13.items():
        m13[i] = v
    for i, v in i2.items():
        m2[i] = v
    return m13, m2


def _run(c: dict, maps: tuple) -> tuple:
    act = bf16_gate_up(c["x"], c["ids"], c["g1"], maps[0])
    return act, bf16_down_combine(act, c["ids"], c["tw"], c["g2"], maps[1], c["shared"])


def test_map_values_out_of_range_read_the_layouts_rows(small) -> None:
    """1 << 24, -1 and the first value past the end read the layout's own row (never outside the weights):
    the same bits as the layout's maps."""
    c = small
    two_ip, h = c["maps"][0].numel(), c["maps"][1].numel()
    act_ref, out_ref = _run(c, c["maps"])
    for v13, v2 in ((1 << 24, -1), (two_ip, h), (-(1 << 31), (1 << 31) - 1)):
        act, out = _run(c, _maps_with(c, {5: v13, two_ip - 1: v13}, {0: v2, h - 1: v2}))
        assert_same(act, act_ref, f"act, map13 value {v13}")
        assert_same(out, out_ref, f"out, map2 value {v2}")


def test_in_range_wrong_values_are_read_as_given(small) -> None:
    c = small
    m13, m2 = c["maps"]
    ip = m13.numel() // 2
    taps: dict = {}
    bf16_gate_up(c["x"], c["ids"], c["g1"], _maps_with(c, {ip + 1: int(m13[1])}, {})[0], taps=taps)
    # up row 1 now reads gate row 1's weights
    assert_same(taps["up_acc"][..., 1], taps["gate_acc"][..., 1], "up_acc read through the wrong map")


# --------------------------------------------------------------------------------------------------------
# the op (router: flint_moe.ops.route)
# --------------------------------------------------------------------------------------------------------

_HAVE_ROUTE = importlib.util.find_spec("flint_moe.ops.route") is not None
needs_route = pytest.mark.skipif(not _HAVE_ROUTE, reason="flint_moe.ops.route not present")


def _op_case(m: int = 2):
    from flint_moe.ops.route import make_route_counter

    c = make_case(5, 128, 64, None, 2, m, seed=11)
    gen = torch.Generator().manual_seed(12)
    c["router"] = (torch.randn(5, 128, generator=gen) * 0.1).to(torch.bfloat16)
    c["counter"] = make_route_counter(torch.device("cpu"))
    return c


def _op(c, taps=None, **kw):
    from flint_moe.ops.moe_bf16 import flint_moe_bf16_decode

    args = dict(
        x=c["x"],
        router_weight=c["router"],
        w13=c["g1"],
        w2=c["g2"],
        row_maps=c["maps"],
        top_k=c["k"],
        counter=c["counter"],
        shared_output=c["shared"],
    )
    args.update(kw)
    return flint_moe_bf16_decode(**args, taps=taps)


@needs_route
def test_op_end_to_end_from_taps() -> None:
    """The op's taps: routing feeds the experts; every order-free step exact; tapped == production."""
    c = _op_case()
    taps: dict = {}
    out = _op(c, taps)
    ids, tw = taps["ids"], taps["weights"]
    assert ids.shape == (c["M"], c["k"]) and tw.shape == (c["M"], c["k"])
    # the router's own outputs from its logits, steps 2-4 (E's tests check steps 1-4 in depth)
    assert torch.equal(ids.long(), R.topk_total_order(taps["logits"], c["k"]).long())
    sel = torch.gather(taps["logits"], 1, ids.long())
    assert_same(tw, R.renormalize(R.routing_scores(sel)), "weights")
    for t in range(c["M"]):
        for j in range(c["k"]):
            e = int(ids[t, j])
            acc = R.gate_up_accumulate_bf16(c["x"][t : t + 1], c["golden"].w13[e])
            assert bool(R.check_accumulator(taps["gate_acc"][t, j][None], acc[:, : c["I"]]).all())
            assert bool(R.check_accumulator(taps["up_acc"][t, j][None], acc[:, c["I"] :]).all())
            dacc = R.down_accumulate_bf16(taps["act"][t, j][None], c["golden"].w2[e])
            assert bool(R.check_accumulator(taps["down_acc"][t, j][None], dacc).all())
    assert_same(taps["act"], R.swiglu(taps["gate_acc"], taps["up_acc"]), "act")
    assert_same(taps["y"], R.down_output_bf16(taps["down_acc"]), "y")
    assert_same(out, R.add_shared(R.combine(tw, taps["y"]), c["shared"]), "out")
    assert taps["out"] is out
    assert_same(_op(c), out, "production vs tapped")


@needs_route
def test_op_rejects_bad_inputs() -> None:
    from flint_moe.ops.moe_bf16 import DECODE_BF16_MAX_TOKENS

    c = _op_case(1)
    with pytest.raises(NotImplementedError, match="DECODE_BF16_MAX_TOKENS"):
        big = torch.zeros(DECODE_BF16_MAX_TOKENS + 1, 128, dtype=torch.bfloat16)
        _op(c, x=big, shared_output=big)
    with pytest.raises(ValueError, match="^top_k"):
        _op(c, top_k=6)
    with pytest.raises(ValueError, match="^top_k"):
        _op(c, top_k=0)
    with pytest.raises(TypeError, match="^top_k"):
        _op(c, top_k=2.0)
    with pytest.raises(TypeError, match="^row_maps"):
        _op(c, row_maps=c["maps"][0])
    with pytest.raises(ValueError, match=r"^row_maps\[0\]"):
        _op(c, row_maps=(c["maps"][0][:-2].contiguous(), c["maps"][1]))
    with pytest.raises(ValueError, match="^w13: holds 5 experts"):
        _op(c, router_weight=c["router"][:4].contiguous())
    with pytest.raises(ValueError, match="^w2: expected"):
        _op(c, w2=c["g2"][:4].contiguous())
    with pytest.raises(ValueError, match="^router_weight: dimension 1"):
        _op(c, router_weight=c["router"][:, :64].contiguous())
    with pytest.raises(ValueError, match="^shared_output: dimension 0"):
        _op(c, shared_output=torch.zeros(2, 128, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="^shared_ready: expected a torch.cuda.Event or None, got object"):
        _op(c, shared_ready=object())
    with pytest.raises(ValueError, match="^shared_ready: a CUDA event only makes sense for CUDA tensors"):
        _op(c, shared_ready=mock.Mock(spec=torch.cuda.Event))  # an event (isinstance) on the CPU
    with pytest.raises(TypeError, match="^x: dtype"):
        _op(c, x=c["x"].float())


def test_row_map_value_check() -> None:
    from flint_moe.ops.moe_bf16 import check_bf16_row_map_values

    maps = trtllm_bf16_row_maps(192, 128)
    check_bf16_row_map_values(maps, 192, 128)
    with pytest.raises(ValueError, match=r"^row_maps\[1\]"):
        check_bf16_row_map_values((maps[0], maps[1].flip(0).contiguous()), 192, 128)


@needs_route
def test_op_row_map_values_checked_once_per_tensor() -> None:
    """Wrong map values (in range or not) are refused before any kernel reads them; a checked map tensor is not
    checked again until it is modified in place (its version counter)."""
    from flint_moe.ops import _checks

    c = _op_case(1)
    good = c["maps"]
    bad13 = good[0].flip(0).contiguous()  # a permutation, in range, but not the layout's map
    with pytest.raises(ValueError, match=r"^row_maps\[0\]: not the TRT-LLM BF16 row map"):
        _op(c, row_maps=(bad13, good[1]))
    oob = good[1].clone()
    oob[0] = 1 << 30  # would index far outside w2
    with pytest.raises(ValueError, match=r"^row_maps\[1\]"):
        _op(c, row_maps=(good[0], oob))
    _op(c)
    assert _checks._is_checked(good[0]) and _checks._is_checked(good[1])
    m2 = good[1].clone()
    _op(c, row_maps=(good[0], m2))
    assert _checks._is_checked(m2)
    m2[0] = 1 << 30  # in-place change after the check: checked again, refused
    assert not _checks._is_checked(m2)
    with pytest.raises(ValueError, match=r"^row_maps\[1\]"):
        _op(c, row_maps=(good[0], m2))


def test_top_k_check_wording() -> None:
    """One exception type and wording per violation, shared by every op (ops._checks.check_top_k)."""
    from flint_moe.ops._checks import check_top_k

    assert check_top_k(3, 4, "E = 4") == 3
    for bad in (True, 2.0, "2", None):
        with pytest.raises(TypeError, match=r"^top_k: expected an int, got "):
            check_top_k(bad, 4, "E = 4")
    for bad in (0, -1, 5):
        with pytest.raises(ValueError, match=rf"^top_k: must satisfy 1 <= top_k <= E = 4, got {bad}$"):
            check_top_k(bad, 4, "E = 4")


@needs_route
def test_op_refuses_cpu_tensors_without_interpreter(monkeypatch) -> None:
    """Without TRITON_INTERPRET the op names the CPU tensor instead of failing inside Triton."""
    from flint_moe.ops import _checks

    c = _op_case(1)
    monkeypatch.setattr(_checks, "INTERPRET", False)
    with pytest.raises(RuntimeError, match="^x: on the CPU.*TRITON_INTERPRET=1"):
        _op(c)
