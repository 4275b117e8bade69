"""The decode block op ``flint_moe_ll`` on the H200 (``pytest -m gpu``; skipped without CUDA or without
nvidia-cutlass-dsl): real hidden / intermediate sizes of DeepSeek-V3, GLM-4.5 and Ling-mini-2.0 (fewer
experts, for speed) and a padded intermediate, M in {1, 2, 3, 8}, and GLM-4.5-Air (lane tails) at M = 1, 3:
every tap against the golden model by teacher forcing, every accumulator equal to the replay of its declared
order (``tests/ops/_ll_check.py``), on two input sets; the tapped and untapped builds equal bit for bit; 8
identical tokens (every expert shared by all of them); CUDA-graph replays equal to eager runs; inputs
unmodified."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.cute.ll_gate_up import cute_available
from flint_moe.ops import flint_moe_ll, make_route_counter
from tests.kernels._nvfp4_check import capture_graph
from tests.ops._ll_check import EPS, check_block, make_block, make_block_inputs, same

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cute_available()[0], reason=f"CuTe DSL missing: {cute_available()[1]}"),
]

#: name -> (E, H, I, SI, top_k, pad_to)
SHAPES = {
    "dsv3": (16, 7168, 2048, 2048, 8, None),
    "glm45": (16, 5120, 1536, 1536, 8, None),
    "ling": (32, 2048, 512, 512, 8, None),
    "padded": (8, 2048, 384, 512, 4, 512),
    "glm45air": (8, 4096, 1408, 1408, 8, None),  # I = SI = 1408: 88 blocks, a lane tail in the down kernels
}
_BLOCKS: dict = {}


def _block(name: str):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if name not in _BLOCKS:  # built once per module (a few hundred MB of GPU memory each)
        E, H, I, SI, k, pad = SHAPES[name]  # noqa: E741, N806
        _BLOCKS[name] = make_block(E, H, I, SI, k, pad_to=pad, seed=len(name))
    return _BLOCKS[name]


def _tapped_and_untapped(b, attn: torch.Tensor, res: torch.Tensor, lnw: torch.Tensor):
    """Run the block op tapped and untapped on one input set; assert both builds agree bit for bit and return
    the tapped run's ``(taps, moe_out, residual_out)``."""
    counter = make_route_counter("cuda")
    taps: dict = {}
    out_t, res_t = flint_moe_ll(attn, res, lnw, EPS, b.w, b.top_k, counter, taps=taps)
    out, res_out = flint_moe_ll(attn, res, lnw, EPS, b.w, b.top_k, counter)
    torch.cuda.synchronize()
    assert same(out, out_t) and same(res_out, res_t), "tapped and untapped builds differ"
    return taps, out_t, res_t


#: (shape name, M) of the golden-model comparisons: GLM-4.5-Air at M = 1, 3, the others at M = 1, 2, 3, 8.
NAME_M = [(n, m) for n in sorted(SHAPES) for m in ((1, 3) if n == "glm45air" else (1, 2, 3, 8))]


@pytest.mark.parametrize(("name", "m"), NAME_M)
def test_block_matches_the_golden_model(name: str, m: int) -> None:
    b = _block(name)
    attn, res, lnw = make_block_inputs(m, b.w.hidden_size, seed=m)
    before = [t.clone() for t in (attn, res, lnw)]
    taps, out_t, res_t = _tapped_and_untapped(b, attn, res, lnw)
    for t, t0 in zip((attn, res, lnw), before, strict=True):
        assert same(t, t0), "an input was modified"
    check_block(b, attn, res, lnw, taps, out_t, res_t)


@pytest.mark.parametrize("name", ["dsv3", "ling"])
def test_cuda_graph_replay_equals_eager(name: str) -> None:
    b = _block(name)
    H = b.w.hidden_size  # noqa: N806
    attn, res, lnw = make_block_inputs(3, H, seed=11)
    counter = make_route_counter("cuda")

    def run():
        return flint_moe_ll(attn, res, lnw, EPS, b.w, b.top_k, counter)

    eager = run()  # compiles every specialisation outside the capture
    graph, got = capture_graph(run)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert same(got[0], eager[0]) and same(got[1], eager[1])
    attn.copy_(make_block_inputs(3, H, seed=12)[0])  # new input in place: the replay follows it
    graph.replay()
    torch.cuda.synchronize()
    fresh = run()
    assert same(got[0], fresh[0]) and same(got[1], fresh[1])
    assert not same(fresh[0], eager[0])


@pytest.mark.parametrize(("name", "m"), NAME_M)
def test_block_matches_the_golden_model_on_other_inputs(name: str, m: int) -> None:
    """A second input set per shape and M: every tap against the golden model replaying the declared orders,
    tapped == untapped."""
    b = _block(name)
    attn, res, lnw = make_block_inputs(m, b.w.hidden_size, seed=m + 20)
    taps, out_t, res_t = _tapped_and_untapped(b, attn, res, lnw)
    check_block(b, attn, res, lnw, taps, out_t, res_t)


def test_shared_experts_across_tokens() -> None:
    """Every token selects the same experts (the same token 8 times): the partial kernel's CTA of each expert
    accumulates all M = 8 tokens from one read; every tap against the golden model, tapped == untapped."""
    b = _block("ling")
    H = b.w.hidden_size  # noqa: N806
    attn, res, lnw = make_block_inputs(8, H, seed=31)
    attn = attn[:1].repeat(8, 1).contiguous()  # same token 8 times: identical routing, all pairs duplicated
    res = res[:1].repeat(8, 1).contiguous()
    taps, out_t, res_t = _tapped_and_untapped(b, attn, res, lnw)
    assert bool((taps["ids"] == taps["ids"][:1]).all())
    assert all(same(out_t[t], out_t[0]) for t in range(8)), "identical tokens gave different outputs"
    check_block(b, attn, res, lnw, taps, out_t, res_t)
