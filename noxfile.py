"""Sessions: ``nox -s conformance`` (the main job: gpu profile when a GPU is present, else cpu), ``nox -s tests``
(CPU test suite, what CI runs; the case matrix as pytest tests is ``slow``-marked, so it is not run twice),
``nox -s golden`` (the golden model alone on a real-size layer), ``nox -s bench`` (GPU), ``nox -s lint``.

The CPU install takes torch 2.13.0 from the machine's local CPU build and pins triton to 3.6.0, the H200's
version, so the interpreter and the sm_90 compile audit see the GPU machine's compiler.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"
CPU_PINS = ("torch==2.13.0", "triton==3.6.0")


def _install(session: nox.Session, extras: str) -> None:
    session.install(*CPU_PINS)
    session.install("-e", f".[{extras}]")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """CPU test suite incl. the oracle tests (ModelOpt, FlashInfer). Extra args go to pytest."""
    _install(session, "test,oracle")
    workers = os.environ.get("FLINT_TEST_WORKERS", "auto")
    args = session.posargs or ["-n", workers, "-q"]
    # pytest exit 5 (no tests collected) is a failure here: a suite that ran nothing proves nothing.
    session.run("python", "-m", "pytest", *args, success_codes=[0])


@nox.session(python=PYTHON)
def golden(session: nox.Session) -> None:
    """Run the golden model on a DeepSeek-V3-size layer for a few tokens and print its stage table."""
    _install(session, "test")
    args = session.posargs or ["--model", "deepseek-v3", "--tokens", "4"]
    session.run("python", "-m", "flint_moe.tools.golden", *args)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks under CUDA graphs (needs the GPU; on the H200, which has no nox, run
    ``PYTHONPATH=$PWD python3 -m benchmarks.runner``). Extra args go to the runner. Without an NVIDIA GPU the
    session is skipped before it installs anything."""
    if not _has_gpu():
        session.skip("benchmarks need an NVIDIA GPU (the H200); nothing timed")
    _install(session, "test")
    session.run("python", "-m", "benchmarks.runner", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check over the package, tests and noxfile."""
    session.install("ruff")
    session.run("ruff", "check", "flint_moe", "tests", "noxfile.py")


def _has_gpu() -> bool:
    """An NVIDIA GPU is present (``nvidia-smi -L`` lists one)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


@nox.session(python=PYTHON)
def conformance(session: nox.Session) -> None:
    """Main job: every kernel path against the golden model (python -m flint_moe.conformance), writing
    reports/<run-id>/report.json, summary.md, summary-full.md and report.html, ending with the GPU-report
    freshness line.

    Profile: ``gpu`` when an NVIDIA GPU is present (torch then comes from PyPI's default, CUDA, build instead of
    the local CPU one), else ``cpu`` (Triton interpreter). Args after ``--`` pass through (``--profile``,
    ``--filter S``, ``--baseline OTHER``, ``--out DIR``, ``--mutation``, ``--invariance``, ``--list``...);
    a ``--profile`` there overrides the choice."""
    gpu = _has_gpu()
    if gpu:
        session.install("torch>=2.11", "triton==3.6.0")
        session.install("-e", ".[test,report]")
    else:
        _install(session, "test,report")
    args = list(session.posargs)
    if not any(a == "--profile" or a.startswith("--profile=") for a in args):
        args = ["--profile", "gpu" if gpu else "cpu", *args]
    session.run("python", "-m", "flint_moe.conformance", *args)
