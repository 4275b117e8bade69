"""Benchmark setup: ``flint_moe_bf16_decode`` (router + BF16 gate/up + down/combine) on TRT-LLM BF16 weights.

Cases: M = 1, 2, 4, 8 tokens at Qwen3-30B-A3B (E=128, H=2048, I=768, k=8) and gpt-oss-120b (E=128, H=2880,
I=2880 read as is, k=4) shapes. Timed by ``benchmarks/runner.py`` under CUDA graphs with events; every case
holds ``ROTATIONS`` independent layers (weights, router, tokens), so consecutive calls never find their
experts in the 60 MB L2.

Bytes moved per call (each input read once, the output written once): the distinct experts the M tokens
select (their g1 and g2 bf16 weights), the router weight, x, shared_output, out and the row maps; averaged
over the rotation sets (routing is data dependent).

Run with the other benchmarks: ``PYTHONPATH=$PWD python -m benchmarks.runner --filter decode_bf16``.
Launch-configuration sweep (rows per program, warps, unrolling; none of them changes a bit):
``PYTHONPATH=$PWD python -m benchmarks.bench_decode_bf16 --sweep`` prints per-kernel times for a grid of
configurations; put the best into ``GATE_UP_CONFIG`` / ``DOWN_CONFIG``.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from benchmarks.runner import Prepared, copy_bandwidth, time_graph

ROTATIONS = 3

#: name -> (E, H, I, k)
SHAPES = {
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "gpt-oss-120b": (128, 2880, 2880, 4),
}

CASES = [{"name": f"{shape}.M{m}", "shape": shape, "m": m} for shape in SHAPES for m in (1, 2, 4, 8)]

_LAYERS: dict[str, list[dict]] = {}


def _layer(e: int, h: int, i: int, seed: int) -> dict:
    from flint_moe.layouts import to_trtllm_bf16, trtllm_bf16_row_maps

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    w13 = torch.empty(e, 2 * i, h, dtype=torch.bfloat16, device=dev).normal_(0.0, 0.02, generator=gen)
    w2 = torch.empty(e, h, i, dtype=torch.bfloat16, device=dev).normal_(0.0, 0.02, generator=gen)
    g1, g2 = to_trtllm_bf16(w13, w2, inplace=True)
    router = torch.empty(e, h, dtype=torch.bfloat16, device=dev).normal_(0.0, 0.05, generator=gen)
    return dict(g1=g1, g2=g2, router=router, maps=trtllm_bf16_row_maps(h, i, dev), gen=gen)


def _layers(shape: str) -> list[dict]:
    """ROTATIONS independent layers of ``shape`` (cached: the four M cases of a shape share them)."""
    if shape not in _LAYERS:
        _LAYERS.clear()  # one shape's layers in memory at a time
        torch.cuda.empty_cache()
        e, h, i, _ = SHAPES[shape]
        _LAYERS[shape] = [_layer(e, h, i, seed=100 + r) for r in range(ROTATIONS)]
    return _LAYERS[shape]


def _sets(shape: str, m: int) -> tuple[list[dict], torch.Tensor]:
    from flint_moe.ops.route import make_route_counter

    e, h, i, k = SHAPES[shape]
    counter = make_route_counter(torch.device("cuda"))
    sets = []
    for layer in _layers(shape):
        gen = layer["gen"]
        x = torch.randn(m, h, generator=gen, device="cuda").to(torch.bfloat16)
        shared = (torch.randn(m, h, generator=gen, device="cuda") * 0.1).to(torch.bfloat16)
        sets.append(dict(layer, x=x, shared=shared))
    return sets, counter


def _bytes(shape: str, m: int, sets: list[dict], counter: torch.Tensor) -> int:
    from flint_moe.ops.route import route

    e, h, i, k = SHAPES[shape]
    per_expert = (2 * i * h + h * i) * 2
    fixed = e * h * 2 + 3 * m * h * 2 + (2 * i + h) * 4
    total = 0
    for s in sets:
        ids, _ = route(s["x"], s["router"], k, counter)
        total += int(torch.unique(ids).numel()) * per_expert + fixed
    return total // len(sets)


def prepare(shape: str, m: int) -> Prepared:
    from flint_moe.ops.moe_bf16 import flint_moe_bf16_decode

    _, _, _, k = SHAPES[shape]
    sets, counter = _sets(shape, m)

    def fn(idx: int) -> torch.Tensor:
        s = sets[idx % len(sets)]
        return flint_moe_bf16_decode(
            s["x"], s["router"], s["g1"], s["g2"], s["maps"], k, counter, s["shared"]
        )

    return Prepared(
        fn=fn,
        bytes_moved=_bytes(shape, m, sets, counter),
        rotations=len(sets),
        note=f"distinct selected experts' bf16 weights + router + activations; {len(sets)} layers rotated",
    )


# ---------------------------------------------------------------------------------------------------------
# launch-configuration sweep (python -m benchmarks.bench_decode_bf16 --sweep)
# ---------------------------------------------------------------------------------------------------------

GATE_UP_GRID = [
    dict(BN=bn, num_warps=w, UNROLL=u) for bn, w, u in itertools.product((4, 8, 16), (1, 2, 4), (2, 8))
]
DOWN_GRID = [
    dict(BH=bh, num_warps=w, UNROLL=u) for bh, w, u in itertools.product((2, 4, 8), (1, 2, 4), (2, 8))
]


def sweep(shapes=tuple(SHAPES), tokens=(1, 8)) -> list[dict]:
    """Time each kernel alone for every configuration of the grids; returns rows (also printed)."""
    from flint_moe.kernels.bf16.down_combine import bf16_down_combine
    from flint_moe.kernels.bf16.gate_up import bf16_gate_up
    from flint_moe.ops.route import route

    bw = copy_bandwidth()
    rows = []
    for shape in shapes:
        e, h, i, k = SHAPES[shape]
        for m in tokens:
            sets, counter = _sets(shape, m)
            for s in sets:
                s["ids"], s["tw"] = route(s["x"], s["router"], k, counter)
                s["act"] = bf16_gate_up(s["x"], s["ids"], s["g1"], s["maps"][0])
            nbytes = {
                "gate_up": sum(int(torch.unique(s["ids"]).numel()) * 2 * i * h * 2 for s in sets)
                // len(sets),
                "down": sum(int(torch.unique(s["ids"]).numel()) * h * i * 2 for s in sets) // len(sets),
            }
            for kern, grid in (("gate_up", GATE_UP_GRID), ("down", DOWN_GRID)):
                for cfg in grid:

                    def fn(idx: int, cfg=cfg, kern=kern, sets=sets):
                        s = sets[idx % len(sets)]
                        if kern == "gate_up":
                            return bf16_gate_up(s["x"], s["ids"], s["g1"], s["maps"][0], config=cfg)
                        return bf16_down_combine(
                            s["act"], s["ids"], s["tw"], s["g2"], s["maps"][1], s["shared"], config=cfg
                        )

                    t = time_graph(Prepared(fn=fn, bytes_moved=nbytes[kern], rotations=len(sets)))
                    row = dict(
                        shape=shape, m=m, kernel=kern, config=cfg, us=t * 1e6, frac=nbytes[kern] / t / bw
                    )
                    rows.append(row)
                    print(
                        f"{shape:14s} M={m} {kern:7s} {cfg!s:42s} {t * 1e6:8.2f} us  "
                        f"{row['frac']:.3f} of copy bw",
                        flush=True,
                    )
    for shape in shapes:
        for m in tokens:
            for kern in ("gate_up", "down"):
                best = min(
                    (r for r in rows if (r["shape"], r["m"], r["kernel"]) == (shape, m, kern)),
                    key=lambda r: r["us"],
                )
                print(f"BEST {shape} M={m} {kern}: {best['config']} {best['us']:.2f} us ({best['frac']:.3f})")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_decode_bf16")
    parser.add_argument("--sweep", action="store_true", help="time the launch-configuration grids")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device (the H200)", file=sys.stderr)
        return 2
    if args.sweep:
        sweep()
        return 0
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
