"""End-to-end golden model: rule steps 1-10 (``moe_nvfp4``, ``moe_bf16``), 11 + 1-10 (``moe_decode_block``).

Each function returns a frozen dataclass with every stage output and the :class:`.exact.Accumulation` of every
long reduction. The fp32 value of each accumulator comes from the ``accumulate`` policy
(``policy(stage, acc, operands) -> fp32``; default :func:`.exact.round_exact`), with stages ``"router"``,
``"gate_up"``, ``"down"``, ``"sumsq"``, ``"shared_gate_up"``, ``"shared_down"``; ``operands`` holds the
reduction's inputs (and for routed experts ``expert`` and ``tokens``), so a later policy can replay a kernel's
documented summation order. Only the selected experts are dequantized, one at a time, a chunk of rows at once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ._checks import check_same_device, check_tensor
from .combine import add_shared, combine_fp32
from .decode_block import residual_add, rmsnorm_apply, sum_squares
from .exact import FP32_RN, Accumulation, SummationModel, round_exact
from .experts import AccumulatePolicy, ExpertStages, _policy_value, bf16_expert, nvfp4_expert
from .formats import to_bf16
from .layouts import experts_from_cutedsl
from .routing import logits_from_accumulator, renormalize, router_accumulate, routing_scores, topk_total_order
from .weights import BF16Experts, NVFP4Experts, NVFP4Linear

__all__ = [
    "MoEResult",
    "DecodeBlockResult",
    "ORDER_STAGES",
    "moe_nvfp4",
    "moe_bf16",
    "moe_decode_block",
    "stage_table",
]

#: Stages whose summation order an ``orders`` dict may declare (:mod:`.orders`; None = undeclared).
ORDER_STAGES = ("router", "gate_up", "down")


@dataclass(frozen=True)
class _RoutingStages:
    """The fields of rule steps 1-4 that open a :class:`MoEResult`."""

    router_acc: Accumulation
    logits: torch.Tensor
    ids: torch.Tensor
    scores: torch.Tensor
    weights: torch.Tensor


# Field order: _RoutingStages', then ExpertStages' (steps 6-8, per token and slot), then these (dataclasses
# collect the fields of the bases in reverse method resolution order).
@dataclass(frozen=True)
class MoEResult(ExpertStages, _RoutingStages):
    """Every stage of rule steps 1-10 (M tokens, E experts, k slots, H hidden, I intermediate).

    Fields:
        router_acc: Accumulation [M, E] (step 1 reduction).  logits: bf16 [M, E] (step 1).
        ids: int32 [M, k] (step 2).  scores: fp32 [M, k] (step 3). weights: fp32 [M, k] bf16 values (step 4).
        gate_acc, up_acc: Accumulation [M, k, I] (step 6 reductions, per token and slot).
        g, u: fp32 [M, k, I] (step 6).  act: bf16 [M, k, I] (step 7).
        down_acc: Accumulation [M, k, H] (step 8 reduction).  y: bf16 [M, k, H] (step 8).
        combine_acc: fp32 [M, H] (step 9 accumulator).  routed: bf16 [M, H] (step 9).
        shared: bf16 [M, H] or None (step 10 input).  out: bf16 [M, H] (step 10; ``routed`` if no shared).
    """

    combine_acc: torch.Tensor
    routed: torch.Tensor
    shared: torch.Tensor | None
    out: torch.Tensor


@dataclass(frozen=True)
class DecodeBlockResult:
    """Every stage of the decode block (step 11, then steps 1-10 on ``xn``).

    Fields:
        s: fp32 [M, H] (residual sum).  residual: bf16 [M, H] (``residual'``).
        sumsq_acc: Accumulation [M].  sumsq: fp32 [M] (the accumulate policy's value).  xn: bf16 [M, H].
        shared_expert: ExpertStages of the shared expert on ``xn``; ``y_shared`` = its ``y`` bf16 [M, H].
        moe: MoEResult of steps 1-10 with ``shared = y_shared``.  out: bf16 [M, H] (= ``moe.out``).
    """

    s: torch.Tensor
    residual: torch.Tensor
    sumsq_acc: Accumulation
    sumsq: torch.Tensor
    xn: torch.Tensor
    shared_expert: ExpertStages
    y_shared: torch.Tensor
    moe: MoEResult
    out: torch.Tensor


class _AccBuffer:
    """Assembles per-(token, slot) Accumulations [M, k, N] from per-expert pieces."""

    def __init__(self, m: int, k: int, device: torch.device):
        self.m, self.k, self.device = m, k, device
        self.parts: dict[str, torch.Tensor] | None = None
        self.n: int | None = None
        self.model: SummationModel | None = None

    def put(self, tokens: torch.Tensor, slots: torch.Tensor, acc: Accumulation) -> None:
        if self.parts is None:
            shape = (self.m, self.k, acc.shape[-1])
            f64 = dict(dtype=torch.float64, device=self.device)
            self.parts = {
                "exact": torch.full(shape, math.nan, **f64),
                "bound": torch.zeros(shape, **f64),
                "abs_sum": torch.zeros(shape, **f64),
                "eta_possible": torch.zeros(shape, dtype=torch.bool, device=self.device),
            }
            if acc.inner_abs_sum is not None:  # NVFP4 block partials (exact.py, "Overflow")
                self.parts["inner_abs_sum"] = torch.zeros(shape, **f64)
            if acc.exact_error is not None:  # certified float64 filter (exact.py, "The float64 filter")
                self.parts["exact_error"] = torch.zeros(shape, **f64)
            if acc.replay is not None:  # a declared summation order's fp32 value (orders.py)
                self.parts["replay"] = torch.full(shape, math.nan, dtype=torch.float32, device=self.device)
            self.n, self.model = acc.n, acc.model
        for name, t in self.parts.items():
            t[tokens, slots] = getattr(acc, name)

    def get(self) -> Accumulation:
        assert self.parts is not None and self.n is not None and self.model is not None
        return Accumulation(n=self.n, model=self.model, **self.parts)


def _check_moe_inputs(x, router_weight, e: int, h: int, top_k, shared) -> None:
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2)
    if x.shape[1] != h:
        raise ValueError(f"x: hidden size {x.shape[1]} does not match the experts' H = {h}")
    check_tensor("router_weight", router_weight, dtype=torch.bfloat16, shape=(e, h))
    check_same_device(x=x, router_weight=router_weight)
    if not isinstance(top_k, int) or isinstance(top_k, bool):
        raise TypeError(f"top_k: expected an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k: must satisfy 1 <= top_k <= E = {e}, got {top_k}")
    if shared is not None:
        check_tensor("shared", shared, dtype=torch.bfloat16, shape=tuple(x.shape))
        check_same_device(x=x, shared=shared)


def _check_orders(orders) -> dict:
    if orders is None:
        return {}
    if not isinstance(orders, dict) or set(orders) - set(ORDER_STAGES):
        raise ValueError(f"orders: expected a dict with keys among {ORDER_STAGES}, got {orders!r:.200}")
    from .orders import check_order

    for _stage, o in orders.items():
        if o is not None:
            check_order(o)
    return {k: v for k, v in orders.items() if v is not None}


def _moe(x, router_weight, top_k, shared, run_expert, i: int, accumulate, model, orders, mma) -> MoEResult:
    m, h = x.shape
    router_acc = router_accumulate(x, router_weight, model=model, order=orders.get("router"), mma=mma)
    v = _policy_value(accumulate, "router", router_acc, {"x": x, "router_weight": router_weight})
    logits = logits_from_accumulator(v)
    ids = topk_total_order(logits, top_k)
    scores = routing_scores(torch.gather(logits, 1, ids.long()))
    weights = renormalize(scores)

    dev = x.device
    g = torch.full((m, top_k, i), math.nan, dtype=torch.float32, device=dev)
    u = torch.full_like(g, math.nan)
    act = torch.zeros((m, top_k, i), dtype=torch.bfloat16, device=dev)
    y = torch.zeros((m, top_k, h), dtype=torch.bfloat16, device=dev)
    gate_buf, up_buf, down_buf = (
        _AccBuffer(m, top_k, dev),
        _AccBuffer(m, top_k, dev),
        _AccBuffer(m, top_k, dev),
    )
    for e in torch.unique(ids).tolist():  # ascending expert index; each token selects an expert at most once
        tokens, slots = torch.nonzero(ids == e, as_tuple=True)
        st = run_expert(e, x[tokens], {"expert": e, "tokens": tokens})
        g[tokens, slots], u[tokens, slots], act[tokens, slots], y[tokens, slots] = st.g, st.u, st.act, st.y
        gate_buf.put(tokens, slots, st.gate_acc)
        up_buf.put(tokens, slots, st.up_acc)
        down_buf.put(tokens, slots, st.down_acc)

    combine_acc = combine_fp32(weights, y)
    routed = to_bf16(combine_acc)
    out = routed if shared is None else add_shared(routed, shared)
    return MoEResult(
        router_acc, logits, ids, scores, weights, gate_buf.get(), up_buf.get(), g, u, act, down_buf.get(), y,
        combine_acc, routed, shared, out,
    )  # fmt: skip


def _logical_nvfp4(experts: object) -> NVFP4Experts:
    """Logical NVFP4 experts from the logical container or a kernel layout (through the independent decoders
    of :mod:`.layouts`; a FlintMoEWeights-like object in FlashInfer's CuTe-DSL W4A16 layout)."""
    if isinstance(experts, NVFP4Experts):
        return experts
    if all(hasattr(experts, a) for a in ("w1", "w1_sf", "w1_alpha", "w2", "w2_sf", "w2_alpha")):
        return experts_from_cutedsl(experts)
    raise TypeError(
        f"experts: expected NVFP4Experts or a FlintMoEWeights-like object (w1, w1_sf, w1_alpha, w2, w2_sf, "
        f"w2_alpha), got {type(experts).__name__}"
    )


def moe_nvfp4(
    x: torch.Tensor, router_weight: torch.Tensor, experts: NVFP4Experts, top_k: int,
    shared: torch.Tensor | None = None, *, accumulate: AccumulatePolicy = round_exact, model: SummationModel = FP32_RN,
    orders: dict | None = None, mma=None,
) -> MoEResult:
    """Rule steps 1-10 with NVFP4 experts.

    Args:
        x: bf16 [M, H]; router_weight: bf16 [E, H]; experts: :class:`.weights.NVFP4Experts` (E, H, I), or
        weights in FlashInfer's CuTe-DSL W4A16 layout (``flint_moe.layouts.FlintMoEWeights``), which are read
        back through the independent decoder :func:`.layouts.experts_from_cutedsl`;
        top_k: int in [1, E]; shared: bf16 [M, H] shared-expert output or None (then ``out = routed``).
        accumulate: fp32 value of each long reduction (module docstring); model: summation model of the
        bounds (re-derive others with ``Accumulation.with_model``).
        orders: None, or stage (``ORDER_STAGES``: "router", "gate_up", "down") -> a summation-order
        declaration (:mod:`.orders`; e.g. ``flint_moe.kernels.orders.nvfp4_decode_orders``) or None: a
        declared stage's fp32 accumulator is the replay of that order (``Accumulation.replay``; ``exact`` and
        ``bound`` unchanged), the others come from ``accumulate``. mma: the tensor-core step of the replay
        (default ``flint_moe.reference.mma.mma_bf16_f32``).
    Raises: TypeError / ValueError naming the offending argument (``orders`` included).
    """
    orders = _check_orders(orders)
    experts = _logical_nvfp4(experts)
    _check_moe_inputs(x, router_weight, experts.num_experts, experts.hidden, top_k, shared)
    check_same_device(x=x, experts_w13=experts.w13)

    def run(e: int, xr: torch.Tensor, info: dict) -> ExpertStages:
        return nvfp4_expert(
            xr, experts.w13[e], experts.w13_scale[e], experts.w13_gs[e], experts.w2[e], experts.w2_scale[e],
            experts.w2_gs[e], accumulate=accumulate, model=model, info=info, orders=orders, mma=mma,
        )  # fmt: skip

    return _moe(x, router_weight, top_k, shared, run, experts.intermediate, accumulate, model, orders, mma)


def moe_bf16(
    x: torch.Tensor, router_weight: torch.Tensor, experts: BF16Experts, top_k: int,
    shared: torch.Tensor | None = None, *, accumulate: AccumulatePolicy = round_exact, model: SummationModel = FP32_RN,
    orders: dict | None = None, mma=None,
) -> MoEResult:
    """Rule steps 1-10 with BF16 experts (``g = g_acc``, ``u = u_acc``, ``y = bf16(y_acc)``). Args as
    :func:`moe_nvfp4` with ``experts`` a :class:`.weights.BF16Experts` (a declared ``down`` order longer
    than I, e.g. the layout's padded intermediate size, is replayed with zero padding)."""
    orders = _check_orders(orders)
    if not isinstance(experts, BF16Experts):
        raise TypeError(f"experts: expected BF16Experts, got {type(experts).__name__}")
    _check_moe_inputs(x, router_weight, experts.num_experts, experts.hidden, top_k, shared)
    check_same_device(x=x, experts_w13=experts.w13)

    def run(e: int, xr: torch.Tensor, info: dict) -> ExpertStages:
        return bf16_expert(
            xr, experts.w13[e], experts.w2[e], accumulate=accumulate, model=model, info=info, orders=orders, mma=mma
        )

    return _moe(x, router_weight, top_k, shared, run, experts.intermediate, accumulate, model, orders, mma)


def moe_decode_block(
    attn_out: torch.Tensor,
    residual: torch.Tensor,
    w_ln: torch.Tensor,
    eps: float,
    router_weight: torch.Tensor,
    experts: NVFP4Experts,
    top_k: int,
    shared_w13: NVFP4Linear,
    shared_w2: NVFP4Linear,
    *,
    accumulate: AccumulatePolicy = round_exact,
    model: SummationModel = FP32_RN,
    orders: dict | None = None,
    mma=None,
) -> DecodeBlockResult:
    """Rule step 11 then steps 1-10 on ``xn`` with ``shared = y_shared`` (shared expert by steps 5-8).

    Args: ``attn_out``, ``residual`` bf16 [M, H]; ``w_ln`` bf16 [H]; ``eps`` Python float (used as fp32);
    router_weight, experts, top_k as :func:`moe_nvfp4`; ``shared_w13`` NVFP4Linear [2*SI, H] ([gate; up]),
    ``shared_w2`` NVFP4Linear [H, SI]; ``orders`` / ``mma``: as :func:`moe_nvfp4`, for the routed stages
    (the sum of squares and the shared expert keep ``accumulate``). Raises TypeError / ValueError naming the
    offending argument.
    """
    _check_orders(orders)
    for name, lin in (("shared_w13", shared_w13), ("shared_w2", shared_w2)):
        if not isinstance(lin, NVFP4Linear):
            raise TypeError(f"{name}: expected NVFP4Linear, got {type(lin).__name__}")
    s = residual_add(attn_out, residual)
    h = s.shape[1]
    if shared_w13.in_features != h or shared_w13.out_features % 2:
        raise ValueError(
            f"shared_w13: expected shape [2*SI, H={h}], got [{shared_w13.out_features}, "
            f"{shared_w13.in_features}]"
        )
    si = shared_w13.out_features // 2
    if (shared_w2.out_features, shared_w2.in_features) != (h, si):
        raise ValueError(
            f"shared_w2: expected shape [H={h}, SI={si}], got [{shared_w2.out_features}, "
            f"{shared_w2.in_features}]"
        )
    sumsq_acc = sum_squares(s, model=model)
    sumsq = _policy_value(accumulate, "sumsq", sumsq_acc, {"s": s})
    xn = rmsnorm_apply(s, sumsq, w_ln, eps)

    def shared_policy(stage: str, acc: Accumulation, operands: dict) -> torch.Tensor:
        return accumulate(f"shared_{stage}", acc, operands)

    sh = nvfp4_expert(
        xn, shared_w13.codes, shared_w13.block_scale, shared_w13.global_scale, shared_w2.codes,
        shared_w2.block_scale, shared_w2.global_scale, accumulate=shared_policy, model=model,
    )  # fmt: skip
    moe = moe_nvfp4(
        xn, router_weight, experts, top_k, sh.y, accumulate=accumulate, model=model, orders=orders, mma=mma
    )
    return DecodeBlockResult(s, to_bf16(s), sumsq_acc, sumsq, xn, sh, sh.y, moe, moe.out)


# ---------------------------------------------------------------------------------------------------------
# Printable summary
# ---------------------------------------------------------------------------------------------------------


def _summary(t: torch.Tensor) -> str:
    if t.numel() == 0:
        return "empty"
    if not (t.is_floating_point()):
        return f"min={int(t.min())} max={int(t.max())}"
    f = t.to(torch.float64)
    nan = int(torch.isnan(f).sum())
    inf = int(torch.isinf(f).sum())
    fin = f[torch.isfinite(f)]
    rng = f"min={float(fin.min()):.6g} max={float(fin.max()):.6g}" if fin.numel() else "no finite values"
    return f"nan={nan} inf={inf} {rng}"


def _acc_summary(a: Accumulation) -> str:
    b = a.bound[torch.isfinite(a.exact)]
    mb = f"{float(b.max()):.3g}" if b.numel() else "-"
    return f"{_summary(a.exact)} n={a.n} model={a.model.name} max_bound={mb}"


def stage_table(result: MoEResult | DecodeBlockResult | ExpertStages, prefix: str = "") -> list[tuple]:
    """Rows ``(stage, shape, dtype, summary)`` for every stage of a result (nested results flattened with
    dotted names); Accumulations show NaN/inf counts, min/max of ``exact``, n, model and the largest bound.
    ``shape`` is a tuple of ints, ``dtype`` a string."""
    if not dataclasses.is_dataclass(result):
        raise TypeError(f"result: expected a result dataclass, got {type(result).__name__}")
    rows: list[tuple] = []
    for f in dataclasses.fields(result):
        v = getattr(result, f.name)
        name = prefix + f.name
        if isinstance(v, Accumulation):
            rows.append((name, tuple(v.shape), "Accumulation(float64)", _acc_summary(v)))
        elif isinstance(v, torch.Tensor):
            rows.append((name, tuple(v.shape), str(v.dtype).replace("torch.", ""), _summary(v)))
        elif dataclasses.is_dataclass(v):
            rows.extend(stage_table(v, prefix=name + "."))
        elif v is None:
            rows.append((name, (), "None", "-"))
    return rows
