"""Round trips logical -> production layout -> independent decoder -> logical, bit for bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from flint_moe.layouts import (
    FlintMoEWeights,
    pad_intermediate_bf16,
    pad_intermediate_nvfp4,
    to_trtllm_bf16,
    to_trtllm_deepseek_fp8,
    to_trtllm_fp8_per_tensor,
    to_trtllm_mxfp8,
    to_trtllm_nvfp4,
    trtllm_bf16_row_maps,
)
from flint_moe.reference import layouts as R
from tests.layouts._gen import FP8, bf16, bits, gen, nvfp4, same, u8

HS = [2048, 2688, 2880, 7168]
IS = [176, 704, 1408, 1856, 2048, 2880]
ES = [8, 160, 384]
BUDGET = 4 << 20  # bytes of w13 codes per example: big E only with small H * I


def _experts(E: int, H: int, I: int, per_elem_bytes: float) -> int:
    """E itself if it fits the byte budget, else the largest count that does (at least 1)."""
    per = 2 * I * H * per_elem_bytes
    return max(1, min(E, int(BUDGET // per)))


shapes = st.tuples(st.sampled_from(ES), st.sampled_from(HS), st.sampled_from(IS), st.integers(0, 2**31 - 1))
SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _nvfp4_check(E, H, I, seed):
    w13, s13, w2, s2 = nvfp4(E, H, I, seed)
    g = gen(seed + 1)
    gs = torch.rand(E, generator=g)
    gs2 = torch.rand(E, generator=g)
    pad = None if I % 64 == 0 else 64
    W = FlintMoEWeights.from_modelopt(w13, s13, (gs, gs.clone()), w2, s2, gs2, pad_intermediate_to=pad)
    assert W.valid_intermediate == I and W.intermediate_size % 64 == 0
    for x in (R.experts_from_cutedsl(W),
              R.decode_cutedsl_w4a16(W.w1, W.w1_sf_swizzled, W.w1_alpha, W.w2, W.w2_sf_swizzled, W.w2_alpha,
                                     intermediate=I)):  # fmt: skip
        assert same(x.w13, w13) and same(x.w13_scale, s13) and same(x.w2, w2) and same(x.w2_scale, s2)
        assert same(x.w13_gs, gs) and same(x.w2_gs, gs2)
    t = to_trtllm_nvfp4(w13, s13, w2, s2, pad_intermediate_to=pad)
    x = R.decode_trtllm_nvfp4(t[0], t[1], gs, t[2], t[3], gs2, intermediate=I)
    assert same(x.w13, w13) and same(x.w13_scale, s13) and same(x.w2, w2) and same(x.w2_scale, s2)


@SETTINGS
@given(shapes)
def test_nvfp4_roundtrip(shape):
    E, H, I, seed = shape
    _nvfp4_check(_experts(E, H, I, 0.5625), H, I, seed)


@pytest.mark.parametrize(
    "H,I", [(2048, 176), (2688, 704), (2880, 1856), (7168, 2048), (2048, 2880), (2688, 1408)]
)
def test_nvfp4_roundtrip_every_size(H, I):
    _nvfp4_check(1, H, I, H + I)


@pytest.mark.parametrize("E", ES)
def test_nvfp4_roundtrip_many_experts(E):
    _nvfp4_check(E, 256, 176, E)


def _bf16_check(E, H, I, seed, inplace):
    w13, w2 = bf16(E, H, I, seed)
    a13, a2, ip = pad_intermediate_bf16(w13, w2, 128) if I % 128 else (w13.clone(), w2.clone(), I)
    g1, g2 = to_trtllm_bf16(a13, a2, inplace=inplace, scratch_bytes=1)
    assert g1.shape == (E, H // 64, 2 * ip, 64) and g2.shape == (E, ip // 64, H, 64)
    if inplace:
        assert g1.data_ptr() == a13.data_ptr() and g2.data_ptr() == a2.data_ptr()
    x = R.decode_trtllm_bf16(g1, g2, intermediate=I)
    assert same(x.w13, w13) and same(x.w2, w2)
    # decode-kernel row maps: logical row l of w13 / h of w2 is physical row map[l]
    m13, m2 = trtllm_bf16_row_maps(H, ip)
    assert m13.dtype == torch.int32 and m2.dtype == torch.int32
    w13p = g1.permute(0, 2, 1, 3).reshape(E, 2 * ip, H)
    assert same(w13p[:, m13[:I].long()], w13[:, :I]) and same(w13p[:, m13[ip : ip + I].long()], w13[:, I:])
    assert same(g2.permute(0, 2, 1, 3).reshape(E, H, ip)[:, m2.long(), :I], w2)


@SETTINGS
@given(shapes, st.booleans())
def test_bf16_roundtrip(shape, inplace):
    E, H, I, seed = shape
    _bf16_check(_experts(E, H, I, 2.0), H, I, seed, inplace)


@pytest.mark.parametrize("H,I", [(2048, 768), (2880, 2880), (7168, 176)])
def test_bf16_roundtrip_sizes(H, I):
    _bf16_check(2, H, I, H * I, inplace=True)


def test_bf16_many_experts_grouped_scratch():
    _bf16_check(160, 64, 64, 5, inplace=True)


@SETTINGS
@given(shapes)
def test_fp8_layouts_roundtrip(shape):
    E, H, I, seed = shape
    E = _experts(E, H, I, 1.0)
    g = gen(seed)
    w13 = u8((E, 2 * I, H), g, 0x7F).view(FP8)
    w2 = u8((E, H, I), g, 0x7F).view(FP8)
    if I % 16 == 0 and H % 32 == 0:
        a, b = to_trtllm_fp8_per_tensor(w13, w2)
        x13, x2 = R.decode_trtllm_fp8_per_tensor(a, b)
        assert same(x13, w13) and same(x2, w2)
    s13 = u8((E, 2 * I, H // 32), g)
    s2 = u8((E, H, I // 32), g)
    if I % 32:  # no MXFP8 checkpoint has a partial 32-element block
        with pytest.raises(ValueError, match="multiples of 32"):
            to_trtllm_mxfp8(w13, s13, w2, s2)
        return
    out = to_trtllm_mxfp8(w13, s13, w2, s2)
    ip, hp = out[4], out[5]
    assert ip % 128 == 0 and hp % 256 == 0 and out[1].shape == (E, 2 * ip, hp // 32)
    x = R.decode_trtllm_mxfp8(*out[:4], hidden=H, intermediate=I)
    assert same(x[0], w13) and same(x[1], s13) and same(x[2], w2) and same(x[3], s2)


@pytest.mark.parametrize("E,H,I", [(3, 2048, 2048), (2, 7168, 256), (8, 256, 1408 - 1408 % 128)])
def test_deepseek_fp8_roundtrip(E, H, I):
    g = gen(E * H + I)
    w13 = u8((E, 2 * I, H), g, 0x7F).view(FP8)
    w2 = u8((E, H, I), g, 0x7F).view(FP8)
    s13 = torch.rand(E, 2 * I // 128, H // 128, generator=g)
    s2 = torch.rand(E, H // 128, I // 128, generator=g)
    out = to_trtllm_deepseek_fp8(w13, s13, w2, s2)
    assert out[0].shape == (E, H // 128, 2 * I, 128) and out[2].shape == (E, I // 128, H, 128)
    x = R.decode_trtllm_deepseek_fp8(*out)
    assert same(x[0], w13) and same(x[1], s13) and same(x[2], w2) and same(x[3], s2)


def test_padding_is_per_half_and_zero():
    w13, s13, w2, s2 = nvfp4(2, 64, 176, 3)
    p13, ps13, p2, ps2, ip = pad_intermediate_nvfp4(w13, s13, w2, s2, 128)
    assert ip == 256
    assert torch.equal(p13[:, :176], w13[:, :176]) and torch.equal(p13[:, 256:432], w13[:, 176:])
    assert int(p13[:, 176:256].count_nonzero()) == 0 and int(p13[:, 432:].count_nonzero()) == 0
    assert int(bits(ps13[:, 176:256]).count_nonzero()) == 0 and int(bits(ps2[..., 11:]).count_nonzero()) == 0
    assert torch.equal(p2[..., :88], w2) and int(p2[..., 88:].count_nonzero()) == 0


def test_inplace_from_modelopt_matches_out_of_place():
    w13, s13, w2, s2 = nvfp4(5, 128, 128, 9)
    gs = torch.rand(5)
    ref = FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs)
    w13c = w13.clone()
    W = FlintMoEWeights.from_modelopt(w13c, s13, gs, w2, s2, gs, inplace=True, scratch_bytes=1)
    assert W.w1.data_ptr() == w13c.data_ptr() and torch.equal(W.w1, ref.w1)
    assert same(W.w1_sf_swizzled, ref.w1_sf_swizzled) and same(W.w2_sf_swizzled, ref.w2_sf_swizzled)


def test_out_of_place_never_modifies_or_aliases_inputs():
    w13, s13, w2, s2 = nvfp4(2, 128, 128, 11)
    snap = [t.clone() for t in (w13, s13, w2, s2)]
    gs = torch.rand(2)
    W = FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs)
    for a, b in zip((w13, s13, w2, s2), snap, strict=True):
        assert same(a, b)
    assert W.w2.data_ptr() != w2.data_ptr() and W.w1_alpha.data_ptr() != gs.data_ptr()
    b13, b2 = bf16(2, 128, 128, 1)
    c13, c2 = b13.clone(), b2.clone()
    to_trtllm_bf16(b13, b2)
    assert same(b13, c13) and same(b2, c2)
