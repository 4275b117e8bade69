"""Per-token NVFP4 x NVFP4 experts (``routed_nvfp4_moe``) vs the W4A16 grouped path, on the H200.

``PYTHONPATH=$PWD python3 benchmarks/bench_pertoken_nvfp4.py [--out DIR]``: the table below (M in ``MS``).

``PYTHONPATH=$PWD python3 benchmarks/bench_pertoken_nvfp4.py --options --out DIR`` (one GPU call, under 90 s
on the H200): the launch options of both sides in the same run, CUDA graphs, at ``OPTION_CASES`` (DeepSeek-V3
M = 1024 and 4096, gpt-oss-120b M = 4096: E 128, H = I = 2880, k 4): ``pertoken.off`` (``routed_nvfp4_moe``
with config ``TAIL`` 0 and ``SCALE_WORD`` off: the schedule before the options), ``pertoken.on`` (TAIL 32 +
SCALE_WORD on both GEMMs; the op's default from 8 pairs per expert, ``grouped_gate_up.row_block_options``) and
``w4a16.rows_sw`` (the grouped W4A16 GEMMs with TAIL 32 + SCALE_WORD, their best options in
reports/gpu/nvfp4-grouped/ab-rows). Asserts the per-token outputs bitwise equal across the option values;
writes ``DIR/bench_pertoken_options.json`` (one row per (model, M, variant): us, TFLOP/s, BM, whether the variant
is the op's default) and ``DIR/bench_pertoken_options.md`` (ratios to ``w4a16.rows_sw``).

DeepSeek-V3 (E = 256, H = 7168, I = 2048, k = 8, SwiGLU) at M in {128, 1024, 4096}; both sides start from the
same token rows and the same expert ids (random top-k, no router: the per-token op takes its routing as an input)
and end with the combined bf16 output:

- ``pertoken``: ``routed_nvfp4_moe``: input quantizer (P1-P5) and its bf16 decode, ``moe_permute``, FC1 +
  SwiGLU (fp32 act), the FC2-input quantizer (P10) and its decode, FC2, combine;
- ``w4a16``: ``moe_permute`` + ``nvfp4_grouped_gate_up`` (bf16 tokens) + ``nvfp4_grouped_down`` + combine (shared
  output zero), the path of docs/kernels/nvfp4-grouped.md.

Weights are random codes and finite E4M3 scales placed directly in each layout (no bf16 stack: DeepSeek-V3 is
7.5 GB of bf16 per matrix pair). FLOPs ``2 M k (2I) H + 2 M k I H``. Goal: pertoken <= 1.1x the W4A16 time at
M >= 1024. ``CASES`` / ``prepare`` plug into ``benchmarks/runner.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

DEEPSEEK = dict(E=256, H=7168, I=2048, k=8)
MS = (128, 1024, 4096)
CASES = [dict(name=f"deepseek-v3.M{M}.{impl}", M=M, impl=impl) for M in MS for impl in ("pertoken", "w4a16")]


def flops(M: int, H: int, I: int, k: int) -> int:  # noqa: E741
    return 2 * M * k * (2 * I) * H + 2 * M * k * I * H


def random_routed_weights(E, H, I, device="cuda", seed=0):  # noqa: E741
    """``RoutedNVFP4Weights`` (gated) with random codes, scale bytes 0x28..0x37 (0.25 .. 0.94) and alphas 2^-8."""
    from flint_moe.layouts.routed_nvfp4 import ROUTED_ALIGNMENT, RoutedNVFP4Weights
    from flint_moe.layouts.swizzle import mma_view

    g = torch.Generator(device=device).manual_seed(seed)
    hp = -(-H // ROUTED_ALIGNMENT) * ROUTED_ALIGNMENT
    ip = -(-I // ROUTED_ALIGNMENT) * ROUTED_ALIGNMENT

    def u8(shape, lo=0, hi=256):
        return torch.randint(lo, hi, shape, dtype=torch.uint8, device=device, generator=g)

    s1 = u8((E, 2 * ip, hp // 16), 0x28, 0x38).view(torch.float8_e4m3fn)
    s2 = u8((E, hp, ip // 16), 0x28, 0x38).view(torch.float8_e4m3fn)
    alpha = torch.full((E,), 2.0**-8, dtype=torch.float32, device=device)
    return RoutedNVFP4Weights(H, I, hp, ip, True, u8((E, 2 * ip, hp // 2)), s1, mma_view(s1, name="fc1"),
                              alpha, u8((E, hp, ip // 2)), s2, mma_view(s2, name="fc2"), alpha.clone())  # fmt: skip


def _inputs(M, E, H, k, device="cuda", seed=1):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(M, H, generator=g, device=device).to(torch.bfloat16)
    ids = torch.argsort(torch.rand(M, E, generator=g, device=device), dim=1)[:, :k].to(torch.int32)
    p = torch.rand(M, k, generator=g, device=device)
    return x, ids, p


_LAYERS: dict = {}


def _layer(impl: str, d: dict = DEEPSEEK):
    key = (impl, d["E"], d["H"], d["I"])
    if key not in _LAYERS:
        if not any(k[1:] == key[1:] for k in _LAYERS):
            _LAYERS.clear()
        if impl == "pertoken":
            _LAYERS[key] = random_routed_weights(d["E"], d["H"], d["I"])
        else:
            from benchmarks.bench_decode_nvfp4 import random_weights

            _LAYERS[key] = random_weights(d["E"], d["H"], d["I"])
    return _LAYERS[key]


def make_fn(impl: str, M: int, d: dict = DEEPSEEK, config: dict | None = None):
    """fn(i) running one side on model ``d`` (E, H, I, k) with M tokens (arguments bound now); ``config``: the
    per-token op's config, or for ``w4a16`` ``{"TAIL": int, "SCALE_WORD": bool}``."""
    w = _layer(impl, d)
    x, ids, p = _inputs(M, d["E"], d["H"], d["k"])
    if impl == "pertoken":
        from flint_moe.ops import routed_nvfp4_moe

        return lambda i: routed_nvfp4_moe(x, ids, p, w, num_experts=d["E"], local_expert_offset=0,
                                          activation="swiglu", config=config)  # fmt: skip
    from flint_moe.kernels.nvfp4.grouped_down import launch_grouped_down
    from flint_moe.kernels.nvfp4.grouped_gate_up import grouped_config, launch_grouped_gate_up
    from flint_moe.kernels.nvfp4.permute import moe_permute

    tw = p.to(torch.bfloat16).float()
    shared = torch.zeros_like(x)
    bm = grouped_config(M * d["k"], d["E"])["BM"]
    c = config or {}
    tail = min(int(c.get("TAIL", 0)), bm)
    sw = {"SCALE_WORD": bool(c.get("SCALE_WORD", False))}

    def fn(i):
        perm = moe_permute(ids, d["E"], bm, tail)
        act = launch_grouped_gate_up(x, ids, perm, w, config=sw)
        return launch_grouped_down(act, ids, tw, perm, w, shared, config=sw)

    return fn


def bytes_moved(impl: str, M: int) -> int:
    """Weights of the touched experts once, tokens in, output out, and the intermediates each side writes and
    reads back (pertoken: the bf16 decode of the tokens, fp32 act, FC2-input codes and scales and their bf16
    decode, fp32 y; w4a16: bf16 act and y)."""
    d = DEEPSEEK
    E, H, I, k = d["E"], d["H"], d["I"], d["k"]  # noqa: E741
    used = min(E, M * k)
    w = used * (3 * H * I // 2 + 3 * H * I // 16)
    p = M * k
    if impl == "pertoken":
        inter = 2 * p * (4 * I + I // 2 + I // 16 + 2 * I + 4 * H) + M * (H // 2 + H // 16 + 4 + 2 * H) * 2
    else:
        inter = 2 * p * (2 * I + 2 * H)
    return w + inter + 2 * M * H * 2


def prepare(name=None, M=128, impl="pertoken"):
    """``benchmarks/runner.py`` entry point: ``Prepared`` of one case."""
    from benchmarks.runner import Prepared

    d = DEEPSEEK
    return Prepared(fn=make_fn(impl, M), bytes_moved=bytes_moved(impl, M), flops=flops(M, d["H"], d["I"], d["k"]),
                    rotations=1, note=f"deepseek-v3 {impl}")  # fmt: skip


GPT_OSS = dict(E=128, H=2880, I=2880, k=4)
#: (model name, dims, M) of ``--options``.
OPTION_CASES = (("deepseek-v3", DEEPSEEK, 1024), ("deepseek-v3", DEEPSEEK, 4096), ("gpt-oss-120b", GPT_OSS, 4096))
#: ``--options`` variants: (name, side, config).
OPTION_VARIANTS = (
    ("pertoken.off", "pertoken", {"TAIL": 0, "fc1": {"SCALE_WORD": False}, "fc2": {"SCALE_WORD": False}}),
    ("pertoken.on", "pertoken", {"TAIL": 32, "fc1": {"SCALE_WORD": True}, "fc2": {"SCALE_WORD": True}}),
    ("w4a16.rows_sw", "w4a16", {"TAIL": 32, "SCALE_WORD": True}),
)


def run_options(out_dir: str) -> int:
    """``--options`` (module docstring): time every ``OPTION_VARIANTS`` entry at every ``OPTION_CASES`` entry,
    assert the per-token outputs bitwise equal across the option values, write JSON + markdown to ``out_dir``."""
    from benchmarks.bench_grouped_nvfp4 import time_fn
    from flint_moe.kernels.nvfp4.grouped_gate_up import grouped_config

    rows = []
    for model, d, M in OPTION_CASES:
        auto = grouped_config(M * d["k"], d["E"])
        bm, on = auto["BM"], auto["TAIL"] > 0
        outs = {}
        for name, impl, config in OPTION_VARIANTS:
            fn = make_fn(impl, M, d, config)
            if impl == "pertoken":
                outs[name] = fn(0).view(torch.int16).clone()
            t = time_fn(fn)
            rows.append({"model": model, "M": M, "variant": name, "BM": bm, "us": t * 1e6,
                         "TFLOPs": flops(M, d["H"], d["I"], d["k"]) / t / 1e12,
                         "op_default": impl == "pertoken" and (name == "pertoken.on") == on})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        assert torch.equal(outs["pertoken.off"], outs["pertoken.on"]), f"{model} M {M}: options changed bits"
        rows[-1]["pertoken_bitwise_equal"] = True
    lines = ["# Per-token NVFP4 launch options vs the W4A16 grouped path (SwiGLU)", "",
             f"{torch.cuda.get_device_name()}; median per call, CUDA graph; ratios to `w4a16.rows_sw` (the grouped "
             "W4A16 GEMMs with TAIL 32 + SCALE_WORD; goal <= 1.1). `pertoken.off`: TAIL 0, no scale words; "
             "`pertoken.on`: TAIL 32 + SCALE_WORD (the op's default from 8 pairs per expert). Per-token "
             "outputs bitwise equal across the options (asserted).", "",
             "| model | M | BM | pertoken.off (us) | pertoken.on (us) | w4a16.rows_sw (us) | off / w4a16 | "
             "on / w4a16 | op default |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for model, _d, M in OPTION_CASES:
        r = {x["variant"]: x for x in rows if x["model"] == model and x["M"] == M}
        base = r["w4a16.rows_sw"]["us"]
        dflt = "on" if r["pertoken.on"]["op_default"] else "off"
        lines.append(f"| {model} | {M} | {r['w4a16.rows_sw']['BM']} | {r['pertoken.off']['us']:.1f} | "
                     f"{r['pertoken.on']['us']:.1f} | {base:.1f} | {r['pertoken.off']['us'] / base:.2f} | "
                     f"{r['pertoken.on']['us'] / base:.2f} | {dflt} |")  # fmt: skip
    with open(os.path.join(out_dir, "bench_pertoken_options.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(out_dir, "bench_pertoken_options.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="reports/bench-pertoken")
    ap.add_argument("--options", action="store_true", help="the launch-option A/B (module docstring)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device (the H200)", file=sys.stderr)
        return 2
    from benchmarks.bench_grouped_nvfp4 import time_fn

    os.makedirs(args.out, exist_ok=True)
    if args.options:
        return run_options(args.out)
    d = DEEPSEEK
    rows = []
    for impl in ("w4a16", "pertoken"):
        for M in MS:
            t = time_fn(make_fn(impl, M))
            rows.append({"impl": impl, "M": M, "us": t * 1e6, "TFLOPs": flops(M, d["H"], d["I"], d["k"]) / t / 1e12,
                         "GBps": bytes_moved(impl, M) / t / 1e9})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        _LAYERS.clear()
        torch.cuda.empty_cache()
    base = {r["M"]: r["us"] for r in rows if r["impl"] == "w4a16"}
    lines = ["# Per-token NVFP4 x NVFP4 vs W4A16 grouped (DeepSeek-V3, SwiGLU)", "",
             f"{torch.cuda.get_device_name()}; median per call, CUDA graph; ratio = pertoken / w4a16 (goal <= 1.1 "
             "at M >= 1024).", "", "| M | w4a16 (us) | pertoken (us) | ratio | pertoken TFLOP/s |",
             "|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        if r["impl"] == "pertoken":
            lines.append(f"| {r['M']} | {base[r['M']]:.1f} | {r['us']:.1f} | {r['us'] / base[r['M']]:.2f} | "
                         f"{r['TFLOPs']:.1f} |")  # fmt: skip
    with open(os.path.join(args.out, "bench_pertoken.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "bench_pertoken.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
