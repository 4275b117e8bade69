"""Router on the GPU (H200; ``pytest -m gpu tests/kernels/test_router_gpu.py``): real router shapes, M = 1..8
(fused GEMV + top-k) and M = 64, 256 (fp32 GEMM + top-k kernel). Every order-free step bit-exact against the
golden model fed the kernel's taps, router_acc within the certified bound, repeated runs and CUDA-graph
replays bitwise identical, GEMV and GEMM paths identical wherever their bf16 logits agree."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.router import COUNTER_ALIGN, ROUTE_GEMV_MAX_TOKENS, launch_topk
from flint_moe.kernels.router_gemm import launch_router_gemm
from flint_moe.ops import make_route_counter, route

from ._router_check import check_route, same_bits

pytestmark = pytest.mark.gpu
BACKEND = "gpu"

#: (name, E, H, k): DeepSeek-V3, Kimi-K2, Qwen3-Next, GLM-4.5, gpt-oss
SHAPES = [
    ("deepseek", 256, 7168, 8),
    ("kimi", 384, 7168, 8),
    ("qwen3next", 512, 2048, 10),
    ("glm", 160, 5120, 6),
    ("gptoss", 128, 2880, 4),
]
TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 64, 256]


def _inputs(m: int, e: int, h: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, h, generator=g).bfloat16()
    w = (torch.randn(e, h, generator=g) * h**-0.5).bfloat16()
    return x.cuda(), w.cuda()


@pytest.mark.parametrize("m", TOKENS)
@pytest.mark.parametrize(("name", "e", "h", "k"), SHAPES, ids=[s[0] for s in SHAPES])
def test_route_matches_golden(name: str, e: int, h: int, k: int, m: int) -> None:
    x, w = _inputs(m, e, h, seed=e * 1000 + m)
    counter = make_route_counter("cuda")
    x0, w0 = x.clone(), w.clone()
    taps: dict = {}
    ids, tw = route(x, w, k, counter, taps=taps)
    torch.cuda.synchronize()
    check_route(x, w, k, ids, tw, taps)
    assert same_bits(x, x0) and same_bits(w, w0), "inputs modified"
    # repeated runs (untapped and tapped) are bitwise identical
    for _ in range(3):
        ids2, tw2 = route(x, w, k, counter)
        assert torch.equal(ids2, ids) and same_bits(tw2, tw)
    taps2: dict = {}
    route(x, w, k, counter, taps=taps2)
    assert same_bits(taps2["router_acc"], taps["router_acc"]) and same_bits(taps2["logits"], taps["logits"])
    if m <= ROUTE_GEMV_MAX_TOKENS:
        assert (counter[:m] % COUNTER_ALIGN == 0).all()


def _special(e: int, h: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = (torch.rand(m, h, generator=g) + 0.5).bfloat16()
    x[:, 0] = 2.0**-75
    w = (torch.randn(e, h, generator=g) * h**-0.5).bfloat16()
    w[1] = float("nan")
    w[4] = torch.tensor(-1, dtype=torch.int16).view(torch.bfloat16)
    w[2], w[5], w[6], w[7] = 0.0, 0.0, 0.0, 0.0
    w[2, 0] = float("inf")
    w[5, 0] = float("-inf")
    w[7, 0] = -(2.0**-74)  # logit -0
    for t in (e - 1, e - 3, 9, 12):
        w[t] = w[8]  # ties
    return x.cuda(), w.cuda()


@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize(("name", "e", "h", "k"), SHAPES[2:4], ids=[s[0] for s in SHAPES[2:4]])
def test_special_logits_gpu(name: str, e: int, h: int, k: int, m: int) -> None:
    x, w = _special(e, h, m)
    taps: dict = {}
    ids, tw = route(x, w, k, make_route_counter("cuda"), taps=taps)
    torch.cuda.synchronize()
    check_route(x, w, k, ids, tw, taps)
    assert ids[:, :3].tolist() == [[1, 4, 2]] * m


def test_all_underflow_rows_gpu() -> None:
    x = torch.ones(3, 2048).bfloat16().cuda()
    w = torch.full((512, 2048), -1.0).bfloat16().cuda()
    taps: dict = {}
    ids, tw = route(x, w, 10, make_route_counter("cuda"), taps=taps)
    torch.cuda.synchronize()
    check_route(x, w, 10, ids, tw, taps)
    assert tw.view(torch.int32).eq(0).all()


@pytest.mark.parametrize("m", [1, 4, 8, 64])
@pytest.mark.parametrize(("name", "e", "h", "k"), SHAPES, ids=[s[0] for s in SHAPES])
def test_cuda_graph_replays_identical(name: str, e: int, h: int, k: int, m: int) -> None:
    x, w = _inputs(m, e, h, seed=e + m)
    counter = make_route_counter("cuda")
    counter[:] = 0x7FFF0000  # the replays cross the int32 wrap point
    ids_ref, tw_ref = route(x, w, k, counter)  # eager (also compiles before capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids_g, tw_g = route(x, w, k, counter)
    for _ in range(5):
        ids_g.zero_()
        tw_g.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(ids_g, ids_ref) and same_bits(tw_g, tw_ref)
    if m <= ROUTE_GEMV_MAX_TOKENS:
        assert (counter[:m] % COUNTER_ALIGN == 0).all()


@pytest.mark.parametrize(("name", "e", "h", "k"), SHAPES, ids=[s[0] for s in SHAPES])
def test_gemv_and_gemm_paths_agree_where_logits_agree(name: str, e: int, h: int, k: int) -> None:
    m = ROUTE_GEMV_MAX_TOKENS
    x, w = _inputs(64, e, h, seed=e * 7)
    taps_v: dict = {}
    ids_v, tw_v = route(x[:m].contiguous(), w, k, make_route_counter("cuda"), taps=taps_v)
    taps_g: dict = {}
    ids_g, tw_g = launch_topk(launch_router_gemm(x[:m].contiguous(), w), k, taps=taps_g)
    ids_64, tw_64 = route(x, w, k, make_route_counter("cuda"))  # the GEMM path of route itself
    torch.cuda.synchronize()
    assert torch.equal(ids_64[:m], ids_g) and same_bits(tw_64[:m], tw_g)
    rows = (taps_v["logits"].view(torch.int16) == taps_g["logits"].view(torch.int16)).all(dim=1)
    for t in torch.nonzero(rows).flatten().tolist():
        assert torch.equal(ids_v[t], ids_g[t]) and same_bits(tw_v[t], tw_g[t]), f"token {t}"
    print(f"{name}: {int(rows.sum())}/{m} tokens with identical bf16 logits on both paths")
