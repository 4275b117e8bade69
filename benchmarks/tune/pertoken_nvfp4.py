"""Where the per-token NVFP4 path spends its time, and its launch-configuration sweep, on the H200.

``PYTHONPATH=$PWD python3 -m benchmarks.tune.pertoken_nvfp4 --out DIR``:

- ``DIR/prof.json``: device time per kernel (torch.profiler, eager, 10 calls) of ``routed_nvfp4_moe`` (its
  defaults) and of the W4A16 grouped GEMMs (TAIL 32 + SCALE_WORD) at ``CASES``;
- ``DIR/sweep.json``: CUDA-graph times (``bench_grouped_nvfp4.time_fn``) of the per-token op with each entry of
  ``VARIANTS`` (config overrides of FC1 / FC2), the W4A16 time of the same run and the ratio, with the outputs
  asserted bitwise equal to the defaults' (``bits_equal``).

Setup (weights, inputs) comes from ``benchmarks/bench_pertoken_nvfp4.py``; the measurements and the choices
made from them are in docs/kernels/nvfp4-pertoken.md.
"""

from __future__ import annotations

import json
import os

import torch

from benchmarks import bench_pertoken_nvfp4 as B
from benchmarks.tune import out_dir

#: (model, dims, M): DeepSeek-V3 at M = 1024 (BM 32) and 4096 (BM 128), gpt-oss-120b at 4096 (BM 128).
CASES = (("deepseek-v3", B.DEEPSEEK, 1024), ("gpt-oss-120b", B.GPT_OSS, 4096), ("deepseek-v3", B.DEEPSEEK, 4096))
W4A16 = {"TAIL": 32, "SCALE_WORD": True}
VARIANTS = (
    ("default", None),
    ("fc1.stages4", {"fc1": {"num_stages": 4}}),
    ("fc1.bc32", {"fc1": {"BC": 32}}),
    ("fc1.bc64", {"fc1": {"BC": 64}}),
    ("fc1.warps8", {"fc1": {"num_warps": 8}}),
    ("fc2.stages4", {"fc2": {"num_stages": 4}}),
    ("fc1.bk128", {"fc1": {"BK": 128}}),
    ("fc2.bk128", {"fc2": {"BK": 128}}),
)


def main(argv=None) -> int:
    from benchmarks.bench_grouped_nvfp4 import time_fn
    from benchmarks.runner import profile_kernels

    out = out_dir(argv, "reports/tune-pertoken")
    prof, sweep = [], []
    for model, d, m in CASES:
        for impl, cfg in (("pertoken", None), ("w4a16", W4A16)):
            for name, us in profile_kernels(B.make_fn(impl, m, d, cfg)).items():
                prof.append(dict(model=model, M=m, impl=impl, kernel=name, us=us))
        tw = time_fn(B.make_fn("w4a16", m, d, W4A16))
        ref = None
        for name, cfg in VARIANTS:
            fn = B.make_fn("pertoken", m, d, cfg)
            o = fn(0).view(torch.int16).clone()
            ref = o if ref is None else ref
            t = time_fn(fn)
            sweep.append(dict(model=model, M=m, variant=name, us=t * 1e6, w4a16_us=tw * 1e6, ratio=t / tw,
                              bits_equal=bool(torch.equal(o, ref))))  # fmt: skip
            print(json.dumps(sweep[-1]), flush=True)
        B._LAYERS.clear()
        torch.cuda.empty_cache()
    for name, rows in (("prof", prof), ("sweep", sweep)):
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
