"""Bit-level number formats of the Flint rule: binary32 <-> bfloat16, E2M1 (FP4) and E4M3 (FP8).

Everything here works on the integer bit patterns with vectorised torch ops (no Python loop over elements),
on CPU or CUDA (the output is on the input's device), and never modifies its inputs.

Sources: IEEE 754-2019 (roundTiesToEven, binary32); the bfloat16 format (binary32 with the low 16 bits
dropped); OCP 8-bit Floating Point spec v1.0 (E4M3 "fn": bias 7, no infinity, NaN = S.1111.111, max 448,
min subnormal 2^-9); OCP Microscaling spec v1.0 / PTX ISA "Floating point data types" (E2M1: bias 1, values
0, 0.5, 1, 1.5, 2, 3, 4, 6, code bit 3 = sign); the Flint rule (docs/numerics.md) "Inputs" for the packing
(two codes per byte, low nibble = even element).

Errors: ``TypeError`` for a wrong dtype, ``ValueError`` for a bad shape or value; messages start with the
argument's name (see ``_checks.py``).
"""

from __future__ import annotations

import torch

from ._checks import check_tensor

__all__ = [
    "f32_bits",
    "bits_to_f32",
    "round_bf16",
    "to_bf16",
    "is_subnormal",
    "flush_subnormal",
    "E2M1_VALUES",
    "E2M1_MAX",
    "e2m1_to_float",
    "float_to_e2m1",
    "pack_e2m1",
    "unpack_e2m1",
    "E4M3_MAX",
    "E4M3_MIN_SUBNORMAL",
    "e4m3_bytes",
    "e4m3_to_float",
    "float_to_e4m3",
    "e4m3_nan_mask",
]

_SIGN = -0x80000000  # 0x80000000 as an int32 scalar
_ABS = 0x7FFFFFFF
_EXP = 0x7F800000
_MANT = 0x007FFFFF
_QUIET = 0x00400000


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    """Row-major index of the first True element of ``mask`` (which has at least one)."""
    return tuple(int(i) for i in torch.nonzero(mask)[0].tolist())


# ---------------------------------------------------------------------------------------------------------
# binary32 <-> bfloat16
# ---------------------------------------------------------------------------------------------------------


def f32_bits(x: torch.Tensor) -> torch.Tensor:
    """The bit patterns of fp32 ``x`` as int32 (a view, same shape and device). Raises ``TypeError``."""
    check_tensor("x", x, dtype=torch.float32)
    return x.view(torch.int32)


def bits_to_f32(b: torch.Tensor) -> torch.Tensor:
    """The fp32 values of int32 bit patterns ``b`` (a view, same shape and device). Raises ``TypeError``."""
    check_tensor("b", b, dtype=torch.int32)
    return b.view(torch.float32)


def _round_bf16_bits(bits: torch.Tensor) -> torch.Tensor:
    """int32 fp32 bits -> int32 fp32 bits of the bf16 rounding (low 16 bits zero). No int32 overflow."""
    sign = bits & _SIGN
    mag = bits & _ABS
    is_nan = mag > _EXP
    # Round to nearest, ties to even on bit 16: add 0x7FFF plus the kept LSB, then truncate. A carry out of
    # the mantissa increments the exponent (correct: the next binade / inf). NaN magnitudes are clamped to
    # inf first so the sum stays below 2^31, and handled separately below.
    m = torch.clamp(mag, max=_EXP)
    rounded = (m + 0x7FFF + ((m >> 16) & 1)) & -0x10000
    # NaN -> quiet NaN with the same sign and the top payload bits (mantissa bit 22 forced on so the
    # truncated bf16 mantissa is non-zero).
    nan = (mag | _QUIET) & -0x10000
    return torch.where(is_nan, nan, rounded) | sign


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``x`` to bfloat16, returned as fp32 holding the bf16 value (rule notation ``bf16(.)``).

    Round to nearest, ties to even, computed on the integer bits: subnormals are kept (rounded like any
    other value), +-inf stays +-inf, finite values above the largest bf16 round to +-inf as IEEE says, NaN
    stays NaN (a quiet NaN with the input's sign). Same shape and device as ``x``; ``x`` must be fp32
    (``TypeError`` otherwise).
    """
    check_tensor("x", x, dtype=torch.float32)
    return _round_bf16_bits(x.view(torch.int32)).view(torch.float32)


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``x`` to a ``torch.bfloat16`` tensor with the same rounding as :func:`round_bf16`.

    The result's bits are computed here (torch's cast is not used). ``TypeError`` unless ``x`` is fp32.
    """
    check_tensor("x", x, dtype=torch.float32)
    hi = _round_bf16_bits(x.view(torch.int32)) >> 16  # arithmetic shift: exactly the int16 bit pattern
    return hi.to(torch.int16).view(torch.bfloat16)


def _float_bits(name: str, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    check_tensor(name, x, dtype=(torch.float32, torch.bfloat16))
    if x.dtype == torch.float32:
        return x.view(torch.int32), _EXP, _MANT
    return x.view(torch.int16).to(torch.int32), 0x7F80, 0x007F


def is_subnormal(x: torch.Tensor) -> torch.Tensor:
    """Bool mask of the subnormal (denormal, non-zero) elements of fp32 or bf16 ``x``. ``TypeError``."""
    bits, exp, mant = _float_bits("x", x)
    return ((bits & exp) == 0) & ((bits & mant) != 0)


def flush_subnormal(x: torch.Tensor) -> torch.Tensor:
    """Copy of fp32 or bf16 ``x`` with subnormals replaced by a zero of the same sign (PTX ``.ftz``).

    Same dtype, shape and device as ``x``. ``TypeError`` for other dtypes.
    """
    sub = is_subnormal(x)
    return torch.where(sub, x * 0, x)  # a subnormal times 0 is a zero of its sign


# ---------------------------------------------------------------------------------------------------------
# E2M1 (FP4)
# ---------------------------------------------------------------------------------------------------------

#: Value of each E2M1 code 0..15 (bit 3 = sign, so code 8 is -0.0).
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip
E2M1_MAX = 6.0


def _check_codes(name: str, codes: torch.Tensor) -> None:
    check_tensor(name, codes, dtype=torch.uint8)
    bad = codes > 15
    if bool(bad.any()):
        idx = _first_index(bad)
        raise ValueError(f"{name}: E2M1 codes must be 0..15, got {int(codes[idx])} at index {idx}")


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """Decode E2M1 codes (uint8, one code 0..15 per element, bit 3 = sign) to fp32 (exact; code 8 = -0.0).

    ``TypeError`` unless uint8; ``ValueError`` naming ``codes`` and the first index of a value above 15.
    """
    _check_codes("codes", codes)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


# Midpoints between adjacent E2M1 magnitudes. At a tie the even code wins, i.e. the lower value at
# 0.25 (0|0.5), 1.25 (1|1.5), 2.5 (2|3), 5 (4|6) and the upper one at 0.75 (0.5|1), 1.75 (1.5|2), 3.5 (3|4).
_TIE_DOWN = (0.25, 1.25, 2.5, 5.0)
_TIE_UP = (0.75, 1.75, 3.5)


def _e2m1_magnitude_code(a: torch.Tensor) -> torch.Tensor:
    """|value| (fp32, >= 0 or NaN) -> code 0..7, RNE, saturating at 6 (code 7); NaN -> 0 (callers decide)."""
    code = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for t in _TIE_DOWN:  # loops over the 7 thresholds, not over elements
        code += (a > t).to(torch.uint8)
    for t in _TIE_UP:
        code += (a >= t).to(torch.uint8)
    return code


def float_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``x`` to E2M1 codes (uint8 0..15, same shape/device): RNE, saturating at +-6.

    The sign code bit is the sign bit of ``x`` (so -0.0 and negatives that round to zero give code 8);
    +-inf saturate to +-6. ``TypeError`` unless fp32; ``ValueError`` naming ``x`` and the first index of a
    NaN (E2M1 has no NaN). ModelOpt's quantizer differs on zero signs and NaN: see ``quantize.py``.
    """
    check_tensor("x", x, dtype=torch.float32)
    nan = torch.isnan(x)
    if bool(nan.any()):
        raise ValueError(f"x: NaN at index {_first_index(nan)} has no E2M1 encoding")
    sign = (torch.signbit(x).to(torch.uint8)) << 3
    return _e2m1_magnitude_code(x.abs()) | sign


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes uint8 [..., K] (K even) into bytes uint8 [..., K/2]: low nibble = even element.

    Source: ModelOpt NVFP4 checkpoint layout (Flint rule "Inputs"). ``TypeError`` unless uint8;
    ``ValueError`` for a 0-d tensor, odd K or a code above 15 (naming ``codes``).
    """
    _check_codes("codes", codes)
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"codes: last dimension must be even to pack two codes a byte, got shape "
                         f"{tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Unpack bytes uint8 [..., K/2] into E2M1 codes uint8 [..., K] (low nibble = even element).

    ``TypeError`` unless uint8; ``ValueError`` for a 0-d tensor (naming ``packed``).
    """
    check_tensor("packed", packed, dtype=torch.uint8)
    if packed.dim() == 0:
        raise ValueError("packed: expected at least 1 dimension, got a 0-d tensor")
    out = torch.stack((packed & 0x0F, packed >> 4), dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


# ---------------------------------------------------------------------------------------------------------
# E4M3 (FP8, "fn" variant: no inf, NaN = 0x7F / 0xFF)
# ---------------------------------------------------------------------------------------------------------

E4M3_MAX = 448.0
E4M3_MIN_SUBNORMAL = 2.0**-9


def e4m3_bytes(name: str, x: torch.Tensor) -> torch.Tensor:
    """The raw bytes (uint8 view) of an E4M3 tensor given as uint8 or ``torch.float8_e4m3fn``.

    ``name`` is used in the ``TypeError`` raised for any other dtype.
    """
    check_tensor(name, x, dtype=(torch.uint8, torch.float8_e4m3fn))
    return x if x.dtype == torch.uint8 else x.view(torch.uint8)


_E4M3_TABLES: dict[torch.device, torch.Tensor] = {}


def _e4m3_table(device: torch.device) -> torch.Tensor:
    """fp32 value of each byte 0..255 on ``device`` (built once per device, read-only: only indexed)."""
    t = _E4M3_TABLES.get(device)
    if t is None:
        t = _E4M3_TABLES[device] = _build_e4m3_table(device)
    return t


def _build_e4m3_table(device: torch.device) -> torch.Tensor:
    """fp32 value of each byte 0..255, built from the bits (OCP FP8 E4M3: bias 7, 0x7F/0xFF NaN)."""
    b = torch.arange(256, dtype=torch.int32, device=device)
    sign = (b >> 7) << 31  # int32 shift: 1 << 31 wraps to the sign bit
    e = (b >> 3) & 0xF
    m = b & 0x7
    normal = ((e + (127 - 7)) << 23) | (m << 20)
    # subnormal (e == 0): m * 2^-9; its fp32 form is normal: normalise m = 1, 2..3, 4..7
    lead = (m >= 2).to(torch.int32) + (m >= 4).to(torch.int32)  # floor(log2(m)) for m >= 1
    sub = ((127 - 9 + lead) << 23) | ((m << (23 - lead)) & _MANT)
    zero = torch.zeros_like(b)
    mag = torch.where(e == 0, torch.where(m == 0, zero, sub), normal)
    mag = torch.where((e == 15) & (m == 7), torch.full_like(b, 0x7FC00000), mag)
    return (mag | sign).to(torch.int32).view(torch.float32)


def e4m3_to_float(x: torch.Tensor) -> torch.Tensor:
    """Decode E4M3 bytes (uint8 or ``torch.float8_e4m3fn``, any shape) to fp32 (exact, same device).

    Bytes 0x7F/0xFF decode to NaN; negative bytes and -0 (0x80) are valid values. ``TypeError`` otherwise.
    """
    b = e4m3_bytes("x", x)
    return _e4m3_table(b.device)[b.long()]


def e4m3_nan_mask(x: torch.Tensor) -> torch.Tensor:
    """Bool mask of the NaN bytes (0x7F, 0xFF) of E4M3 ``x`` (uint8 or float8_e4m3fn). ``TypeError``."""
    return (e4m3_bytes("x", x) & 0x7F) == 0x7F


def _rne_shift(sig: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even of ``sig / 2^s`` for int32 sig >= 0, 1 <= s <= 30 (elementwise tensors)."""
    q = sig >> s
    rem = sig - (q << s)
    half = torch.ones_like(sig) << (s - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    return q + up.to(torch.int32)


def float_to_e4m3(x: torch.Tensor, *, saturate: bool = False) -> torch.Tensor:
    """Round fp32 ``x`` to E4M3 bytes (uint8, same shape/device): round to nearest even from the bits.

    Subnormals are rounded on their 2^-9 grid (values <= 2^-10 round to zero; 2^-10 itself is a tie to
    the even 0). NaN -> 0x7F (0xFF for a negative sign bit). A magnitude that rounds above 448 (i.e. > 464,
    464 itself being a tie that goes to the even 448) and +-inf give the NaN byte without ``saturate``
    (the non-saturating conversion), and +-448 (0x7E / 0xFE) with ``saturate=True`` (PTX
    ``cvt.rn.satfinite.e4m3x2.f32``: NaN stays NaN). The sign of zero is kept (-0.0 -> 0x80).
    ``TypeError`` unless ``x`` is fp32.
    """
    check_tensor("x", x, dtype=torch.float32)
    bits = x.view(torch.int32)
    sign = ((bits >> 31) & 1).to(torch.uint8) << 7
    mag = bits & _ABS
    is_nan = mag > _EXP
    m = torch.clamp(mag, max=_EXP)  # inf -> a huge magnitude; NaN handled at the end
    exp = m >> 23
    # Normal E4M3 range (|x| >= 2^-6, fp32 biased exponent >= 121): keep 3 of the 23 mantissa bits; the
    # exponent field rides along, so a mantissa carry bumps the exponent. Rebias 127 -> 7.
    normal = ((m + 0x7FFFF + ((m >> 20) & 1)) >> 20) - (120 << 3)
    # Subnormal E4M3 range: count of 2^-9 quanta = significand * 2^(exp - 141) (exp 0: fp32 subnormal,
    # significand without the implicit bit and exponent 1). Shifts >= 25 leave < 1/2 quantum -> 0.
    sig = torch.where(exp == 0, m, (m & _MANT) | 0x00800000)
    shift = torch.clamp(141 - torch.clamp(exp, min=1), min=1, max=25)
    sub = _rne_shift(sig, shift)  # 0..8; 8 is the byte of the smallest normal 2^-6, as it should be
    code = torch.where(exp >= 121, normal, sub)
    code = torch.clamp(code, max=0x7E if saturate else 0x7F)  # 0x7F: NaN (overflow, inf)
    code = torch.where(is_nan, 0x7F, code)
    return code.to(torch.uint8) | sign
