"""``flint_moe``'s decode / grouped threshold on the H200 (marked gpu; skipped without CUDA).

The expert counts and top_k of the measured layers (reports/gpu/nvfp4-grouped/crossover-engines/README.md) with
small H / I: DeepSeek-V3 (E 256, k 8: limit 24), Qwen3-235B-A22B (E 128, k 8: 16), gpt-oss-120b (E 128, k 4: 24).
At M = ``decode_max_tokens(E, k)`` the op runs the decode kernels past the router's GEMV range (the router GEMM
feeds them): bitwise the kernels called directly (route, ``nvfp4_gate_up``, ``nvfp4_down``; output and every tap),
tapped == production build, every order-free step bit-exact from the taps and sampled accumulators within the
kernels' bound (the golden model), CUDA-graph replays equal to the eager run. At M + 1 it is bitwise
``flint_moe_grouped`` (output and every tap), eagerly and in a CUDA graph.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.ops import decode_max_tokens, flint_moe, flint_moe_grouped, make_route_counter, route
from tests.kernels._nvfp4_check import capture_graph, check_taps, make_weights, run_op_checked, same
from tests.ops.conftest import same_taps

pytestmark = pytest.mark.gpu

#: name -> (E, top_k, the limit worked out by hand: min(24, E // k))
SHAPES = {"deepseek-v3": (256, 8, 24), "qwen3-235b-a22b": (128, 8, 16), "gpt-oss-120b": (128, 4, 24)}
H, I = 1024, 256  # noqa: E741
_LAYERS: dict = {}


def _layer(name: str):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if name not in _LAYERS:
        E = SHAPES[name][0]
        _LAYERS.clear()
        _LAYERS[name] = make_weights(E, H, I, seed=E, device="cuda")
    return _LAYERS[name]


def _tokens(M: int, E: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, H, generator=g, device="cuda").to(torch.bfloat16)
    router = (torch.randn(E, H, generator=g, device="cuda") * 0.05).to(torch.bfloat16)
    shared = torch.randn(M, H, generator=g, device="cuda").to(torch.bfloat16)
    return x, router, shared






@pytest.mark.parametrize("name", sorted(SHAPES))
def test_decode_at_the_limit_is_the_decode_kernels(name: str, grouped_calls: list) -> None:
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up

    E, k, L = SHAPES[name]
    assert decode_max_tokens(E, k) == L > 8
    w = _layer(name)
    x, router, shared = _tokens(L, E, seed=L + E)
    counter = make_route_counter("cuda")
    taps, out_t, out = run_op_checked(
        flint_moe, check_taps, w, x, router, k, counter, shared, acc_pairs=[(0, 0), (L - 1, k - 1), (L // 2, k // 2)]
    )
    ref_taps: dict = {}
    ids, tw = route(x, router, k, counter, taps=ref_taps)
    ref = nvfp4_down(nvfp4_gate_up(x, ids, w, taps=ref_taps), ids, tw, w, shared, taps=ref_taps)
    torch.cuda.synchronize()
    assert grouped_calls == []
    assert same(out_t, ref) and same(out, ref)
    same_taps(taps, ref_taps)
    g, static_out = capture_graph(lambda: flint_moe(x, router, w, k, counter, shared))
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert same(static_out, out)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_one_past_the_limit_is_the_grouped_op(name: str, grouped_calls: list) -> None:
    E, k, L = SHAPES[name]
    assert decode_max_tokens(E, k) == L
    w = _layer(name)
    M = L + 1
    x, router, shared = _tokens(M, E, seed=M + E)
    counter = make_route_counter("cuda")
    taps, ref_taps = {}, {}
    out_t = flint_moe(x, router, w, k, counter, shared, taps=taps)
    assert grouped_calls == [M]
    ref = flint_moe_grouped(x, router, w, k, counter, shared, taps=ref_taps)
    out = flint_moe(x, router, w, k, counter, shared)
    torch.cuda.synchronize()
    assert same(out_t, ref) and same(out, ref)
    same_taps(taps, ref_taps)
    g, static_out = capture_graph(lambda: flint_moe(x, router, w, k, counter, shared))
    g.replay()
    torch.cuda.synchronize()
    assert same(static_out, ref)
