"""Routing control (flint_moe/conformance/inputs/routing.py, ``Case.route``): the spellings, the checks, the
golden routing of the steered inputs, and the kernels' own ``ids`` on the CPU interpreter (decode and grouped)."""

from __future__ import annotations

import pytest
import torch

from flint_moe import reference as R
from flint_moe.conformance.inputs.cases import Case, make_inputs
from flint_moe.conformance.inputs.routing import check_route, parse_route, route_plan

SHAPE = "cpu-E6-H96-I64-k3"  # E = 6, k = 3


@pytest.mark.parametrize(
    ("text", "canon"),
    [("experts=5", "experts-5"), ("experts=5,1, 3", "experts-5-1-3"), ("experts-4-2", "experts-4-2"),
     ("last", "last"), ("last=2", "last-2"), ("count=128@5", "count-128-5"), ("count=7,0", "count-7-0"),
     ("count-3-1", "count-3-1")],
)  # fmt: skip
def test_parse_route(text, canon):
    assert parse_route(text) == canon


@pytest.mark.parametrize("bad", ["experts", "experts=", "first=2", "count=5", "last=1,2", "count=1@2@3", "experts=a"])
def test_parse_route_rejects(bad):
    with pytest.raises(ValueError, match="expected experts=E1"):
        parse_route(bad)


def test_route_plan_and_checks():
    assert route_plan("experts-5-1", 6, 3, 4) == ([5, 1], 4)
    assert route_plan("last", 6, 3, 4) == ([5, 4, 3], 4)
    assert route_plan("last-2", 10, 8, 4) == ([9, 8], 4)
    assert route_plan("count-3-2", 6, 3, 12) == ([2], 3)
    for route, why in (("experts-6", "below E = 6"), ("experts-1-1", "distinct"), ("experts-0-1-2-3", "top_k = 3"),
                       ("last-4", r"\[1, top_k = 3\]"), ("count-13-2", "N <= M = 12"), ("count-3-6", "expert < E")):
        with pytest.raises(ValueError, match=why):
            check_route(route, 6, 3, 12)
    with pytest.raises(ValueError, match="top_k = 6 < E"):
        check_route("count-1-0", 6, 6, 12)
    with pytest.raises(ValueError, match="sets the routing itself"):
        Case.make("nvfp4_decode", SHAPE, 2, "skewed_routing", route="last")


def test_route_ids_round_trip():
    c = Case.make("nvfp4_grouped", SHAPE, 12, "gaussian", route="count-5-2", config="bm64")
    assert c.id == "nvfp4_grouped/cpu-E6-H96-I64-k3/M12/gaussian/s0/r-count-5-2/c-bm64"
    assert Case.from_id(c.id) == c
    with pytest.raises(ValueError):
        Case.from_id("nvfp4_grouped/cpu-E6-H96-I64-k3/M12/gaussian/s0/r-count-13-2")  # 13 tokens of 12


def _want(case: Case) -> tuple[list[int], int]:
    return route_plan(case.route, case.E, case.k, case.M)


def _check_ids(case: Case, ids: torch.Tensor) -> None:
    forced, n_tok = _want(case)
    ids = ids.to(torch.int64).cpu()
    n = len(forced)
    for t in range(case.M):
        row = ids[t].tolist()
        if t < n_tok:
            assert row[:n] == forced, (case.id, t, row)
        else:
            assert not set(forced) & set(row), (case.id, t, row)


ROUTED = [
    Case.make("nvfp4_decode", SHAPE, 5, "gaussian", route="experts-4-1"),
    Case.make("nvfp4_decode", "cpu-E10-H160-I192-k3", 3, "heavy_tailed", route="last"),
    Case.make("bf16_decode", "cpu-E6-H192-I192-k3", 2, "gaussian", route="experts-5"),
    Case.make("nvfp4_grouped", SHAPE, 12, "gaussian", route="count-5-2"),
    Case.make("nvfp4_dispatch", SHAPE, 9, "gaussian", route="last-2"),
]


@pytest.mark.parametrize("case", ROUTED, ids=[c.id for c in ROUTED])
def test_golden_routing_follows_the_route(case):
    inp = make_inputs(case)
    assert inp.notes["route"] == case.route and inp.notes["forced_experts"] == _want(case)[0]
    acc = R.router_accumulate(inp.x, inp.router_weight)
    logits = R.logits_from_accumulator(acc.exact.to(torch.float32))  # RN32 of the exact sum, then bf16
    _check_ids(case, R.topk_total_order(logits, case.k))


@pytest.mark.parametrize("case", [ROUTED[0], ROUTED[3]], ids=["decode", "grouped"])
def test_kernel_ids_are_the_requested_ones(case):
    """The kernels' own ``ids`` tap (router kernel on the Triton interpreter) holds the forced experts."""
    from flint_moe.conformance.run.paths import path_for
    from flint_moe.ops import make_route_counter

    inp = make_inputs(case)
    taps: dict = {}
    out = path_for(case).run(inp, make_route_counter("cpu"), taps)
    assert out.shape == (case.M, case.H)
    _check_ids(case, taps["ids"])
    if case.path == "nvfp4_grouped":  # exactly count tokens send a slot to the expert
        forced, n_tok = _want(case)
        assert int((taps["ids"] == forced[0]).any(dim=1).sum()) == n_tok
