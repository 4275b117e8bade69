"""The CuTe DSL gate/up of the decode block (flint_moe/kernels/cute/ll_gate_up.py ``finish`` after the partial
kernel of ll_partial.py): its builds compiled for sm_90a on the CPU and their PTX audited in test_cute_ptx.py;
the addressing functions (the very code the kernels trace) against the golden model's layout decoders; the
spec's limits; the exact decode of the CPU model (tests/ops/_ll_emulate.py) against the golden format decoders.
Whether the kernels compute the right values is not checked here: CuTe DSL has no CPU interpreter (the GPU
tests: tests/ops/test_moe_ll_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flint_moe.kernels.cute.ll_gate_up import (
    GateUpSpec,
    gate_up_rows,
    scale_block_byte,
    scale_block_shape,
    scale_row_byte,
)
from flint_moe.layouts import FlintMoEWeights
from flint_moe.reference.formats import e2m1_to_float, e4m3_to_float
from flint_moe.reference.layouts import cutedsl_w13_phys_rows, swizzle_offsets
from tests.layouts._gen import nvfp4
from tests.ops._ll_emulate import decode_e2m1, decode_e4m3

from ._cute_check import assert_row_reads_checkpoint

BACKEND = "any"


def test_spec_limits() -> None:
    with pytest.raises(ValueError, match=r"hidden 7160 must be a positive multiple of 16 with 1 <= splits \(1\)"):
        GateUpSpec(7160, 2048, 256, 1, True, 8)
    with pytest.raises(ValueError, match=r"hidden 2048 must be .* 1 <= splits \(129\) <= hidden / 16"):
        GateUpSpec(2048, 2048, 256, 129, True, 8)
    GateUpSpec(5120, 1536, 160, 3, True, 8)  # a lane tail: 320 blocks in splits of 107, 107, 106
    with pytest.raises(ValueError, match=r"intermediate 96 must be a positive multiple of 64"):
        GateUpSpec(2048, 96, 8, 1, True, 8)
    with pytest.raises(ValueError, match=r"experts 4 must be >= 1 \(1 for the shared expert\)"):
        GateUpSpec(2048, 512, 4, 1, False, 1)
    GateUpSpec(2048, 512, 16, 1, True, 16)
    for e, k, routed in ((16, 17, True), (8, 9, True), (8, 0, True), (1, 2, False), (1, 0, False)):
        with pytest.raises(ValueError, match=rf"^GateUpSpec: top_k {k} must be in \[1, min\(experts = {e}, 16\)\]"):
            GateUpSpec(2048, 512, e, 1, routed, k)


def test_scale_addressing_matches_the_golden_swizzle() -> None:
    e_count, rows, hidden = 3, 256, 320  # 20 scale blocks per row: Kp = 20, two row tiles
    mp, kp = scale_block_shape(rows, hidden)
    assert (mp, kp) == (256, 20)
    want = swizzle_offsets(rows, hidden // 16)  # int64 [rows, blocks], one expert
    for e in range(e_count):
        got = torch.tensor(
            [[scale_row_byte(e, r, mp, kp) + scale_block_byte(b) for b in range(hidden // 16)] for r in range(rows)]
        )
        assert torch.equal(got, want + e * mp * kp)


def test_routed_rows_read_the_interleaved_weights() -> None:
    """The kernel's rows and words read FlintMoEWeights.w1 / w1_sf_swizzled back into the checkpoint's codes and
    scales: gate row i is w13[e, i], up row i is w13[e, I + i] (ModelOpt [gate; up])."""
    E, H, I = 2, 512, 128  # noqa: N806, E741
    w13, s13, w2, s2 = nvfp4(E, H, I, 7)
    w = FlintMoEWeights.from_modelopt(w13, s13, torch.ones(E), w2, s2, torch.ones(E))
    words = w.w1.reshape(-1).view(torch.int32)
    sf = w.w1_sf_swizzled.reshape(-1).view(torch.uint8)
    phys = cutedsl_w13_phys_rows(I, I)
    for i in range(I):
        g, u = gate_up_rows(i, I, True)
        assert (g, u) == (int(phys[i]), int(phys[I + i]))
    for e in range(E):
        for i in (0, 1, 63, 64, 127):
            for logical, row in zip((i, I + i), gate_up_rows(i, I, True), strict=True):
                assert_row_reads_checkpoint(words, sf, e, row, 2 * I, H, w13[e, logical], s13[e, logical])


def test_shared_rows_are_gate_then_up() -> None:
    assert gate_up_rows(5, 64, False) == (5, 69)
    assert gate_up_rows(63, 64, False) == (63, 127)


def _as_f32(bits: int) -> np.float32:
    return np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0]


def _mul(a, b) -> np.float32:
    return np.float32(a) * np.float32(b)  # IEEE fp32, subnormal inputs kept (as mul.rn.f32)


def _bits(values) -> list[int]:
    return [int(v) for v in np.array(values, dtype=np.float32).view(np.uint32)]


def test_e2m1_decode_is_exact_for_every_code() -> None:
    got = [decode_e2m1(c, _as_f32, _mul) for c in range(16)]
    want = e2m1_to_float(torch.arange(16, dtype=torch.uint8)).numpy()
    assert _bits(got) == _bits(want)  # signed zero of code 8 included


def test_e4m3_decode_is_exact_for_every_byte_and_its_sign_extension() -> None:
    finite = [b for b in range(256) if b & 0x7F != 0x7F]
    want = _bits(e4m3_to_float(torch.tensor(finite, dtype=torch.uint8)).numpy())
    assert _bits([decode_e4m3(b, _as_f32, _mul) for b in finite]) == want
    # the kernel reads the scale bytes as int8 (sign-extended); only bits 0-7 count
    assert _bits([decode_e4m3(b - 256 if b > 127 else b, _as_f32, _mul) for b in finite]) == want
    assert decode_e4m3(0x01, _as_f32, _mul) == np.float32(2.0**-9)  # smallest subnormal, not flushed
