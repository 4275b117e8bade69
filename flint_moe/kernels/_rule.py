"""The rule's instructions as device helpers (``@triton.jit``; call them from kernels), each pinned to the
rule's PTX instruction on the GPU:

=====================  =======================================  ==========================  ============
helper                 GPU (sm_90) lowering                     interpreter (CPU) path       rule step
=====================  =======================================  ==========================  ============
``rcp_approx_ftz(x)``  inline PTX ``rcp.approx.ftz.f32``        SHIM: ``mufu.rcp_approx_ftz``   7
``ex2_approx_ftz(x)``  inline PTX ``ex2.approx.ftz.f32``        SHIM: ``mufu.ex2_approx_ftz``   7
``rsqrt_approx_ftz``   inline PTX ``rsqrt.approx.ftz.f32``      SHIM: ``mufu.rsqrt_approx_ftz`` 11
``expf_libdevice(x)``  ``libdevice.exp`` (``__nv_expf``, ftz)   SHIM: ``mufu.expf_libdevice``   3
``div_rn(a, b)``       ``div.rn.f32`` (``tl.math.div_rn``)      SHIM: numpy fp32 divide (IEEE)  3, 4, 11
``bf16_rn(x)``         inline PTX ``cvt.rn.bf16.f32``           SHIM: ``formats.round_bf16``    1, 4, 7-10
``fma_rn(a, b, c)``    ``fma.rn.f32`` (``tl.fma``)              SHIM: ``combine.fma_f32``       P12
=====================  =======================================  ==========================  ============

and the rule steps every expert kernel shares, built from them (one copy, used by every kernel):

==============================  ==========================================================  ============
helper                          computes                                                     rule step
==============================  ==========================================================  ============
``global_scale(acc, gs)``       ``RN(acc * gs)`` (``mul.f32``)                                 6, 8
``swiglu(g, u)``                ``bf16(RN(u * RN(g * rcp(RN(ex2(RN(g * c)) + 1)))))``          7
``swiglu_f32(g, u)``            the same without the final ``bf16``                          P9
``combine_fma(acc, tw, y)``     ``fma(tw, fp32(y), acc)`` (``fma.rn.f32``, one rounding)        9
``shared_add(routed, sh)``      ``bf16(RN(fp32(routed) + fp32(sh)))``, routed = bf16(acc)     10
==============================  ==========================================================  ============

All take and return fp32 tensors (``bf16_rn`` returns bf16) of any block shape. ``expf_libdevice`` is only
defined for inputs that are bf16 values widened to fp32 (rule step 3); under the interpreter the shim raises
``ValueError`` for any other value, so masked-out lanes must hold a bf16 value too (e.g. ``other=0.0``).
The shims live in ``flint_moe.kernels._shims``.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from flint_moe.kernels._launch import _INTERPRET
from flint_moe.kernels._shims import (
    _SHIM_bf16_rn,
    _SHIM_div_rn,
    _SHIM_ex2_approx_ftz,
    _SHIM_expf_libdevice,
    _SHIM_fma_rn,
    _SHIM_rcp_approx_ftz,
    _SHIM_rsqrt_approx_ftz,
)

__all__ = [
    "rcp_approx_ftz",
    "ex2_approx_ftz",
    "rsqrt_approx_ftz",
    "expf_libdevice",
    "div_rn",
    "bf16_rn",
    "fma_rn",
    "SWIGLU_C",
    "global_scale",
    "swiglu",
    "swiglu_f32",
    "combine_fma",
    "shared_add",
]

#: Rule step 7 constant c = fp32(-log2(e)) (bits 0xBFB8AA3B), exact in fp32.
SWIGLU_C = -1.44269502162933349609375
_C = tl.constexpr(SWIGLU_C)


@triton.jit
def _f32_unary(x, ASM: tl.constexpr, SHIM: tl.constexpr):
    """fp32 -> fp32 by the one inline PTX instruction ``ASM`` (``"op $0, $1;"``) on the GPU, by ``SHIM`` (a
    ``flint_moe.kernels._shims`` constexpr) under the interpreter."""
    if _INTERPRET:
        return SHIM(x)
    else:
        return tl.inline_asm_elementwise(ASM, "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def rcp_approx_ftz(x):
    """fp32 -> fp32 ``rcp.approx.ftz.f32`` (rule step 7). Interpreter: SHIM to mufu.rcp_approx_ftz."""
    return _f32_unary(x, "rcp.approx.ftz.f32 $0, $1;", _SHIM_rcp_approx_ftz)


@triton.jit
def ex2_approx_ftz(x):
    """fp32 -> fp32 ``ex2.approx.ftz.f32`` (rule step 7). Interpreter: SHIM to mufu.ex2_approx_ftz."""
    return _f32_unary(x, "ex2.approx.ftz.f32 $0, $1;", _SHIM_ex2_approx_ftz)


@triton.jit
def rsqrt_approx_ftz(x):
    """fp32 -> fp32 ``rsqrt.approx.ftz.f32`` (rule step 11). Interpreter: SHIM to mufu.rsqrt_approx_ftz."""
    return _f32_unary(x, "rsqrt.approx.ftz.f32 $0, $1;", _SHIM_rsqrt_approx_ftz)


@triton.jit
def expf_libdevice(x):
    """fp32 -> fp32 libdevice ``__nv_expf`` as Triton 3.6 links it (rule step 3; PTX ends in
    ``ex2.approx.ftz.f32``). Inputs must be bf16 values. Interpreter: SHIM to mufu.expf_libdevice."""
    if _INTERPRET:
        return _SHIM_expf_libdevice(x)
    else:
        return libdevice.exp(x)


@triton.jit
def div_rn(a, b):
    """fp32 / fp32 correctly rounded, ``div.rn.f32`` (never ``div.full.f32``, which ``a / b`` gives).
    ``a`` and ``b``: fp32 tensors of the same shape (``tl.math.div_rn`` does not broadcast).
    Interpreter: SHIM, numpy fp32 division (IEEE)."""
    if _INTERPRET:
        return _SHIM_div_rn(a, b)
    else:
        return tl.math.div_rn(a, b)


@triton.jit
def bf16_rn(x):
    """fp32 -> bf16 round-to-nearest-even, subnormals kept: inline PTX ``cvt.rn.bf16.f32`` (rule ``bf16(.)``).
    Interpreter: SHIM to formats.round_bf16 (the interpreter's own cast truncates)."""
    if _INTERPRET:
        return _SHIM_bf16_rn(x)
    else:
        return tl.inline_asm_elementwise(
            "cvt.rn.bf16.f32 $0, $1;", "=h,f", [x], dtype=tl.bfloat16, is_pure=True, pack=1
        )


@triton.jit
def fma_rn(a, b, c):
    """fp32 ``fma(a, b, c)``, one rounding of the exact ``a * b + c`` (``fma.rn.f32``); fp32 tensors of one shape.
    Interpreter: SHIM to ``reference.combine.fma_f32`` (the interpreter's ``tl.fma`` rounds the product first,
    which ``combine_fma`` tolerates only because its products of two bf16 values are exact)."""
    if _INTERPRET:
        return _SHIM_fma_rn(a, b, c)
    else:
        return tl.fma(a, b, c)


@triton.jit
def global_scale(acc, gs):
    """Rule steps 6 / 8: an fp32 accumulator times the expert's fp32 global scale, ``RN(acc * gs)``
    (``mul.f32``; ``gs`` a scalar or the same shape as ``acc``)."""
    return acc * gs


@triton.jit
def swiglu_f32(g, u):
    """Rule step 7 before its bf16 rounding (the per-token recipe's P9): fp32
    ``RN(u * RN(g * rcp(RN(ex2(RN(g * c)) + 1))))`` from fp32 ``g``, ``u`` (same shape), c = ``SWIGLU_C``:
    ``mul.f32``, ``ex2.approx.ftz.f32``, ``add.f32``, ``rcp.approx.ftz.f32``, ``mul.f32``, ``mul.f32``."""
    a = g * _C
    ex = ex2_approx_ftz(a)
    d = ex + 1.0
    r = rcp_approx_ftz(d)
    return u * (g * r)


@triton.jit
def swiglu(g, u):
    """Rule step 7: bf16 ``act = bf16(RN(u * RN(g * rcp(RN(ex2(RN(g * c)) + 1)))))`` from the globally scaled
    fp32 gate ``g`` and up ``u`` (same shape): :func:`swiglu_f32`, then ``cvt.rn.bf16.f32``."""
    return bf16_rn(swiglu_f32(g, u))


@triton.jit
def combine_fma(acc, tw, y):
    """Rule step 9, one selected expert: fp32 ``fma(tw, fp32(y), acc)`` (``fma.rn.f32``). ``acc`` fp32, ``tw``
    fp32 of the shape of ``acc`` (a routing weight holding a bf16 value, broadcast by the caller), ``y`` bf16 of
    that shape; the caller runs the experts in selection order from ``acc = +0``."""
    return tl.fma(tw, y.to(tl.float32), acc)


@triton.jit
def shared_add(routed, sh):
    """Rule step 10: bf16 ``out = bf16(RN(fp32(routed) + fp32(sh)))`` (``add.f32``, ``cvt.rn.bf16.f32``) from
    ``routed = bf16_rn(acc)`` (the combined fp32 ``acc`` rounded by the caller, ``cvt.rn.bf16.f32``, before it
    loads ``sh``: that keeps the kernels' instruction order) and the shared expert's output ``sh`` (bf16, or
    fp32 holding bf16 values, the shape of ``routed``)."""
    return bf16_rn(routed.to(tl.float32) + sh.to(tl.float32))
