"""Per-token NVFP4 routed experts (docs/numerics.md "Per-token NVFP4 experts", P1-P12): the weight preparation
``prepare_routed_nvfp4_weights`` and the MoE ``routed_nvfp4_moe``.

``routed_nvfp4_moe`` launches on the current stream: the per-token quantizer of ``quantize_routed_nvfp4_input``
(P1-P5 of the token rows; it also writes their exact values, the FC1 operand),
``moe_permute`` on the local expert ids (torch ops; a slot whose expert is not local, or -1, is in no row
block), ``pertoken_fc1`` (P7-P9, then P10 by the per-token quantizer kernel) and ``pertoken_fc2`` (P11, the
combine P12). No host synchronisation and no value check of the routing (a check would synchronise): any id
outside ``[local_expert_offset, local_expert_offset + E)`` adds nothing, so a graph-stable dispatcher buffer may
be passed whole. Golden twins: ``reference.pertoken_experts.quantize_pertoken_experts`` (+ the layout) and
``routed_nvfp4_moe_reference``. Seed (semantics only): ``core.inference.moe.flashinfer_nvfp4`` of Megatron.
"""

from __future__ import annotations

import torch

from flint_moe.kernels._launch import check_op_tensor, check_taps
from flint_moe.kernels.nvfp4.grouped_gate_up import grouped_config
from flint_moe.kernels.nvfp4.permute import moe_permute
from flint_moe.kernels.nvfp4.pertoken_fc1 import launch_pertoken_fc1
from flint_moe.kernels.nvfp4.pertoken_fc2 import launch_pertoken_fc2_combine
from flint_moe.kernels.nvfp4.pertoken_quant import quantize_rows
from flint_moe.layouts.routed_nvfp4 import RoutedNVFP4Weights, to_routed_nvfp4
from flint_moe.ops._checks import check_kernel_device, check_out

__all__ = ["ROUTED_ACTIVATIONS", "prepare_routed_nvfp4_weights", "routed_nvfp4_moe"]

#: The activations: squared ReLU (non-gated FC1) and SwiGLU (gated FC1).
ROUTED_ACTIVATIONS = ("relu2", "swiglu")

_WEIGHT_TENSORS = ("fc1_data", "fc1_scale_swizzled", "fc1_alpha", "fc2_data", "fc2_scale_swizzled", "fc2_alpha")


def prepare_routed_nvfp4_weights(
    fc1_weight: torch.Tensor, fc2_weight: torch.Tensor, out: RoutedNVFP4Weights | None = None
) -> RoutedNVFP4Weights:
    """Quantize bf16 MCore expert stacks (P6: one fp32 global scale per expert and matrix, exact divisions) and
    lay them out for the per-token grouped GEMMs (``layouts.routed_nvfp4``: H, I padded to 256, gated FC1 rows
    [up; gate] interleaved by 64, 128x4-swizzled E4M3 block scales).

    Args:
        fc1_weight: bf16 [E, I, H] (squared ReLU) or [E, 2I, H] rows [gate; up] (SwiGLU); fc2_weight: bf16
            [E, H, I]. H, I positive multiples of 16, finite values. Not modified.
        out: None, or :class:`RoutedNVFP4Weights` of the same sizes refreshed in place (addresses kept, so CUDA
            graphs captured on it stay valid) and returned.
    Returns:
        :class:`RoutedNVFP4Weights` on the weights' device.
    Raises:
        TypeError / ValueError naming ``fc1_weight``, ``fc2_weight`` or ``out``.
    """
    from flint_moe.reference.pertoken_experts import quantize_pertoken_experts

    q = quantize_pertoken_experts(fc1_weight, fc2_weight)
    return to_routed_nvfp4(
        q.fc1, q.fc1_scale, q.fc1_alpha, q.fc2, q.fc2_scale, q.fc2_alpha, gated=q.gated, out=out
    )


def _int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    return v


def _check_weights(weights: object, h: int, activation: str, dev: torch.device) -> RoutedNVFP4Weights:
    if not isinstance(weights, RoutedNVFP4Weights):
        raise TypeError(f"weights: expected RoutedNVFP4Weights (prepare_routed_nvfp4_weights), got "
                        f"{type(weights).__name__}")  # fmt: skip
    if weights.hidden_size != h:
        raise ValueError(f"hidden_states: hidden size {h} differs from the weights' {weights.hidden_size}")
    if activation not in ROUTED_ACTIVATIONS:
        raise ValueError(f"activation: must be one of {ROUTED_ACTIVATIONS}, got {activation!r}")
    if (activation == "swiglu") != weights.gated:
        raise ValueError(f"activation: {activation!r} needs {'gated' if activation == 'swiglu' else 'non-gated'} "
                         f"weights, these are {'gated' if weights.gated else 'non-gated'}")  # fmt: skip
    e, hp, ip = weights.num_local_experts, weights.padded_hidden_size, weights.padded_intermediate_size
    n1p = 2 * ip if weights.gated else ip
    specs = {
        "fc1_data": (torch.uint8, (e, n1p, hp // 2)),
        "fc1_scale_swizzled": (torch.float8_e4m3fn, (e, n1p, hp // 16)),
        "fc1_alpha": (torch.float32, (e,)),
        "fc2_data": (torch.uint8, (e, hp, ip // 2)),
        "fc2_scale_swizzled": (torch.float8_e4m3fn, (e, hp, ip // 16)),
        "fc2_alpha": (torch.float32, (e,)),
    }
    for name, (dtype, shape) in specs.items():
        check_op_tensor(f"weights.{name}", getattr(weights, name), dtype=dtype, shape=shape, device=dev)
    return weights


def routed_nvfp4_moe(
    hidden_states: torch.Tensor,
    routing_map: torch.Tensor,
    probabilities: torch.Tensor,
    weights: RoutedNVFP4Weights,
    *,
    num_experts: int,
    local_expert_offset: int,
    activation: str,
    out: torch.Tensor | None = None,
    token_capacity: int | None = None,
    taps: dict | None = None,
    config: dict | None = None,
) -> torch.Tensor:
    """The per-token NVFP4 routed-expert MoE output, P1-P12 (module docstring).

    Args:
        hidden_states: bf16 [T, H] contiguous, H = ``weights.hidden_size``, finite (not checked; a non-finite
            row's outputs are unspecified). Never modified.
        routing_map: int32 or int64 [T, k] contiguous, k >= 1: global expert ids; -1 (or any id outside this
            rank's ``[local_expert_offset, local_expert_offset + E)``) adds nothing. Never modified.
        probabilities: fp32 or bf16 [T, k] contiguous: the routing weights (bf16 widened exactly). Never modified.
        weights: :class:`RoutedNVFP4Weights` from :func:`prepare_routed_nvfp4_weights` (E local experts).
        num_experts: the global expert count (>= local_expert_offset + E); local_expert_offset: int >= 0.
        activation: ``"relu2"`` (non-gated weights) or ``"swiglu"`` (gated weights).
        out: None, or bf16 [T, H] contiguous, sharing no memory with an input: rows below ``token_capacity``
            are written, the others left untouched; returned.
        token_capacity: None (all T rows) or an int in [0, T]: only that prefix is quantized and processed.
        taps: None or a dict receiving the golden model's stages for the computed rows T' (names and shapes of
            ``reference.pertoken_experts.PerTokenMoEStages``, slots that add nothing zeroed): ``x_codes``
            uint8 [T', H/2], ``x_scale`` float8_e4m3fn [T', H/16], ``x_token_scale`` fp32 [T'], ``local`` bool
            [T', k], ``fc1_acc`` / ``h`` fp32 [T', k, N1], ``act`` fp32 [T', k, I], ``a_codes`` uint8
            [T', k, I/2], ``a_scale`` float8_e4m3fn [T', k, I/16], ``a_token_scale`` fp32 [T', k], ``fc2_acc``
            / ``y`` fp32 [T', k, H], ``w`` fp32 [T', k], ``out`` bf16 [T, H]; and the padded quantized operands
            ``x_codes_padded`` / ``x_scale_padded`` uint8 [T', Hp/2] / [T', Hp/16], ``a_codes_padded`` /
            ``a_scale_padded`` uint8 [T', k, Ip/2] / [T', k, Ip/16]. The output is bitwise the production build's.
        config: None or ``{"fc1": {...}, "fc2": {...}, "BM": int, "TAIL": int}`` launch overrides
            (``pertoken_fc1.PERTOKEN_FC1_CONFIG``, ``pertoken_fc2.PERTOKEN_FC2_CONFIG``; BK changes the declared
            orders), the keys of ``flint_moe_grouped``'s config. ``TAIL``: expert-wide row blocks, each program one
            expert's next ``BM + TAIL`` pairs in a BM-pair and a TAIL-pair accumulator (``moe_permute(...,
            tail=min(TAIL, BM))``; 0 = off, else a power of two >= 16); ``fc1`` / ``fc2`` ``SCALE_WORD`` (bool):
            the weight scales as int32 words (needs BK a multiple of 64). Unset, both follow
            ``grouped_config(token_capacity * k, E)`` (the grouped path's rule, ``row_block_options``: on from 8
            pairs per local expert; ``SCALE_WORD`` only where BK is a multiple of 64). No option changes a bit
            of any output or tap.
    Returns:
        bf16 [T, H]: ``out`` when given, else a new tensor whose rows past ``token_capacity`` are +0.
    Raises:
        TypeError: a wrong type or dtype (naming the argument). ValueError: shapes, contiguity, devices, an
        activation that does not match the weights, expert ranges, ``token_capacity`` out of range, ``out``
        overlapping an input, unknown config keys. RuntimeError: CPU tensors without ``TRITON_INTERPRET=1``.
    """
    check_op_tensor("hidden_states", hidden_states, dtype=torch.bfloat16, shape=(None, None))
    t, h = hidden_states.shape
    dev = hidden_states.device
    check_kernel_device("hidden_states", hidden_states)
    w = _check_weights(weights, h, activation, dev)
    check_op_tensor("routing_map", routing_map, dtype=(torch.int32, torch.int64), shape=(t, None), device=dev)
    k = routing_map.shape[1]
    if k < 1:
        raise ValueError(f"routing_map: needs k >= 1 slots, got shape {tuple(routing_map.shape)}")
    check_op_tensor("probabilities", probabilities, dtype=(torch.float32, torch.bfloat16), shape=(t, k), device=dev)
    e = w.num_local_experts
    n_exp, off = _int("num_experts", num_experts), _int("local_expert_offset", local_expert_offset)
    if off < 0 or off + e > n_exp:
        raise ValueError(f"local_expert_offset: local experts [{off}, {off + e}) must lie in [0, num_experts = "
                         f"{n_exp})")  # fmt: skip
    cap = t if token_capacity is None else _int("token_capacity", token_capacity)
    if not 0 <= cap <= t:
        raise ValueError(f"token_capacity: must be None or in [0, {t}], got {cap}")
    inputs = {"hidden_states": hidden_states, "routing_map": routing_map, "probabilities": probabilities}
    inputs.update({f"weights.{n}": getattr(w, n) for n in _WEIGHT_TENSORS})
    check_out(out, (t, h), dev, inputs)
    tap = check_taps(taps)
    cfg = dict(config or {})
    unknown = set(cfg) - {"fc1", "fc2", "BM", "TAIL"}
    if unknown:
        raise ValueError(f"config: unknown keys {sorted(unknown)}")
    auto = grouped_config(cap * k, e)
    bm = int(cfg.get("BM", auto["BM"]))
    tail, fc1_cfg, fc2_cfg = _row_options(cfg, bm, auto)
    if out is None:
        out = torch.zeros((t, h), dtype=torch.bfloat16, device=dev)
    if cap == 0:
        return out
    x_codes, x_scale, x_d, x_values = quantize_rows(hidden_states[:cap], w.padded_hidden_size, values=True)  # P1-P5
    ids = routing_map[:cap]
    loc = ids - off
    local = (loc >= 0) & (loc < e)
    loc = torch.where(local, loc, torch.full_like(loc, -1)).to(torch.int32)
    perm = moe_permute(loc, e, bm, tail)
    kt: dict | None = {} if tap else None
    _, a_codes, a_scale, a_d, a_values = launch_pertoken_fc1(x_values, x_d, perm, w, activation, taps=kt,
                                                             config=fc1_cfg)  # fmt: skip
    launch_pertoken_fc2_combine(a_values, a_d, loc, probabilities[:cap], perm, w, out[:cap], taps=kt,
                                config=fc2_cfg)  # fmt: skip
    if tap:
        taps.update(_stage_taps(kt, local, x_codes, x_scale, x_d, a_codes, a_scale, a_d, w, out))
    return out


def _row_options(cfg: dict, bm: int, dflt: dict) -> tuple[int, dict, dict]:
    """``(tail, fc1 config, fc2 config)`` of the op's checked ``cfg`` at row blocks of ``bm`` pairs: ``TAIL`` and
    each GEMM's ``SCALE_WORD`` as set, else ``dflt``'s (``grouped_config``; ``SCALE_WORD`` only with BK a
    multiple of 64, the per-token default BK 64 included). ValueError for a ``TAIL`` that is not 0 or a power of
    two >= 16."""
    tail = cfg.get("TAIL", dflt["TAIL"])
    if isinstance(tail, bool) or not isinstance(tail, int) or (tail and (tail < 16 or tail & (tail - 1))):
        raise ValueError(f"config: TAIL must be 0 or a power of two >= 16, got {tail!r}")
    out = []
    for name in ("fc1", "fc2"):
        c = dict(cfg.get(name) or {})
        if "SCALE_WORD" not in c:
            c["SCALE_WORD"] = dflt["SCALE_WORD"] and int(c.get("BK") or 64) % 64 == 0
        out.append(c)
    return min(tail, bm), out[0], out[1]


def _stage_taps(kt, local, x_codes, x_scale, x_d, a_codes, a_scale, a_d, w, out) -> dict:
    """The kernels' buffers in the golden model's stage shapes (unpadded columns; slots that add nothing: 0, so
    that no tap shows the unspecified contents of rows never computed), and the padded quantized operands
    (``x_codes_padded``, ``x_scale_padded`` [T', Hp/2], [T', Hp/16]; ``a_codes_padded``, ``a_scale_padded``
    [T', k, Ip/2], [T', k, Ip/16], uint8)."""
    cap, k = local.shape
    h, inter = w.hidden_size, w.intermediate_size

    def masked(v: torch.Tensor) -> torch.Tensor:
        m = local.reshape(cap, k, *([1] * (v.dim() - 2)))
        return torch.where(m, v, torch.zeros_like(v))

    return {
        "x_codes": x_codes[:, : h // 2].clone(),
        "x_scale": x_scale[:, : h // 16].clone().view(torch.float8_e4m3fn),
        "x_token_scale": x_d,
        "local": local,
        "fc1_acc": masked(kt["fc1_acc"]),
        "h": masked(kt["h"]),
        "act": masked(kt["act"]),
        "a_codes": masked(a_codes.view(cap, k, -1)[..., : inter // 2]),
        "a_scale": masked(a_scale.view(cap, k, -1)[..., : inter // 16]).view(torch.float8_e4m3fn),
        "a_token_scale": masked(a_d.view(cap, k)),
        "fc2_acc": masked(kt["fc2_acc"]),
        "y": masked(kt["y"]),
        "w": kt["w"],
        "out": out,
        "x_codes_padded": x_codes,
        "x_scale_padded": x_scale,
        "a_codes_padded": masked(a_codes.view(cap, k, -1)),
        "a_scale_padded": masked(a_scale.view(cap, k, -1)),
    }
