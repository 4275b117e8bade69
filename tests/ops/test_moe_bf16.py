"""``flint_moe_bf16_decode``: row maps changed behind the version counter never read outside the weights and
are reported; ``shared_ready`` of a wrong type is refused before any launch (Triton interpreter, CPU).

A map changed through ``.data`` or ``.numpy()`` keeps its version counter, so the op's first-use value
check (``ops._checks.checked_row_maps``) does not see the change. The kernels compare every loaded map value
with the layout's closed form, clamp it into the map's range and record the entry in the device's row-map
status; ``flint_moe.ops.check_row_map_status`` reports it (and the op itself at its next call).

Expected outputs are derived independently: a value clamped into range reads the row a map holding the
clamped value reads, so the output equals that of the op run on such a map with the value checks off.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels._bf16_gemv import row_map_status
from flint_moe.kernels._common import INTERPRET
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


@pytest.fixture(autouse=True)
def _clean_status():
    """Every test starts and ends with no recorded fault on the CPU."""
    row_map_status("cpu").zero_()
    yield
    assert not bool(row_map_status("cpu").any()), "a test left a row-map fault recorded"


@pytest.fixture(scope="module")
def layer() -> dict:
    return _layer()


def _with(t: torch.Tensor, idx: int, value: int) -> torch.Tensor:
    u = t.clone()
    u[idx] = value
    return u


@pytest.mark.parametrize("how", ["data", "numpy"])
def test_out_of_range_map2_value_written_behind_the_version_counter(layer, how) -> None:
    m13, m2 = trtllm_bf16_row_maps(H, I)
    good = _op(layer, (m13, m2))  # first use: values checked, tensors recorded by version
    check_row_map_status("cpu")
    version = m2._version
    if how == "data":
        m2.data[3] = 1 << 24
    else:
        m2.numpy()[3] = 1 << 24
    assert m2._version == version  # the first-use check cannot see this write
    out = _op(layer, (m13, m2))  # no crash, no read outside w2
    assert bool(torch.isfinite(out.float()).all())
    # clamped to the last row, H - 1: the output of a map holding H - 1 there
    want = _op(layer, (m13, _with(trtllm_bf16_row_maps(H, I)[1], 3, H - 1)), check_row_map_values=False)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert not torch.equal(out.view(torch.int16), good.view(torch.int16))
    with pytest.raises(RuntimeError, match=r"^row_maps\[1\]: entry 3 of map2 held a value other than"):
        check_row_map_status("cpu")
    check_row_map_status("cpu")  # reported once, then cleared


def test_negative_map13_value_is_clamped_and_reported(layer) -> None:
    m13, m2 = trtllm_bf16_row_maps(H, I)
    _op(layer, (m13, m2))
    m13.numpy()[70] = -5  # up row 6: unsigned minimum -> row 2I - 1
    out = _op(layer, (m13, m2))
    want = _op(layer, (_with(trtllm_bf16_row_maps(H, I)[0], 70, 2 * I - 1), m2), check_row_map_values=False)
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    with pytest.raises(RuntimeError, match=r"^row_maps\[0\]: entry 70 of map13 held a value other than"):
        check_row_map_status("cpu")


def test_in_range_wrong_permutation_is_reported(layer) -> None:
    m13, m2 = trtllm_bf16_row_maps(H, I)
    _op(layer, (m13, m2))
    a, b = int(m13[0]), int(m13[I])
    m13.data[0], m13.data[I] = b, a  # gate row 0 and up row 0 swapped: a permutation, every value in range
    out = _op(layer, (m13, m2))
    swapped = trtllm_bf16_row_maps(H, I)[0]
    swapped[0], swapped[I] = b, a
    want = _op(layer, (swapped, m2), check_row_map_values=False)  # the map is read as it is
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    with pytest.raises(RuntimeError, match=rf"^row_maps\[0\]: entry (0|{I}) of map13 held"):
        check_row_map_status("cpu")


def test_the_next_call_reports_an_earlier_fault_before_launching(layer, monkeypatch) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    m13, m2 = trtllm_bf16_row_maps(H, I)
    _op(layer, (m13, m2))
    m2.data[5] = H  # one past the end
    _op(layer, (m13, m2))
    m2.data[5] = int(trtllm_bf16_row_maps(H, I)[1][5])  # repaired: the outputs since the fault stay wrong
    with monkeypatch.context() as mp:
        mp.setattr(InterpretedFunction, "run", _no_launch)
        with pytest.raises(RuntimeError, match=r"^row_maps\[1\]: entry 5 of map2"):
            _op(layer, (m13, m2))
    _op(layer, (m13, m2))  # cleared by the report; the repaired map passes


def test_unchecked_calls_record_into_a_scratch_status(layer) -> None:
    """``check_row_map_values=False`` (deliberately wrong maps): clamped, but no report."""
    m13, m2 = trtllm_bf16_row_maps(H, I)
    out = _op(layer, (m13, _with(m2, 0, -1)), check_row_map_values=False)
    assert bool(torch.isfinite(out.float()).all())
    check_row_map_status("cpu")
    assert int(row_map_status("cpu", scratch=True)[1]) == 1


def test_check_row_map_status_filters_by_device() -> None:
    row_map_status("cpu")[1] = 8  # as the down kernel records a wrong entry 7 of map2
    check_row_map_status("cuda:0", synchronize=False)  # another device: nothing to report there
    with pytest.raises(RuntimeError, match=r"^row_maps\[1\]: entry 7 of map2 .* on cpu loaded it"):
        check_row_map_status()


def _no_launch(*args, **kwargs):
    raise AssertionError("a kernel was launched")


@pytest.mark.parametrize("bad", [object(), "event", 1, torch.cuda.Stream])
def test_shared_ready_of_a_wrong_type_launches_nothing(layer, monkeypatch, bad) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    maps = trtllm_bf16_row_maps(H, I)
    monkeypatch.setattr(InterpretedFunction, "run", _no_launch)
    with pytest.raises(TypeError, match=r"^shared_ready: expected a torch.cuda.Event or None, got "):
        _op(layer, maps, shared_ready=bad)
