"""``fma_chain`` over several axes (flint_moe/reference/orders.py): validation, and the replay of hand-built
small cases against a straightforward evaluation (one fp32 fma per element in the stated order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flint_moe.reference.orders import FORMAT, OrderError, check_order, order_summary, replay_dot


def _order(program, axes=(("j", 2), ("lane", 2), ("e", 2)), k=8, parts=None, plen=None):
    return {
        "format": FORMAT, "length": k, "parts": parts or [[0, k]], "part_length": plen or k,
        "axes": [list(a) for a in axes], "program": program,
    }  # fmt: skip


CHAIN_JE = [{"op": "fma_chain", "axis": ["j", "e"], "init": "zero"}, {"op": "tree", "axis": "lane", "shape": "halves"}]


def _fma(a, b, c) -> np.float32:
    # operands below have few significant bits and close exponents: a * b + c is exact in float64, so one
    # rounding to fp32 is the fused multiply-add
    return np.float32(float(a) * float(b) + float(c))


def test_chain_over_two_axes_follows_row_major_order() -> None:
    # element index = 4 j + 2 lane + e; lane l chains elements (j, e) = (0,0), (0,1), (1,0), (1,1)
    w = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=np.float32)
    x = np.array([2.0**24, -(2.0**24), 3.0, 5.0, 1.0, 1.0, 7.0, 9.0], dtype=np.float32)
    lanes = []
    for lane in range(2):
        acc = np.float32(0.0)
        for j in range(2):
            for e in range(2):
                h = 4 * j + 2 * lane + e
                acc = _fma(w[h], x[h], acc)
        lanes.append(acc)
    want = np.float32(float(lanes[0]) + float(lanes[1]))
    got = replay_dot(check_order(_order(CHAIN_JE)), torch.from_numpy(w), torch.from_numpy(x))
    assert got.item() == float(want)
    # lane 0 (elements 0, 1, 4, 5): 2^24 - 2^24 = 0, + 1, + 1 = 2; lane 1: 3 + 5 + 7 + 9 = 24; total 26
    assert float(want) == 26.0
    # the other nesting (e slowest: elements 0, 4, 1, 5): 2^24 + 1 -> 2^24 (tie to even), - 2^24, + 1 = 1
    other = [{"op": "fma_chain", "axis": ["e", "j"], "init": "zero"}, CHAIN_JE[1]]
    assert replay_dot(_order(other), torch.from_numpy(w), torch.from_numpy(x)).item() == 25.0


def test_chain_axes_with_parts_and_first_init() -> None:
    # two parts of 4 (axes a2 x b2), each chained over (a, b) from its first product, then added
    k = 8
    w = torch.tensor([3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    x = torch.tensor([2.0**23, 0.5, 0.5, 0.5, -(2.0**23), 0.25, 0.5, 0.25])
    prog = [
        {"op": "fma_chain", "axis": ["a", "b"], "init": "first"},
        {"op": "add_chain", "axis": "part", "init": "first"},
    ]
    o = _order(prog, axes=(("a", 2), ("b", 2)), k=k, parts=[[0, 4], [4, 8]], plen=4)
    p0 = np.float32(3 * 2.0**23)
    for h in (1, 2, 3):
        p0 = _fma(w[h], x[h], p0)
    p1 = np.float32(-(2.0**23))
    for h in (5, 6, 7):
        p1 = _fma(w[h], x[h], p1)
    want = np.float32(float(p0) + float(p1))
    assert replay_dot(o, w, x).item() == float(want)


@pytest.mark.parametrize(
    ("axis", "pattern"),
    [([], r"axis list \[\] empty"), (["j", "j"], r"repeated"), (["j", "part"], r"'part'"),
     (["j", "zz"], r"axis 'zz' is not a live axis")],
)  # fmt: skip
def test_bad_axis_lists_are_refused(axis, pattern) -> None:
    with pytest.raises(OrderError, match=pattern):
        check_order(_order([{"op": "fma_chain", "axis": axis, "init": "zero"}, CHAIN_JE[1]]))


def test_summary_names_the_chain_axes() -> None:
    assert "fma_chain(j+e,zero) -> tree(lane,halves)" in order_summary(_order(CHAIN_JE))
