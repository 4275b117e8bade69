"""The low-latency decode block ``flint_moe_ll`` against the Triton decode path on the H200, M = 1..8.

``PYTHONPATH=$PWD python3 benchmarks/bench_ll.py [--out DIR] [--models ...] [--tokens 1,2,...]``

Per model (random weights of the real shapes: DeepSeek-V3, GLM-4.5, Ling-mini-2.0, all experts), per M:

- ``ll``: ``ops.flint_moe_ll`` (router kernel with the fused residual add + RMSNorm, CuTe routed and shared
  experts, each selected expert's weights read once for all its tokens (``kernels/cute/ll_partial.py``),
  combine);
- ``triton``: the same block from the existing pieces: add + RMSNorm in torch (fp32), the shared expert by the
  NVFP4 decode kernels on a one-expert ``FlintMoEWeights`` (``nvfp4_gate_up`` / ``nvfp4_down``), then
  ``ops.flint_moe`` (router, routed experts, combine with the shared output).

Timing follows METHOD.md (``benchmarks.runner.time_graph``): a CUDA graph of ``CALLS`` calls, each on another
input set (so other experts are selected and the 60 MB L2 does not serve the previous call's weights), warm-up,
median of the replays timed with CUDA events; the device copy bandwidth (read + write) measured in the same
run. Bytes per call (both paths, the block's minimum): the router weight, the distinct selected experts' w1 and
w2 codes and scales, the shared expert's codes and scales, attn_out / residual / ln_weight read, out and
residual_out written (averaged over the input sets). ``CASES`` / ``prepare`` plug into ``benchmarks/runner.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from benchmarks.bench_decode_nvfp4 import random_weights

MODELS = {
    "deepseek-v3": dict(E=256, H=7168, I=2048, SI=2048, k=8),
    "glm-4.5": dict(E=160, H=5120, I=1536, SI=1536, k=8),
    "ling-mini-2.0": dict(E=256, H=2048, I=512, SI=512, k=8),
}
TOKENS = (1, 2, 3, 4, 5, 6, 7, 8)
PATHS = ("ll", "triton")
CASES = [
    dict(name=f"{p}.{m}.M{M}", path=p, model=m, M=M) for m in MODELS for M in (1, 2, 4, 8) for p in PATHS
]
CALLS = 16
REPLAYS = 20
EPS = 1e-6

_LAYER: dict = {}


def _u8(shape, g, hi=256):
    return torch.randint(0, hi, shape, dtype=torch.uint8, device="cuda", generator=g)


def _shared_linear(n: int, k: int, g):
    b = _u8((n, k // 16), g, 0x70) + 0x08  # finite E4M3 bytes of moderate exponent, both signs
    b |= _u8(b.shape, g, 2) << 7
    gs = torch.rand((), device="cuda", generator=g) * 2.0**-6 + 2.0**-8
    return _u8((n, k // 2), g), b, gs


def layer(model: str, seed: int = 0) -> dict:
    """Random weights of one layer of ``model`` (cached: one model resident at a time): ``ll`` the
    LLMoEWeights, ``shared_fi`` a one-expert FlintMoEWeights of the shared expert's shape (the Triton path's)."""
    from flint_moe.layouts.ll_weights import LLMoEWeights

    if model not in _LAYER:
        _LAYER.clear()
        torch.cuda.empty_cache()
        c = MODELS[model]
        E, H, I, SI = c["E"], c["H"], c["I"], c["SI"]  # noqa: E741, N806
        g = torch.Generator(device="cuda").manual_seed(seed)
        experts = random_weights(E, H, I, seed=seed)
        router = (torch.randn(E, H, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
        w = LLMoEWeights(router, experts, *_shared_linear(2 * SI, H, g), *_shared_linear(H, SI, g))
        _LAYER[model] = {"ll": w, "shared_fi": random_weights(1, H, SI, seed=seed + 1)}
    return _LAYER[model]


def bytes_moved(w, ids: torch.Tensor) -> int:
    """The block's minimal bytes for one call with the selected experts ``ids`` [M, k] (module docstring)."""
    H, I, SI = w.hidden_size, w.experts.valid_intermediate, w.shared_intermediate_size  # noqa: E741, N806
    M = ids.shape[0]  # noqa: N806
    distinct = len(set(ids.flatten().tolist()))
    expert = 2 * I * H // 2 + 2 * I * H // 16 + H * I // 2 + H * I // 16
    shared = 2 * SI * H // 2 + 2 * SI * H // 16 + H * SI // 2 + H * SI // 16
    return w.num_experts * H * 2 + distinct * expert + shared + 4 * M * H * 2 + H * 2


def _inputs(H: int, M: int, rotations: int, seed: int):  # noqa: N803
    g = torch.Generator().manual_seed(seed + 7)
    return [
        (torch.randn(M, H, generator=g).to(torch.bfloat16).cuda(),
         (torch.randn(M, H, generator=g) * 4).to(torch.bfloat16).cuda())
        for _ in range(rotations)
    ]  # fmt: skip


def _add_rmsnorm(attn, res, lnw, eps):
    s = attn.float() + res.float()
    r = s.to(torch.bfloat16)
    inv = torch.rsqrt(s.square().mean(dim=1, keepdim=True) + eps)
    return ((s * inv).to(torch.float32) * lnw.float()).to(torch.bfloat16), r


def prepare(name=None, path="ll", model="deepseek-v3", M=1, rotations=CALLS, seed=0):  # noqa: N803
    """``benchmarks/runner.py`` entry point: the ``Prepared`` of one case."""
    from benchmarks.runner import Prepared
    from flint_moe.kernels.nvfp4.down_combine import nvfp4_down
    from flint_moe.kernels.nvfp4.gate_up import nvfp4_gate_up
    from flint_moe.ops import flint_moe, flint_moe_ll, ll_route, make_route_counter

    lay = layer(model, seed)
    w, sfi = lay["ll"], lay["shared_fi"]
    k, H = MODELS[model]["k"], w.hidden_size  # noqa: N806
    g = torch.Generator().manual_seed(seed + 3)
    lnw = (torch.rand(H, generator=g) * 1.5 + 0.25).to(torch.bfloat16).cuda()
    sets = _inputs(H, M, rotations, seed)
    counter = make_route_counter("cuda")
    ids_of = [ll_route(a, r, lnw, EPS, w.router_weight, k, counter)[0] for a, r in sets]
    nbytes = int(statistics.mean(bytes_moved(w, ids) for ids in ids_of))
    zeros_ids = torch.zeros((M, 1), dtype=torch.int32, device="cuda")
    ones_tw = torch.ones((M, 1), dtype=torch.float32, device="cuda")
    zeros_sh = torch.zeros((M, H), dtype=torch.bfloat16, device="cuda")

    if path == "ll":

        def fn(i):
            a, r = sets[i % rotations]
            return flint_moe_ll(a, r, lnw, EPS, w, k, counter)

    elif path == "triton":

        def fn(i):
            a, r = sets[i % rotations]
            xn, res_out = _add_rmsnorm(a, r, lnw, EPS)
            act = nvfp4_gate_up(xn, zeros_ids, sfi)
            shared = nvfp4_down(act, zeros_ids, ones_tw, sfi, zeros_sh)
            return flint_moe(xn, w.router_weight, w.experts, k, counter, shared), res_out

    else:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return Prepared(fn=fn, bytes_moved=nbytes, rotations=rotations, note=f"{path} {model}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "reports/bench-ll"))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--paths", default=",".join(PATHS))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_ll needs a CUDA device (the H200); nothing timed", file=sys.stderr)
        return 2
    from benchmarks.runner import copy_bandwidth, time_graph

    os.makedirs(args.out, exist_ok=True)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    rows = []
    for model in args.models.split(","):
        for M in (int(t) for t in args.tokens.split(",")):  # noqa: N806
            for path in args.paths.split(","):
                try:
                    prep = prepare(path=path, model=model, M=M)
                    t = time_graph(prep, graph_calls=CALLS, replays=REPLAYS)
                    r = dict(model=model, path=path, M=M, us=t * 1e6, bytes=prep.bytes_moved,
                             gbps=prep.bytes_moved / t / 1e9, frac=prep.bytes_moved / t / bw, error="")  # fmt: skip
                except Exception as exc:  # one failing case must not hide the others' numbers
                    r = dict(model=model, path=path, M=M, us=float("nan"), bytes=0, gbps=float("nan"),
                             frac=float("nan"), error=f"{type(exc).__name__}: {exc}"[:300])  # fmt: skip
                rows.append(r)
                print(f"{model:14s} {path:9s} M={M} {r['us']:8.1f} us {r['gbps']:8.1f} GB/s "
                      f"{100 * r['frac']:5.1f}% of copy {r['error']}", flush=True)  # fmt: skip
    _LAYER.clear()
    from benchmarks.runner import write_table

    lines = []
    paths = args.paths.split(",")
    nan = dict(us=float("nan"), gbps=float("nan"), frac=float("nan"), bytes=0)
    by = {(r["model"], r["M"], r["path"]): r for r in rows}
    for model in args.models.split(","):
        for M in (int(t) for t in args.tokens.split(",")):  # noqa: N806
            c = [by.get((model, M, p), nan) for p in paths]
            lines.append(
                f"| {model} | {M} | " + " | ".join(f"{r['us']:.1f}" for r in c) + " | "
                + " | ".join(f"{100 * r['frac']:.1f}" for r in c)
                + f" | {max(r['bytes'] for r in c) / 1e6:.1f} |"
            )
    errors = [f"{r['model']} {r['path']} M={r['M']}: {r['error']}" for r in rows if r["error"]]
    header = ("model | M | " + " | ".join(f"{p} us" for p in paths) + " | "
              + " | ".join(f"{p} % of copy" for p in paths) + " | MB moved")  # fmt: skip
    print(write_table(args.out, "bench_ll", bw, rows, header, lines + ([""] + errors if errors else [])))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
