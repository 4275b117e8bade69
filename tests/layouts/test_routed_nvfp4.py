"""Per-token NVFP4 grouped-GEMM layout (flint_moe/layouts/routed_nvfp4.py) against the golden model's
independent decoder (flint_moe/reference/layouts.decode_routed_nvfp4): round trips, hand-placed rows, zero
padding, the MMA view, refresh in place, errors."""

from __future__ import annotations

import pytest
import torch

from flint_moe.layouts.routed_nvfp4 import RoutedNVFP4Weights, to_routed_nvfp4
from flint_moe.reference.layouts import cutedsl_w13_phys_rows, decode_routed_nvfp4, swizzle_offsets
from flint_moe.reference.pertoken_experts import PerTokenNVFP4Experts


def _stacks(e: int, h: int, i: int, gated: bool, seed: int = 0) -> PerTokenNVFP4Experts:
    """Random codes, random non-NaN scale bytes (0x00..0x7E and 0x80..0xFE), random positive alphas."""
    g = torch.Generator().manual_seed(seed)
    n1 = 2 * i if gated else i

    def scales(*shape):
        b = torch.randint(0, 0x7F, shape, generator=g, dtype=torch.int32)
        sign = torch.randint(0, 2, shape, generator=g, dtype=torch.int32) << 7
        return (b | sign).to(torch.uint8).view(torch.float8_e4m3fn)

    return PerTokenNVFP4Experts(
        fc1=torch.randint(0, 256, (e, n1, h // 2), generator=g, dtype=torch.int32).to(torch.uint8),
        fc1_scale=scales(e, n1, h // 16),
        fc1_alpha=torch.rand(e, generator=g) + 0.5,
        fc2=torch.randint(0, 256, (e, h, i // 2), generator=g, dtype=torch.int32).to(torch.uint8),
        fc2_scale=scales(e, h, i // 16),
        fc2_alpha=torch.rand(e, generator=g) + 0.5,
        gated=gated,
    )


def _layout(w: PerTokenNVFP4Experts, out=None) -> RoutedNVFP4Weights:
    return to_routed_nvfp4(w.fc1, w.fc1_scale, w.fc1_alpha, w.fc2, w.fc2_scale, w.fc2_alpha, gated=w.gated, out=out)


def _same(a: PerTokenNVFP4Experts, b: PerTokenNVFP4Experts) -> None:
    assert a.gated == b.gated
    for n in ("fc1", "fc1_scale", "fc1_alpha", "fc2", "fc2_scale", "fc2_alpha"):
        x, y = getattr(a, n), getattr(b, n)
        if x.dtype == torch.float8_e4m3fn:
            x, y = x.view(torch.uint8), y.view(torch.uint8)
        assert torch.equal(x, y), n


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize(("h", "i"), [(48, 80), (256, 256), (272, 64), (16, 512)])
def test_round_trip(gated, h, i):
    w = _stacks(3, h, i, gated, seed=h + i)
    lay = _layout(w)
    hp, ip = -(-h // 256) * 256, -(-i // 256) * 256
    n1p = 2 * ip if gated else ip
    assert (lay.padded_hidden_size, lay.padded_intermediate_size) == (hp, ip)
    assert lay.fc1_data.shape == (3, n1p, hp // 2) and lay.fc1_scale_swizzled.shape == (3, n1p, hp // 16)
    assert lay.fc2_data.shape == (3, hp, ip // 2) and lay.fc2_scale_swizzled.shape == (3, hp, ip // 16)
    _same(decode_routed_nvfp4(lay), w)


def test_gated_rows_by_hand():
    """I = 80 -> Ip = 256, 2Ip = 512 rows in blocks of 128: [up 0..63 | gate 0..63 | up 64..127 | gate 64..127
    | ...]. Physical row 0 = up 0 = logical row 80; row 64 = gate 0 = logical 0; row 128 + 15 = up 79 =
    logical 159; row 128 + 16 = up 80: padding (zero codes, zero scale bytes); row 192 + 15 = gate 79 =
    logical 79; rows 256.. are all padding. Columns past H/2 = 24 bytes are zero."""
    w = _stacks(2, 48, 80, True, seed=5)
    lay = _layout(w)
    d, s = lay.fc1_data, lay.fc1_scale_swizzled.view(torch.uint8)
    off = swizzle_offsets(512, 16).reshape(-1)
    flat = s.reshape(2, -1)[:, off].reshape(2, 512, 16)  # logical [row, col] scale bytes
    for phys, logical in ((0, 80), (64, 0), (143, 159), (207, 79)):
        assert torch.equal(d[:, phys, :24], w.fc1[:, logical]), phys
        assert torch.equal(flat[:, phys, :3], w.fc1_scale[:, logical].view(torch.uint8)), phys
    for phys in (144, 208, 256, 300, 511):
        assert d[:, phys].abs().sum() == 0 and flat[:, phys].sum() == 0, phys
    assert d[:, :, 24:].sum() == 0 and flat[:, :, 3:].sum() == 0


@pytest.mark.parametrize("gated", [True, False])
def test_padding_is_zero_everywhere(gated):
    """Every byte the decoder does not read (padded rows and columns, swizzle padding) is 0: zero codes and
    zero scales, so padded products are +0 (the per-token rule relies on it)."""
    h, i = 48, 80
    w = _stacks(2, h, i, gated, seed=9)
    lay = _layout(w)
    phys = cutedsl_w13_phys_rows(i, 256, 64) if gated else torch.arange(i)

    def unused_zero(data, scale, rows, n_code_cols, n_scale_cols):
        used = torch.zeros(data.shape[1:], dtype=torch.bool)
        used[rows[:, None], torch.arange(n_code_cols)[None, :]] = True
        assert data[:, ~used].sum() == 0
        off = swizzle_offsets(data.shape[1], scale.shape[2])[rows][:, :n_scale_cols].reshape(-1)
        used_s = torch.zeros(scale[0].numel(), dtype=torch.bool)
        used_s[off] = True
        assert scale.view(torch.uint8).reshape(2, -1)[:, ~used_s].sum() == 0

    unused_zero(lay.fc1_data, lay.fc1_scale_swizzled, phys, h // 2, h // 16)
    unused_zero(lay.fc2_data, lay.fc2_scale_swizzled, torch.arange(h), i // 2, i // 16)


def test_mma_view_shares_storage():
    w = _stacks(2, 48, 80, True)
    lay = _layout(w)
    for view, sw in ((lay.fc1_scale, lay.fc1_scale_swizzled), (lay.fc2_scale, lay.fc2_scale_swizzled)):
        assert view.data_ptr() == sw.data_ptr()
        e, mp, kp = sw.shape
        assert view.shape == (32, 4, mp // 128, 4, kp // 4, e)


def test_refresh_in_place_keeps_addresses():
    lay = _layout(_stacks(2, 48, 80, True, seed=1))
    ptrs = {n: getattr(lay, n).data_ptr() for n in ("fc1_data", "fc1_scale", "fc1_alpha", "fc2_data", "fc2_scale")}
    w2 = _stacks(2, 48, 80, True, seed=2)
    again = _layout(w2, out=lay)
    assert again is lay
    assert {n: getattr(lay, n).data_ptr() for n in ptrs} == ptrs
    _same(decode_routed_nvfp4(lay), w2)
    with pytest.raises(ValueError, match="out: intermediate_size is 80, the new weights have 96"):
        _layout(_stacks(2, 48, 96, True), out=lay)
    with pytest.raises(ValueError, match="out: gated is True, the new weights have False"):
        _layout(_stacks(2, 48, 80, False), out=lay)
    with pytest.raises(TypeError, match="out: expected RoutedNVFP4Weights"):
        _layout(_stacks(2, 48, 80, True), out=object())


def test_errors_name_the_tensor():
    w = _stacks(2, 48, 80, True)
    bad = w.fc1_scale.view(torch.uint8).clone()
    bad[1, 3, 2] = 0xFF
    with pytest.raises(ValueError, match="fc1_scale: contains E4M3 NaN scale bytes"):
        to_routed_nvfp4(w.fc1, bad, w.fc1_alpha, w.fc2, w.fc2_scale, w.fc2_alpha, gated=True)
    with pytest.raises(ValueError, match="fc1: dimension 1 must be 80"):
        to_routed_nvfp4(w.fc1, w.fc1_scale, w.fc1_alpha, w.fc2, w.fc2_scale, w.fc2_alpha, gated=False)
    with pytest.raises(ValueError, match="fc2_alpha: must be finite and > 0"):
        to_routed_nvfp4(w.fc1, w.fc1_scale, w.fc1_alpha, w.fc2, w.fc2_scale, -w.fc2_alpha, gated=True)
    with pytest.raises(TypeError, match="fc2: dtype"):
        to_routed_nvfp4(w.fc1, w.fc1_scale, w.fc1_alpha, w.fc2.int(), w.fc2_scale, w.fc2_alpha, gated=True)
    with pytest.raises(TypeError, match="gated: expected bool"):
        to_routed_nvfp4(w.fc1, w.fc1_scale, w.fc1_alpha, w.fc2, w.fc2_scale, w.fc2_alpha, gated=1)
