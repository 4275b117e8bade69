"""Launch-configuration sweep of the grouped W4A16 path at bandwidth-bound token counts, on the H200.

``PYTHONPATH=$PWD python3 -m benchmarks.tune.grouped_nvfp4 --out DIR``: ``flint_moe_grouped`` (routing included,
CUDA graphs, ``bench_grouped_nvfp4.time_fn``) with each entry of ``VARIANTS`` at ``CASES``, the fraction of the
same-run copy bandwidth over the touched experts' bytes (``bench_grouped_nvfp4.prepare``'s ``bytes_moved``),
and whether the output equals the default configuration's bit for bit (``bits_equal``); ``DIR/sweep.json``.
The measurements and what they decided are in docs/kernels/nvfp4-grouped.md.
"""

from __future__ import annotations

import json
import os

import torch

from benchmarks import bench_grouped_nvfp4 as G
from benchmarks.tune import out_dir

#: (model, token counts): every expert touched from M = 128 on (DeepSeek-V3, Qwen3-235B-A22B, gpt-oss-120b).
CASES = (("deepseek-v3", (128, 256, 1024)), ("qwen3-235b-a22b", (128, 256)), ("gpt-oss-120b", (256,)))
VARIANTS = (
    ("default", None),
    ("gu.bc32", {"gate_up": {"BC": 32}}),
    ("down.bh64", {"down": {"BH": 64}}),
    ("bc32+bh64", {"gate_up": {"BC": 32}, "down": {"BH": 64}}),
    ("gu.stages4", {"gate_up": {"num_stages": 4}}),
)


def main(argv=None) -> int:
    from benchmarks.runner import copy_bandwidth

    out = out_dir(argv, "reports/tune-grouped")
    bw = copy_bandwidth()
    rows = []
    for model, ms in CASES:
        layer = G.Layer(model)
        for m in ms:
            ref = None
            for name, cfg in VARIANTS:
                prep = G.prepare(model=model, M=m, impl="grouped", layer=layer, config=cfg)
                o = prep.fn(0).view(torch.int16).clone()
                ref = o if ref is None else ref
                t = G.time_fn(prep.fn)
                rows.append(dict(model=model, M=m, variant=name, us=t * 1e6, frac=prep.bytes_moved / t / bw,
                                 bits_equal=bool(torch.equal(o, ref))))  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
        del layer
        torch.cuda.empty_cache()
    with open(os.path.join(out, "sweep.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
