"""The shared-memory wavefront model (benchmarks.smem_banks) on hand-counted accesses and on the grouped gate/up
epilogue's scratch (CPU only: Triton's layout conversion, no compile)."""

from __future__ import annotations

import pytest
from triton.experimental.gluon import language as gl

from benchmarks.smem_banks import (
    access,
    element_of,
    epilogue_table,
    padded_offsets,
    row_major_offsets,
    swizzled_offsets,
)


def test_element_of_xors_the_selected_bases():
    bases = [[0, 1], [8, 0], [8, 2]]
    assert element_of(bases, 0) == (0, 0) and element_of(bases, 0b011) == (8, 1)
    assert element_of(bases, 0b110) == (0, 2)  # [8, 0] ^ [8, 2]


def test_offsets_by_hand():
    # column-major (dimension 0 fastest), vec 8, per_phase 2, max_phase 4: (r 10, n 5) -> phase (5 // 2) % 4 = 2,
    # vector 10 // 8 = 1 -> 1 ^ 2 = 3 -> 5 * 128 + 3 * 8 + 10 % 8 = 666
    assert swizzled_offsets((128, 128), 8, 2, 4, order=(0, 1))((10, 5)) == 666
    assert row_major_offsets((128, 128))((10, 5)) == 1285
    assert padded_offsets((128, 128), 128, 1)((10, 5)) == 1285 + 10  # one element after each 128-element row
    for off in (row_major_offsets((64, 32)), swizzled_offsets((64, 32), 8, 2, 4, order=(0, 1))):
        assert sorted(off((r, n)) for r in range(64) for n in range(32)) == list(range(64 * 32))  # a bijection
    with pytest.raises(ValueError, match="fewer than max_phase"):
        swizzled_offsets((16, 16), 8, 1, 4)
    with pytest.raises(ValueError, match="per_phase: expected a power of two"):
        swizzled_offsets((64, 64), 4, 3, 4)
    with pytest.raises(ValueError, match=r"shape\[0\]: expected a power of two"):
        access(gl.BlockedLayout([1, 1], [32, 1], [1, 1], [0, 1]), (48, 1), lambda c: c[0])


def test_hand_counted_accesses():
    one_warp_rows = gl.BlockedLayout([1, 1], [32, 1], [1, 1], [0, 1])  # lane i holds row i
    one_warp_cols = gl.BlockedLayout([1, 1], [1, 32], [1, 1], [1, 0])  # lane i holds column i
    rows32 = row_major_offsets((32, 32))
    # a column of a row-major [32, 32] fp32 array: 32 words 128 B apart, all in one bank -> 32 wavefronts
    col = access(one_warp_rows, (32, 1), rows32)
    assert (col.vec, col.instructions, col.wavefronts, col.ideal, col.conflicts) == (1, 1, 32, 1, 31)
    row = access(one_warp_cols, (1, 32), rows32)
    assert (row.vec, row.instructions, row.wavefronts, row.conflicts) == (1, 1, 1, 0)
    # 4 consecutive fp32 per lane: one 16-byte access, served per quarter-warp (8 lanes x 16 B = 128 B each)
    vec4 = access(gl.BlockedLayout([1, 4], [1, 32], [1, 1], [1, 0]), (1, 128), row_major_offsets((1, 128)))
    assert (vec4.vec, vec4.instructions, vec4.wavefronts, vec4.ideal) == (4, 1, 4, 4)
    # every lane reading one word: a broadcast, one wavefront
    bcast = gl.DistributedLinearLayout(reg_bases=[], lane_bases=[[0, 0]] * 5, warp_bases=[], block_bases=[],
                                       shape=[1, 1])  # fmt: skip
    assert access(bcast, (1, 1), rows32).wavefronts == 1


def test_gate_up_epilogue_scratch():
    """The warp-specialised gate/up tile (128 weight rows x 128 pairs, fp32, 8 warps):

    - store from the wgmma layout (each thread: 2 adjacent columns of rows r and r + 8, lanes = 8 rows x 4 column
      pairs) to the row-major scratch: 8-byte vectors, 32 per thread; a half-warp (4 rows 512 B apart, 4 lanes x
      8 B each) puts 4 words in each of 8 banks -> 4 wavefronts per half, 8 per instruction, 32 x 8 x 8 warps = 2048;
    - loads of the two [64, 128] halves, one lane per row: each instruction reads 32 rows of one column, 512 B apart
      -> one bank, 32 wavefronts; 32 instructions per thread per half x 8 warps x 2 halves x 32 = 16384;
    - column-major with (vec 8, per_phase 2, max_phase 4): the 4 column pairs of a store land in 4 different 8-word
      groups (phase = column // 2), the 32 rows of a load are 32 consecutive words -> one wavefront per phase:
      512 (64 scalar stores x 8 warps) + 512."""
    table = {row["scratch"]: row for row in epilogue_table(128)}
    cur = table["row-major"]
    assert (cur["store"].vec, cur["store"].instructions, cur["store"].wavefronts) == (2, 32, 2048)
    assert [(a.vec, a.instructions, a.wavefronts) for a in cur["loads"]] == [(1, 32, 8192)] * 2
    assert (cur["wavefronts"], cur["ideal"]) == (18432, 1024)
    swz = table["column-major, swizzled (8, 2, 4)"]
    assert (swz["store"].vec, swz["store"].instructions, swz["store"].wavefronts) == (1, 64, 512)
    assert (swz["wavefronts"], swz["ideal"]) == (1024, 1024)
    # the tail's [128, 32] tile: a quarter of the same counts
    tail = {row["scratch"]: row["wavefronts"] for row in epilogue_table(32)}
    assert tail["row-major"] == 18432 // 4 and tail["column-major, swizzled (8, 2, 4)"] == 1024 // 4
    with pytest.raises(ValueError, match="kernel: expected"):
        epilogue_table(16, "triton")


def test_current_scratch_is_the_kernels():
    """The row the tables mark as the kernels' is the layout ``grouped_gluon._gate_up_store`` allocates."""
    from benchmarks.smem_banks import CURRENT, CURRENT_PARAMS, SCRATCHES
    from flint_moe.kernels.nvfp4.grouped_gluon import EPILOGUE_SCRATCH

    lay = EPILOGUE_SCRATCH.value if hasattr(EPILOGUE_SCRATCH, "value") else EPILOGUE_SCRATCH
    assert (lay.vec, lay.per_phase, lay.max_phase, list(lay.order)) == CURRENT_PARAMS
    assert CURRENT in SCRATCHES and CURRENT.endswith(str(tuple(CURRENT_PARAMS[:3])))
