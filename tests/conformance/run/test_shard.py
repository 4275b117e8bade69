"""conformance.run.shard: every selected case in exactly one shard for N = 1..16, deterministic, balanced by the
parallel runner's estimates, weight-sharing cases kept together unless their group is longer than a share."""

from __future__ import annotations

import pytest

from flint_moe.conformance.inputs.cases import matrix
from flint_moe.conformance.inputs.profiles import weight_key
from flint_moe.conformance.run.parallel import MUTATION_SECONDS, estimate_seconds
from flint_moe.conformance.run.shard import parse_shard, plan_shards, selection_digest, shard_record

GPU = matrix("gpu")
CPU = matrix("cpu")


@pytest.mark.parametrize("cases", [GPU, CPU], ids=["gpu", "cpu"])
@pytest.mark.parametrize("mutation", [False, True])
def test_every_case_in_exactly_one_shard(cases, mutation):
    ids = [c.id for c in cases]
    for n in range(1, 17):
        shards = plan_shards(cases, n, mutation=mutation)
        assert [s.index for s in shards] == list(range(1, n + 1)) and all(s.count == n for s in shards)
        got = [c.id for s in shards for c in s.cases]
        assert sorted(got) == sorted(ids), n  # no case lost, none twice
        assert len(set(got)) == len(got)
        for s in shards:  # matrix order inside a shard
            pos = [ids.index(c.id) for c in s.cases]
            assert pos == sorted(pos)
        assert sum(s.mutation for s in shards) == (1 if mutation else 0)


def test_one_shard_is_the_whole_selection():
    (s,) = plan_shards(GPU, 1, mutation=True)
    assert [c.id for c in s.cases] == [c.id for c in GPU] and s.mutation


def test_deterministic():
    a = [[c.id for c in s.cases] for s in plan_shards(GPU, 5, mutation=True)]
    b = [[c.id for c in s.cases] for s in plan_shards(list(GPU), 5, mutation=True)]
    assert a == b


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_balanced(n):
    """Greedy longest-first: no shard exceeds an even share by more than the longest atom it took."""
    shards = plan_shards(GPU, n, mutation=True)
    total = sum(estimate_seconds(c) for c in GPU) + MUTATION_SECONDS
    longest = max(max((estimate_seconds(c) for c in s.cases), default=0.0) for s in shards)
    for s in shards:
        est = sum(estimate_seconds(c) for c in s.cases) + (MUTATION_SECONDS if s.mutation else 0.0)
        assert abs(est - s.seconds) < 1e-6
    loads = [s.seconds for s in shards]
    assert max(loads) <= total / n + max(longest, MUTATION_SECONDS) * 2 + 1e-6, loads


def test_weight_groups_stay_together_when_short():
    """A weight group no longer than an even share is never split across shards."""
    n = 2
    shards = plan_shards(GPU, n)
    share = sum(estimate_seconds(c) for c in GPU) / n
    where = {c.id: s.index for s in shards for c in s.cases}
    groups: dict = {}
    for c in GPU:
        groups.setdefault(weight_key(c), []).append(c)
    for members in groups.values():
        if sum(estimate_seconds(c) for c in members) <= share:
            assert len({where[c.id] for c in members}) == 1


def test_parse_shard():
    assert parse_shard("1/1") == (1, 1) and parse_shard(" 3/8 ") == (3, 8)
    for bad in ("0/2", "3/2", "1", "a/b", "1/0", "-1/2", "1/2/3", ""):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_shard_record():
    ids = [c.id for c in CPU]
    s = plan_shards(CPU, 3)[1]
    rec = shard_record(s, ids)
    assert rec["index"] == 2 and rec["count"] == 3 and rec["selection_size"] == len(ids)
    assert rec["cases"] == [c.id for c in s.cases] and rec["mutation"] is False
    assert rec["selection_digest"] == selection_digest(ids) != selection_digest(ids[::-1])
    with pytest.raises(ValueError, match="count must be a positive integer"):
        plan_shards(CPU, 0)
