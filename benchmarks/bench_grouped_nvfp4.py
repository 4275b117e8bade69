"""Grouped NVFP4 path (``flint_moe_grouped``) vs ``torch._grouped_mm`` on bf16 weights, on the H200.

``PYTHONPATH=$PWD python3 benchmarks/bench_grouped_nvfp4.py [--out DIR] [--quick]``;
``... --cross [--model ...] --out DIR``: decode vs grouped around the threshold (``CROSS_M``; the measurement
behind ``ops.decode_max_tokens``, reports/gpu/nvfp4-grouped/crossover-engines/; the first: crossover/);
``... --ab [--model deepseek-v3 [--model ...] --M 1024,4096] --out DIR``: only the default launch configuration
against the schedule with both launch options off and the expert-wide row blocks (op config ``TAIL`` 32,
without and with ``SCALE_WORD``; ``AB_VARIANTS``) and the bf16 layer, alternated over two rounds, and each
variant's two GEMM kernels alone, bits compared, the row blocks and programs of each schedule (``ab``), at
``AB_CASES`` (DeepSeek-V3 M = 4096 and 16384, Qwen3-235B-A22B and gpt-oss-120b M = 4096) unless --model /
--M name others (every model at every M).

Both sides run the same layer end to end from the same tokens and router: ``route`` (same ids and routing
weights), then
- grouped (NVFP4): ``moe_permute`` + ``nvfp4_grouped_gate_up`` + ``nvfp4_grouped_down`` + combine;
- bf16 baseline: a stable sort of the pairs by expert, a gather of x, ``torch._grouped_mm`` (CUTLASS, bf16,
  fp32 accumulation) for w13, SiLU(gate) * up in torch, ``torch._grouped_mm`` for w2, weighted sum + shared.
  Its weights are the exact bf16 dequantisation of the NVFP4 weights (E2M1 x E4M3 is exact in bf16; the
  global scales are folded into the epilogues), so both compute the same function and the outputs are
  compared (relative L2 error, reported). It reads 3.6x more weight bytes.
FLOPs per call: ``2 M k (2I) H + 2 M k I H`` (the expert GEMMs; the router's ``2 M E H`` is common to both
and left out). TFLOP/s = FLOPs / time; ratio = bf16 time / grouped time (> 1: grouped faster).
Timing (METHOD.md): warm-up, then a CUDA graph of n calls (n chosen so a replay lasts >= ~30 ms, at most
20), replayed and timed with CUDA events, median. Weights are GBs, far beyond the 60 MB L2, so one input set.

Also: decode vs grouped at DeepSeek-V3 for M = 4..32 (decode kernels called directly at every M) to place the
threshold; a launch-config sweep of the grouped kernels at M = 4096;
the golden model (``reference.model.moe_nvfp4``, exact accumulations) at small M.

``CASES`` / ``prepare`` plug into ``benchmarks/runner.py`` (grouped and bf16 cases).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from benchmarks.runner import replay_median

MODELS = {
    "deepseek-v3": dict(E=256, H=7168, I=2048, k=8),
    "qwen3-235b-a22b": dict(E=128, H=4096, I=1536, k=8),
    "gpt-oss-120b": dict(E=128, H=2880, I=2880, k=4),
}
MS = (128, 256, 1024, 4096, 16384)
CASES = [
    dict(name=f"{m}.M{M}.{impl}", model=m, M=M, impl=impl) for m in MODELS for M in MS for impl in ("grouped", "bf16")
]

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def expert_weight_bytes(H: int, I: int) -> int:  # noqa: E741
    """NVFP4 bytes of one expert's w1 and w2: codes (3 H I / 2) and E4M3 block scales (3 H I / 16)."""
    return 3 * H * I // 2 + 3 * H * I // 16


def flops(M: int, H: int, I: int, k: int) -> int:  # noqa: E741
    return 2 * M * k * (2 * I) * H + 2 * M * k * I * H


def unswizzle(sf: torch.Tensor, E: int, rows: int, cols: int) -> torch.Tensor:
    """[E, roundup(rows, 128), roundup(cols, 4)] swizzled scale bytes -> uint8 [E, rows, cols] (docs/layouts.md)."""
    b = sf.view(torch.uint8).reshape(E, -1)
    mp, kp = -(-rows // 128) * 128, -(-cols // 4) * 4
    v = b.view(E, mp // 128, kp // 4, 32, 4, 4).permute(0, 1, 4, 3, 2, 5).reshape(E, mp, kp)
    return v[:, :rows, :cols]


def dequant_bf16(codes: torch.Tensor, sf: torch.Tensor, rows: int, cols: int, chunk: int = 8) -> torch.Tensor:
    """Exact bf16 of NVFP4 codes uint8 [E, rows, cols/2] with swizzled E4M3 scales -> bf16 [E, rows, cols]."""
    E = codes.shape[0]
    table = torch.tensor(_E2M1, dtype=torch.float32, device=codes.device)
    sc = unswizzle(sf, E, rows, cols // 16)
    out = torch.empty((E, rows, cols), dtype=torch.bfloat16, device=codes.device)
    for e0 in range(0, E, chunk):
        c = codes[e0 : e0 + chunk].long()
        v = torch.stack([table[c & 15], table[c >> 4]], dim=-1).reshape(c.shape[0], rows, cols)
        s = sc[e0 : e0 + chunk].contiguous().view(torch.float8_e4m3fn).float()
        out[e0 : e0 + chunk] = (v.view(c.shape[0], rows, cols // 16, 16) * s[..., None]).reshape(v.shape).bfloat16()
    return out


class Layer:
    """One random NVFP4 layer (FlintMoEWeights) and, on demand, its exact bf16 dequantisation."""

    def __init__(self, model: str, device: str = "cuda", seed: int = 0, dims: dict | None = None):
        from benchmarks.bench_decode_nvfp4 import random_weights

        self.model = model
        d = dims or MODELS[model]
        self.E, self.H, self.I, self.k = d["E"], d["H"], d["I"], d["k"]
        self.w = random_weights(self.E, self.H, self.I, device=device, seed=seed)
        self.device = device
        self._bf16 = None

    def bf16(self):
        """(w13 bf16 [E, 2I, H] in w1's physical row order, w2 bf16 [E, H, I]); global scales not applied."""
        if self._bf16 is None:
            w = self.w
            w13 = dequant_bf16(w.w1, w.w1_sf_swizzled, 2 * self.I, self.H)
            w2 = dequant_bf16(w.w2, w.w2_sf_swizzled, self.H, self.I)
            self._bf16 = (w13, w2)
        return self._bf16

    def inputs(self, M: int, seed: int = 1):
        g = torch.Generator(device=self.device).manual_seed(seed)
        x = torch.randn(M, self.H, generator=g, device=self.device).to(torch.bfloat16)
        router = (torch.randn(self.E, self.H, generator=g, device=self.device) * 0.05).to(torch.bfloat16)
        shared = torch.randn(M, self.H, generator=g, device=self.device).to(torch.bfloat16)
        return x, router, shared


def bf16_baseline(layer: Layer, x, router, shared, counter):
    """The bf16 grouped-GEMM layer (module docstring); returns bf16 [M, H]."""
    from flint_moe.ops import route

    w13, w2 = layer.bf16()
    E, k, inter = layer.E, layer.k, layer.I
    ids, tw = route(x, router, k, counter)
    M = x.shape[0]
    flat = ids.reshape(-1)
    sorted_e, order = torch.sort(flat, stable=True)
    offs = torch.searchsorted(sorted_e, torch.arange(1, E + 1, dtype=torch.int32, device=x.device)).to(torch.int32)
    xs = x.index_select(0, order // k)
    h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)  # [P, 2I] physical rows: [up 64; gate 64]...
    a1 = layer.w.w1_alpha[sorted_e.long()][:, None]
    h = h.float().view(-1, 2 * inter // 128, 2, 64) * a1[..., None, None]
    up, gate = h[:, :, 0].reshape(-1, inter), h[:, :, 1].reshape(-1, inter)
    act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
    y = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs).float() * layer.w.w2_alpha[sorted_e.long()][:, None]
    yp = torch.empty_like(y)
    yp[order] = y
    out = (yp.view(M, k, -1) * tw[..., None]).sum(1) + shared.float()
    return out.to(torch.bfloat16)


def prepare(name=None, model="deepseek-v3", M=128, impl="grouped", layer=None, config=None):
    """``benchmarks/runner.py`` entry point: ``Prepared`` of one case (impl "grouped" | "bf16" | "decode")."""
    from benchmarks.runner import Prepared
    from flint_moe.ops import flint_moe_grouped, make_route_counter

    layer = layer or Layer(model)
    x, router, shared = layer.inputs(M)
    counter = make_route_counter(layer.device)
    if impl == "grouped":

        def fn(i):
            return flint_moe_grouped(x, router, layer.w, layer.k, counter, shared, config=config)

        wbytes_per_expert = expert_weight_bytes(layer.H, layer.I)
    elif impl == "bf16":
        layer.bf16()

        def fn(i):
            return bf16_baseline(layer, x, router, shared, counter)

        wbytes_per_expert = 3 * layer.H * layer.I * 2
    elif impl == "decode":
        from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
        from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
        from flint_moe.ops import route

        def fn(i):
            ids, tw = route(x, router, layer.k, counter)
            act = nvfp4_gate_up(x, ids, layer.w)
            return nvfp4_down(act, ids, tw, layer.w, shared)

        wbytes_per_expert = expert_weight_bytes(layer.H, layer.I)
    else:
        raise ValueError(f"impl: 'grouped', 'bf16' or 'decode', got {impl!r}")
    used = min(layer.E, M * layer.k)  # upper bound of the distinct experts touched
    nbytes = used * wbytes_per_expert + 2 * M * layer.H * 2 * 2
    return Prepared(
        fn=fn, bytes_moved=nbytes, flops=flops(M, layer.H, layer.I, layer.k), rotations=1, note=f"{model} {impl}"
    )


def time_fn(fn, target_s: float = 0.03, max_calls: int = 20) -> float:
    """Median seconds per call: warm-up, CUDA graph of n calls, replays timed with events."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn(0)
    b.record()
    b.synchronize()
    t0 = a.elapsed_time(b) * 1e-3
    calls = max(1, min(max_calls, int(target_s / max(t0, 1e-6))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    reps = 5 if t0 * calls > 0.02 else 15
    t = replay_median(graph, calls, reps)
    del graph
    return t


def _grouped(layer, x, router, shared, counter, config=None):
    """fn(i) running the grouped op (arguments bound now)."""
    from flint_moe.ops import flint_moe_grouped

    return lambda i: flint_moe_grouped(x, router, layer.w, layer.k, counter, shared, config=config)


def _bf16(layer, x, router, shared, counter):
    return lambda i: bf16_baseline(layer, x, router, shared, counter)


def _decode(layer, x, router, shared, counter):
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
    from flint_moe.ops import route

    def fn(i):
        ids, tw = route(x, router, layer.k, counter)
        return nvfp4_down(nvfp4_gate_up(x, ids, layer.w), ids, tw, layer.w, shared)

    return fn


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


#: ``--ab`` variants: the default launch configuration (from 8 pairs per expert on: ``rows+sw``,
#: ``grouped_gate_up.row_block_options``, on the engine ``grouped_gate_up.default_engine`` picks) against, on the
#: Triton kernels, the row-block schedule with both options off (``classic``),
#: the expert-wide row blocks alone (op config ``TAIL``: BM + 32 pairs per program, the 32-pair tail
#: accumulator's MMAs only where an expert has more than BM pairs) and with the scales as one word per row per
#: 64 K (``SCALE_WORD``) in both GEMMs, and the Gluon GEMMs (``ENGINE`` 'gluon': the weights dequantised into
#: the wgmma A registers; the row-block schedule without a tail, BM at most 128: ``"BM": None`` takes the
#: default's BM capped at 128); ``gluon-3cta``: the same with a 2-deep ring (73 KiB, 168 registers: three CTAs per
#: SM instead of two), ``gluon-bm64+32`` / ``gluon-bm64+16``: 64-pair row blocks with a 32 / 16-pair tail (143 /
#: 127 registers; their 3- / 4-deep rings, 85 / 98 KiB, still hold them to two CTAs per SM); ``gluon_ws``,
#: ``gluon_ws+tail``, ``gluon_ws+tail64``: the warp-specialised Gluon GEMMs (``ENGINE`` 'gluon_ws') without a tail,
#: with a 32- and a 64-pair tail (``-tile``: one program per tile instead of one per SM; ``-s2``: 2-deep rings);
#: ``triton``: the default's row-block schedule on the Triton kernels (the engine
#: the default takes without an sm_90 GPU; ``grouped_gate_up.default_engine``).
_SW, _NO_SW = {"SCALE_WORD": True, "ENGINE": "triton"}, {"SCALE_WORD": False, "ENGINE": "triton"}
_GLUON, _WS, _TRITON = {"ENGINE": "gluon"}, {"ENGINE": "gluon_ws"}, {"ENGINE": "triton"}
AB_VARIANTS = {"default": None, "triton": {"gate_up": _TRITON, "down": _TRITON},
               "classic": {"TAIL": 0, "gate_up": _NO_SW, "down": _NO_SW},
               "rows": {"TAIL": 32, "gate_up": _NO_SW, "down": _NO_SW},
               "rows+sw": {"TAIL": 32, "gate_up": _SW, "down": _SW},
               "gluon": {"TAIL": 0, "BM": None, "gate_up": _GLUON, "down": _GLUON},
               "gluon+tail": {"TAIL": 32, "BM": None, "gate_up": _GLUON, "down": _GLUON},
               "gluon-3cta": {"TAIL": 0, "BM": None, "gate_up": {**_GLUON, "num_stages": 2},
                              "down": {**_GLUON, "num_stages": 2}},
               "gluon-bm64+32": {"TAIL": 32, "BM": 64, "gate_up": _GLUON, "down": _GLUON},
               "gluon-bm64+16": {"TAIL": 16, "BM": 64, "gate_up": _GLUON, "down": _GLUON},
               "gluon_ws": {"TAIL": 0, "BM": None, "gate_up": _WS, "down": _WS},
               "gluon_ws+tail": {"TAIL": 32, "BM": None, "gate_up": _WS, "down": _WS},
               "gluon_ws+tail64": {"TAIL": 64, "BM": None, "gate_up": _WS, "down": _WS},
               "gluon_ws+tail-tile": {"TAIL": 32, "BM": None, "gate_up": {**_WS, "PERSISTENT": False},
                                      "down": {**_WS, "PERSISTENT": False}},
               "gluon_ws+tail-s2": {"TAIL": 32, "BM": None, "gate_up": {**_WS, "num_stages": 2},
                                    "down": {**_WS, "num_stages": 2}}}  # fmt: skip
#: ``--ab`` (model, M) cases when no ``--model`` / ``--M`` is given.
AB_CASES = (("deepseek-v3", 4096), ("deepseek-v3", 16384), ("qwen3-235b-a22b", 4096), ("gpt-oss-120b", 4096))


def schedule_counts(perm, pairs: int, row_tiles: int) -> dict:
    """Row blocks of a permutation (``moe_permute``): ``blocks_used`` (non-empty), ``tails`` (blocks with more
    than ``block_m`` pairs: their tail accumulator runs), ``programs`` (launched: the grid bound x ``row_tiles``
    weight tiles), ``mma_rows`` (token columns the MMAs run on: BM per used block plus the tail per tail),
    ``fill`` (pairs / mma_rows)."""
    n = perm.block_end - perm.block_start
    used = int((n > 0).sum())
    tails = int((n > perm.block_m).sum())
    mma_rows = used * perm.block_m + tails * perm.tail
    return {"BM": perm.block_m, "tail": perm.tail, "blocks_used": used, "tails": tails,
            "programs": perm.num_blocks * row_tiles, "mma_rows": mma_rows,
            "fill": pairs / max(mma_rows, 1)}  # fmt: skip


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    iv = torch.int32 if a.dtype == torch.float32 else torch.int16
    return a.shape == b.shape and bool(torch.equal(a.contiguous().view(iv), b.contiguous().view(iv)))


def ab(model: str, M: int, rounds: int = 2, layer: Layer | None = None, names=None, copy_bps: float = 0.0) -> dict:
    """One model and M: the grouped layer under each ``AB_VARIANTS`` configuration (or those in ``names``) and the bf16
    ``torch._grouped_mm`` layer, timed in alternation for ``rounds`` rounds (the spread of one version across
    rounds is the noise), plus each variant's two GEMM kernels alone on its permutation; with ``copy_bps`` (the
    same run's copy bandwidth, bytes/s) each variant's layer as a percentage of it over the touched experts' weight
    bytes (``pct_of_copy``, the bandwidth-bound goal's measure); bits of every variant
    against the default (the output of the production build, and every tap of the tapped build); the row
    blocks and programs each variant's schedule uses. Returns the results (printed as a table)."""
    from flint_moe.kernels.nvfp4.grouped_down import launch_grouped_down
    from flint_moe.kernels.nvfp4.grouped_gate_up import GROUPED_GATE_UP_CONFIG, grouped_config, launch_grouped_gate_up
    from flint_moe.kernels.nvfp4.permute import moe_permute
    from flint_moe.ops import flint_moe_grouped, make_route_counter, route

    t0 = time.time()
    layer = layer or Layer(model)
    counter = make_route_counter(layer.device)
    x, router, shared = layer.inputs(M, seed=5)
    fl = flops(M, layer.H, layer.I, layer.k)
    ids, tw = route(x, router, layer.k, counter)
    auto = grouped_config(M * layer.k, layer.E)
    bm = auto["BM"]
    # the default variant's launch options as the op resolves them (its kernels timed alone below)
    resolved = {"TAIL": auto["TAIL"], "gate_up": {"SCALE_WORD": auto["SCALE_WORD"]},
                "down": {"SCALE_WORD": auto["SCALE_WORD"]}}  # fmt: skip
    counts = torch.bincount(ids.reshape(-1).long(), minlength=layer.E)
    res = {"env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}, "model": model, "M": M,
           "flops": fl, "BM": bm, "rounds": [], "schedule": {}, "bits_equal_default": {},
           "pairs_per_expert": [int(counts.min()), float(counts.float().mean()), int(counts.max())],
           "weight_bytes": int((counts > 0).sum()) * expert_weight_bytes(layer.H, layer.I)}  # fmt: skip
    tiles = -(-layer.I // GROUPED_GATE_UP_CONFIG["BC"]) + -(-layer.H // 128)  # gate/up + down weight tiles
    variants = {n: (dict(c, BM=min(bm, 128)) if c and "BM" in c and c["BM"] is None else c)
                for n, c in AB_VARIANTS.items() if names is None or n in names}  # fmt: skip
    for n, c in variants.items():  # a variant that sets no TAIL takes the default's row-block options
        if c and "TAIL" not in c:
            variants[n] = {**c, "TAIL": resolved["TAIL"],
                           **{g: {**resolved[g], **c.get(g, {})} for g in ("gate_up", "down")}}  # fmt: skip
    perms = {}
    for name, cfg in variants.items():
        vbm = (cfg or {}).get("BM", bm)
        perms[name] = moe_permute(ids, layer.E, vbm, min(int((cfg or resolved)["TAIL"]), vbm))
        res["schedule"][name] = schedule_counts(perms[name], M * layer.k, tiles)
    ref_taps: dict = {}
    ref = flint_moe_grouped(x, router, layer.w, layer.k, counter, shared, taps=ref_taps)
    ref_out = flint_moe_grouped(x, router, layer.w, layer.k, counter, shared)
    res["refused"] = {}
    for name, cfg in list(variants.items()):  # a variant whose kernels refuse this layer (ValueError) is left out
        try:
            flint_moe_grouped(x, router, layer.w, layer.k, counter, shared, config=cfg)
        except ValueError as err:
            res["refused"][name] = str(err)
            print(f"  {name}: refused: {err}")
            del variants[name]
    for name, cfg in variants.items():
        taps: dict = {}
        o = flint_moe_grouped(x, router, layer.w, layer.k, counter, shared, config=cfg, taps=taps)
        eq = {"out": _bits_equal(flint_moe_grouped(x, router, layer.w, layer.k, counter, shared, config=cfg), ref_out),
              "tapped out": _bits_equal(o, ref)}  # fmt: skip
        for t in ("gate_acc", "up_acc", "act", "down_acc", "y"):
            eq[t] = _bits_equal(taps[t], ref_taps[t])
        res["bits_equal_default"][name] = eq
        del taps, o
    del ref_taps
    torch.cuda.empty_cache()
    fns = {name: _grouped(layer, x, router, shared, counter, cfg) for name, cfg in variants.items()}
    fns["bf16"] = _bf16(layer, x, router, shared, counter)
    for name, cfg in variants.items():
        cfg, perm = cfg or resolved, perms[name]
        act = launch_grouped_gate_up(x, ids, perm, layer.w, config=cfg.get("gate_up"))
        fns[f"{name} gate/up kernel"] = lambda i, c=cfg, p=perm: launch_grouped_gate_up(
            x, ids, p, layer.w, config=c.get("gate_up"))  # fmt: skip
        fns[f"{name} down kernel"] = lambda i, c=cfg, a=act, p=perm: launch_grouped_down(
            a, ids, tw, p, layer.w, shared, config=c.get("down"))  # fmt: skip
    for _ in range(rounds):
        res["rounds"].append({name: time_fn(fn) * 1e6 for name, fn in fns.items()})
    res["elapsed_s"] = time.time() - t0
    med = {n: statistics.median(r[n] for r in res["rounds"]) for n in fns}
    res["median_us"] = med
    print(f"\n{model} M={M}: pairs per expert min/mean/max {res['pairs_per_expert']}, {res['elapsed_s']:.0f} s")
    for name, sc in res["schedule"].items():
        print(f"  {name}: BM {sc['BM']} + tail {sc['tail']}: {sc['blocks_used']} row blocks used ({sc['tails']} "
              f"with a tail), {sc['programs']} programs launched, MMA on {sc['mma_rows']} token columns "
              f"(fill {sc['fill']:.2f}); bits equal to default: "
              f"{res['bits_equal_default'].get(name, 'refused')}")  # fmt: skip
    print("| variant | us per round | TFLOP/s | bf16 / variant | default / variant |")
    print("|---|---|---:|---:|---:|")
    for n in fns:
        per = ", ".join(f"{r[n]:.1f}" for r in res["rounds"])
        tf = "" if "kernel" in n else f"{fl / (med[n] * 1e-6) / 1e12:.1f}"
        ratio = "" if "kernel" in n else f"{med['bf16'] / med[n]:.2f}"
        variant = next((v for v in sorted(AB_VARIANTS, key=len, reverse=True) if n.split(" ")[0] == v), None)
        base = "default" + n[len(variant):] if variant and variant != "default" else None
        speed = f"{med[base] / med[n]:.2f}" if base in med else ""
        print(f"| {n} | {per} | {tf} | {ratio} | {speed} |")
    if copy_bps:
        res["copy_tbps"] = copy_bps / 1e12
        res["pct_of_copy"] = {n: 100 * res["weight_bytes"] / (med[n] * 1e-6) / copy_bps for n in variants}
        print(f"weights of the {int((counts > 0).sum())} touched experts {res['weight_bytes'] / 1e9:.2f} GB, copy "
              f"{copy_bps / 1e12:.2f} TB/s: " + ", ".join(f"{n} {v:.1f}%" for n, v in res["pct_of_copy"].items()))
    return res


#: ``--cross`` token counts: from decode sizes up to where the grouped path wins on every measured layer (the
#: threshold ``ops.decode_max_tokens(E, k)`` follows them: 24 / 16 / 24 on DeepSeek-V3 / Qwen3 / gpt-oss from
#: crossover-engines/, 32 / 24 / 32 from crossover/ before the Gluon engines).
CROSS_M = (4, 8, 9, 12, 16, 24, 32, 48)


def cross_row(layer: Layer, M: int, counter) -> dict:
    """One decode-vs-grouped point: the decode path (route + ``nvfp4_gate_up`` + ``nvfp4_down``) and the grouped
    op on the same M tokens (seed 3), routing included in both; times in us and the faster path."""
    x, router, shared = layer.inputs(M, seed=3)
    d = time_fn(_decode(layer, x, router, shared, counter)) * 1e6
    g = time_fn(_grouped(layer, x, router, shared, counter)) * 1e6
    return {"M": M, "decode_us": d, "grouped_us": g, "faster": "decode" if d < g else "grouped"}


def cross_all(models, out: str) -> list:
    """``--cross``: :func:`cross_row` at every ``CROSS_M`` on each model (CUDA graphs); writes
    ``out/bench_cross.json`` after each model and prints one line per (model, M) with the faster path."""
    from flint_moe.ops import make_route_counter

    os.makedirs(out, exist_ok=True)
    rows = []
    for model in models:
        layer = Layer(model)
        counter = make_route_counter(layer.device)
        for M in CROSS_M:
            rows.append({"model": model, **cross_row(layer, M, counter)})
            print(json.dumps(rows[-1]), flush=True)
        with open(os.path.join(out, "bench_cross.json"), "w") as f:
            json.dump(rows, f, indent=1)
        del layer
        torch.cuda.empty_cache()
    return rows


def ab_all(cases, out: str, rounds: int = 2, variants=None) -> list:
    """:func:`ab` for every (model, M) of ``cases`` (one layer per model, built once) with the ``variants``
    (names of ``AB_VARIANTS``; None: all); writes ``out/bench_ab.json`` after each case."""
    from benchmarks.runner import copy_bandwidth

    os.makedirs(out, exist_ok=True)
    results, layers = [], {}
    copy_bps = copy_bandwidth()
    for model, M in cases:
        if model not in layers:
            layers.clear()
            torch.cuda.empty_cache()
            layers[model] = Layer(model)
        results.append(ab(model, M, rounds, layers[model], variants, copy_bps))
        with open(os.path.join(out, "bench_ab.json"), "w") as f:
            json.dump(results, f, indent=1)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="reports/bench-grouped")
    p.add_argument("--quick", action="store_true", help="DeepSeek-V3 only, fewer M")
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting new sections after this")
    p.add_argument("--ab", action="store_true",
                   help="only the A/B of the default launch configuration vs the expert-wide row blocks vs bf16 "
                        "(AB_CASES, or --model / --M)")  # fmt: skip
    p.add_argument("--cross", action="store_true",
                   help="only decode vs grouped at CROSS_M (every model, or the --model ones)")  # fmt: skip
    p.add_argument("--model", choices=sorted(MODELS), action="append",
                   help="--ab: these models only (repeatable; default: AB_CASES)")  # fmt: skip
    p.add_argument("--M", help="--ab: these token counts only (comma-separated, e.g. 256,1024; default 4096)")
    p.add_argument("--variants", help="--ab: these AB_VARIANTS only (comma-separated; 'default' is always run)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device (the H200)", file=sys.stderr)
        return 2
    if args.cross:
        cross_all(args.model or list(MODELS), args.out)
        return 0
    if args.ab:
        if args.model is None and args.M is None:
            cases = AB_CASES
        else:
            ms = [int(m) for m in (args.M or "4096").split(",")]
            cases = [(model, m) for model in (args.model or ["deepseek-v3"]) for m in ms]
        names = None
        if args.variants:
            names = ["default"] + [v for v in args.variants.split(",") if v != "default"]
            unknown = [v for v in names if v not in AB_VARIANTS]
            if unknown:
                p.error(f"--variants: unknown {unknown}; known: {sorted(AB_VARIANTS)}")
        ab_all(cases, args.out, variants=names)
        return 0
    from flint_moe.ops import flint_moe_grouped, make_route_counter

    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    res = {"env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}, "main": [], "cross": [],
           "sweep": [], "golden": [], "errors": []}  # fmt: skip
    import triton

    res["env"]["triton"] = triton.__version__

    def dump():
        with open(os.path.join(args.out, "bench_grouped.json"), "w") as f:
            json.dump(res, f, indent=1)

    def over():
        return time.time() - t_start > args.budget_s

    models = ["deepseek-v3"] if args.quick else list(MODELS)
    layers = {}
    for model in models:
        if over():
            break
        layer = Layer(model)
        counter = make_route_counter("cuda")
        ms = MS if model == "deepseek-v3" else (128, 256, 1024, 4096)
        for M in ms:
            if over():
                break
            row = {"model": model, "M": M, "flops": flops(M, layer.H, layer.I, layer.k)}
            x, router, shared = layer.inputs(M)
            try:
                tg = time_fn(_grouped(layer, x, router, shared, counter))
                row["grouped_us"] = tg * 1e6
                row["grouped_TFLOPs"] = row["flops"] / tg / 1e12
            except Exception as exc:  # keep going: the table says what failed
                res["errors"].append(f"{model} M{M} grouped: {exc!r}"[:2000])
            try:
                tb = time_fn(_bf16(layer, x, router, shared, counter))
                row["bf16_us"] = tb * 1e6
                row["bf16_TFLOPs"] = row["flops"] / tb / 1e12
                og = flint_moe_grouped(x, router, layer.w, layer.k, counter, shared)
                ob = bf16_baseline(layer, x, router, shared, counter)
                row["rel_err_vs_bf16"] = rel_err(og, ob)
            except Exception as exc:
                res["errors"].append(f"{model} M{M} bf16: {exc!r}"[:2000])
            if "grouped_us" in row and "bf16_us" in row:
                row["ratio_bf16_over_grouped"] = row["bf16_us"] / row["grouped_us"]
            res["main"].append(row)
            print(json.dumps(row), flush=True)
            dump()
        layer._bf16 = None  # free the bf16 copy
        if model == "deepseek-v3":
            layers[model] = layer  # kept for the decode-vs-grouped and sweep sections
        torch.cuda.empty_cache()
    if "deepseek-v3" in layers and not over():
        layer, counter = layers["deepseek-v3"], make_route_counter("cuda")
        # decode vs grouped around the threshold
        for M in (4, 8, 9, 12, 16, 32):
            row = {"M": M}
            try:
                row = cross_row(layer, M, counter)
            except Exception as exc:
                res["errors"].append(f"cross M{M}: {exc!r}"[:2000])
            res["cross"].append(row)
            print(json.dumps(row), flush=True)
        dump()
        # launch-config sweep of the grouped kernels
        variants = [
            {},
            {"gate_up": {"DECODE": 2}, "down": {"DECODE": 2}},
            {"gate_up": {"BK": 64}, "down": {"BK": 64}},  # the default is BK 128 at BM 128 (default_bk)
            {"gate_up": {"num_stages": 4}, "down": {"num_stages": 4}},
            {"BM": 64},
            {"BM": 256},
        ]
        for M in (4096,):
            x, router, shared = layer.inputs(M, seed=5)
            ref = flint_moe_grouped(x, router, layer.w, layer.k, counter, shared)
            for v in variants:
                if over():
                    break
                row = {"M": M, "config": v}
                try:
                    row["us"] = time_fn(_grouped(layer, x, router, shared, counter, v)) * 1e6
                    o = flint_moe_grouped(x, router, layer.w, layer.k, counter, shared, config=v)
                    row["bits_equal_default"] = bool(torch.equal(o.view(torch.int16), ref.view(torch.int16)))
                except Exception as exc:
                    res["errors"].append(f"sweep M{M} {v}: {exc!r}"[:2000])
                res["sweep"].append(row)
                print(json.dumps(row), flush=True)
                dump()
    # golden model at small M (exact accumulations on the GPU), one timed call
    if not over():
        from flint_moe.reference.model import moe_nvfp4

        layer = Layer("gpt-oss-120b")
        for M in (16, 128):
            if over():
                break
            x, router, shared = layer.inputs(M)
            torch.cuda.synchronize()
            t0 = time.time()
            try:
                moe_nvfp4(x, router, layer.w, layer.k, shared)
                torch.cuda.synchronize()
                tgold = time.time() - t0
                counter = make_route_counter("cuda")
                tg = time_fn(_grouped(layer, x, router, shared, counter))
                row = {"model": "gpt-oss-120b", "M": M, "golden_s": tgold, "grouped_us": tg * 1e6,
                       "ratio_golden_over_grouped": tgold / tg}  # fmt: skip
            except Exception as exc:
                row = {"M": M}
                res["errors"].append(f"golden M{M}: {exc!r}"[:2000])
            res["golden"].append(row)
            print(json.dumps(row), flush=True)
        dump()
    res["elapsed_s"] = time.time() - t_start
    dump()
    write_table(res, os.path.join(args.out, "bench_grouped.md"))
    print(open(os.path.join(args.out, "bench_grouped.md")).read())
    return 0


def write_table(res: dict, path: str) -> None:
    env = res["env"]
    lines = [
        f"# Grouped NVFP4 path vs torch._grouped_mm (bf16) on {env['gpu']}",
        "",
        f"torch {env['torch']}, triton {env.get('triton')}. Median per call, CUDA graph; TFLOP/s of the expert "
        "GEMMs (2 M k 2I H + 2 M k I H); ratio = bf16 time / grouped time; rel err = ||grouped - bf16|| / ||bf16||.",
        "",
        "| model | M | grouped (us) | TFLOP/s | bf16 grouped_mm (us) | TFLOP/s | ratio | rel err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    f = lambda r, key, fmt: format(r[key], fmt) if key in r else "-"  # noqa: E731
    for r in res["main"]:
        lines.append(
            f"| {r['model']} | {r['M']} | {f(r, 'grouped_us', '.1f')} | {f(r, 'grouped_TFLOPs', '.1f')} | "
            f"{f(r, 'bf16_us', '.1f')} | {f(r, 'bf16_TFLOPs', '.1f')} | {f(r, 'ratio_bf16_over_grouped', '.2f')} | "
            f"{f(r, 'rel_err_vs_bf16', '.2e')} |"
        )
    lines += ["", "## Decode vs grouped (DeepSeek-V3, routing included)", "", "| M | decode (us) | grouped (us) |",
              "|---:|---:|---:|"]  # fmt: skip
    for r in res["cross"]:
        lines.append(f"| {r['M']} | {f(r, 'decode_us', '.1f')} | {f(r, 'grouped_us', '.1f')} |")
    lines += ["", "## Launch-config sweep (DeepSeek-V3)", "", "| M | config | us | bits = default |"]
    lines += ["|---:|---|---:|---|"]
    for r in res["sweep"]:
        cfg, eq = json.dumps(r["config"]), r.get("bits_equal_default", "-")
        lines.append(f"| {r['M']} | `{cfg}` | {f(r, 'us', '.1f')} | {eq} |")
    lines += ["", "## Golden model (exact accumulations, GPU)", "", "| model | M | golden (s) | grouped (us) |",
              "|---|---:|---:|---:|"]  # fmt: skip
    for r in res["golden"]:
        lines.append(f"| {r.get('model', '-')} | {r['M']} | {f(r, 'golden_s', '.2f')} | {f(r, 'grouped_us', '.1f')} |")
    if res["errors"]:
        lines += ["", "## Errors", ""] + [f"- `{e[:300]}`" for e in res["errors"]]
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
