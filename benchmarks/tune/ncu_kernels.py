"""Nsight Compute over one benchmark point: per-launch time, DRAM throughput, issue-slot use, occupancy and warp
stall reasons of the kernels that limit a path (METHOD.md: read what limits a kernel before changing it).

``python3 -m benchmarks.tune.ncu_kernels --out DIR [--ncu ncu] POINT ...`` with POINT ``bench:model:M``:
``ll`` (``benchmarks/bench_ll.py``, path ``ll``: the CuTe DSL decode block), ``lltriton`` (the same module's
Triton decode path), ``grouped`` (``benchmarks/bench_grouped_nvfp4.py``, the W4A16 grouped path with its default
engines), ``triton`` (the same on the Triton kernels, ``--ab`` variant ``triton``) or ``gluon`` / ``gluontail``
(the same path with the Gluon GEMMs, ``--ab`` variants ``gluon`` / ``gluon+tail``) or ``ab-<variant>`` (the grouped
path under any ``--ab`` variant of ``bench_grouped_nvfp4.AB_VARIANTS``, an open BM resolved as ``--ab`` does). For each
point it runs ``ncu --clock-control none`` on a child process of this module (``--drive POINT``: warm-up calls,
then the profiled ones) for the kernels in :data:`KERNELS`, and writes ``DIR/<point>.csv`` (ncu's raw page) and
``DIR/ncu_summary.json`` (one row per launch: the metrics in :data:`METRICS` and the four largest stall
reasons, cycles per issued instruction). Needs a GPU and ncu; the notes that read the numbers are under
docs/kernels/.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys

#: Kernel-name regular expression per bench.
KERNELS = {
    "ll": "partial_kernel",
    "lltriton": "_nvfp4_gate_up_kernel|_nvfp4_down_split_kernel",
    "grouped": "_grouped_gate_up|_grouped_down|_gluon_gate_up|_gluon_down|_ws_grouped",
    "triton": "_grouped_gate_up|_grouped_down",
    "gluon": "_gluon_gate_up|_gluon_down",
    "gluontail": "_gluon_gate_up|_gluon_down",
}
#: The ``--ab`` variant of the grouped benches that name one.
_VARIANTS = {"triton": "triton", "gluon": "gluon", "gluontail": "gluon+tail"}
#: Warm-up calls before the profiled ones (the first compiles), profiled calls.
WARMUP, PROFILED = 3, 1
#: ncu metrics kept per launch (the raw page holds them; names as ncu 2025 on sm_90).
METRICS = {
    "us": "gpu__time_duration.sum",
    "dram_tbps": "dram__bytes.sum.per_second",
    "dram_active_pct": "dram__cycles_active.avg.pct_of_peak_sustained_elapsed",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "regs": "launch__registers_per_thread",
    "grid": "launch__grid_size",
    "l1_hit_pct": "l1tex__t_sector_hit_rate.pct",
    "lsu_pct": "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
    "alu_pct": "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",
    "fma_pct": "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
    "tensor_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "smem_pct": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
    "smem_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
}
#: Sections collected (ncu's raw page then holds every metric they use; a name missing there reads NaN).
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "SchedulerStats", "WarpStateStats", "ComputeWorkloadAnalysis",
            "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables")  # fmt: skip
_STALL = "smsp__average_warps_issue_stalled_"
_STALL_SUFFIX = "_per_issue_active.ratio"


def _fn(point: str):
    bench, model, m = point.split(":")
    if bench in ("ll", "lltriton"):
        from benchmarks import bench_ll

        return bench_ll.prepare(path="ll" if bench == "ll" else "triton", model=model, M=int(m)).fn
    from benchmarks import bench_grouped_nvfp4

    # the grouped benches are --ab variants ("grouped": the default launch); an open BM takes the default's, capped
    # at 128, as --ab resolves it
    variant = _VARIANTS.get(bench, bench[3:] if bench.startswith("ab-") else None)
    config = None if variant is None else bench_grouped_nvfp4.AB_VARIANTS[variant]
    if config is not None and "BM" in config and config["BM"] is None:
        from flint_moe.kernels.nvfp4.grouped_gate_up import grouped_config

        shape = bench_grouped_nvfp4.MODELS[model]
        config = dict(config, BM=min(grouped_config(int(m) * shape["k"], shape["E"])["BM"], 128))
    return bench_grouped_nvfp4.prepare(model=model, M=int(m), config=config).fn


def _kernels(point: str) -> str:
    """The kernel-name expression of ``point``'s bench (``ab-<variant>``: the grouped path's); KeyError naming an
    unknown bench."""
    bench = point.split(":")[0]
    if bench.startswith("ab-"):
        return KERNELS["grouped"]
    if bench not in KERNELS:
        raise KeyError(f"ncu point {point!r}: bench must be one of {sorted(KERNELS)} or ab-<variant>")
    return KERNELS[bench]


def drive(point: str) -> None:
    """Run ``point``'s call ``WARMUP`` times, then ``PROFILED`` times between cudaProfilerStart / Stop."""
    import torch

    fn = _fn(point)
    for i in range(WARMUP):
        fn(i)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for i in range(PROFILED):
        fn(WARMUP + i)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def _rows(raw: str) -> tuple[dict, list[dict]]:
    """ncu's raw CSV: (the units row, one dict per launch)."""
    lines = [ln for ln in raw.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if rows and rows[0].get("ID", "") == "":
        return rows[0], rows[1:]
    return {}, rows


def _num(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except (AttributeError, ValueError):
        return float("nan")


def summarise(point: str, raw: str) -> list[dict]:
    """One dict per launch of ncu's raw CSV page ``raw``: ``point``, the kernel name, :data:`METRICS` (time in
    microseconds, DRAM in TB/s; a metric the page lacks is NaN) and ``stalls`` (the four largest warp stall
    reasons, cycles per issued instruction)."""
    out = []
    units, rows = _rows(raw)
    to_us = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(
        units.get(METRICS["us"], "us"), float("nan"))
    for r in rows:
        row = {"point": point, "kernel": r.get("Kernel Name", "")[:60]}
        row.update({k: _num(r.get(v, "")) for k, v in METRICS.items()})
        row["us"] *= to_us
        row["dram_tbps"] /= 1e12
        stalls = {k[len(_STALL):-len(_STALL_SUFFIX)]: _num(v) for k, v in r.items()
                  if k.startswith(_STALL) and k.endswith(_STALL_SUFFIX) and "not_issued" not in k}  # fmt: skip
        row["stalls"] = dict(sorted(((k, v) for k, v in stalls.items() if v == v), key=lambda kv: -kv[1])[:4])
        out.append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("points", nargs="*")
    ap.add_argument("--out", default="reports/tune-ncu")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--drive", help=argparse.SUPPRESS)
    ap.add_argument("--from-csv", action="store_true", help="summarise the CSVs already in --out (no GPU)")
    a = ap.parse_args(argv)
    if a.drive:
        drive(a.drive)
        return 0
    os.makedirs(a.out, exist_ok=True)
    sections = [arg for sec in SECTIONS for arg in ("--section", sec)]
    summary = []
    for point in a.points:
        cmd = [a.ncu, "--clock-control", "none", "--profile-from-start", "off", "--kernel-name",
               f"regex:{_kernels(point)}", *sections, "--csv", "--page", "raw",
               sys.executable, "-m", "benchmarks.tune.ncu_kernels", "--drive", point]  # fmt: skip
        name = os.path.join(a.out, point.replace(":", "_") + ".csv")
        if a.from_csv:
            with open(name) as f:
                raw = f.read()
        else:
            p = subprocess.run(cmd, capture_output=True, text=True)
            with open(name, "w") as f:
                f.write(p.stdout)
            if p.returncode:
                print(f"{point}: ncu rc {p.returncode}\n{p.stderr[-2000:]}", flush=True)
                continue
            raw = p.stdout
        rows = summarise(point, raw)
        summary += rows
        for r in rows:
            st = ", ".join(f"{k} {v:.1f}" for k, v in r["stalls"].items())
            print(f"{point} {r['kernel'][:40]:40s} {r['us']:8.1f} us dram {r['dram_tbps']:5.2f} TB/s issue "
                  f"{r['issue_pct']:5.1f}% occ {r['occupancy_pct']:5.1f}% regs {r['regs']:.0f} grid {r['grid']:.0f}"
                  f" tensor {r['tensor_pct']:5.1f}% smem {r['smem_pct']:5.1f}%"
                  f" | {st}", flush=True)  # fmt: skip
    with open(os.path.join(a.out, "ncu_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
