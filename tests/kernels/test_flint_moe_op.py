"""The public NVFP4 decode op ``flint_moe`` end to end (route -> gate/up -> down + combine + shared add).

Every stage is checked from the op's own taps: routing steps 1-4 (``_router_check.check_route``) and steps
5-10 (``_nvfp4_check.check_taps``); the tapped op's output equals the production op's, bit for bit. The same
test runs under the interpreter on small shapes (CPU CI) and, marked ``gpu``, on real shapes on the H200.
"""

from __future__ import annotations

import functools

import pytest
import torch

from flint_moe.ops import flint_moe, make_route_counter

from ._nvfp4_check import check_taps, make_weights, run_op_checked, same

BACKEND = "any"


@functools.lru_cache(maxsize=1)
def _weights(E, H, I, seed, pad_to, device):
    """One layer per shape, reused across token counts (a DeepSeek-size layer takes ~30 s to build)."""
    return make_weights(E, H, I, seed=seed, pad_to=pad_to, device=device)


def _run_and_check(E, H, I, k, M, *, device, seed, pad_to=None, acc_pairs=None):
    w = _weights(E, H, I, E + H, pad_to, device)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=g).to(torch.bfloat16).to(device)
    router = (torch.randn(E, H, generator=g) * 0.1).to(torch.bfloat16).to(device)
    shared = torch.randn(M, H, generator=g).to(torch.bfloat16).to(device)
    x0, r0, s0 = x.clone(), router.clone(), shared.clone()
    counter = make_route_counter(device)
    _, _, out = run_op_checked(flint_moe, check_taps, w, x, router, k, counter, shared, acc_pairs=acc_pairs)
    assert same(x, x0) and same(router, r0) and same(shared, s0), "an input was modified"
    return out


@pytest.mark.parametrize("E,H,I,k,M,pad_to", [(6, 96, 64, 2, 2, None), (5, 160, 176, 3, 1, 192)])
def test_op_end_to_end_interpreter(E, H, I, k, M, pad_to):
    from flint_moe.kernels._launch import INTERPRET

    if not INTERPRET:
        pytest.skip("interpreter variant (the gpu variant below covers CUDA)")
    _run_and_check(E, H, I, k, M, device="cpu", seed=E + H, pad_to=pad_to)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "E,H,I,k,M",
    [(256, 7168, 2048, 8, m) for m in (1, 3, 8)]
    + [(128, 2048, 768, 8, m) for m in (1, 2, 5, 8)]
    + [(128, 2880, 2880, 4, m) for m in (1, 4, 7)]
    + [(160, 5120, 704, 6, m) for m in (1, 6)],
)
def test_op_end_to_end_gpu(E, H, I, k, M):
    # Accumulators checked for two (token, slot) pairs per case (the golden bound of a DeepSeek-size expert
    # costs seconds); every order-free step is checked for every pair.
    out = _run_and_check(E, H, I, k, M, device="cuda", seed=M, acc_pairs={(0, 0), (M - 1, k - 1)})
    assert out.is_cuda and out.shape == (M, H)
