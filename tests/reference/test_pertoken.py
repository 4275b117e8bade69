"""Per-token NVFP4 quantizer (flint_moe/reference/pertoken.py): hand-derived rows and two CPU oracles.

1. TransformerEngine 2.20.2's ``NVFP4QuantizerRef`` with ``row_scaled_nvfp4=True`` (one amax per row, 1x16
   blocks), plain PyTorch from the pure-Python ``transformer-engine`` wheel (oracle extra), loaded from its
   file because the package ``__init__`` files load CUDA libraries (marked ``oracle``). TransformerEngine's
   newer ``NVFP4QuantizerPerTokenRef`` is not in a released wheel; FlashInfer's per-token quantizer is an sm_100
   CuTe-DSL kernel and its ``ref_fp4_quant`` lives in FlashInfer's test tree; nvidia-modelopt 0.47.0 has no
   per-token quantizer.
2. A separate numpy float32 statement of the published formulas (numerics.md "Per-token NVFP4 experts",
   P1-P5), written from the formulas and not from the torch code: nearest-value searches in fp64 over the E4M3
   and E2M1 magnitudes (ties to the even code) instead of the torch code's bit arithmetic and threshold counts.
   It runs everywhere and also checks the row scales.

Both run on every finite bf16 value, in rows where the value is the row max and in rows whose max is set by
another block (zero, 1, 448, 2688, the bf16 maximum, subnormal row maxima), and on random rows.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch

from flint_moe.reference.pertoken import (
    PERTOKEN_INV6,
    dequantize_nvfp4_rows,
    pertoken_global_scale,
    quantize_nvfp4_pertoken,
    quantize_nvfp4_rows,
)

# ------------------------------------------------------------------------------------------------------
# the oracle: numpy float32 (one IEEE rounding per operation, subnormals kept)
# ------------------------------------------------------------------------------------------------------

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)


def _e4m3_mag(byte: int) -> float:
    e, m = byte >> 3, byte & 7
    return (m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


E4M3 = np.array([_e4m3_mag(b) for b in range(0x7F)])  # bytes 0x00..0x7E, increasing
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _nearest_even(v: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of the grid value nearest to each v >= 0 (fp64 distances; v and grid exact in fp64); a tie
    goes to the even index (the even code)."""
    d = np.abs(v.astype(np.float64)[..., None] - grid)
    best = d.min(-1, keepdims=True)
    cand = d == best
    lo = np.argmax(cand, -1)
    tie = cand.sum(-1) == 2
    return np.where(tie & (lo % 2 == 1), lo + 1, lo)


def oracle_rows(x: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P3-P5: x float32 [M, K], g float32 [M] -> (unpacked codes uint8 [M, K], scale bytes uint8 [M, K/16])."""
    m, k = x.shape
    with np.errstate(divide="ignore", over="ignore"):
        d = (F32(1) / g).astype(F32)
        c6 = F32(1.0 / 6.0)
        blocks = x.reshape(m, k // 16, 16)
        pre = (np.abs(blocks).max(-1) * (g * c6)[:, None]).astype(F32)
        sbyte = _nearest_even(np.minimum(pre, F32(448)), E4M3).astype(np.uint8)
        s = E4M3[sbyte].astype(F32)
        enc = np.minimum(F32(1) / (s * d[:, None]), FLT_MAX).astype(F32)
        q = (blocks * enc[..., None]).astype(F32)
    mag = _nearest_even(np.minimum(np.abs(q), F32(6)), E2M1).astype(np.uint8)
    codes = mag | ((q < 0).astype(np.uint8) << 3)
    return codes.reshape(m, k), sbyte


def oracle(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """P1-P5: x float32 [M, K] -> (unpacked codes uint8 [M, K], scale bytes uint8 [M, K/16], d [M], g [M])."""
    with np.errstate(divide="ignore", over="ignore"):
        amax = np.abs(x).max(1)
        g = np.where(amax == 0, F32(1), np.minimum(F32(2688) / np.where(amax == 0, F32(1), amax), FLT_MAX))
        g = g.astype(F32)
        d = (F32(1) / g).astype(F32)
    codes, sbyte = oracle_rows(x, g)
    return codes, sbyte, d, g


def _unpack(packed: torch.Tensor) -> np.ndarray:
    p = packed.numpy()
    return np.stack((p & 0xF, p >> 4), -1).reshape(p.shape[0], -1)


def _check_against_oracle(x: torch.Tensor) -> None:
    codes, scale, d, g = quantize_nvfp4_pertoken(x)
    o_codes, o_scale, o_d, o_g = oracle(x.float().numpy())
    np.testing.assert_array_equal(_unpack(codes), o_codes)
    np.testing.assert_array_equal(scale.view(torch.uint8).numpy(), o_scale)
    np.testing.assert_array_equal(d.numpy().view(np.int32), o_d.view(np.int32))
    np.testing.assert_array_equal(g.numpy().view(np.int32), o_g.view(np.int32))


def _bf16(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)


# every finite bf16 bit pattern: exponent field not all ones (65,280 of them)
_ALL = np.arange(1 << 16, dtype=np.int64)
FINITE_BF16 = _ALL[(_ALL & 0x7F80) != 0x7F80]


def test_oracle_constants():
    assert F32(1.0 / 6.0).view(np.int32) == 0x3E2AAAAB
    # FlashInfer's exact mode inverts the fp32 constant 1/2688 it is passed: the round trip is exact
    assert F32(1) / (F32(1) / F32(2688)) == F32(2688)
    assert np.float32(PERTOKEN_INV6).view(np.int32) == 0x3E2AAAAB
    assert E4M3[-1] == 448.0 and E4M3[1] == 2.0**-9 and len(E4M3) == 127


def test_all_bf16_values_as_row_maxima():
    """Rows of 16 consecutive bf16 patterns: each row one block, every finite bf16 value in some row."""
    x = _bf16(FINITE_BF16.reshape(-1, 16))
    _check_against_oracle(x)


@pytest.mark.parametrize(
    "context_bits",
    [0x0000, 0x3F80, 0x4528, 0x7F7F, 0x0001, 0x0080, 0x43E0],
    ids=["zero", "one", "2688", "bf16-max", "min-subnormal", "min-normal", "448"],
)
def test_all_bf16_values_beside_a_context_block(context_bits):
    """[16 consecutive bf16 patterns | a block of one repeated value]: the row max (and so g) is set by
    whichever block is larger, so every value is also quantized under a foreign scale: blocks whose
    decode scale underflows E4M3 (0x00), the FLT_MAX clamp of g (subnormal maxima), the 448 clamp."""
    vals = FINITE_BF16.reshape(-1, 16)
    ctx = np.full_like(vals, context_bits)
    x = _bf16(np.concatenate([vals, ctx], 1))
    _check_against_oracle(x)


def test_random_rows_against_oracle():
    gen = torch.Generator().manual_seed(17)
    x = (torch.randn(64, 256, generator=gen) * torch.exp2(torch.randint(-20, 20, (64, 1), generator=gen))).to(
        torch.bfloat16
    )
    x[3, 77] = 3.0e38  # one huge outlier
    x[5] = 0.0
    _check_against_oracle(x)
    _check_against_oracle(x.float() * 1.000001)  # fp32 input (an FC2 activation row)


# ------------------------------------------------------------------------------------------------------
# TransformerEngine 2.20.2's row-scaled NVFP4 reference, run on the CPU
# ------------------------------------------------------------------------------------------------------

TE_VERSION = "2.20.2"


def _te_reference_module() -> types.ModuleType:
    """``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py`` of the installed (pure-Python) wheel,
    loaded from its file: the package ``__init__`` files load CUDA libraries, so they are not executed;
    ``reference_utils`` and ``gemm`` are TransformerEngine's own files, the framework base classes
    (``quantized_tensor``) and ``tensor.utils.is_custom`` are stand-ins the row-scaled quantizer never calls."""
    spec = importlib.util.find_spec("transformer_engine")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("transformer-engine is not installed (oracle extra)")
    if metadata.version("transformer_engine") != TE_VERSION:
        pytest.skip(f"transformer-engine {metadata.version('transformer_engine')} installed, oracle pins {TE_VERSION}")
    root = Path(list(spec.submodule_search_locations)[0]) / "pytorch" / "custom_recipes"
    names = [
        "transformer_engine",
        "transformer_engine.pytorch",
        "transformer_engine.pytorch.custom_recipes",
        "transformer_engine.pytorch.tensor",
        "transformer_engine.pytorch.tensor.utils",
        "transformer_engine.pytorch.quantized_tensor",
        "transformer_engine.pytorch.custom_recipes.reference_utils",
        "transformer_engine.pytorch.custom_recipes.gemm",
    ]
    saved = {n: sys.modules.get(n) for n in names}
    try:
        for n in names[:4]:
            sys.modules[n] = types.ModuleType(n)
            sys.modules[n].__path__ = []
        tu = sys.modules[names[4]] = types.ModuleType(names[4])
        tu.is_custom = lambda *args, **kwargs: False
        qt = sys.modules[names[5]] = types.ModuleType(names[5])
        qt.QuantizedTensorStorage = type("QuantizedTensorStorage", (), {})
        qt.Quantizer = type("Quantizer", (), {})
        loaded = []
        for n, f in ((names[6], "reference_utils.py"), (names[7], "gemm.py")):  # TransformerEngine's own files
            spec_n = importlib.util.spec_from_file_location(n, root / f)
            mod = sys.modules[n] = importlib.util.module_from_spec(spec_n)
            spec_n.loader.exec_module(mod)
            loaded.append(mod)
        ru, gemm = loaded
        sys.modules[names[2]].gemm, sys.modules[names[2]].reference_utils = gemm, ru
        ref_spec = importlib.util.spec_from_file_location("te_reference_nvfp4", root / "reference_nvfp4.py")
        ref = importlib.util.module_from_spec(ref_spec)
        ref_spec.loader.exec_module(ref)
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return ref


def _te_row_scaled(ref: types.ModuleType, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """TE's 1x16 row-scaled quantizer: ``NVFP4QuantizerRef._quantize_blockwise_reference`` with the row
    amax (as its ``_quantize`` computes it) -> (unpacked codes [M, K], scale bytes [M, K/16])."""
    amax = torch.max(torch.abs(x), dim=1).values.to(torch.float32)
    packed, scale = ref.NVFP4QuantizerRef._quantize_blockwise_reference(
        x, amax, 16, 1, pow_2_scales=False, row_scaled_nvfp4=True, eps=0.0
    )
    return _unpack(packed), scale.view(torch.uint8).numpy()


@pytest.mark.oracle
def test_bit_identical_to_transformer_engine_row_scaled_reference():
    """Every finite bf16 value, alone in its row and beside the context blocks above, plus random rows with
    an outlier and a zero row: codes and block-scale bytes equal TransformerEngine's bit for bit (its zero row
    uses g = FLT_MAX, the rule g = 1: the codes and scale bytes agree there too)."""
    ref = _te_reference_module()
    vals = FINITE_BF16.reshape(-1, 16)
    cases = [_bf16(vals)]
    for ctx in (0x0000, 0x3F80, 0x4528, 0x7F7F, 0x0001, 0x0080, 0x43E0):
        cases.append(_bf16(np.concatenate([vals, np.full_like(vals, ctx)], 1)))
    gen = torch.Generator().manual_seed(1)
    rnd = (torch.randn(512, 256, generator=gen) * torch.exp2(torch.randint(-30, 30, (512, 1), generator=gen))).to(
        torch.bfloat16
    )
    rnd[7, 100], rnd[9] = 3.0e38, 0.0
    cases.append(rnd)
    for x in cases:
        codes, scale, _, _ = quantize_nvfp4_pertoken(x)
        te_codes, te_scale = _te_row_scaled(ref, x)
        np.testing.assert_array_equal(_unpack(codes), te_codes)
        np.testing.assert_array_equal(scale.view(torch.uint8).numpy(), te_scale)


# ------------------------------------------------------------------------------------------------------
# hand-derived rows
# ------------------------------------------------------------------------------------------------------

TIES = [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, -0.0]


def test_e2m1_ties_with_unit_scales():
    """amax = 2688 (exact) -> g = 2688/2688 = 1, d = 1. Block 0 has bamax 6: RN(6 * RN32(1/6)) =
    RN(1 + 2^-25.4...) = 1.0 (within half an ulp of 1) -> S = 1.0 (0x38), e = 1/RN(1 * 1) = 1, so q = x and
    the E2M1 ties show directly: 0.25 -> 0, 0.75 -> 1 (code 2), 1.25 -> 1 (2), 1.75 -> 2 (4), 2.5 -> 2 (4),
    3.5 -> 4 (6), 5 -> 4 (6); negatives set bit 3 (-0.25 -> 8: q < 0 though it rounds to zero), -0.0 -> 0.
    Block 1 = [2688, 0 x 15]: RN(2688 * RN32(1/6)) = 448.0000134 -> RN32 448 (half ulp 2^-16) -> S = 448
    (0x7E); e = RN(1/448); q = RN(2688 * RN(1/448)) = 6.0000005 -> saturates to 6 (code 7)."""
    x = torch.tensor([TIES + [2688.0] + [0.0] * 15], dtype=torch.bfloat16)
    codes, scale, d, g = quantize_nvfp4_pertoken(x)
    assert float(g[0]) == 1.0 and float(d[0]) == 1.0
    assert scale.view(torch.uint8).tolist() == [[0x38, 0x7E]]
    assert _unpack(codes)[0].tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 0, 7] + [0] * 15


def test_all_zero_row():
    """amax 0 -> g = 1, d = 1; every block amax 0 -> S = E4M3(0) = 0x00, e = min(1/0, FLT_MAX) = FLT_MAX,
    q = 0 * FLT_MAX = 0: codes 0."""
    codes, scale, d, g = quantize_nvfp4_pertoken(torch.zeros(2, 32, dtype=torch.bfloat16))
    assert g.tolist() == [1.0, 1.0] and d.tolist() == [1.0, 1.0]
    assert scale.view(torch.uint8).tolist() == [[0, 0], [0, 0]]
    assert codes.tolist() == [[0] * 16] * 2
    # -0.0 everywhere: still code 0 (q = -0.0 * 0 is not < 0)
    codes, scale, _, _ = quantize_nvfp4_pertoken(torch.full((1, 16), -0.0, dtype=torch.bfloat16))
    assert codes.tolist() == [[0] * 8] and scale.view(torch.uint8).tolist() == [[0]]


def test_single_huge_outlier():
    """x[0] = bf16 max 3.3895e38, the other 31 values 1.0. g = RN(2688 / 3.3895e38) ~ 7.93e-36; block 1
    (bamax 1): RN(1 * RN(g / 6)) ~ 1.3e-36, far below half the smallest E4M3 subnormal (2^-10) -> S = 0 (the
    block decodes to zero) -> e = min(1/0, FLT_MAX) = FLT_MAX -> q = FLT_MAX: the ones saturate to code 7.
    Block 0: RN(3.3895e38 * RN(g * RN32(1/6))) is 448 within a few ulps -> S = 448 (0x7E); the outlier's q is
    6 within an ulp -> code 7, the ones there (q ~ 1.8e-38) -> 0."""
    x = torch.ones(1, 32, dtype=torch.bfloat16)
    x[0, 0] = torch.finfo(torch.bfloat16).max
    codes, scale, d, g = quantize_nvfp4_pertoken(x)
    assert scale.view(torch.uint8).tolist() == [[0x7E, 0x00]]
    assert _unpack(codes)[0].tolist() == [7] + [0] * 15 + [7] * 16
    amax = torch.tensor(torch.finfo(torch.bfloat16).max, dtype=torch.float32)
    assert float(g[0]) == float(torch.tensor(2688.0) / amax)
    assert float(d[0]) == float(torch.tensor(1.0) / g[0])
    assert dequantize_nvfp4_rows(codes, scale)[0, 16:].abs().max().item() == 0.0


def test_e4m3_clamp_at_448_and_the_flt_max_clamp_of_g():
    """pertoken_global_scale: 0 -> 1; 2688 -> 1; 6 -> 448; the smallest bf16 subnormal 2^-133: 2688 * 2^133
    overflows fp32 -> FLT_MAX. A block of amax 2688 under g = 1 gives pre-scale 448.0000134 > 448 -> 0x7E."""
    amax = torch.tensor([0.0, 2688.0, 6.0, 2.0**-133], dtype=torch.float32)
    assert pertoken_global_scale(amax).tolist() == [1.0, 1.0, 448.0, float(torch.finfo(torch.float32).max)]
    _, scale = quantize_nvfp4_rows(torch.tensor([[2688.0] * 16]), torch.tensor([1.0]))
    assert scale.view(torch.uint8).tolist() == [[0x7E]]


def test_block_scale_association_where_sources_disagree():
    """P3 multiplies RN(g * RN32(1/6)) by the block amax (TransformerEngine, FlashInfer's exact kernel);
    FlashInfer's test reference computes RN(g * RN(bamax * RN32(1/6))). Row amax 46, block amax 34.5:
    g = RN(2688/46) = 58.434784; RN(34.5 * RN(g/6)) = 336.00003, just above the E4M3 tie 336 between 320
    and 352 -> 352 (0x7B). The other association gives exactly 336, a tie to the even 320 (0x7A)."""
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    x[0, 0], x[0, 16] = 46.0, 34.5
    _, scale, _, g = quantize_nvfp4_pertoken(x)
    assert float(g[0]) == 58.434783935546875
    assert scale.view(torch.uint8).tolist() == [[0x7E, 0x7B]]


def test_encode_scale_form_where_sources_disagree():
    """P4 is div_rn(1, RN(S * d)) (FlashInfer); TransformerEngine divides div_rn(g, S). Row amax 52:
    g = RN(2688/52) = 51.692307 (0x424EC4EC), d = RN(1/g). Block [6.5, 0.8125, 0 ...]: S = RN(6.5 * RN(g/6))
    -> 56 (0x66). e = RN(1/RN(56 d)) = 0.92307687 and q = RN(0.8125 e) = 0.74999994 -> 0.5 (code 1);
    TransformerEngine's e = RN(g/56) = 0.92307693 gives q = 0.75, a tie to 1.0 (code 2). 6.5 -> 6 (code 7)."""
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    x[0, 0], x[0, 16], x[0, 17] = 52.0, 6.5, 0.8125
    codes, scale, _, g = quantize_nvfp4_pertoken(x)
    assert float(g[0]) == 51.69230651855469
    assert scale.view(torch.uint8).tolist() == [[0x7E, 0x66]]
    assert int(codes[0, 8]) == 0x17  # low nibble: 6.5 -> code 7; high nibble: 0.8125 -> code 1


def test_dequantize_is_exact_and_bf16():
    """The tie row alone: amax 6 -> g = 2688/6 = 448, d = RN(1/448). P3: RN(448 * RN32(1/6)) = 74.666669,
    times 6 rounds to 448 -> S = 448 (0x7E). P4: RN(448 * RN(1/448)) = RN(7 * RN32(1/7)) = RN(1 + 4.5e-8) = 1
    -> e = 1, q = x: the codes of the ties test. Decoding gives E2M1 value x 448, exactly, in bf16."""
    x = torch.tensor([TIES], dtype=torch.bfloat16)
    codes, scale, d, g = quantize_nvfp4_pertoken(x)
    assert float(g[0]) == 448.0 and scale.view(torch.uint8).tolist() == [[0x7E]]
    assert _unpack(codes)[0].tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 8, 10, 10, 12, 12, 14, 14, 0]
    w = dequantize_nvfp4_rows(codes, scale)
    assert w.dtype == torch.bfloat16
    want = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0, 0.0]
    assert w[0].float().tolist() == [v * 448.0 for v in want]


# ------------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------------


def test_bad_input_names_the_tensor():
    with pytest.raises(TypeError, match="x: dtype"):
        quantize_nvfp4_pertoken(torch.zeros(1, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="x: row length K"):
        quantize_nvfp4_pertoken(torch.zeros(1, 24, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="x: expected 2 dimensions"):
        quantize_nvfp4_pertoken(torch.zeros(16, dtype=torch.bfloat16))
    bad = torch.zeros(2, 16, dtype=torch.bfloat16)
    bad[1, 3] = float("inf")
    with pytest.raises(ValueError, match=r"x: non-finite value inf at index \(1, 3\)"):
        quantize_nvfp4_pertoken(bad)
    with pytest.raises(ValueError, match="g: must be finite and > 0"):
        quantize_nvfp4_rows(torch.zeros(1, 16), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="amax: must be finite and >= 0"):
        pertoken_global_scale(torch.tensor([-1.0]))
    with pytest.raises(ValueError, match=r"block_scale: E4M3 NaN scale byte 0x7F at index \(0, 0\)"):
        dequantize_nvfp4_rows(torch.zeros(1, 8, dtype=torch.uint8), torch.tensor([[0x7F]], dtype=torch.uint8))
