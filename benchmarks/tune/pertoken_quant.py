"""Launch sweep of the per-token NVFP4 quantizer kernel (``pertoken_quant.launch_pertoken_quant``) on the H200.

``PYTHONPATH=$PWD python3 -m benchmarks.tune.pertoken_quant --out DIR``: for each entry of ``SHAPES`` (the routed
inputs and FC2 inputs of DeepSeek-V3 and gpt-oss-120b) every ``CHUNK`` x ``num_warps`` of ``CHUNKS`` x ``WARPS``,
with the operand values written (as ``routed_nvfp4_moe`` launches it): median microseconds per launch (a CUDA
graph of 10 launches, 5 replays), TB/s of reads and writes, and whether codes, scale bytes, row scales and values
equal the first configuration's bit for bit (``same``); ``DIR/quant_sweep.json``. The choice made from it is
``PERTOKEN_QUANT_CONFIG``'s comment and docs/kernels/nvfp4-pertoken.md.
"""

from __future__ import annotations

import json
import os

import torch

from benchmarks.tune import out_dir

#: (name, rows, H, Hp, dtype): gpt-oss-120b M = 4096 (k 4) FC2 input and tokens, DeepSeek-V3 M = 4096 / 1024 (k 8).
SHAPES = (
    ("gptoss.fc2in", 16384, 2880, 3072, torch.float32),
    ("ds.fc2in.M4096", 32768, 2048, 2048, torch.float32),
    ("ds.in.M4096", 4096, 7168, 7168, torch.bfloat16),
    ("gptoss.in", 4096, 2880, 3072, torch.bfloat16),
    ("ds.fc2in.M1024", 8192, 2048, 2048, torch.float32),
)
CHUNKS = (512, 1024, 2048, 4096, 8192)
WARPS = (4, 8, 16)


def _time(launch, calls: int = 10, replays: int = 5) -> float:
    """Median microseconds per call of ``launch`` in a CUDA graph of ``calls`` calls (``runner.replay_median``)."""
    from benchmarks.runner import replay_median

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            launch()
    g.replay()
    torch.cuda.synchronize()
    return replay_median(g, calls, replays) * 1e6


def main(argv=None) -> int:
    from flint_moe.kernels.nvfp4.pertoken_quant import launch_pertoken_quant

    out = out_dir(argv, "reports/tune-pertoken-quant")
    rows = []
    for name, m, h, hp, dtype in SHAPES:
        x = torch.randn(m, h, device="cuda").to(dtype)
        codes = torch.empty((m, hp // 2), dtype=torch.uint8, device="cuda")
        scale = torch.empty((m, hp // 16), dtype=torch.uint8, device="cuda")
        d = torch.empty((m,), device="cuda")
        v = torch.empty((m, h), dtype=torch.bfloat16, device="cuda")
        nbytes = x.numel() * x.element_size() + codes.numel() + scale.numel() + v.numel() * 2 + 4 * m
        ref = None
        for chunk in CHUNKS:
            for warps in WARPS:
                cfg = {"CHUNK": chunk, "num_warps": warps}

                def launch(cfg=cfg, args=(x, hp, codes, scale, d), v=v):
                    launch_pertoken_quant(*args, config=cfg, values=v)

                launch()
                torch.cuda.synchronize()
                got = (codes.clone(), scale.clone(), d.clone(), v.view(torch.int16).clone())
                ref = ref or got
                us = _time(launch)
                rows.append(dict(shape=name, chunk=chunk, warps=warps, us=us, tbps=nbytes / us / 1e6,
                                 same=all(torch.equal(p, q) for p, q in zip(got, ref, strict=True))))  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(out, "quant_sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
