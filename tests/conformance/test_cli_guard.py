"""The CLI refuses the gpu profile on a machine without CUDA unless --force is given (real shapes under the
interpreter would take minutes per case and claim nothing)."""

from __future__ import annotations

import pytest
import torch

from flint_moe.conformance.__main__ import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="the guard only applies without CUDA")
def test_gpu_profile_without_cuda_is_refused(capsys):
    assert main(["--profile", "gpu", "--filter", "qwen3-30b-a3b/M1/gaussian"]) == 2
    assert "--force" in capsys.readouterr().out


def test_backend_line_names_the_device_once():
    from flint_moe.conformance.report.summary import backend_line

    line = backend_line({"backend": "triton-cuda (NVIDIA H200)", "gpu": "NVIDIA H200"})
    assert line.count("NVIDIA H200") == 1 and "measured on this GPU" in line


def test_summary_has_the_run_line():
    from flint_moe.conformance.report.summary import summary_markdown

    env = {
        "backend": "triton-interpreter (CPU)",
        "date_utc": "2026-11-29T00:00:00+00:00",
        "cases_run": "1 of 20",
        "profile": "cpu",
        "git_commit": "abc123",
        "command": "python -m flint_moe.conformance --profile cpu",
    }
    text = summary_markdown([], env)
    assert "Run: 2026-11-29T00:00:00+00:00; cases 1 of 20 of profile `cpu`; commit `abc123`; command " in text
