"""Bit-accurate model of one H200 (sm_90) tensor-core step: bf16 x bf16 products, fp32 accumulator, k = 16.

``mma_bf16_f32(acc, a, b, instruction=...)`` returns the fp32 ``d = acc + sum_{k<16} a_k * b_k`` that one
``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`` or one k16 step of ``wgmma.mma_async.sync.aligned.
m64nNk16.f32.bf16.bf16`` produces for one output element, bit for bit. Pure integer arithmetic on bit
patterns (torch int32 / int64), vectorised, on any device; never torch's float arithmetic or casts.

The model, step by step (on the 17 terms: the accumulator and the 16 products)
-----------------------------------------------------------------------------
1. Special values first. NaN in any operand, ``inf * 0`` in a product, or infinities of both signs among the
   accumulator and the products give NaN (returned as 0x7FFFFFFF; only NaN-ness is modelled). Otherwise an
   infinite operand gives the infinity of its sign. Finite products never overflow here: they are exact.
2. Decode. bf16 ``x`` -> integer significand ``M = 1.m`` (8 bits, 7 fractional) and exponent
   ``e = max(E, 1) - 127``: subnormal inputs are kept (``M = 0.m``, ``e = -126``), never flushed. The fp32
   accumulator likewise (24-bit significand, 23 fractional bits), subnormals kept.
3. Products exact: ``P_k = M_a * M_b`` (16 bits, 14 fractional bits, value in [0, 4)) with exponent
   ``e_a + e_b``.
4. Alignment exponent ``emax`` = the largest exponent among the NON-ZERO terms (a zero product or a zero
   accumulator takes no part), but never below -133. Each term's significand is placed in a fixed-point
   register whose last bit is 2^(emax - 25) (``F = 25`` fractional bits below 2^emax; the last bit never lies
   below 2^-158) and its magnitude is truncated there, toward zero, independently per term, before its sign
   is applied.
5. The 17 aligned, signed integers are added exactly. There is no internal grouping: the order of the k
   positions does not change the result (measured: every permutation class vector, 8 orders each).
6. Normalisation and one rounding to fp32 toward zero (RZ), with gradual underflow (a result below 2^-126 is
   truncated to a multiple of 2^-149). A result of magnitude >= 2^128 after truncation is infinity (not the
   largest finite value that IEEE RZ would give).
7. Every zero result is +0: an exact zero sum (also of -0 terms only, e.g. -0 + (-0) * 1) and a non-zero sum
   that truncates to zero.

Steps 2, 3, 5 and 6 and F = 25 follow MMA-Sim (github.com/microsoft/MMA-Sim, arXiv:2511.10909):
``mmasim/simulator/nv_ptx.py`` classes ``mma`` and ``wgmma`` (Hopper: 25 accumulator fractional bits, no
split-k for bf16 m16n8k16) and ``mmasim/simulator/arithmetic.py`` ``nv_fused_dot_add`` / ``fused_sum`` /
``extract_significand_exponent`` (per-term truncation at the largest exponent, RZ normalisation). Measured on
the H200 where this model departs from MMA-Sim's: zero terms do not take part in the largest exponent (MMA-Sim
gives a zero operand exponent -126 and lets it count), the alignment exponent has the floor -133 (seen only
when the accumulator is zero and every product lies below 2^-126), and zero results are +0 also when a
negative sum truncates to zero. The structure (truncating alignment to the largest exponent, a multi-term
adder, normalisation at the end) is also described by Fasi, Higham, Mikaitis and Pranesh ("Numerical
behavior of NVIDIA tensor cores", PeerJ CS 7:e330, 2021) and Khattak and Mikaitis ("Accurate Models of NVIDIA
Tensor Cores", arXiv:2512.07004). This module is written from those facts, not from their code.

Fitted and verified on the H200 with ``python -m flint_moe.tools.mma verify`` (report
``reports/gpu/mma/verify.txt``, vectors in ``data/mma_probe.npz``): every constant above was chosen among
alternatives (F = 24..27, two's-complement truncation, round to nearest, saturation on overflow, the signs of
zeros, zero terms' exponents, the floor) by the mismatch counts on random and adversarial inputs, and
``mma.sync.m16n8k16`` and the wgmma k16 step gave identical bits on every vector: both instruction names
select the same model. A K = 32 ``tl.dot`` (two chained wgmma k16 steps) equals this model applied to
k 0..15 and then to k 16..31.
"""

from __future__ import annotations

import torch

__all__ = ["mma_bf16_f32", "MMA_INSTRUCTIONS", "MMA_K"]

#: The instruction names accepted by ``mma_bf16_f32`` (measured identical on the H200).
MMA_INSTRUCTIONS = ("mma.sync.m16n8k16", "wgmma.m64nNk16")
#: Products per instruction step.
MMA_K = 16

# Fitted constants (the defaults of ``_fused_dot``): see the module docstring.
_PARAMS: dict[str, dict] = {
    "mma.sync.m16n8k16": {},
    "wgmma.m64nNk16": {},
}

_NAN_BITS = 0x7FFFFFFF
_INF_BITS = 0x7F800000


def _check(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, instruction: str) -> tuple[int, ...]:
    if instruction not in _PARAMS:
        raise ValueError(f"instruction: must be one of {MMA_INSTRUCTIONS}, got {instruction!r}")
    for name, t, dt in (("acc", acc, torch.float32), ("a", a, torch.bfloat16), ("b", b, torch.bfloat16)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dt:
            raise TypeError(f"{name}: dtype must be {dt}, got {t.dtype}")
    for name, t in (("a", a), ("b", b)):
        if t.dim() < 1 or t.shape[-1] != MMA_K:
            raise ValueError(
                f"{name}: last dimension must be {MMA_K} (the instruction's k), got shape {tuple(t.shape)}"
            )
    if not (acc.device == a.device == b.device):
        raise ValueError(f"acc, a, b: must be on one device, got {acc.device}, {a.device}, {b.device}")
    try:
        return tuple(torch.broadcast_shapes(acc.shape, a.shape[:-1], b.shape[:-1]))
    except RuntimeError as exc:
        raise ValueError(
            f"acc {tuple(acc.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}: leading dimensions do not broadcast"
        ) from exc


def mma_bf16_f32(
    acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, instruction: str = "mma.sync.m16n8k16"
) -> torch.Tensor:
    """fp32 ``acc + sum_k a[..., k] * b[..., k]`` as one H200 tensor-core k16 step computes it (module docstring).

    acc: fp32 [...]; a, b: bf16 [..., 16] in the instruction's k order; leading dimensions broadcast together.
    ``instruction``: "mma.sync.m16n8k16" or "wgmma.m64nNk16" (the same arithmetic, measured). Returns a new
    fp32 tensor of the broadcast shape on the inputs' device; NaN results are 0x7FFFFFFF.
    Raises TypeError for a non-tensor or a wrong dtype, ValueError for a last dimension other than 16,
    shapes that do not broadcast, tensors on different devices or an unknown instruction.
    """
    shape = _check(acc, a, b, instruction)
    acc_e = acc.expand(shape)
    a_e = a.expand(shape + (MMA_K,))
    b_e = b.expand(shape + (MMA_K,))
    return _fused_dot(acc_e, a_e, b_e, **_PARAMS[instruction])


def _bf16_fields(bits16: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    bits = bits16.to(torch.int64) & 0xFFFF
    sign = bits >> 15
    ef = (bits >> 7) & 0xFF
    mf = bits & 0x7F
    sig = torch.where(ef > 0, mf | 0x80, mf)
    exp = torch.clamp(ef, min=1) - 127
    return sign, ef, mf, sig, exp


def _shift(v: torch.Tensor, sh: torch.Tensor) -> torch.Tensor:
    """v * 2^sh for sh >= 0, v >> -sh (arithmetic, floor) for sh < 0; v int64 with |v| < 2^40."""
    left = v << torch.clamp(sh, min=0, max=23)
    right = v >> torch.clamp(-sh, min=0, max=62)
    return torch.where(sh >= 0, left, right)


def _msb(mag: torch.Tensor) -> torch.Tensor:
    """Position of the most significant set bit of ``mag`` (int64, 0 < mag < 2^63); 0 for mag <= 1. Integer
    shifts only (a binary search), so an elementwise fusion of the model computes the same bits."""
    p = torch.zeros_like(mag)
    m = mag
    for s in (32, 16, 8, 4, 2, 1):
        big = (m >> s) > 0
        m = torch.where(big, m >> s, m)
        p = p + torch.where(big, s, 0)
    return p


def _fused_dot(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **params) -> torch.Tensor:
    """fp32 result of the model on fp32 ``acc`` [...] and bf16 ``a``, ``b`` [..., 16] of one shape;
    ``params``: the fitted constants' alternatives (:func:`_fused_dot_bits`), for the fitting tool.

    On CUDA with the fitted constants the integer model runs as one fused kernel (``torch.compile`` of
    :func:`_fused_dot_bits`: integer arithmetic only, so the fusion cannot change a bit; the GPU tests compare
    it with the eager evaluation); ``FLINT_MMA_COMPILE=0`` keeps the eager evaluation."""
    shape = acc.shape
    abits = a.view(torch.int16).reshape(-1, MMA_K)
    bbits = b.view(torch.int16).reshape(-1, MMA_K)
    cbits = acc.view(torch.int32).reshape(-1)
    fn = _fused_dot_bits
    if not params and acc.is_cuda:
        fn = _compiled_bits()
    return fn(abits, bbits, cbits, **params).view(torch.float32).reshape(shape)


_COMPILED: dict = {}


def compiled_once(fn):
    """``torch.compile(fn, dynamic=True, fullgraph=True)``, built on the first call and kept for the process;
    ``fn`` itself when compiling is switched off (``FLINT_MMA_COMPILE=0``) or unavailable."""
    import os

    if os.environ.get("FLINT_MMA_COMPILE", "1") == "0":
        return fn
    if fn not in _COMPILED:
        try:
            _COMPILED[fn] = torch.compile(fn, dynamic=True, fullgraph=True)
        except Exception:  # pragma: no cover - a torch build without a working compiler
            _COMPILED[fn] = fn
    return _COMPILED[fn]


def _compiled_bits():
    """The fused (``torch.compile``) :func:`_fused_dot_bits` with the fitted constants, or the eager function
    when compiling is switched off (``FLINT_MMA_COMPILE=0``) or unavailable."""
    return compiled_once(_fused_dot_bits)


def _fused_dot_bits(
    abits: torch.Tensor,
    bbits: torch.Tensor,
    cbits32: torch.Tensor,
    *,
    frac_bits: int = 25,
    term_round: str = "trunc",
    zero_exponent: bool = False,
    final: str = "rz",
    overflow: str = "inf",
    zero_sign: str = "plus",
    align_floor: int | None = -133,
) -> torch.Tensor:
    """The model on bit patterns: ``abits``, ``bbits`` int16 [..., 16] (bf16 bits), ``cbits32`` int32 [...]
    (fp32 bits) -> int32 [...] (fp32 bits). The fitted constants are the keyword defaults; the variants exist
    for the fitting tool.

    frac_bits: F; term_round: "trunc" (magnitude toward zero) or "floor" (two's complement); zero_exponent:
    zero terms take part in the largest exponent with exponent -126 + the partner's (MMA-Sim's reading);
    final: "rz" or "rne"; overflow: "inf" or "max" (largest finite); zero_sign: "plus" (every zero result
    is +0) or "all_negative_zero" (IEEE-like: -0 if every term is -0, a non-zero sum keeps its sign);
    align_floor: the alignment exponent is max(emax, align_floor) (None: no floor).
    """
    sa, eaf, maf, Ma, ea = _bf16_fields(abits)
    sb, ebf, mbf, Mb, eb = _bf16_fields(bbits)
    cbits = cbits32.to(torch.int64) & 0xFFFFFFFF
    sc = cbits >> 31
    ecf = (cbits >> 23) & 0xFF
    mcf = cbits & 0x7FFFFF
    Mc = torch.where(ecf > 0, mcf | (1 << 23), mcf)
    ec = torch.clamp(ecf, min=1) - 127

    # 1. special values
    a_nan = (eaf == 255) & (maf != 0)
    b_nan = (ebf == 255) & (mbf != 0)
    a_inf = (eaf == 255) & (maf == 0)
    b_inf = (ebf == 255) & (mbf == 0)
    a_zero = (eaf == 0) & (maf == 0)
    b_zero = (ebf == 0) & (mbf == 0)
    sp = sa ^ sb
    p_nan = a_nan | b_nan | (a_inf & b_zero) | (b_inf & a_zero)
    p_inf = (a_inf | b_inf) & ~p_nan
    c_nan = (ecf == 255) & (mcf != 0)
    c_inf = (ecf == 255) & (mcf == 0)
    pos_inf = (p_inf & (sp == 0)).any(-1) | (c_inf & (sc == 0))
    neg_inf = (p_inf & (sp == 1)).any(-1) | (c_inf & (sc == 1))
    is_nan = p_nan.any(-1) | c_nan | (pos_inf & neg_inf)
    is_inf = (pos_inf | neg_inf) & ~is_nan

    # 2-3. exact products and their exponents
    P = Ma * Mb
    ep = ea + eb
    if not zero_exponent:
        ep = torch.where(P == 0, torch.full_like(ep, -100000), ep)
        ec_m = torch.where(Mc == 0, torch.full_like(ec, -100000), ec)
    else:
        ec_m = ec
    emax = torch.maximum(ep.amax(-1), ec_m)
    emax = torch.where(emax < -1000, torch.full_like(emax, -126), emax)
    if align_floor is not None:
        emax = torch.clamp(emax, min=align_floor)

    # 4. alignment with truncation at 2^(emax - F)
    sh_p = ep - emax.unsqueeze(-1) + (frac_bits - 14)
    sh_c = ec - emax + (frac_bits - 23)
    if term_round == "trunc":
        tp = _shift(P, sh_p)
        tp = torch.where(sp == 1, -tp, tp)
        tc = _shift(Mc, sh_c)
        tc = torch.where(sc == 1, -tc, tc)
    elif term_round == "floor":
        tp = _shift(torch.where(sp == 1, -P, P), sh_p)
        tc = _shift(torch.where(sc == 1, -Mc, Mc), sh_c)
    else:
        raise ValueError(f"term_round: {term_round!r}")

    # 5. exact sum
    S = tp.sum(-1) + tc
    neg = S < 0
    mag = S.abs()

    # 6. normalise, round to fp32
    p = _msb(mag)  # msb position (mag > 0)
    E = p + emax - frac_bits
    normal = E >= -126
    # normal: 24 significant bits
    rs = p - 23
    m24 = _shift(mag, -rs)
    # subnormal: units of 2^-149
    ss = emax - frac_bits + 149
    q = _shift(mag, ss)
    if final == "rne":

        def _rne(v: torch.Tensor, r: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
            rr = torch.clamp(r, min=0, max=62)
            half = torch.where(rr > 0, torch.ones_like(rr) << torch.clamp(rr - 1, min=0), torch.zeros_like(rr))
            rem = v - ((v >> rr) << rr)
            up = (r > 0) & ((rem > half) | ((rem == half) & (rem > 0) & ((base & 1) == 1)))
            return base + up.to(base.dtype)

        m24 = _rne(mag, rs, m24)
        q = _rne(mag, -ss, q)
    elif final != "rz":
        raise ValueError(f"final: {final!r}")
    bits = torch.where(normal, ((E + 126) << 23) + m24, q)
    over = bits >= _INF_BITS
    bits = torch.where(over, torch.full_like(bits, _INF_BITS if overflow == "inf" else _INF_BITS - 1), bits)
    # 7. zero signs
    zero_sum = S == 0
    if zero_sign == "all_negative_zero":
        p_negzero = (P == 0) & (sp == 1)
        all_neg_zero = p_negzero.all(-1) & (Mc == 0) & (sc == 1)
        sign = torch.where(zero_sum, all_neg_zero.to(torch.int64), neg.to(torch.int64))
    elif zero_sign == "plus":
        sign = torch.where(zero_sum | (bits == 0), torch.zeros_like(S), neg.to(torch.int64))
    else:
        raise ValueError(f"zero_sign: {zero_sign!r}")
    bits = torch.where(zero_sum, torch.zeros_like(bits), bits) | (sign << 31)

    # specials
    inf_bits = torch.where(neg_inf, _INF_BITS | (1 << 31), _INF_BITS)
    bits = torch.where(is_inf, inf_bits, bits)
    bits = torch.where(is_nan, torch.full_like(bits, _NAN_BITS), bits)
    return (bits - ((bits >> 31) << 32)).to(torch.int32)
