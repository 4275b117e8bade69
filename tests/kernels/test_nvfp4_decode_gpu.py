"""NVFP4 decode kernels on the H200 (marked gpu): golden model fed the taps, compiled kernels.

For M in 1..8 and every (H, I) of the conformance matrix (DeepSeek-V3's E=256, H=7168, I=2048, k=8
included): order-free steps bit-exact from the taps, accumulators within the certified bound (block model,
B = 16), tapped build == production build, repeated runs and CUDA-graph replays bitwise identical, and the
inline-PTX E2M1 decodes (bf16x2 and fp16x2 variants) exact on all 256 code bytes.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels._nvfp4_gemv import decode_probe
from flint_moe.kernels.nvfp4_down import nvfp4_down
from flint_moe.kernels.nvfp4_gate_up import AUDIT_SHAPES, nvfp4_gate_up
from flint_moe.reference.formats import E2M1_VALUES

from ._nvfp4_check import check_taps, make_inputs, same

pytestmark = pytest.mark.gpu
BACKEND = "gpu"


def _weights(E, H, I, seed):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.bench_decode_nvfp4 import random_weights

    return random_weights(E, H, I, seed=seed)


def _run(w, x, ids, tw, sh, taps=None, variant=None):
    act = nvfp4_gate_up(x, ids, w, taps=taps, config=variant)
    return nvfp4_down(act, ids, tw, w, sh, taps=taps, config=variant)


@pytest.mark.parametrize("decode", [0, 1, 2])
def test_decode_all_bytes_gpu(decode):
    codes = torch.arange(256, dtype=torch.uint8, device="cuda").repeat(4)
    lo, hi = decode_probe(codes, decode)
    vals = torch.tensor([*E2M1_VALUES], dtype=torch.float32, device="cuda")
    assert same(lo, vals[codes.long() & 15]) and same(hi, vals[codes.long() >> 4])


@pytest.mark.parametrize("H,I", AUDIT_SHAPES)
def test_matrix_shapes(H, I):
    E, k = 9, 4
    w = _weights(E, H, I, seed=H + I)
    for M in (1, 3, 8):
        x, ids, tw, sh = make_inputs(M, H, E, k, seed=M, device="cuda")
        taps = {}
        out = _run(w, x, ids, tw, sh, taps)
        check_taps(w, x, ids, tw, sh, taps, out, acc_pairs={(0, 0), (M - 1, k - 1)})
        assert same(_run(w, x, ids, tw, sh), out)
        # every decode variant gives the same bits (same summation order)
        for d in (0, 1):
            assert same(_run(w, x, ids, tw, sh, variant={"DECODE": d}), out)


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
