"""Grouped NVFP4 path under Triton's interpreter (CPU CI): golden model fed the kernels' own taps.

DeepSeek-like properties scaled down: E and H not powers of two, k = 3 of E = 6..10, I a multiple of 64 and
a padded I (176 -> 192), K steps with a partial last step (H = 160 with BK = 64; I = 176 with BK = 64),
row blocks shared by several tokens, experts with no token and one expert picked by every token.
Order-free steps (global scale, SwiGLU, bf16 casts, combine, shared add) are compared bit for bit for every
pair; accumulators against the certified bound of the kernels' documented order (``FP32_TRUNCATE``, the
plain any-order tensor-core model). The tapped build's outputs equal the production build's bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.nvfp4.grouped_down import nvfp4_grouped_down
from flint_moe.kernels.nvfp4.grouped_gate_up import (
    GROUPED_GATE_UP_CONFIG,
    _cfg,
    default_bk,
    grouped_config,
    grouped_launch_kwargs,
    nvfp4_grouped_gate_up,
    row_block_options,
)
from flint_moe.kernels.nvfp4.permute import moe_permute
from flint_moe.ops import decode_max_tokens, flint_moe, flint_moe_grouped, make_route_counter

from ._grouped_check import check_grouped_taps, ids_with_counts
from ._nvfp4_check import make_inputs, make_weights, same
from ._router_check import check_route

BACKEND = "interpreter"

# Interpreter configs: small K steps so that H = 160 and I = 176 end in a partial step.
GU = {"BC": 32, "BK": 64}
DN = {"BH": 64, "BK": 64}


def _run(w, x, ids, tw, sh, taps=None, bm=16):
    perm = moe_permute(ids, w.num_experts, bm)
    act = nvfp4_grouped_gate_up(x, ids, perm, w, taps=taps, config=GU)
    return nvfp4_grouped_down(act, ids, tw, perm, w, sh, taps=taps, config=DN)


def _all_pairs(M, k):
    return [(m, j) for m in range(M) for j in range(k)]


def test_kernels_match_golden_from_taps_and_production():
    E, H, I, M, k = 6, 160, 192, 11, 3
    w = make_weights(E, H, I, seed=3)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=3)
    x0, ids0, tw0, sh0 = (t.clone() for t in (x, ids, tw, sh))
    taps: dict = {}
    out = _run(w, x, ids, tw, sh, taps)
    counts = check_grouped_taps(w, x, ids, tw, sh, taps, out, acc_pairs=_all_pairs(M, k))
    assert counts["pairs"] == M * k and counts["acc_elements"] == M * k * (2 * I + H)
    for a, b in ((x, x0), (ids, ids0), (tw, tw0), (sh, sh0)):
        assert same(a, b), "an input was modified"
    assert same(_run(w, x, ids, tw, sh), out), "production build differs from the tapped build"
    # another row-block size and launch shape give the same act bits here (numpy dots per K step)
    assert same(_run(w, x, ids, tw, sh, bm=32), out)


def test_empty_experts_and_expert_with_every_token_padded_intermediate():
    # I = 176 stored padded to 192 (padded rows / columns never read); expert 4 is picked by every token
    # (19 pairs: two row blocks of 16), experts 1, 3, 6 by none.
    E, H, I, M, k = 7, 96, 176, 19, 2
    w = make_weights(E, H, I, seed=5, pad_to=192)
    x, _, tw, sh = make_inputs(M, H, E, k, seed=5)
    ids = torch.empty(M, k, dtype=torch.int32)
    ids[:, 0] = 4
    ids[:, 1] = torch.tensor([0, 2, 5])[torch.arange(M) % 3].to(torch.int32)
    taps: dict = {}
    out = _run(w, x, ids, tw, sh, taps)
    check_grouped_taps(w, x, ids, tw, sh, taps, out, acc_pairs=[(0, 0), (M - 1, 0), (5, 1), (M - 1, 1)])


def test_poisoned_padding_changes_nothing():
    """NaN / 0x7F bytes in the padded rows and columns of w1 / w2 codes and scales change no bit."""
    E, H, I, M, k = 5, 96, 176, 10, 2
    w = make_weights(E, H, I, seed=7, pad_to=192)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=7)
    clean = _run(w, x, ids, tw, sh)
    w.w1.view(E, -1, 128, H // 2)[:, -1, 48:64] = 0x77  # up rows of padded columns 176..191
    w.w1.view(E, -1, 128, H // 2)[:, -1, 112:128] = 0x77  # gate rows of padded columns
    w.w2[:, :, I // 2 :] = 0xFF
    w.w2_sf_swizzled.view(torch.uint8).view(E, -1)[:, :] = torch.where(
        w.w2_sf_swizzled.view(torch.uint8).view(E, -1) == 0, 0x7F, w.w2_sf_swizzled.view(torch.uint8).view(E, -1)
    )
    assert same(_run(w, x, ids, tw, sh), clean)
    # SCALE_WORD: the last K step's scale words hold columns past K / 16 (w2: I / 16 = 11 of 12, the twelfth
    # poisoned with 0x7F, a NaN in E4M3): masked to 0, so the same bits
    perm = moe_permute(ids, E, 16)
    _, out_sw = _run_perm(w, x, ids, tw, sh, perm, sw=True)
    assert same(out_sw, clean)
    _, out_rows = _run_perm(w, x, ids, tw, sh, moe_permute(ids, E, 16, 16), sw=True)
    assert same(out_rows, clean)


def _op_inputs(E, H, I, M, seed):  # noqa: E741
    """The op's inputs: ``make_weights(E, H, I, seed)``, then from one generator seeded ``seed`` x bf16 [M, H],
    the router bf16 [E, H] (times 0.1) and the shared output bf16 [M, H]; a CPU route counter."""
    w = make_weights(E, H, I, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g).to(torch.bfloat16)
    router = (torch.randn(E, H, generator=g) * 0.1).to(torch.bfloat16)
    shared = torch.randn(M, H, generator=g).to(torch.bfloat16)
    return w, x, router, shared, make_route_counter("cpu")


def test_op_end_to_end_and_dispatch():
    """route (tensor-core GEMM + top-k for M > 8) + permutation + grouped GEMMs; ``flint_moe`` dispatches
    M > ``decode_max_tokens(E, k)`` (10 // 3 = 3 here) to it (same bits)."""
    E, H, I, k = 10, 160, 64, 3
    M = decode_max_tokens(E, k) + 6
    assert M == 9  # past the router's GEMV range (8)
    w, x, router, shared, counter = _op_inputs(E, H, I, M, 9)
    taps: dict = {}
    out_t = flint_moe_grouped(x, router, w, k, counter, shared, taps=taps)
    check_route(x, router, k, taps["ids"], taps["weights"], taps)
    check_grouped_taps(w, x, taps["ids"], taps["weights"], shared, taps, out_t, acc_pairs=[(0, 0), (M - 1, 2)])
    assert same(flint_moe_grouped(x, router, w, k, counter, shared), out_t)
    assert same(flint_moe(x, router, w, k, counter, shared), out_t)
    # the grouped op also serves M <= decode_max_tokens(E, k) (the conformance path runs both sides)
    t2: dict = {}
    o2 = flint_moe_grouped(x[:3].contiguous(), router, w, k, counter, shared[:3].contiguous(), taps=t2)
    check_grouped_taps(w, x[:3], t2["ids"], t2["weights"], shared[:3], t2, o2)


_STAGES = ("gate_acc", "up_acc", "act", "down_acc", "y", "out")


def _run_perm(w, x, ids, tw, sh, perm, sw=False):
    taps: dict = {}
    act = nvfp4_grouped_gate_up(x, ids, perm, w, taps=taps, config={**GU, "SCALE_WORD": sw})
    out = nvfp4_grouped_down(act, ids, tw, perm, w, sh, taps=taps, config={**DN, "SCALE_WORD": sw})
    return taps, out


def test_expert_wide_row_blocks_same_bits_as_default():
    """Row blocks of BM + tail pairs (two accumulators per program, the tail's MMAs only past BM pairs) give the
    default schedule's bits in both GEMMs: experts with 0, 1, 128, 129, 160 = 128 + 32 and 200 pairs (BM 128,
    tail 32: one program each, two for the last), H = 160 and I = 176 (padded to 192) ending in a partial K
    step of 64; also BM 16 with tail 16 (every count above 32 split over several programs)."""
    E, H, I, k = 6, 160, 176, 3  # noqa: E741
    counts = [0, 1, 128, 129, 160, 200]
    w = make_weights(E, H, I, seed=21, pad_to=192)
    ids = ids_with_counts(counts, k, 21)
    M = ids.shape[0]
    x, _, tw, sh = make_inputs(M, H, E, k, seed=21)
    t0, o0 = _run_perm(w, x, ids, tw, sh, moe_permute(ids, E, 128))
    rows = moe_permute(ids, E, 128, 32)
    assert ((rows.block_end - rows.block_start).tolist()[:6]) == [1, 128, 129, 160, 160, 40]
    t1, o1 = _run_perm(w, x, ids, tw, sh, rows)
    assert same(o1, o0), "expert-wide row blocks: out differs from the default schedule"
    for name in _STAGES:
        assert same(t1[name], t0[name]), f"expert-wide row blocks: {name} differs"
    # the default itself against the golden model, at pairs in the main and in the tail part of a block:
    # positions 0, 127 (main) and 128, 159 (tail) of expert 4, position 160 (second block) of expert 5
    order = rows.order.tolist()
    off = rows.offsets.tolist()
    picks = [order[off[4] + i] for i in (0, 127, 128, 159)] + [order[off[5] + 160], order[off[3] + 128]]
    check_grouped_taps(w, x, ids, tw, sh, t1, o1, acc_pairs=[(p // k, p % k) for p in picks])
    t2, o2 = _run_perm(w, x, ids, tw, sh, moe_permute(ids, E, 16, 16))
    assert same(o2, o0)
    for name in _STAGES:
        assert same(t2[name], t0[name]), f"BM 16 + tail 16: {name} differs"
    act = nvfp4_grouped_gate_up(x, ids, rows, w, config=GU)
    assert same(nvfp4_grouped_down(act, ids, tw, rows, w, sh, config=DN), o0), "production build differs"
    # the scales as one word per row per 64 K (SCALE_WORD), default and expert-wide schedules: the same bits
    for perm in (moe_permute(ids, E, 128), rows):
        t3, o3 = _run_perm(w, x, ids, tw, sh, perm, sw=True)
        assert same(o3, o0)
        for name in _STAGES:
            assert same(t3[name], t0[name]), f"SCALE_WORD, tail {perm.tail}: {name} differs"


def test_op_tail_config_same_bits():
    """``flint_moe_grouped(config={"TAIL": 32})``: tail min(32, BM) = 16 at BM 16 (M = 40, E = 5, k = 2: 16
    pairs per expert on average, so several experts run a tail); the same bits and taps as the default."""
    E, H, I, k, M = 5, 96, 64, 2, 40  # noqa: E741
    w, x, router, shared, counter = _op_inputs(E, H, I, M, 23)
    t0: dict = {}
    t1: dict = {}
    o0 = flint_moe_grouped(x, router, w, k, counter, shared, taps=t0)
    o1 = flint_moe_grouped(x, router, w, k, counter, shared, taps=t1, config={"TAIL": 32})
    counts = torch.bincount(t0["ids"].reshape(-1).long(), minlength=E)
    assert grouped_config(M * k, E)["BM"] == 16 and int((counts > 16).sum()) >= 1, counts
    assert same(o1, o0)
    for name in _STAGES:
        assert same(t1[name], t0[name]), name


def test_grouped_config():
    on, off = {"TAIL": 32, "SCALE_WORD": True}, {"TAIL": 0, "SCALE_WORD": False}
    assert grouped_config(8 * 16384, 256) == {"BM": 256, "num_warps": 8, **on}
    assert grouped_config(8 * 4096, 256) == {"BM": 128, "num_warps": 8, **on}
    assert grouped_config(8 * 1024, 256) == {"BM": 32, "num_warps": 4, **on}
    assert grouped_config(8 * 2048, 256) == {"BM": 64, "num_warps": 8, **on}
    # the options from 8 pairs per expert on (mean rounded up): M = 256 at k = 8, E = 256 is the first
    assert grouped_config(8 * 256, 256) == {"BM": 16, "num_warps": 4, **on}
    assert grouped_config(8 * 225, 256) == {"BM": 16, "num_warps": 4, **on}  # 1800 pairs: 7.03 -> 8
    assert grouped_config(8 * 224, 256) == {"BM": 16, "num_warps": 4, **off}  # 1792 pairs: exactly 7
    assert grouped_config(8 * 16, 256) == {"BM": 16, "num_warps": 4, **off}
    assert row_block_options(7) == off and row_block_options(8) == on


def test_op_row_block_defaults_same_bits(monkeypatch):
    """From 8 pairs per expert the op launches expert-wide row blocks (tail 32) with the scales as words in
    both GEMMs by default (M = 240, E = 4, k = 2: 120 pairs per expert on average, so BM 128; expert 0,
    preferred by the router, has more than 128 pairs and runs its tail); the same bits and taps as both
    options off, and as the golden model. An explicit option, or a given BK that is not a multiple of 64, wins
    over the default; a given BM does not change it."""
    import flint_moe.ops.moe_nvfp4_grouped as op

    E, H, I, k, M = 4, 96, 64, 2, 240  # noqa: E741
    w = make_weights(E, H, I, seed=29)
    g = torch.Generator().manual_seed(29)
    x = (torch.randn(M, H, generator=g) + 0.5).to(torch.bfloat16)
    router = torch.randn(E, H, generator=g) * 0.1
    router[0] += 0.02  # expert 0 preferred: most tokens pick it, more than 128 pairs
    router = router.to(torch.bfloat16)
    shared = torch.randn(M, H, generator=g).to(torch.bfloat16)
    seen = []
    gate_up, down = op.launch_grouped_gate_up, op.launch_grouped_down

    def spy_gate_up(x, ids, perm, weights, *, taps=None, config=None):
        seen.append((perm.block_m, perm.tail, config))
        return gate_up(x, ids, perm, weights, taps=taps, config=config)

    def spy_down(*args, config=None, **kw):
        seen.append(("down", config))
        return down(*args, config=config, **kw)

    monkeypatch.setattr(op, "launch_grouped_gate_up", spy_gate_up)
    monkeypatch.setattr(op, "launch_grouped_down", spy_down)
    t0: dict = {}
    t1: dict = {}
    off = {"TAIL": 0, "gate_up": {"SCALE_WORD": False}, "down": {"SCALE_WORD": False}}
    o0 = flint_moe_grouped(x, router, w, k, make_route_counter("cpu"), shared, taps=t0, config=off)
    o1 = flint_moe_grouped(x, router, w, k, make_route_counter("cpu"), shared, taps=t1)
    sw = {"SCALE_WORD": True}
    assert seen == [(128, 0, {"SCALE_WORD": False}), ("down", {"SCALE_WORD": False}), (128, 32, sw), ("down", sw)]
    counts = torch.bincount(t1["ids"].reshape(-1).long(), minlength=E)
    assert int((counts > 128).sum()) >= 1, counts
    assert same(o1, o0)
    for name in _STAGES:
        assert same(t1[name], t0[name]), name
    ids, tw = t1["ids"], t1["weights"]
    check_grouped_taps(w, x, ids, tw, shared, t1, o1, acc_pairs=_all_pairs(M, k)[::7])
    seen.clear()
    flint_moe_grouped(x, router, w, k, make_route_counter("cpu"), shared, config={"BM": 16, "gate_up": {"BK": 32}})
    assert seen == [(16, 16, {"BK": 32}), ("down", sw)]


def test_default_k_step():
    """BK 128 only for 128-pair row blocks over a K that is a multiple of 128; an explicit BK wins."""
    assert [default_bk(bm, 7168) for bm in (16, 32, 64, 128, 256)] == [64, 64, 64, 128, 64]
    assert (default_bk(128, 2048), default_bk(128, 2880), default_bk(128, 1536), default_bk(128, 96)) == (
        128, 64, 128, 64)  # fmt: skip
    cfg = _cfg(None, GROUPED_GATE_UP_CONFIG, "t")
    assert grouped_launch_kwargs(cfg, 128, False, 7168)["BK"] == 128
    assert grouped_launch_kwargs(cfg, 128, False, 2880)["BK"] == 64
    assert grouped_launch_kwargs(cfg, 64, False, 7168)["BK"] == 64
    assert grouped_launch_kwargs(_cfg({"BK": 64}, GROUPED_GATE_UP_CONFIG, "t"), 128, False, 7168)["BK"] == 64
    assert grouped_launch_kwargs(_cfg({"BK": 256}, GROUPED_GATE_UP_CONFIG, "t"), 16, False, 96)["BK"] == 256


def test_default_k_step_of_128_matches_golden():
    """Row blocks of 128 with H = 256 and I = 128 (multiples of 128): the default launch takes BK = 128 in both
    GEMMs (two K steps of gate/up, one of down); checked against the golden model like the BK 64 runs."""
    E, H, I, M, k = 6, 256, 128, 13, 3
    w = make_weights(E, H, I, seed=11)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=11)
    perm = moe_permute(ids, E, 128)
    taps: dict = {}
    act = nvfp4_grouped_gate_up(x, ids, perm, w, taps=taps)
    out = nvfp4_grouped_down(act, ids, tw, perm, w, sh, taps=taps)
    counts = check_grouped_taps(w, x, ids, tw, sh, taps, out, acc_pairs=_all_pairs(M, k))
    assert counts["pairs"] == M * k and counts["acc_elements"] == M * k * (2 * I + H)
    act128 = nvfp4_grouped_gate_up(x, ids, perm, w, config={"BK": 128})
    assert same(act128, act), "the default launch is not the BK 128 build"
    assert same(nvfp4_grouped_down(act128, ids, tw, perm, w, sh, config={"BK": 128}), out)


def test_bad_inputs_raise():
    E, H, I, M, k = 5, 96, 64, 9, 2
    w = make_weights(E, H, I, seed=1)
    x, ids, tw, sh = make_inputs(M, H, E, k, seed=1)
    perm = moe_permute(ids, E, 16)
    with pytest.raises(TypeError, match="^perm"):
        nvfp4_grouped_gate_up(x, ids, object(), w)
    with pytest.raises(ValueError, match="^perm"):
        nvfp4_grouped_gate_up(x, ids, moe_permute(ids, E + 1, 16), w)
    with pytest.raises(ValueError, match="^perm.order"):
        nvfp4_grouped_gate_up(x[:4].contiguous(), ids[:4].contiguous(), perm, w)
    with pytest.raises(TypeError, match="^x"):
        nvfp4_grouped_gate_up(x.float(), ids, perm, w)
    with pytest.raises(ValueError, match="BK"):
        nvfp4_grouped_gate_up(x, ids, perm, w, config={"BK": 48})
    for bc in (16, 128):  # 16: a 32-row tile, another MMA than the declared order's wgmma
        with pytest.raises(ValueError, match=f"BC = {bc} must be 32 or 64"):
            nvfp4_grouped_gate_up(x, ids, perm, w, config={"BC": bc})
    with pytest.raises(ValueError, match="unknown config"):
        nvfp4_grouped_gate_up(x, ids, perm, w, config={"BN": 8})
    with pytest.raises(ValueError, match="SCALE_WORD needs BK a multiple of 64"):
        nvfp4_grouped_gate_up(x, ids, perm, w, config={"BK": 32, "SCALE_WORD": True})
    with pytest.raises(ValueError, match="SCALE_WORD must be a bool"):
        nvfp4_grouped_gate_up(x, ids, perm, w, config={"SCALE_WORD": 1})
    act = torch.zeros(M * k, I, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^act"):
        nvfp4_grouped_down(act[:3], ids, tw, perm, w, sh)
    with pytest.raises(TypeError, match="^tw"):
        nvfp4_grouped_down(act, ids, tw.double(), perm, w, sh)
    with pytest.raises(ValueError, match="^shared_output"):
        nvfp4_grouped_down(act, ids, tw, perm, w, sh[:, :32])
    with pytest.raises(ValueError, match="BH"):
        nvfp4_grouped_down(act, ids, tw, perm, w, sh, config={"BH": 32})
    router = torch.zeros(E, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="top_k"):
        flint_moe_grouped(x, router, w, E + 1, None, sh)
    with pytest.raises(TypeError, match="^router_weight"):
        flint_moe_grouped(x, router.float(), w, k, None, sh)
    with pytest.raises(TypeError, match="^weights"):
        flint_moe_grouped(x, router, object(), k, None, sh)
    with pytest.raises(ValueError, match="^config"):
        flint_moe_grouped(x, router, w, k, None, sh, config={"BN": 1})
    with pytest.raises(ValueError, match="^tail"):
        flint_moe_grouped(x, router, w, k, make_route_counter("cpu"), sh, config={"TAIL": 12})
    bad = moe_permute(ids, E, 16)
    object.__setattr__(bad, "tail", 48)
    with pytest.raises(ValueError, match="^perm: tail"):
        nvfp4_grouped_gate_up(x, ids, bad, w)
    assert flint_moe_grouped(x[:0], router, w, k, None, sh[:0]).shape == (0, H)
