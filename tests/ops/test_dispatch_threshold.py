"""``flint_moe``'s decode / grouped threshold (``ops.decode_max_tokens``) on the CPU.

The rule's values, worked out by hand from ``min(24, E // k)`` for the measured shapes and a few others, its
equivalence with "decode iff M <= 24 and M k <= E", its agreement with every point of the H200 measurement with
the grouped path's Gluon engines (reports/gpu/nvfp4-grouped/crossover-engines/bench_cross.json: the faster path at
each measured M), its errors; the dispatch decision at the limit and one past it on the measured layers' E and k
(the launchers stubbed); and the dispatch under the Triton interpreter on small layers: at M = the limit
``flint_moe`` runs the decode kernels (the grouped launcher not called; with the limit past the router's GEMV
range (8), bitwise the kernels called directly, output and every tap), at the limit + 1 the grouped path (bitwise
``flint_moe_grouped``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flint_moe.kernels._launch import INTERPRET
from flint_moe.ops import (
    DECODE_DISPATCH_MAX_TOKENS,
    DECODE_MAX_TOKENS,
    decode_max_tokens,
    flint_moe,
    flint_moe_grouped,
    make_route_counter,
)
from tests.ops.conftest import same_taps

CROSSOVER = Path(__file__).resolve().parents[2] / "reports/gpu/nvfp4-grouped/crossover-engines/bench_cross.json"


@pytest.mark.parametrize(
    ("E", "k", "want"),
    [
        (256, 8, 24),  # DeepSeek-V3: 256 // 8 = 32, capped at 24
        (128, 4, 24),  # gpt-oss-120b: 128 // 4 = 32 -> 24
        (128, 8, 16),  # Qwen3-235B-A22B, Qwen3-30B-A3B: 128 // 8 = 16
        (384, 8, 24),  # Kimi-K2: 48 -> 24
        (160, 8, 20),  # GLM-4.5: 160 // 8 = 20
        (512, 10, 24),  # Qwen3-Next-80B: 51 -> 24
        (128, 1, 24),  # Llama-4-Maverick: 128 -> 24
        (8, 2, 4),  # Mixtral-8x7B: 8 // 2 = 4
        (512, 2, 24),  # 256 -> 24: the cap
        (192, 8, 24),  # 24: the rule and the cap agree
        (200, 8, 24),  # 25 -> 24
        (184, 8, 23),  # 23: below the cap
        (6, 3, 2),  # the conformance CPU shape cpu-E6-H96-I64-k3: 6 // 3
        (10, 3, 3),  # the conformance CPU shape cpu-E10-H160-I192-k3: 10 // 3
        (6, 2, 3),  # 6 // 2
        (9, 1, 9),  # 9 // 1: a decode limit past the router's GEMV range (8)
        (16, 2, 8),  # 16 // 2 = 8: the router's GEMV range exactly
        (10, 8, 1),  # 10 // 8 = 1
        (1, 1, 1),  # 1 // 1
        (3, 3, 1),  # E = k: one token still decodes
        (16, 16, 1),  # E = k at the router's top_k limit
    ],
)
def test_decode_max_tokens_values(E: int, k: int, want: int) -> None:
    assert decode_max_tokens(E, k) == want


def test_decode_max_tokens_is_the_stated_rule() -> None:
    assert DECODE_MAX_TOKENS == 32 and DECODE_DISPATCH_MAX_TOKENS == 24
    for E in range(1, 300):
        for k in range(1, min(E, 16) + 1):
            decode = [M for M in range(1, 100) if M <= 24 and M * k <= E]
            assert decode_max_tokens(E, k) == max(decode, default=1) >= 1, (E, k)
            assert decode == list(range(1, len(decode) + 1))


def test_decode_max_tokens_agrees_with_the_measurement() -> None:
    """Every (model, M) point of the H200 crossover run with the Gluon engines: decode where it was faster, grouped
    where it lost."""
    from flint_moe.shapes import MODEL_SHAPES

    rows = json.loads(CROSSOVER.read_text())
    assert {r["model"] for r in rows} == {"deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b"} and len(rows) == 24
    for r in rows:
        s = MODEL_SHAPES[r["model"]]
        side = "decode" if r["M"] <= decode_max_tokens(s.num_experts, s.top_k) else "grouped"
        assert side == r["faster"] == ("decode" if r["decode_us"] < r["grouped_us"] else "grouped"), r
    # the largest measured M where decode won, per model, as in the README's table
    last = {m: max(r["M"] for r in rows if r["model"] == m and r["faster"] == "decode") for m in MODEL_SHAPES
            if any(r["model"] == m for r in rows)}  # fmt: skip
    assert last == {"deepseek-v3": 24, "qwen3-235b-a22b": 16, "gpt-oss-120b": 24}


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






@pytest.fixture
def stub_launchers(monkeypatch) -> list:
    """The decode launchers (``route``, ``launch_gate_up``, ``launch_down``) and the grouped one
    (``launch_grouped``) replaced by stubs that record (path, M) and return a new bf16 [M, H] tensor: the
    dispatch decision alone, no kernel run."""
    import sys

    import flint_moe.ops.moe_nvfp4 as op
    import flint_moe.ops.moe_nvfp4_grouped as grouped

    calls: list = []
    route_mod = sys.modules["flint_moe.ops.route"]
    monkeypatch.setattr(route_mod, "route", lambda x, *a, **kw: calls.append(("route", x.shape[0])) or (None, None))
    monkeypatch.setattr(op, "launch_gate_up", lambda x, *a, **kw: calls.append(("gate_up", x.shape[0])) or x)
    monkeypatch.setattr(op, "launch_down", lambda act, *a, **kw: calls.append(("down", act.shape[0])) or act.clone())
    monkeypatch.setattr(grouped, "launch_grouped",
                        lambda x, *a, **kw: calls.append(("grouped", x.shape[0])) or x.clone())  # fmt: skip
    return calls


@pytest.mark.skipif(not INTERPRET, reason="CPU tensors need the Triton interpreter")
@pytest.mark.parametrize(
    ("E", "k", "L"),
    [(256, 8, 24), (128, 8, 16), (128, 4, 24), (8, 2, 4), (512, 2, 24), (6, 6, 1)],
    ids=["deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b", "mixtral-8x7b", "E512-k2-cap", "E-equals-k"],
)
def test_flint_moe_sends_the_limit_to_decode_and_one_more_to_grouped(stub_launchers, E: int, k: int, L: int) -> None:
    """On the measured layers' E and k (small H and I), Mixtral's, the cap and E = k: M = L (hand-derived,
    ``min(24, E // k)``) runs the three decode launches, M = L + 1 the grouped launcher only, and so does M = 25
    .. ``DECODE_MAX_TOKENS`` (the per-shape branch) and ``DECODE_MAX_TOKENS`` + 1 (the early exit)."""
    assert decode_max_tokens(E, k) == L
    w, x, router, shared = _layer(E, DECODE_MAX_TOKENS + 1, seed=E + k)
    for M in (L, L + 1, 25, DECODE_MAX_TOKENS, DECODE_MAX_TOKENS + 1):
        stub_launchers.clear()
        out = flint_moe(x[:M].contiguous(), router, w, k, make_route_counter("cpu"), shared[:M].contiguous())
        assert out.shape == (M, H)
        want = [("route", M), ("gate_up", M), ("down", M)] if M <= L else [("grouped", M)]
        assert stub_launchers == want, (E, k, M)


@pytest.mark.skipif(not INTERPRET, reason="CPU tensors need the Triton interpreter")
@pytest.mark.parametrize(("E", "k"), [(6, 2), (9, 1)], ids=["limit3-router-gemv", "limit9-router-gemm"])
def test_flint_moe_dispatch_on_both_sides_of_the_limit(grouped_calls, E: int, k: int) -> None:
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
    from flint_moe.ops import route

    L = decode_max_tokens(E, k)
    assert L == {(6, 2): 3, (9, 1): 9}[E, k]  # 6 // 2, 9 // 1
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
