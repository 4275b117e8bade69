"""Triton probes running one sm_90 special-function instruction per element (for reference.mufu).

- ``rcp_approx_ftz_hw(x)``   ``rcp.approx.ftz.f32``   via ``tl.inline_asm_elementwise``
- ``ex2_approx_ftz_hw(x)``   ``ex2.approx.ftz.f32``   via ``tl.inline_asm_elementwise``
- ``rsqrt_approx_ftz_hw(x)`` ``rsqrt.approx.ftz.f32`` via ``tl.inline_asm_elementwise``
- ``expf_libdevice_hw(x)``   ``libdevice.exp`` (``__nv_expf``) as Triton 3.6 links it (nvvm-reflect ftz=1)

Each takes a CUDA fp32 tensor of any shape and returns a new fp32 tensor of that shape (input untouched);
TypeError for a non-fp32 tensor, ValueError for a non-CUDA one. Every launch pins ``enable_fp_fusion=True``
(gpu-numerics.md: Triton 3.10 flips the default). ``probe_ptx(name)`` compiles a probe for sm_90 without a GPU
(``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))``) so CI can audit the instructions.

``_helpers_probe_kernel`` runs every rule helper of ``flint_moe.kernels._rule`` and the PDL waits once,
elementwise; it is registered for the sm_90 PTX audit as ``common.helpers``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from flint_moe.kernels._launch import gdc_launch_dependents, gdc_wait
from flint_moe.kernels._rule import bf16_rn, div_rn, ex2_approx_ftz, expf_libdevice, rcp_approx_ftz, rsqrt_approx_ftz
from flint_moe.kernels.audit.registry import BF16_CVT, EXPF_LIBDEVICE, register_audit

__all__ = [
    "rcp_approx_ftz_hw",
    "ex2_approx_ftz_hw",
    "rsqrt_approx_ftz_hw",
    "expf_libdevice_hw",
    "PROBES",
    "PROBE_INSTRUCTIONS",
    "probe_ptx",
]

_BLOCK = 1024


@triton.jit
def _approx_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, ASM: tl.constexpr, OTHER: tl.constexpr):
    """y = the one-operand fp32 instruction ``ASM`` of x, elementwise (masked lanes load ``OTHER``)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=OTHER)
    y = tl.inline_asm_elementwise(ASM, "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(y_ptr + offs, y, mask=m)


@triton.jit
def _expf_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=0.0)
    tl.store(y_ptr + offs, libdevice.exp(x), mask=m)


#: name -> (kernel, its constexprs besides BLOCK): the instruction probes share ``_approx_kernel``.
_KERNELS = {
    "rcp": (_approx_kernel, {"ASM": "rcp.approx.ftz.f32 $0, $1;", "OTHER": 1.0}),
    "ex2": (_approx_kernel, {"ASM": "ex2.approx.ftz.f32 $0, $1;", "OTHER": 0.0}),
    "rsqrt": (_approx_kernel, {"ASM": "rsqrt.approx.ftz.f32 $0, $1;", "OTHER": 1.0}),
    "expf": (_expf_kernel, {}),
}

#: The PTX instruction each probe must contain (``expf``: libdevice's ftz path ends in ex2.approx.ftz.f32).
PROBE_INSTRUCTIONS = {
    "rcp": "rcp.approx.ftz.f32",
    "ex2": "ex2.approx.ftz.f32",
    "rsqrt": "rsqrt.approx.ftz.f32",
    "expf": "ex2.approx.ftz.f32",
}


def _launch(name: str, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"x: dtype must be torch.float32, got {x.dtype}")
    if x.device.type != "cuda":
        raise ValueError(f"x: the {name} probe runs on a CUDA device, got {x.device}")
    xc = x.contiguous()
    y = torch.empty_like(xc)
    n = xc.numel()
    if n:
        grid = (triton.cdiv(n, _BLOCK),)
        kernel, consts = _KERNELS[name]
        kernel[grid](xc, y, n, BLOCK=_BLOCK, **consts, num_warps=4, enable_fp_fusion=True)
    return y.view(x.shape)


def rcp_approx_ftz_hw(x: torch.Tensor) -> torch.Tensor:
    """Hardware ``rcp.approx.ftz.f32`` elementwise (CUDA fp32 [*] -> fp32 [*])."""
    return _launch("rcp", x)


def ex2_approx_ftz_hw(x: torch.Tensor) -> torch.Tensor:
    """Hardware ``ex2.approx.ftz.f32`` elementwise (CUDA fp32 [*] -> fp32 [*])."""
    return _launch("ex2", x)


def rsqrt_approx_ftz_hw(x: torch.Tensor) -> torch.Tensor:
    """Hardware ``rsqrt.approx.ftz.f32`` elementwise (CUDA fp32 [*] -> fp32 [*])."""
    return _launch("rsqrt", x)


def expf_libdevice_hw(x: torch.Tensor) -> torch.Tensor:
    """Triton's ``libdevice.exp`` (``__nv_expf``) elementwise (CUDA fp32 [*] -> fp32 [*])."""
    return _launch("expf", x)


PROBES = {
    "rcp": rcp_approx_ftz_hw,
    "ex2": ex2_approx_ftz_hw,
    "rsqrt": rsqrt_approx_ftz_hw,
    "expf": expf_libdevice_hw,
}


def probe_ptx(name: str, arch: int = 90) -> str:
    """PTX of probe ``name`` ("rcp", "ex2", "rsqrt", "expf") compiled for sm_``arch`` (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, consts = _KERNELS[name]
    src = ASTSource(
        fn=kernel,
        signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i64", "BLOCK": "constexpr"}
        | dict.fromkeys(consts, "constexpr"),
        constexprs={"BLOCK": _BLOCK, **consts},
    )
    compiled = triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": True, "num_warps": 4}
    )
    return compiled.asm["ptx"]


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
