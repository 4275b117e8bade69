"""Bit-exact emulation of four sm_90 special functions, in pure PyTorch (rule steps 3, 7 and 11).

Public functions (all device-agnostic: CPU or CUDA tensors of any shape, result on the input's device with
the input's shape, inputs never modified, vectorised):

- ``rcp_approx_ftz(x)``   PTX ``rcp.approx.ftz.f32``   (PTX ISA section 9.7.3, floating-point: "rcp")
- ``ex2_approx_ftz(x)``   PTX ``ex2.approx.ftz.f32``   (PTX ISA section 9.7.3, "ex2")
- ``rsqrt_approx_ftz(x)`` PTX ``rsqrt.approx.ftz.f32`` (PTX ISA section 9.7.3, "rsqrt")
- ``expf_libdevice(x)``   CUDA libdevice ``__nv_expf`` as Triton 3.6 links it (nvvm-reflect ftz=1), for
  inputs that are bf16 values (rule step 3 only ever feeds it widened bf16 logits)

and their correctly rounded bases ``rcp_rn``, ``rsqrt_rn``, ``exp2_rn``, ``exp_rn``.

Model (source: /work/shared/notes/gpu-numerics.md, "Measured on the project's H200"; verified on all 2^32
inputs on the H200 by ``python -m flint_moe.tools.mufu verify``, report ``reports/gpu/mufu-verify.txt``):

- Each instruction = a correctly rounded base evaluated on a small canonical domain + a table of ulp deltas
  (hardware bits minus base bits, as integers) + exponent arithmetic + ftz / special-case handling.
- rcp: for a normal x = (1.f) * 2^e the result is T[f] * 2^-e with T[f] = rcp_rn(1.f) + d_rcp[f]
  (2^23 entries, d in {-1, 0, +1}); rcp(-x) = -rcp(x); subnormal inputs are flushed
  (rcp(+-subnormal) = rcp(+-0) = +-inf), results below 2^-126 flush to sign-preserving zero,
  rcp(+-inf) = +-0, NaN -> NaN.
- rsqrt: x = c * 4^k with c in [1, 4); result = T[c] * 2^-k with T = rsqrt_rn(c) + d_rsqrt (2^24 entries:
  index = mantissa for c in [1, 2), 2^23 + mantissa for c in [2, 4); d in {-2, -1, 0, +1}).
  Negative x -> NaN, +-0 and +-subnormal -> +-inf, +inf -> +0, -inf -> NaN, NaN -> NaN.
- ex2: a = |x| truncated toward zero to 23 fraction bits (subnormal x counts as 0); ip = integer part,
  j = fraction index; result = T_pos[j] * 2^ip for x >= 0 (incl. +0), T_neg[j] * 2^-ip for x < 0
  (incl. -0), with T_pos[j] = exp2_rn(j 2^-23) + d_pos[j], T_neg[j] = exp2_rn(-j 2^-23) + d_neg[j];
  results below 2^-126 flush to +0, results >= 2^128 are +inf, NaN -> NaN (so +inf -> +inf, -inf -> +0).
- expf: exp_rn(x) (correctly rounded e^x) except at 2,372 of the 65,536 bf16 inputs, listed with the
  hardware's fp32 bits (measured on the H200: 844 are 1 ulp below, 1,527 are 1 ulp above, e^42.25 is
  2 ulp above). Subnormal results are NOT flushed: Triton's __nv_expf (ftz path) ends in a non-ftz
  ``mul.f32`` by 2^k, and the 33 bf16 inputs with results below 2^-126 all give the correctly rounded
  subnormal (tables' json, "expf"). This differs from flint-rule.md step 3's "results below 2^-126
  become 0"; it cannot change the rule's scores (1 + tiny = 1), and the emulation follows the hardware.

Correctly rounded bases and why they are bit-identical on CPU and CUDA:

- ``rcp_rn(x)`` is IEEE fp32 division ``1 / x`` (correctly rounded on both devices; no fp64 involved).
- ``rsqrt_rn(x)`` = RN32(1 / sqrt(f64(x))); both fp64 operations are IEEE (correctly rounded on both
  devices, so the f64 value, and hence its single rounding to fp32, is identical); error < 1.5 ulp64.
- ``exp2_rn`` / ``exp_rn`` = RN32(f64 libm exp2 / exp), error < 2 ulp64 on both devices' libms.
- Then an override list: every canonical-domain input whose f64 value (on CPU or on CUDA, at capture time)
  lies within ``OVERRIDE_MARGIN`` = 2^-20 fp32-ulp of an fp32 rounding midpoint is resolved exactly at
  table-build time (Python ``decimal``, 60 digits, nearest of three fp32 candidates, with a guard that the
  exact value is more than 1e-45 relative away from the midpoint; no ties are possible since these values
  are irrational, and for rsqrt a tie would need 1/m^2 to be dyadic) and its correct fp32 bits are stored
  with the tables. Outside that list an f64 value lies more than 2^-20 fp32-ulp = 512 ulp64 from every
  midpoint, so an f64 error below 2 ulp64 cannot change the rounding: RN32 is correct and the same on both
  devices. The verify command checks the bases bit for bit on CPU vs CUDA over every canonical input.
- fp64 -> fp32 conversion is one IEEE round-to-nearest-even (``Tensor.to(torch.float32)``), subnormals kept.

Tables: ``data/mufu_tables.npz`` (np.savez_compressed; deltas stored as 2-bit codes ``delta + 2``, four per
byte, element 4i in bits 0-1) with provenance in ``data/mufu_tables.json``; captured on the H200 by
``python -m flint_moe.tools.mufu capture``. They are expanded lazily, once per function and device.

Errors: ``TypeError`` when an argument is not a tensor of the accepted dtype; ``ValueError`` when
``expf_libdevice`` or ``exp_rn`` gets a value that is not a bf16 value, or ``exp2_rn`` one outside its
domain. Messages name the tensor.

This module imports torch, numpy and the standard library only (never triton).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import torch

from flint_moe.reference._checks import check_tensor

__all__ = [
    "rcp_approx_ftz",
    "ex2_approx_ftz",
    "rsqrt_approx_ftz",
    "expf_libdevice",
    "rcp_rn",
    "rsqrt_rn",
    "exp2_rn",
    "exp_rn",
    "OVERRIDE_MARGIN",
    "DEFAULT_TABLES",
    "use_tables",
    "tables_path",
    "pack_deltas",
    "unpack_deltas",
    "canonical_inputs",
]

#: An f64 base value within this many fp32-ulps of a rounding midpoint is resolved exactly (override list).
OVERRIDE_MARGIN = 2.0**-20
#: The committed tables.
DEFAULT_TABLES = Path(__file__).with_name("data") / "mufu_tables.npz"

_N23 = 1 << 23
_MANT = 0x7FFFFF
_SIGN = -(1 << 31)  # 0x80000000 as int32
_INF_BITS = 0x7F800000
_NAN_BITS = 0x7FC00000

_lock = threading.Lock()
_state: dict = {"path": DEFAULT_TABLES, "npz": None, "cache": {}}


# ------------------------------------------------------------------------------------------------------------
# table file handling


def use_tables(path: str | Path | None = None) -> Path:
    """Select the ``.npz`` table file (``None``: the committed default), drop cached expansions; return it.

    Used by the capture/verify tool to check freshly captured tables before they are committed.
    """
    with _lock:
        _state["path"] = Path(path) if path is not None else DEFAULT_TABLES
        _state["npz"] = None
        _state["cache"] = {}
        return _state["path"]


def tables_path() -> Path:
    """The ``.npz`` file the emulation currently reads."""
    return _state["path"]


def _npz() -> dict[str, np.ndarray]:
    with _lock:
        if _state["npz"] is None:
            path = _state["path"]
            if not path.exists():
                raise FileNotFoundError(
                    f"mufu tables not found at {path}: "
                    "run `python -m flint_moe.tools.mufu capture` on the GPU"
                )
            with np.load(path, allow_pickle=False) as z:
                _state["npz"] = {k: z[k] for k in z.files}
        return _state["npz"]


def pack_deltas(delta: np.ndarray) -> np.ndarray:
    """Pack int deltas in {-2, -1, 0, +1} (length a multiple of 4) into uint8, 2-bit codes ``delta + 2``.

    Element 4i goes to bits 0-1 of byte i, 4i+1 to bits 2-3, etc. Raises ValueError for an out-of-range delta.
    """
    d = np.asarray(delta).astype(np.int64)
    if d.ndim != 1 or d.size % 4:
        raise ValueError(f"delta: expected a 1-D array with a multiple of 4 elements, got shape {d.shape}")
    if d.size and (d.min() < -2 or d.max() > 1):
        raise ValueError(f"delta: values must lie in {{-2, -1, 0, 1}}, got range [{d.min()}, {d.max()}]")
    c = (d + 2).astype(np.uint8).reshape(-1, 4)
    return (c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)).astype(np.uint8)


def unpack_deltas(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_deltas`: uint8 [n] -> int8 [4n] in {-2, -1, 0, +1}."""
    p = np.asarray(packed, dtype=np.uint8)
    c = np.stack([(p >> s) & 3 for s in (0, 2, 4, 6)], axis=1).reshape(-1)
    return c.astype(np.int8) - 2


# ------------------------------------------------------------------------------------------------------------
# helpers


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def _from_bits(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def _as_f32(name: str, x: object) -> torch.Tensor:
    return check_tensor(name, x, dtype=torch.float32)


def canonical_inputs(name: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """The fp32 inputs of a table's canonical domain, in table order.

    ``"rcp"``: 1 + j 2^-23 (2^23); ``"rsqrt"``: 1 + j 2^-23 then 2 + j 2^-22 (2^24);
    ``"ex2_pos"`` / ``"ex2_neg"``: +-j 2^-23 (2^23 each; ex2_neg[0] is -0.0); ``"expf"``: all 65,536 bf16
    bit patterns widened to fp32.
    """
    dev = torch.device(device)
    j = torch.arange(_N23, dtype=torch.int32, device=dev)
    if name == "rcp":
        return _from_bits(j + 0x3F800000)
    if name == "rsqrt":
        return _from_bits(torch.cat([j + 0x3F800000, j + 0x40000000]))
    if name == "ex2_pos":
        return j.to(torch.float32) * 2.0**-23
    if name == "ex2_neg":
        return -(j.to(torch.float32) * 2.0**-23)
    if name == "expf":
        b = torch.arange(1 << 16, dtype=torch.int32, device=dev)
        return _from_bits(b << 16)
    raise ValueError(f"name: unknown canonical domain {name!r}")


def _apply_overrides(
    result_bits: torch.Tensor, keys: torch.Tensor, ov_keys: str, ov_bits: str
) -> torch.Tensor:
    """Where ``keys`` is in the stored override list, replace ``result_bits`` by the stored correct bits."""
    z = _npz()
    okeys = torch.from_numpy(z[ov_keys].astype(np.int64)).to(keys.device)
    if okeys.numel() == 0:
        return result_bits
    obits = torch.from_numpy(z[ov_bits].astype(np.int64)).to(keys.device)
    pos = torch.searchsorted(okeys, keys).clamp_(max=okeys.numel() - 1)
    hit = okeys[pos] == keys
    return torch.where(hit, obits[pos].to(torch.int32), result_bits)


# ------------------------------------------------------------------------------------------------------------
# correctly rounded bases


def _base64(name: str, x: torch.Tensor) -> torch.Tensor:
    """The f64 computation of a base (``"rsqrt"``, ``"exp2"``, ``"exp"``): fp32 x -> float64, on x's device;
    ValueError for another name. Also read by the table capture (``flint_moe.tools.mufu``)."""
    x64 = x.double()
    if name == "rsqrt":
        v = 1.0 / torch.sqrt(x64)
    elif name == "exp2":
        v = torch.exp2(x64)
    elif name == "exp":
        v = torch.exp(x64)
    else:
        raise ValueError(f"name: unknown base {name!r}")
    return v


def _raw_base(name: str, x: torch.Tensor) -> torch.Tensor:
    """RN32 of the f64 computation, before overrides (``"rsqrt"``, ``"exp2"``, ``"exp"``); fp32 x -> fp32."""
    return _base64(name, x).to(torch.float32)


def rcp_rn(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 1/x (IEEE division, subnormals kept): fp32 [*] -> fp32 [*].

    TypeError if ``x`` is not an fp32 tensor.
    """
    x = _as_f32("x", x)
    return torch.ones_like(x) / x


def rsqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 1/sqrt(x) for any fp32 x: fp32 [*] -> fp32 [*].

    IEEE special cases: +-0 -> +-inf, x < 0 (incl. -inf) -> NaN, +inf -> +0, NaN -> NaN; subnormal x is
    used as is. Computed as RN32(1 / sqrt(f64 x)) plus the stored override list (module docstring).
    TypeError if not fp32.
    """
    x = _as_f32("x", x)
    r = _bits(_raw_base("rsqrt", x))
    b = _bits(x)
    e_field = (b >> 23) & 0xFF
    positive_finite = (b > 0) & (e_field < 255)
    sub = positive_finite & (e_field == 0)
    # normalise subnormals exactly: x * 2^64 is a normal fp32; rsqrt(x) = rsqrt(x 2^64) * 2^32
    bn = torch.where(sub, _bits(x * 2.0**64), b)
    en = ((bn >> 23) & 0xFF) - 127
    parity = en & 1  # 1: unbiased exponent odd -> canonical c in [2, 4)
    keys = (parity.to(torch.int64) << 23) | (bn & _MANT).to(torch.int64)
    k = en >> 1  # floor(e / 2)
    k = torch.where(sub, k - 32, k)
    z = _npz()
    okeys = torch.from_numpy(z["rsqrt_override_index"].astype(np.int64)).to(x.device)
    if okeys.numel():
        obits = torch.from_numpy(z["rsqrt_override_bits"].astype(np.int64)).to(x.device)
        pos = torch.searchsorted(okeys, keys).clamp_(max=okeys.numel() - 1)
        hit = (okeys[pos] == keys) & positive_finite
        r = torch.where(hit, obits[pos].to(torch.int32) - (k << 23), r)
    return _from_bits(r).clone()


def _exp2_keys(name: str, x: torch.Tensor) -> torch.Tensor:
    k = x.double() * 2.0**23
    ok = (k == torch.round(k)) & (k.abs() < 2.0**23)
    if not bool(ok.all()):
        bad = x[~ok].flatten()[:3].tolist()
        raise ValueError(f"{name}: exp2_rn takes values k * 2^-23 with |k| < 2^23 only, got e.g. {bad}")
    return k.to(torch.int64)


def exp2_rn(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 2^x on the ex2 tables' domain: x = k * 2^-23 with integer |k| < 2^23.

    fp32 [*] -> fp32 [*] in (0.5, 2). RN32(f64 exp2) plus the stored override list. TypeError if not fp32,
    ValueError (naming ``x``) for a value outside the domain (incl. NaN / inf).
    """
    x = _as_f32("x", x)
    keys = _exp2_keys("x", x)
    r = _bits(_raw_base("exp2", x))
    return _from_bits(_apply_overrides(r, keys, "exp2_override_index", "exp2_override_bits")).clone()


def _bf16_index(name: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 tensor holding the values, int64 bf16 bit index 0..65535). ValueError for a non-bf16 value."""
    check_tensor(name, x, dtype=(torch.float32, torch.bfloat16))
    if x.dtype == torch.bfloat16:
        xf = x.to(torch.float32)
    else:
        xf = x
        b = _bits(x)
        bad = ((b & 0xFFFF) != 0) & ~torch.isnan(x)
        if bool(bad.any()):
            ex = x[bad].flatten()[:3].tolist()
            raise ValueError(
                f"{name}: expected fp32 values representable in bf16 (low 16 bits zero), got e.g. {ex}"
            )
    idx = ((_bits(xf) >> 16) & 0xFFFF).to(torch.int64)
    return xf, idx


def exp_rn(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp32 e^x (subnormal results kept) for bf16 values: fp32 or bf16 [*] -> fp32 [*].

    RN32(f64 exp) plus the stored override list. TypeError for another dtype, ValueError (naming ``x``) for an
    fp32 value that is not a bf16 value. NaN -> NaN, +inf -> +inf, -inf -> +0.
    """
    xf, idx = _bf16_index("x", x)
    r = _bits(_raw_base("exp", xf))
    return _from_bits(_apply_overrides(r, idx, "exp_override_index", "exp_override_bits")).clone()


# ------------------------------------------------------------------------------------------------------------
# expanded tables (hardware bits on the canonical domain), cached per device


def _table(name: str, device: torch.device) -> torch.Tensor:
    key = (name, str(device))
    cached = _state["cache"].get(key)
    if cached is not None:
        return cached
    z = _npz()
    if name == "expf":
        t = _bits(exp_rn(canonical_inputs("expf", device)))
        idx = torch.from_numpy(z["expf_exception_index"].astype(np.int64)).to(device)
        val = torch.from_numpy(z["expf_exception_bits"].astype(np.uint32).view(np.int32)).to(device)
        t = t.clone()
        t[idx] = val
    else:
        x = canonical_inputs(name, device)
        if name == "rcp":
            base = _bits(rcp_rn(x))
        elif name == "rsqrt":
            base = _bits(rsqrt_rn(x))
        else:
            base = _bits(exp2_rn(x))
        d = torch.from_numpy(unpack_deltas(z[f"{name}_delta"])).to(device)
        if d.numel() != base.numel():
            raise ValueError(f"mufu tables: {name}_delta has {d.numel()} entries, expected {base.numel()}")
        t = base + d.to(torch.int32)
    with _lock:
        _state["cache"][key] = t
    return t


# ------------------------------------------------------------------------------------------------------------
# emulations


def rcp_approx_ftz(x: torch.Tensor) -> torch.Tensor:
    """``rcp.approx.ftz.f32`` on sm_90, bit for bit: fp32 [*] -> fp32 [*] (TypeError if not fp32).

    Normal x: table lookup on the mantissa plus exponent arithmetic, sign copied; results below 2^-126 -> +-0.
    +-0 / +-subnormal -> +-inf, +-inf -> +-0, NaN -> NaN.
    Source: PTX ISA "rcp.approx.ftz.f32"; gpu-numerics.md.
    """
    x = _as_f32("x", x)
    b = _bits(x)
    t = _table("rcp", x.device)[(b & _MANT).to(torch.int64)]
    e = (b >> 23) & 0xFF
    field = ((t >> 23) & 0xFF) - (e - 127)
    mag = torch.where(field > 0, (t & _MANT) | (field.clamp(min=0, max=254) << 23), torch.zeros_like(b))
    mag = torch.where(e == 0, torch.full_like(b, _INF_BITS), mag)  # ftz input: 1/(+-0) = +-inf
    mag = torch.where(e == 255, torch.zeros_like(b), mag)  # 1/(+-inf) = +-0
    out = mag | (b & _SIGN)
    out = torch.where((e == 255) & ((b & _MANT) != 0), torch.full_like(b, _NAN_BITS), out)
    return _from_bits(out)


def rsqrt_approx_ftz(x: torch.Tensor) -> torch.Tensor:
    """``rsqrt.approx.ftz.f32`` on sm_90, bit for bit: fp32 [*] -> fp32 [*] (TypeError if not fp32).

    Positive normal x = c 4^k, c in [1, 4): T[c] 2^-k. +-0 / +-subnormal -> +-inf, other negatives -> NaN,
    +inf -> +0, NaN -> NaN. Source: PTX ISA "rsqrt.approx.ftz.f32"; gpu-numerics.md.
    """
    x = _as_f32("x", x)
    b = _bits(x)
    e = (b >> 23) & 0xFF
    mant = b & _MANT
    en = e - 127
    idx = (((en & 1) << 23) | mant).to(torch.int64)
    t = _table("rsqrt", x.device)[idx]
    out = t - ((en >> 1) << 23)
    neg = b < 0
    out = torch.where(neg, torch.full_like(b, _NAN_BITS), out)
    out = torch.where(e == 0, torch.full_like(b, _INF_BITS) | (b & _SIGN), out)
    out = torch.where((e == 255) & ~neg, torch.zeros_like(b), out)  # +inf -> +0
    out = torch.where((e == 255) & (mant != 0), torch.full_like(b, _NAN_BITS), out)
    return _from_bits(out)


def ex2_approx_ftz(x: torch.Tensor) -> torch.Tensor:
    """``ex2.approx.ftz.f32`` on sm_90, bit for bit: fp32 [*] -> fp32 [*] (TypeError if not fp32).

    a = |x| truncated to 23 fraction bits (subnormal x -> 0), ip = floor(a), j = fraction index;
    x >= 0: T_pos[j] 2^ip, x < 0: T_neg[j] 2^-ip; results >= 2^128 -> +inf, below 2^-126 -> +0; NaN -> NaN.
    Source: PTX ISA "ex2.approx.ftz.f32"; gpu-numerics.md (model checked on all 2^32 inputs).
    """
    x = _as_f32("x", x)
    b = _bits(x)
    e = (b >> 23) & 0xFF
    mant = b & _MANT
    neg = b < 0
    sh = e - 127
    m24 = mant | (1 << 23)
    # fixed point with 23 fraction bits: F = floor(m24 * 2^sh); sh in [-126, 128]
    right = torch.bitwise_right_shift(m24, (-sh).clamp(min=0, max=31))
    left = torch.bitwise_left_shift(m24, sh.clamp(min=0, max=7))
    f = torch.where(sh >= 0, left, right)
    f = torch.where(e == 0, torch.zeros_like(f), f)  # ftz: subnormal inputs are zero
    ip = torch.where(sh >= 8, torch.full_like(f, 255), f >> 23)  # |x| >= 256 saturates
    j = (f & _MANT).to(torch.int64)
    t = torch.where(neg, _table("ex2_neg", x.device)[j], _table("ex2_pos", x.device)[j])
    field = ((t >> 23) & 0xFF) + torch.where(neg, -ip, ip)
    out = (t & _MANT) | (field.clamp(min=0, max=254) << 23)
    out = torch.where(field >= 255, torch.full_like(b, _INF_BITS), out)
    out = torch.where(field <= 0, torch.zeros_like(b), out)
    out = torch.where((e == 255) & (mant != 0), torch.full_like(b, _NAN_BITS), out)
    return _from_bits(out)


def expf_libdevice(x: torch.Tensor) -> torch.Tensor:
    """CUDA libdevice ``__nv_expf`` (as Triton 3.6 links it, ftz) on bf16 values, bit for bit.

    fp32 [*] holding bf16 values, or bf16 [*] -> fp32 [*]. A 65,536-entry table: exp_rn plus the captured
    exception list; subnormal results are kept (measured, module docstring). TypeError for another dtype;
    ValueError naming ``x`` if an fp32 value is not a bf16 value.
    NaN -> NaN. Source: rule step 3 (flint-rule.md), gpu-numerics.md.
    """
    xf, idx = _bf16_index("x", x)
    out = _table("expf", xf.device)[idx]
    out = torch.where(torch.isnan(xf), torch.full_like(out, _NAN_BITS), out)
    return _from_bits(out)
