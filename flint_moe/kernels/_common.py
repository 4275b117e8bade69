"""Shared pieces of the Triton kernels: rule instructions, interpreter shims, launch options, input checks,
and the sm_90 PTX audit registry (docs/CONTRACTS.md, "Issue 4"; owner E).

Device helpers (``@triton.jit``; call them from kernels), each pinned to the rule's PTX instruction on the
GPU:

=====================  =======================================  ==========================  ============
helper                 GPU (sm_90) lowering                     interpreter (CPU) path       rule step
=====================  =======================================  ==========================  ============
``rcp_approx_ftz(x)``  inline PTX ``rcp.approx.ftz.f32``        SHIM: ``mufu.rcp_approx_ftz``   7
``ex2_approx_ftz(x)``  inline PTX ``ex2.approx.ftz.f32``        SHIM: ``mufu.ex2_approx_ftz``   7
``rsqrt_approx_ftz``   inline PTX ``rsqrt.approx.ftz.f32``      SHIM: ``mufu.rsqrt_approx_ftz`` 11
``expf_libdevice(x)``  ``libdevice.exp`` (``__nv_expf``, ftz)   SHIM: ``mufu.expf_libdevice``   3
``div_rn(a, b)``       ``div.rn.f32`` (``tl.math.div_rn``)      SHIM: numpy fp32 divide (IEEE)  3, 4, 11
``bf16_rn(x)``         inline PTX ``cvt.rn.bf16.f32``           SHIM: ``formats.round_bf16``    1, 4, 7-10
``gdc_wait()``         ``griddepcontrol.wait``                  no-op
``gdc_launch_dependents()`` ``griddepcontrol.launch_dependents``  no-op
=====================  =======================================  ==========================  ============

All take and return fp32 tensors (``bf16_rn`` returns bf16) of any block shape. ``expf_libdevice`` is only
defined for inputs that are bf16 values widened to fp32 (rule step 3); under the interpreter the shim raises
``ValueError`` for any other value, so masked-out lanes must hold a bf16 value too (e.g. ``other=0.0``).

Interpreter shims (``INTERPRET`` True, i.e. ``TRITON_INTERPRET=1`` when this module was imported): Triton's
interpreter runs a ``@triton.jit`` function as ordinary Python on ``tl.tensor`` objects whose ``handle`` is a
``TensorHandle`` holding a numpy array (bf16 stored as uint16 bit patterns; triton/runtime/interpreter.py),
so a helper can call plain Python. Each helper branches on the compile-time constant ``_INTERPRET``: the GPU
compiler folds the branch away and never sees the Python call; the interpreter calls the golden model's
bit-exact emulation (``flint_moe.reference.mufu`` / ``formats.round_bf16``, exact integer
round-to-nearest-even),
never the interpreter's own bf16 cast (which truncates) nor its ``exp``. Every shim below is named
``_SHIM_*`` and marked ``INTERPRETER SHIM``.

Launching: every launch is ``kernel[grid](..., **launch_options())``: ``enable_fp_fusion=True`` always (rule
"Accumulation": Triton 3.10 flips the default) and ``launch_pdl=True`` on the GPU (programmatic dependent
launch; the kernel must call ``gdc_wait()`` before it reads anything an earlier kernel wrote). The
interpreter drops launch options that are not kernel arguments.

PTX audit: kernel modules call ``register_audit(...)`` from a module-level ``audit_specs()`` function that
they run at import. ``collect_audit_specs()`` imports every module of ``flint_moe.kernels`` and returns the
registry; ``run_audit(name)`` compiles one specialisation for sm_90 on the CPU
(``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``; Triton bundles ptxas) and returns the
list of problems. Under ``TRITON_INTERPRET=1`` ``@triton.jit`` builds interpreter objects that cannot be
compiled, so the audit test runs ``python -m flint_moe.kernels._common audit NAME`` in a subprocess with
``TRITON_INTERPRET`` removed from its environment.

Errors: ``check_op_tensor`` raises ``TypeError`` (not a tensor, wrong dtype) or ``ValueError`` (shape,
device, contiguity) with a message that starts with the tensor's name.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents_ptx, gdc_wait as _gdc_wait_ptx

from flint_moe.reference._checks import check_tensor

__all__ = [
    "INTERPRET",
    "rcp_approx_ftz",
    "ex2_approx_ftz",
    "rsqrt_approx_ftz",
    "expf_libdevice",
    "div_rn",
    "bf16_rn",
    "gdc_wait",
    "gdc_launch_dependents",
    "launch_options",
    "check_op_tensor",
    "AuditSpec",
    "AUDIT_REGISTRY",
    "DEFAULT_FORBID",
    "BF16_CVT",
    "register_audit",
    "compile_ptx_sm90",
    "audit_ptx",
    "collect_audit_specs",
    "run_audit",
    "EXPF_LIBDEVICE",
    "audit_specs",
]

#: True when this module was imported with TRITON_INTERPRET=1 (then every ``@triton.jit`` of the process
#: imported afterwards is an interpreter object and the helpers below take their shim branch).
INTERPRET: bool = bool(triton.knobs.runtime.interpret)
_INTERPRET = tl.constexpr(INTERPRET)


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


class _NamedShim:
    """An interpreter shim callable whose ``repr`` names the function, not its address.

    Triton 3.6 hashes ``str(value)`` of every ``tl.constexpr`` global a kernel body names
    (``JITFunction.cache_key``), dead branches included; a plain function prints its memory address, which
    made every process's cache key differ and every process compile anew. The compiled code does not depend
    on it: the shims sit in ``if _INTERPRET:`` branches that the GPU compiler folds away unvisited."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<shim {self.fn.__module__}.{self.fn.__qualname__}>"


# The helpers reference the shims through ``tl.constexpr`` wrappers: Triton's cache-key pass visits every name
# of a ``@triton.jit`` body, dead branches included, and rejects plain Python functions; a constexpr is a
# compile-time constant to it (and callable in the interpreter). The GPU compiler never reaches these calls.
_SHIM_rcp_approx_ftz = tl.constexpr(_NamedShim(_shim_rcp_approx_ftz))
_SHIM_ex2_approx_ftz = tl.constexpr(_NamedShim(_shim_ex2_approx_ftz))
_SHIM_rsqrt_approx_ftz = tl.constexpr(_NamedShim(_shim_rsqrt_approx_ftz))
_SHIM_expf_libdevice = tl.constexpr(_NamedShim(_shim_expf_libdevice))
_SHIM_div_rn = tl.constexpr(_NamedShim(_shim_div_rn))
_SHIM_bf16_rn = tl.constexpr(_NamedShim(_shim_bf16_rn))


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


if INTERPRET:
    _install_exact_widening()


# =========================================================================================================
# Device helpers
# =========================================================================================================


@triton.jit
def rcp_approx_ftz(x):
    """fp32 -> fp32 ``rcp.approx.ftz.f32`` (rule step 7). Interpreter: SHIM to mufu.rcp_approx_ftz."""
    if _INTERPRET:
        return _SHIM_rcp_approx_ftz(x)
    else:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )


@triton.jit
def ex2_approx_ftz(x):
    """fp32 -> fp32 ``ex2.approx.ftz.f32`` (rule step 7). Interpreter: SHIM to mufu.ex2_approx_ftz."""
    if _INTERPRET:
        return _SHIM_ex2_approx_ftz(x)
    else:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )


@triton.jit
def rsqrt_approx_ftz(x):
    """fp32 -> fp32 ``rsqrt.approx.ftz.f32`` (rule step 11). Interpreter: SHIM to mufu.rsqrt_approx_ftz."""
    if _INTERPRET:
        return _SHIM_rsqrt_approx_ftz(x)
    else:
        return tl.inline_asm_elementwise(
            "rsqrt.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
        )


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
def gdc_wait():
    """Programmatic dependent launch: wait until the previous kernel's writes are visible
    (``griddepcontrol.wait``; harmless without PDL). No-op under the interpreter."""
    if not _INTERPRET:
        _gdc_wait_ptx()


@triton.jit
def gdc_launch_dependents():
    """Programmatic dependent launch: let the next kernel start its prologue
    (``griddepcontrol.launch_dependents``). No-op under the interpreter."""
    if not _INTERPRET:
        _gdc_launch_dependents_ptx()


@triton.jit
def _helpers_probe_kernel(x_ptr, f32_ptr, bf16_ptr, n, BLOCK: tl.constexpr):
    """Every helper once, elementwise (audited as ``common.helpers``; tested under the interpreter).

    f32_ptr[0:6, i] = rcp, ex2, rsqrt, expf(fp32(bf16_rn(x))), div_rn(x, x + 1), x (fp32 [6, n]);
    bf16_ptr[i] = bf16_rn(x).
    """
    gdc_wait()
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(f32_ptr + offs, rcp_approx_ftz(x), mask=m)
    tl.store(f32_ptr + n + offs, ex2_approx_ftz(x), mask=m)
    tl.store(f32_ptr + 2 * n + offs, rsqrt_approx_ftz(x), mask=m)
    xb = bf16_rn(x)
    tl.store(f32_ptr + 3 * n + offs, expf_libdevice(xb.to(tl.float32)), mask=m)
    tl.store(f32_ptr + 4 * n + offs, div_rn(x, x + 1.0), mask=m)
    tl.store(f32_ptr + 5 * n + offs, x, mask=m)
    tl.store(bf16_ptr + offs, xb, mask=m)
    gdc_launch_dependents()


# =========================================================================================================
# Launch options and input validation
# =========================================================================================================


def launch_options(pdl: bool = True) -> dict[str, bool]:
    """Keyword arguments for every ``kernel[grid](..., **launch_options())``.

    ``enable_fp_fusion=True`` always (pinned: results must not depend on Triton's default);
    ``launch_pdl=True``
    when ``pdl`` and not under the interpreter (programmatic dependent launch; the kernel calls ``gdc_wait()``
    before reading its inputs).
    """
    opts = {"enable_fp_fusion": True}
    if pdl and not INTERPRET:
        opts["launch_pdl"] = True
    return opts


def check_op_tensor(
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    shape: Sequence[int | None] | None = None,
    device: torch.device | str | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    """Validate an op's input tensor and return it unchanged (never copied or modified).

    ``shape`` entries that are ``None`` match any size. ``device`` compares the device type and, when the
    given device has an index, the index. Raises ``TypeError`` (not a tensor, wrong dtype) or ``ValueError``
    (rank, shape, device, not contiguous); the message starts with ``name``.
    """
    check_tensor(name, t, dtype=dtype, shape=None if shape is None else tuple(shape))
    if device is not None:
        dev = torch.device(device)
        if t.device.type != dev.type or (dev.index is not None and t.device.index != dev.index):
            raise ValueError(f"{name}: must be on {dev}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})")
    return t


# =========================================================================================================
# PTX audit
# =========================================================================================================

#: ``require`` entry for the rule's bf16 conversion: either form satisfies it.
BF16_CVT: tuple[str, ...] = ("cvt.rn.bf16.f32", "cvt.rn.bf16x2.f32")
#: Forbidden by default: approximate division, and any fp64 instruction
#: (``re:`` = regex on instruction lines).
DEFAULT_FORBID: tuple[str, ...] = (
    "div.full.f32",
    r"re:^\s*(@!?%p\d+\s+)?[a-z][a-z0-9_]*(\.[a-z0-9_]+)*\.f64\b",
)


@dataclass(frozen=True)
class AuditSpec:
    """One kernel specialisation to compile for sm_90 and audit.

    ``signature``: argument name -> Triton type string (``"*fp32"``, ``"i32"``, ...); constexpr arguments
    may be left out (they are filled from ``constexprs``). ``require``: each entry a string that must occur
    in the PTX instructions, or a tuple of alternatives (one must occur). ``forbid``: strings that must not
    occur; an entry ``"re:PATTERN"`` is a regex searched on each instruction line. ``options``: compile
    options (num_warps, ...); ``enable_fp_fusion`` is always True.
    """

    name: str
    kernel: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    require: tuple[Any, ...]
    forbid: tuple[str, ...] = DEFAULT_FORBID
    options: dict[str, Any] = field(default_factory=dict)


#: name -> AuditSpec, filled by the kernel modules' ``audit_specs()`` at import.
AUDIT_REGISTRY: dict[str, AuditSpec] = {}


def register_audit(
    name: str,
    kernel: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    require: Sequence[Any],
    forbid: Sequence[str] = DEFAULT_FORBID,
    *,
    options: dict[str, Any] | None = None,
) -> AuditSpec:
    """Register a specialisation for the sm_90 PTX audit (idempotent for the same kernel and arguments).

    Raises ``ValueError`` when ``name`` is already registered with a different kernel or arguments.
    """
    spec = AuditSpec(
        name=name,
        kernel=kernel,
        signature=dict(signature),
        constexprs=dict(constexprs),
        require=tuple(tuple(r) if isinstance(r, (list, tuple)) else r for r in require),
        forbid=tuple(forbid),
        options=dict(options or {}),
    )
    old = AUDIT_REGISTRY.get(name)
    if old is not None and (
        getattr(old.kernel, "fn", old.kernel) is not getattr(kernel, "fn", kernel)
        or (old.signature, old.constexprs, old.require, old.forbid, old.options)
        != (spec.signature, spec.constexprs, spec.require, spec.forbid, spec.options)
    ):
        raise ValueError(f"register_audit: name {name!r} is already registered with different arguments")
    AUDIT_REGISTRY[name] = spec
    return spec


def compile_ptx_sm90(
    kernel: Any, signature: dict[str, str], constexprs: dict[str, Any], options: dict[str, Any] | None = None
) -> str:
    """PTX of ``kernel`` specialised by ``signature`` / ``constexprs``, compiled for sm_90 without a GPU.

    Raises ``RuntimeError`` when ``kernel`` is an interpreter object (TRITON_INTERPRET=1 at import):
    compile in
    a process without that variable (``python -m flint_moe.kernels._common audit NAME``).
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    if not isinstance(kernel, JITFunction):
        raise RuntimeError(
            f"compile_ptx_sm90: {getattr(kernel, '__name__', kernel)!r} is not a JITFunction "
            "(was it imported "
            "with TRITON_INTERPRET=1?); run `python -m flint_moe.kernels._common audit NAME` without it"
        )
    sig: dict[str, str] = {}
    for arg in kernel.arg_names:
        if arg in constexprs:
            sig[arg] = "constexpr"
        elif arg in signature:
            sig[arg] = signature[arg]
        else:
            raise ValueError(f"compile_ptx_sm90: argument {arg!r} of {kernel.__name__} has no type or value")
    opts = {"num_warps": 4, **(options or {}), "enable_fp_fusion": True}
    src = ASTSource(fn=kernel, signature=sig, constexprs=dict(constexprs))
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    return compiled.asm["ptx"]


def _instruction_lines(ptx: str) -> list[str]:
    lines = []
    for raw in ptx.splitlines():
        line = raw.split("//", 1)[0].strip()
        if not line or line.startswith(".") or line.endswith(":") or line in ("{", "}"):
            continue
        lines.append(line)
    return lines


def audit_ptx(ptx: str, require: Sequence[Any], forbid: Sequence[str] = DEFAULT_FORBID) -> list[str]:
    """Problems of ``ptx`` against ``require`` / ``forbid`` (see ``AuditSpec``); empty when it passes.

    Comments and directives (``.reg``, ``.loc``, ...) are ignored.
    """
    lines = _instruction_lines(ptx)
    text = "\n".join(lines)
    problems = []
    for req in require:
        alts = req if isinstance(req, tuple) else (req,)
        if not any(a in text for a in alts):
            problems.append(f"required instruction missing: {' or '.join(alts)}")
    for fb in forbid:
        if fb.startswith("re:"):
            pat = re.compile(fb[3:])
            hits = [ln for ln in lines if pat.search(ln)]
        else:
            hits = [ln for ln in lines if fb in ln]
        if hits:
            problems.append(f"forbidden {fb!r} present ({len(hits)}x), e.g. {hits[0]!r}")
    return problems


def collect_audit_specs() -> dict[str, AuditSpec]:
    """Import every module of ``flint_moe.kernels`` (running each ``audit_specs()``); return the registry."""
    import flint_moe.kernels as pkg

    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
        hook = getattr(mod, "audit_specs", None)
        if callable(hook):
            hook()
    return dict(AUDIT_REGISTRY)


def run_audit(name: str) -> list[str]:
    """Compile registered specialisation ``name`` for sm_90 and return its audit problems (empty = pass)."""
    specs = collect_audit_specs()
    if name not in specs:
        raise KeyError(f"run_audit: no audit specialisation named {name!r}")
    s = specs[name]
    ptx = compile_ptx_sm90(s.kernel, s.signature, s.constexprs, s.options)
    return audit_ptx(ptx, s.require, s.forbid)


#: The instructions of libdevice ``__nv_expf`` (ftz) as Triton 3.6 links it: a round-down fma, then ex2.
EXPF_LIBDEVICE: tuple[str, ...] = ("fma.rm.ftz.f32", "ex2.approx.ftz.f32")


def audit_specs() -> None:
    """Register this module's audit specialisation: ``common.helpers`` (every helper's GPU lowering)."""
    register_audit(
        "common.helpers",
        _helpers_probe_kernel,
        {"x_ptr": "*fp32", "f32_ptr": "*fp32", "bf16_ptr": "*bf16", "n": "i64"},
        {"BLOCK": 256},
        [
            "rcp.approx.ftz.f32",
            "ex2.approx.ftz.f32",
            "rsqrt.approx.ftz.f32",
            *EXPF_LIBDEVICE,
            "div.rn.f32",
            BF16_CVT,
            "griddepcontrol.wait",
            "griddepcontrol.launch_dependents",
        ],
    )


audit_specs()


def _main(argv: Sequence[str]) -> int:
    """``python -m flint_moe.kernels._common list`` | ``audit NAME...`` (prints JSON; exit 1 on problems)."""
    if not argv or argv[0] not in ("list", "audit"):
        print("usage: python -m flint_moe.kernels._common list | audit NAME...", file=sys.stderr)
        return 2
    if argv[0] == "list":
        print(json.dumps(sorted(collect_audit_specs())))
        return 0
    if INTERPRET:
        print("audit: unset TRITON_INTERPRET (the audit compiles real PTX)", file=sys.stderr)
        return 2
    result = {n: run_audit(n) for n in argv[1:]}
    print(json.dumps(result))
    return 1 if any(result.values()) else 0


if __name__ == "__main__":
    # Run through the package module so that the kernel modules register into the same registry.
    from flint_moe.kernels._common import _main as _package_main

    sys.exit(_package_main(sys.argv[1:]))
