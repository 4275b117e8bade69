"""``flint_moe_grouped``: routed NVFP4 experts + shared output for larger batches.

Launches on the current stream: ``route`` (for M > ROUTE_GEMV_MAX_TOKENS the tensor-core router GEMM of
``kernels/router_gemm.py``, the explicit bf16 cast and the Triton top-k; rule steps 1-4), ``moe_permute``
(pairs sorted by expert, row-block schedule; torch ops, deterministic, no host synchronisation),
``nvfp4_grouped_gate_up`` (steps 5-7), ``nvfp4_grouped_down`` (steps 5, 8) and its combine kernel (steps
9-10). Reads the same ``FlintMoEWeights`` as the decode path. ``flint_moe`` (flint_moe/ops/moe_nvfp4.py) calls
it for M > ``decode_max_tokens(E, k)``; it serves any M >= 1 itself (the conformance path ``nvfp4_grouped`` runs
it on both sides of the threshold).
Seed: the grouped (``moe_cute``) branch of ``vllm.models.flint.ops.moe`` (semantics only).
"""

from __future__ import annotations

import torch

from flint_moe.kernels._launch import check_taps
from flint_moe.kernels.nvfp4.grouped_down import launch_grouped_down
from flint_moe.kernels.nvfp4.grouped_gate_up import grouped_config, launch_grouped_gate_up
from flint_moe.kernels.nvfp4.permute import moe_permute
from flint_moe.ops._checks import check_nvfp4_entry, check_nvfp4_operands

__all__ = ["GROUPED_MAX_TOKENS", "flint_moe_grouped", "launch_grouped"]

#: Largest token count accepted (tested on the H200 up to 16384 at DeepSeek-V3; the limit keeps the
#: activation and y buffers, P * (I + H) * 2 bytes with P = M * k, and the int32 pair positions in range).
GROUPED_MAX_TOKENS = 65536


def flint_moe_grouped(
    x: torch.Tensor, router_weight: torch.Tensor, weights, top_k: int, counter: torch.Tensor,
    shared_output: torch.Tensor, shared_ready: torch.cuda.Event | None = None, *, taps: dict | None = None,
    config: dict | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Routed-expert MoE output plus ``shared_output`` by grouped GEMMs (Flint rule steps 1-10).

    Args:
        x: bf16 [M, H] contiguous, M <= GROUPED_MAX_TOKENS (M = 0 returns an empty tensor and fills no
            taps); never modified.
        router_weight: bf16 [E, H] contiguous.
        weights: ``flint_moe.layouts.FlintMoEWeights``; its tensors' metadata is checked again here
            (``FlintMoEWeights.check_metadata``: host-side, no synchronisation).
        top_k: experts per token, 1 <= top_k <= E (and the router's limit, 16).
        counter: ``make_route_counter(device)`` buffer (used by ``route`` only for M <= ROUTE_GEMV_MAX_TOKENS).
        shared_output: bf16 [M, H] contiguous (rule step 10), read only by the combine kernel.
        shared_ready: None or a ``torch.cuda.Event`` the current stream waits on before the down GEMM
            (TypeError for any other type, ValueError for an event with CPU tensors, before any launch).
        taps: optional dict; receives ``router_acc``, ``logits``, ``ids``, ``weights`` (``route``),
            ``gate_acc``, ``up_acc`` fp32 [M, k, I], ``act`` bf16 [M, k, I], ``down_acc`` fp32 [M, k, H],
            ``y`` bf16 [M, k, H], ``out`` bf16 [M, H] (docs/ARCHITECTURE.md, section 2); outputs are bitwise those of
            the production build.
        config: optional ``{"gate_up": {...}, "down": {...}, "BM": int, "TAIL": int}`` launch overrides
            (benchmarks, conformance). ``TAIL``: expert-wide row blocks, each program one expert's next
            ``BM + TAIL`` pairs in a BM-pair and a TAIL-pair accumulator, the TAIL one's MMAs run only where the
            block has more than BM pairs (``moe_permute(..., tail=min(TAIL, BM))``; 0 = off, else a power of
            two >= 16); ``SCALE_WORD`` in ``gate_up`` / ``down``: the scales as int32 words. Defaults from
            ``grouped_config(M * top_k, E)`` (``row_block_options``: both on from 8 pairs per expert, where
            the H200 measured them faster), whatever ``BM`` is given; every value gives the same bits
            (docs/kernels/nvfp4-grouped.md, "Expert-wide row blocks").
        out: None, or a preallocated bf16 [M, H] contiguous tensor that receives the result and is returned;
            the aliasing rules of ``flint_moe.ops.flint_moe`` apply (no memory shared with any input).
    Returns:
        bf16 [M, H]: ``out`` when given, else a new tensor.
    Raises:
        TypeError / ValueError naming the bad argument (dtype, shape, device, contiguity, top_k range, an
        ``out`` that overlaps an input);
        ValueError for M > GROUPED_MAX_TOKENS; RuntimeError for CPU tensors without TRITON_INTERPRET=1.
    """
    dev = check_nvfp4_entry(x, weights, shared_ready)
    M = int(x.shape[0])
    if M > GROUPED_MAX_TOKENS:
        raise ValueError(f"x: {M} tokens exceed GROUPED_MAX_TOKENS = {GROUPED_MAX_TOKENS}")
    check_nvfp4_operands(x, router_weight, top_k, counter, shared_output, weights, out, dev)
    return launch_grouped(x, router_weight, weights, top_k, counter, shared_output, shared_ready, taps, config, out,
                          dev)  # fmt: skip


def launch_grouped(
    x: torch.Tensor, router_weight: torch.Tensor, weights, top_k: int, counter: torch.Tensor,
    shared_output: torch.Tensor, shared_ready, taps: dict | None, config: dict | None, out: torch.Tensor | None,
    dev: torch.device,
) -> torch.Tensor:
    """``flint_moe_grouped`` after its tensor checks, for a caller that made them (``flint_moe``: entry and
    operands, ``ops._checks``, on ``dev``, M <= GROUPED_MAX_TOKENS): checks ``taps`` and ``config`` (TypeError /
    ValueError), then launches. Same arguments, result and errors as ``flint_moe_grouped`` otherwise."""
    E = weights.num_experts
    M = int(x.shape[0])
    check_taps(taps)
    cfg = dict(config or {})
    unknown = set(cfg) - {"gate_up", "down", "BM", "TAIL"}
    if unknown:
        raise ValueError(f"config: unknown keys {sorted(unknown)}")
    from flint_moe.ops.route import route

    if M == 0:
        return out if out is not None else torch.empty((0, weights.hidden_size), dtype=torch.bfloat16, device=dev)
    ids, tw = route(x, router_weight, top_k, counter, taps=taps)
    auto = grouped_config(M * top_k, E)
    bm = int(cfg.get("BM", auto["BM"]))
    perm = moe_permute(ids, E, bm, min(int(cfg.get("TAIL", auto["TAIL"])), bm))
    gate_up_cfg = _with_scale_word(cfg.get("gate_up"), auto["SCALE_WORD"])
    down_cfg = _with_scale_word(cfg.get("down"), auto["SCALE_WORD"])
    # validated once, here: the launchers take the checked inputs, route's outputs and the permutation as they are
    act = launch_grouped_gate_up(x, ids, perm, weights, taps=taps, config=gate_up_cfg)
    if shared_ready is not None:
        shared_ready.wait(torch.cuda.current_stream(dev))
    return launch_grouped_down(act, ids, tw, perm, weights, shared_output, taps=taps, config=down_cfg, out=out)


def _with_scale_word(config: dict | None, default: bool) -> dict | None:
    """One GEMM's launch overrides with ``SCALE_WORD`` set to ``default`` unless given, or unless a given ``BK``
    is not a multiple of 64 (scale words need whole 64-K words; the launcher raises for an explicit request)."""
    if not default or (config and ("SCALE_WORD" in config or (config.get("BK") or 64) % 64)):
        return config
    return {**(config or {}), "SCALE_WORD": True}
