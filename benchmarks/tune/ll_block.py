"""Where the decode block (``flint_moe_ll``) spends its device time, against the Triton decode path, on the H200.

``PYTHONPATH=<CuTe DSL>:$PWD python3 -m benchmarks.tune.ll_block --out DIR``: torch.profiler over 20 eager calls
of each path of ``benchmarks/bench_ll.py`` (``ll``: router + the CuTe DSL partial / finish / combine kernels;
``triton``: add + RMSNorm, the shared expert and ``flint_moe``) at ``POINTS``: device microseconds per call and
kernel, written to ``DIR/ll_profile.json`` and printed. The notes are docs/kernels/ll-block.md.
"""

from __future__ import annotations

import json
import os

from benchmarks.tune import out_dir

#: (model, M) measured.
POINTS = (("deepseek-v3", 1), ("deepseek-v3", 8))


def main(argv=None) -> int:
    from benchmarks import bench_ll as B
    from benchmarks.runner import profile_kernels

    out = out_dir(argv, "reports/tune-ll")
    rows = []
    for model, m in POINTS:
        for path in ("ll", "triton"):
            kernels = profile_kernels(B.prepare(path=path, model=model, M=m).fn, calls=20)
            print(f"== {model} M = {m} {path}: {sum(kernels.values()):.1f} us per call", flush=True)
            for name, us in kernels.items():
                print(f"   {us:8.1f} us  {name}", flush=True)
                rows.append(dict(model=model, M=m, path=path, kernel=name, us=us))
    with open(os.path.join(out, "ll_profile.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
