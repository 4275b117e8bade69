"""``flint_moe``: routed NVFP4 experts + shared output, decode kernels for a few tokens, grouped path above.

Decode (M <= ``decode_max_tokens(E, k)``): three launches on the current stream, chained by programmatic
dependent launch: ``route`` (``flint_moe.ops.route``: router GEMV + top-k up to ``ROUTE_GEMV_MAX_TOKENS``, the
router GEMM + top-k above; rule steps 1-4), ``nvfp4_gate_up`` (steps 5-7), ``nvfp4_down`` (steps 8-10). Larger M:
``flint_moe.ops.moe_nvfp4_grouped``. Seed: ``flint_moe`` of ``vllm.models.flint.ops.moe`` (semantics only).
"""

from __future__ import annotations

import torch

from flint_moe.kernels.nvfp4.down_combine import launch_down
from flint_moe.kernels.nvfp4.gate_up import launch_gate_up
from flint_moe.ops._checks import check_nvfp4_entry, check_nvfp4_operands, check_top_k

__all__ = ["DECODE_DISPATCH_MAX_TOKENS", "DECODE_MAX_TOKENS", "decode_max_tokens", "flint_moe"]

#: Largest token count the decode kernels (one gate/up and one down GEMV program set per (token, expert) pair)
#: serve: ``flint_moe`` sends every larger M to the grouped path before any per-shape rule, and the conformance
#: path ``nvfp4_decode`` launches the decode kernels directly up to it. ``flint_moe`` itself runs them only up to
#: ``decode_max_tokens(E, k)`` (at most ``DECODE_DISPATCH_MAX_TOKENS``).
DECODE_MAX_TOKENS = 32

#: Largest token count ``flint_moe`` runs on the decode kernels for any shape (the cap of
#: ``decode_max_tokens(E, k)``). The decode kernels read an expert's weights once per pair, the grouped path once
#: per row block: measured on the H200 with the grouped path's Gluon engines
#: (reports/gpu/nvfp4-grouped/crossover-engines/README.md, routing included, CUDA graphs, M = 4, 8, 9, 12, 16,
#: 24, 32, 48), decode is faster up to M = 24 on DeepSeek-V3 and gpt-oss-120b and slower at M = 32 and 48 on
#: every measured shape (on Qwen3-235B-A22B from M = 24 on: ``decode_max_tokens``).
DECODE_DISPATCH_MAX_TOKENS = 24


def decode_max_tokens(num_experts: int, top_k: int) -> int:
    """Largest token count M that ``flint_moe`` runs on the decode kernels for a layer of ``num_experts`` experts
    and ``top_k`` experts per token; ``flint_moe`` sends larger M to the grouped path.

    ``min(DECODE_DISPATCH_MAX_TOKENS, E // k)`` (>= 1 as k <= E): decode iff M <= 24 and M * k <= E, i.e. at
    most one (token, expert) pair per expert on average. From the H200 measurement with the grouped path's Gluon
    engines (reports/gpu/nvfp4-grouped/crossover-engines/README.md): decode is faster up to M = 24 on DeepSeek-V3
    (E 256, k 8; 0.75 pairs per expert; 1611.9 against 1642.5 us) and gpt-oss-120b (E 128, k 4; 0.75; 516.3
    against 579.9 us) and up to M = 16 on Qwen3-235B-A22B (E 128, k 8; 1.0; 438.8 against 502.7 us), and slower
    at the next measured M (32, 32, 24: 1.0, 1.0, 1.5 pairs per expert; 2070.2 against 1916.3 us, 652.3 against
    638.6 us, 635.2 against 625.1 us: by 8.0%, 2.2%, 1.6%, the last two within the run-to-run spread of ~3%); the
    rule gives 24, 24 and 16 there. The pair count alone does not separate the points (1.0 wins on Qwen3 at M =
    16 and loses on DeepSeek-V3 and gpt-oss-120b at M = 32): the cap does. Other shapes follow the same rule
    unmeasured (e.g. Mixtral-8x7B, E 8, k 2: 4).

    Args:
        num_experts: E, an int >= 1.
        top_k: k, an int with 1 <= k <= E.

    Returns:
        int in [1, ``DECODE_DISPATCH_MAX_TOKENS``].

    Raises:
        TypeError: an argument not an int (bool refused); the message names it.
        ValueError: E < 1, or k outside [1, E]; the message names the argument.
    """
    if isinstance(num_experts, bool) or not isinstance(num_experts, int):
        raise TypeError(f"num_experts: expected an int, got {type(num_experts).__name__}")
    if num_experts < 1:
        raise ValueError(f"num_experts: must be >= 1, got {num_experts}")
    top_k = check_top_k(top_k, num_experts, f"E = {num_experts}")
    return min(DECODE_DISPATCH_MAX_TOKENS, num_experts // top_k)


def flint_moe(
    x: torch.Tensor, router_weight: torch.Tensor, weights, top_k: int, counter: torch.Tensor,
    shared_output: torch.Tensor, shared_ready: torch.cuda.Event | None = None, *, taps: dict | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Routed-expert MoE output plus ``shared_output`` for a few tokens (Flint rule steps 1-10).

    Args:
        x: bf16 [M, H] contiguous; never modified. M <= ``decode_max_tokens(E, top_k)`` (E =
            ``weights.num_experts``; at most ``DECODE_DISPATCH_MAX_TOKENS``) runs the decode kernels below, larger M the
            grouped path (``flint_moe.ops.moe_nvfp4_grouped.flint_moe_grouped``; same checks, same taps).
        router_weight: bf16 [E, H] contiguous.
        weights: ``flint_moe.layouts.FlintMoEWeights`` (FlashInfer CuTe-DSL W4A16 layout); its tensors'
            metadata is checked again here (``FlintMoEWeights.check_metadata``: host-side, no synchronisation),
            so a tensor changed in place after construction is refused before any kernel reads it.
        top_k: experts per token, 1 <= top_k <= E.
        counter: int32 buffer from ``flint_moe.ops.route.make_route_counter`` (never reset; launches that use
            it must be serialized on one stream).
        shared_output: bf16 [M, H] contiguous, the shared expert's output, read only by the last kernel.
        shared_ready: None or a ``torch.cuda.Event`` the current stream waits on before that kernel
            (``shared_output`` may be produced on another stream). TypeError for any other type, ValueError
            for an event with CPU tensors, both before any launch (decode and grouped paths alike).
        taps: optional dict; when given, every kernel is compiled with its tap option and the dict receives
            ``router_acc``, ``logits``, ``ids``, ``weights`` (``route``), ``gate_acc``, ``up_acc``, ``act``
            (fp32 / bf16 [M, k, I]), ``down_acc``, ``y`` ([M, k, H]) and ``out`` ([M, H]) (docs/ARCHITECTURE.md,
            section 2).
        out: None, or a preallocated bf16 [M, H] contiguous tensor on the weights' device that receives the
            result and is returned (no output allocation: CUDA-graph friendly with the same buffer on every
            replay). It must share no memory with any input (``x``, ``router_weight``, ``shared_output``,
            ``counter``, the weights' tensors): in-place ``out=shared_output`` or ``out=x`` is refused. Checked
            like an input before any launch (``ops._checks.check_out``); with ``taps`` it is also ``taps["out"]``.

    Returns:
        bf16 [M, H]: ``out`` when given, else a new tensor.

    Raises:
        ValueError: M > ``GROUPED_MAX_TOKENS`` (grouped path).
        TypeError / ValueError: wrong dtype, shape, device or contiguity (the message names the tensor,
        ``weights.<field>`` for the weights, ``out`` for the buffer, also when it overlaps an input), top_k out
        of range (TypeError when not an int), H of ``x`` and
        ``weights`` different, ``shared_ready`` not None or a CUDA event.
        RuntimeError: CPU tensors without TRITON_INTERPRET=1 (the Triton interpreter).
    """
    dev = check_nvfp4_entry(x, weights, shared_ready)
    M = x.shape[0]
    if M > DECODE_MAX_TOKENS:  # above what the decode kernels serve: the grouped op makes the other checks
        from flint_moe.ops.moe_nvfp4_grouped import flint_moe_grouped

        return flint_moe_grouped(x, router_weight, weights, top_k, counter, shared_output, shared_ready, taps=taps,
                                 out=out)  # fmt: skip
    check_nvfp4_operands(x, router_weight, top_k, counter, shared_output, weights, out, dev)
    if M > decode_max_tokens(weights.num_experts, top_k):  # top_k checked above
        from flint_moe.ops.moe_nvfp4_grouped import launch_grouped

        return launch_grouped(x, router_weight, weights, top_k, counter, shared_output, shared_ready, taps, None,
                              out, dev)  # fmt: skip
    from flint_moe.ops.route import route

    # validated once, here: the launchers below take the checked inputs and route's own outputs as they are
    ids, tw = route(x, router_weight, top_k, counter, taps=taps)
    act = launch_gate_up(x, ids, weights, taps=taps)
    if shared_ready is not None:
        shared_ready.wait(torch.cuda.current_stream(dev))
    return launch_down(act, ids, tw, weights, shared_output, taps=taps, out=out)
