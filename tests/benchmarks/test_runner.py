"""benchmarks/runner.py on the CPU: the results writer every benchmark's table goes through, and ``main`` with CUDA,
the copy bandwidth, the CUDA-graph timer and the case modules stood in for (rows written before the cache is
emptied, prepared state released, an empty selection refused, atomic writes, one-line error cells)."""

from __future__ import annotations

import json
import os
import pathlib

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


# --------------------------------------------------------------------------------------------------------------
# main() on the CPU: CUDA, the copy bandwidth, the CUDA-graph timer and the case modules stood in for
# --------------------------------------------------------------------------------------------------------------


class _Case:
    """A stand-in ``bench_*`` module: ``CASES`` and ``prepare`` (which keeps weak references to what it made)."""

    def __init__(self, stem: str, names: list[str]):
        self.__name__ = f"benchmarks.bench_{stem}"
        self.CASES = [{"name": n, "size": i} for i, n in enumerate(names)]
        self.made: list = []

    def prepare(self, size):
        import weakref

        from benchmarks.runner import Prepared

        prep = Prepared(fn=lambda i: None, bytes_moved=1_000_000 * (size + 1), flops=0, note=f"size {size}")
        self.made.append(weakref.ref(prep))
        return prep


def _standins(monkeypatch, tmp_path, mods, fail: dict | None = None):
    """Patch the runner for the CPU; returns the log of ``torch.cuda.empty_cache`` calls: (rows in bench.json at
    that moment, every Prepared made so far released)."""
    import benchmarks.runner as R

    log = []

    def timer(prep, graph_calls=20, replays=30):
        note = prep.note
        if fail and note in fail:
            raise type(fail[note])(*fail[note].args)  # a fresh one: a kept exception's traceback holds ``prep``
        return 10e-6

    def empty_cache():
        rows = json.loads((tmp_path / "out" / "bench.json").read_text())["rows"]
        log.append((len(rows), all(ref() is None for m in mods for ref in m.made)))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(R, "copy_bandwidth", lambda *a, **k: 4.0e12)
    monkeypatch.setattr(R, "time_graph", timer)
    monkeypatch.setattr(R, "_modules", lambda: mods)
    return log


def test_main_writes_each_row_before_freeing_memory(tmp_path, monkeypatch):
    from benchmarks.runner import main

    mods = [_Case("ll", ["a", "b"]), _Case("decode_nvfp4", ["c"])]
    log = _standins(monkeypatch, tmp_path, mods, fail={"size 1": RuntimeError("CUDA error: illegal\naddress | x")})
    assert main(["--out", str(tmp_path / "out")]) == 1  # a case raised
    # after each case: its row is on disk and its prepared state released (the failed case's too)
    assert log == [(1, True), (2, True), (3, True)]
    rows = json.loads((tmp_path / "out" / "bench.json").read_text())["rows"]
    assert [r["case"] for r in rows] == ["ll.a", "ll.b", "decode_nvfp4.c"]
    assert rows[1] == {"case": "ll.b", "error": "RuntimeError: CUDA error: illegal\naddress | x"}
    md = (tmp_path / "out" / "bench.md").read_text().splitlines()
    assert "| ll.b | - | - | - | - | - | failed: RuntimeError: CUDA error: illegal address \\| x |" in md
    assert "| ll.a | 10.0 | 1,000,000 | 0.10 | 2% | 0.0 | size 0 |" in md
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["bench.json", "bench.md"]  # no temp files


def test_main_filters_and_refuses_an_empty_selection(tmp_path, monkeypatch, capsys):
    from benchmarks.runner import main

    mods = [_Case("ll", ["a", "b"]), _Case("decode_nvfp4", ["c"])]
    log = _standins(monkeypatch, tmp_path, mods)
    assert main(["--out", str(tmp_path / "out"), "--filter", "nothing"]) == 1
    assert "no benchmark case matches the filters ['nothing']" in capsys.readouterr().err
    assert log == [] and not (tmp_path / "out").exists()
    assert main(["--out", str(tmp_path / "out"), "--filter", "ll.b", "--filter", "nvfp4.c"]) == 0
    assert [r["case"] for r in json.loads((tmp_path / "out" / "bench.json").read_text())["rows"]] == [
        "ll.b", "decode_nvfp4.c"
    ]  # fmt: skip


def test_results_are_replaced_atomically(tmp_path, monkeypatch):
    """Each file is written to a temporary file beside it and renamed over it; a failing write leaves the old
    file whole and no temporary file."""
    import benchmarks.runner as R

    env = {"gpu": "g", "torch": "t", "cuda": "c", "triton": "3.6.0", "date_utc": "d", "copy_bandwidth_TBps": 4.0}
    R.write_results(tmp_path, env, [])
    before = (tmp_path / "bench.json").read_text()
    replaced = []
    real = os.replace
    monkeypatch.setattr(R.os, "replace", lambda a, b: replaced.append((pathlib.Path(a).parent, pathlib.Path(b).name))
                        or real(a, b))  # fmt: skip
    R.write_results(tmp_path, env, [{"case": "x", "error": "E"}])
    assert replaced == [(tmp_path, "bench.json"), (tmp_path, "bench.md")]

    def broken(a, b):
        raise OSError("disk full")

    monkeypatch.setattr(R.os, "replace", broken)
    with pytest.raises(OSError):
        R.write_results(tmp_path, env, [])
    assert json.loads((tmp_path / "bench.json").read_text())["rows"] == [{"case": "x", "error": "E"}] != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md"]
