"""flint_moe.conformance.judge.metrics: ulp distances on the ordered integer keys, bitwise equality with NaN as
NaN-ness and signed zeros compared, first coordinates and tensor digests, on hand-made tensors."""

from __future__ import annotations

import hashlib
import struct

import torch

from flint_moe.conformance.judge.metrics import _bits_equal, _coords, tensor_digest, ulp_distance


def test_ulp_distance() -> None:
    a = torch.tensor([1.0, -0.0, float("nan"), 1.0, -1.0], dtype=torch.float32)
    b = torch.tensor([1.0, 0.0, float("nan"), float("nan"), 1.0], dtype=torch.float32)
    d = ulp_distance(a, b)
    assert d[:3].tolist() == [0.0, 0.0, 0.0] and d[3].item() == float("inf")
    assert d[4].item() == 2 * 0x3F800000
    nxt = torch.nextafter(torch.tensor([1.0]), torch.tensor([2.0]))
    assert ulp_distance(nxt, torch.tensor([1.0])).item() == 1.0


def test_bits_equal_nan_and_signed_zero() -> None:
    a = torch.tensor([1.0, -0.0, float("nan"), float("nan"), 2.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0, 0.0, -float("nan"), 1.0, 2.0], dtype=torch.bfloat16)
    assert _bits_equal(a, b).tolist() == [True, False, True, False, True]
    ints = torch.tensor([3, 4], dtype=torch.int32), torch.tensor([3, 5], dtype=torch.int32)
    assert _bits_equal(*ints).tolist() == [True, False]


def test_coords_row_major_and_limited() -> None:
    mask = torch.zeros((3, 4), dtype=torch.bool)
    mask[2, 1] = mask[0, 3] = mask[1, 0] = True
    assert _coords(mask) == [[0, 3], [1, 0], [2, 1]]
    assert _coords(mask, limit=2) == [[0, 3], [1, 0]]
    assert _coords(torch.tensor(True)) == [[]] and _coords(torch.tensor(False)) == []


def test_tensor_digest_is_sha256_of_the_row_major_bytes() -> None:
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float32)
    want = hashlib.sha256(struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)).hexdigest()
    assert tensor_digest(t) == want
    assert tensor_digest(t.t().contiguous().t()) == want  # same values, other strides
    assert tensor_digest(t.t()) == hashlib.sha256(struct.pack("<4f", 1.0, 3.0, 2.0, 4.0)).hexdigest()
