"""The CuTe DSL down projections + combine of the decode block (flint_moe/kernels/cute/ll_down.py): its
specialisations compiled for sm_90a on the CPU and their PTX audited; the down weights' addressing (the
functions the kernels trace) against the checkpoint, padded intermediate included; the spec's limits. Values
are not checked here: CuTe DSL has no CPU interpreter (GPU run pending)."""

from __future__ import annotations

import pytest
import torch

from flint_moe.kernels.cute.ll_down import AUDIT_SPECS, DownSpec, audit_down
from flint_moe.kernels.cute.ll_gate_up import (
    codes_row_word,
    cute_available,
    scale_block_byte,
    scale_block_shape,
    scale_row_byte,
)
from flint_moe.layouts import FlintMoEWeights
from tests.layouts._gen import nvfp4

BACKEND = "any"

needs_cute = pytest.mark.skipif(not cute_available()[0], reason="the cute extra (nvidia-cutlass-dsl) is not installed")


@needs_cute
@pytest.mark.parametrize("name", sorted(AUDIT_SPECS))
def test_sm90_ptx_has_the_pinned_instructions(name: str) -> None:
    assert audit_down(AUDIT_SPECS[name]) == []


@needs_cute
def test_tap_build_ptx() -> None:
    assert audit_down(AUDIT_SPECS["ling.S1"], tap=True) == []


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
    for e in range(E):
        for h in (0, 31, 32, 127):
            base = codes_row_word(e, h, H, ip)
            for blk in range(I // 16):
                assert int(sf[scale_row_byte(e, h, mp, kp) + scale_block_byte(blk)]) == int(
                    s2[e, h, blk].view(torch.uint8)
                )
                for half in range(2):
                    word = int(words[base + 2 * blk + half]) & 0xFFFFFFFF
                    for n in range(8):
                        i = 16 * blk + 8 * half + n
                        assert (word >> (4 * n)) & 15 == (int(w2[e, h, i // 2]) >> (4 * (i % 2))) & 15


def test_spec_limits() -> None:
    with pytest.raises(ValueError, match=r"inter 1536 must be a positive multiple of 16 \* 32 \* splits \(1024\)"):
        DownSpec(5120, 1536, 1536, 1536, 160, 8, 2, 3)
    with pytest.raises(ValueError, match=r"shared_inter 512 must be a positive multiple .* \(1024\)"):
        DownSpec(2048, 512, 512, 512, 256, 8, 1, 2)
    with pytest.raises(ValueError, match=r"valid_inter 100 must be a multiple of 16 in \(0, 512\]"):
        DownSpec(2048, 512, 100, 512, 256, 8, 1, 1)
    with pytest.raises(ValueError, match=r"top_k 9 must be in \[1, min\(experts = 8, 16\)\]"):
        DownSpec(2048, 512, 512, 512, 8, 9, 1, 1)
