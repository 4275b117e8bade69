"""benchmarks/runner.py on the CPU: the results writer every benchmark's table goes through."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.runner import write_table


def test_write_table(tmp_path):
    rows = [{"model": "m", "us": 1.5}, {"model": "n", "us": 2.25}]
    text = write_table(str(tmp_path), "bench_x", 4.18e12, rows, "model | us", ["| m | 1.5 |", "| n | 2.2 |"])
    assert text == (
        "copy bandwidth (2 GiB D2D, read + write): 4.180 TB/s\n\n| model | us |\n|---|---|\n| m | 1.5 |\n| n | 2.2 |\n"
    )
    assert (tmp_path / "bench_x.md").read_text() == text
    saved = json.loads((tmp_path / "bench_x.json").read_text())
    assert saved["copy_bw"] == 4.18e12 and saved["rows"] == rows and saved["time"] > 0


def test_write_results_keeps_failed_cases(tmp_path):
    from benchmarks.runner import write_results

    env = {"gpu": "NVIDIA H200", "torch": "2.11", "cuda": "13.0", "triton": "3.6.0", "date_utc": "2026-12-02",
           "copy_bandwidth_TBps": 4.2}  # fmt: skip
    rows = [
        {"case": "ll.a", "us": 70.0, "bytes": 294_000_000, "TB/s": 4.2, "of_copy_bw": 1.0, "TFLOP/s": 0.0, "note": "n"},
        {"case": "ll.b", "error": "RuntimeError: no CuTe DSL"},
    ]
    text = write_results(tmp_path / "out", env, rows)
    assert "| ll.a | 70.0 | 294,000,000 | 4.20 | 100% | 0.0 | n |" in text.splitlines()
    assert "| ll.b | - | - | - | - | - | failed: RuntimeError: no CuTe DSL |" in text.splitlines()
    assert json.loads((tmp_path / "out" / "bench.json").read_text()) == {"env": env, "rows": rows}
    assert (tmp_path / "out" / "bench.md").read_text() == text


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_runner_refuses_without_cuda():
    from benchmarks.runner import main

    assert main(["--filter", "decode_nvfp4"]) == 2
