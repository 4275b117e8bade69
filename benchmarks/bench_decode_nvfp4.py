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
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up

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
    plan = [
        ("deepseek-v3", 1, list(SWEEP)),
        ("deepseek-v3", 8, ["old", "new", "new-combine0", "dn-BH32w4", "gu-BN16w4", "gu-BN8w4"]),
        (
            "qwen3-30b-a3b",
            1,
            ["old", "gu-prefetch", "split", "new", "new-combine0", "dn-BH8w1", "gu-BN4w1", "gu-BN4w2"],
        ),
        ("gpt-oss-120b", 1, ["old", "new", "dn-BH8w1", "gu-BN4w2"]),
    ]
    for mname, M, vs in plan:
        w = None
        for v in vs:
            gu, dn = SWEEP[v]
            prep, w, sets = _prepare(model=mname, M=M, gu=gu, dn=dn, weights=w)
            t_all = time_graph(prep.fn, prep.rotations)
            acts = [nvfp4_gate_up(x, ids, w, config=gu) for (x, ids, tw, sh) in sets]
            t_gu = time_graph(lambda i: nvfp4_gate_up(sets[i % CALLS][0], sets[i % CALLS][1], w, config=gu), CALLS)
            t_dn = time_graph(
                lambda i: nvfp4_down(
                    acts[i % CALLS], sets[i % CALLS][1], sets[i % CALLS][2], w, sets[i % CALLS][3], config=dn
                ),
                CALLS,
            )
            r = dict(
                model=mname,
                M=M,
                variant=v,
                us=t_all * 1e6,
                gu_us=t_gu * 1e6,
                dn_us=t_dn * 1e6,
                frac=prep.bytes_moved / t_all / bw,
                mb=prep.bytes_moved / 1e6,
            )
            res["times"].append(r)
            print(
                f"{mname:14s} M={M} {v:13s} all {r['us']:7.1f} us ({100 * r['frac']:4.1f}%)  gu {r['gu_us']:7.1f}"
                f"  dn {r['dn_us']:7.1f}",
                flush=True,
            )
        del w
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "sweep.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = [
        f"copy {bw / 1e12:.3f} TB/s; bit mismatches {n_bad}",
        "| model | M | variant | all us | % copy | gu us | dn us |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["times"]:
        lines.append(
            f"| {r['model']} | {r['M']} | {r['variant']} | {r['us']:.1f} | {100 * r['frac']:.1f} | "
            f"{r['gu_us']:.1f} | {r['dn_us']:.1f} |"
        )
    with open(os.path.join(out_dir, "sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if n_bad else 0


#: WORDS sweep (``--words``; codes as int32 words): variant -> (gate/up config, down config); "new" = the defaults.
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
    """``--words`` (one device call): bit checks of every ``WORDS_SWEEP`` variant against the defaults at
    DeepSeek-V3 M = 1, 8 and at H 2880 x I 704 (partial K steps), CUDA-graph timings (gate/up alone, down
    alone, both) at DeepSeek-V3 M = 1 and 8, then the fastest gate/up variant vs the default on the other models
    at M = 1."""
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up

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
                print(
                    f"check {mname} M={M} {v}: {'same bits' if ok else 'BIT MISMATCH'} ({time.time() - t0:.0f} s)",
                    flush=True,
                )
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
                lambda i: nvfp4_down(
                    acts[i % CALLS], sets[i % CALLS][1], sets[i % CALLS][2], w, sets[i % CALLS][3], config=dn
                ),
                CALLS,
            )
            r = dict(
                model=mname,
                M=M,
                variant=v,
                us=t_all * 1e6,
                gu_us=t_gu * 1e6,
                dn_us=t_dn * 1e6,
                frac=prep.bytes_moved / t_all / bw,
                mb=prep.bytes_moved / 1e6,
            )
            res["times"].append(r)
            print(
                f"{mname:14s} M={M} {v:14s} all {r['us']:7.1f} us ({100 * r['frac']:4.1f}%)  gu {r['gu_us']:7.1f}"
                f"  dn {r['dn_us']:7.1f} ({time.time() - t0:.0f} s)",
                flush=True,
            )
        del w
        torch.cuda.empty_cache()

    def dump():
        n_bad = sum(not c["same"] for c in res["checks"])
        lines = [
            f"copy {bw / 1e12:.3f} TB/s; bit checks {len(res['checks'])}, mismatches {n_bad}",
            "| model | M | variant | all us | % copy | gu us | dn us |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in res["times"]:
            lines.append(
                f"| {r['model']} | {r['M']} | {r['variant']} | {r['us']:.1f} | {100 * r['frac']:.1f} | "
                f"{r['gu_us']:.1f} | {r['dn_us']:.1f} |"
            )
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


#: MMA sweep (``--mma``; tensor cores): variant -> (gate/up config, down config); "new" = the defaults.
#: Gate/up rows per program 2 * BN = 8 * num_warps * RT; down BH = 8 * num_warps * RT.
def _gu(bn, nw, rt, s):
    return {"MMA": True, "BN": bn, "num_warps": nw, "RT": rt, "S": s}


def _dn(bh, nw, rt, s):
    return {"MMA": True, "BH": bh, "num_warps": nw, "RT": rt, "S": s}


MMA_SWEEP = {
    "new": (None, None),
    "gu-mma-BN16w2r2s4": (_gu(16, 2, 2, 4), None),
    "gu-mma-BN16w1r4s2": (_gu(16, 1, 4, 2), None),
    "gu-mma-BN32w2r4s2": (_gu(32, 2, 4, 2), None),
    "gu-mma-BN8w1r2s4": (_gu(8, 1, 2, 4), None),
    "dn-mma-BH32w2r2s2": (None, _dn(32, 2, 2, 2)),
    "dn-mma-BH16w1r2s4": (None, _dn(16, 1, 2, 4)),
    "dn-mma-BH32w1r4s2": (None, _dn(32, 1, 4, 2)),
    "dn-mma-BH64w4r2s2": (None, _dn(64, 4, 2, 2)),
}


def sweep_mma(out_dir: str) -> int:
    """``--mma`` (one device call): tensor-core variants. Checks: every MMA variant bit-identical to the first
    (same MMA sequence per row) on DeepSeek-V3 M = 1 and on H 2880 x I 704 / Qwen shapes (partial K steps);
    golden ``check_taps`` with ``FP32_TRUNCATE`` on the MMA path. Timings (gate/up alone, down alone, both) at
    DeepSeek-V3 M = 1, then the best gate/up + best down against the default at DeepSeek M = 1, 2, 4, 8 and
    Qwen / gpt-oss M = 1, 8."""
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
    from flint_moe.reference.exact import FP32_TRUNCATE

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "kernels"))
    from _nvfp4_check import check_taps, make_inputs, same

    t0 = time.time()
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    res = {"copy_bw": bw, "checks": [], "times": []}
    gus = [v for v in MMA_SWEEP if v.startswith("gu-")]
    dns = [v for v in MMA_SWEEP if v.startswith("dn-")]

    def note(name, ok, extra=""):
        res["checks"].append(dict(check=name, ok=bool(ok)))
        print(f"check {name}: {'ok' if ok else 'FAIL'} {extra}({time.time() - t0:.0f} s)", flush=True)

    def check(mname, cfg, Ms, golden_pairs, nvar=99):
        w = random_weights(cfg["E"], cfg["H"], cfg["I"], seed=3)
        for M in Ms:
            x, ids, tw, sh = make_inputs(M, cfg["H"], cfg["E"], cfg["k"], seed=M, device="cuda")
            ref_act = nvfp4_gate_up(x, ids, w, config=MMA_SWEEP[gus[0]][0])
            ref_y = None
            for v in gus[:nvar]:
                act = nvfp4_gate_up(x, ids, w, config=MMA_SWEEP[v][0])
                note(f"{mname} M={M} {v} act == {gus[0]}", same(act, ref_act))
            for v in dns[:nvar]:
                taps = {}
                nvfp4_down(ref_act, ids, tw, w, sh, config=MMA_SWEEP[v][1], taps=taps)
                if ref_y is None:
                    ref_y = taps["down_acc"]
                note(f"{mname} M={M} {v} down_acc == {dns[0]}", same(taps["down_acc"], ref_y))
            try:
                taps = {}
                out = nvfp4_down(
                    nvfp4_gate_up(x, ids, w, taps=taps, config=MMA_SWEEP[gus[1]][0]),
                    ids,
                    tw,
                    w,
                    sh,
                    taps=taps,
                    config=MMA_SWEEP[dns[1]][1],
                )
                pairs = golden_pairs(M, cfg["k"])
                check_taps(
                    w, x, ids, tw, sh, taps, out, acc_pairs=pairs, gu_model=FP32_TRUNCATE, dn_model=FP32_TRUNCATE
                )
                note(f"{mname} M={M} golden (FP32_TRUNCATE) pairs {sorted(pairs)}", True)
            except AssertionError as exc:
                note(f"{mname} M={M} golden", False, f"{exc} ")
        del w
        torch.cuda.empty_cache()

    def timing(mname, M, variants):
        w = None
        for v in variants:
            gu, dn = MMA_SWEEP[v] if isinstance(v, str) else v[1]
            name = v if isinstance(v, str) else v[0]
            prep, w, sets = _prepare(model=mname, M=M, gu=gu, dn=dn, weights=w)
            t_all = time_graph(prep.fn, prep.rotations)
            acts = [nvfp4_gate_up(x, ids, w, config=gu) for (x, ids, tw, sh) in sets]
            t_gu = time_graph(lambda i: nvfp4_gate_up(sets[i % CALLS][0], sets[i % CALLS][1], w, config=gu), CALLS)
            t_dn = time_graph(
                lambda i: nvfp4_down(
                    acts[i % CALLS], sets[i % CALLS][1], sets[i % CALLS][2], w, sets[i % CALLS][3], config=dn
                ),
                CALLS,
            )
            r = dict(
                model=mname,
                M=M,
                variant=name,
                us=t_all * 1e6,
                gu_us=t_gu * 1e6,
                dn_us=t_dn * 1e6,
                frac=prep.bytes_moved / t_all / bw,
                mb=prep.bytes_moved / 1e6,
                gu=gu,
                dn=dn,
            )
            res["times"].append(r)
            print(
                f"{mname:14s} M={M} {name:20s} all {r['us']:7.1f} us ({100 * r['frac']:4.1f}%)  gu {r['gu_us']:7.1f}"
                f"  dn {r['dn_us']:7.1f} ({time.time() - t0:.0f} s)",
                flush=True,
            )
        del w
        torch.cuda.empty_cache()

    def dump():
        n_bad = sum(not c["ok"] for c in res["checks"])
        lines = [
            f"copy {bw / 1e12:.3f} TB/s; checks {len(res['checks'])}, failures {n_bad}",
            "| model | M | variant | all us | % copy | gu us | dn us |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in res["times"]:
            lines.append(
                f"| {r['model']} | {r['M']} | {r['variant']} | {r['us']:.1f} | {100 * r['frac']:.1f} | "
                f"{r['gu_us']:.1f} | {r['dn_us']:.1f} |"
            )
        with open(os.path.join(out_dir, "mma.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(out_dir, "mma.json"), "w") as f:
            json.dump(res, f, indent=1)
        return n_bad, lines

    check("deepseek-v3", MODELS["deepseek-v3"], (1,), lambda M, k: {(0, 0), (0, k - 1)})
    dump()
    check("partial", dict(E=9, H=2880, I=704, k=4), (3,), lambda M, k: {(m, j) for m in range(M) for j in range(k)}, 2)
    dump()
    timing("deepseek-v3", 1, list(MMA_SWEEP))
    dump()
    best_gu = min((r for r in res["times"] if r["variant"] in gus), key=lambda r: r["gu_us"])
    best_dn = min((r for r in res["times"] if r["variant"] in dns), key=lambda r: r["dn_us"])
    best = ("best-mma", (best_gu["gu"], best_dn["dn"]))
    print(f"best gate/up {best_gu['variant']}, best down {best_dn['variant']}", flush=True)
    res["best"] = dict(gu=best_gu["variant"], dn=best_dn["variant"], gu_cfg=best_gu["gu"], dn_cfg=best_dn["dn"])
    for M in (1, 2, 4, 8):
        timing("deepseek-v3", M, ["new", best] if M > 1 else [best])
        dump()
    for mname in ("qwen3-30b-a3b", "gpt-oss-120b"):
        for M in (1, 8):
            timing(mname, M, ["new", best])
        dump()
    n_bad, lines = dump()
    print("\n".join(lines))
    return 1 if n_bad else 0


#: Tune candidates (``--tune``): complete configurations (every key of the path given, so that no value is
#: inherited from whichever defaults are current). CUDA-core ("cc") and tensor-core ("mma") paths; k = K-parts
#: (SK), f = FENCE (all code / scale loads of an asm call before its first decode), l2 = L2PF distance, pf = PF
#: (register prefetch), late = LATE.
def _mma_cfg(rows_key, rows, nw, rt, s, sk=1, late=False, pf=False, l2pf=0, fence=False):
    return {
        "MMA": True, rows_key: rows, "num_warps": nw, "RT": rt, "S": s, "SK": sk, "LATE": late, "PF": pf,
        "L2PF": l2pf, "FENCE": fence,
    }  # fmt: skip


def _gu6(bn, nw, rt, s, sk=1, **kw):
    return _mma_cfg("BN", bn, nw, rt, s, sk, **kw)


def _dn6(bh, nw, rt, s, sk=1, **kw):
    return _mma_cfg("BH", bh, nw, rt, s, sk, **kw)


TUNE_GU = {
    "cc-BN8w2": {"MMA": False, "BN": 8, "num_warps": 2, "BKB": 512, "PREFETCH": False, "WORDS": False},
    "mma-BN16w2r2s4": _gu6(16, 2, 2, 4),
    "mma-BN8w4r2s4k4": _gu6(8, 4, 2, 4, 4),
    "mma-BN8w4r2s4k4-pf": _gu6(8, 4, 2, 4, 4, pf=True),
    "mma-BN8w4r2s4k4-l2": _gu6(8, 4, 2, 4, 4, l2pf=2),
    "mma-BN8w4r2s4k4-f": _gu6(8, 4, 2, 4, 4, fence=True),
    "mma-BN8w4r2s4k4-f-l2": _gu6(8, 4, 2, 4, 4, fence=True, l2pf=2),
    "mma-BN8w4r2s2k4-f": _gu6(8, 4, 2, 2, 4, fence=True),
    "mma-BN16w4r2s4k2-f": _gu6(16, 4, 2, 4, 2, fence=True),
    "mma-BN16w8r2s4k4-f": _gu6(16, 8, 2, 4, 4, fence=True),
    "mma-BN16w2r2s4-f": _gu6(16, 2, 2, 4, fence=True),
}
TUNE_DN = {
    "cc-BH16w4": {"MMA": False, "BH": 16, "num_warps": 4, "BKB": 512, "PREFETCH": True, "WORDS": False},
    "mma-BH16w1r2s4": _dn6(16, 1, 2, 4),
    "mma-BH16w1r2s4-pf": _dn6(16, 1, 2, 4, pf=True),
    "mma-BH16w1r2s4-l2": _dn6(16, 1, 2, 4, l2pf=1),
    "mma-BH16w1r2s4-f": _dn6(16, 1, 2, 4, fence=True),
    "mma-BH16w1r2s2-f": _dn6(16, 1, 2, 2, fence=True),
    "mma-BH16w2r2s4k2-f": _dn6(16, 2, 2, 4, 2, fence=True),
    "mma-BH32w2r2s4-f": _dn6(32, 2, 2, 4, fence=True),
    "mma-BH16w4r2s2k4-f": _dn6(16, 4, 2, 2, 4, fence=True),
}


def _eff_sk(cfg: dict, kbytes: int, rows: int) -> int:
    """The K-split the launcher runs ``cfg`` with at a row of ``kbytes`` code bytes (1 on the CUDA cores)."""
    from flint_moe.kernels.nvfp4.gate_up import _check_mma

    if not cfg["MMA"]:
        return 0
    return _check_mma(cfg["RT"], cfg["S"], cfg["SK"], cfg["num_warps"], rows, kbytes, "rows", "rows")[0]


def tune(out_dir: str, write_tuned: str | None, models=("deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b")) -> int:
    """``--tune`` (one device call, before the GPU tests and the runner): checks, timings, choice of the defaults
    per shape (docs/kernels/nvfp4-decode.md).

    Per model at M = 1: every candidate with the same path and the same K-split the launcher runs at that shape
    gives the same bits as the first (gate/up act; down y_acc); the first of each such group is checked against
    the golden model (``FP32_TRUNCATE`` for the tensor-core path, the block model for the CUDA cores; two
    (token, expert) pairs). Timings (CUDA graphs, rotating expert sets): gate/up alone and down alone per
    candidate; gate/up + down for every gate/up with the fastest down, and for the fastest of those with every
    down. Choice: the pair with the least gate/up + down time; DeepSeek-V3's becomes ``GATE_UP`` / ``DOWN``;
    another model's becomes a per-shape override when it differs (the best pair on the default's paths, so that
    ``accumulation_model`` does not depend on the shape). Written to ``write_tuned`` if every check passed, and
    to DIR/tuned.py always."""
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
    from flint_moe.reference.exact import FP32_TRUNCATE, block_model

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "kernels"))
    from _nvfp4_check import check_taps, make_inputs, same

    t0 = time.time()
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    res = {"copy_bw": bw, "checks": [], "times": [], "choice": {}}

    def note(name, ok, extra=""):
        res["checks"].append(dict(check=name, ok=bool(ok)))
        print(f"check {name}: {'ok' if ok else 'FAIL'} {extra}({time.time() - t0:.0f} s)", flush=True)

    def model_of(cfg):
        return FP32_TRUNCATE if cfg["MMA"] else block_model(16)

    def checks(mname):
        cfg = MODELS[mname]
        H, I, k = cfg["H"], cfg["I"], cfg["k"]
        w = random_weights(cfg["E"], H, I, seed=3)
        x, ids, tw, sh = make_inputs(1, H, cfg["E"], k, seed=11, device="cuda")
        pairs = {(0, 0), (0, k - 1)}
        refs = {}
        for v, gu in TUNE_GU.items():
            key = (gu["MMA"], _eff_sk(gu, H // 2, 2 * gu["BN"]))
            act = nvfp4_gate_up(x, ids, w, config=gu)
            if key in refs:
                note(f"{mname} gate/up {v} == first of its path and K-split", same(act, refs[key]))
                continue
            refs[key] = act
            taps = {}
            out = nvfp4_down(nvfp4_gate_up(x, ids, w, config=gu, taps=taps), ids, tw, w, sh, taps=taps,
                             config=TUNE_DN["mma-BH16w1r2s4"])  # fmt: skip
            try:
                check_taps(w, x, ids, tw, sh, taps, out, acc_pairs=pairs, gu_model=model_of(gu),
                           dn_model=FP32_TRUNCATE)  # fmt: skip
                note(f"{mname} gate/up {v} golden", True)
            except AssertionError as exc:
                note(f"{mname} gate/up {v} golden", False, f"{exc} ")
        cc = TUNE_GU["cc-BN8w2"]
        gtaps = {}
        act = nvfp4_gate_up(x, ids, w, config=cc, taps=gtaps)
        drefs = {}
        for v, dn in TUNE_DN.items():
            key = (dn["MMA"], _eff_sk(dn, I // 2, dn["BH"]))
            taps = {}
            out = nvfp4_down(act, ids, tw, w, sh, config=dn, taps=taps)
            if key in drefs:
                note(f"{mname} down {v} == first of its path and K-split", same(taps["down_acc"], drefs[key]))
                continue
            drefs[key] = taps["down_acc"]
            taps.update(act=act.view(1, k, -1), gate_acc=gtaps["gate_acc"], up_acc=gtaps["up_acc"])
            try:
                check_taps(w, x, ids, tw, sh, taps, out, acc_pairs=pairs, gu_model=block_model(16),
                           dn_model=model_of(dn))  # fmt: skip
                note(f"{mname} down {v} golden", True)
            except AssertionError as exc:
                note(f"{mname} down {v} golden", False, f"{exc} ")
        del w
        torch.cuda.empty_cache()

    def timings(mname):
        state = {"w": None}

        def timing(name, gu, dn, parts):
            prep, w, sets = _prepare(model=mname, M=1, gu=gu, dn=dn, weights=state["w"])
            state["w"] = w
            r = dict(model=mname, variant=name, gu=gu, dn=dn)
            if "all" in parts:
                t = time_graph(prep.fn, prep.rotations)
                r.update(us=t * 1e6, frac=prep.bytes_moved / t / bw)
            if "gu" in parts:
                r["gu_us"] = 1e6 * time_graph(
                    lambda i: nvfp4_gate_up(sets[i % CALLS][0], sets[i % CALLS][1], w, config=gu), CALLS
                )
            if "dn" in parts:
                acts = [nvfp4_gate_up(xx, ii, w, config=TUNE_GU["cc-BN8w2"]) for (xx, ii, _, _) in sets]
                r["dn_us"] = 1e6 * time_graph(
                    lambda i: nvfp4_down(
                        acts[i % CALLS], sets[i % CALLS][1], sets[i % CALLS][2], w, sets[i % CALLS][3], config=dn
                    ),
                    CALLS,
                )
            res["times"].append(r)
            print(
                f"{mname} M=1 {name:44s} "
                + "  ".join(f"{k} {r[k]:.1f}" for k in ("us", "gu_us", "dn_us") if k in r)
                + (f" ({100 * r['frac']:.1f}% of copy)" if "frac" in r else "")
                + f" ({time.time() - t0:.0f} s)",
                flush=True,
            )
            return r

        for v, gu in TUNE_GU.items():
            timing("gu " + v, gu, None, ("gu",))
        dn_t = {v: timing("dn " + v, None, dn, ("dn",))["dn_us"] for v, dn in TUNE_DN.items()}
        best_dn = min(dn_t, key=dn_t.get)
        pair_t = {}
        for v, gu in TUNE_GU.items():
            pair_t[(v, best_dn)] = timing(f"all {v} + {best_dn}", gu, TUNE_DN[best_dn], ("all",))["us"]
        best_gu = min((g for g, _ in pair_t), key=lambda g: pair_t[(g, best_dn)])
        for v, dn in TUNE_DN.items():
            if v != best_dn:
                pair_t[(best_gu, v)] = timing(f"all {best_gu} + {v}", TUNE_GU[best_gu], dn, ("all",))["us"]
        del state["w"]
        torch.cuda.empty_cache()
        return pair_t, dn_t

    per_model = {}
    for mname in models:
        checks(mname)
        per_model[mname] = timings(mname)
    n_bad = sum(not c["ok"] for c in res["checks"])

    ds_pairs, ds_dn = per_model["deepseek-v3"]
    gu0, dn0 = min(ds_pairs, key=ds_pairs.get)
    res["choice"]["deepseek-v3"] = dict(gate_up=gu0, down=dn0, us=ds_pairs[(gu0, dn0)])
    gu_by_shape, dn_by_shape = {}, {}
    for mname in models[1:]:
        pairs = per_model[mname][0]
        same_path = {
            p: t for p, t in pairs.items()
            if TUNE_GU[p[0]]["MMA"] == TUNE_GU[gu0]["MMA"] and TUNE_DN[p[1]]["MMA"] == TUNE_DN[dn0]["MMA"]
        }  # fmt: skip
        g, d = min(same_path, key=same_path.get)
        dflt = pairs.get((gu0, dn0))
        res["choice"][mname] = dict(gate_up=g, down=d, us=same_path[(g, d)], default_pair_us=dflt)
        shape = (MODELS[mname]["H"], MODELS[mname]["I"])
        if g != gu0:
            gu_by_shape[shape] = g
        if d != dn0:
            dn_by_shape[shape] = d
    gu_cc = "cc-BN8w2"
    gu_mma = min(
        (v for v in TUNE_GU if v.startswith("mma")), key=lambda v: ds_pairs.get((v, min(ds_dn, key=ds_dn.get)), 1e9)
    )
    dn_cc = min((v for v in TUNE_DN if v.startswith("cc")), key=ds_dn.get)
    dn_mma = min((v for v in TUNE_DN if v.startswith("mma")), key=ds_dn.get)
    print(f"choice: {res['choice']}; checks {len(res['checks'])}, failures {n_bad}", flush=True)

    def shapes_text(table, cands, what):
        if not table:
            return "{}"
        rows = [f"    {shape!r}: {cands[v]!r},  # {v}" for shape, v in sorted(table.items())]
        return "{\n" + "\n".join(rows) + "\n}"

    ds = res["choice"]["deepseek-v3"]
    text = tuned_text(
        "",
        f"DeepSeek-V3 M=1 gate/up + down {ds['us']:.1f} us\n(copy {bw / 1e12:.3f} TB/s).",
        [
            ("GATE_UP", TUNE_GU[gu0], gu0),
            ("DOWN", TUNE_DN[dn0], dn0),
            ("GATE_UP_CUDA_CORE", TUNE_GU[gu_cc], gu_cc),
            ("GATE_UP_MMA", TUNE_GU[gu_mma], gu_mma),
            ("DOWN_CUDA_CORE", TUNE_DN[dn_cc], dn_cc),
            ("DOWN_MMA", TUNE_DN[dn_mma], dn_mma),
        ],
        shapes_text(gu_by_shape, TUNE_GU, "gate/up"),
        shapes_text(dn_by_shape, TUNE_DN, "down"),
    )
    with open(os.path.join(out_dir, "tuned.py"), "w") as f:
        f.write(text)
    if write_tuned and n_bad == 0:
        with open(write_tuned, "w") as f:
            f.write(text)
    lines = [
        f"copy {bw / 1e12:.3f} TB/s; checks {len(res['checks'])}, failures {n_bad}; choice {res['choice']}",
        "| model | variant | all us | % copy | gu us | dn us |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["times"]:
        lines.append(
            f"| {r['model']} | {r['variant']} | "
            + " | ".join(
                (f"{100 * r[k]:.1f}" if k == "frac" else f"{r[k]:.1f}") if k in r else ""
                for k in ("us", "frac", "gu_us", "dn_us")
            )
            + " |"
        )
    with open(os.path.join(out_dir, "tune.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "tune.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("\n".join(lines))
    return 1 if n_bad else 0


#: Follow-up probe (``--probe``): gate/up variants not among the ``--tune`` candidates, each timed alone and with the
#: default down at DeepSeek-V3 M=1 (diagnostic only: nothing is written).
PROBE_GU = {
    "mma-BN8w4r2s2k4": _gu6(8, 4, 2, 2, 4),
    "mma-BN8w4r2s1k4": _gu6(8, 4, 2, 1, 4),
    "mma-BN8w2r2s2k2-f": _gu6(8, 2, 2, 2, 2, fence=True),
    "mma-BN8w4r2s2k4-f-late": _gu6(8, 4, 2, 2, 4, fence=True, late=True),
}


def probe(out_dir: str) -> int:
    """``PROBE_GU`` at DeepSeek-V3 M=1: bits equal to the default gate/up's where the K-split is the same, then
    gate/up alone, the default pair and each probe with the default down (CUDA graphs); DIR/probe.md."""
    from flint_moe.kernels.nvfp4.gate_up import GATE_UP_CONFIG, nvfp4_gate_up

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "kernels"))
    from _nvfp4_check import make_inputs, same

    bw = copy_bw()
    cfg = MODELS["deepseek-v3"]
    w = random_weights(cfg["E"], cfg["H"], cfg["I"], seed=3)
    x, ids, _, _ = make_inputs(1, cfg["H"], cfg["E"], cfg["k"], seed=11, device="cuda")
    ref = nvfp4_gate_up(x, ids, w)
    sk0 = _eff_sk(GATE_UP_CONFIG, cfg["H"] // 2, 2 * GATE_UP_CONFIG["BN"])
    lines = [
        f"copy {bw / 1e12:.3f} TB/s",
        "| gate/up | same bits as default | gu us | all us | % copy |",
        "|---|---|---|---|---|",
    ]
    bad = 0
    state = {"w": w}
    for name, gu in {"default": None, **PROBE_GU}.items():
        eq = ""
        if gu is not None and _eff_sk(gu, cfg["H"] // 2, 2 * gu["BN"]) == sk0:
            ok = same(nvfp4_gate_up(x, ids, w, config=gu), ref)
            bad += not ok
            eq = "yes" if ok else "NO"
        prep, _, sets = _prepare(model="deepseek-v3", M=1, gu=gu, weights=state["w"])
        t_all = time_graph(prep.fn, prep.rotations)
        t_gu = time_graph(lambda i: nvfp4_gate_up(sets[i % CALLS][0], sets[i % CALLS][1], w, config=gu), CALLS)
        lines.append(
            f"| {name} | {eq} | {t_gu * 1e6:.1f} | {t_all * 1e6:.1f} | {100 * prep.bytes_moved / t_all / bw:.1f} |"
        )
        print(lines[-1], flush=True)
    with open(os.path.join(out_dir, "probe.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 1 if bad else 0


#: Down candidates of ``--round7`` (RB, EARLY, MAXNREG), DeepSeek-V3 shape, all tensor-core BH 16 / 1 warp / RT 2
#: (complete configurations). e1 / e2 = EARLY 1 / 2 (first call's weights into registers / L2 before
#: griddepcontrol.wait), r72 = MAXNREG 72 (28 one-warp programs per SM: one wave of the 3584 programs at M=1),
#: rbN = RB N (N row blocks per program), f = FENCE. Every candidate has the default down's per-row MMA sequence:
#: the same bits.
def _dn7(s=4, rb=1, early=0, maxnreg=0, fence=False):
    return {**_dn6(16, 1, 2, s, fence=fence), "RB": rb, "EARLY": early, "MAXNREG": maxnreg}


TUNE7_DN = {
    "mma-BH16w1r2s4": _dn7(),  # the base down (the ``--tune`` default)
    "mma-BH16w1r2s4-e1-r72": _dn7(early=1, maxnreg=72),
    "mma-BH16w1r2s4-e1": _dn7(early=1),
    "mma-BH16w1r2s4-e2": _dn7(early=2),
    "mma-BH16w1r2s2-e1": _dn7(s=2, early=1),
    "mma-BH16w1r2s4-f-r72": _dn7(fence=True, maxnreg=72),
    "mma-BH16w1r2s4-f-e1-r72": _dn7(fence=True, early=1, maxnreg=72),
    "mma-BH16w1r2s4-rb2": _dn7(rb=2),
    "mma-BH16w1r2s4-rb2-e1": _dn7(rb=2, early=1),
    "mma-BH16w1r2s4-rb2-f": _dn7(rb=2, fence=True),
    "mma-BH16w1r2s4-rb2-f-e1": _dn7(rb=2, fence=True, early=1),
}
#: Keys that pin a per-shape down override to the base down's behaviour when DOWN changes.
PIN7 = {"RB": 1, "EARLY": 0, "MAXNREG": 0}


def tuned_text(doc_extra: str, measured: str, values: list, gu_by_shape: str, dn_by_shape: str) -> str:
    """Text of nvfp4/tuned.py: the module docstring (the ``--tune`` paragraph, then ``doc_extra`` and the
    ``measured`` line), ``values`` as ``(name, config, comment)`` assignments (comment "" for none) and the two
    per-shape override dicts as source text. Shared by ``tune`` and ``round7``."""
    body = "".join(f"{name} = {cfg!r}" + (f"  # {note}" if note else "") + "\n" for name, cfg, note in values)
    return (
        '"""Launch configurations of the NVFP4 decode kernels chosen on the H200.\n\n'
        "Written by ``benchmarks/bench_decode_nvfp4.py --tune --write-tuned`` (docs/kernels/nvfp4-decode.md):\n"
        "``GATE_UP`` / ``DOWN`` are the pair with the least gate/up + down time at DeepSeek-V3 M=1 among the\n"
        "CUDA-core and tensor-core (``MMA``) candidates, each checked against the golden model first;\n"
        "``*_BY_SHAPE[(H, I)]`` the pair of another measured model where it differs (same paths: a shape never\n"
        "changes ``MMA``); ``*_CUDA_CORE`` / ``*_MMA`` the best of each path at DeepSeek-V3 (tests run both).\n"
        f"{doc_extra}Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {measured}\n"
        '"""\n\n'
        f"{body}"
        "#: Per-shape overrides ((H, I) -> keys replacing GATE_UP's / DOWN's at that shape; never MMA).\n"
        f"GATE_UP_BY_SHAPE: dict = {gu_by_shape}\n"
        f"DOWN_BY_SHAPE: dict = {dn_by_shape}\n"
    )


def tuned7_text(best: str, best_us: float, base_us: float, bw: float) -> str:
    """Text of nvfp4/tuned.py with ``DOWN`` / ``DOWN_MMA`` = ``TUNE7_DN[best]``, everything else as now and the
    per-shape down overrides pinned with ``PIN7`` (``round7``)."""
    from flint_moe.kernels.nvfp4 import tuned as T

    dn_shape = {shape: {**over, **PIN7} for shape, over in T.DOWN_BY_SHAPE.items()}
    return tuned_text(
        "Then ``--round7 --write-tuned``: ``DOWN`` / ``DOWN_MMA`` the fastest pair of the down candidates (row blocks\n"
        "per program, weights loaded before the grid-dependency wait, register cap; same bits as the base down\n"
        "``mma-BH16w1r2s4``, the ``--tune`` choice); the per-shape down overrides pinned to the base down's behaviour\n"
        "(RB 1, EARLY 0, MAXNREG 0).\n",
        f"DeepSeek-V3 M=1 gate/up + down {best_us:.1f} us\n(copy {bw / 1e12:.3f} TB/s; base down "
        f"{base_us:.1f} us in the same run).",
        [
            ("GATE_UP", T.GATE_UP, ""),
            ("DOWN", TUNE7_DN[best], best),
            ("GATE_UP_CUDA_CORE", T.GATE_UP_CUDA_CORE, ""),
            ("GATE_UP_MMA", T.GATE_UP_MMA, ""),
            ("DOWN_CUDA_CORE", T.DOWN_CUDA_CORE, ""),
            ("DOWN_MMA", TUNE7_DN[best], best),
        ],
        repr(T.GATE_UP_BY_SHAPE),
        repr(dn_shape),
    )


def round7(out_dir: str, write_tuned: str | None) -> int:
    """``--round7`` (docs/kernels/nvfp4-decode.md): the ``TUNE7_DN`` downs at DeepSeek-V3 with the default gate/up.

    Checks: every candidate's y_acc, y and out bit-identical to the base down's (``mma-BH16w1r2s4``) at M = 1 and 3
    (same act). Timings (CUDA graphs, rotating expert sets, M=1): down alone, then gate/up + down for every candidate in
    3 rounds (candidate order rotated each round; median of the rounds). Diagnostic: Qwen3 / gpt-oss M=1 pair with their
    own down, with and without EARLY 1. Choice: the least median pair time; written as ``DOWN`` / ``DOWN_MMA``
    (per-shape down overrides pinned with ``PIN7``) to ``write_tuned`` only if every check passed and it beats the base
    down in every round; DIR/tuned7.py always."""
    from flint_moe.kernels.nvfp4.down_combine import default_config as dn_default, nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "kernels"))
    from _nvfp4_check import make_inputs, same

    t0 = time.time()
    bw = copy_bw()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    res = {"copy_bw": bw, "checks": [], "times": [], "choice": None}
    base = "mma-BH16w1r2s4"
    cfg = MODELS["deepseek-v3"]
    E, H, I, k = cfg["E"], cfg["H"], cfg["I"], cfg["k"]
    w = random_weights(E, H, I, seed=3)
    for M in (1, 3):
        x, ids, tw, sh = make_inputs(M, H, E, k, seed=11 + M, device="cuda")
        act = nvfp4_gate_up(x, ids, w)
        t_ref = {}
        ref = nvfp4_down(act, ids, tw, w, sh, config=TUNE7_DN[base], taps=t_ref)
        for v, dn in TUNE7_DN.items():
            taps = {}
            out = nvfp4_down(act, ids, tw, w, sh, config=dn, taps=taps)
            out2 = nvfp4_down(act, ids, tw, w, sh, config=dn)
            ok = same(out, ref) and same(out2, ref) and same(taps["down_acc"], t_ref["down_acc"])
            ok = ok and same(taps["y"], t_ref["y"])
            res["checks"].append(dict(check=f"M={M} {v}", ok=bool(ok)))
            print(f"check M={M} {v} == {base}: {'ok' if ok else 'FAIL'} ({time.time() - t0:.0f} s)", flush=True)
    prep0, w, sets = _prepare(model="deepseek-v3", M=1, weights=w)
    acts = [nvfp4_gate_up(xx, ii, w) for (xx, ii, _, _) in sets]
    dn_us = {}
    for v, dn in TUNE7_DN.items():
        dn_us[v] = 1e6 * time_graph(
            lambda i, dn=dn: nvfp4_down(
                acts[i % CALLS], sets[i % CALLS][1], sets[i % CALLS][2], w, sets[i % CALLS][3], config=dn
            ),
            CALLS,
        )
        print(f"dn {v:32s} {dn_us[v]:.1f} us ({time.time() - t0:.0f} s)", flush=True)
    names = list(TUNE7_DN)
    pair = {v: [] for v in names}
    gu_us = 1e6 * time_graph(lambda i: nvfp4_gate_up(sets[i % CALLS][0], sets[i % CALLS][1], w), CALLS)
    for rnd in range(3):
        order = names[rnd:] + names[:rnd] if rnd != 1 else names[::-1]
        for v in order:
            prep, _, _ = _prepare(model="deepseek-v3", M=1, dn=TUNE7_DN[v], weights=w)
            pair[v].append(1e6 * time_graph(prep.fn, prep.rotations))
        print(f"round {rnd}: " + ", ".join(f"{v} {pair[v][-1]:.1f}" for v in names), flush=True)
    nbytes = prep0.bytes_moved
    for v in names:
        med = statistics.median(pair[v])
        res["times"].append(dict(model="deepseek-v3", variant=v, dn_us=dn_us[v], pair_us=pair[v], median=med,
                                 frac=nbytes / (med * 1e-6) / bw))  # fmt: skip
    del w
    torch.cuda.empty_cache()
    diag = []
    for mname in ("qwen3-30b-a3b", "gpt-oss-120b"):
        m = MODELS[mname]
        d0 = dn_default(m["H"], m["I"])
        ww = None
        for tag, dn in (("own down", d0), ("own down + EARLY 1", {**d0, "EARLY": 1})):
            try:
                prep, ww, _ = _prepare(model=mname, M=1, dn=dn, weights=ww)
                t = [1e6 * time_graph(prep.fn, prep.rotations) for _ in range(2)]
                diag.append(f"| {mname} | {tag} | {t[0]:.1f}, {t[1]:.1f} |")
            except Exception as exc:  # diagnostic only
                diag.append(f"| {mname} | {tag} | error {type(exc).__name__}: {exc} |")
            print(diag[-1], flush=True)
        del ww
        torch.cuda.empty_cache()
    n_bad = sum(not c["ok"] for c in res["checks"])
    med = {v: statistics.median(pair[v]) for v in names}
    best = min(med, key=med.get)
    wins = best != base and all(a < b for a, b in zip(pair[best], pair[base], strict=True))
    res["choice"] = dict(down=best, median=med[best], base_median=med[base], wins_every_round=wins)
    text = tuned7_text(best, med[best], med[base], bw)
    with open(os.path.join(out_dir, "tuned7.py"), "w") as f:
        f.write(text)
    written = bool(write_tuned and n_bad == 0 and wins)
    if written:
        with open(write_tuned, "w") as f:
            f.write(text)
    lines = [
        f"copy {bw / 1e12:.3f} TB/s; checks {len(res['checks'])}, failures {n_bad}; gate/up alone {gu_us:.1f} us; "
        f"choice {res['choice']}; written {written}",
        "",
        "| down (DeepSeek-V3 M=1) | dn us | pair us (3 rounds) | median | % copy |",
        "|---|---|---|---|---|",
    ]
    for r in res["times"]:
        lines.append(
            f"| {r['variant']} | {r['dn_us']:.1f} | {', '.join(f'{t:.1f}' for t in r['pair_us'])} | "
            f"{r['median']:.1f} | {100 * r['frac']:.1f} |"
        )
    lines += ["", "| model | down | pair us (2 runs) |", "|---|---|---|", *diag]
    with open(os.path.join(out_dir, "round7.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "round7.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    print("\n".join(lines), flush=True)
    return 1 if n_bad else 0


def ab7(out_dir: str) -> int:
    """``--ab7``: confirmation of ``--round7`` (diagnostic, nothing written but DIR/ab7.md): gate/up + down at
    M = 1, 2, 4, 8 with the committed default down against the base down ``mma-BH16w1r2s4`` (DeepSeek-V3), and
    gpt-oss-120b's own down with and without EARLY 1; 3 interleaved rounds (order reversed every other round),
    CUDA graphs, median."""
    from flint_moe.kernels.nvfp4.down_combine import default_config as dn_default

    bw = copy_bw()
    lines = [f"copy {bw / 1e12:.3f} TB/s", "", "| model | M | down | us (3 rounds) | median |", "|---|---|---|---|---|"]
    variants = {
        "deepseek-v3": {"default (tuned down)": None, "base down": TUNE7_DN["mma-BH16w1r2s4"]},
        "gpt-oss-120b": {"default (own down)": None, "own down + EARLY 1": {**dn_default(2880, 2880), "EARLY": 1}},
    }
    for mname, vs in variants.items():
        w = None
        for M in (1, 2, 4, 8):
            preps = {}
            for v, dn in vs.items():
                preps[v], w, _ = _prepare(model=mname, M=M, dn=dn, weights=w)
            t = {v: [] for v in vs}
            for rnd in range(3):
                for v in list(vs) if rnd % 2 == 0 else list(vs)[::-1]:
                    t[v].append(1e6 * time_graph(preps[v].fn, preps[v].rotations))
            for v in vs:
                lines.append(f"| {mname} | {M} | {v} | {', '.join(f'{x:.1f}' for x in t[v])} | "
                             f"{statistics.median(t[v]):.1f} |")  # fmt: skip
                print(lines[-1], flush=True)
        del w
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "ab7.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/bench-nvfp4"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default="default")
    ap.add_argument("--sweep", action="store_true", help="tuning sweep (bit checks + split timings)")
    ap.add_argument("--words", action="store_true", help="sweep of int32-word code tiles (WORDS)")
    ap.add_argument("--mma", action="store_true", help="sweep of the tensor-core path (MMA)")
    ap.add_argument("--tune", action="store_true", help="checks, timings and the choice of the defaults")
    ap.add_argument("--probe", action="store_true", help="follow-up to --tune: untuned gate/up variants (no write)")
    ap.add_argument("--write-tuned", default=None, help="with --tune: path of nvfp4/tuned.py to (over)write")
    ap.add_argument("--round7", action="store_true", help="down candidates (RB, EARLY, MAXNREG)")
    ap.add_argument("--ab7", action="store_true", help="confirmation of --round7: tuned vs base down, M = 1..8")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.round7:
        return round7(args.out, args.write_tuned)
    if args.ab7:
        return ab7(args.out)
    if args.tune:
        return tune(args.out, args.write_tuned)
    if args.probe:
        return probe(args.out)
    if args.mma:
        return sweep_mma(args.out)
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
