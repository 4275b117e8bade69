"""Run the golden model on a real-size MoE layer and print its per-stage table.

``python -m flint_moe.tools.golden --model deepseek-v3 --tokens 4 [--seed 0] [--device cpu]``

NVFP4 codes and E4M3 block scales are synthesised directly (a bf16 stack of a DeepSeek-V3 layer does not fit
in memory): random E2M1 codes, block scales drawn from the E4M3 binades a ModelOpt checkpoint uses for
N(0, 0.02) weights, and per-expert global scales near ``amax / (6 * 448)``. A look at the golden model alone;
the main job is the conformance harness (``nox -s conformance``). A DeepSeek-V3 layer needs ~10 GB of memory:
``--model qwen3-30b-a3b`` is a small one.

The shared expert is the shape's own (``MoEShape.shared_intermediate``): a model with one gets a synthesised
NVFP4 shared expert of that intermediate size whose output (rule steps 5-8 on the same tokens) is added in
step 10; a model without one (Qwen3, gpt-oss, Mixtral, ...) gets no shared output (``out = routed``).
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table

from flint_moe.reference import model as golden
from flint_moe.reference.experts import nvfp4_expert
from flint_moe.reference.weights import NVFP4Experts
from flint_moe.shapes import MODEL_SHAPES, MoEShape


def synthesize_nvfp4_experts(shape: MoEShape, generator: torch.Generator, device: str = "cpu") -> NVFP4Experts:
    """Random NVFP4 experts in logical (ModelOpt) layout for ``shape``, built without a bf16 stack.

    Codes: uniform bytes (two E2M1 codes each). Block scales: E4M3 bytes 0x58-0x7E (= 64 ... 448, the range
    ModelOpt produces when ``weight_scale_2 = amax / 2688``), never the NaN byte 0x7F. Global scales: fp32
    near 2^-15 (weights of magnitude ~0.02), distinct per expert so a mixed-up expert index shows.
    """
    e, h, i = shape.num_experts, shape.hidden, shape.intermediate

    def codes(*size: int) -> torch.Tensor:
        return torch.randint(0, 256, size, dtype=torch.uint8, generator=generator).to(device)

    def scales(*size: int) -> torch.Tensor:
        return torch.randint(0x58, 0x7F, size, dtype=torch.uint8, generator=generator).to(device)

    def global_scales() -> torch.Tensor:
        jitter = torch.rand(e, generator=generator, dtype=torch.float64) + 1.0
        return (jitter * 2.0**-15).to(torch.float32).to(device)

    return NVFP4Experts(
        w13=codes(e, 2 * i, h // 2),
        w13_scale=scales(e, 2 * i, h // 16),
        w13_gs=global_scales(),
        w2=codes(e, h, i // 2),
        w2_scale=scales(e, h, i // 16),
        w2_gs=global_scales(),
    )


def shared_expert_output(shape: MoEShape, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor | None:
    """The shape's own shared expert applied to ``x`` bf16 [M, H]: None when ``shape.shared_intermediate`` is
    None (the model has no shared expert), else ``y`` bf16 [M, H] of one synthesised NVFP4 expert (see
    :func:`synthesize_nvfp4_experts`) of intermediate size ``shape.shared_intermediate`` (rule steps 5-8)."""
    if shape.shared_intermediate is None:
        return None
    one = MoEShape(f"{shape.name}-shared", 1, shape.hidden, shape.shared_intermediate, 1)
    ex = synthesize_nvfp4_experts(one, generator, str(x.device))
    return nvfp4_expert(x, ex.w13[0], ex.w13_scale[0], ex.w13_gs[0], ex.w2[0], ex.w2_scale[0], ex.w2_gs[0]).y


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flint_moe.tools.golden", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="deepseek-v3", choices=sorted(MODEL_SHAPES),
                        help="real layer shape (default deepseek-v3: ~10 GB of memory)")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=4, help="M, the number of tokens (decode: a few)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthesised weights and tokens")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the golden model runs")
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error("--tokens must be >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu)")

    shape = MODEL_SHAPES[args.model]
    console = Console(width=140)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.perf_counter()
    experts = synthesize_nvfp4_experts(shape, gen, args.device)
    nbytes = sum(t.numel() * t.element_size() for t in (experts.w13, experts.w13_scale, experts.w2, experts.w2_scale))
    router_weight = (torch.randn(shape.num_experts, shape.hidden, generator=gen) * 0.02).to(torch.bfloat16)
    x = torch.randn(args.tokens, shape.hidden, generator=gen).to(torch.bfloat16)
    router_weight, x = (t.to(args.device) for t in (router_weight, x))
    shared = shared_expert_output(shape, x, gen)
    t1 = time.perf_counter()
    result = golden.moe_nvfp4(x, router_weight, experts, shape.top_k, shared=shared)
    t2 = time.perf_counter()

    si = "none" if shape.shared_intermediate is None else str(shape.shared_intermediate)
    title = (
        f"golden model, {shape.name}: E={shape.num_experts} H={shape.hidden} I={shape.intermediate} "
        f"k={shape.top_k} shared expert I={si} M={args.tokens}, "
        f"backend: reference ({args.device}, torch {torch.__version__})"
    )
    table = Table(title=title)
    for column in ("stage", "shape", "dtype", "summary"):
        table.add_column(column)
    for row in golden.stage_table(result):
        table.add_row(*(str(v) for v in row))
    console.print(table)
    console.print(
        f"synthesised {nbytes / 1e9:.2f} GB of NVFP4 codes + scales in {t1 - t0:.1f} s; golden model {t2 - t1:.1f} s"
    )
    console.print(f"ids[0] = {result.ids[0].tolist()}  routing weights[0] = {result.weights[0].tolist()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
