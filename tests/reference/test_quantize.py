"""NVFP4 quantizer (flint_moe/reference/quantize.py): hand-derived examples, an independent numpy float32
re-statement of ModelOpt's recipe, and (marked ``oracle``) bit-for-bit agreement with nvidia-modelopt 0.47.0.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from flint_moe.reference.formats import e2m1_to_float, e4m3_to_float, unpack_e2m1
from flint_moe.reference.quantize import dequantize_nvfp4, global_scale_of, quantize_experts, quantize_nvfp4
from flint_moe.reference.weights import NVFP4Experts

# ------------------------------------------------------------------------------------------------------
# independent reference: the recipe in numpy float32 (IEEE, one rounding per op), nearest-value searches
# in fp64 for E4M3 / E2M1 (ties to the even code)
# ------------------------------------------------------------------------------------------------------


def _e4m3_fp64(byte: int) -> float:
    e, m = (byte >> 3) & 0xF, byte & 7
    return (m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


E4M3_MAGS = np.array([_e4m3_fp64(b) for b in range(0x7F)])  # bytes 0x00..0x7E
E2M1_MAGS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _nearest_even(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of the nearest grid value for each x (fp64 distances), ties to the even index."""
    d = np.abs(x[..., None].astype(np.float64) - grid)
    best = d.min(-1, keepdims=True)
    cand = d == best
    idx = np.argmax(cand, -1)  # first candidate
    two = cand.sum(-1) == 2
    return np.where(two & (idx % 2 == 1), idx + 1, idx)


def np_quantize(w: np.ndarray, gs: np.float32 | None = None) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """w float32 [N, K] -> (codes uint8 [N, K] unpacked, scale bytes uint8 [N, K/16], gs float32)."""
    f = np.float32
    n, k = w.shape
    if gs is None:
        amax = f(np.max(np.abs(w)))
        gs = f(1.0) if amax == 0 else f(amax / f(2688.0))
    blocks = w.reshape(n, k // 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (np.max(np.abs(blocks), -1) / f(f(6.0) * gs)).astype(np.float32)
        s = np.where(s == 0, f(1.0), s)
        s = np.clip(s, f(2.0**-9), f(448.0)).astype(np.float32)
        sb = _nearest_even(s, E4M3_MAGS).astype(np.uint8)
        step = (E4M3_MAGS[sb].astype(np.float32) * gs).astype(np.float32)
        q = (blocks / step[..., None]).astype(np.float32)
    a = np.abs(q)
    mag = np.where(np.isnan(a) | (a > 6), 7, _nearest_even(np.where(np.isnan(a), 0, np.minimum(a, 6)), E2M1_MAGS))
    codes = mag.astype(np.uint8) | ((q < 0).astype(np.uint8) << 3)
    return codes.reshape(n, k), sb, gs


def _ours_unpacked(w: torch.Tensor, gs=None):
    c, s, g = quantize_nvfp4(w, global_scale=gs)
    return unpack_e2m1(c).numpy(), s.view(torch.uint8).numpy(), g


def _check_vs_numpy(w: torch.Tensor, gs: float | None = None) -> None:
    codes, sb, g = _ours_unpacked(w, None if gs is None else torch.tensor(gs, dtype=torch.float32))
    rc, rs, rg = np_quantize(w.float().numpy(), None if gs is None else np.float32(gs))
    np.testing.assert_array_equal(sb, rs)
    np.testing.assert_array_equal(codes, rc)
    assert g.view(torch.int32).item() == np.array(rg, dtype=np.float32).view(np.int32).item()


# ------------------------------------------------------------------------------------------------------
# hand-derived example
# ------------------------------------------------------------------------------------------------------


def _hand_matrix() -> torch.Tensor:
    w = torch.zeros(2, 80)
    # block 0: amax 2688 = matrix amax -> gs = 2688 / 2688 = 1.0 exactly; 6 * gs = 6; s = 2688 / 6 = 448
    # (byte 0x7E); step = 448 * 1 = 448; q = w / 448 =
    #   6, -3, 0.5, 0.25 (tie 0|0.5 -> 0), -0.25 (-> 0 with sign: code 8), 0.75 (tie 0.5|1 -> 1), 1.25 (tie
    #   1|1.5 -> 1), 1.75 (tie 1.5|2 -> 2), 2.5 (tie 2|3 -> 2), 3.5 (tie 3|4 -> 4), 5 (tie 4|6 -> 4),
    #   5.5 (-> 6), 0, -0.0 (q < 0 is false: code 0, ModelOpt's sign rule), 1, 1.5
    w[0, :16] = torch.tensor([2688, -1344, 224, 112, -112, 336, 560, 784, 1120, 1568, 2240, 2464, 0, -0.0,
                              448, 672])  # fmt: skip
    # block 1: all zero -> s = 0 -> 1.0 (byte 0x38), codes 0
    # block 2: amax 6 * 2^-12 -> s = 2^-12 < 2^-9 -> clamped to 2^-9 (byte 0x01); step 2^-9;
    #   q = 0.75 (tie -> 1, code 2), -0.5 (code 9), 0.25 (tie -> 0), -0.375 (-> -0.5, code 9)
    w[0, 32:36] = torch.tensor([6 * 2**-12, -(2**-10), 2**-11, -3 * 2**-12])
    # block 3: amax 93 -> s = 15.5: tie between 15 (0x57: e=10, m=7) and 16 (0x58: e=11, m=0): the even
    #   mantissa wins, 16 -- the scale rounds up across the binade; q = 5.8125 (-> 6), 2.90625 (-> 3), -0.5, 1.5
    w[0, 48:52] = torch.tensor([93, 46.5, -8, 24])
    # block 4: amax 91.5 -> s = 15.25 -> 15 (0x57); q = 6.1 (saturates to 6), -2.5 (tie 2|3 -> -2, code 12),
    #   1.5 (code 3)
    w[0, 64:67] = torch.tensor([91.5, -37.5, 22.5])
    return w.bfloat16()  # every value above is a bf16 value


HAND_CODES_ROW0 = (
    [7, 13, 1, 0, 8, 2, 2, 4, 4, 6, 6, 7, 0, 0, 2, 3] + [0] * 16 + [2, 9, 0, 9] + [0] * 12
    + [7, 5, 9, 3] + [0] * 12 + [7, 12, 3] + [0] * 13
)  # fmt: skip
HAND_SCALES = [[0x7E, 0x38, 0x01, 0x58, 0x57], [0x38] * 5]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hand_example(dtype: torch.dtype) -> None:
    w = _hand_matrix().to(dtype)
    keep = w.clone()
    codes, scale, gs = quantize_nvfp4(w)
    assert torch.equal(w.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       keep.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))  # not modified
    assert codes.dtype == torch.uint8 and codes.shape == (2, 40)
    assert scale.dtype == torch.float8_e4m3fn and scale.shape == (2, 5)
    assert gs.dtype == torch.float32 and gs.shape == () and gs.item() == 1.0
    assert unpack_e2m1(codes).tolist() == [HAND_CODES_ROW0, [0] * 80]
    assert codes[0, :2].tolist() == [0xD7, 0x01]  # (7, 13) -> 0xD7; (1, 0) -> 0x01
    assert scale.view(torch.uint8).tolist() == HAND_SCALES
    # dequantized: code value x block scale (x gs = 1)
    deq = dequantize_nvfp4(codes, scale, gs)
    assert deq[0, :16].tolist() == [2688, -1344, 224, 0, -0.0, 448, 448, 896, 896, 1792, 1792, 2688, 0, 0,
                                    448, 672]  # fmt: skip
    assert deq[0, 48:52].tolist() == [96, 48, -8, 24] and deq[0, 64:67].tolist() == [90, -30, 22.5]
    _check_vs_numpy(w)


def test_given_global_scale() -> None:
    # gs = 0.5 given: 6 * gs = 3; block amax 3 -> s = 1 (0x38); step = 1 * 0.5; q = 3 / 0.5 = 6, 0.25 / 0.5
    # = 0.5, -0.625 / 0.5 = -1.25 (tie -> -1, code 10)
    w = torch.zeros(1, 16)
    w[0, :3] = torch.tensor([3.0, 0.25, -0.625])
    codes, scale, gs = quantize_nvfp4(w, global_scale=0.5)
    assert unpack_e2m1(codes)[0, :3].tolist() == [7, 1, 10]
    assert scale.view(torch.uint8).tolist() == [[0x38]] and gs.item() == 0.5
    # a scalar scale broadcasts over leading dimensions; a [...] one is used per matrix
    w3 = torch.randn(3, 4, 32)
    _, _, g3 = quantize_nvfp4(w3, global_scale=torch.tensor(0.01))
    assert g3.shape == (3,) and (g3 == torch.tensor(0.01)).all()
    per = torch.tensor([0.01, 0.02, 0.03])
    c3, s3, g3 = quantize_nvfp4(w3, global_scale=per)
    assert torch.equal(g3, per) and g3 is not per
    for e in range(3):
        c, s, _ = quantize_nvfp4(w3[e], global_scale=per[e])
        assert torch.equal(c3[e], c) and torch.equal(s3[e].view(torch.uint8), s.view(torch.uint8))


def test_global_scale_amax() -> None:
    # gs = RN(amax / 2688): amax = 1 -> fp32(1/2688), computed independently in numpy float32
    w = torch.zeros(2, 16)
    w[1, 5] = -1.0
    assert global_scale_of(w).item() == float(np.float32(1.0) / np.float32(2688.0))
    assert global_scale_of(torch.zeros(3, 2, 16)).tolist() == [1.0, 1.0, 1.0]  # all-zero: 1.0 (deviation)


def test_all_zero_matrix() -> None:
    # ModelOpt gives gs = 0 and NaN scale bytes here; the golden model gives gs = 1, scales 1.0, codes 0
    c, s, g = quantize_nvfp4(torch.zeros(4, 32, dtype=torch.bfloat16))
    assert g.item() == 1.0 and (s.view(torch.uint8) == 0x38).all() and (c == 0).all()


def test_leading_dims_are_independent_matrices() -> None:
    g = torch.Generator().manual_seed(5)
    w = torch.randn(2, 3, 8, 48, generator=g) * torch.tensor([1.0, 1e-3, 50.0]).reshape(1, 3, 1, 1)
    c, s, gs = quantize_nvfp4(w)
    assert c.shape == (2, 3, 8, 24) and s.shape == (2, 3, 8, 3) and gs.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            ci, si, gi = quantize_nvfp4(w[i, j])
            assert torch.equal(c[i, j], ci) and torch.equal(s[i, j].view(torch.uint8), si.view(torch.uint8))
            assert gs[i, j].view(torch.int32) == gi.view(torch.int32)


def test_vs_numpy_reference_distributions() -> None:
    g = torch.Generator().manual_seed(6)
    n, k = 64, 256
    cases = [
        torch.randn(n, k, generator=g),
        torch.empty(n, k).cauchy_(generator=g),  # heavy-tailed
        torch.randn(n, k, generator=g) * torch.exp2(torch.randint(-40, 20, (n, k), generator=g).float()),
        torch.randn(n, k, generator=g) * 1e-30,
    ]
    w = torch.randn(n, k, generator=g)
    w[3] = 0
    w[5, 16:48] = 0  # zero blocks
    w[7, :16] *= 1e-6  # a block scale below the 2^-9 clamp
    cases.append(w)
    for w in cases:
        for dt in (torch.float32, torch.bfloat16):
            _check_vs_numpy(w.to(dt))
            _check_vs_numpy(w.to(dt), gs=0.0137)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 4), st.sampled_from([16, 32, 48])),
        elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=True),
    ),
    st.booleans(),
)
def test_hypothesis_vs_numpy_reference(w: np.ndarray, as_bf16: bool) -> None:
    t = torch.from_numpy(w.copy())
    if as_bf16:
        t = t.bfloat16()
    if float(t.abs().max()) / 2688 < 2.0**-149 and float(t.abs().max()) != 0:
        return  # global-scale underflow: rejected (tested separately)
    _check_vs_numpy(t)


def test_dequantize() -> None:
    g = torch.Generator().manual_seed(7)
    w = torch.randn(3, 16, 64, generator=g)
    c, s, gs = quantize_nvfp4(w)
    exact = dequantize_nvfp4(c, s, None)
    vals = e2m1_to_float(unpack_e2m1(c)).double().reshape(3, 16, 4, 16)
    want = (vals * e4m3_to_float(s).double()[..., None]).reshape(3, 16, 64)
    assert torch.equal(exact.double(), want)  # exact in fp32
    scaled = dequantize_nvfp4(c, s.view(torch.uint8), gs)
    assert torch.equal(scaled, (want * gs.double().reshape(3, 1, 1)).float())  # one rounding
    bad = s.view(torch.uint8).clone()
    bad[1, 2, 3] = 0x7F
    with pytest.raises(ValueError, match=r"^block_scale: E4M3 NaN scale byte 0x7F at index \(1, 2, 3\)"):
        dequantize_nvfp4(c, bad, gs)
    with pytest.raises(ValueError, match=r"^block_scale: dimension 2 must be 4"):
        dequantize_nvfp4(c, s[..., :3], gs)
    with pytest.raises(ValueError, match=r"^global_scale: shape must be \(\) or \(3,\)"):
        dequantize_nvfp4(c, s, torch.ones(2))
    with pytest.raises(ValueError, match=r"^codes: unpacked row length .* 6 must be a positive multiple of 16"):
        dequantize_nvfp4(c[..., :3], s, gs)


def test_quantize_experts() -> None:
    g = torch.Generator().manual_seed(8)
    e, i, h = 4, 32, 48
    w13 = (torch.randn(e, 2 * i, h, generator=g) * torch.linspace(0.1, 3, e).reshape(e, 1, 1)).bfloat16()
    w13[1, i:] *= 8  # expert 1: "up" holds the amax, so gate's scale comes from up's amax
    w2 = torch.randn(e, h, i, generator=g).bfloat16()
    keep13, keep2 = w13.clone(), w2.clone()
    ex = quantize_experts(w13, w2)
    assert isinstance(ex, NVFP4Experts)
    assert (ex.num_experts, ex.hidden, ex.intermediate) == (e, h, i)
    assert torch.equal(w13.view(torch.int16), keep13.view(torch.int16))
    assert torch.equal(w2.view(torch.int16), keep2.view(torch.int16))
    for x in range(e):
        want_gs = w13[x].float().abs().max() / torch.tensor(2688.0)
        assert ex.w13_gs[x].view(torch.int32) == want_gs.view(torch.int32)
        c, s, gsx = quantize_nvfp4(w13[x])
        assert torch.equal(ex.w13[x], c) and torch.equal(ex.w13_scale_bytes()[x], s.view(torch.uint8))
        # gate alone, quantized with the shared scale, is the top half
        cg, sg, _ = quantize_nvfp4(w13[x, :i], global_scale=gsx)
        assert torch.equal(ex.w13[x, :i], cg) and torch.equal(ex.w13_scale_bytes()[x, :i], sg.view(torch.uint8))
        c2, s2, g2 = quantize_nvfp4(w2[x])
        assert torch.equal(ex.w2[x], c2) and ex.w2_gs[x].view(torch.int32) == g2.view(torch.int32)
    # gate's own amax would give a different global scale for expert 1
    assert quantize_nvfp4(w13[1, :i])[2] != ex.w13_gs[1]


# ------------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------------


def test_bad_input() -> None:
    w = torch.randn(4, 32)
    with pytest.raises(TypeError, match=r"^w: dtype must be torch.bfloat16 or torch.float32, got torch.float16"):
        quantize_nvfp4(w.half())
    with pytest.raises(TypeError, match=r"^w: expected a torch.Tensor"):
        quantize_nvfp4(w.numpy())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^w: expected \[..., N, K\]"):
        quantize_nvfp4(torch.randn(32))
    with pytest.raises(ValueError, match=r"^w: row length K \(last dimension\) 24 must be a positive multiple"):
        quantize_nvfp4(torch.randn(4, 24))
    with pytest.raises(ValueError, match=r"^w: row length K \(last dimension\) 17 must"):
        quantize_nvfp4(torch.randn(4, 17))  # odd K
    with pytest.raises(ValueError, match=r"^w: empty dimension"):
        quantize_nvfp4(torch.randn(0, 4, 32))
    bad = w.clone()
    bad[2, 7] = math.nan
    bad[3, 0] = math.inf
    with pytest.raises(ValueError, match=r"^w: non-finite value nan at index \(2, 7\)"):
        quantize_nvfp4(bad)
    with pytest.raises(ValueError, match=r"^global_scale: must be finite and > 0, got 0.0"):
        quantize_nvfp4(w, global_scale=0.0)
    with pytest.raises(ValueError, match=r"^global_scale: must be finite and > 0, got -1.0 at index \(1,\)"):
        quantize_nvfp4(w.expand(2, 4, 32), global_scale=torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match=r"^global_scale: shape must be \(\) or \(2,\), got \(3,\)"):
        quantize_nvfp4(w.expand(2, 4, 32), global_scale=torch.ones(3))
    with pytest.raises(TypeError, match=r"^global_scale: dtype must be torch.float32"):
        quantize_nvfp4(w, global_scale=torch.tensor(1.0, dtype=torch.float64))
    tiny = torch.zeros(2, 16)
    tiny[0, 0] = 2.0**-140  # fp32 subnormal: amax / 2688 underflows to 0
    with pytest.raises(ValueError, match=r"^w: matrix \(\) has amax .* underflows to 0"):
        quantize_nvfp4(tiny)
    w13, w2 = torch.randn(2, 32, 48).bfloat16(), torch.randn(2, 48, 16).bfloat16()
    with pytest.raises(TypeError, match=r"^w13: dtype must be torch.bfloat16"):
        quantize_experts(w13.float(), w2)
    with pytest.raises(ValueError, match=r"^w2: dimension 1 must be 48"):
        quantize_experts(w13, w2[:, :40])
    with pytest.raises(ValueError, match=r"^w13: hidden size H 40 must be a positive multiple of 16"):
        quantize_experts(w13[..., :40], w2[:, :40])
    with pytest.raises(ValueError, match=r"^w2: intermediate size I 8 must be a positive multiple of 16"):
        quantize_experts(torch.randn(2, 16, 48).bfloat16(), torch.randn(2, 48, 8).bfloat16())
    bad13 = w13.clone()
    bad13[1, 3, 4] = math.inf
    with pytest.raises(ValueError, match=r"^w13: non-finite value inf at index \(1, 3, 4\)"):
        quantize_experts(bad13, w2)


@pytest.mark.gpu
def test_cuda_matches_cpu() -> None:
    g = torch.Generator().manual_seed(9)
    w = torch.randn(4, 64, 128, generator=g) * torch.exp2(torch.randint(-30, 10, (4, 64, 128), generator=g))
    for dt in (torch.float32, torch.bfloat16):
        a = quantize_nvfp4(w.to(dt))
        b = quantize_nvfp4(w.to(dt).cuda())
        assert b[0].is_cuda
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x.view(torch.uint8), y.cpu().view(torch.uint8))
    c, s, gs = a
    assert torch.equal(dequantize_nvfp4(c.cuda(), s.cuda(), gs.cuda()).cpu(), dequantize_nvfp4(c, s, gs))


# ------------------------------------------------------------------------------------------------------
# oracle: nvidia-modelopt 0.47.0
# ------------------------------------------------------------------------------------------------------


def _oracle_cases() -> list[tuple[str, torch.Tensor, torch.Tensor | None]]:
    g = torch.Generator().manual_seed(10)
    cases: list[tuple[str, torch.Tensor, torch.Tensor | None]] = []

    def add(name: str, w: torch.Tensor, gs: torch.Tensor | None = None) -> None:
        cases.append((name, w, gs))

    for n, k in [(1, 16), (3, 32), (16, 64), (64, 256), (32, 2880), (8, 7168)]:
        add(f"normal{n}x{k}", torch.randn(n, k, generator=g))
        add(f"uniform{n}x{k}", torch.rand(n, k, generator=g) * 2 - 1)
        add(f"cauchy{n}x{k}", torch.empty(n, k).cauchy_(generator=g))
        chi = torch.randn(n, k, 3, generator=g).pow(2).sum(-1)
        add(f"student_t3_{n}x{k}", torch.randn(n, k, generator=g) / (chi / 3).sqrt())
        signs = torch.randint(0, 2, (n, k), generator=g) * 2 - 1
        add(f"lognormal{n}x{k}", signs * torch.exp2(torch.randn(n, k, generator=g) * 12))
    w = torch.randn(48, 128, generator=g)
    w[[0, 5, 47]] = 0  # all-zero rows
    w[7, 16:48] = 0  # all-zero blocks
    w[9, :: 3] = 0
    add("zero_rows_blocks", w)
    # tiny blocks near the 2^-9 clamp: per-block scale amax / (6 gs) around 2^-9
    w = torch.randn(32, 128, generator=g)
    gs = w.abs().max() / 2688
    for r in range(1, 32):
        target = 2.0**-9 * float(torch.tensor(2.0) ** (torch.rand(1, generator=g) * 4 - 2))
        blk = w[r, 16:32]
        w[r, 16:32] = blk / blk.abs().max() * (target * 6 * gs)
    add("near_clamp", w)
    # scales that round across an E4M3 binade (or sit on a tie there): gs = 1 via amax 2688
    tops = [15.5, 15.4, 15.6, 31.0, 31.5, 1.9375, 0.9375 + 0.03125, 15 * 2.0**-10, 7.5 * 2.0**-9, 240.0,
            232.0, 447.0, 456.0, 500.0, 2.0**-9, 0.75 * 2.0**-9, 1.5 * 2.0**-9, 2.0**-10]  # fmt: skip
    w = torch.randn(len(tops), 64, generator=g)
    for r, t in enumerate(tops):
        w[r, :16] = w[r, :16] / w[r, :16].abs().max() * (6 * t)
        w[r, 16:32] = torch.tensor([6 * t, -3 * t] + [0.0] * 14)
    w[0, 63] = 2688
    add("binade_fp32", w)
    add("binade_bf16", w.bfloat16())
    # exact E2M1 ties at gs = 1 (values are multiples of a quarter step)
    w = torch.randint(-24, 25, (16, 64), generator=g).float() * 0.25 * 448
    w[0, 0] = 2688
    add("e2m1_ties", w)
    add("e2m1_ties_bf16", w.bfloat16())
    # fp32 matrix so small that block scale x gs underflows to 0 in some blocks (q = inf or 0/0 = NaN)
    w = torch.zeros(4, 32)
    w[0, 0] = 2.0**-129
    w[1, 0] = 2.0**-149
    w[2, 16] = -(2.0**-148)
    add("fp32_underflow", w)
    # given global scales
    w = torch.randn(64, 256, generator=g)
    add("given_gs", w, torch.tensor(0.0137))
    add("given_gs_small", w, torch.tensor(1e-6))  # block scales clamp at 448
    add("given_gs_large", w, torch.tensor(30.0))  # block scales clamp at 2^-9
    add("given_gs_bf16", w.bfloat16(), torch.tensor(0.001))
    for name, w, gs in list(cases):
        if w.dtype == torch.float32 and not name.startswith(("binade", "e2m1", "fp32_underflow")):
            cases.append((name + "_bf16", w.bfloat16(), gs))
    return cases


@pytest.mark.oracle
def test_oracle_modelopt_bit_exact() -> None:
    pytest.importorskip("modelopt")
    import modelopt

    assert modelopt.__version__ == "0.47.0", f"oracle pinned to nvidia-modelopt 0.47.0, got {modelopt.__version__}"
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    cases = _oracle_cases()
    assert len(cases) > 60
    for name, w, gs in cases:
        q, s_ref, g_ref = NVFP4QTensor.quantize(w.clone(), 16, weights_scaling_factor_2=gs)
        c, s, g = quantize_nvfp4(w, global_scale=gs)
        assert torch.equal(c, q._quantized_data), name
        assert s_ref.dtype == torch.float8_e4m3fn
        assert torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8)), name
        assert g.shape == () and g.view(torch.int32) == g_ref.float().view(torch.int32), name
        # W = E2M1 x E4M3 (no global scale) agrees with ModelOpt's dequantize at double_scale 1
        # (values compared with ==: ModelOpt decodes code 8 as +0, the rule as -0)
        deq = q.dequantize(dtype=torch.float32, scale=s_ref, double_scale=torch.tensor(1.0), block_sizes={-1: 16})
        assert torch.equal(dequantize_nvfp4(c, s, None), deq), name
    # a 3-D stack: each trailing matrix is one ModelOpt tensor
    w = torch.randn(5, 32, 64, generator=torch.Generator().manual_seed(11)).bfloat16()
    w[2] *= 1e-3
    c, s, g = quantize_nvfp4(w)
    for e in range(5):
        q, s_ref, g_ref = NVFP4QTensor.quantize(w[e].clone(), 16)
        assert torch.equal(c[e], q._quantized_data)
        assert torch.equal(s[e].view(torch.uint8), s_ref.view(torch.uint8))
        assert g[e].view(torch.int32) == g_ref.view(torch.int32)


@pytest.mark.oracle
@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 3), st.sampled_from([16, 32])),
        elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=False).filter(lambda v: v == 0 or abs(v) > 1e-30),
    ),
    st.booleans(),
)
def test_oracle_modelopt_hypothesis(w: np.ndarray, as_bf16: bool) -> None:
    pytest.importorskip("modelopt")
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    t = torch.from_numpy(w.copy())
    if as_bf16:
        t = t.bfloat16()
    if not bool((t != 0).any()):
        return  # all-zero matrix: documented deviation
    q, s_ref, g_ref = NVFP4QTensor.quantize(t.clone(), 16)
    c, s, g = quantize_nvfp4(t)
    assert torch.equal(c, q._quantized_data)
    assert torch.equal(s.view(torch.uint8), s_ref.view(torch.uint8))
    assert g.view(torch.int32) == g_ref.view(torch.int32)
