"""Tests of flint_moe.reference.mufu: bit-exact emulation of rcp/ex2/rsqrt.approx.ftz.f32 and libdevice expf.

CPU tests use the committed tables (captured on the H200); the exhaustive proof is the GPU verify report
(reports/gpu/mufu-verify.txt). The ``gpu`` test compares against the hardware probes on a random sample.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from flint_moe.reference import mufu

META = json.loads(mufu.DEFAULT_TABLES.with_suffix(".json").read_text())
TINY = 2.0**-126
INF = float("inf")


def f32(*vals: float) -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.float32)


def from_bits(*b: int) -> torch.Tensor:
    return torch.tensor(np.array(b, dtype=np.uint32).view(np.int32)).view(torch.float32)


def bits(t: torch.Tensor) -> list[int]:
    return [v & 0xFFFFFFFF for v in t.contiguous().view(torch.int32).flatten().tolist()]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN compared as NaN-ness."""
    an, bn = torch.isnan(a), torch.isnan(b)
    return bool(torch.equal(an, bn)) and bool(torch.equal(a.view(torch.int32)[~an], b.view(torch.int32)[~bn]))


def random_f32(n: int, seed: int) -> torch.Tensor:
    g = np.random.default_rng(seed)
    return torch.from_numpy(
        g.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.int32)
    ).view(torch.float32)


# ------------------------------------------------------------------------------------------------------------
# module hygiene


def test_reference_mufu_never_imports_triton() -> None:
    src = Path(mufu.__file__).read_text()
    assert not re.search(r"^\s*(import|from)\s+triton", src, re.M)
    code = "\n".join(
        [
            "import sys, importlib.util",
            f"spec = importlib.util.spec_from_file_location('m', {str(mufu.__file__)!r})",
            "import flint_moe.reference._checks",
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)",
            "m.rcp_approx_ftz(__import__('torch').ones(4))",
            "assert 'triton' not in sys.modules, 'triton imported'",
        ]
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------------------------------
# tables


def test_table_file_integrity() -> None:
    data = mufu.DEFAULT_TABLES.read_bytes()
    assert hashlib.sha256(data).hexdigest() == META["npz_sha256"]
    assert len(data) == META["npz_bytes"] < 16 * 2**20
    assert META["simulated"] is False
    assert "H200" in META["environment"]["gpu"]
    with np.load(mufu.DEFAULT_TABLES, allow_pickle=False) as z:
        shapes = {k: z[k].shape for k in z.files}
        assert z["rcp_delta"].dtype == np.uint8
    assert shapes["rcp_delta"] == (2**21,)
    assert shapes["rsqrt_delta"] == (2**22,)
    assert shapes["ex2_pos_delta"] == shapes["ex2_neg_delta"] == (2**21,)
    assert {k: list(v) for k, v in shapes.items()} == {k: v["shape"] for k, v in META["arrays"].items()}


def _deltas(name: str) -> np.ndarray:
    with np.load(mufu.DEFAULT_TABLES, allow_pickle=False) as z:
        return mufu.unpack_deltas(z[f"{name}_delta"])


def _counts(d: np.ndarray) -> dict[int, int]:
    v, c = np.unique(d, return_counts=True)
    return {int(a): int(b) for a, b in zip(v, c, strict=False)}


def test_delta_counts_match_notes_and_json() -> None:
    pos = _counts(_deltas("ex2_pos"))
    assert pos[-1] == 3_093 and pos[1] == 3_259_640  # gpu-numerics.md
    assert set(pos) == {-1, 0, 1}
    neg = _counts(_deltas("ex2_neg"))
    assert {k: v for k, v in neg.items() if k != 0} == {-2: 86_537, -1: 4_959_061, 1: 75}  # gpu-numerics.md
    # captured on the H200 (mufu_tables.json); the notes give only the value sets
    rcp = _counts(_deltas("rcp"))
    assert {k: v for k, v in rcp.items() if k != 0} == {-1: 374_723, 1: 733_799}
    rsq = _counts(_deltas("rsqrt"))
    assert {k: v for k, v in rsq.items() if k != 0} == {-2: 8, -1: 2_344_391, 1: 1_289_731}
    for name in ("rcp", "rsqrt", "ex2_pos", "ex2_neg"):
        assert {str(k): v for k, v in _counts(_deltas(name)).items()} == META["deltas"][name]


def test_pack_roundtrip_and_range() -> None:
    d = np.random.default_rng(1).integers(-2, 2, size=4096)
    p = mufu.pack_deltas(d)
    assert p.shape == (1024,) and p.dtype == np.uint8
    assert np.array_equal(mufu.unpack_deltas(p), d)
    assert mufu.pack_deltas(np.array([-2, -1, 0, 1]))[0] == 0 | (1 << 2) | (2 << 4) | (3 << 6)
    with pytest.raises(ValueError, match="delta"):
        mufu.pack_deltas(np.array([0, 0, 2, 0]))


# ------------------------------------------------------------------------------------------------------------
# rcp.approx.ftz.f32


def test_rcp_hand_examples() -> None:
    x = f32(1.0, 2.0, 0.5, -4.0, 2.0**126, 2.0**-126, 2.0**127)
    assert bits(mufu.rcp_approx_ftz(x)) == bits(f32(1.0, 0.5, 2.0, -0.25, 2.0**-126, 2.0**126, 0.0))


def test_rcp_special_and_ftz() -> None:
    big = 2.0**126 * (1 + 2.0**-23)  # 1/big < 2^-126: flushed, sign kept
    x = f32(0.0, -0.0, 1e-40, -1e-40, INF, -INF, big, -big, float("nan"))
    y = mufu.rcp_approx_ftz(x)
    assert bits(y[:8]) == bits(f32(INF, -INF, INF, -INF, 0.0, -0.0, 0.0, -0.0))
    assert torch.isnan(y[8])


def test_rcp_symmetry_and_exponent_structure() -> None:
    x = random_f32(1 << 16, 2)
    y = mufu.rcp_approx_ftz(x)
    assert same(mufu.rcp_approx_ftz(-x), -y)
    # normal x with normal results: scaling x by 2 halves the result exactly
    m = x.abs()
    ok = (m >= 2.0**-125) & (m < 2.0**125)
    assert same(mufu.rcp_approx_ftz(m[ok] * 2), mufu.rcp_approx_ftz(m[ok]) / 2)
    # every result is within 1 ulp of the correctly rounded 1/x (normal range)
    d = (mufu.rcp_approx_ftz(m[ok]).view(torch.int32) - mufu.rcp_rn(m[ok]).view(torch.int32)).abs()
    assert int(d.max()) == 1


# ------------------------------------------------------------------------------------------------------------
# ex2.approx.ftz.f32


def test_ex2_hand_examples() -> None:
    k = torch.arange(-126, 128, dtype=torch.float32)
    assert bits(mufu.ex2_approx_ftz(k)) == bits(torch.exp2(k.double()).float())  # integers are exact
    x = f32(
        0.0, -0.0, 1.0, -1.0, -126.0, -126.5, -127.0, 128.0, 1e30, -1e30, INF, -INF, 1e-40, -1e-40, 2.0**-24
    )
    want = f32(1.0, 1.0, 2.0, 0.5, TINY, 0.0, 0.0, INF, INF, 0.0, INF, 0.0, 1.0, 1.0, 1.0)
    assert bits(mufu.ex2_approx_ftz(x)) == bits(want)
    assert torch.isnan(mufu.ex2_approx_ftz(f32(float("nan"), -float("nan")))).all()


def test_ex2_truncation_and_integer_part() -> None:
    # fractions with 16 bits, so that f + 127 is still exact in fp32
    j = torch.from_numpy(np.random.default_rng(3).integers(0, 1 << 16, size=4096)).to(torch.float32)
    f = j * 2.0**-16
    tp, tn = mufu.ex2_approx_ftz(f), mufu.ex2_approx_ftz(-f)
    assert same(mufu.ex2_approx_ftz(f + 5), tp * 32)
    assert same(mufu.ex2_approx_ftz(-(f + 3)), tn / 8)
    # 0.1f = 13421773 * 2^-27 is truncated to 838860 * 2^-23
    assert same(mufu.ex2_approx_ftz(f32(0.1)), mufu.ex2_approx_ftz(f32(838860 * 2.0**-23)))
    assert same(mufu.ex2_approx_ftz(f32(-0.1)), mufu.ex2_approx_ftz(f32(-838860 * 2.0**-23)))
    # 2^(127 + f) overflows iff T_pos[j] * 2^127 does; 2^-(126 + f) survives only for T_neg[j] = 1
    big = mufu.ex2_approx_ftz(127 + f)
    assert same(big, tp * 2.0**127)


# ------------------------------------------------------------------------------------------------------------
# rsqrt.approx.ftz.f32


def test_rsqrt_hand_examples() -> None:
    x = f32(1.0, 4.0, 0.25, 2.0**-126, 2.0**126)
    assert bits(mufu.rsqrt_approx_ftz(x)) == bits(f32(1.0, 0.5, 2.0, 2.0**63, 2.0**-63))
    x = f32(0.0, -0.0, 1e-40, -1e-40, INF, -1.0, -INF, float("nan"), -(2.0**-126))
    y = mufu.rsqrt_approx_ftz(x)
    assert bits(y[:5]) == bits(f32(INF, -INF, INF, -INF, 0.0))
    assert torch.isnan(y[5:]).all()


def test_rsqrt_exponent_structure() -> None:
    m = random_f32(1 << 16, 4).abs()
    m = m[(m >= 2.0**-124) & (m < 2.0**124)]
    y = mufu.rsqrt_approx_ftz(m)
    assert same(mufu.rsqrt_approx_ftz(m * 4), y / 2)
    d = mufu.rsqrt_approx_ftz(m).view(torch.int32) - mufu.rsqrt_rn(m).view(torch.int32)
    assert set(torch.unique(d).tolist()) <= {-2, -1, 0, 1}


# ------------------------------------------------------------------------------------------------------------
# libdevice expf


def test_expf_notes_example() -> None:
    # gpu-numerics.md: e^(6.19e-8) gives 1.0 where the correctly rounded value is 1 + 2^-23.
    x = f32(133 * 2.0**-31)  # 6.1933e-8, a bf16 value (133 = 1.0000101b * 2^7)
    assert float(x) == pytest.approx(6.19e-8, rel=1e-3)
    assert bits(mufu.exp_rn(x)) == bits(f32(1 + 2.0**-23))
    assert bits(mufu.expf_libdevice(x)) == bits(f32(1.0))
    assert bits(mufu.expf_libdevice(x.to(torch.bfloat16))) == bits(f32(1.0))


def test_expf_special_values_and_dtypes() -> None:
    y = mufu.expf_libdevice(f32(0.0, -0.0, INF, -INF, 89.0, -120.0))
    assert bits(y) == bits(f32(1.0, 1.0, INF, 0.0, INF, 0.0))
    assert torch.isnan(mufu.expf_libdevice(f32(float("nan"))))
    with pytest.raises(ValueError, match="^x: .*bf16"):
        mufu.expf_libdevice(f32(0.1))
    with pytest.raises(TypeError, match="^x: "):
        mufu.expf_libdevice(torch.zeros(2, dtype=torch.float64))
    allbf = mufu.canonical_inputs("expf")
    assert same(mufu.expf_libdevice(allbf), mufu.expf_libdevice(allbf.to(torch.bfloat16)))


def test_expf_exception_counts() -> None:
    e = META["expf"]
    with np.load(mufu.DEFAULT_TABLES, allow_pickle=False) as z:
        idx, hw = z["expf_exception_index"], z["expf_exception_bits"]
    assert e["exceptions"] == idx.size
    x = mufu.canonical_inputs("expf")[torch.from_numpy(idx)]
    base = mufu.exp_rn(x)
    d = torch.from_numpy(hw.view(np.int32)).to(torch.int64) - base.view(torch.int32).to(torch.int64)
    # gpu-numerics.md: 2,372 results off correctly rounded e^x, 1,528 above and 844 below. Measured: all are
    # 1 ulp off except e^42.25, 2 ulp above; none has a subnormal result (libdevice keeps those, rounded
    # correctly).
    assert int((base.abs() >= TINY).sum()) == 2_372 == idx.size
    assert {int(k): int(v) for k, v in zip(*torch.unique(d, return_counts=True), strict=False)} == {
        -1: 844,
        1: 1_527,
        2: 1,
    }
    assert float(x[d == 2]) == 42.25
    assert e["subnormal_results_kept_by_hw"] == 33 and e["exceptions_subnormal_or_zero_base"] == 0


# ------------------------------------------------------------------------------------------------------------
# correctly rounded bases vs exact arithmetic


def _neighbours(r: float) -> tuple[Fraction, Fraction, Fraction]:
    a = np.float32(r)
    up = np.nextafter(a, np.float32(INF))
    dn = np.nextafter(a, np.float32(-INF))
    up_f = Fraction(2**128) if np.isinf(up) else Fraction(float(up))
    return Fraction(float(dn)), Fraction(float(a)), up_f


def test_rcp_rn_exact_sample() -> None:
    x = random_f32(3000, 5)
    x = x[torch.isfinite(x) & (x != 0)]
    y = mufu.rcp_rn(x)
    for xi, yi in zip(x.tolist(), y.tolist(), strict=False):
        v = 1 / Fraction(xi)
        if abs(v) > Fraction(float(np.finfo(np.float32).max)) or yi == 0:
            continue
        dn, r, up = _neighbours(yi)
        assert (dn + r) / 2 < v < (r + up) / 2 or (dn + r) / 2 > v > (r + up) / 2


def _override_inputs(key: str) -> np.ndarray:
    with np.load(mufu.DEFAULT_TABLES, allow_pickle=False) as z:
        return z[key]


def test_rsqrt_rn_exact_sample_and_overrides() -> None:
    x = random_f32(2000, 6).abs()
    x = x[torch.isfinite(x) & (x > 0)]
    canon = mufu.canonical_inputs("rsqrt")
    ov = torch.from_numpy(_override_inputs("rsqrt_override_index"))
    assert ov.numel() > 0
    x = torch.cat([x, canon[ov], canon[ov] * 2.0**40, canon[ov] * 2.0**-140])
    y = mufu.rsqrt_rn(x)
    for xi, yi in zip(x.tolist(), y.tolist(), strict=False):
        dn, r, up = _neighbours(yi)
        lo, hi = (dn + r) / 2, (r + up) / 2  # exact: lo < 1/sqrt(x) < hi  <=>  lo^2 x < 1 < hi^2 x
        assert lo * lo * Fraction(xi) < 1 < hi * hi * Fraction(xi), xi


def _decimal_between(v: Decimal, r: float) -> bool:
    dn, rr, up = _neighbours(r)
    lo = (
        Decimal(dn.numerator) / Decimal(dn.denominator) / 2
        + Decimal(rr.numerator) / Decimal(rr.denominator) / 2
    )
    hi = (
        Decimal(up.numerator) / Decimal(up.denominator) / 2
        + Decimal(rr.numerator) / Decimal(rr.denominator) / 2
    )
    return lo < v < hi


def test_exp2_rn_exact_sample_and_overrides() -> None:
    k = np.random.default_rng(7).integers(-(1 << 23) + 1, 1 << 23, size=600)
    k = np.concatenate([k, _override_inputs("exp2_override_index")])
    assert _override_inputs("exp2_override_index").size > 0
    x = torch.from_numpy(k.astype(np.float32)) * 2.0**-23
    y = mufu.exp2_rn(x)
    with localcontext() as ctx:
        ctx.prec = 80
        ln2 = Decimal(2).ln()
        for xi, yi in zip(x.tolist(), y.tolist(), strict=False):
            assert _decimal_between((Decimal(xi) * ln2).exp(), yi), xi
    with pytest.raises(ValueError, match="^x: "):
        mufu.exp2_rn(f32(0.1))


def test_exp_rn_exact_sample_and_overrides() -> None:
    allbf = mufu.canonical_inputs("expf")
    ov = _override_inputs("exp_override_index")
    pick = np.concatenate([np.random.default_rng(8).integers(0, 1 << 16, size=1500), ov])
    x = allbf[torch.from_numpy(pick)]
    x = x[torch.isfinite(x)]
    y = mufu.exp_rn(x)
    with localcontext() as ctx:
        ctx.prec = 80
        for xi, yi in zip(x.tolist(), y.tolist(), strict=False):
            if xi > 89:
                assert yi == INF, xi
                continue
            if xi < -104:
                assert yi == 0, xi
                continue
            v = Decimal(xi).exp()
            if yi == INF:
                assert v > Decimal(2**128 - 2**103)
            elif yi == 0:
                assert v < Decimal(2) ** -150
            else:
                assert _decimal_between(v, yi), xi


def test_override_lists_cover_every_near_midpoint_input() -> None:
    """Each canonical input whose CPU f64 value is within OVERRIDE_MARGIN ulp of a midpoint is overridden."""

    def near(v: np.ndarray) -> np.ndarray:
        r32 = v.astype(np.float32)
        r = r32.astype(np.float64)
        up = np.nextafter(r32, np.float32(INF)).astype(np.float64)
        dn = np.nextafter(r32, np.float32(-INF)).astype(np.float64)
        m = mufu.OVERRIDE_MARGIN
        ok = np.isfinite(v) & np.isfinite(r) & np.isfinite(up)
        with np.errstate(invalid="ignore"):
            return ok & (
                (np.abs(v - (r + up) / 2) < m * (up - r)) | (np.abs(v - (r + dn) / 2) < m * (r - dn))
            )

    c = mufu.canonical_inputs("rsqrt").double()
    cand = np.flatnonzero(near((1.0 / torch.sqrt(c)).numpy()))
    assert set(cand) <= set(_override_inputs("rsqrt_override_index").tolist())
    k = np.arange(-(1 << 23) + 1, 1 << 23)
    cand = k[near(torch.exp2(torch.from_numpy(k * 2.0**-23)).numpy())]
    assert set(cand.tolist()) <= set(_override_inputs("exp2_override_index").tolist())
    allbf = mufu.canonical_inputs("expf").double()
    with np.errstate(over="ignore"):
        cand = np.flatnonzero(near(torch.exp(allbf).numpy()))
    assert set(cand.tolist()) <= set(_override_inputs("exp_override_index").tolist())


# ------------------------------------------------------------------------------------------------------------
# emulation logic against a synthetic all-zero-delta table (exponent arithmetic and specials, hardware-free)


@pytest.fixture()
def zero_delta_tables(tmp_path: Path):
    with np.load(mufu.DEFAULT_TABLES, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for name in ("rcp", "rsqrt", "ex2_pos", "ex2_neg"):
        arrays[f"{name}_delta"] = np.full_like(arrays[f"{name}_delta"], 0xAA)  # code 2 = delta 0
    arrays["expf_exception_index"] = arrays["expf_exception_index"][:0]
    arrays["expf_exception_bits"] = arrays["expf_exception_bits"][:0]
    p = tmp_path / "zero.npz"
    np.savez_compressed(p, **arrays)
    mufu.use_tables(p)
    yield
    mufu.use_tables(None)


def _ftz(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v.abs() < TINY, torch.copysign(torch.zeros_like(v), v), v)


def test_zero_delta_model_equals_ftz_correct_rounding(zero_delta_tables) -> None:
    x = torch.cat([random_f32(1 << 18, 9), f32(0.0, -0.0, INF, -INF, 2.0**126, 2.0**127, 3 * 2.0**125)])
    xf = _ftz(x)
    want_rcp = _ftz(torch.ones_like(xf) / xf)  # IEEE fp32 division; 1/(+-0) = +-inf
    assert same(mufu.rcp_approx_ftz(x), want_rcp)
    want_rsqrt = mufu.rsqrt_rn(xf)
    assert same(mufu.rsqrt_approx_ftz(x), want_rsqrt)
    assert same(
        mufu.expf_libdevice(mufu.canonical_inputs("expf")), mufu.exp_rn(mufu.canonical_inputs("expf"))
    )
    # ex2: 2^trunc23(x), flushed to +0 below 2^-126 (exact in f64: trunc23(x) has <= 31 bits)
    a = torch.trunc(xf.double().abs() * 2.0**23) * 2.0**-23
    a = torch.where(torch.isnan(xf), xf.double(), a)
    ip, fr = torch.floor(a), a - torch.floor(a)
    sign = torch.where(x.view(torch.int32) < 0, -1.0, 1.0).double()
    t = mufu.exp2_rn(torch.nan_to_num((sign * fr).float(), nan=0.0)).double()
    want = t * torch.exp2(sign * ip.clamp(max=300))
    want = torch.where(want >= 2.0**128, torch.full_like(want, INF), want)
    want = torch.where(want < TINY, torch.zeros_like(want), want)
    want = torch.where(torch.isnan(x), x.double(), want).float()
    assert same(mufu.ex2_approx_ftz(x), want)


# ------------------------------------------------------------------------------------------------------------
# API hygiene


@pytest.mark.parametrize("fn", [mufu.rcp_approx_ftz, mufu.ex2_approx_ftz, mufu.rsqrt_approx_ftz])
def test_inputs_untouched_shape_kept_and_dtype_checked(fn) -> None:
    x = random_f32(4096, 10).view(64, 64).t()  # non-contiguous
    x0 = x.clone()
    y = fn(x)
    assert torch.equal(x.view(torch.int32), x0.view(torch.int32))
    assert y.shape == x.shape and y.dtype == torch.float32
    assert same(y.contiguous().flatten(), fn(x.contiguous().flatten()))
    with pytest.raises(TypeError, match="^x: "):
        fn(x.double())


# ------------------------------------------------------------------------------------------------------------
# probes: PTX audit on the CPU, hardware comparison on a GPU


@pytest.mark.parametrize("name", ["rcp", "ex2", "rsqrt", "expf"])
def test_probe_ptx_has_the_instruction(name: str) -> None:
    import os
    import subprocess
    import sys

    from flint_moe.kernels.audit.probes import PROBE_INSTRUCTIONS

    # Compiled in a fresh process without TRITON_INTERPRET: the CPU test run sets it before triton is imported
    # (tests/conftest.py), and interpreter-mode kernels cannot be compiled to PTX.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = f"import sys; from flint_moe.kernels.audit.probes import probe_ptx; sys.stdout.write(probe_ptx({name!r}))"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ptx = proc.stdout
    assert PROBE_INSTRUCTIONS[name] in ptx
    assert "div.full" not in ptx and ".f64" not in ptx
    if name == "expf":
        assert "ex2.approx.f32" not in ptx  # the ftz variant of __nv_expf


@pytest.mark.gpu
def test_probes_match_emulation_on_gpu() -> None:
    from flint_moe.kernels.audit.probes import PROBES

    x = torch.cat([random_f32(1 << 22, 11), f32(0.0, -0.0, INF, -INF, float("nan"), 1e-40, -1e-40)]).cuda()
    for name, emu in (
        ("rcp", mufu.rcp_approx_ftz),
        ("ex2", mufu.ex2_approx_ftz),
        ("rsqrt", mufu.rsqrt_approx_ftz),
    ):
        assert same(PROBES[name](x).cpu(), emu(x).cpu()), name
        assert same(emu(x).cpu(), emu(x.cpu())), name  # the emulation gives the same bits on CPU and CUDA
    xb = mufu.canonical_inputs("expf", "cuda")
    assert same(PROBES["expf"](xb).cpu(), mufu.expf_libdevice(xb).cpu())
