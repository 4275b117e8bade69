"""Test options shared by the whole suite.

- Triton backend: without a CUDA device, ``TRITON_INTERPRET=1`` is set HERE, when pytest imports this root
  conftest and before any test module imports triton. ``triton.language`` decides at its own import whether its
  standard functions (``tl.zeros``, ...) are interpreter objects, so setting the variable any later (e.g. in
  tests/kernels/conftest.py after another module imported triton) breaks every interpreted kernel. Tests that
  need real sm_90 PTX compile in a subprocess with the variable removed (tests/kernels/test_ptx_audit.py).

- ``--run-slow`` (or ``FLINT_SLOW=1``) runs tests marked ``slow`` (exhaustive 2^32 sweeps on the CPU).
- Tests marked ``gpu`` run only where CUDA is available (the H200 runs; CI has no GPU).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="run exhaustive (slow) tests")


def _slow_enabled(config: pytest.Config) -> bool:
    return bool(config.getoption("--run-slow")) or os.environ.get("FLINT_SLOW", "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_slow = _slow_enabled(config)
    has_cuda = torch.cuda.is_available()
    skip_slow = pytest.mark.skip(reason="exhaustive sweep: opt in with --run-slow or FLINT_SLOW=1")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (runs on the H200, not in CPU CI)")
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
