"""``quantize_routed_nvfp4_input`` (kernels/nvfp4/pertoken_quant.py) under the Triton interpreter.

- the kernel's E4M3 and E2M1 rounding helpers against an independent numpy oracle (nearest grid value by
  fp64 distance, ties to the even code) on every grid value, every midpoint and its fp32 neighbours, values
  past the saturation points, fp32 subnormals and random values;
- whole rows bitwise against the golden model (``reference.pertoken.quantize_nvfp4_pertoken``): the
  hand-derived rows of tests/reference/test_pertoken.py (E2M1 ties, 448 clamp, zero and -0.0 rows, one huge
  outlier, subnormal row maxima, the two source disagreements) with their hand-derived bytes, sampled
  consecutive bf16 patterns beside context blocks, and random rows at a width with a masked tail;
- the padding: code-0 bytes and 0x00 scale bytes past H;
- ``out=``, inputs never modified, and every bad-input error.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from flint_moe.kernels.nvfp4.pertoken_quant import e2m1_code_rn, e4m3_satfinite_rn
from flint_moe.ops import quantize_routed_nvfp4_input
from flint_moe.reference.pertoken import quantize_nvfp4_pertoken

BACKEND = "interpreter"

F32 = np.float32
BF16_MAX = torch.finfo(torch.bfloat16).max
FLT_MAX = float(torch.finfo(torch.float32).max)


def _e4m3_value(byte: int) -> float:
    e, m = byte >> 3, byte & 7
    return m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


E4M3_GRID = np.array([_e4m3_value(b) for b in range(0x7F)])  # bytes 0x00..0x7E, increasing, 448 last
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _nearest_even(v: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of the grid value nearest to each v in [0, grid[-1]] (fp64, exact here); ties to the even index."""
    dist = np.abs(v[:, None] - grid[None, :])
    best = dist.min(1, keepdims=True)
    hit = dist == best
    lo = hit.argmax(1)
    tie = hit.sum(1) == 2
    return np.where(tie & (lo % 2 == 1), lo + 1, lo)


@triton.jit
def _helpers_kernel(v_ptr, e4_ptr, e2_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    v = tl.load(v_ptr + i)
    tl.store(e4_ptr + i, e4m3_satfinite_rn(tl.abs(v)))
    tl.store(e2_ptr + i, e2m1_code_rn(v))


def _run_helpers(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = triton.next_power_of_2(len(v))
    vt = torch.zeros(n, dtype=torch.float32)
    vt[: len(v)] = torch.from_numpy(v.astype(F32))
    e4 = torch.empty(n, dtype=torch.int32)
    e2 = torch.empty(n, dtype=torch.int32)
    _helpers_kernel[(1,)](vt, e4, e2, N=n)
    return e4[: len(v)].numpy(), e2[: len(v)].numpy()


def _neighbours(x: np.ndarray) -> np.ndarray:
    x = x.astype(F32)
    return np.concatenate([x, np.nextafter(x, F32(0)), np.nextafter(x, F32(np.inf))])


def test_e4m3_rounding_helper_against_nearest_even_oracle():
    mids = (E4M3_GRID[1:] + E4M3_GRID[:-1]) / 2  # exact in fp32 (at most 5 significant bits)
    gen = np.random.default_rng(17)
    rand = (gen.random(3000) * 2.0 ** gen.uniform(-14, 10, 3000)).astype(F32)
    extra = np.array([0.0, 464.0, 480.0, 1e30, FLT_MAX, np.inf, 2.0**-10, 2.0**-11, 1e-45, 1e-40], dtype=F32)
    v = np.concatenate([_neighbours(E4M3_GRID), _neighbours(mids), rand, extra])
    got, _ = _run_helpers(v)
    want = _nearest_even(np.minimum(v.astype(np.float64), 448.0), E4M3_GRID)
    np.testing.assert_array_equal(got, want)
    # hand-derived anchors: 2^-10 is a tie to 0, just above it 1; 448.0000134 and inf saturate to 0x7E; the
    # tie 336 between 320 (0x7A) and 352 (0x7B) goes to 0x7A; 2^-6 - 2^-10 (tie 7.5 x 2^-9) rounds up to 0x08
    anchors = np.array([2.0**-10, np.nextafter(F32(2.0**-10), F32(1)), 448.0000134, np.inf, 336.0, 2.0**-6 - 2.0**-10])
    assert _run_helpers(anchors.astype(F32))[0].tolist() == [0x00, 0x01, 0x7E, 0x7E, 0x7A, 0x08]


def test_e2m1_code_helper_against_nearest_even_oracle():
    mids = (E2M1_GRID[1:] + E2M1_GRID[:-1]) / 2
    gen = np.random.default_rng(18)
    rand = (gen.standard_normal(2000) * 3).astype(F32)
    mags = np.concatenate([_neighbours(E2M1_GRID), _neighbours(mids), [7.0, 1e30, FLT_MAX, np.inf, 1e-45]])
    v = np.concatenate([mags, -mags, rand]).astype(F32)
    _, got = _run_helpers(v)
    mag = _nearest_even(np.minimum(np.abs(v.astype(np.float64)), 6.0), E2M1_GRID)
    np.testing.assert_array_equal(got, mag | np.where(v < 0, 8, 0))
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.0, -np.inf], dtype=F32)
    assert _run_helpers(ties)[1].tolist() == [0, 2, 2, 4, 4, 6, 6, 8, 0, 15]


def _unpack(packed: torch.Tensor) -> list[list[int]]:
    p = packed.to(torch.int32)
    return torch.stack((p & 0xF, p >> 4), -1).reshape(p.shape[0], -1).tolist()


def _quantize_and_compare(x: torch.Tensor, hp: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the op, compare bitwise with the golden model on the first H columns, check the padding."""
    before = x.clone()
    codes, scale, d = quantize_routed_nvfp4_input(x, hp)
    m, h = x.shape
    assert codes.shape == (m, hp // 2) and codes.dtype == torch.uint8
    assert scale.shape == (m, hp // 16) and scale.dtype == torch.uint8
    assert d.shape == (m,) and d.dtype == torch.float32
    r_codes, r_scale, r_d, _ = quantize_nvfp4_pertoken(x)
    assert torch.equal(codes[:, : h // 2], r_codes)
    assert torch.equal(scale[:, : h // 16], r_scale.view(torch.uint8))
    assert torch.equal(d.view(torch.int32), r_d.view(torch.int32))
    assert not codes[:, h // 2 :].any() and not scale[:, h // 16 :].any()
    assert torch.equal(x.view(torch.int16), before.view(torch.int16))
    return codes, scale, d


TIES = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, -0.0]


def _row(vals: dict[int, float], h: int = 32) -> list[float]:
    r = [0.0] * h
    for i, v in vals.items():
        r[i] = v
    return r


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow of x * FLT_MAX (q = inf, code 7)
def test_hand_derived_rows():
    """The rows of tests/reference/test_pertoken.py, their bytes derived there by hand, in one launch:
    0 E2M1 ties under unit scales ([TIES | 2688, 0 x 15]: S 0x38, 0x7E; 2688 -> q 6.0000005 -> code 7);
    1 all zero (g = d = 1, codes 0, scales 0x00); 2 all -0.0 (codes 0); 3 one bf16-max outlier among ones
    (S 0x7E, 0x00; the ones of block 1 saturate to code 7 under e = FLT_MAX); 4 the association example (amax
    46, block amax 34.5 -> 0x7B); 5 the encode-scale example (amax 52, block [6.5, 0.8125] -> 0x66, byte 0x17);
    6 the smallest bf16 subnormal 2^-133 as the row amax: g clamps to FLT_MAX, d = div_rn(1, FLT_MAX) an fp32
    subnormal; S = E4M3(RN(2^-133 * RN(FLT_MAX * C6)) = 0.0052083 = 2.67 x 2^-9) = 3 x 2^-9 (0x03);
    RN(S * d) ~ 1.7e-41, its reciprocal overflows -> e = FLT_MAX; q = +-RN(2^-133 * FLT_MAX) ~ +-2^-5 ->
    codes 0 and 8 (negative, rounds to zero)."""
    rows = [
        TIES + [2688.0] + [0.0] * 15,
        [0.0] * 32,
        [-0.0] * 32,
        [BF16_MAX] + [1.0] * 31,
        _row({0: 46.0, 16: 34.5}),
        _row({0: 52.0, 16: 6.5, 17: 0.8125}),
        _row({5: 2.0**-133, 20: -(2.0**-133)}),
    ]
    x = torch.tensor(rows, dtype=torch.bfloat16)
    codes, scale, d = _quantize_and_compare(x, 256)
    u = _unpack(codes)
    assert scale[:, :2].tolist() == [[0x38, 0x7E], [0, 0], [0, 0], [0x7E, 0x00], [0x7E, 0x7B], [0x7E, 0x66], [3, 3]]
    assert u[0][:32] == [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 0, 7] + [0] * 15
    assert u[1][:32] == [0] * 32 and u[2][:32] == [0] * 32
    assert u[3][:32] == [7] + [0] * 15 + [7] * 16
    assert int(codes[5, 8]) == 0x17
    assert d[:3].tolist() == [1.0, 1.0, 1.0]
    assert float(d[6]) == float(torch.tensor(1.0) / torch.tensor(FLT_MAX))  # d = div_rn(1, FLT_MAX)
    assert u[6][5] == 0 and u[6][20] == 8


def _bf16_patterns(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("context_bits", [0x0000, 0x0001, 0x43E0, 0x4528, 0x7F7F], ids=lambda b: f"{b:#06x}")
def test_bf16_patterns_beside_a_context_block(context_bits):
    """[16 consecutive bf16 patterns | a block of one repeated value]: 96 rows spread over all finite bf16
    patterns (every 42nd group of 16), so values are quantized under their own and under foreign scales
    (0x00 scales, the FLT_MAX clamp of g, the 448 clamp)."""
    all_bits = np.arange(1 << 16, dtype=np.int64)
    finite = all_bits[(all_bits & 0x7F80) != 0x7F80].reshape(-1, 16)[::42][:96]
    x = _bf16_patterns(np.concatenate([finite, np.full_like(finite, context_bits)], 1)).contiguous()
    _quantize_and_compare(x, 256)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_random_rows_with_a_masked_tail():
    """H = 272 (17 blocks) padded to 512: rows of normals times 2^U(-30, 30), one huge outlier, a zero row."""
    gen = torch.Generator().manual_seed(170)
    scale = torch.exp2(torch.randint(-30, 30, (24, 1), generator=gen).float())
    x = (torch.randn(24, 272, generator=gen) * scale).to(torch.bfloat16)
    x[3, 77] = 3.0e38
    x[5] = 0.0
    _quantize_and_compare(x, 512)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_random_rows_gpt_oss_width():
    """H = 2880 padded to 3072 (the audited masked specialisation), 3 rows."""
    gen = torch.Generator().manual_seed(171)
    x = (torch.randn(3, 2880, generator=gen) * 4).to(torch.bfloat16)
    _quantize_and_compare(x, 3072)


def test_out_buffers_are_filled_and_returned():
    x = torch.tensor([TIES + [2688.0] + [0.0] * 15], dtype=torch.bfloat16)
    out = (
        torch.full((1, 128), 0xFF, dtype=torch.uint8),
        torch.full((1, 16), 0xFF, dtype=torch.uint8),
        torch.full((1,), 5.0),
    )
    res = quantize_routed_nvfp4_input(x, 256, out=out)
    assert all(a is b for a, b in zip(res, out, strict=True))
    ref = quantize_routed_nvfp4_input(x, 256)
    for a, b in zip(res, ref, strict=True):
        assert torch.equal(a, b)


def _x(m: int = 2, h: int = 32) -> torch.Tensor:
    return torch.ones(m, h, dtype=torch.bfloat16)


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        ((_x().float(), 256), TypeError, "hidden_states"),
        (([[1.0] * 16], 256), TypeError, "hidden_states"),
        ((torch.ones(32, dtype=torch.bfloat16), 256), ValueError, "hidden_states"),
        ((_x(0), 256), ValueError, r"hidden_states: needs at least one row"),
        ((_x(2, 24), 256), ValueError, r"hidden_states: hidden size H = 24"),
        ((_x(2, 64).t(), 256), ValueError, "hidden_states: must be contiguous"),
        ((_x(), 128), ValueError, r"padded_hidden_size: must be a multiple of 256"),
        ((_x(2, 272), 256), ValueError, r"padded_hidden_size: .* >= H = 272"),
        ((_x(), 0), ValueError, "padded_hidden_size"),
        ((_x(), 256.0), TypeError, "padded_hidden_size"),
        ((_x(), True), TypeError, "padded_hidden_size"),
    ],
    ids=["fp32", "list", "1-D", "no-rows", "H24", "strided", "Hp128", "Hp<H", "Hp0", "Hp-float", "Hp-bool"],
)
def test_bad_input(args, exc, match):
    with pytest.raises(exc, match=match):
        quantize_routed_nvfp4_input(*args)


def test_bad_out():
    x = _x()
    good = (torch.empty(2, 128, dtype=torch.uint8), torch.empty(2, 16, dtype=torch.uint8), torch.empty(2))
    with pytest.raises(TypeError, match="out: expected a tuple"):
        quantize_routed_nvfp4_input(x, 256, out=list(good))
    with pytest.raises(TypeError, match="out.block_scale"):
        quantize_routed_nvfp4_input(x, 256, out=(good[0], good[1].view(torch.float8_e4m3fn), good[2]))
    with pytest.raises(ValueError, match="out.codes"):
        quantize_routed_nvfp4_input(x, 256, out=(good[0][:, :64], good[1], good[2]))
    with pytest.raises(ValueError, match="out.token_scale"):
        quantize_routed_nvfp4_input(x, 256, out=(good[0], good[1], torch.empty(4)[::2]))
    shared = torch.empty(2 * 128 + 2 * 16, dtype=torch.uint8)
    overlap = (shared[:256].view(2, 128), shared[240:272].view(2, 16), good[2])
    with pytest.raises(ValueError, match="out.block_scale: shares memory with out.codes"):
        quantize_routed_nvfp4_input(x, 256, out=overlap)


def _decoded(codes: torch.Tensor, scale: torch.Tensor, h: int) -> torch.Tensor:
    """Independent decode: E2M1 grid value of each nibble (sign bit 8, so code 8 is -0.0) times the E4M3 value of
    its block's byte, in fp64 (exact), as bf16 [M, h]."""
    c = np.array(_unpack(codes))[:, :h]
    mag = E2M1_GRID[c & 7]
    val = np.where(c & 8, -mag, mag) * E4M3_GRID[scale.numpy().astype(np.int64)[:, : h // 16]].repeat(16, 1)
    return torch.from_numpy(val).to(torch.bfloat16)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("chunk", [256, 4096], ids=["two_chunks", "one_chunk"])
def test_values_are_the_exact_decoded_codes(dtype, chunk):
    """``launch_pertoken_quant(..., values=)`` (the GEMM operand): bitwise the independent decode of its own codes
    and scale bytes (signed zeros included), for bf16 and fp32 rows (the tokens, FC2's input), with the row in
    one chunk or in two (``CHUNK`` 256 on Hp 512); codes, scales and d equal across the chunkings and with the
    golden model."""
    from flint_moe.kernels.nvfp4.pertoken_quant import launch_pertoken_quant

    gen = torch.Generator().manual_seed(172)
    m, h, hp = 6, 272, 512
    x = (torch.randn(m, h, generator=gen) * torch.exp2(torch.randint(-20, 20, (m, 1), generator=gen).float()))
    x[1, 0], x[1, 1:16] = x[1].abs().max(), -x[1].abs().max() / 64  # rounds to zero: code 8
    x[2] = 0.0
    x = x.to(dtype)
    codes = torch.empty((m, hp // 2), dtype=torch.uint8)
    scale = torch.empty((m, hp // 16), dtype=torch.uint8)
    d = torch.empty((m,), dtype=torch.float32)
    values = torch.empty((m, h), dtype=torch.bfloat16)
    launch_pertoken_quant(x, hp, codes, scale, d, config={"CHUNK": chunk}, values=values)
    assert torch.equal(values.view(torch.int16), _decoded(codes, scale, h).view(torch.int16))
    assert (values[1, 1:16].view(torch.int16) == -32768).all()  # code 8 is -0.0
    r_codes, r_scale, r_d, _ = quantize_nvfp4_pertoken(x.to(torch.bfloat16)) if dtype == torch.bfloat16 else (
        codes[:, : h // 2], scale[:, : h // 16].view(torch.float8_e4m3fn), d, None)
    assert torch.equal(codes[:, : h // 2], r_codes)
    assert torch.equal(scale[:, : h // 16], r_scale.view(torch.uint8))
    assert torch.equal(d.view(torch.int32), r_d.view(torch.int32))
    assert not codes[:, h // 2 :].any() and not scale[:, h // 16 :].any()
