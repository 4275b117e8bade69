"""``moe_permute``: the (token, slot) pairs sorted by expert and the grouped GEMMs' row-block schedule.

Checked against an independent pure-Python construction (lists per expert, in pair order): exact order,
offsets, every expert's pairs covered by its blocks exactly once, blocks of at most ``block_m`` rows, unused
blocks empty; experts with no pair and an expert picked by every token; deterministic; errors.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.nvfp4.permute import moe_permute, num_blocks_bound

from ._grouped_check import ids_with_counts

BACKEND = "any"


def _reference(ids: torch.Tensor, E: int, bm: int):
    """(order, offsets, blocks) built from per-expert lists; blocks of at most ``bm`` pairs."""
    flat = ids.reshape(-1).tolist()
    per = [[p for p, e in enumerate(flat) if e == ex] for ex in range(E)]
    order = [p for lst in per for p in lst]
    offsets = [0]
    for lst in per:
        offsets.append(offsets[-1] + len(lst))
    blocks = []
    for ex, lst in enumerate(per):
        for s in range(0, len(lst), bm):
            blocks.append((ex, offsets[ex] + s, offsets[ex] + min(s + bm, len(lst))))
    return order, offsets, blocks


def _check(ids, E, bm, tail=0):
    perm = moe_permute(ids, E, bm, tail) if tail else moe_permute(ids, E, bm)
    order, offsets, blocks = _reference(ids.cpu(), E, bm + tail)
    assert perm.order.tolist() == order
    assert perm.offsets.tolist() == offsets
    assert (perm.block_m, perm.tail, perm.rows_per_block) == (bm, tail, bm + tail)
    nb = num_blocks_bound(ids.numel(), E, bm, tail)
    assert perm.num_blocks == nb >= len(blocks)
    got = list(zip(perm.block_expert.tolist(), perm.block_start.tolist(), perm.block_end.tolist(), strict=True))
    assert got[: len(blocks)] == blocks
    assert all(s == en == 0 and ex == E - 1 for ex, s, en in got[len(blocks) :]), "unused blocks not empty"
    for t in (perm.order, perm.offsets, perm.block_expert, perm.block_start, perm.block_end):
        assert t.dtype == torch.int32 and t.device == ids.device
    return perm


@pytest.mark.parametrize("M,E,k,bm", [(1, 3, 1, 16), (9, 7, 3, 16), (37, 10, 5, 16), (200, 6, 4, 32), (70, 257, 8, 64)])
def test_matches_reference_random(M, E, k, bm):
    g = torch.Generator().manual_seed(M * 1000 + E)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).to(torch.int32)
    ids0 = ids.clone()
    _check(ids, E, bm)
    assert torch.equal(ids, ids0), "ids was modified"


def test_empty_experts_and_expert_with_every_token():
    # expert 2 is picked by every token (slot 0), experts 0, 4 and 6 by none; 40 > block_m pairs of expert 2.
    M, E, k = 40, 7, 2
    ids = torch.empty(M, k, dtype=torch.int32)
    ids[:, 0] = 2
    ids[:, 1] = torch.tensor([1, 3, 5])[torch.arange(M) % 3]
    perm = _check(ids, E, 16)
    off = perm.offsets.tolist()
    assert off[3] - off[2] == M and off[1] - off[0] == 0 and off[5] - off[4] == 0 and off[7] - off[6] == 0
    # expert 2's pairs, in token order, are split into blocks of 16, 16, 8
    b2 = [(s, e) for ex, s, e in zip(perm.block_expert.tolist(), perm.block_start.tolist(),
                                     perm.block_end.tolist(), strict=True) if ex == 2 and e > s]  # fmt: skip
    assert [e - s for s, e in b2] == [16, 16, 8]
    assert perm.order[off[2] : off[3]].tolist() == [2 * t for t in range(M)]


def test_expert_wide_blocks_of_block_m_plus_tail():
    # counts 0, 1, 128, 129, 160 = 128 + 32 and 200: blocks of at most 160 pairs -> [1], [128], [129], [160],
    # [160, 40]; with tail 0 the same pairs make [1], [128], [128, 1], [128, 32], [128, 72]
    counts = [0, 1, 128, 129, 160, 200]
    ids = ids_with_counts(counts, 3, 1)
    assert torch.bincount(ids.reshape(-1).long(), minlength=6).tolist() == counts
    perm = _check(ids, 6, 128, 32)
    sizes = (perm.block_end - perm.block_start).tolist()
    used = [(ex, n) for ex, n in zip(perm.block_expert.tolist(), sizes, strict=True) if n > 0]
    assert used == [(1, 1), (2, 128), (3, 129), (4, 160), (5, 160), (5, 40)]
    assert perm.num_blocks == -(-618 // 160) + 6
    default = _check(ids, 6, 128)
    assert int((default.block_end > default.block_start).sum()) == 8
    _check(ids, 6, 16, 16)  # blocks of 32: expert 5 in 7 blocks, the last of 8 pairs


@pytest.mark.parametrize(
    "M,E,k,bm,tail", [(9, 7, 3, 16, 16), (200, 6, 4, 32, 16), (300, 5, 2, 64, 32), (70, 257, 8, 64, 64)]
)
def test_tail_matches_reference_random(M, E, k, bm, tail):
    g = torch.Generator().manual_seed(M * 1000 + E + tail)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).to(torch.int32)
    _check(ids, E, bm, tail)


def test_single_expert_layer_and_deterministic():
    ids = torch.zeros(33, 1, dtype=torch.int32)
    p1 = _check(ids, 1, 16)
    p2 = moe_permute(ids, 1, 16)
    assert torch.equal(p1.order, p2.order) and torch.equal(p1.block_start, p2.block_start)


def test_errors():
    ids = torch.zeros(4, 2, dtype=torch.int32)
    with pytest.raises(TypeError, match="^ids"):
        moe_permute(ids.long(), 4, 16)
    with pytest.raises(ValueError, match="^ids"):
        moe_permute(ids.t(), 4, 16)
    with pytest.raises(ValueError, match="^num_experts"):
        moe_permute(ids, 0, 16)
    with pytest.raises(ValueError, match="^block_m"):
        moe_permute(ids, 4, 24)
    with pytest.raises(ValueError, match="^block_m"):
        moe_permute(ids, 4, 8)
    for tail in (8, 24, 32, True):  # below 16, not a power of two, above block_m = 16, not an int
        with pytest.raises(ValueError, match="^tail"):
            moe_permute(ids, 4, 16, tail)
