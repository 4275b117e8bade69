"""``flint_moe``'s decode / grouped threshold (``ops.decode_max_tokens``) on the CPU.

The rule's values, worked out by hand from ``min(32, 3E // 2k)`` for the measured shapes and a few others, its
equivalence with "decode iff M <= 32 and 2 M k <= 3 E", its agreement with every point of the H200 measurement
(reports/gpu/nvfp4-grouped/crossover/bench_cross.json: the faster path at each measured M), its errors; and the
dispatch under the Triton interpreter on small layers: at M = the limit ``flint_moe`` runs the decode kernels
(the grouped launcher not called; with the limit past the router's GEMV range (8), bitwise the kernels called
directly, output and every tap), at the limit + 1 the grouped path (bitwise ``flint_moe_grouped``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flint_moe.kernels._launch import INTERPRET
from flint_moe.ops import DECODE_MAX_TOKENS, decode_max_tokens, flint_moe, flint_moe_grouped, make_route_counter
from tests.ops.conftest import same_taps

CROSSOVER = Path(__file__).resolve().parents[2] / "reports/gpu/nvfp4-grouped/crossover/bench_cross.json"


@pytest.mark.parametrize(
    ("E", "k", "want"),
    [
        (256, 8, 32),  # DeepSeek-V3: 3 * 256 // 16 = 48, capped at 32
        (128, 4, 32),  # gpt-oss-120b: 3 * 128 // 8 = 48 -> 32
        (128, 8, 24),  # Qwen3-235B-A22B, Qwen3-30B-A3B: 3 * 128 // 16 = 24
        (384, 8, 32),  # Kimi-K2: 72 -> 32
        (160, 8, 30),  # GLM-4.5: 480 // 16 = 30
        (8, 2, 6),  # Mixtral-8x7B: 24 // 4 = 6 (below the old limit of 8)
        (6, 3, 3),  # the conformance CPU shape cpu-E6-H96-I64-k3: 18 // 6
        (6, 2, 4),  # 18 // 4 = 4
        (16, 2, 12),  # 48 // 4 = 12: a decode limit past the router's GEMV range
        (10, 8, 1),  # 30 // 16 = 1
        (1, 1, 1),  # 3 // 2 = 1
        (3, 3, 1),  # 9 // 6 = 1: k = E still decodes one token
    ],
)
def test_decode_max_tokens_values(E: int, k: int, want: int) -> None:
    assert decode_max_tokens(E, k) == want


def test_decode_max_tokens_is_the_stated_rule() -> None:
    assert DECODE_MAX_TOKENS == 32
    for E in range(1, 200):
        for k in range(1, min(E, 16) + 1):
            decode = [M for M in range(1, 100) if M <= 32 and 2 * M * k <= 3 * E]
            assert decode_max_tokens(E, k) == max(decode, default=1) >= 1, (E, k)
            assert decode == list(range(1, len(decode) + 1))


def test_decode_max_tokens_agrees_with_the_measurement() -> None:
    """Every (model, M) point of the H200 crossover run: decode where it was faster, grouped where it lost."""
    from flint_moe.shapes import MODEL_SHAPES

    rows = json.loads(CROSSOVER.read_text())
    assert {r["model"] for r in rows} == {"deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b"} and len(rows) == 24
    for r in rows:
        s = MODEL_SHAPES[r["model"]]
        side = "decode" if r["M"] <= decode_max_tokens(s.num_experts, s.top_k) else "grouped"
        assert side == r["faster"] == ("decode" if r["decode_us"] < r["grouped_us"] else "grouped"), r


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        ((256.0, 8), TypeError, r"^num_experts: expected an int, got float$"),
        ((True, 1), TypeError, r"^num_experts: expected an int, got bool$"),
        ((0, 1), ValueError, r"^num_experts: must be >= 1, got 0$"),
        ((256, "8"), TypeError, r"^top_k: expected an int, got str$"),
        ((256, False), TypeError, r"^top_k: expected an int, got bool$"),
        ((256, 0), ValueError, r"^top_k: must satisfy 1 <= top_k <= E = 256, got 0$"),
        ((4, 5), ValueError, r"^top_k: must satisfy 1 <= top_k <= E = 4, got 5$"),
    ],
)
def test_decode_max_tokens_errors(args, exc, match) -> None:
    with pytest.raises(exc, match=match):
        decode_max_tokens(*args)


# ------------------------------------------------------------------------------------------------------
# The dispatch under the interpreter: small layers, M on both sides of the limit
# ------------------------------------------------------------------------------------------------------

#: Small: the decode kernels take ~10 s per call under the interpreter even so.
H, I = 64, 64  # noqa: E741


def _layer(E: int, M: int, seed: int):
    from flint_moe.layouts import FlintMoEWeights
    from tests.layouts._gen import nvfp4

    w13, s13, w2, s2 = nvfp4(E, H, I, seed)
    gs = torch.rand(E, generator=torch.Generator().manual_seed(seed + 1)) + 0.5
    g = torch.Generator().manual_seed(seed + 2)
    x = torch.randn(M, H, generator=g).bfloat16()
    router = (torch.randn(E, H, generator=g) * 0.1).bfloat16()
    shared = (torch.randn(M, H, generator=g) * 0.1).bfloat16()
    return FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs), x, router, shared


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)






@pytest.mark.skipif(not INTERPRET, reason="CPU tensors need the Triton interpreter")
@pytest.mark.parametrize(("E", "k"), [(6, 2), (6, 1)], ids=["limit4-router-gemv", "limit9-router-gemm"])
def test_flint_moe_dispatch_on_both_sides_of_the_limit(grouped_calls, E: int, k: int) -> None:
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
    from flint_moe.ops import route

    L = decode_max_tokens(E, k)
    w, x, router, shared = _layer(E, L + 1, seed=E)
    counter = make_route_counter("cpu")
    # M = L: the decode kernels; past the router GEMV (L > 8) bitwise those called directly (route, gate/up, down)
    xd, sd = x[:L].contiguous(), shared[:L].contiguous()
    taps, ref_taps = {}, {}
    out = flint_moe(xd, router, w, k, counter, sd, taps=taps)
    assert grouped_calls == [] and out.shape == (L, H)
    if L > 8:
        ids, tw = route(xd, router, k, counter, taps=ref_taps)
        ref = nvfp4_down(nvfp4_gate_up(xd, ids, w, taps=ref_taps), ids, tw, w, sd, taps=ref_taps)
        assert torch.equal(_bits(out), _bits(ref))
        same_taps(taps, ref_taps)
    # M = L + 1: the grouped path, bitwise flint_moe_grouped
    taps, ref_taps = {}, {}
    out = flint_moe(x, router, w, k, counter, shared, taps=taps)
    assert grouped_calls == [L + 1]
    ref = flint_moe_grouped(x, router, w, k, counter, shared, taps=ref_taps)
    assert torch.equal(_bits(out), _bits(ref))
    same_taps(taps, ref_taps)


@pytest.mark.skipif(not INTERPRET, reason="CPU tensors need the Triton interpreter")
def test_flint_moe_above_every_limit_skips_the_per_shape_rule(grouped_calls, monkeypatch) -> None:
    """M > DECODE_MAX_TOKENS goes to ``flint_moe_grouped`` before the per-shape rule is asked (which would
    refuse nothing here: the op checks top_k itself); the per-shape branch asks it with the checked E and k."""
    import flint_moe.ops.moe_nvfp4 as op

    asked: list = []
    real = op.decode_max_tokens
    monkeypatch.setattr(op, "decode_max_tokens", lambda E, k: asked.append((E, k)) or real(E, k))
    w, x, router, shared = _layer(6, DECODE_MAX_TOKENS + 1, seed=3)
    with pytest.raises(ValueError, match=r"^top_k: must satisfy 1 <= top_k <= E = 6, got 7$"):
        flint_moe(x, router, w, 7, make_route_counter("cpu"), shared)
    assert asked == [] and grouped_calls == []
    with pytest.raises(ValueError, match=r"^top_k: must satisfy 1 <= top_k <= E = 6, got 7$"):
        flint_moe(x[:2].contiguous(), router, w, 7, make_route_counter("cpu"), shared[:2].contiguous())
    assert asked == []  # the operands (top_k included) are checked before the rule is asked
    out = flint_moe(x[:5].contiguous(), router, w, 2, make_route_counter("cpu"), shared[:5].contiguous())
    assert asked == [(6, 2)] and grouped_calls == [5] and out.shape == (5, H)
