"""Interpreter shims: plain Python that the rule helpers (``flint_moe.kernels._rule``) call from their
``if _INTERPRET`` branch, and the exact bf16 -> fp32 widening of Triton's interpreter (CPU only).

Triton's interpreter runs a ``@triton.jit`` function as ordinary Python on ``tl.tensor`` objects whose
``handle`` is a ``TensorHandle`` holding a numpy array (bf16 stored as uint16 bit patterns;
triton/runtime/interpreter.py), so a helper can call plain Python. Each helper branches on the compile-time
constant ``_INTERPRET``: the GPU compiler folds the branch away and never sees the Python call; the
interpreter calls the golden model's bit-exact emulation (``flint_moe.reference.mufu`` /
``formats.round_bf16``, exact integer round-to-nearest-even), never the interpreter's own bf16 cast (which
truncates) nor its ``exp``. Every shim below is named ``_SHIM_*`` and marked ``INTERPRETER SHIM``.
``flint_moe.kernels._launch`` installs the exact widening when ``INTERPRET`` is True.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import triton.language as tl

# =========================================================================================================
# INTERPRETER SHIMS: plain Python called from the helpers' ``if _INTERPRET`` branch, CPU interpreter only.
# They unwrap the interpreter's numpy data, run the golden model's emulation, and wrap the result again.
# =========================================================================================================


def _shim_data(name: str, x: Any, dtype: Any) -> tuple[np.ndarray, Any]:
    """INTERPRETER SHIM helper: (numpy data, triton type) of interpreter value ``x`` of type ``dtype``."""
    if not isinstance(x, tl.core.tensor):
        raise TypeError(f"{name}: expected a Triton tensor inside the interpreter, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected {dtype}, got {x.dtype}")
    return np.asarray(x.handle.data), x.type


def _shim_wrap(data: np.ndarray, ty: Any, elem: Any) -> Any:
    """INTERPRETER SHIM helper: an interpreter tensor of element type ``elem`` shaped like type ``ty``."""
    from triton.runtime.interpreter import TensorHandle

    out_ty = tl.block_type(elem, ty.shape) if ty.is_block() else elem
    return tl.core.tensor(TensorHandle(data, elem), out_ty)


def _shim_f32_unary(name: str, fn_name: str, x: Any) -> Any:
    """INTERPRETER SHIM: fp32 -> fp32 through ``flint_moe.reference.mufu.<fn_name>`` (bit-exact emulation)."""
    from flint_moe.reference import mufu

    data, ty = _shim_data(name, x, tl.float32)
    t = torch.from_numpy(np.array(data, dtype=np.float32, copy=True))
    out = getattr(mufu, fn_name)(t).numpy().astype(np.float32, copy=False)
    return _shim_wrap(out.reshape(data.shape), ty, tl.float32)


def _shim_rcp_approx_ftz(x: Any) -> Any:
    """INTERPRETER SHIM for PTX rcp.approx.ftz.f32."""
    return _shim_f32_unary("rcp_approx_ftz(x)", "rcp_approx_ftz", x)


def _shim_ex2_approx_ftz(x: Any) -> Any:
    """INTERPRETER SHIM for PTX ex2.approx.ftz.f32."""
    return _shim_f32_unary("ex2_approx_ftz(x)", "ex2_approx_ftz", x)


def _shim_rsqrt_approx_ftz(x: Any) -> Any:
    """INTERPRETER SHIM for PTX rsqrt.approx.ftz.f32."""
    return _shim_f32_unary("rsqrt_approx_ftz(x)", "rsqrt_approx_ftz", x)


def _shim_expf_libdevice(x: Any) -> Any:
    """INTERPRETER SHIM for libdevice __nv_expf (inputs must be bf16 values widened to fp32)."""
    return _shim_f32_unary("expf_libdevice(x)", "expf_libdevice", x)


def _shim_div_rn(a: Any, b: Any) -> Any:
    """INTERPRETER SHIM for PTX div.rn.f32: numpy fp32 division (IEEE, correctly rounded, subnormals kept)."""
    da, ta = _shim_data("div_rn(a, b): a", a, tl.float32)
    db, tb = _shim_data("div_rn(a, b): b", b, tl.float32)
    with np.errstate(all="ignore"):
        out = np.divide(da.astype(np.float32), db.astype(np.float32), dtype=np.float32)
    ty = ta if ta.is_block() else tb
    if ta.is_block() and tb.is_block() and tuple(ta.shape) != tuple(tb.shape):
        raise ValueError(f"div_rn(a, b): shapes differ, {ta.shape} vs {tb.shape}")
    return _shim_wrap(np.asarray(out, dtype=np.float32), ty, tl.float32)


def _shim_bf16_rn(x: Any) -> Any:
    """INTERPRETER SHIM for PTX cvt.rn.bf16.f32: exact integer round-to-nearest-even (formats.round_bf16)."""
    from flint_moe.reference.formats import round_bf16

    data, ty = _shim_data("bf16_rn(x)", x, tl.float32)
    t = torch.from_numpy(np.array(data, dtype=np.float32, copy=True))
    bits = round_bf16(t).view(torch.int32).numpy().view(np.uint32)
    out = (bits >> np.uint32(16)).astype(np.uint16)
    return _shim_wrap(out.reshape(data.shape), ty, tl.bfloat16)


def _shim_fma_rn(a: Any, b: Any, c: Any) -> Any:
    """INTERPRETER SHIM for PTX fma.rn.f32 on fp32 tensors of one shape: ``reference.combine.fma_f32`` (one
    rounding of the exact ``a * b + c``; the interpreter's own ``tl.fma`` rounds the product first)."""
    from flint_moe.reference.combine import fma_f32

    arrs = []
    ty = None
    for name, v in (("a", a), ("b", b), ("c", c)):
        data, t = _shim_data(f"fma_rn(a, b, c): {name}", v, tl.float32)
        if ty is not None and tuple(t.shape if t.is_block() else ()) != tuple(ty.shape if ty.is_block() else ()):
            raise ValueError("fma_rn(a, b, c): the operands' shapes differ")
        ty = t
        arrs.append(torch.from_numpy(np.array(data, dtype=np.float32, copy=True)))
    out = fma_f32(*arrs).numpy().astype(np.float32, copy=False)
    return _shim_wrap(out.reshape(np.asarray(c.handle.data).shape), ty, tl.float32)


class _NamedShim:
    """An interpreter shim callable whose ``repr`` names the function, not its address.

    Triton 3.6 hashes ``str(value)`` of every ``tl.constexpr`` global a kernel body names
    (``JITFunction.cache_key``), dead branches included; a plain function prints its memory address, which
    made every process's cache key differ and every process compile anew. The compiled code does not depend
    on it: the shims sit in ``if _INTERPRET:`` branches that the GPU compiler folds away unvisited.

    At every launch Triton compares each global a kernel used with a ``copy.deepcopy`` it took at compile time
    (``JITFunction.run``: "Global variable ... has changed since we compiled this kernel"), so a shim is its
    own deep copy and equal to any shim of the same function."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<shim {self.fn.__module__}.{self.fn.__qualname__}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NamedShim) and other.fn is self.fn

    def __hash__(self) -> int:
        return hash(self.fn)

    def __deepcopy__(self, memo: dict) -> _NamedShim:
        return self


# The helpers reference the shims through ``tl.constexpr`` wrappers: Triton's cache-key pass visits every name
# of a ``@triton.jit`` body, dead branches included, and rejects plain Python functions; a constexpr is a
# compile-time constant to it (and callable in the interpreter). The GPU compiler never reaches these calls.
_SHIM_rcp_approx_ftz = tl.constexpr(_NamedShim(_shim_rcp_approx_ftz))
_SHIM_ex2_approx_ftz = tl.constexpr(_NamedShim(_shim_ex2_approx_ftz))
_SHIM_rsqrt_approx_ftz = tl.constexpr(_NamedShim(_shim_rsqrt_approx_ftz))
_SHIM_expf_libdevice = tl.constexpr(_NamedShim(_shim_expf_libdevice))
_SHIM_div_rn = tl.constexpr(_NamedShim(_shim_div_rn))
_SHIM_bf16_rn = tl.constexpr(_NamedShim(_shim_bf16_rn))
_SHIM_fma_rn = tl.constexpr(_NamedShim(_shim_fma_rn))


# INTERPRETER SHIM for the widening casts. Triton 3.6's interpreter converts every float cast through
# ``triton.runtime.interpreter._convert_float``, which renormalises a subnormal input before re-biasing and
# then clamps the exponent at 0: bf16 2^-130 becomes 0 and 3 * 2^-133 becomes 2^-127, although bf16 and fp32
# share one exponent range and the GPU widens by a 16-bit shift (exact, subnormals kept). Every bf16 -> fp32
# widening of a kernel (``.to(tl.float32)``, and the implicit promotion of mixed bf16 / fp32 arithmetic) goes
# through that function, so the shim replaces it in this process: bf16 -> fp32 exactly, every other
# conversion by Triton's own code (its fp16 -> fp32 is exact: fp16 subnormals are fp32 normals).
def _exact_widen(data: np.ndarray, src: Any, dst: Any) -> np.ndarray | None:
    """The exact widening of interpreter ``data`` (bit patterns of ``src``) to ``dst`` as fp32 bit patterns,
    or None when the conversion is not bf16 -> fp32."""
    if src == tl.bfloat16 and dst == tl.float32:
        bits = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint16).astype(np.uint32)
        return (bits << np.uint32(16)).reshape(np.shape(data))
    return None


def _install_exact_widening() -> None:
    """Route the interpreter's float conversions through ``_exact_widen`` first (idempotent)."""
    from triton.runtime import interpreter

    if getattr(interpreter._convert_float, "_flint_exact_widening", False):
        return
    convert = interpreter._convert_float

    def _convert_float(input, input_dtype, output_dtype, rounding_mode):  # noqa: A002 (Triton's signature)
        out = _exact_widen(input, input_dtype, output_dtype)
        return convert(input, input_dtype, output_dtype, rounding_mode) if out is None else out

    _convert_float._flint_exact_widening = True
    interpreter._convert_float = _convert_float
