"""``flint_moe_bf16_decode``: row maps changed behind the version counter never read outside the weights and
are reported; ``shared_ready`` of a wrong type is refused before any launch (Triton interpreter, CPU).

A map changed through ``.data`` or ``.numpy()`` keeps its version counter, so the op's first-use value
check (``ops._checks.checked_row_maps``) does not see the change. The kernels read a value out of range as
the layout's own row (so the output is the correct one) and an in-range value as given;
``flint_moe.ops.check_row_map_status`` compares every map the op checked with the expected one again.

Expected outputs are derived independently: the op on fresh maps (out-of-range values), or on a map holding
the same wrong in-range values with the value check off.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels._launch import INTERPRET
from flint_moe.layouts import to_trtllm_bf16, trtllm_bf16_row_maps
from flint_moe.ops import check_row_map_status, flint_moe_bf16_decode, make_route_counter

pytestmark = pytest.mark.skipif(not INTERPRET, reason="CPU tensors need the Triton interpreter")

E, H, I, K = 5, 128, 64, 2  # noqa: E741


def _layer(seed: int = 3) -> dict:
    g = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, generator=g) * 0.1).to(torch.bfloat16)
    g1, g2 = to_trtllm_bf16(w13, w2)
    return dict(
        g1=g1,
        g2=g2,
        router=(torch.randn(E, H, generator=g) * 0.1).to(torch.bfloat16),
        x=torch.randn(1, H, generator=g).to(torch.bfloat16),
        shared=(torch.randn(1, H, generator=g) * 0.1).to(torch.bfloat16),
    )


def _op(c: dict, maps, **kw) -> torch.Tensor:
    return flint_moe_bf16_decode(
        c["x"], c["router"], c["g1"], c["g2"], maps, K, make_route_counter("cpu"), c["shared"], **kw
    )


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.fixture(autouse=True)
def _nothing_left_wrong():
    """Every test leaves no remembered map with wrong values behind."""
    yield
    check_row_map_status("cpu")


@pytest.fixture(scope="module")
def layer() -> dict:
    return _layer()


@pytest.fixture(scope="module")
def good(layer) -> torch.Tensor:
    return _op(layer, trtllm_bf16_row_maps(H, I))


@pytest.mark.parametrize("how", ["data", "numpy"])
def test_out_of_range_map2_value_written_behind_the_version_counter(layer, good, how) -> None:
    m13, m2 = trtllm_bf16_row_maps(H, I)
    _op(layer, (m13, m2))  # first use: values checked, tensors remembered with their version
    check_row_map_status("cpu")
    version, want = m2._version, int(m2[3])
    if how == "data":
        m2.data[3] = 1 << 24
    else:
        m2.numpy()[3] = 1 << 24
    assert m2._version == version  # the first-use check cannot see this write
    out = _op(layer, (m13, m2))  # no crash, no read outside w2: the layout's row 3 is read instead
    assert _same(out, good)
    with pytest.raises(RuntimeError, match=rf"^row_maps\[1\]: the map2 tensor on cpu \(H = 128, I = 64\) changed "
                       rf"after flint_moe_bf16_decode checked it .*: entry 3 holds 16777216, the layout's value is "
                       rf"{want}\. "):  # fmt: skip
        check_row_map_status("cpu")
    with pytest.raises(ValueError, match=r"^row_maps\[1\]: not the TRT-LLM BF16 row map"):
        _op(layer, (m13, m2))  # forgotten when reported: the op checks it again


def test_negative_map13_value_reads_the_layouts_row_and_is_reported(layer, good) -> None:
    m13, m2 = trtllm_bf16_row_maps(H, I)
    _op(layer, (m13, m2))
    m13.numpy()[70] = -5  # up row 6
    assert _same(_op(layer, (m13, m2)), good)
    with pytest.raises(RuntimeError, match=r"^row_maps\[0\]: the map13 tensor .*: entry 70 holds -5, "):
        check_row_map_status()


def test_in_range_wrong_permutation_is_read_as_given_and_reported(layer, good) -> None:
    m13, m2 = trtllm_bf16_row_maps(H, I)
    _op(layer, (m13, m2))
    a, b = int(m13[0]), int(m13[I])
    m13.data[0], m13.data[I] = b, a  # gate row 0 and up row 0 swapped: a permutation, every value in range
    out = _op(layer, (m13, m2))
    swapped = trtllm_bf16_row_maps(H, I)[0]
    swapped[0], swapped[I] = b, a
    assert _same(out, _op(layer, (swapped, m2), check_row_map_values=False))
    assert not _same(out, good)
    with pytest.raises(RuntimeError, match=rf"^row_maps\[0\]: .*: entry 0 holds {b}, the layout's value is {a}\. "):
        check_row_map_status("cpu")


def test_unchecked_maps_are_not_remembered(layer, good) -> None:
    """``check_row_map_values=False`` (deliberately wrong maps): out-of-range values still read the layout's
    rows, and the maps are neither checked nor remembered."""
    m13, m2 = trtllm_bf16_row_maps(H, I)
    m2[0], m13[1] = -1, 1 << 20
    assert _same(_op(layer, (m13, m2), check_row_map_values=False), good)
    check_row_map_status("cpu")


def test_check_row_map_status_filters_by_device(layer) -> None:
    m13, m2 = trtllm_bf16_row_maps(H, I)
    _op(layer, (m13, m2))
    m2.data[7] = v6 = int(m2[6])
    check_row_map_status("cuda:0")  # another device: nothing to compare there
    with pytest.raises(RuntimeError, match=rf"^row_maps\[1\]: the map2 tensor on cpu .*: entry 7 holds {v6}, "):
        check_row_map_status(torch.device("cpu"))


def _no_launch(*args, **kwargs):
    raise AssertionError("a kernel was launched")


@pytest.mark.parametrize("bad", [object(), "event", 1, torch.cuda.Stream])
def test_shared_ready_of_a_wrong_type_launches_nothing(layer, monkeypatch, bad) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    maps = trtllm_bf16_row_maps(H, I)
    monkeypatch.setattr(InterpretedFunction, "run", _no_launch)
    with pytest.raises(TypeError, match=r"^shared_ready: expected a torch.cuda.Event or None, got "):
        _op(layer, maps, shared_ready=bad)
