"""Grouped NVFP4 path on the H200 (marked gpu): compiled kernels, real shapes, the golden model fed the taps.

Real layers (DeepSeek-V3 E=256 H=7168 I=2048 k=8, Qwen3-235B, gpt-oss-120b, a padded I) at M on both sides of the
decode / grouped threshold (``ops.decode_max_tokens``) up to 16384: every order-free step (global scale, SwiGLU,
bf16 casts, combine, shared add) bit-exact from the taps for EVERY (token, slot) pair; accumulators within the
certified FP32_TRUNCATE bound (tensor-core accumulation, any order) for sampled pairs; tapped build == production
build; repeated runs and CUDA-graph replays bitwise identical; E2M1 decode variants (inline PTX vs plain integer
ops) give identical bits; an expert picked by every token; row independence of the tile schedule; the expert-wide
row blocks (op config ``TAIL``) bitwise equal to the default schedule.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.nvfp4.grouped_down import nvfp4_grouped_down
from flint_moe.kernels.nvfp4.grouped_gate_up import grouped_config, nvfp4_grouped_gate_up
from flint_moe.kernels.nvfp4.permute import moe_permute
from flint_moe.ops import decode_max_tokens, flint_moe, flint_moe_grouped, make_route_counter, route

from ._grouped_check import check_grouped_taps
from ._nvfp4_check import capture_graph, run_op_checked, same

pytestmark = pytest.mark.gpu
BACKEND = "gpu"

_LAYERS: dict = {}


def _weights(E, H, I, seed=0):
    key = (E, H, I, seed)
    if key not in _LAYERS:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from benchmarks.bench_decode_nvfp4 import random_weights

        _LAYERS.clear()  # one real layer at a time (DeepSeek-V3: 6.3 GB)
        _LAYERS[key] = random_weights(E, H, I, seed=seed)
    return _LAYERS[key]


def _tokens(M, H, E, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, H, generator=g, device="cuda").to(torch.bfloat16)
    router = (torch.randn(E, H, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    shared = torch.randn(M, H, generator=g, device="cuda").to(torch.bfloat16)
    return x, router, shared


def _op_case(E, H, I, k, M, seed, acc_pairs):
    w = _weights(E, H, I)
    x, router, shared = _tokens(M, H, E, seed)
    counter = make_route_counter("cuda")
    taps, _, out = run_op_checked(
        flint_moe_grouped, check_grouped_taps, w, x, router, k, counter, shared, acc_pairs=acc_pairs
    )
    return w, x, router, shared, counter, taps, out


@pytest.mark.parametrize(
    "E,H,I,k,M",
    [(256, 7168, 2048, 8, m) for m in (4, 300, 4096)] + [(128, 4096, 1536, 8, 1000), (128, 2880, 2880, 4, 2048)],
)
def test_real_shapes(E, H, I, k, M):
    pairs = [(0, 0), (M - 1, k - 1), (M // 2, k // 2)]
    w, x, router, shared, counter, taps, out = _op_case(E, H, I, k, M, M + E, pairs)
    assert out.shape == (M, H) and out.is_cuda
    for _ in range(2):  # repeated runs: bitwise identical
        assert same(flint_moe_grouped(x, router, w, k, counter, shared), out)
    if M > decode_max_tokens(E, k):  # flint_moe dispatches to the grouped path
        assert same(flint_moe(x, router, w, k, counter, shared), out)


def test_deepseek_m16384_and_graph_replay():
    E, H, I, k, M = 256, 7168, 2048, 8, 16384
    w, x, router, shared, counter, _taps, out = _op_case(E, H, I, k, M, 7, [(0, 0), (M - 1, k - 1), (8191, 3)])
    g, static_out = capture_graph(lambda: flint_moe_grouped(x, router, w, k, counter, shared))
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert same(static_out, out)


def test_decode_variants_and_block_sizes_same_bits():
    """The dequantisations (DECODE 3 bf16x2 word asm, 2 the fp16x2 E2M1 decode, 0 plain integer ops) give
    identical weights, hence identical
    accumulators. Another row-block size (a different MMA N) is measured, not required."""
    E, H, I, k, M = 256, 7168, 2048, 8, 512
    w = _weights(E, H, I)
    x, router, shared = _tokens(M, H, E, 11)
    from flint_moe.ops import route

    ids, tw = route(x, router, k, make_route_counter("cuda"))
    bm = grouped_config(M * k, E)["BM"]

    def run(decode, block_m=bm):
        perm = moe_permute(ids, E, block_m)
        taps: dict = {}
        cfg = {"DECODE": decode, "ENGINE": "triton"}  # DECODE selects the Triton kernels' dequantisation
        act = nvfp4_grouped_gate_up(x, ids, perm, w, taps=taps, config=cfg)
        out = nvfp4_grouped_down(act, ids, tw, perm, w, shared, taps=taps, config=cfg)
        return taps, out

    t2, o2 = run(3)  # the default: one inline-PTX call per code word
    for decode in (0, 2):
        t, o = run(decode)
        assert same(o, o2), f"DECODE={decode} output differs"
        for name in ("gate_acc", "up_acc", "down_acc"):
            assert same(t[name], t2[name]), f"DECODE={decode}: {name} differs"
    t, o = run(3, 64 if bm != 64 else 32)
    check_grouped_taps(w, x, ids, tw, shared, t, o)  # another block size: every order-free step still exact
    _report_block_size_invariance(t, t2)  # measured (printed), not required: the MMA shape may change bits


def _report_block_size_invariance(t, t2) -> None:
    """Print (not assert) whether another row-block size changed accumulator bits (hardware MMA shape)."""
    eq = {n: bool(same(t[n], t2[n])) for n in ("gate_acc", "up_acc", "down_acc", "out")}
    print(f"block-size invariance: {eq}")


def test_expert_with_every_token():
    """Expert 17 picked by every token (M = 3000: 24 row blocks of 128), the other slots spread."""
    E, H, I, k, M = 256, 7168, 2048, 8, 3000
    w = _weights(E, H, I)
    x, _router, shared = _tokens(M, H, E, 13)
    g = torch.Generator(device="cuda").manual_seed(13)
    others = torch.argsort(torch.rand(M, E - 1, generator=g, device="cuda"), dim=1)[:, : k - 1]
    others = others + (others >= 17).long()
    ids = torch.cat([torch.full((M, 1), 17, device="cuda"), others], dim=1).to(torch.int32).contiguous()
    tw = (torch.rand(M, k, generator=g, device="cuda") / k).to(torch.bfloat16).float()
    perm = moe_permute(ids, E, grouped_config(M * k, E)["BM"])
    taps: dict = {}
    act = nvfp4_grouped_gate_up(x, ids, perm, w, taps=taps)
    out = nvfp4_grouped_down(act, ids, tw, perm, w, shared, taps=taps)
    check_grouped_taps(w, x, ids, tw, shared, taps, out, acc_pairs=[(0, 0), (M - 1, 0), (1500, 5)])


@pytest.mark.parametrize(
    "E,H,I,k,M", [(256, 7168, 2048, 8, 4096), (256, 7168, 2048, 8, 16384), (128, 2880, 2880, 4, 4096)]
)
def test_expert_wide_row_blocks_same_bits(E, H, I, k, M):  # noqa: E741
    """On the Triton kernels, the op's ``TAIL`` option (BM + 32 pairs per program, a second accumulator for the
    pairs past BM) gives the bits of the schedule without tails: the production output, and every tap of the tapped
    build (accumulators, act, y, out); also with ``SCALE_WORD`` in both GEMMs, and ``SCALE_WORD`` alone; the
    default (its engine per launch) gives them too; the schedule really runs tails (experts with more than BM
    pairs) and fewer row blocks."""
    w = _weights(E, H, I)
    x, router, shared = _tokens(M, H, E, 19)
    counter = make_route_counter("cuda")

    def triton(tail, sw):  # the options on the Triton kernels (the default engine may be another one)
        kernel = {"ENGINE": "triton", "SCALE_WORD": sw}
        return {"TAIL": tail, "gate_up": kernel, "down": dict(kernel)}

    t0: dict = {}
    t1: dict = {}
    o0 = flint_moe_grouped(x, router, w, k, counter, shared, taps=t0, config=triton(0, False))
    o1 = flint_moe_grouped(x, router, w, k, counter, shared, taps=t1, config=triton(32, False))
    assert same(o1, o0)
    for name in ("gate_acc", "up_acc", "act", "down_acc", "y", "out"):
        assert same(t1[name], t0[name]), f"TAIL 32: {name} differs from the schedule without tails"
    t2: dict = {}
    assert same(flint_moe_grouped(x, router, w, k, counter, shared, taps=t2, config=triton(32, True)), o0)
    for name in ("gate_acc", "up_acc", "down_acc"):
        assert same(t2[name], t0[name]), f"TAIL 32 + SCALE_WORD: {name} differs from the schedule without tails"
    del t0, t1, t2
    assert same(flint_moe_grouped(x, router, w, k, counter, shared, config=triton(32, False)), o0)
    assert same(flint_moe_grouped(x, router, w, k, counter, shared, config=triton(0, True)), o0)
    assert same(flint_moe_grouped(x, router, w, k, counter, shared), o0)  # the default (its engine, its options)
    bm = grouped_config(M * k, E)["BM"]
    ids, _ = route(x, router, k, counter)
    p0, p1 = moe_permute(ids, E, bm), moe_permute(ids, E, bm, 32)
    n0, n1 = p0.block_end - p0.block_start, p1.block_end - p1.block_start
    assert int((n1 > bm).sum()) > 0 and int((n1 > 0).sum()) < int((n0 > 0).sum())


def test_row_independence():
    """Replacing the odd tokens (hence the routing and the row blocks' composition) leaves the even tokens'
    outputs and accumulators bitwise unchanged."""
    E, H, I, k, M = 128, 4096, 1536, 8, 600
    w = _weights(E, H, I)
    x, router, shared = _tokens(M, H, E, 17)
    x2, _, shared2 = _tokens(M, H, E, 18)
    x2[0::2], shared2[0::2] = x[0::2], shared[0::2]
    counter = make_route_counter("cuda")
    t1: dict = {}
    t2: dict = {}
    o1 = flint_moe_grouped(x, router, w, k, counter, shared, taps=t1)
    o2 = flint_moe_grouped(x2.contiguous(), router, w, k, counter, shared2.contiguous(), taps=t2)
    assert same(o1[0::2], o2[0::2])
    for name in ("gate_acc", "up_acc", "down_acc"):
        assert same(t1[name][0::2], t2[name][0::2]), name


@pytest.mark.parametrize("tail", [0, 32])
def test_large_row_blocks_production_equals_tapped_repeatedly(tail):
    """gpt-oss-120b widths (H = I = 2880: K steps of 64 at row blocks of 128 pairs, 8 warps) at M = 4096 with
    the scales byte by byte: the production gate/up and down builds equal the tapped ones bit for bit, run after
    run. A main loop that Triton pipelined differently (the same instructions in another order) once gave this
    build NaN and run-to-run different activations on the H200 while its tapped build stayed exact."""
    E, H, I, k, M = 128, 2880, 2880, 4, 4096  # noqa: E741
    w = _weights(E, H, I)
    x, _, shared = _tokens(M, H, E, 11)
    g = torch.Generator(device="cuda").manual_seed(11)
    ids = torch.stack([torch.randperm(E, generator=g, device="cuda")[:k] for _ in range(M)]).to(torch.int32)
    tw = (torch.rand(M, k, generator=g, device="cuda") / k).to(torch.bfloat16).float()
    perm = moe_permute(ids, E, 128, tail)
    off = {"SCALE_WORD": False, "ENGINE": "triton"}
    taps: dict = {}
    act_t = nvfp4_grouped_gate_up(x, ids, perm, w, taps=taps, config=off)
    out_t = nvfp4_grouped_down(act_t, ids, tw, perm, w, shared, taps=taps, config=off)
    check_grouped_taps(w, x, ids, tw, shared, taps, out_t, acc_pairs=[(0, 0), (M - 1, k - 1), (2047, 2)])
    for _ in range(4):
        act = nvfp4_grouped_gate_up(x, ids, perm, w, config=off)
        assert same(act, act_t)
        assert same(nvfp4_grouped_down(act, ids, tw, perm, w, shared, config=off), out_t)
