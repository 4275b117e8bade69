"""Poisoned padding decodes to the same logical tensors; bad input raises errors naming tensor and constraint."""

from __future__ import annotations

import pytest
import torch

from flint_moe.layouts import (
    FlintMoEWeights,
    swizzle_block_scales,
    to_trtllm_bf16,
    to_trtllm_deepseek_fp8,
    to_trtllm_mxfp8,
    to_trtllm_nvfp4,
)
from flint_moe.reference import layouts as R
from tests.layouts._gen import FP8, bf16, bits, gen, nvfp4, same, u8

POISON = [0x7F, 0xFF, 0x7E]  # E4M3 NaN, -NaN, 448


def _poison_swizzle(stored: torch.Tensor, rows: int, cols: int, byte: int) -> torch.Tensor:
    """Copy of swizzled storage [E, Mp, Kp] with every padding byte (rows >= rows or cols >= cols) = byte."""
    E, mp, kp = stored.shape
    real = torch.zeros(mp * kp, dtype=torch.bool)
    real[R.swizzle_offsets(rows, cols).reshape(-1)] = True
    out = bits(stored).clone().reshape(E, -1)
    out[:, ~real] = byte
    return out.view(E, mp, kp).view(stored.dtype)


def _poison_half_rows(t: torch.Tensor, inter: int, ip: int, phys_of_logical: torch.Tensor, byte: int):
    out = bits(t).clone()
    pad = torch.ones(out.shape[1], dtype=torch.bool)
    pad[phys_of_logical] = False
    out.view(torch.uint8).view(out.shape[0], out.shape[1], -1)[:, pad] = byte
    return out.view(t.dtype)


@pytest.mark.parametrize("byte", POISON)
def test_poisoned_padding_cutedsl(byte):
    E, H, I = 2, 2880, 176  # H/16 = 180 scale columns, 2Ip = 384 rows, w2 K padded 176 -> 192
    w13, s13, w2, s2 = nvfp4(E, H, I, byte)
    gs = torch.rand(E)
    W = FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs, pad_intermediate_to=64)
    ip = W.intermediate_size
    phys = R.cutedsl_w13_phys_rows(I, ip)
    w1 = _poison_half_rows(W.w1, I, ip, phys, byte)
    sf1 = R.unswizzle_scales(W.w1_sf_swizzled, 2 * ip, H // 16)  # poison rows of the padded halves too
    sf1[:, [r for r in range(2 * ip) if r not in set(phys.tolist())]] = torch.tensor(
        byte, dtype=torch.uint8
    ).view(FP8)
    swz1 = swizzle_block_scales(sf1, fill=byte)
    w2p = bits(W.w2).clone()
    w2p[..., I // 2 :] = byte
    sf2 = R.unswizzle_scales(W.w2_sf_swizzled, H, ip // 16)
    sf2.view(torch.uint8)[..., I // 16 :] = byte
    swz2 = swizzle_block_scales(sf2, fill=byte)
    for a in (swz1, swz2):
        assert int((bits(a) == byte).sum()) > 0
    x = R.decode_cutedsl_w4a16(w1, swz1, W.w1_alpha, w2p, swz2, W.w2_alpha, intermediate=I)
    assert same(x.w13, w13) and same(x.w13_scale, s13) and same(x.w2, w2) and same(x.w2_scale, s2)
    # via the MMA view of poisoned storage as well
    from flint_moe.layouts import mma_view

    x = R.decode_cutedsl_w4a16(
        w1, mma_view(swz1), W.w1_alpha, w2p, mma_view(swz2), W.w2_alpha, intermediate=I
    )
    assert same(x.w13_scale, s13) and same(x.w2_scale, s2)


@pytest.mark.parametrize("byte", POISON)
def test_poisoned_padding_trtllm_nvfp4_and_bf16(byte):
    E, H, I = 2, 2880, 176
    w13, s13, w2, s2 = nvfp4(E, H, I, 3 + byte)
    g1, g1s, g2, g2s = to_trtllm_nvfp4(w13, s13, w2, s2, pad_intermediate_to=64)
    ip = g2.shape[2] * 2
    phys = R.trtllm_gated_w13_phys_rows(I, ip)
    p1 = _poison_half_rows(g1, I, ip, phys, byte)
    p1s = _poison_swizzle(g1s, 2 * ip, H // 16, byte)  # only the swizzle padding (rows 384.., cols 180..)
    p2 = bits(g2).clone()
    p2[..., I // 2 :] = byte
    p2s = _poison_swizzle(g2s, H, I // 16, byte)  # also the intermediate padding columns
    gs = torch.rand(E)
    x = R.decode_trtllm_nvfp4(p1, p1s, gs, p2, p2s, gs, intermediate=I)
    assert same(x.w13, w13) and same(x.w13_scale, s13) and same(x.w2, w2) and same(x.w2_scale, s2)
    b13, b2 = bf16(E, 128, 176, byte)
    from flint_moe.layouts import pad_intermediate_bf16

    a13, a2, ipb = pad_intermediate_bf16(b13, b2, 128)
    c1, c2 = to_trtllm_bf16(a13, a2)
    w13p = c1.permute(0, 2, 1, 3)  # [E, 2Ip, H/64, 64] view of the storage
    pad_rows = torch.ones(2 * ipb, dtype=torch.bool)
    pad_rows[R.trtllm_gated_w13_phys_rows(176, ipb)] = False
    w13p.view(torch.int16)[:, pad_rows] = torch.tensor((byte << 8) | byte, dtype=torch.int32).to(torch.int16)
    c2.view(torch.int16)[:, 176 // 64 :, :, 176 % 64 :] = 0x7FFF  # bf16 NaN in the K padding of w2
    c2.view(torch.int16)[:, 3:] = 0x7FFF
    x = R.decode_trtllm_bf16(c1, c2, intermediate=176)
    assert same(x.w13, b13) and same(x.w2, b2)


# ------------------------------------------------------------------------------------------------ errors


def _ok():
    w13, s13, w2, s2 = nvfp4(2, 128, 64, 0)
    return dict(
        w13=w13, w13_scale=s13, w13_scale_2=torch.ones(2), w2=w2, w2_scale=s2, w2_scale_2=torch.ones(2)
    )


@pytest.mark.parametrize(
    "change,exc,match",
    [
        (dict(w13=torch.zeros(2, 128, 64, dtype=torch.int8)), TypeError, "w13: dtype must be torch.uint8"),
        (dict(w13_scale=torch.zeros(2, 128, 8, dtype=torch.float16)), TypeError, "w13_scale: dtype"),
        (
            dict(w13_scale=torch.zeros(2, 128, 7, dtype=torch.uint8)),
            ValueError,
            "w13_scale: dimension 2 must be 8",
        ),
        (dict(w2=torch.zeros(2, 128, 16, dtype=torch.uint8)), ValueError, "w2: dimension 2 must be 32"),
        (
            dict(w13_scale_2=torch.ones(2, dtype=torch.float16)),
            TypeError,
            "w13_scale_2: dtype must be torch.float32",
        ),
        (
            dict(w13_scale_2=torch.tensor([[1.0, 1.0], [1.0, 2.0]])),
            ValueError,
            r"gate and up global scales differ for experts \[1\]",
        ),
        (
            dict(w13_scale_2=(torch.ones(2), torch.tensor([1.0, 0.5]))),
            ValueError,
            "gate and up global scales differ",
        ),
        (
            dict(w13_scale_2=torch.tensor([1.0, float("nan")])),
            ValueError,
            "w13_scale_2: global scales must be finite",
        ),
        (dict(w2_scale_2=torch.ones(3)), ValueError, "w2_scale_2: dimension 0 must be 2"),
    ],
)
def test_from_modelopt_rejects(change, exc, match):
    kw = _ok()
    kw.update(change)
    with pytest.raises(exc, match=match):
        FlintMoEWeights.from_modelopt(**kw)


@pytest.mark.parametrize("byte", [0x7F, 0xFF])
def test_from_modelopt_rejects_nan_scale_bytes(byte):
    kw = _ok()
    s = bits(kw["w2_scale"]).clone()
    s[1, 5, 2] = byte
    kw["w2_scale"] = s
    with pytest.raises(ValueError, match=r"w2_scale: contains E4M3 NaN scale bytes .* \(1, 5, 2\)"):
        FlintMoEWeights.from_modelopt(**kw)


def test_from_modelopt_needs_padding_for_unaligned_intermediate():
    w13, s13, w2, s2 = nvfp4(1, 128, 176, 0)
    with pytest.raises(ValueError, match="I = 176 must be a multiple of 64.*pad_intermediate_to=64"):
        FlintMoEWeights.from_modelopt(w13, s13, torch.ones(1), w2, s2, torch.ones(1))
    with pytest.raises(ValueError, match="pad_intermediate_to: 48 must be a positive multiple of 64"):
        FlintMoEWeights.from_modelopt(w13, s13, torch.ones(1), w2, s2, torch.ones(1), pad_intermediate_to=48)
    with pytest.raises(ValueError, match="inplace: not supported together with intermediate padding"):
        FlintMoEWeights.from_modelopt(w13, s13, torch.ones(1), w2, s2, torch.ones(1), pad_intermediate_to=64,
                                      inplace=True)  # fmt: skip


def test_other_converters_reject():
    b13, b2 = bf16(1, 128, 96, 0)
    with pytest.raises(ValueError, match="w2: intermediate size I = 96 must be a multiple of 64"):
        to_trtllm_bf16(b13, b2)
    with pytest.raises(TypeError, match="w13: dtype must be torch.bfloat16"):
        to_trtllm_bf16(b13.float(), b2)
    with pytest.raises(ValueError, match="w2: dimension 2 must be 96"):
        to_trtllm_bf16(b13, b2[..., :64])
    w13, s13, w2, s2 = nvfp4(1, 48, 64, 0)
    with pytest.raises(ValueError, match="w13: hidden size H = 48 must be a multiple of 32"):
        to_trtllm_nvfp4(w13, s13, w2, s2)
    g = gen(0)
    f13, f2 = u8((1, 256, 128), g, 0x7F).view(FP8), u8((1, 128, 128), g, 0x7F).view(FP8)
    with pytest.raises(ValueError, match="w13_scale: dimension 1 must be 2"):
        to_trtllm_deepseek_fp8(f13, torch.ones(1, 1, 1), f2, torch.ones(1, 1, 1))
    with pytest.raises(TypeError, match="w13_scale: dtype must be torch.uint8"):
        to_trtllm_mxfp8(f13, torch.ones(1, 256, 4), f2, torch.zeros(1, 128, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="scale: row map entries must lie in"):
        swizzle_block_scales(torch.zeros(1, 4, 4, dtype=torch.uint8), rows=torch.tensor([0, 9]))


def test_decoders_reject():
    with pytest.raises(ValueError, match="intermediate: logical intermediate 300 must be in"):
        R.decode_trtllm_bf16(torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16),
                             torch.zeros(1, 2, 128, 64, dtype=torch.bfloat16), intermediate=300)  # fmt: skip
    with pytest.raises(ValueError, match="w1_sf: MMA view shape"):
        R.unswizzle_scales(torch.zeros(32, 4, 1, 4, 1, 1, dtype=torch.uint8), 256, 4, name="w1_sf")
    with pytest.raises(ValueError, match="g1_scale: 512 bytes per expert"):
        R.unswizzle_scales(torch.zeros(1, 512, dtype=torch.uint8), 256, 4, name="g1_scale")
