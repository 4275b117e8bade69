"""Shared benchmark runner: times every ``benchmarks/bench_*.py`` under CUDA graphs and writes one table.

A benchmark module holds only its setup (Liger-Kernel style):

- ``CASES: list[dict]`` — keyword arguments of ``prepare``; each dict must have a ``"name"``.
- ``prepare(**case) -> Prepared`` — allocates weights/inputs (``rotations`` independent sets, so the 60 MB
  L2 of the H200 does not serve a replay from the previous one) and returns a callable ``fn(i)`` that runs
  the op once on set ``i % rotations``, plus the bytes the op must move (each input read once, each output
  written once) and its flops.

The runner measures the device-to-device copy bandwidth in the same process (bytes read + written), then for
each case captures a CUDA graph of ``graph_calls`` calls cycling through the sets, replays it (warm-up, then
``replays`` timed replays with CUDA events), and reports the median time per call, achieved bandwidth and its
fraction of the measured copy bandwidth (METHOD.md: events, warm-up, graphs, rotation, median).

``python -m benchmarks.runner [--filter SUBSTR ...] [--out DIR]`` writes ``DIR/bench.md`` and ``DIR/bench.json``
(default ``reports/bench``) after every case, each file replaced atomically (a run cut short keeps what it
measured, never half a file; a case that raises is a row with its error on one line, and the exit status is 1)
and prints the table last. No case matching the filters: nothing is measured, exit status 1.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import pathlib
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Prepared", "copy_bandwidth", "time_graph", "profile_kernels", "write_table", "write_results", "main"]


def _write_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and ``os.replace``: a reader (or a
    run killed mid-write) sees the old file or the new one, never a part."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _cell(value) -> str:
    """A markdown table cell: each line break (``\\n``, ``\\r\\n``, ``\\r``, ...) as one space, pipes escaped."""
    return " ".join(str(value).splitlines()).replace("|", "\\|")


@dataclass
class Prepared:
    """What a benchmark case hands the runner. ``fn(i)`` runs one op on input set ``i % rotations``."""

    fn: Callable[[int], object]
    bytes_moved: int
    flops: int = 0
    rotations: int = 1
    note: str = ""


def copy_bandwidth(nbytes: int = 1 << 31, replays: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), median of ``replays``."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    times = []
    for _ in range(3):
        dst.copy_(src)
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    return nbytes / statistics.median(times)


def time_graph(prep: Prepared, graph_calls: int = 20, replays: int = 30) -> float:
    """Median seconds per call of ``prep.fn`` replayed from a CUDA graph of ``graph_calls`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(max(3, prep.rotations)):  # warm-up: compile and autotune outside the graph
            prep.fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(graph_calls):
            prep.fn(i)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return replay_median(graph, graph_calls, replays)


def replay_median(graph: torch.cuda.CUDAGraph, calls: int, replays: int) -> float:
    """Median seconds per call of a captured ``graph`` holding ``calls`` calls, over ``replays`` replays each
    timed by a pair of CUDA events (the graph is already warm)."""
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3 / calls)
    return statistics.median(times)


def profile_kernels(fn, calls: int = 10, warmup: int = 3) -> dict[str, float]:
    """Kernel name (first 80 characters) -> mean device microseconds per call of ``fn(i)`` over ``calls`` eager
    calls under torch.profiler (after ``warmup`` calls), longest first: where a path spends its device time."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(i)
        torch.cuda.synchronize()
    agg: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            agg[ev.name[:80]] = agg.get(ev.name[:80], 0.0) + ev.device_time_total / calls
    return dict(sorted(agg.items(), key=lambda kv: -kv[1]))


def write_table(out_dir: str, stem: str, copy_bw: float, rows: list[dict], header: str, lines: list[str]) -> str:
    """Write one benchmark's results: ``out_dir/stem.json`` (``copy_bw`` in bytes/s, the ``rows``, the time) and
    ``out_dir/stem.md`` (the same-run copy bandwidth, then the markdown table ``header`` (its cells, without the
    outer pipes) with the row ``lines``). Returns the markdown text."""
    import time

    _write_atomic(os.path.join(out_dir, f"{stem}.json"),
                  json.dumps({"copy_bw": copy_bw, "rows": rows, "time": time.time()}, indent=1))  # fmt: skip
    cells = [c.strip() for c in header.split("|")]
    text = "\n".join([
        f"copy bandwidth (2 GiB D2D, read + write): {copy_bw / 1e12:.3f} TB/s",
        "",
        "| " + " | ".join(cells) + " |",
        "|" + "---|" * len(cells),
        *lines,
    ]) + "\n"  # fmt: skip
    _write_atomic(os.path.join(out_dir, f"{stem}.md"), text)
    return text


def _modules() -> list:
    here = pathlib.Path(__file__).parent
    return [importlib.import_module(f"benchmarks.{p.stem}") for p in sorted(here.glob("bench_*.py"))]


def write_results(out: pathlib.Path, env: dict, rows: list[dict]) -> str:
    """Write ``out/bench.json`` (``env`` and ``rows``) and ``out/bench.md`` (the table; a failed case's row
    carries its error instead of numbers, on one line with its pipes escaped); returns the markdown. The runner
    calls it after every case, so a run cut short (a device-time limit) keeps what it measured; each file is
    replaced atomically."""
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / "bench.json", json.dumps({"env": env, "rows": rows}, indent=2))
    lines = [
        f"# Benchmarks on {env['gpu']}",
        "",
        f"torch {env['torch']}, CUDA {env['cuda']}, triton {env['triton']}, {env['date_utc']}; "
        f"measured copy bandwidth {env['copy_bandwidth_TBps']:.2f} TB/s (read + write). Times: median per call, "
        "CUDA graph.",
        "",
        "| case | time (us) | bytes moved | TB/s | of copy BW | TFLOP/s | note |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {_cell(r['case'])} | - | - | - | - | - | failed: {_cell(r['error'])} |")
            continue
        lines.append(
            f"| {_cell(r['case'])} | {r['us']:.1f} | {r['bytes']:,} | {r['TB/s']:.2f} | {r['of_copy_bw']:.0%} | "
            f"{r['TFLOP/s']:.1f} | {_cell(r['note'])} |"
        )
    text = "\n".join(lines) + "\n"
    _write_atomic(out / "bench.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.runner")
    parser.add_argument(
        "--filter", action="append", default=[], help="run only cases whose module.name contains this (repeatable: any)"
    )
    parser.add_argument("--out", default="reports/bench")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks need a CUDA device (the H200); nothing timed", file=sys.stderr)
        return 2
    selected = []
    for mod in _modules():
        short = mod.__name__.split(".")[-1].removeprefix("bench_")
        for case in mod.CASES:
            name = f"{short}.{case['name']}"
            if not args.filter or any(f in name for f in args.filter):
                selected.append((mod, name, {k: v for k, v in case.items() if k != "name"}))
    if not selected:
        print(f"no benchmark case matches the filters {args.filter}; nothing timed", file=sys.stderr)
        return 1
    bw = copy_bandwidth()
    env = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "triton": importlib.import_module("triton").__version__,
        "date_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "copy_bandwidth_TBps": bw / 1e12,
    }  # fmt: skip
    out = pathlib.Path(args.out)
    rows: list[dict] = []
    text = ""
    for mod, name, params in selected:
        prep = None
        try:
            prep = mod.prepare(**params)
            t = time_graph(prep)
        except Exception as exc:  # noqa: BLE001  (one failing case must not hide the others' numbers)
            rows.append({"case": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(f"{name}: failed: {rows[-1]['error']}", flush=True)
        else:
            achieved = prep.bytes_moved / t
            rows.append(
                {"case": name, "us": t * 1e6, "bytes": prep.bytes_moved, "TB/s": achieved / 1e12,
                 "of_copy_bw": achieved / bw, "TFLOP/s": prep.flops / t / 1e12, "note": prep.note}
            )  # fmt: skip
            print(f"{name}: {t * 1e6:.1f} us, {achieved / 1e12:.2f} TB/s = {achieved / bw:.0%} of copy", flush=True)
        finally:
            prep = None  # the case's weights and inputs, released before the cache is emptied
        text = write_results(out, env, rows)  # first: an error in freeing memory must not lose this row
        torch.cuda.empty_cache()
    print(text)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
