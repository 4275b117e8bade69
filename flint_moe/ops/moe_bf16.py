"""Decode MoE on BF16 experts held in the TRT-LLM BlockMajorK layout.

``flint_moe_bf16_decode`` = ``route`` (rule steps 1-4) + ``bf16_gate_up`` (steps 6-7) +
``bf16_down_combine`` (steps 8-10): three kernels, chained with programmatic dependent launch on the GPU.
The expert weights are read in place, in the layout FlashInfer's ``trtllm_bf16_moe`` uses (so a model that
already holds that layout for its large-batch path needs no second copy). Seed: ``flint_moe_bf16_decode`` /
``FlintBf16DecodeMoE`` of ``vllm.models.flint.ops.moe`` (semantics only).
"""

from __future__ import annotations

import torch

from flint_moe.kernels._launch import check_op_tensor, check_taps
from flint_moe.kernels.bf16.down_combine import check_g2, launch_bf16_down_combine
from flint_moe.kernels.bf16.gate_up import check_g1, launch_bf16_gate_up
from flint_moe.ops._checks import (
    check_kernel_device,
    check_out,
    check_shared_ready,
    check_top_k,
    checked_row_maps,
)
from flint_moe.ops.route import route

__all__ = [
    "DECODE_BF16_MAX_TOKENS",
    "flint_moe_bf16_decode",
    "check_bf16_row_maps",
    "check_bf16_row_map_values",
]

#: Largest token count of the decode path. Each (token, expert) pair reads its expert's weights once, so the
#: bytes moved grow with M * k until tokens share experts; the tested and benchmarked range is M = 1..8
#: (tests/kernels/test_bf16_decode_gpu.py, benchmarks/bench_decode_bf16.py). Larger M goes to a grouped
#: GEMM path (a later issue) and raises NotImplementedError here.
DECODE_BF16_MAX_TOKENS = 8


def check_bf16_row_maps(row_maps: object, hidden: int, inter: int, device: torch.device) -> tuple:
    """Validate ``row_maps`` = (map13 int32 [2Ip], map2 int32 [H]) and return it as a tuple.

    Dtype, shape, device and contiguity only. ``flint_moe_bf16_decode`` also checks the values, once per
    tensor (``ops._checks.checked_row_maps``; ``ops.check_row_map_status`` again on demand);
    :func:`check_bf16_row_map_values` checks them on the host.
    """
    if not isinstance(row_maps, (tuple, list)) or len(row_maps) != 2:
        raise TypeError("row_maps: expected a pair (map13, map2) from flint_moe.layouts.trtllm_bf16_row_maps")
    map13, map2 = row_maps
    check_op_tensor("row_maps[0]", map13, dtype=torch.int32, shape=(2 * inter,), device=device)
    check_op_tensor("row_maps[1]", map2, dtype=torch.int32, shape=(hidden,), device=device)
    return map13, map2


def check_bf16_row_map_values(row_maps: tuple, hidden: int, inter: int) -> None:
    """ValueError unless ``row_maps`` equal ``trtllm_bf16_row_maps(hidden, inter)`` (copies them to the
    host: call once, e.g. at model load)."""
    from flint_moe.layouts import trtllm_bf16_row_maps

    want = trtllm_bf16_row_maps(hidden, inter)
    for i, (got, exp) in enumerate(zip(row_maps, want, strict=True)):
        if got.shape != exp.shape or not torch.equal(got.cpu(), exp):
            raise ValueError(
                f"row_maps[{i}]: not the TRT-LLM BF16 row map of H = {hidden}, I = {inter} "
                "(use flint_moe.layouts.trtllm_bf16_row_maps)"
            )


def flint_moe_bf16_decode(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    row_maps: tuple[torch.Tensor, torch.Tensor],
    top_k: int,
    counter: torch.Tensor,
    shared_output: torch.Tensor,
    shared_ready: torch.cuda.Event | None = None,
    *,
    taps: dict | None = None,
    check_row_map_values: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Routed experts + shared add for ``M <= DECODE_BF16_MAX_TOKENS`` tokens, BF16 rule (steps 1-4, 6-10).

    Args:
        x: bf16 [M, H] (contiguous), H a multiple of 64.
        router_weight: bf16 [E, H].
        w13: bf16 g1 [E, H/64, 2Ip, 64], w2: bf16 g2 [E, Ip/64, H, 64]: ``flint_moe.layouts.to_trtllm_bf16``
            of [gate; up] experts (Ip a multiple of 64, e.g. 704 or 2880 as is, or padded to 128 with
            ``pad_intermediate_bf16`` for FlashInfer's launcher: padded rows are zero and change nothing).
        row_maps: ``trtllm_bf16_row_maps(H, Ip)`` on x's device (int32 [2Ip], int32 [H]). Their values are
            compared with the expected maps once per tensor and again after any in-place change its version
            counter sees (ValueError): the first call with a new map tensor reads one flag back to the host,
            so make it before a CUDA-graph capture. Writes the version counter does not see (``.data``,
            ``.numpy()``, DLPack) cannot make the kernels read outside ``w13`` / ``w2``: a loaded value out
            of range reads the layout's own row instead (``flint_moe.kernels.bf16.gemv.checked_row``, free
            on the H200); a wrong in-range value reads a wrong row until
            ``flint_moe.ops.check_row_map_status(device)`` (a safe-point check, one synchronisation) reports
            it. The kernels record nothing themselves: every in-kernel record measured (predicated stores,
            reductions) cost 1-11 us per decode step on the H200 (docs/kernels/bf16-decode.md).
        top_k: k, 1 <= k <= E (the router's limits apply, see ``flint_moe.ops.route``).
        counter: ``make_route_counter(device)`` buffer (never reset; CUDA-graph safe).
        shared_output: bf16 [M, H], the shared expert's output (rule step 10).
        shared_ready: None or a ``torch.cuda.Event`` recorded after ``shared_output`` was produced on another
            stream; the current stream waits on it before the down/combine kernel (the router and gate/up
            kernels overlap the shared expert). TypeError for any other type, ValueError for an event with CPU
            tensors, both before any launch.
        taps: if a dict, every kernel runs its tapped build and fills it with ``router_acc``, ``logits``,
            ``ids``, ``weights`` (router), ``gate_acc``, ``up_acc`` fp32 [M, k, Ip], ``act`` bf16 [M, k, Ip],
            ``down_acc`` fp32 [M, k, H], ``y`` bf16 [M, k, H], ``out`` bf16 [M, H] (docs/ARCHITECTURE.md, section 2).
            The outputs are bitwise those of the production build.
        check_row_map_values: False skips the value check of ``row_maps`` and does not remember them for
            ``check_row_map_status`` (the conformance harness's fault injection passes deliberately wrong
            in-range permutations). Values out of range still read the layout's own row. Default True.
        out: None, or a preallocated bf16 [M, H] contiguous tensor on x's device that receives the result and is
            returned (no output allocation: CUDA-graph friendly with the same buffer on every replay). It must
            share no memory with any input (``x``, ``router_weight``, ``w13``, ``w2``, ``row_maps``, ``counter``,
            ``shared_output``): in-place ``out=shared_output`` is refused. Checked before any launch.

    Returns: bf16 tensor [M, H]: ``out`` when given, else a new one (inputs are never modified).
    Raises: TypeError / ValueError naming the bad argument (dtype, shape, layout, device, contiguity, row map
        values, ``shared_ready``); NotImplementedError for M > DECODE_BF16_MAX_TOKENS; RuntimeError for CPU
        tensors without TRITON_INTERPRET=1, or new row maps first seen inside a CUDA-graph capture.
    """
    check_op_tensor("x", x, dtype=torch.bfloat16)
    check_kernel_device("x", x)
    check_shared_ready(shared_ready, x.device)
    if x.dim() != 2:
        raise ValueError(f"x: expected [M, H], got shape {tuple(x.shape)}")
    m_tok, hidden = int(x.shape[0]), int(x.shape[1])
    if m_tok > DECODE_BF16_MAX_TOKENS:
        raise NotImplementedError(
            f"flint_moe_bf16_decode: M = {m_tok} tokens exceeds the decode path's limit "
            f"DECODE_BF16_MAX_TOKENS = {DECODE_BF16_MAX_TOKENS}; the grouped BF16 path for larger batches "
            "is not implemented yet"
        )
    dev = x.device
    if hidden <= 0 or hidden % 64:
        raise ValueError(f"x: hidden size H = {hidden} must be a positive multiple of 64")
    check_op_tensor("router_weight", router_weight, dtype=torch.bfloat16, shape=(None, hidden), device=dev)
    n_exp = int(router_weight.shape[0])
    e13, inter = check_g1(w13, hidden, dev)
    if e13 != n_exp:
        raise ValueError(f"w13: holds {e13} experts, router_weight has {n_exp}")
    check_g2(w2, hidden, inter, n_exp, dev)
    maps = check_bf16_row_maps(row_maps, hidden, inter, dev)
    check_top_k(top_k, n_exp, f"E = {n_exp}")
    if check_row_map_values:
        checked_row_maps(maps, hidden, inter)
    check_op_tensor("shared_output", shared_output, dtype=torch.bfloat16, shape=(m_tok, hidden), device=dev)
    inputs = {"x": x, "router_weight": router_weight, "w13": w13, "w2": w2, "row_maps[0]": maps[0],
              "row_maps[1]": maps[1], "counter": counter, "shared_output": shared_output}  # fmt: skip
    check_out(out, (m_tok, hidden), dev, inputs)
    check_taps(taps)
    if m_tok == 0:
        return out if out is not None else torch.empty((0, hidden), dtype=torch.bfloat16, device=dev)

    ids, weights = route(x, router_weight, top_k, counter, taps=taps)
    if taps is not None:
        taps.setdefault("ids", ids)
        taps.setdefault("weights", weights)
    # validated once, above: the launchers take the checked inputs and route's outputs as they are
    act = launch_bf16_gate_up(x, ids, w13, maps[0], taps=taps)
    if shared_ready is not None:
        torch.cuda.current_stream(dev).wait_event(shared_ready)
    return launch_bf16_down_combine(act, ids, weights, w2, maps[1], shared_output, taps=taps, out=out)
