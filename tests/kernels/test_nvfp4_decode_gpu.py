"""NVFP4 decode kernels on the H200 (marked gpu): golden model fed the taps, compiled kernels.

For M in 1..8 and every (H, I) of the conformance matrix (DeepSeek-V3's E=256, H=7168, I=2048, k=8
included), on both accumulation paths (CUDA cores: block model B = 16; tensor cores ``MMA``: FP32_TRUNCATE):
order-free steps bit-exact from the taps, accumulators within the certified bound of the path, tapped build
== production build, repeated runs and CUDA-graph replays bitwise identical, launch variants of a path
bit-identical, and the inline-PTX E2M1 decodes (bf16x2 and fp16x2 variants) exact on all 256 code bytes.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.nvfp4 import tuned as nvfp4_tuned
from flint_moe.kernels.nvfp4.decode_ptx import decode_probe
from flint_moe.kernels.nvfp4.down_combine import accumulation_model as dn_model, nvfp4_down
from flint_moe.kernels.nvfp4.gate_up import AUDIT_SHAPES, accumulation_model as gu_model, nvfp4_gate_up
from flint_moe.reference.formats import E2M1_VALUES

from ._nvfp4_check import capture_graph, check_taps, make_inputs, make_weights, same

pytestmark = pytest.mark.gpu
BACKEND = "gpu"


def _weights(E, H, I, seed):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.bench_decode_nvfp4 import random_weights

    return random_weights(E, H, I, seed=seed)


def _run(w, x, ids, tw, sh, taps=None, variant=None, dn_variant=None):
    act = nvfp4_gate_up(x, ids, w, taps=taps, config=variant)
    return nvfp4_down(act, ids, tw, w, sh, taps=taps, config=variant if dn_variant is None else dn_variant)


#: The two accumulation paths, each with its best measured configuration (flint_moe/kernels/nvfp4/tuned.py).
PATHS = {
    "cuda-core": (nvfp4_tuned.GATE_UP_CUDA_CORE, nvfp4_tuned.DOWN_CUDA_CORE),
    "tensor-core": (nvfp4_tuned.GATE_UP_MMA, nvfp4_tuned.DOWN_MMA),
}


def test_decode_all_bytes_gpu():
    codes = torch.arange(256, dtype=torch.uint8, device="cuda").repeat(4)
    lo, hi = decode_probe(codes)
    vals = torch.tensor([*E2M1_VALUES], dtype=torch.float32, device="cuda")
    assert same(lo, vals[codes.long() & 15]) and same(hi, vals[codes.long() >> 4])


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("H,I", AUDIT_SHAPES)
def test_matrix_shapes(H, I, path):
    gu, dn = PATHS[path]
    models = dict(gu_model=gu_model(gu), dn_model=dn_model(dn))
    E, k = 9, 4
    w = _weights(E, H, I, seed=H + I)
    for M in (1, 3, 8):
        x, ids, tw, sh = make_inputs(M, H, E, k, seed=M, device="cuda")
        taps = {}
        out = _run(w, x, ids, tw, sh, taps, gu, dn)
        check_taps(w, x, ids, tw, sh, taps, out, acc_pairs={(0, 0), (M - 1, k - 1)}, **models)
        assert same(_run(w, x, ids, tw, sh, None, gu, dn), out)


def test_mma_variants_half_chunk():
    """Tensor-core path: S / num_warps / FENCE / EARLY / MAXNREG change no bit; I/2 = 520 bytes ends in a
    half 16-byte chunk (one block) and H/2 = 1440 in a partial 64-byte step; K-split variants (uneven parts here:
    1440 = 768 + 672, 520 = 320 + 200) within the bound and independent of the warps per part."""
    from flint_moe.reference.exact import FP32_TRUNCATE

    E, H, I, k = 9, 2880, 1040, 4  # I = 1040 stored padded to 1088
    w = make_weights(E, H, I, seed=7, pad_to=64, device="cuda")
    keys = {"SK": 1, "FENCE": False}  # complete: nothing from the defaults
    gu0 = {"MMA": True, "BN": 16, "num_warps": 2, "RT": 2, "S": 4, **keys}
    dn0 = {"MMA": True, "BH": 16, "num_warps": 1, "RT": 2, "S": 4, **keys, "EARLY": 0, "MAXNREG": 0}
    for M in (1, 5):
        x, ids, tw, sh = make_inputs(M, H, E, k, seed=M, device="cuda")
        taps = {}
        out = _run(w, x, ids, tw, sh, taps, gu0, dn0)
        check_taps(w, x, ids, tw, sh, taps, out, gu_model=FP32_TRUNCATE, dn_model=FP32_TRUNCATE)
        for gu, dn in (
            ({**gu0, "S": 2}, {**dn0, "num_warps": 2, "BH": 32, "S": 2}),
            ({**gu0, "BN": 8, "num_warps": 1}, {**dn0, "num_warps": 4, "BH": 64}),
            ({**gu0, "FENCE": True}, {**dn0, "FENCE": True, "S": 2}),  # scheduling only
            # weights before the grid-dependency wait, register cap: scheduling only
            ({**gu0, "FENCE": True, "S": 2}, {**dn0, "EARLY": 1, "MAXNREG": 72}),
            (gu0, {**dn0, "S": 2, "EARLY": 1, "FENCE": True}),
        ):
            assert same(_run(w, x, ids, tw, sh, None, gu, dn), out)
        # uneven K-split: within the bound; same bits with more warps per part, with FENCE
        taps = {}
        gk, dk = {**gu0, "num_warps": 4, "SK": 2}, {**dn0, "num_warps": 2, "SK": 2}
        o2 = _run(w, x, ids, tw, sh, taps, gk, dk)
        check_taps(w, x, ids, tw, sh, taps, o2, gu_model=FP32_TRUNCATE, dn_model=FP32_TRUNCATE)
        gk8, dk4 = {**gk, "num_warps": 8, "BN": 32, "FENCE": True}, {**dk, "num_warps": 4, "BH": 32, "FENCE": True}
        assert same(_run(w, x, ids, tw, sh, None, gk8, dk4), o2)
        taps = {}
        o4 = _run(
            w, x, ids, tw, sh, taps, {**gk, "BN": 8, "SK": 4}, {**dk, "num_warps": 4, "SK": 4}
        )  # gate/up 3 x 384 + 288; down: 4 parts would leave the last empty, runs as 2
        check_taps(w, x, ids, tw, sh, taps, o4, gu_model=FP32_TRUNCATE, dn_model=FP32_TRUNCATE)
    w = _weights(E, 2048, 1024, seed=8)  # H/2 = 1024 and I/2 = 512 split in 2 and 4 parts
    x, ids, tw, sh = make_inputs(3, 2048, E, k, seed=3, device="cuda")
    taps = {}
    out = _run(w, x, ids, tw, sh, taps, {**gu0, "num_warps": 4, "SK": 2}, {**dn0, "num_warps": 4, "SK": 4})
    check_taps(w, x, ids, tw, sh, taps, out, gu_model=FP32_TRUNCATE, dn_model=FP32_TRUNCATE)


def test_op_graph_new_routing_every_replay():
    """The whole op (router, gate/up, down: one chain of dependent launches) captured once in a CUDA graph and
    replayed with new tokens, hence a new routing, every time: the same bits as eager calls, i.e. the down kernel
    reads this replay's expert ids (it may read them before its grid-dependency wait: ``EARLY``)."""
    from flint_moe.ops import flint_moe, make_route_counter

    E, H, I, k, M = 256, 7168, 2048, 8, 2
    w = _weights(E, H, I, seed=2)
    g = torch.Generator(device="cuda").manual_seed(5)
    rw = (torch.randn(E, H, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    xs = [torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4)]
    sh = torch.randn(M, H, device="cuda", generator=g).to(torch.bfloat16)
    counter = make_route_counter(torch.device("cuda"))
    eager = [flint_moe(x, rw, w, k, counter, sh) for x in xs]
    assert not any(same(eager[i], eager[j]) for i in range(4) for j in range(i))
    static_x = xs[0].clone()
    graph, out = capture_graph(lambda: flint_moe(static_x, rw, w, k, counter, sh))
    for i in (1, 2, 3, 0, 2, 1):
        static_x.copy_(xs[i])
        graph.replay()
        torch.cuda.synchronize()
        assert same(out, eager[i]), i


def test_deepseek_v3_all_m_graph_replay():
    E, H, I, k = 256, 7168, 2048, 8
    w = _weights(E, H, I, seed=1)
    for M in range(1, 9):
        x, ids, tw, sh = make_inputs(M, H, E, k, seed=10 + M, device="cuda")
        taps = {}
        out = _run(w, x, ids, tw, sh, taps)
        check_taps(w, x, ids, tw, sh, taps, out, acc_pairs={(0, 0), (M - 1, k - 1)})
        prod = _run(w, x, ids, tw, sh)
        assert same(prod, out)
        for _ in range(3):
            assert same(_run(w, x, ids, tw, sh), out)
    # CUDA graph replays
    static = {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _run(w, x, ids, tw, sh)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static["out"] = _run(w, x, ids, tw, sh)
    for _ in range(5):
        g.replay()
        torch.cuda.synchronize()
        assert same(static["out"], out)
