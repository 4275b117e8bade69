"""``flint_moe`` / ``flint_moe_grouped``: the weights' metadata is checked at every entry, and ``shared_ready``
of a wrong type is refused, before any kernel launches (Triton interpreter, CPU).

``FlintMoEWeights`` is immutable, but its tensors are not: ``.data =`` or ``resize_`` change a tensor behind
the constructor's checks. Every path (decode M <= ``decode_max_tokens(E, k)``, grouped through ``flint_moe`` for
larger M, also above ``DECODE_MAX_TOKENS``, ``flint_moe_grouped`` itself) must refuse such weights with an error
naming the field; no kernel may run (``InterpretedFunction.run`` is replaced by a function that fails the test).
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from flint_moe.kernels._launch import INTERPRET
from flint_moe.layouts import FlintMoEWeights
from flint_moe.ops import DECODE_MAX_TOKENS, decode_max_tokens, flint_moe, flint_moe_grouped, make_route_counter
from tests.layouts._gen import nvfp4

pytestmark = pytest.mark.skipif(not INTERPRET, reason="CPU tensors need the Triton interpreter")

E, H, I, K = 6, 128, 64, 2  # noqa: E741

#: (path name, op, token count)
PATHS = [
    ("decode", flint_moe, 1),
    ("decode at the limit", flint_moe, decode_max_tokens(E, K)),
    ("grouped via flint_moe", flint_moe, decode_max_tokens(E, K) + 1),
    ("grouped via flint_moe above every limit", flint_moe, DECODE_MAX_TOKENS + 1),
    ("grouped", flint_moe_grouped, 1),
]


def _weights() -> FlintMoEWeights:
    w13, s13, w2, s2 = nvfp4(E, H, I, 5)
    gs = torch.rand(E, generator=torch.Generator().manual_seed(6)) + 0.5
    return FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs)


def _no_launch(*args, **kwargs):
    raise AssertionError("a kernel was launched")


@pytest.fixture
def no_launch(monkeypatch):
    from triton.runtime.interpreter import InterpretedFunction

    monkeypatch.setattr(InterpretedFunction, "run", _no_launch)


def _call(op, w, m, **kw):
    x = torch.zeros(m, H, dtype=torch.bfloat16)
    router = torch.zeros(E, H, dtype=torch.bfloat16)
    return op(x, router, w, K, make_route_counter("cpu"), torch.zeros_like(x), **kw)


def _two_expert_w2(w: FlintMoEWeights) -> None:
    w.w2.data = w.w2[:2].clone()


def _resized_alpha(w: FlintMoEWeights) -> None:
    w.w1_alpha.resize_(E - 1)


def _moved_scales(w: FlintMoEWeights) -> None:
    w.w1_sf_swizzled.data = w.w1_sf_swizzled.clone()  # same shape, new storage: w1_sf views the old one


def _strided_w1(w: FlintMoEWeights) -> None:
    w.w1.data = torch.cat([w.w1, w.w1], dim=2)[:, :, ::2]


CHANGES = [
    (_two_expert_w2, ValueError, r"^weights\.w2: dimension 0 must be 6, got 2"),
    (_resized_alpha, ValueError, r"^weights\.w1_alpha: dimension 0 must be 6, got 5"),
    (_moved_scales, ValueError, r"^weights\.w1_sf: no longer the MMA view of weights\.w1_sf_swizzled"),
    (_strided_w1, ValueError, r"^weights\.w1: must be contiguous"),
]


@pytest.mark.parametrize("change,exc,match", CHANGES, ids=[c[0].__name__.strip("_") for c in CHANGES])
@pytest.mark.parametrize("path,op,m", PATHS, ids=[p[0] for p in PATHS])
def test_weights_changed_in_place_are_refused_before_any_launch(no_launch, path, op, m, change, exc, match):
    w = _weights()
    w.check_metadata()
    change(w)
    with pytest.raises(exc, match=match):
        _call(op, w, m)


def test_fields_cannot_be_replaced() -> None:
    import dataclasses

    w = _weights()
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.w2 = w.w2[:2].clone()


@pytest.mark.parametrize("bad", [object(), "event", 1.0, torch.cuda.Stream])
@pytest.mark.parametrize("path,op,m", PATHS, ids=[p[0] for p in PATHS])
def test_shared_ready_of_a_wrong_type_launches_nothing(no_launch, path, op, m, bad) -> None:
    with pytest.raises(TypeError, match=r"^shared_ready: expected a torch.cuda.Event or None, got "):
        _call(op, _weights(), m, shared_ready=bad)


@pytest.mark.parametrize("path,op,m", PATHS, ids=[p[0] for p in PATHS])
def test_shared_ready_event_with_cpu_tensors_launches_nothing(no_launch, path, op, m) -> None:
    with pytest.raises(ValueError, match=r"^shared_ready: a CUDA event only makes sense for CUDA tensors"):
        _call(op, _weights(), m, shared_ready=mock.Mock(spec=torch.cuda.Event))


@pytest.mark.parametrize("path,op,m", PATHS, ids=[p[0] for p in PATHS])
@pytest.mark.parametrize("arg", ["x", "shared_output"])
def test_misaligned_tensor_launches_nothing(no_launch, path, op, m, arg) -> None:
    """A view 2 bytes into its storage (bf16 [M, H] at offset 1) is refused by name before any launch."""
    base = torch.zeros(m * H + 1, dtype=torch.bfloat16)
    bad = base[1:].view(m, H)
    assert bad.data_ptr() % 16 != 0
    x = bad if arg == "x" else torch.zeros(m, H, dtype=torch.bfloat16)
    shared = bad if arg == "shared_output" else torch.zeros(m, H, dtype=torch.bfloat16)
    router = torch.zeros(E, H, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^{arg}: data pointer 0x[0-9a-f]+ is not 16-byte aligned"):
        op(x, router, _weights(), K, make_route_counter("cpu"), shared)
