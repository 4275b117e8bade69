"""The conformance case matrix as pytest tests: one test per case id, FAIL = test failure.

    pytest --run-slow tests/conformance/test_matrix.py                  # cpu profile (no CUDA): ~2 min
    pytest --run-slow -n 8 -p xdist tests/conformance/test_matrix.py    # gpu profile on an 8-GPU host

The profile is ``gpu`` when CUDA is available, else ``cpu`` (``FLINT_CONFORMANCE_PROFILE`` overrides;
``FLINT_CONFORMANCE_FILTER=a,b`` keeps case ids containing every substring; ``FLINT_CONFORMANCE_INVARIANCE=0|1``
overrides the invariance checks, default on for gpu). Every case test is marked ``slow`` so that
``nox -s tests`` (CI) does not run the matrix a second time beside ``nox -s conformance``; the gpu ones are
also marked ``gpu``. With pytest-xdist each worker ``gwN`` runs on GPU ``N mod device_count`` (run one
worker per GPU: ``-n $(nvidia-smi -L | wc -l)``). The CLI (``python -m flint_moe.conformance``) is what
writes the reports; this entry point only gives pass/fail per case (with the failure details).
"""

from __future__ import annotations

import os

import pytest
import torch

from flint_moe.conformance.__main__ import select
from flint_moe.conformance.inputs.cases import Case
from flint_moe.conformance.run.runner import run_case

PROFILE = os.environ.get("FLINT_CONFORMANCE_PROFILE") or ("gpu" if torch.cuda.is_available() else "cpu")
FILTERS = [f for f in os.environ.get("FLINT_CONFORMANCE_FILTER", "").split(",") if f]
_INV = os.environ.get("FLINT_CONFORMANCE_INVARIANCE", "")
INVARIANCE = (PROFILE == "gpu") if _INV == "" else _INV not in ("0", "false", "no")
CASE_IDS = [c.id for c in select(PROFILE, FILTERS)]
MARKS = [pytest.mark.slow] + ([pytest.mark.gpu] if PROFILE == "gpu" else [])


def worker_index(worker: str | None, devices: int) -> int:
    """CUDA device index of the xdist worker ``worker`` (``"gw3"``; None / "master" without xdist):
    ``N mod devices``. Raises ValueError for ``devices < 1``."""
    if devices < 1:
        raise ValueError(f"worker_index: devices must be >= 1, got {devices}")
    if not worker or not worker.startswith("gw") or not worker[2:].isdigit():
        return 0
    return int(worker[2:]) % devices


@pytest.fixture(scope="session")
def device() -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    idx = worker_index(os.environ.get("PYTEST_XDIST_WORKER"), torch.cuda.device_count())
    torch.cuda.set_device(idx)
    return torch.device("cuda", idx)


@pytest.fixture(scope="session")
def counter(device):
    from flint_moe.ops import make_route_counter

    return make_route_counter(device)


@pytest.mark.parametrize("case_id", [pytest.param(i, id=i, marks=MARKS) for i in CASE_IDS])
def test_case(case_id, device, counter):
    from flint_moe.conformance.report.summary import _details

    res = run_case(Case.from_id(case_id), device, counter, invariance=INVARIANCE)
    details = "\n".join(_details(res.to_json()))
    assert res.verdict != "FAIL", f"{case_id} on {device}: FAIL\n{details}"


def test_worker_index():
    assert [worker_index(f"gw{n}", 4) for n in range(6)] == [0, 1, 2, 3, 0, 1]
    assert worker_index(None, 8) == worker_index("master", 8) == 0
    with pytest.raises(ValueError, match="devices must be >= 1"):
        worker_index("gw0", 0)


def test_matrix_is_collected():
    assert CASE_IDS, "no case selected: check FLINT_CONFORMANCE_PROFILE / FLINT_CONFORMANCE_FILTER"
    assert all(Case.from_id(i).id == i for i in CASE_IDS)
