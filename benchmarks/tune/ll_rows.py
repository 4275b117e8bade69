"""Rows per warp of the decode block's partial kernel (``ll_partial.rows_per_warp``, bounded by
``BLOCKS_PER_LANE_CAP``) on the H200: the block's time per call (CUDA graph) at each cap, and its output bits
compared across caps (rows per warp leave every row's summation order as it is, so the bits must not move).

``PYTHONPATH=<CuTe DSL>:$PWD python3 -m benchmarks.tune.ll_rows --out DIR``: one child process per cap (the
compiled kernels are cached per process), writes ``DIR/ll_rows.json`` and prints a table. Notes:
docs/kernels/ll-block.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

from benchmarks.tune import out_dir

#: Caps measured: 4 keeps one row per warp at the shapes below, 8 / 16 give the down projections 2 / 4 rows,
#: 28 also gives DeepSeek-V3's gate/up (14 blocks per lane) 2 rows.
CAPS = (4, 8, 16, 28)
#: (model, M) measured.
POINTS = (("deepseek-v3", 1), ("deepseek-v3", 8), ("glm-4.5", 1), ("ling-mini-2.0", 1))


def child(cap: int) -> list[dict]:
    import torch

    from benchmarks import bench_ll as B
    from benchmarks.runner import time_graph
    from flint_moe.kernels.cute import ll_partial

    ll_partial.BLOCKS_PER_LANE_CAP = cap
    rows = []
    for model, m in POINTS:
        prep = B.prepare(path="ll", model=model, M=m)
        out, res = prep.fn(0)
        torch.cuda.synchronize()
        digest = hashlib.sha256(out.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]
        us = time_graph(prep) * 1e6
        rows.append(dict(cap=cap, model=model, M=m, us=us, out_digest=digest))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
        return 0
    out = out_dir(argv, "reports/tune-ll-rows")
    rows = []
    for cap in CAPS:
        p = subprocess.run([sys.executable, "-m", "benchmarks.tune.ll_rows", "--child", str(cap)],
                           capture_output=True, text=True)  # fmt: skip
        rows += [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode:
            print(f"cap {cap}: rc {p.returncode}\n{p.stderr[-1500:]}", flush=True)
    with open(os.path.join(out, "ll_rows.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("| model | M | " + " | ".join(f"cap {c} (us)" for c in CAPS) + " | bits equal |")
    print("|---|---:|" + "---:|" * len(CAPS) + "---|")
    for model, m in POINTS:
        pr = [r for r in rows if r["model"] == model and r["M"] == m]
        cells = [next((f"{r['us']:.1f}" for r in pr if r["cap"] == c), "-") for c in CAPS]
        same = len({r["out_digest"] for r in pr}) == 1 and len(pr) == len(CAPS)
        print(f"| {model} | {m} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
