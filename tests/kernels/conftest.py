"""Triton backend for the kernel tests (tests/kernels), decided once per process before any kernel import.

- No CUDA device (CPU CI): ``TRITON_INTERPRET=1`` is set here, at conftest import, so every
  ``flint_moe.kernels`` module imported afterwards builds interpreter objects (``triton.jit`` reads the
  variable when it decorates). pytest imports this conftest when it collects tests/kernels, before the test modules of
  this directory, in every pytest-xdist worker alike.
- A CUDA device (the H200): the variable is left as it is; ``pytest -m gpu`` runs the compiled kernels.
  ``TRITON_INTERPRET=1 pytest tests/kernels`` runs the interpreter tests there too.

Each test module of this directory says which backend it needs with a module-level ``BACKEND``:
``"interpreter"`` (default for tests without the ``gpu`` marker), ``"gpu"`` (default with it) or ``"any"``
(the PTX audit, which compiles in a subprocess). A test whose backend is not this process's is skipped.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

# The root tests/conftest.py sets TRITON_INTERPRET=1 without CUDA, before anything imports triton.
if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:  # pragma: no cover - safety net
    os.environ["TRITON_INTERPRET"] = "1"

_WANT_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
_launch = sys.modules.get("flint_moe.kernels._launch")
if _launch is not None and _launch.INTERPRET != _WANT_INTERPRET:
    raise pytest.UsageError(
        "flint_moe.kernels._launch was imported before tests/kernels/conftest.py set the Triton backend "
        f"(INTERPRET={_launch.INTERPRET}, wanted {_WANT_INTERPRET}); run tests/kernels in its own process"
    )

from flint_moe.kernels._launch import INTERPRET  # noqa: E402


@pytest.fixture(autouse=True)
def _backend_guard(request: pytest.FixtureRequest) -> None:
    """Skip a test whose module's BACKEND does not match this process's Triton backend."""
    default = "gpu" if request.node.get_closest_marker("gpu") is not None else "interpreter"
    backend = getattr(request.module, "BACKEND", default)
    if request.node.get_closest_marker("gpu") is not None:
        backend = "gpu"
    if backend == "interpreter" and not INTERPRET:
        pytest.skip("interpreter test: run with TRITON_INTERPRET=1 (set automatically without CUDA)")
    if backend == "gpu" and INTERPRET:
        pytest.skip("GPU test: needs a CUDA device and TRITON_INTERPRET unset")
