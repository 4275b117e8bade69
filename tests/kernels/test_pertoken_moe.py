"""Per-token NVFP4 x NVFP4 routed experts (``routed_nvfp4_moe``) under Triton's interpreter (CPU CI).

Every tap of both kernels and the output against the golden model (``reference.pertoken_experts``): the
accumulators within their certified bound (``FP32_TRUNCATE``; the interpreter's numpy fp32 dot per K step is
not the wgmma's rounding) and fed to the golden model, every other stage bit for bit (tests/kernels/
_pertoken_check.py). Shapes exercise the padding (H = 160 -> 256, I = 176 -> 256) and partial K steps (BK = 64),
row blocks shared by tokens, experts with no pair; both activations; -1 slots and other ranks' experts;
``token_capacity`` with and without ``out``; quantizer stress rows (an all-zero row, one huge outlier, a row at
the E4M3 clamp, E2M1 ties); inputs never modified; the tapped build's output equals the production build's;
bad input. The launch options (config ``TAIL``: expert-wide row blocks; ``fc1`` / ``fc2`` ``SCALE_WORD``): every
combination gives outputs and taps bitwise equal to the options-off build and to the golden model, with experts
of more than BM pairs (the tail accumulator runs), -1 slots, other ranks' experts and ``token_capacity``; the
op's default at BM 128 (options on, ``grouped_config``) equals the options-off build bit for bit.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from flint_moe.kernels import orders as K
from flint_moe.kernels.nvfp4.grouped_gate_up import grouped_config
from flint_moe.ops import prepare_routed_nvfp4_weights, routed_nvfp4_moe

from ._pertoken_check import bits, check_pertoken_taps, first_diff

BACKEND = "interpreter"

CFG = {"fc1": {"BK": 64}, "fc2": {"BH": 64, "BK": 64}}


def _weights(E, H, I, gated, seed):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    fc1 = (torch.randn(E, (2 if gated else 1) * I, H, generator=g) * 0.05).to(torch.bfloat16)
    fc2 = (torch.randn(E, H, I, generator=g) * 0.05).to(torch.bfloat16)
    return prepare_routed_nvfp4_weights(fc1, fc2)


def _tokens(T, H, k, num_experts, seed, *, lo=-1):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, H, generator=g) * 2.0 ** torch.randint(-4, 5, (T, 1), generator=g)).to(torch.bfloat16)
    ids = torch.randint(lo, num_experts, (T, k), generator=g, dtype=torch.int32)
    p = torch.rand(T, k, generator=g)
    return x, ids, p


def _run(w, x, ids, p, *, n, off, act, cap=None, out=None, taps=None, bm=None):
    cfg = dict(CFG, **({"BM": bm} if bm else {}))
    return routed_nvfp4_moe(x, ids, p, w, num_experts=n, local_expert_offset=off, activation=act, out=out,
                            token_capacity=cap, taps=taps, config=cfg)  # fmt: skip


def _case(w, x, ids, p, *, n, off, act, cap=None, out=None):
    inputs = [t.clone() for t in (x, ids, p)]
    before = None if out is None else out.clone()
    taps: dict = {}
    got = _run(w, x, ids, p, n=n, off=off, act=act, cap=cap, out=out, taps=taps)
    counts = check_pertoken_taps(w, x, ids, p, taps, got, num_experts=n, offset=off, activation=act,
                                 token_capacity=cap, out_before=before)  # fmt: skip
    for a, b in zip((x, ids, p), inputs, strict=True):
        assert torch.equal(bits(a), bits(b)), "an input was modified"
    prod = _run(w, x, ids, p, n=n, off=off, act=act, cap=cap, out=None if out is None else before.clone())
    assert torch.equal(bits(prod), bits(got)), "production build differs from the tapped build"
    return counts, taps, got


@pytest.mark.parametrize("act", ["swiglu", "relu2"])
def test_every_stage_matches_golden_padded_sizes(act):
    E, H, I, T, k = 5, 160, 176, 9, 3  # noqa: E741
    w = _weights(E, H, I, act == "swiglu", seed=1)
    x, ids, p = _tokens(T, H, k, E, seed=2)
    ids[0] = torch.tensor([2, 2, -1], dtype=torch.int32)  # one token picks an expert twice
    ids[:, 1] = torch.where(ids[:, 1] == 4, 3, ids[:, 1])  # expert 4 only in slots 0 and 2
    counts, taps, _ = _case(w, x, ids, p, n=E, off=0, act=act)
    n1 = (2 if act == "swiglu" else 1) * I
    pairs = int((ids >= 0).sum())
    assert counts == {"fc1": pairs * n1, "fc2": pairs * H, "pairs": pairs}
    assert pairs < T * k, "the case must hold -1 slots"


def test_other_ranks_experts_and_minus_one_rows_add_nothing():
    # 12 global experts, this rank holds 4..7; a whole row of -1 and a row of only other ranks' experts
    E, H, I, T, k, off, n = 4, 256, 256, 7, 4, 4, 12  # noqa: E741
    w = _weights(E, H, I, True, seed=3)
    x, ids, p = _tokens(T, H, k, n, seed=4)
    ids[1] = -1
    ids[2] = torch.tensor([0, 11, 3, 8], dtype=torch.int32)
    ids[3] = torch.tensor([5, 5, 6, 7], dtype=torch.int32)
    counts, taps, out = _case(w, x, ids, p, n=n, off=off, act="swiglu")
    assert not bool(out[1].view(torch.int16).any()) and not bool(out[2].view(torch.int16).any())  # +0 rows
    assert counts["pairs"] == int(((ids >= off) & (ids < off + E)).sum())
    assert not bool(taps["w"][1].any()) and not bool(taps["w"][2].any())


def test_token_capacity_with_and_without_out():
    E, H, I, T, k = 3, 256, 256, 8, 2  # noqa: E741
    w = _weights(E, H, I, False, seed=5)
    x, ids, p = _tokens(T, H, k, E, seed=6)
    sentinel = torch.full((T, H), -3.5, dtype=torch.bfloat16)
    _, _, out = _case(w, x, ids, p, n=E, off=0, act="relu2", cap=5, out=sentinel)
    assert out is sentinel
    assert bool((out[5:] == -3.5).all()), "rows past token_capacity were written"
    _, _, fresh = _case(w, x, ids, p, n=E, off=0, act="relu2", cap=5)
    assert torch.equal(bits(fresh[:5]), bits(out[:5])) and not bool(fresh[5:].view(torch.int16).any())
    zero = routed_nvfp4_moe(x, ids, p, w, num_experts=E, local_expert_offset=0, activation="relu2",
                            out=torch.full((T, H), -3.5, dtype=torch.bfloat16), token_capacity=0)  # fmt: skip
    assert bool((zero == -3.5).all())


def test_quantizer_stress_rows_bf16_weights_int64_ids():
    # row 0 all zero (g = d = 1, FC1 gives +0 everywhere, so the FC2 input row is zero too), row 1 one huge
    # outlier (the other blocks' decode scales underflow to 0), row 2 at the E4M3 clamp (amax 2688 = 448 x 6),
    # row 3 E2M1 ties (0.25, 0.75, ..., 5 times a power of two), row 4 tiny values (g near 2^111)
    E, H, I, T, k = 3, 256, 256, 6, 3  # noqa: E741
    w = _weights(E, H, I, True, seed=7)
    x, ids, p = _tokens(T, H, k, E, seed=8, lo=0)
    x[0] = 0
    x[1] = torch.randn(H).to(torch.bfloat16) * 1e-3
    x[1, 37] = 3.0e4
    x[2, 5] = 2688.0
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * (H // 8)) * 2.0**-3
    x[3] = (ties * torch.where(torch.arange(H) % 3 == 0, -1.0, 1.0)).to(torch.bfloat16)
    x[4] = (torch.randn(H) * 2.0**-100).to(torch.bfloat16)
    counts, taps, _ = _case(w, x, ids.long(), p.to(torch.bfloat16), n=E, off=0, act="swiglu")
    assert counts["pairs"] == T * k
    assert float(taps["x_token_scale"][0]) == 1.0 and not bool(taps["x_codes"][0].any())
    assert not bool(taps["act"][0].view(torch.int32).any()) and bool((taps["a_token_scale"][0] == 1.0).all())
    assert int(taps["x_scale"][2].view(torch.uint8).max()) == 0x7E  # the block holding 2688: E4M3 448


def test_row_block_size_does_not_change_bits():
    E, H, I, T, k = 2, 256, 256, 12, 2  # noqa: E741
    w = _weights(E, H, I, True, seed=9)
    x, ids, p = _tokens(T, H, k, E, seed=10, lo=0)
    a = _run(w, x, ids, p, n=E, off=0, act="swiglu", bm=16)
    b = _run(w, x, ids, p, n=E, off=0, act="swiglu", bm=32)
    assert torch.equal(bits(a), bits(b))


def test_declared_orders():
    o = K.pertoken_orders(7168, 2048)
    assert o["fc1"]["kernel"] == "pertoken_fc1" and o["fc1"]["length"] == 7168 and o["fc1"]["part_length"] == 7168
    assert o["fc2"]["kernel"] == "pertoken_fc2" and o["fc2"]["length"] == 2048
    # the W4A16 grouped main loop: one wgmma chain over the K16 steps of the padded width, 16 slots each
    chain = [{"op": "mma_chain", "chain": ["k16"], "slots": ["slot"], "instruction": "wgmma.m64nNk16"}]
    assert o["fc1"]["program"] == chain and o["fc2"]["program"] == chain
    assert o["fc1"]["axes"] == [["k16", 7168 // 16], ["slot", 16]]
    assert o["fc2"]["axes"] == [["k16", 2048 // 16], ["slot", 16]]
    o = K.pertoken_orders(160, 176, config={"fc2": {"BK": 128}})
    # 160 -> 192 (BK 64), 176 -> 256 (BK 128): the chain runs over the zero-padded tail
    assert o["fc1"]["axes"] == [["k16", 192 // 16], ["slot", 16]] and o["fc1"]["part_length"] == 192
    assert o["fc2"]["axes"] == [["k16", 256 // 16], ["slot", 16]] and o["fc2"]["part_length"] == 256


def _bad_calls(w, wr, x, ids, p):
    base = dict(num_experts=3, local_expert_offset=0, activation="swiglu")
    f = routed_nvfp4_moe
    yield TypeError, "^hidden_states", lambda: f(x.float(), ids, p, w, **base)
    yield ValueError, "^hidden_states: hidden size", lambda: f(x[:, :128].contiguous(), ids, p, w, **base)
    yield ValueError, "^hidden_states", lambda: f(x.t(), ids, p, w, **base)
    yield TypeError, "^routing_map", lambda: f(x, ids.float(), p, w, **base)
    yield ValueError, "^routing_map", lambda: f(x, ids[:2], p, w, **base)
    yield TypeError, "^probabilities", lambda: f(x, ids, p.double(), w, **base)
    yield ValueError, "^probabilities", lambda: f(x, ids, p[:, :1].contiguous(), w, **base)
    yield TypeError, "^weights", lambda: f(x, ids, p, object(), **base)
    yield ValueError, "^activation", lambda: f(x, ids, p, w, **{**base, "activation": "relu2"})
    yield ValueError, "^activation", lambda: f(x, ids, p, wr, **base)
    yield ValueError, "^activation", lambda: f(x, ids, p, w, **{**base, "activation": "gelu"})
    yield ValueError, "^local_expert_offset", lambda: f(x, ids, p, w, **{**base, "local_expert_offset": 1})
    yield TypeError, "^num_experts", lambda: f(x, ids, p, w, **{**base, "num_experts": 3.0})
    yield ValueError, "^token_capacity", lambda: f(x, ids, p, w, token_capacity=5, **base)
    yield TypeError, "^token_capacity", lambda: f(x, ids, p, w, token_capacity=True, **base)
    yield ValueError, "^out", lambda: f(x, ids, p, w, out=torch.empty(4, 256, dtype=torch.bfloat16), **base)
    yield ValueError, "^out: shares memory", lambda: f(x, ids, p, w, out=x, **base)
    yield TypeError, "^taps", lambda: f(x, ids, p, w, taps=[], **base)
    yield ValueError, "^config", lambda: f(x, ids, p, w, config={"gate_up": {}}, **base)
    yield ValueError, "^pertoken_fc1: config BC", lambda: f(x, ids, p, w, config={"fc1": {"BC": 128}}, **base)
    yield ValueError, "^pertoken_fc1: config BC = 16", lambda: f(x, ids, p, w, config={"fc1": {"BC": 16}}, **base)
    yield ValueError, "^config: TAIL", lambda: f(x, ids, p, w, config={"TAIL": 24}, **base)
    yield ValueError, "^config: TAIL", lambda: f(x, ids, p, w, config={"TAIL": True}, **base)
    yield ValueError, "SCALE_WORD needs BK", lambda: f(x, ids, p, w, config={"fc2": {"BK": 32, "SCALE_WORD": True}},
                                                       **base)  # fmt: skip
    yield ValueError, "^pertoken_fc1: config SCALE_WORD", lambda: f(x, ids, p, w, config={"fc1": {"SCALE_WORD": 1}},
                                                                    **base)  # fmt: skip


def test_bad_inputs_raise_naming_the_tensor():
    w = _weights(3, 256, 256, True, seed=11)
    wr = _weights(3, 256, 256, False, seed=11)
    x, ids, p = _tokens(3, 256, 2, 3, seed=12)
    for exc, pattern, call in _bad_calls(w, wr, x, ids, p):
        with pytest.raises(exc, match=pattern):
            call()
    with pytest.raises(ValueError, match="^fc1_weight"):
        prepare_routed_nvfp4_weights(torch.zeros(2, 48, 32, dtype=torch.bfloat16),
                                     torch.zeros(2, 32, 32, dtype=torch.bfloat16))  # fmt: skip


def test_prepare_refreshes_in_place():
    g = torch.Generator().manual_seed(13)
    fc1 = (torch.randn(2, 2 * 64, 128, generator=g) * 0.1).to(torch.bfloat16)
    fc2 = (torch.randn(2, 128, 64, generator=g) * 0.1).to(torch.bfloat16)
    w = prepare_routed_nvfp4_weights(fc1, fc2)
    ptr = w.fc1_data.data_ptr()
    w2 = prepare_routed_nvfp4_weights(fc1 * 2, fc2, out=w)
    assert w2 is w and w.fc1_data.data_ptr() == ptr
    assert torch.equal(w.fc1_data, prepare_routed_nvfp4_weights(fc1 * 2, fc2).fc1_data)


@pytest.mark.parametrize("act", ["swiglu", "relu2"])
def test_default_launch_config(act):
    # the op's defaults (BC 64 gated / 128 non-gated, BK 64, BH 128, BM from the pair count)
    E, H, I, T, k = 3, 256, 256, 5, 2  # noqa: E741
    w = _weights(E, H, I, act == "swiglu", seed=14)
    x, ids, p = _tokens(T, H, k, E, seed=15)
    taps: dict = {}
    out = routed_nvfp4_moe(x, ids, p, w, num_experts=E, local_expert_offset=0, activation=act, taps=taps)
    counts = check_pertoken_taps(w, x, ids, p, taps, out, num_experts=E, offset=0, activation=act)
    assert counts["pairs"] == int((ids >= 0).sum())


def _options_run(w, x, ids, p, *, n, off, act, cap, base, tail, sw1, sw2, taps=None):
    """One run of the op with launch options: config ``base`` plus TAIL / fc1 / fc2 ``SCALE_WORD``; ``out`` a
    fresh sentinel buffer (rows past ``cap`` must stay)."""
    cfg = {**base, "TAIL": tail, "fc1": {**base.get("fc1", {}), "SCALE_WORD": sw1},
           "fc2": {**base.get("fc2", {}), "SCALE_WORD": sw2}}  # fmt: skip
    out = torch.full((x.shape[0], x.shape[1]), -3.5, dtype=torch.bfloat16)
    return routed_nvfp4_moe(x, ids, p, w, num_experts=n, local_expert_offset=off, activation=act, out=out,
                            token_capacity=cap, taps=taps, config=cfg)  # fmt: skip


def _assert_taps_equal(got: dict, ref: dict, what: str) -> None:
    assert sorted(got) == sorted(ref), what
    for name in sorted(ref):
        d = first_diff(got[name], ref[name])
        assert d == "", f"{what}: tap {name}: {d}"


#: The option combinations (TAIL, fc1 SCALE_WORD, fc2 SCALE_WORD) run per activation: every one for SwiGLU, each
#: option alone and all on for squared ReLU (the options touch the main loop, which the activations share).
_COMBOS = {"swiglu": list(itertools.product((0, 16), (False, True), (False, True))),
           "relu2": [(16, False, False), (0, True, True), (16, True, True)]}  # fmt: skip


@pytest.mark.parametrize("act", ["swiglu", "relu2"])
def test_launch_options_bitwise_equal_every_combination(act):
    # BM 16: expert 0 holds 40 pairs (blocks of 16 + 16 and 8 with TAIL 16), expert 1 about 18 (16 + 2);
    # -1 slots, another rank's experts (global ids 0..1 and 6..7; this rank holds 2..5), capacity 27 of 30 tokens;
    # padded widths (H 160 -> 256, I 176 -> 256) with partial K steps (BK 64)
    E, H, I, T, k, off, n, cap = 4, 160, 176, 30, 3, 2, 8, 27  # noqa: E741
    w = _weights(E, H, I, act == "swiglu", seed=21)
    x, ids, p = _tokens(T, H, k, n, seed=22)
    ids[:, 0] = torch.where(torch.arange(T) < 26, off, ids[:, 0])  # expert 0: 26 tokens in slot 0
    ids[:14, 1] = off  # and 14 more in slot 1
    ids[3, 2] = -1
    loc = ids[:cap] - off
    counts = torch.bincount(loc[(loc >= 0) & (loc < E)].long(), minlength=E)
    assert int(counts[0]) > 32 and bool((ids[:cap] == -1).any()) and bool(((loc < 0) | (loc >= E)).any())
    base = {"BM": 16, "fc1": dict(CFG["fc1"]), "fc2": dict(CFG["fc2"])}
    ref_taps: dict = {}
    ref = _options_run(w, x, ids, p, n=n, off=off, act=act, cap=cap, base=base, tail=0, sw1=False, sw2=False,
                       taps=ref_taps)  # fmt: skip
    for tail, sw1, sw2 in _COMBOS[act]:
        what = f"TAIL {tail}, SCALE_WORD fc1 {sw1} fc2 {sw2}"
        taps: dict = {}
        got = _options_run(w, x, ids, p, n=n, off=off, act=act, cap=cap, base=base, tail=tail, sw1=sw1, sw2=sw2,
                           taps=taps)  # fmt: skip
        assert first_diff(got, ref) == "", what
        _assert_taps_equal(taps, ref_taps, what)
        assert bool((got[cap:] == -3.5).all()), f"{what}: rows past token_capacity were written"
    # all options on: the production build, and every stage against the golden model
    prod = _options_run(w, x, ids, p, n=n, off=off, act=act, cap=cap, base=base, tail=16, sw1=True, sw2=True)
    assert first_diff(prod, ref) == "", "all options on: production build"
    before = torch.full((T, H), -3.5, dtype=torch.bfloat16)
    counted = check_pertoken_taps(w, x, ids, p, taps, got, num_experts=n, offset=off, activation=act,
                                  token_capacity=cap, out_before=before)  # fmt: skip
    assert counted["pairs"] == int(counts.sum())


def test_default_options_at_large_blocks_equal_options_off():
    # 2 local experts, 100 tokens x 2 slots, expert 0 in 140 of the 200 pairs: mean 100 pairs per expert ->
    # BM 128, where the op's default (the grouped path's, from 8 pairs per expert) turns TAIL 32 and
    # SCALE_WORD on; expert 0's 140 pairs fill the tail
    E, H, I, T, k = 2, 256, 256, 100, 2  # noqa: E741
    assert grouped_config(T * k, E) == {"BM": 128, "num_warps": 8, "TAIL": 32, "SCALE_WORD": True}
    w = _weights(E, H, I, True, seed=23)
    x, ids, p = _tokens(T, H, k, E, seed=24, lo=0)
    ids[:, 0] = 0
    ids[:40, 1] = 0
    ids[40:, 1] = 1
    assert int((ids == 0).sum()) == 140
    taps: dict = {}
    default = routed_nvfp4_moe(x, ids, p, w, num_experts=E, local_expert_offset=0, activation="swiglu", taps=taps)
    off_taps: dict = {}
    off_cfg = {"TAIL": 0, "fc1": {"SCALE_WORD": False}, "fc2": {"SCALE_WORD": False}}
    plain = routed_nvfp4_moe(x, ids, p, w, num_experts=E, local_expert_offset=0, activation="swiglu",
                             taps=off_taps, config=off_cfg)  # fmt: skip
    assert first_diff(default, plain) == ""
    _assert_taps_equal(taps, off_taps, "default vs options off at BM 128")
    counts = check_pertoken_taps(w, x, ids, p, taps, default, num_experts=E, offset=0, activation="swiglu")
    assert counts["pairs"] == T * k


def test_default_columns_per_program():
    """``default_bc``: gated row blocks of <= 32 pairs take 32 columns (64 weight rows), larger ones 64 (128
    rows); non-gated tiles 128 columns at every block size."""
    from flint_moe.kernels.nvfp4.pertoken_fc1 import default_bc

    assert [default_bc(True, bm) for bm in (16, 32, 64, 128, 256)] == [32, 32, 64, 64, 64]
    assert [default_bc(False, bm) for bm in (16, 32, 256)] == [128, 128, 128]
