"""``out=`` on the public ops (``flint_moe``, ``flint_moe_grouped``, ``flint_moe_bf16_decode``): the buffer is
written in full and returned, bitwise equal to the op's own output; a buffer of the wrong dtype, shape, device or
layout, or one sharing memory with an input, is refused before any kernel launches (Triton interpreter, CPU)."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels._launch import INTERPRET
from flint_moe.layouts import FlintMoEWeights, to_trtllm_bf16, trtllm_bf16_row_maps
from flint_moe.ops import (
    DECODE_MAX_TOKENS,
    decode_max_tokens,
    flint_moe,
    flint_moe_bf16_decode,
    flint_moe_grouped,
    make_route_counter,
)
from flint_moe.ops._checks import check_out
from tests.layouts._gen import nvfp4

pytestmark = pytest.mark.skipif(not INTERPRET, reason="CPU tensors need the Triton interpreter")

E, H, I, K = 6, 128, 64, 2  # noqa: E741
LIMIT = decode_max_tokens(E, K)  # 6 // 2 = 3: flint_moe's decode kernels up to 3 tokens here, the grouped path above


@pytest.fixture(scope="module")
def nvfp4_layer() -> dict:
    w13, s13, w2, s2 = nvfp4(E, H, I, 5)
    gs = torch.rand(E, generator=torch.Generator().manual_seed(6)) + 0.5
    g = torch.Generator().manual_seed(7)
    return dict(w=FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs),
                router=(torch.randn(E, H, generator=g) * 0.1).bfloat16(),
                x=torch.randn(DECODE_MAX_TOKENS + 1, H, generator=g).bfloat16(),
                shared=(torch.randn(DECODE_MAX_TOKENS + 1, H, generator=g) * 0.1).bfloat16())  # fmt: skip


@pytest.fixture(scope="module")
def bf16_layer() -> dict:
    g = torch.Generator().manual_seed(3)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.1).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g) * 0.1).bfloat16()
    g1, g2 = to_trtllm_bf16(w13, w2)
    return dict(g1=g1, g2=g2, maps=trtllm_bf16_row_maps(H, I),
                router=(torch.randn(E, H, generator=g) * 0.1).bfloat16(), x=torch.randn(2, H, generator=g).bfloat16(),
                shared=(torch.randn(2, H, generator=g) * 0.1).bfloat16())  # fmt: skip


def _nvfp4(op, c: dict, m: int, **kw) -> torch.Tensor:
    x, shared = c["x"][:m], c["shared"][:m]
    return op(x, c["router"], c["w"], K, make_route_counter("cpu"), shared, **kw)


def _bf16(c: dict, **kw) -> torch.Tensor:
    return flint_moe_bf16_decode(c["x"], c["router"], c["g1"], c["g2"], c["maps"], K, make_route_counter("cpu"),
                                 c["shared"], **kw)  # fmt: skip


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


def _garbage(m: int) -> torch.Tensor:
    """A buffer holding NaN everywhere: an element the op leaves unwritten stays NaN and fails the comparison."""
    return torch.full((m, H), float("nan"), dtype=torch.bfloat16)


NVFP4_PATHS = [("decode", flint_moe, LIMIT), ("grouped via flint_moe", flint_moe, LIMIT + 1),
               ("grouped via flint_moe above every limit", flint_moe, DECODE_MAX_TOKENS + 1),
               ("grouped", flint_moe_grouped, 3)]  # fmt: skip


@pytest.mark.parametrize("path,op,m", NVFP4_PATHS, ids=[p[0] for p in NVFP4_PATHS])
def test_nvfp4_out_is_written_and_returned(nvfp4_layer, path, op, m) -> None:
    want = _nvfp4(op, nvfp4_layer, m)
    out = _garbage(m)
    taps: dict = {}
    got = _nvfp4(op, nvfp4_layer, m, out=out, taps=taps)
    assert got is out and _same(out, want)
    assert taps["out"] is out


def test_bf16_out_is_written_and_returned(bf16_layer) -> None:
    want = _bf16(bf16_layer)
    out = _garbage(2)
    assert _bf16(bf16_layer, out=out) is out and _same(out, want)


def test_no_tokens_returns_the_empty_out(nvfp4_layer, bf16_layer) -> None:
    out = torch.empty(0, H, dtype=torch.bfloat16)
    assert _nvfp4(flint_moe_grouped, nvfp4_layer, 0, out=out) is out
    c = dict(bf16_layer, x=bf16_layer["x"][:0], shared=bf16_layer["shared"][:0])
    assert _bf16(c, out=out) is out


def _bad_outs(c: dict, m: int, names: dict[str, torch.Tensor]) -> list:
    """(out, exception, message pattern): every way a buffer can be wrong, for an op on ``m`` tokens."""
    wide = torch.empty(m, 2 * H, dtype=torch.bfloat16)
    cases = [
        (torch.empty(m, H, dtype=torch.float32), TypeError, r"^out: dtype must be torch\.bfloat16, got torch\.float32"),
        ([0.0], TypeError, r"^out: expected a torch\.Tensor, got list$"),
        (torch.empty(m + 1, H, dtype=torch.bfloat16), ValueError, rf"^out: dimension 0 must be {m}, got {m + 1}"),
        (torch.empty(m, H, 1, dtype=torch.bfloat16), ValueError, r"^out: expected 2 dimensions"),
        (wide[:, ::2], ValueError, r"^out: must be contiguous"),
        (torch.empty(m, H, dtype=torch.bfloat16, device="meta"), ValueError, r"^out: must be on cpu, got meta$"),
    ]  # fmt: skip
    for name, t in names.items():
        if t.numel() * t.element_size() < m * H * 2:
            continue  # (the router of E = 6 rows is too small to hold an out of 9 rows)
        # a bf16 [m, H] view of the input's own memory (its first bytes)
        alias = t.view(-1).view(torch.uint8)[: m * H * 2].view(torch.bfloat16).view(m, H)
        cases.append((alias, ValueError, rf"^out: shares memory with {name}; out must not overlap any input"))
    return cases


def _no_launch(*args, **kwargs):
    raise AssertionError("a kernel was launched")


@pytest.mark.parametrize("path,op,m", NVFP4_PATHS, ids=[p[0] for p in NVFP4_PATHS])
def test_nvfp4_bad_out_is_refused_before_any_launch(nvfp4_layer, monkeypatch, path, op, m) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    monkeypatch.setattr(InterpretedFunction, "run", _no_launch)
    c = nvfp4_layer
    names = {"x": c["x"][:m], "shared_output": c["shared"][:m], "router_weight": c["router"], "weights.w2": c["w"].w2,
             "weights.w1_sf_swizzled": c["w"].w1_sf_swizzled}  # fmt: skip
    for out, exc, match in _bad_outs(c, m, names):
        with pytest.raises(exc, match=match):
            _nvfp4(op, c, m, out=out)


def test_bf16_bad_out_is_refused_before_any_launch(bf16_layer, monkeypatch) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    c = bf16_layer
    _bf16(c)  # the row maps' values are checked once, eagerly
    monkeypatch.setattr(InterpretedFunction, "run", _no_launch)
    names = {"x": c["x"], "shared_output": c["shared"], "w13": c["g1"], "w2": c["g2"]}
    for out, exc, match in _bad_outs(c, 2, names):
        with pytest.raises(exc, match=match):
            _bf16(c, out=out)


def test_overlap_is_by_bytes_touched() -> None:
    """Two row ranges of one buffer: adjacent ones pass, one shared row is refused; a strided input covers the
    bytes between its first and last element."""
    buf = torch.zeros(5, H, dtype=torch.bfloat16)
    assert check_out(buf[2:4], (2, H), torch.device("cpu"), {"shared_output": buf[0:2], "x": buf[4:5]}) is not None
    with pytest.raises(ValueError, match=r"^out: shares memory with x;"):
        check_out(buf[2:4], (2, H), torch.device("cpu"), {"shared_output": buf[0:2], "x": buf[3:5]})
    with pytest.raises(ValueError, match=r"^out: shares memory with x;"):
        check_out(buf[2:4], (2, H), torch.device("cpu"), {"x": buf[::4]})  # rows 0 and 4 span rows 1-3 too
    assert check_out(None, (2, H), torch.device("cpu"), {"x": buf}) is None
