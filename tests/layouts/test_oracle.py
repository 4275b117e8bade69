"""Production layouts == FlashInfer 0.7.4's own (CPU-capable) functions, bit for bit.

FlashInfer is used only here, as an oracle. ``block_scale_interleave`` needs CUDA, so the 128x4 swizzle is
checked against its formula, vLLM's reshape/permute, and FlashInfer's CPU helpers
``fused_moe.prepare._swizzle_cutile_fp4_scales`` / ``trace.templates.gemm._unswizzle_batched_sf_128x4``.
"""

from __future__ import annotations

import pytest
import torch

from flint_moe.layouts import (
    FlintMoEWeights,
    mma_view,
    rows as L,
    swizzle_block_scales,
    to_trtllm_bf16,
    to_trtllm_deepseek_fp8,
    to_trtllm_fp8_per_tensor,
    to_trtllm_mxfp8,
    to_trtllm_nvfp4,
)
from tests.layouts._gen import FP8, bf16, bits, gen, nvfp4, same, u8

fi = pytest.importorskip("flashinfer")
pytestmark = pytest.mark.oracle

from flashinfer.cute_dsl.utils import convert_sf_to_mma_layout  # noqa: E402
from flashinfer.fused_moe.core import (  # noqa: E402
    _maybe_get_cached_w3_w1_permute_indices,
    convert_to_block_layout,
    get_reorder_rows_for_gated_act_gemm_row_indices,
    get_w2_permute_indices_with_cache,
    reorder_rows_for_gated_act_gemm,
)
from flashinfer.fused_moe.prepare import (  # noqa: E402
    _swizzle_cutile_fp4_scales,
    interleave_cute_dsl_moe_weights,
    prepare_trtllm_bf16_weights,
)
from flashinfer.trace.templates.gemm import _unswizzle_batched_sf_128x4  # noqa: E402
from flashinfer.utils import get_shuffle_matrix_a_row_indices  # noqa: E402


def test_flashinfer_version():
    assert fi.__version__ == "0.7.4"


def _w31(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[1] // 2
    return torch.cat([t[:, half:], t[:, :half]], dim=1)


@pytest.mark.parametrize("m", [32, 128, 352, 1408, 4096, 5760])
@pytest.mark.parametrize("tile", [128, 64])
def test_shuffle_indices(m, tile):
    ref = get_shuffle_matrix_a_row_indices(torch.empty(m, 4, dtype=torch.uint8), tile)
    assert torch.equal(L.shuffle_rows(m, tile), ref)


@pytest.mark.parametrize("m", [2, 64, 352, 5760])
def test_gated_reorder(m):
    x = torch.empty(m, 3, dtype=torch.uint8)
    assert torch.equal(L.gated_reorder_rows(m), get_reorder_rows_for_gated_act_gemm_row_indices(x))
    x = torch.arange(m * 3, dtype=torch.int32).view(m, 3)
    assert torch.equal(x[L.gated_reorder_rows(m)], reorder_rows_for_gated_act_gemm(x))


@pytest.mark.parametrize("inter", [64, 176, 704, 1856, 2048, 2880])
def test_w3_w1_and_w2_permute_indices(inter):
    g = torch.arange(2 * inter)  # logical [gate; up] row ids
    for sf in (None, 16):
        if sf is not None and (2 * inter) % 128:
            continue
        p = _maybe_get_cached_w3_w1_permute_indices(
            {}, torch.empty(2 * inter, 8, dtype=torch.uint8), 128, num_elts_per_sf=sf, is_gated_act_gemm=True
        )
        # FlashInfer permutes [up; gate]; ours maps physical rows to [gate; up] rows
        assert torch.equal(_w31(g[None])[0][p], L.w13_rows_trtllm_gated(inter))
        # vLLM's rotation-by-half on [gate; up] gives the same map
        assert torch.equal((p + inter) % (2 * inter), L.w13_rows_trtllm_gated(inter))
    for h in (2048, 2880, 7168):
        p2 = get_w2_permute_indices_with_cache({}, torch.empty(h, 8, dtype=torch.uint8), 128)
        assert torch.equal(p2, L.shuffle_rows(h, 128))


@pytest.mark.parametrize("E,H,I", [(3, 128, 64), (2, 2048, 768), (1, 2880, 2880)])
def test_trtllm_bf16_block_major_k(E, H, I):
    w13, w2 = bf16(E, H, I, E + H + I)
    ref = prepare_trtllm_bf16_weights(_w31(w13), w2, num_local_experts=E, hidden_size=H, intermediate_size=I,
                                      permute_cache={})  # fmt: skip
    g1, g2 = to_trtllm_bf16(w13, w2)
    assert same(g1, ref["gemm1_weights"].view(E, H // 64, 2 * I, 64))
    assert same(g2, ref["gemm2_weights"].view(E, I // 64, H, 64))
    # convert_to_block_layout on one expert's permuted uint8 view
    p = _maybe_get_cached_w3_w1_permute_indices({}, _w31(w13)[0].view(torch.uint8), 128)
    blk = convert_to_block_layout(_w31(w13)[0].view(torch.uint8)[p].contiguous(), 128)
    assert torch.equal(blk, g1[0].view(torch.uint8).view(H // 64, 2 * I, 128))
    # in place gives the same bytes
    c13, c2 = w13.clone(), w2.clone()
    i1, i2 = to_trtllm_bf16(c13, c2, inplace=True, scratch_bytes=1)
    assert same(i1, g1) and same(i2, g2)


def _vllm_swizzle(s: torch.Tensor) -> torch.Tensor:
    """vLLM ``swizzle_blockscale`` as a reshape/permute (written here as the oracle)."""
    E, M, K = s.shape
    mp, kp = (M + 127) // 128 * 128, (K + 3) // 4 * 4
    p = torch.zeros(E, mp, kp, dtype=torch.uint8)
    p[:, :M, :K] = s.view(torch.uint8)
    return (
        p.reshape(E, mp // 128, 4, 32, kp // 4, 4).permute(0, 1, 4, 3, 2, 5).contiguous().reshape(E, mp, kp)
    )


def _formula_swizzle(s: torch.Tensor) -> torch.Tensor:
    E, M, K = s.shape
    mp, kp = (M + 127) // 128 * 128, (K + 3) // 4 * 4
    out = torch.zeros(E * mp * kp, dtype=torch.uint8)
    src = s.view(torch.uint8)
    for e in range(E):
        for r in range(M):
            for c in range(K):
                off = (
                    e * mp * kp
                    + (r // 128) * (kp // 4) * 512
                    + (c // 4) * 512
                    + (r % 32) * 16
                    + ((r % 128) // 32) * 4
                    + c % 4
                )
                out[off] = src[e, r, c]
    return out.view(E, mp, kp)


@pytest.mark.parametrize("E,M,K", [(2, 128, 4), (2, 200, 7), (1, 300, 13), (3, 256, 448)])
def test_swizzle_formula_vllm_and_flashinfer(E, M, K):
    s = u8((E, M, K), gen(M * K), 0x7F).view(FP8)
    out = swizzle_block_scales(s).view(torch.uint8)
    assert torch.equal(out, _vllm_swizzle(s))
    assert torch.equal(
        out.reshape(-1), _swizzle_cutile_fp4_scales(s.view(torch.uint8), scale_block_size=16).reshape(-1)
    )
    assert torch.equal(_unswizzle_batched_sf_128x4(out, E, M, K), s.view(torch.uint8))
    if M * K <= 2100:
        assert torch.equal(out, _formula_swizzle(s))


@pytest.mark.parametrize("E,Mp,Kp", [(3, 256, 8), (2, 384, 180)])
def test_mma_view(E, Mp, Kp):
    swz = u8((E, Mp, Kp), gen(Kp)).view(FP8)
    ref = convert_sf_to_mma_layout(swz.reshape(E * Mp, Kp), m=Mp, k=Kp * 16, num_groups=E, sf_vec_size=16)
    v = mma_view(swz)
    assert (
        v.shape == ref.shape
        and v.stride() == ref.stride()
        and v.data_ptr() == ref.data_ptr() == swz.data_ptr()
    )
    assert torch.equal(bits(v), bits(ref))


@pytest.mark.parametrize("E,H,I", [(2, 256, 128), (2, 2048, 704), (1, 7168, 2048), (3, 2880, 1856)])
def test_cutedsl_interleave_vs_flashinfer_prepare(E, H, I):
    w13, s13, w2, s2 = nvfp4(E, H, I, H + I)
    gs = torch.rand(E)
    W = FlintMoEWeights.from_modelopt(w13, s13, gs, w2, s2, gs)
    fw, fs = interleave_cute_dsl_moe_weights(_w31(w13), _w31(s13), swap_ab=False)
    assert torch.equal(W.w1, fw)
    fsw = _swizzle_cutile_fp4_scales(fs.view(torch.uint8), scale_block_size=16).reshape(
        W.w1_sf_swizzled.shape
    )
    assert torch.equal(bits(W.w1_sf_swizzled), fsw)
    f2 = _swizzle_cutile_fp4_scales(s2.view(torch.uint8), scale_block_size=16).reshape(W.w2_sf_swizzled.shape)
    assert torch.equal(bits(W.w2_sf_swizzled), f2) and torch.equal(W.w2, w2)
    ref_view = convert_sf_to_mma_layout(W.w1_sf_swizzled.reshape(-1, W.w1_sf_swizzled.shape[2]), m=2 * I, k=H,
                                        num_groups=E)  # fmt: skip
    assert W.w1_sf.stride() == ref_view.stride() and torch.equal(bits(W.w1_sf), bits(ref_view))


@pytest.mark.parametrize("E,H,I", [(2, 256, 128), (2, 2048, 704), (1, 2688, 1408)])
def test_trtllm_nvfp4_vs_flashinfer_permutes(E, H, I):
    w13, s13, w2, s2 = nvfp4(E, H, I, 7 * H + I)
    g1, g1s, g2, g2s = to_trtllm_nvfp4(w13, s13, w2, s2)
    u13, us13 = _w31(w13), _w31(s13).view(torch.uint8)
    pw = _maybe_get_cached_w3_w1_permute_indices({}, u13[0], 128)
    ps = _maybe_get_cached_w3_w1_permute_indices({}, us13[0], 128, num_elts_per_sf=16)
    p2 = get_w2_permute_indices_with_cache({}, w2[0], 128)
    p2s = get_w2_permute_indices_with_cache({}, s2[0].view(torch.uint8), 128, num_elts_per_sf=16)
    assert torch.equal(g1, u13[:, pw]) and torch.equal(g2, w2[:, p2])
    assert g1s.shape == (E, 2 * I, H // 16) and g2s.shape == (E, H, I // 16)  # FlashInfer's shapes
    assert torch.equal(bits(g1s), _vllm_swizzle(us13[:, ps].view(FP8)))
    assert torch.equal(bits(g2s), _vllm_swizzle(s2[:, p2s]))


def test_fp8_per_tensor_vs_flashinfer():
    E, H, I = 2, 256, 192
    g = gen(1)
    w13, w2 = u8((E, 2 * I, H), g, 0x7F).view(FP8), u8((E, H, I), g, 0x7F).view(FP8)
    a, b = to_trtllm_fp8_per_tensor(w13, w2)
    for e in range(E):
        ref1 = fi.shuffle_matrix_a(reorder_rows_for_gated_act_gemm(_w31(w13)[e]).view(torch.uint8), 128)
        assert torch.equal(bits(a[e]), ref1)
        assert torch.equal(bits(b[e]), fi.shuffle_matrix_a(w2[e].view(torch.uint8), 128))


def test_deepseek_fp8_vs_flashinfer():
    E, H, I = 2, 512, 256
    g = gen(2)
    w13, w2 = u8((E, 2 * I, H), g, 0x7F).view(FP8), u8((E, H, I), g, 0x7F).view(FP8)
    s13, s2 = torch.rand(E, 2 * I // 128, H // 128), torch.rand(E, H // 128, I // 128)
    g1, g1s, g2, g2s = to_trtllm_deepseek_fp8(w13, s13, w2, s2)
    for e in range(E):
        x = _w31(w13)[e].view(torch.uint8)
        r = get_shuffle_matrix_a_row_indices(x, 64)
        assert torch.equal(bits(g1[e]), convert_to_block_layout(x[r].contiguous(), 128))
        y = w2[e].view(torch.uint8)
        assert torch.equal(
            bits(g2[e]), convert_to_block_layout(y[get_shuffle_matrix_a_row_indices(y, 64)].contiguous(), 128)
        )
    assert torch.equal(g1s, _w31(s13)) and torch.equal(g2s, s2)


def test_mxfp8_vs_flashinfer_permutes():
    E, H, I = 2, 224, 96  # padded to Hp = 256, Ip = 128
    g = gen(3)
    w13, w2 = u8((E, 2 * I, H), g, 0x7F).view(FP8), u8((E, H, I), g, 0x7F).view(FP8)
    s13, s2 = u8((E, 2 * I, H // 32), g), u8((E, H, I // 32), g)
    g1, g1s, g2, g2s, ip, hp = to_trtllm_mxfp8(w13, s13, w2, s2)
    assert (ip, hp) == (128, 256)
    # vLLM's padding (weights 0, scales 127, each half on its own), then [up; gate], then FlashInfer's permutes
    pw13 = torch.zeros(E, 2 * ip, hp, dtype=torch.uint8)
    pw13[:, :I, :H], pw13[:, ip : ip + I, :H] = w13[:, :I].view(torch.uint8), w13[:, I:].view(torch.uint8)
    ps13 = torch.full((E, 2 * ip, hp // 32), 127, dtype=torch.uint8)
    ps13[:, :I, : H // 32], ps13[:, ip : ip + I, : H // 32] = s13[:, :I], s13[:, I:]
    pw2 = torch.zeros(E, hp, ip, dtype=torch.uint8)
    pw2[:, :H, :I] = w2.view(torch.uint8)
    ps2 = torch.full((E, hp, ip // 32), 127, dtype=torch.uint8)
    ps2[:, :H, : I // 32] = s2
    u13, us13 = _w31(pw13), _w31(ps13)
    p = _maybe_get_cached_w3_w1_permute_indices({}, u13[0], 128)
    psf = _maybe_get_cached_w3_w1_permute_indices({}, us13[0], 128, num_elts_per_sf=32)
    p2 = get_w2_permute_indices_with_cache({}, pw2[0], 128)
    assert torch.equal(bits(g1), u13[:, p]) and torch.equal(bits(g2), pw2[:, p2])
    assert torch.equal(g1s, _vllm_swizzle(us13[:, psf])) and torch.equal(g2s, _vllm_swizzle(ps2[:, p2]))
