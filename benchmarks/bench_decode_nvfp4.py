"""NVFP4 decode (gate/up + down GEMVs, routing excluded) on the H200: correctness from the taps, then timing.

``PYTHONPATH=$PWD python3 benchmarks/bench_decode_nvfp4.py [--out DIR] [--models ...] [--variants ...]``

Timing follows METHOD.md: CUDA graph of ``CALLS`` calls, each on a different set of selected experts
(rotation: the selected experts' codes and scales of consecutive calls differ, so the 60 MB L2 does not serve
them), warm-up, median of ``REPLAYS`` replays timed with CUDA events. Bytes moved per call = the distinct
selected experts' w1 + w2 codes and scales (real rows/columns only) + x, act (written and read), ids, tw,
shared and out. The copy bandwidth (bytes read + written of a 2 GiB device-to-device copy) is measured in the
same run. ``CASES`` / ``prepare`` also plug into ``benchmarks/runner.py``. The tuning of the launch
configurations is ``benchmarks/tune/decode_nvfp4.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from flint_moe.layouts.flashinfer_w4a16 import FlintMoEWeights
from flint_moe.layouts.swizzle import swizzled_scale_shape

MODELS = {
    "deepseek-v3": dict(E=256, H=7168, I=2048, k=8),
    "qwen3-30b-a3b": dict(E=128, H=2048, I=768, k=8),
    "gpt-oss-120b": dict(E=128, H=2880, I=2880, k=4),
}
CASES = [dict(name=f"{m}.M{M}", model=m, M=M) for m in MODELS for M in (1, 2, 4, 8)]
CALLS = 16
REPLAYS = 30


def random_weights(E, H, I, device="cuda", seed=0) -> FlintMoEWeights:
    """Random codes / finite E4M3 scales directly in the FlintMoEWeights layout (no conversion needed)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def u8(shape, hi=256):
        return torch.randint(0, hi, shape, dtype=torch.uint8, device=device, generator=g)

    def sf(rows, cols):
        b = u8((E, *swizzled_scale_shape(rows, cols)), 0x70) + 0x08  # exponents in a moderate range
        b |= u8(b.shape, 2) << 7
        return b.view(torch.float8_e4m3fn)

    a1 = torch.rand(E, device=device, generator=g) * 2.0**-6 + 2.0**-8
    a2 = torch.rand(E, device=device, generator=g) * 2.0**-6 + 2.0**-8
    return FlintMoEWeights(u8((E, 2 * I, H // 2)), sf(2 * I, H // 16), a1, u8((E, H, I // 2)), sf(H, I // 16), a2, I)


def bytes_moved(w: FlintMoEWeights, ids: torch.Tensor) -> int:
    H, I = w.hidden_size, w.valid_intermediate
    M, k = ids.shape
    n = len(set(ids.flatten().tolist()))
    per_expert = 2 * I * H // 2 + 2 * I * H // 16 + H * I // 2 + H * I // 16
    acts = M * H * 2 + 2 * (M * k * I * 2) + M * k * 8 + 2 * M * H * 2
    return n * per_expert + acts


def prepare(name=None, model="deepseek-v3", M=1, rotations=CALLS):
    """``benchmarks/runner.py`` entry point: the ``Prepared`` of one case (default configs)."""
    return _prepare(model=model, M=M, rotations=rotations)[0]


def _prepare(name=None, model="deepseek-v3", M=1, rotations=CALLS, gu=None, dn=None, weights=None, seed=0):
    """(Prepared, weights, input sets): fn(i) runs gate/up + down on id set i % rotations."""
    from benchmarks.runner import Prepared
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up

    cfg = MODELS[model]
    E, H, I, k = cfg["E"], cfg["H"], cfg["I"], cfg["k"]
    w = weights if weights is not None else random_weights(E, H, I, seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    sets = []
    for _ in range(rotations):
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(M)]).to(torch.int32).cuda()
        x = torch.randn(M, H, generator=g).to(torch.bfloat16).cuda()
        tw = (torch.rand(M, k, generator=g) / k).to(torch.bfloat16).float().cuda()
        sh = torch.randn(M, H, generator=g).to(torch.bfloat16).cuda()
        sets.append((x, ids, tw, sh))

    def fn(i):
        x, ids, tw, sh = sets[i % rotations]
        act = nvfp4_gate_up(x, ids, w, config=gu)
        return nvfp4_down(act, ids, tw, w, sh, config=dn)

    nbytes = statistics.mean(bytes_moved(w, s[1]) for s in sets)
    return Prepared(fn=fn, bytes_moved=int(nbytes), rotations=rotations, note=model), w, sets


def copy_bw() -> float:
    """Measured device copy bandwidth, bytes/s (``benchmarks.runner.copy_bandwidth``)."""
    from benchmarks.runner import copy_bandwidth

    return copy_bandwidth()


def time_graph(fn, rotations, calls=CALLS, replays=REPLAYS) -> float:
    """Median seconds per call of ``fn`` from a CUDA graph (``benchmarks.runner.time_graph``)."""
    from benchmarks.runner import Prepared, time_graph as runner_time_graph

    return runner_time_graph(Prepared(fn=fn, bytes_moved=0, rotations=rotations), graph_calls=calls, replays=replays)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/bench-nvfp4"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default="default")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    from flint_moe.kernels.nvfp4 import tuned as nvfp4_tuned

    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    variants = {
        "default": (None, None),
        "cuda-core": ("GATE_UP_CUDA_CORE", "DOWN_CUDA_CORE"),
        "tensor-core": ("GATE_UP_MMA", "DOWN_MMA"),
        "gu-BN8w2": ({"BN": 8, "num_warps": 2}, None),
        "gu-BN8w4": ({"BN": 8, "num_warps": 4}, None),
        "gu-BN16w4": ({"BN": 16, "num_warps": 4}, None),
        "dn-BH32w4": (None, {"BH": 32, "num_warps": 4}),
        "dn-BH8w1": (None, {"BH": 8, "num_warps": 1}),
    }
    chosen = list(variants) if args.variants == "all" else args.variants.split(",")
    rows = []
    for model in args.models.split(","):
        w = None
        for vname in chosen:
            gu, dn = (getattr(nvfp4_tuned, c) if isinstance(c, str) else c for c in variants[vname])
            for M in (1, 2, 4, 8):
                if vname != "default" and M not in (1, 8):
                    continue
                prep, w, _ = _prepare(model=model, M=M, gu=gu, dn=dn, weights=w)
                t = time_graph(prep.fn, prep.rotations)
                r = dict(
                    model=model,
                    variant=vname,
                    M=M,
                    us=t * 1e6,
                    bytes=prep.bytes_moved,
                    tbps=prep.bytes_moved / t / 1e12,
                    frac=prep.bytes_moved / t / bw,
                )
                rows.append(r)
                print(
                    f"{model:14s} {vname:13s} M={M} {r['us']:8.1f} us {r['bytes'] / 1e6:8.1f} MB "
                    f"{r['tbps']:.3f} TB/s {100 * r['frac']:5.1f}% of copy",
                    flush=True,
                )
        del w
        torch.cuda.empty_cache()
    from benchmarks.runner import write_table

    lines = [
        f"| {r['model']} | {r['variant']} | {r['M']} | {r['us']:.1f} | {r['bytes'] / 1e6:.1f} | "
        f"{r['tbps']:.3f} | {100 * r['frac']:.1f} |"
        for r in rows
    ]
    header = "model | variant | M | us | MB moved | TB/s | % of copy"
    print(write_table(args.out, "bench_nvfp4", bw, rows, header, lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
