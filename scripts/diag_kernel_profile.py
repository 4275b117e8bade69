"""Which GPU kernels the conformance harness spends its device time in: torch.profiler over whole
cases (kernel run + golden model + comparison + invariances). Not a test; a measurement script (METHOD.md).

Usage on the GPU machine: PYTHONPATH=$PWD python3 scripts/diag_kernel_profile.py --out DIR --ids CASE_ID ...
Writes DIR/<n>_by_op.txt (ops by self CUDA time) and DIR/<n>_by_stack.txt (grouped by the Python call site)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ids", nargs="+", required=True)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from flint_moe.conformance.inputs.cases import matrix
    from flint_moe.conformance.run.runner import run_case
    from flint_moe.ops import make_route_counter

    dev = torch.device("cuda")
    counter = make_route_counter(dev)
    cases = [c for c in matrix("gpu") if c.id in set(a.ids)]
    for n, c in enumerate(cases):
        run_case(c, dev, counter, invariance=True)  # warm: compiles, tables, allocator
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
            r = run_case(c, dev, counter, invariance=True)
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        head = f"{c.id}: {r.verdict}, wall {wall:.2f} s (profiled), phases {r.meta.get('phase_seconds')}\n"
        print(head, flush=True)
        ka = prof.key_averages()
        (out / f"{n}_by_op.txt").write_text(head + ka.table(sort_by="self_cuda_time_total", row_limit=45))
        ks = prof.key_averages(group_by_stack_n=6)
        (out / f"{n}_by_stack.txt").write_text(head + ks.table(sort_by="self_cuda_time_total", row_limit=40))


if __name__ == "__main__":
    main()
