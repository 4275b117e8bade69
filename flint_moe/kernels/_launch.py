"""Launch options, the interpreter switch, programmatic-dependent-launch waits, and op input checks.

``INTERPRET`` is True when this module was imported with ``TRITON_INTERPRET=1``; then every ``@triton.jit``
of the process imported afterwards is an interpreter object, the rule helpers (``flint_moe.kernels._rule``)
take their shim branch, and the interpreter's exact bf16 widening (``flint_moe.kernels._shims``) is
installed.

Device helpers (``@triton.jit``; call them from kernels):

=============================  ======================================  ==================
helper                         GPU (sm_90) lowering                    interpreter (CPU)
=============================  ======================================  ==================
``gdc_wait()``                 ``griddepcontrol.wait``                 no-op
``gdc_launch_dependents()``    ``griddepcontrol.launch_dependents``    no-op
=============================  ======================================  ==================

Launching: every launch is ``kernel[grid](..., **launch_options())``: ``enable_fp_fusion=True`` always (rule
"Accumulation": Triton 3.10 flips the default) and ``launch_pdl=True`` on the GPU (programmatic dependent
launch; the kernel must call ``gdc_wait()`` before it reads anything an earlier kernel wrote). The
interpreter drops launch options that are not kernel arguments.

Errors: ``check_op_tensor`` raises ``TypeError`` (not a tensor, wrong dtype) or ``ValueError`` (shape,
device, contiguity) with a message that starts with the tensor's name.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents as _gdc_launch_dependents_ptx, gdc_wait as _gdc_wait_ptx

from flint_moe.reference._checks import check_tensor

__all__ = ["INTERPRET", "gdc_wait", "gdc_launch_dependents", "launch_options", "check_op_tensor", "check_taps"]

#: True when this module was imported with TRITON_INTERPRET=1 (then every ``@triton.jit`` of the process
#: imported afterwards is an interpreter object and the helpers below take their shim branch).
INTERPRET: bool = bool(triton.knobs.runtime.interpret)
_INTERPRET = tl.constexpr(INTERPRET)

if INTERPRET:
    from flint_moe.kernels._shims import _install_exact_widening

    _install_exact_widening()


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


def check_taps(taps: object) -> bool:
    """True when ``taps`` is a dict (the tapped build runs), False when it is None.

    Raises ``TypeError`` naming ``taps`` for anything else.
    """
    if taps is not None and not isinstance(taps, dict):
        raise TypeError(f"taps: expected a dict or None, got {type(taps).__name__}")
    return taps is not None
