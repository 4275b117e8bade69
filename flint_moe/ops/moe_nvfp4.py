"""``flint_moe``: routed NVFP4 experts + shared output for decode.

Three launches on the current stream, chained by programmatic dependent launch: ``route`` (router GEMV +
top-k, ``flint_moe.ops.route``; rule steps 1-4), ``nvfp4_gate_up`` (steps 5-7), ``nvfp4_down`` (steps 8-10).
Seed: ``flint_moe`` of ``vllm.models.flint.ops.moe`` (semantics only).
"""

from __future__ import annotations

import torch

from flint_moe.kernels.nvfp4.down_combine import launch_down
from flint_moe.kernels.nvfp4.gate_up import launch_gate_up
from flint_moe.ops._checks import check_nvfp4_entry, check_nvfp4_operands

__all__ = ["DECODE_MAX_TOKENS", "flint_moe"]

#: Largest token count the decode path (one gate/up and one down GEMV program set per (token, expert) pair)
#: serves. Above it the weights of an expert picked by several tokens are read once per token, and a grouped
#: path (a later issue) is the right tool. Chosen on the H200: docs/kernels/nvfp4-decode.md.
DECODE_MAX_TOKENS = 8


def flint_moe(
    x: torch.Tensor, router_weight: torch.Tensor, weights, top_k: int, counter: torch.Tensor,
    shared_output: torch.Tensor, shared_ready: torch.cuda.Event | None = None, *, taps: dict | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Routed-expert MoE output plus ``shared_output`` for a few tokens (Flint rule steps 1-10).

    Args:
        x: bf16 [M, H] contiguous; never modified. M <= ``DECODE_MAX_TOKENS`` runs the decode kernels below,
            larger M the grouped path (``flint_moe.ops.moe_nvfp4_grouped.flint_moe_grouped``).
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
    if M > DECODE_MAX_TOKENS:
        from flint_moe.ops.moe_nvfp4_grouped import flint_moe_grouped

        return flint_moe_grouped(x, router_weight, weights, top_k, counter, shared_output, shared_ready, taps=taps,
                                 out=out)  # fmt: skip
    check_nvfp4_operands(x, router_weight, top_k, counter, shared_output, weights, out, dev)
    from flint_moe.ops.route import route

    # validated once, here: the launchers below take the checked inputs and route's own outputs as they are
    ids, tw = route(x, router_weight, top_k, counter, taps=taps)
    act = launch_gate_up(x, ids, weights, taps=taps)
    if shared_ready is not None:
        shared_ready.wait(torch.cuda.current_stream(dev))
    return launch_down(act, ids, tw, weights, shared_output, taps=taps, out=out)
