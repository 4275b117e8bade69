"""benchmarks/runner.py on the CPU: the results writer every benchmark's table goes through."""

from __future__ import annotations

import json

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
