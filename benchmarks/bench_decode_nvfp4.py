"""NVFP4 decode (gate/up + down GEMVs, routing excluded) on the H200: correctness from the taps, then timing.

``PYTHONPATH=$PWD python3 benchmarks/bench_decode_nvfp4.py [--out DIR] [--quick]``

Timing follows METHOD.md: CUDA graph of ``CALLS`` calls, each on a different set of selected experts
(rotation: the selected experts' codes and scales of consecutive calls differ, so the 60 MB L2 does not serve
them), warm-up, median of ``REPLAYS`` replays timed with CUDA events. Bytes moved per call = the distinct
selected experts' w1 + w2 codes and scales (real rows/columns only) + x, act (written and read), ids, tw,
shared and out. The copy bandwidth (bytes read + written of a 2 GiB device-to-device copy) is measured in the
same run. ``CASES`` / ``prepare`` also plug into ``benchmarks/runner.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

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
    return FlintMoEWeights(
        u8((E, 2 * I, H // 2)), sf(2 * I, H // 16), a1, u8((E, H, I // 2)), sf(H, I // 16), a2, I
    )


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
    from flint_moe.kernels.nvfp4_down import nvfp4_down
    from flint_moe.kernels.nvfp4_gate_up import nvfp4_gate_up

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


def copy_bw(nbytes=1 << 31, reps=20) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    return nbytes / statistics.median(ts)


def time_graph(fn, rotations, calls=CALLS, replays=REPLAYS) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(max(3, rotations)):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3 / calls)
    return statistics.median(ts)


#: Configuration before the 2026 tuning round (sequential-expert down, no prefetch): the bit reference.
OLD = ({"BN": 8, "num_warps": 2, "PREFETCH": False}, {"BH": 16, "num_warps": 2, "PREFETCH": False, "SPLIT": False})
SWEEP = {
    "old": OLD,
    "gu-prefetch": ({}, OLD[1]),
    "split": (OLD[0], {"PREFETCH": False}),
    "new": (None, None),
    "new-combine0": (None, {"COMBINE": 0}),
    "dn-BH8w1": (None, {"BH": 8, "num_warps": 1}),
    "dn-BH32w4": (None, {"BH": 32, "num_warps": 4}),
    "dn-BH16w4": (None, {"BH": 16, "num_warps": 4}),
    "dn-BH32w2": (None, {"BH": 32, "num_warps": 2}),
    "gu-BN8w4": ({"BN": 8, "num_warps": 4}, None),
    "gu-BN16w4": ({"BN": 16, "num_warps": 4}, None),
    "gu-BN16w2": ({"BN": 16, "num_warps": 2}, None),
    "gu-BN4w2": ({"BN": 4, "num_warps": 2}, None),
    "gu-BN4w1": ({"BN": 4, "num_warps": 1}, None),
}


def sweep(out_dir: str) -> int:
    """Tuning sweep (one device call): bit checks of every variant against ``OLD``, one golden check of the
    default at DeepSeek-V3 size, then CUDA-graph timings of gate/up alone, down alone and both."""
    from flint_moe.kernels.nvfp4_down import nvfp4_down
    from flint_moe.kernels.nvfp4_gate_up import nvfp4_gate_up

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "kernels"))
    from _nvfp4_check import check_taps, make_inputs, same

    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    res = {"copy_bw": bw, "checks": [], "times": []}
    # 1. bits: every variant == OLD on each model (M = 1, 8) and on a partial-step shape
    shapes = dict(MODELS, partial=dict(E=9, H=2880, I=704, k=4))
    for mname, cfg in shapes.items():
        w = random_weights(cfg["E"], cfg["H"], cfg["I"], seed=3)
        for M in (1, 8):
            x, ids, tw, sh = make_inputs(M, cfg["H"], cfg["E"], cfg["k"], seed=M, device="cuda")
            ref = nvfp4_down(nvfp4_gate_up(x, ids, w, config=OLD[0]), ids, tw, w, sh, config=OLD[1])
            for v, (gu, dn) in SWEEP.items():
                got = nvfp4_down(nvfp4_gate_up(x, ids, w, config=gu), ids, tw, w, sh, config=dn)
                got2 = nvfp4_down(nvfp4_gate_up(x, ids, w, config=gu), ids, tw, w, sh, config=dn)
                ok = same(got, ref) and same(got2, ref)
                res["checks"].append(dict(model=mname, M=M, variant=v, same=ok))
                if not ok:
                    print(f"BIT MISMATCH {mname} M={M} {v}", flush=True)
        if mname == "deepseek-v3":
            x, ids, tw, sh = make_inputs(1, cfg["H"], cfg["E"], cfg["k"], seed=5, device="cuda")
            taps = {}
            out = nvfp4_down(nvfp4_gate_up(x, ids, w, taps=taps), ids, tw, w, sh, taps=taps)
            check_taps(w, x, ids, tw, sh, taps, out, acc_pairs={(0, 0), (0, 7)})
            print("golden check deepseek-v3 M=1 default: ok", flush=True)
        del w
        torch.cuda.empty_cache()
    n_bad = sum(not c["same"] for c in res["checks"])
    print(f"bit checks: {len(res['checks'])} done, {n_bad} mismatches", flush=True)
    # 2. timings
    plan = [("deepseek-v3", 1, list(SWEEP)), ("deepseek-v3", 8, ["old", "new", "new-combine0", "dn-BH32w4",
            "gu-BN16w4", "gu-BN8w4"]), ("qwen3-30b-a3b", 1, ["old", "gu-prefetch", "split", "new", "new-combine0",
            "dn-BH8w1", "gu-BN4w1", "gu-BN4w2"]), ("gpt-oss-120b", 1, ["old", "new", "dn-BH8w1", "gu-BN4w2"])]
    for mname, M, vs in plan:
        w = None
        for v in vs:
            gu, dn = SWEEP[v]
            prep, w, sets = _prepare(model=mname, M=M, gu=gu, dn=dn, weights=w)
            t_all = time_graph(prep.fn, prep.rotations)
            acts = [nvfp4_gate_up(x, ids, w, config=gu) for (x, ids, tw, sh) in sets]
            t_gu = time_graph(lambda i: nvfp4_gate_up(sets[i % CALLS][0], sets[i % CALLS][1], w, config=gu), CALLS)
            t_dn = time_graph(
                lambda i: nvfp4_down(acts[i % CALLS], sets[i % CALLS][1], sets[i % CALLS][2], w,
                                     sets[i % CALLS][3], config=dn), CALLS)
            r = dict(model=mname, M=M, variant=v, us=t_all * 1e6, gu_us=t_gu * 1e6, dn_us=t_dn * 1e6,
                     frac=prep.bytes_moved / t_all / bw, mb=prep.bytes_moved / 1e6)
            res["times"].append(r)
            print(f"{mname:14s} M={M} {v:13s} all {r['us']:7.1f} us ({100 * r['frac']:4.1f}%)  gu {r['gu_us']:7.1f}"
                  f"  dn {r['dn_us']:7.1f}", flush=True)
        del w
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "sweep.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = [f"copy {bw / 1e12:.3f} TB/s; bit mismatches {n_bad}", "| model | M | variant | all us | % copy | gu us | dn us |",
             "|---|---|---|---|---|---|---|"]
    for r in res["times"]:
        lines.append(f"| {r['model']} | {r['M']} | {r['variant']} | {r['us']:.1f} | {100 * r['frac']:.1f} | "
                     f"{r['gu_us']:.1f} | {r['dn_us']:.1f} |")
    with open(os.path.join(out_dir, "sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if n_bad else 0


#: Round 3 (codes as int32 words, WORDS): variant -> (gate/up config, down config); "new" = the defaults.
WORDS_SWEEP = {
    "new": (None, None),
    "gu-Wpf": ({"WORDS": True, "PREFETCH": True}, None),
    "gu-Wpf-BN4w2": ({"WORDS": True, "PREFETCH": True, "BN": 4, "num_warps": 2}, None),
    "gu-Wpf-BN8w4": ({"WORDS": True, "PREFETCH": True, "BN": 8, "num_warps": 4}, None),
    "gu-Wpf-BN16w4": ({"WORDS": True, "PREFETCH": True, "BN": 16, "num_warps": 4}, None),
    "dn-W": (None, {"WORDS": True}),
    "dn-W-BH32w4": (None, {"WORDS": True, "BH": 32, "num_warps": 4}),
}


def sweep_words(out_dir: str) -> int:
    """Round 3 (one device call): bit checks of every ``WORDS_SWEEP`` variant against the defaults at
    DeepSeek-V3 M = 1, 8 and at H 2880 x I 704 (partial K steps), CUDA-graph timings (gate/up alone, down
    alone, both) at DeepSeek-V3 M = 1 and 8, then the fastest gate/up variant vs the default on the other models
    at M = 1."""
    from flint_moe.kernels.nvfp4_down import nvfp4_down
    from flint_moe.kernels.nvfp4_gate_up import nvfp4_gate_up

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "kernels"))
    from _nvfp4_check import make_inputs, same

    t0 = time.time()
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    res = {"copy_bw": bw, "checks": [], "times": []}
    md = os.path.join(out_dir, "words.md")

    def check(mname, cfg, variants, Ms=(1, 8)):
        w = random_weights(cfg["E"], cfg["H"], cfg["I"], seed=3)
        for M in Ms:
            x, ids, tw, sh = make_inputs(M, cfg["H"], cfg["E"], cfg["k"], seed=M, device="cuda")
            ref_act = nvfp4_gate_up(x, ids, w)
            ref = nvfp4_down(ref_act, ids, tw, w, sh)
            for v in variants:
                gu, dn = WORDS_SWEEP[v]
                act = nvfp4_gate_up(x, ids, w, config=gu)
                got = nvfp4_down(act, ids, tw, w, sh, config=dn)
                got2 = nvfp4_down(nvfp4_gate_up(x, ids, w, config=gu), ids, tw, w, sh, config=dn)
                ok = same(act, ref_act) and same(got, ref) and same(got2, ref)
                res["checks"].append(dict(model=mname, M=M, variant=v, same=ok))
                print(f"check {mname} M={M} {v}: {'same bits' if ok else 'BIT MISMATCH'} ({time.time() - t0:.0f} s)",
                      flush=True)
        del w
        torch.cuda.empty_cache()

    def timing(mname, M, variants):
        w = None
        for v in variants:
            gu, dn = WORDS_SWEEP[v]
            prep, w, sets = _prepare(model=mname, M=M, gu=gu, dn=dn, weights=w)
            t_all = time_graph(prep.fn, prep.rotations)
            acts = [nvfp4_gate_up(x, ids, w, config=gu) for (x, ids, tw, sh) in sets]
            t_gu = time_graph(lambda i: nvfp4_gate_up(sets[i % CALLS][0], sets[i % CALLS][1], w, config=gu), CALLS)
            t_dn = time_graph(
                lambda i: nvfp4_down(acts[i % CALLS], sets[i % CALLS][1], sets[i % CALLS][2], w,
                                     sets[i % CALLS][3], config=dn), CALLS)
            r = dict(model=mname, M=M, variant=v, us=t_all * 1e6, gu_us=t_gu * 1e6, dn_us=t_dn * 1e6,
                     frac=prep.bytes_moved / t_all / bw, mb=prep.bytes_moved / 1e6)
            res["times"].append(r)
            print(f"{mname:14s} M={M} {v:14s} all {r['us']:7.1f} us ({100 * r['frac']:4.1f}%)  gu {r['gu_us']:7.1f}"
                  f"  dn {r['dn_us']:7.1f} ({time.time() - t0:.0f} s)", flush=True)
        del w
        torch.cuda.empty_cache()

    def dump():
        n_bad = sum(not c["same"] for c in res["checks"])
        lines = [f"copy {bw / 1e12:.3f} TB/s; bit checks {len(res['checks'])}, mismatches {n_bad}",
                 "| model | M | variant | all us | % copy | gu us | dn us |", "|---|---|---|---|---|---|---|"]
        for r in res["times"]:
            lines.append(f"| {r['model']} | {r['M']} | {r['variant']} | {r['us']:.1f} | {100 * r['frac']:.1f} | "
                         f"{r['gu_us']:.1f} | {r['dn_us']:.1f} |")
        with open(md, "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(out_dir, "words.json"), "w") as f:
            json.dump(res, f, indent=1)
        return n_bad, lines

    allv = list(WORDS_SWEEP)
    check("deepseek-v3", MODELS["deepseek-v3"], allv[1:])
    timing("deepseek-v3", 1, allv)
    dump()
    check("partial", dict(E=9, H=2880, I=704, k=4), allv[1:])
    dump()
    gus = [r for r in res["times"] if r["variant"].startswith("gu-")]
    best = min(gus, key=lambda r: r["gu_us"])["variant"]
    timing("deepseek-v3", 8, ["new", best] + (["dn-W-BH32w4"] if "dn-W-BH32w4" != best else []))
    dump()
    for mname in ("qwen3-30b-a3b", "gpt-oss-120b"):
        timing(mname, 1, ["new", best])
        dump()
    n_bad, lines = dump()
    print("\n".join(lines))
    return 1 if n_bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/bench-nvfp4"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default="default")
    ap.add_argument("--sweep", action="store_true", help="tuning sweep (bit checks + split timings)")
    ap.add_argument("--words", action="store_true", help="round 3 sweep: int32-word code tiles (WORDS)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.words:
        return sweep_words(args.out)
    if args.sweep:
        return sweep(args.out)
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    variants = {
        "default": (None, None),
        "plain-decode": ({"DECODE": 0}, {"DECODE": 0}),
        "bf16-decode": ({"DECODE": 1}, {"DECODE": 1}),
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
            gu, dn = variants[vname]
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
    with open(os.path.join(args.out, "bench_nvfp4.json"), "w") as f:
        json.dump({"copy_bw": bw, "rows": rows, "time": time.time()}, f, indent=1)
    lines = [
        f"copy bandwidth (2 GiB D2D, read + write): {bw / 1e12:.3f} TB/s",
        "",
        "| model | variant | M | us | MB moved | TB/s | % of copy |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['variant']} | {r['M']} | {r['us']:.1f} | {r['bytes'] / 1e6:.1f} | "
            f"{r['tbps']:.3f} | {100 * r['frac']:.1f} |"
        )
    with open(os.path.join(args.out, "bench_nvfp4.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
