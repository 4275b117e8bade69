"""The CuTe DSL down projections + combine of the decode block (flint_moe/kernels/cute/ll_down.py): its
specialisations' PTX audit is in test_cute_ptx.py; the down weights' addressing (the
functions the kernels trace) against the checkpoint, padded intermediate included; the spec's limits. Values
are not checked here: CuTe DSL has no CPU interpreter (GPU run pending)."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.cute.ll_down import DownSpec
from flint_moe.kernels.cute.ll_gate_up import scale_block_shape
from flint_moe.layouts import FlintMoEWeights
from tests.layouts._gen import nvfp4

from ._cute_check import assert_row_reads_checkpoint

BACKEND = "any"


def test_down_addressing_reads_the_checkpoint_with_a_padded_intermediate() -> None:
    """w2 [E, H, Ip/2] with I = 96 padded to Ip = 128: row h of expert e, blocks c < I/16 read back the
    checkpoint's w2[e, h] codes and w2_scale[e, h, c]; the kernel never reads blocks c >= I/16."""
    E, H, I = 2, 128, 96  # noqa: N806, E741
    w13, s13, w2, s2 = nvfp4(E, H, I, 11)
    w = FlintMoEWeights.from_modelopt(w13, s13, torch.ones(E), w2, s2, torch.ones(E), pad_intermediate_to=64)
    ip = w.intermediate_size
    assert ip == 128
    words = w.w2.reshape(-1).view(torch.int32)
    sf = w.w2_sf_swizzled.reshape(-1).view(torch.uint8)
    mp, kp = scale_block_shape(H, ip)
    assert (mp, kp) == (128, 8) and sf.numel() == E * mp * kp
    assert s2.shape == (E, H, I // 16)  # the blocks c < I/16 the check reads
    for e in range(E):
        for h in (0, 31, 32, 127):
            assert_row_reads_checkpoint(words, sf, e, h, H, ip, w2[e, h], s2[e, h])


def test_spec_limits() -> None:
    with pytest.raises(ValueError, match=r"inter 1544 must be a positive multiple of 16 with 1 <= splits \(1\)"):
        DownSpec(5120, 1544, 1536, 1536, 160, 8, 1, 1)
    with pytest.raises(ValueError, match=r"shared_inter 512 must be .* 1 <= splits \(33\) <= shared_inter / 16"):
        DownSpec(2048, 512, 512, 512, 256, 8, 1, 33)
    with pytest.raises(ValueError, match=r"inter 512 must be .* 1 <= splits \(0\) <= inter / 16"):
        DownSpec(2048, 512, 512, 512, 256, 8, 0, 1)
    DownSpec(4096, 1408, 1408, 1408, 128, 8, 3, 32)  # tails: 88 blocks in 3 splits of 30, 30, 28; 32 of 2 or 3
    with pytest.raises(ValueError, match=r"valid_inter 100 must be a multiple of 16 in \(0, 512\]"):
        DownSpec(2048, 512, 100, 512, 256, 8, 1, 1)
    with pytest.raises(ValueError, match=r"top_k 9 must be in \[1, min\(experts = 8, 16\)\]"):
        DownSpec(2048, 512, 512, 512, 8, 9, 1, 1)
