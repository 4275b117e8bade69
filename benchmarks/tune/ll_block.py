"""Where the decode block (``flint_moe_ll``) spends its device time, against the Triton decode path, on the H200.

``PYTHONPATH=<CuTe DSL>:$PWD python3 -m benchmarks.tune.ll_block --out DIR``: torch.profiler over 20 eager calls
of each path of ``benchmarks/bench_ll.py`` (``ll``: router + the CuTe DSL partial / finish / combine kernels;
``triton``: add + RMSNorm, the shared expert and ``flint_moe``) at ``POINTS``: device microseconds per call and
kernel, written to ``DIR/ll_profile.json`` and printed. The notes are docs/kernels/ll-block.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import torch

#: (model, M) measured.
POINTS = (("deepseek-v3", 1), ("deepseek-v3", 8))


def main(argv=None) -> int:
    from torch.profiler import ProfilerActivity, profile

    from benchmarks import bench_ll as B

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/tune-ll"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for model, m in POINTS:
        for path in ("ll", "triton"):
            prep = B.prepare(path=path, model=model, M=m)
            for i in range(4):
                prep.fn(i)
            torch.cuda.synchronize()
            calls = 20
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for i in range(calls):
                    prep.fn(i)
                torch.cuda.synchronize()
            agg: dict[str, float] = collections.defaultdict(float)
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    agg[ev.name[:80]] += ev.device_time_total / calls
            print(f"== {model} M = {m} {path}: {sum(agg.values()):.1f} us per call", flush=True)
            for name, us in sorted(agg.items(), key=lambda kv: -kv[1]):
                print(f"   {us:8.1f} us  {name}", flush=True)
                rows.append(dict(model=model, M=m, path=path, kernel=name, us=us))
    with open(os.path.join(args.out, "ll_profile.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
