"""Token/expert permutation of the grouped NVFP4 path.

``moe_permute(ids, num_experts, block_m) -> MoEPermutation``: the M * k (token, slot) pairs sorted by
expert, and the tile schedule of the grouped GEMMs (``nvfp4_grouped_gate_up`` / ``nvfp4_grouped_down``).

Definitions (P = M * k pairs; pair p = t * k + j is token t's j-th selected expert ``ids[t, j]``):

- ``order`` int32 [P]: the pair indices sorted by expert, ties in increasing pair index (a stable sort:
  token order, then slot order). Deterministic: ``torch.sort(stable=True)`` is a deterministic radix /
  merge sort on every device, and the tie order is fixed by stability, not by the device.
- ``offsets`` int32 [E + 1]: expert e's pairs are ``order[offsets[e]:offsets[e + 1]]`` (``offsets[0] = 0``,
  ``offsets[E] = P``); an expert with no pair has an empty range, an expert picked by every token has M.
- the tile schedule: expert e is cut into ``cdiv(count_e, block_m + tail)`` row blocks of at most
  ``block_m + tail`` pairs (``tail`` = 0 unless asked: the expert-wide row blocks of the grouped GEMMs, whose
  programs carry a ``block_m``-pair accumulator plus a ``tail``-pair one); the blocks of all experts are
  numbered consecutively (expert order). ``num_blocks`` (host int) = ``cdiv(P, block_m + tail) + min(E, P)``,
  an upper bound of the real block count that depends only on (P, E, block_m, tail), so the launch grid never
  needs a device-to-host copy (CUDA-graph safe). Block b has
  ``block_expert[b]``, ``block_start[b]`` and ``block_end[b]`` (int32 positions into ``order``). The unused
  blocks at the end are empty (``start == end == 0``) and name expert ``E - 1`` (a valid index, so a kernel
  may read that expert's global scale without a bounds check).

Every step is a torch op on the device (sort, searchsorted, cumsum, elementwise): no host synchronisation,
no atomics, identical results on every run. Ids must lie in [0, E) (``route`` guarantees it; not checked on
the device, which would synchronise: an out-of-range id is left out of every expert's range, so its pair is
never computed). Offsets fit int32 for P < 2^31; the GEMM kernels form element offsets in 64 bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flint_moe.kernels._launch import check_op_tensor

__all__ = ["MoEPermutation", "moe_permute", "num_blocks_bound"]


@dataclass(frozen=True)
class MoEPermutation:
    """Result of :func:`moe_permute` (see the module docstring). All tensors int32 on ids' device."""

    order: torch.Tensor
    offsets: torch.Tensor
    block_expert: torch.Tensor
    block_start: torch.Tensor
    block_end: torch.Tensor
    num_experts: int
    top_k: int
    block_m: int
    tail: int = 0

    @property
    def num_blocks(self) -> int:
        """Launch-grid size of the row blocks (an upper bound of the used blocks)."""
        return int(self.block_expert.numel())

    @property
    def rows_per_block(self) -> int:
        """Most pairs of one row block: ``block_m + tail``."""
        return self.block_m + self.tail


def num_blocks_bound(pairs: int, num_experts: int, block_m: int, tail: int = 0) -> int:
    """``cdiv(pairs, block_m + tail) + min(num_experts, pairs)``: at most this many row blocks are used."""
    return -(-pairs // (block_m + tail)) + min(num_experts, pairs)


def moe_permute(ids: torch.Tensor, num_experts: int, block_m: int, tail: int = 0) -> MoEPermutation:
    """Sort the (token, slot) pairs of ``ids`` by expert and build the grouped GEMMs' row-block schedule.

    Args:
        ids: int32 [M, k] contiguous, the selected experts (rule step 2), values in [0, num_experts).
        num_experts: E >= 1.
        block_m: rows (pairs) per block, a power of two >= 16.
        tail: 0 (row blocks of ``block_m`` pairs), or a power of two in [16, block_m]: row blocks of up to
            ``block_m + tail`` pairs, for the grouped GEMMs' expert-wide row blocks (the first ``block_m``
            pairs of a block in one accumulator, the rest in a ``tail``-pair one).
    Returns:
        :class:`MoEPermutation` (module docstring); ``ids`` is not modified.
    Raises:
        TypeError / ValueError naming the bad argument.
    """
    check_op_tensor("ids", ids, dtype=torch.int32, shape=(None, None))
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts: expected an int >= 1, got {num_experts!r}")
    if isinstance(block_m, bool) or not isinstance(block_m, int) or block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m: expected a power of two >= 16, got {block_m!r}")
    bad_tail = isinstance(tail, bool) or not isinstance(tail, int)
    if bad_tail or (tail and (tail < 16 or tail > block_m or tail & (tail - 1))):
        raise ValueError(f"tail: expected 0 or a power of two in [16, block_m = {block_m}], got {tail!r}")
    m, k = ids.shape
    p = m * k
    if p >= 2**31:
        raise ValueError(f"ids: {p} pairs exceed the int32 positions of the permutation (< 2^31)")
    dev = ids.device
    E = num_experts
    flat = ids.reshape(-1)
    sorted_e, order = torch.sort(flat, stable=True)
    probes = torch.arange(E + 1, dtype=torch.int32, device=dev)
    offsets = torch.searchsorted(sorted_e, probes).to(torch.int32)  # first position with expert >= e
    counts = offsets[1:] - offsets[:-1]
    rows = block_m + tail
    nblk = (counts + (rows - 1)) // rows
    blk_end = torch.cumsum(nblk, 0, dtype=torch.int32)  # [E]: one past the last block of expert e
    nb = num_blocks_bound(p, E, block_m, tail)
    b = torch.arange(nb, dtype=torch.int32, device=dev)
    be = torch.searchsorted(blk_end, b, right=True).to(torch.int32)  # first expert whose blocks end after b
    used = be < E
    bec = torch.clamp(be, max=E - 1).long()
    first = blk_end[bec] - nblk[bec]
    start = offsets[bec] + (b - first) * rows
    end = torch.minimum(start + rows, offsets[bec + 1])
    zero = torch.zeros_like(start)
    return MoEPermutation(
        order=order.to(torch.int32),
        offsets=offsets,
        block_expert=bec.to(torch.int32),
        block_start=torch.where(used, start, zero),
        block_end=torch.where(used, end, zero),
        num_experts=E,
        top_k=int(k),
        block_m=block_m,
        tail=tail,
    )
