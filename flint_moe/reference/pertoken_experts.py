"""Per-token NVFP4 x NVFP4 routed experts (numerics.md "Per-token NVFP4 experts", steps P6-P12).

Golden twins of the public ops: :func:`quantize_pertoken_experts` of ``prepare_routed_nvfp4_weights`` (in the
logical MCore layout: FC1 rows [gate; up], no padding), :func:`quantize_routed_nvfp4_input_reference` of
``quantize_routed_nvfp4_input`` (unpadded) and :func:`routed_nvfp4_moe_reference` of ``routed_nvfp4_moe``.
Zero padding of H and I (to 256) changes no value here: padded columns are zero codes under zero block
scales (their products are +0), padded FC1 rows give activations of +0, which leave the FC2-input row amax
unchanged, and padded FC2 rows are never read into ``out``.

Per (token t, slot j) with local expert e, fp32 values, every operation one IEEE rounding:

- P6 weights: per expert, ``g_e`` = P1 of the whole matrix's amax, rows quantized by P3-P5 with ``g_e``,
  ``alpha_e = div_rn(1, g_e)`` (FC1 and FC2 separately; FC1's gate and up halves share ``g_e``).
- P7 ``acc1 = sum_h Wq1[n, h] * Xq[t, h]``: both operands exact E2M1 x E4M3 values; fp32 accumulation, the
  only order-dependent value (certified bound, :mod:`.exact`).
- P8 ``h = RN(RN(acc1 * alpha1_e) * d_t)``: the per-expert alpha, then the token's decode scale, before
  the activation.
- P9 activation, fp32 result (no bf16 rounding): squared ReLU ``a = RN(r * r)``, ``r = h`` where ``h > 0``,
  else +0 (NaN stays NaN); SwiGLU as rule step 7 on ``g = h[:I]``, ``u = h[I:]`` without its final bf16:
  ``a = RN(u * RN(g * rcp.approx.ftz(RN(ex2.approx.ftz(RN(g * c)) + 1))))``.
- P10 the FC2 input: the row ``a[t, j, :]`` re-quantized by P1-P5 (its own ``g2``, ``d2 = d2[t, j]``).
- P11 ``acc2 = sum_i Wq2[h, i] * Aq[t, j, i]`` (fp32, order-dependent), ``y = RN(acc2 * alpha2_e)``.
- P12 combine: ``w_j = RN(p[t, j] * d2[t, j])``; ``acc = +0``; for each slot j in order whose expert is
  local: ``acc = fma(w_j, y_j, acc)``; ``out[t] = bf16(acc)``. Slots holding -1 (or another rank's
  expert) add nothing; with ``token_capacity`` only rows below it are computed.

Errors: ``TypeError`` (dtype), ``ValueError`` (shape, value, a non-finite FC2 input row), naming the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import check_multiple, check_same_device, check_tensor
from .combine import fma_f32
from .exact import FP32_RN, SummationModel, round_exact
from .experts import SWIGLU_C, AccumulatePolicy, _policy_value, down_accumulate, gate_up_accumulate
from .formats import _first_index, e4m3_bytes, to_bf16
from .pertoken import (
    PERTOKEN_BLOCK,
    dequantize_nvfp4_rows,
    pertoken_global_scale,
    quantize_nvfp4_pertoken,
    quantize_nvfp4_rows,
)
from .weights import _dim

__all__ = [
    "PERTOKEN_ACTIVATIONS",
    "PerTokenNVFP4Experts",
    "PerTokenMoEStages",
    "quantize_pertoken_experts",
    "quantize_routed_nvfp4_input_reference",
    "relu2_fp32",
    "swiglu_fp32",
    "routed_nvfp4_moe_reference",
]

#: The activations of P9.
PERTOKEN_ACTIVATIONS = ("relu2", "swiglu")


@dataclass(frozen=True)
class PerTokenNVFP4Experts:
    """Quantized expert stacks (P6) in the logical layout.

    Fields: ``fc1`` uint8 [E, N1, H/2] packed E2M1 (N1 = I, or 2I as rows [gate; up] when ``gated``);
    ``fc1_scale`` float8_e4m3fn [E, N1, H/16]; ``fc1_alpha`` fp32 [E]; ``fc2`` uint8 [E, H, I/2];
    ``fc2_scale`` float8_e4m3fn [E, H, I/16]; ``fc2_alpha`` fp32 [E]; ``gated`` bool. One device.
    Raises TypeError / ValueError naming the field on construction.
    """

    fc1: torch.Tensor
    fc1_scale: torch.Tensor
    fc1_alpha: torch.Tensor
    fc2: torch.Tensor
    fc2_scale: torch.Tensor
    fc2_alpha: torch.Tensor
    gated: bool

    def __post_init__(self) -> None:
        check_tensor("fc2", self.fc2, dtype=torch.uint8, ndim=3)
        e, h, half_i = self.fc2.shape
        i = 2 * half_i
        check_multiple("fc2", i, PERTOKEN_BLOCK, "intermediate size I (2 x last dimension)")
        check_multiple("fc2", h, PERTOKEN_BLOCK, "hidden size H")
        n1 = 2 * i if self.gated else i
        check_tensor("fc1", self.fc1, dtype=torch.uint8, shape=(e, n1, h // 2))
        for name, t, shape in (
            ("fc1_scale", self.fc1_scale, (e, n1, h // 16)),
            ("fc2_scale", self.fc2_scale, (e, h, i // 16)),
        ):
            b = e4m3_bytes(name, t)
            check_tensor(name, b, shape=shape)
            nan = (b & 0x7F) == 0x7F
            if bool(nan.any()):
                raise ValueError(f"{name}: NaN byte at index {_first_index(nan)}")
        for name in ("fc1_alpha", "fc2_alpha"):
            a = getattr(self, name)
            check_tensor(name, a, dtype=torch.float32, shape=(e,))
            bad = ~(torch.isfinite(a) & (a > 0))
            if bool(bad.any()):
                raise ValueError(f"{name}: must be finite and > 0, got {float(a[_first_index(bad)])}")
        check_same_device(
            fc1=self.fc1,
            fc1_scale=self.fc1_scale,
            fc1_alpha=self.fc1_alpha,
            fc2=self.fc2,
            fc2_scale=self.fc2_scale,
            fc2_alpha=self.fc2_alpha,
        )

    num_experts = _dim("fc2", 0, doc="E.")
    hidden_size = _dim("fc2", 1, doc="H.")
    intermediate_size = _dim("fc2", 2, mul=2, doc="I.")


def _quantize_stack(name: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    e, n, k = w.shape
    bad = ~torch.isfinite(w)
    if bool(bad.any()):
        idx = _first_index(bad)
        raise ValueError(f"{name}: non-finite value {float(w[idx])} at index {idx} cannot be quantized")
    g = pertoken_global_scale(w.float().abs().flatten(1).amax(1))  # P6: one scale per expert
    codes, scale = quantize_nvfp4_rows(w.reshape(e * n, k), g.repeat_interleave(n), name=name)
    return codes.reshape(e, n, k // 2), scale.reshape(e, n, k // 16), torch.ones_like(g) / g


def quantize_pertoken_experts(fc1_weight: torch.Tensor, fc2_weight: torch.Tensor) -> PerTokenNVFP4Experts:
    """P6: quantize bf16 MCore expert stacks, one fp32 global scale per expert and matrix.

    Args:
        fc1_weight: bf16 [E, I, H] (squared ReLU) or [E, 2I, H] rows [gate; up] (SwiGLU).
        fc2_weight: bf16 [E, H, I]. H and I positive multiples of 16; all values finite. Not modified.
    Returns:
        :class:`PerTokenNVFP4Experts` (``gated`` when FC1 has 2I rows), on the weights' device.
    Raises:
        TypeError / ValueError naming ``fc1_weight`` or ``fc2_weight``.
    """
    check_tensor("fc2_weight", fc2_weight, dtype=torch.bfloat16, ndim=3)
    e, h, i = fc2_weight.shape
    if e == 0:
        raise ValueError("fc2_weight: no experts (dimension 0 is 0)")
    check_multiple("fc2_weight", h, PERTOKEN_BLOCK, "hidden size H (dimension 1)")
    check_multiple("fc2_weight", i, PERTOKEN_BLOCK, "intermediate size I (dimension 2)")
    check_tensor("fc1_weight", fc1_weight, dtype=torch.bfloat16, shape=(e, None, h))
    if fc1_weight.shape[1] not in (i, 2 * i):
        raise ValueError(
            f"fc1_weight: dimension 1 must be I = {i} (squared ReLU) or 2I = {2 * i} (SwiGLU "
            f"[gate; up]), got {fc1_weight.shape[1]}"
        )
    check_same_device(fc1_weight=fc1_weight, fc2_weight=fc2_weight)
    c1, s1, a1 = _quantize_stack("fc1_weight", fc1_weight)
    c2, s2, a2 = _quantize_stack("fc2_weight", fc2_weight)
    return PerTokenNVFP4Experts(c1, s1, a1, c2, s2, a2, gated=fc1_weight.shape[1] == 2 * i)


def quantize_routed_nvfp4_input_reference(hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """P1-P5 on the routed input: ``(codes uint8 [T, H/2], block_scale float8_e4m3fn [T, H/16],
    token_scale fp32 [T])`` for ``hidden_states`` bf16 [T, H] (H a positive multiple of 16, finite).
    Raises TypeError / ValueError naming ``hidden_states``."""
    check_tensor("hidden_states", hidden_states, dtype=torch.bfloat16, ndim=2)
    codes, scale, d, _ = quantize_nvfp4_pertoken(hidden_states, name="hidden_states")
    return codes, scale, d


def relu2_fp32(h: torch.Tensor) -> torch.Tensor:
    """P9 squared ReLU: ``RN(r * r)``, ``r = h`` where ``h > 0`` else +0, NaN kept. fp32 -> fp32 (shape kept).
    Raises TypeError naming ``h``."""
    check_tensor("h", h, dtype=torch.float32)
    r = torch.where((h > 0) | torch.isnan(h), h, torch.zeros_like(h))
    return r * r


def swiglu_fp32(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """P9 SwiGLU: rule step 7 without the final bf16, ``RN(u * RN(g * r))``; fp32 ``g``, ``u`` of one shape.
    ``r = rcp.approx.ftz(RN(ex2.approx.ftz(RN(g * c)) + 1))`` (bit-exact emulations, :mod:`.mufu`).
    Returns fp32. Raises TypeError / ValueError naming ``g`` or ``u``."""
    from .mufu import ex2_approx_ftz, rcp_approx_ftz

    check_tensor("g", g, dtype=torch.float32)
    check_tensor("u", u, dtype=torch.float32, shape=tuple(g.shape))
    check_same_device(g=g, u=u)
    r = rcp_approx_ftz(ex2_approx_ftz(g * SWIGLU_C) + 1.0)
    return u * (g * r)


@dataclass(frozen=True)
class PerTokenMoEStages:
    """Every stage of P1-P12 for the computed rows (T' = ``token_capacity`` or T) and k slots.

    Fields: ``x_codes`` uint8 [T', H/2], ``x_scale`` float8_e4m3fn [T', H/16], ``x_token_scale`` fp32 [T']
    (P1-P5 of the input); ``local`` bool [T', k] (slot computed here); ``fc1_acc`` fp32 [T', k, N1] and
    ``fc1_bound`` float64 [T', k, N1] (P7: the accumulator value used and its certified bound);
    ``h`` fp32 [T', k, N1] (P8); ``act`` fp32 [T', k, I] (P9); ``a_codes`` uint8 [T', k, I/2], ``a_scale``
    float8_e4m3fn [T', k, I/16], ``a_token_scale`` fp32 [T', k] (P10); ``fc2_acc`` fp32 [T', k, H],
    ``fc2_bound`` float64 [T', k, H] (P11); ``y`` fp32 [T', k, H]; ``w`` fp32 [T', k] (P12 weights);
    ``out`` bf16 [T, H]. Slots that are not local hold zeros (bounds 0).
    """

    x_codes: torch.Tensor
    x_scale: torch.Tensor
    x_token_scale: torch.Tensor
    local: torch.Tensor
    fc1_acc: torch.Tensor
    fc1_bound: torch.Tensor
    h: torch.Tensor
    act: torch.Tensor
    a_codes: torch.Tensor
    a_scale: torch.Tensor
    a_token_scale: torch.Tensor
    fc2_acc: torch.Tensor
    fc2_bound: torch.Tensor
    y: torch.Tensor
    w: torch.Tensor
    out: torch.Tensor


def _check_routing(routing_map, probabilities, t: int, num_experts: int, local_expert_offset: int, e_local: int):
    check_tensor("routing_map", routing_map, dtype=(torch.int32, torch.int64), ndim=2)
    if routing_map.shape[0] != t or routing_map.shape[1] < 1:
        raise ValueError(f"routing_map: expected [{t}, k >= 1], got shape {tuple(routing_map.shape)}")
    check_tensor("probabilities", probabilities, dtype=(torch.float32, torch.bfloat16), shape=tuple(routing_map.shape))
    if not isinstance(num_experts, int) or not isinstance(local_expert_offset, int):
        raise TypeError("num_experts and local_expert_offset must be int")
    if local_expert_offset < 0 or local_expert_offset + e_local > num_experts:
        raise ValueError(
            f"local_expert_offset: experts [{local_expert_offset}, {local_expert_offset + e_local}) "
            f"must lie in [0, num_experts = {num_experts})"
        )
    bad = (routing_map < -1) | (routing_map >= num_experts)
    if bool(bad.any()):
        idx = _first_index(bad)
        raise ValueError(
            f"routing_map: entry {int(routing_map[idx])} at index {idx} is neither -1 nor an expert "
            f"id in [0, {num_experts})"
        )
    nonfinite = ~torch.isfinite(probabilities)
    if bool(nonfinite.any()):
        raise ValueError(f"probabilities: non-finite value at index {_first_index(nonfinite)}")


def routed_nvfp4_moe_reference(
    hidden_states: torch.Tensor,
    routing_map: torch.Tensor,
    probabilities: torch.Tensor,
    weights: PerTokenNVFP4Experts,
    *,
    num_experts: int,
    local_expert_offset: int,
    activation: str,
    out: torch.Tensor | None = None,
    token_capacity: int | None = None,
    accumulate: AccumulatePolicy = round_exact,
    model: SummationModel = FP32_RN,
    orders: dict | None = None,
    mma=None,
) -> PerTokenMoEStages:
    """P1-P12: the golden twin of ``routed_nvfp4_moe`` (module docstring).

    Args:
        hidden_states: bf16 [T, H], finite, H = ``weights.hidden_size``.
        routing_map: int32 / int64 [T, k]: global expert ids, or -1 for an empty slot.
        probabilities: fp32 or bf16 [T, k], finite (bf16 widened exactly): the routing weights.
        weights: :class:`PerTokenNVFP4Experts` holding the local experts ``local_expert_offset ...
            local_expert_offset + E - 1``; ids outside that range contribute nothing (another rank's).
        num_experts: the global expert count (ids must be below it).
        activation: ``"relu2"`` (non-gated weights) or ``"swiglu"`` (gated weights).
        out: None or bf16 [T, H]: its rows at and past ``token_capacity`` are copied to the result (the op
            leaves them untouched); without it they are +0. Not modified.
        token_capacity: None (all T rows) or 0 <= int <= T: only rows below it are computed.
        accumulate: the fp32 value of an accumulation (stages ``"fc1"`` [n, N1] and ``"fc2"`` [n, H] per
            expert; default: RN32 of the exact sum); ``model``: the summation model of the bounds.
        orders: None or ``{"fc1": declaration, "fc2": declaration}`` (:mod:`.orders`): a declared stage's
            accumulator value is the replay of that order instead (``mma``: its tensor-core step).
    Returns:
        :class:`PerTokenMoEStages`.
    Raises:
        TypeError / ValueError naming the offending argument; ValueError naming ``act`` when an FC2 input
        row is not finite (P10 is undefined there).
    """
    check_tensor("hidden_states", hidden_states, dtype=torch.bfloat16, ndim=2)
    t, hdim = hidden_states.shape
    if not isinstance(weights, PerTokenNVFP4Experts):
        raise TypeError(f"weights: expected PerTokenNVFP4Experts, got {type(weights).__name__}")
    if hdim != weights.hidden_size:
        raise ValueError(f"hidden_states: hidden size {hdim} differs from the weights' {weights.hidden_size}")
    if activation not in PERTOKEN_ACTIVATIONS:
        raise ValueError(f"activation: must be one of {PERTOKEN_ACTIVATIONS}, got {activation!r}")
    if (activation == "swiglu") != weights.gated:
        raise ValueError(
            f"activation: {activation!r} needs {'gated' if activation == 'swiglu' else 'non-gated'} "
            f"weights (FC1 with {'2I' if activation == 'swiglu' else 'I'} rows)"
        )
    e_local, idim = weights.num_experts, weights.intermediate_size
    _check_routing(routing_map, probabilities, t, num_experts, local_expert_offset, e_local)
    if token_capacity is None:
        cap = t
    elif isinstance(token_capacity, int) and not isinstance(token_capacity, bool) and 0 <= token_capacity <= t:
        cap = token_capacity
    else:
        raise ValueError(f"token_capacity: must be None or an int in [0, {t}], got {token_capacity!r}")
    if out is not None:
        check_tensor("out", out, dtype=torch.bfloat16, shape=(t, hdim))
    dev = check_same_device(
        hidden_states=hidden_states,
        routing_map=routing_map,
        probabilities=probabilities,
        weights=weights.fc1,
        **({} if out is None else {"out": out}),
    )
    orders = orders or {}
    if set(orders) - {"fc1", "fc2"}:
        raise ValueError(f"orders: keys must be 'fc1' and / or 'fc2', got {sorted(orders)}")
    k = routing_map.shape[1]
    n1 = weights.fc1.shape[1]
    x = hidden_states[:cap]
    ids = routing_map[:cap].long()
    prob = probabilities[:cap].float()
    local = (ids >= local_expert_offset) & (ids < local_expert_offset + e_local)

    f32 = dict(dtype=torch.float32, device=dev)
    fc1_acc = torch.zeros(cap, k, n1, **f32)
    fc1_bound = torch.zeros(cap, k, n1, dtype=torch.float64, device=dev)
    h = torch.zeros(cap, k, n1, **f32)
    act = torch.zeros(cap, k, idim, **f32)
    a_codes = torch.zeros(cap, k, idim // 2, dtype=torch.uint8, device=dev)
    a_scale = torch.zeros(cap, k, idim // 16, dtype=torch.uint8, device=dev)
    a_d = torch.zeros(cap, k, **f32)
    fc2_acc = torch.zeros(cap, k, hdim, **f32)
    fc2_bound = torch.zeros(cap, k, hdim, dtype=torch.float64, device=dev)
    y = torch.zeros(cap, k, hdim, **f32)

    if cap > 0:
        x_codes, x_scale, x_d = quantize_routed_nvfp4_input_reference(x)
        xq = dequantize_nvfp4_rows(x_codes, x_scale)  # exact bf16 operand
    else:
        x_codes = torch.zeros(0, hdim // 2, dtype=torch.uint8, device=dev)
        x_scale = torch.zeros(0, hdim // 16, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
        x_d = torch.zeros(0, **f32)
    for e in range(e_local):
        rows, slots = torch.nonzero(ids == local_expert_offset + e, as_tuple=True)
        if rows.numel() == 0:
            continue
        xe = xq[rows]
        acc1 = gate_up_accumulate(  # P7
            xe, weights.fc1[e], weights.fc1_scale[e], model=model, order=orders.get("fc1"), mma=mma
        )
        v1 = _policy_value(accumulate, "fc1", acc1, {"x": xe, "expert": e})
        he = (v1 * weights.fc1_alpha[e]) * x_d[rows].unsqueeze(1)  # P8
        if activation == "relu2":  # P9
            ae = relu2_fp32(he)
        else:
            ae = swiglu_fp32(he[:, :idim].contiguous(), he[:, idim:].contiguous())
        bad = ~torch.isfinite(ae)
        if bool(bad.any()):
            r, c = _first_index(bad)
            raise ValueError(
                f"act: FC2 input of token {int(rows[r])}, slot {int(slots[r])} has the non-finite "
                f"value {float(ae[r, c])} at column {c}; P10 does not define it"
            )
        ce, se, de, _ = quantize_nvfp4_pertoken(ae, name="act")  # P10
        aq = dequantize_nvfp4_rows(ce, se)
        acc2 = down_accumulate(  # P11
            aq, weights.fc2[e], weights.fc2_scale[e], model=model, order=orders.get("fc2"), mma=mma
        )
        v2 = _policy_value(accumulate, "fc2", acc2, {"act": aq, "expert": e})
        fc1_acc[rows, slots] = v1
        fc1_bound[rows, slots] = acc1.bound
        h[rows, slots] = he
        act[rows, slots] = ae
        a_codes[rows, slots] = ce
        a_scale[rows, slots] = se.view(torch.uint8)
        a_d[rows, slots] = de
        fc2_acc[rows, slots] = v2
        fc2_bound[rows, slots] = acc2.bound
        y[rows, slots] = v2 * weights.fc2_alpha[e]
    w = prob * a_d  # P12: RN(p * d2)
    acc = torch.zeros(cap, hdim, **f32)
    for j in range(k):
        step = fma_f32(w[:, j : j + 1], y[:, j], acc)
        acc = torch.where(local[:, j : j + 1], step, acc)
    result = torch.zeros(t, hdim, dtype=torch.bfloat16, device=dev) if out is None else out.clone()
    result[:cap] = to_bf16(acc)
    return PerTokenMoEStages(
        x_codes,
        x_scale,
        x_d,
        local,
        fc1_acc,
        fc1_bound,
        h,
        act,
        a_codes,
        a_scale.view(torch.float8_e4m3fn),
        a_d,
        fc2_acc,
        fc2_bound,
        y,
        torch.where(local, w, torch.zeros_like(w)),
        result,
    )
