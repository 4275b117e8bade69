"""Black-box mode: end-to-end conformance of a kernel WITHOUT taps (e.g. a third-party kernel).

``compare_blackbox(fn, x, router_weight, weights, top_k, logical, *, shared=None, ...) -> CaseResult`` calls
``fn(x, router_weight, weights, top_k) -> out bf16 [M, H]`` once and compares ``out`` with the golden model
run on its own. With no intermediate values to trace, an output element that differs is EXPLAINED only by the
bounded explanation: the golden model carries, for every element, the interval of values a conforming kernel
can reach, through every rule step after each accumulation (``docs`` of the Flint rule, steps 1-10):

* each long reduction (router, gate/up, down): ``[exact - bound, exact + bound]`` for its summation model
  (defaults: router plain fp32 round-to-nearest in any order; experts ``FP32_TRUNCATE``, the loosest the
  rule admits (tensor-core truncation, u = 2^-23, any order), which also covers round-to-nearest and the
  documented NVFP4 block regrouping);
* order-free steps are monotone (RN32, bf16 rounding, the global scale ``>= 0``, the sigmoid of step 3, the
  renormalisation division) and map interval ends to interval ends; SwiGLU's ``g * r(g)`` is evaluated with
  the rule's emulated instructions at both ends and at its minimum near ``g = -1.2785``, widened by 2^-20
  relative (the ``.approx`` instructions are monotone only to within an ulp) and extended to 0 below -80
  (where ``rcp.approx.ftz`` flushes); products of intervals take the four corners; the down reduction of an
  ``act`` interval is ``W2 . mid +- |W2| . radius`` plus the summation bound on ``|W2| . max|act|``; the
  step-4 sum and the step-9 fma chain are bounded for any slot order (``gamma_k`` relative);
* top-k: every selection a conforming kernel could make: experts whose logit intervals overlap the k-th
  place compete, and a selection is possible only if no selected expert's interval lies entirely below an
  unselected competitor's (a top-k difference counts as explained only when the competing logits'
  intervals overlap). The output interval is the hull over the possible selections (at most
  :data:`MAX_SELECTIONS` per token; more makes the token's differing elements unexplained).

An element is EXPLAINED when the kernel's value lies inside its interval (compared on the bf16 totalOrder,
so -0 < +0: a zero's sign must be reachable), FAIL otherwise; NaN positions must match the golden output, and
where the golden output is not finite the kernel must equal it. The result is a ``results.CaseResult`` with
``mode = "black-box"``, no stages, and ``end_to_end`` (mode "black-box", causes ``interval`` / ``routing``:
inside the golden selection's interval, or only inside another possible selection's).

Example (a third-party kernel whose weights ``theirs`` hold the experts ``logical`` in its own layout)::

    from flint_moe.conformance.judge.blackbox import compare_blackbox
    res = compare_blackbox(lambda x, rw, w, k: their_moe(x, rw, w, k), x, router_weight, theirs, top_k,
                           logical, name="their-moe")
    print(res.verdict, res.end_to_end.unexplained, res.end_to_end.failure_details)

Cost: one golden run plus, per token and possible selection, the interval propagation (the tests run our
kernels this way on cpu shapes in seconds).
"""

from __future__ import annotations

import itertools
import math

import torch

from flint_moe.conformance.judge.explain import _bf16_key, _e2e_result, logit_intervals
from flint_moe.conformance.judge.metrics import _bits_equal, tensor_digest
from flint_moe.conformance.judge.results import CAUSES, FAIL, CaseResult
from flint_moe.reference._checks import check_tensor
from flint_moe.reference.exact import FP32_RN, FP32_TRUNCATE, Accumulation, SummationModel, gamma
from flint_moe.reference.experts import (
    SWIGLU_C,
    dequant_nvfp4,
    gate_up_accumulate,
    gate_up_accumulate_bf16,
)
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.model import moe_bf16, moe_nvfp4
from flint_moe.reference.mufu import ex2_approx_ftz, rcp_approx_ftz
from flint_moe.reference.routing import RENORM_EPS, router_accumulate, routing_scores
from flint_moe.reference.weights import BF16Experts, NVFP4Experts

__all__ = ["MAX_SELECTIONS", "SILU_MIN_G", "compare_blackbox", "output_intervals"]

#: Most top-k selections enumerated per token.
MAX_SELECTIONS = 64
#: ``g`` where ``g * sigmoid(g)`` is smallest (-1.27846454...).
SILU_MIN_G = -1.2784645427610738
_REL_APPROX = 2.0**-20
_U = 2.0**-24
_INF = math.inf


def _down(t: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(t, torch.full_like(t, -_INF))


def _up(t: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(t, torch.full_like(t, _INF))


def _bf16_of(t64: torch.Tensor) -> torch.Tensor:
    """bf16(RN32(t)) as float64 (monotone in t)."""
    return to_bf16(t64.to(torch.float32)).to(torch.float64)


def _acc_interval(acc: Accumulation) -> tuple[torch.Tensor, torch.Tensor]:
    """Real interval holding the kernel's fp32 accumulator (float64 ends, widened one float64 ulp)."""
    return _down(acc.exact - acc.bound), _up(acc.exact + acc.bound)


def _scale(lo, hi, gs: float):
    """Interval of RN32(v * gs) for v in [lo, hi] (v an fp32 value), gs >= 0: monotone ends."""
    a, b = _down(lo * gs), _up(hi * gs)
    return a.to(torch.float32).to(torch.float64), b.to(torch.float32).to(torch.float64)


def _silu_rule(g32: torch.Tensor) -> torch.Tensor:
    """RN(g * r), r = rcp.approx.ftz(RN(ex2.approx.ftz(RN(g * c)) + 1)) (rule step 7), fp32 -> float64."""
    r = rcp_approx_ftz(ex2_approx_ftz(g32 * SWIGLU_C) + 1.0)
    return (g32 * r).to(torch.float64)


def _silu_interval(g_lo, g_hi):
    """Interval of the rule's ``RN(g * r(g))`` for fp32 g in [g_lo, g_hi] (float64 tensors)."""
    a = _silu_rule(g_lo.to(torch.float32))
    b = _silu_rule(g_hi.to(torch.float32))
    lo, hi = torch.minimum(a, b), torch.maximum(a, b)
    inside = (g_lo <= SILU_MIN_G) & (g_hi >= SILU_MIN_G)
    if bool(inside.any()):
        pts = torch.tensor([SILU_MIN_G - 1e-3, SILU_MIN_G, SILU_MIN_G + 1e-3], dtype=torch.float32)
        m = float(_silu_rule(pts.to(g_lo.device)).min())
        lo = torch.where(inside, torch.minimum(lo, torch.full_like(lo, m)), lo)
    lo = _down(lo - lo.abs() * _REL_APPROX)
    hi = _up(hi + hi.abs() * _REL_APPROX)
    flush = g_lo < -80.0
    return torch.where(flush, torch.minimum(lo, torch.zeros_like(lo)), lo), torch.where(
        flush, torch.maximum(hi, torch.zeros_like(hi)), hi
    )


def _mul_interval(alo, ahi, blo, bhi):
    c = torch.stack([alo * blo, alo * bhi, ahi * blo, ahi * bhi])
    return c.min(dim=0).values, c.max(dim=0).values


def _possible_selections(lo: torch.Tensor, hi: torch.Tensor, k: int) -> list[tuple[int, ...]] | None:
    """k-subsets of experts a conforming kernel could select, from bf16 [E] logit intervals; the golden-like
    (most likely) one first is not guaranteed. None when there are more than MAX_SELECTIONS."""
    klo, khi = _bf16_key(lo), _bf16_key(hi)
    E = lo.shape[0]
    kth = torch.sort(klo, descending=True).values[k - 1]
    cand = [e for e in range(E) if khi[e] >= kth]
    if math.comb(len(cand), k) > 50 * MAX_SELECTIONS:
        return None
    out = []
    for sel in itertools.combinations(cand, k):
        s = set(sel)
        if any(khi[a] < klo[b] for a in sel for b in cand if b not in s):
            continue
        out.append(sel)
        if len(out) > MAX_SELECTIONS:
            return None
    return out


def output_intervals(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    logical: NVFP4Experts | BF16Experts,
    top_k: int,
    shared: torch.Tensor | None = None,
    *,
    router_model: SummationModel = FP32_RN,
    expert_model: SummationModel = FP32_TRUNCATE,
):
    """Per token and possible top-k selection, the interval of outputs a conforming kernel can return.

    Args: ``x`` bf16 [M, H]; ``router_weight`` bf16 [E, H]; ``logical`` NVFP4Experts / BF16Experts; ``top_k``;
    ``shared`` bf16 [M, H] or None; summation models of the router and expert reductions.
    Returns a list over tokens: None when the token has more than :data:`MAX_SELECTIONS` possible
    selections (not bounded), else a list of ``(selection, lo, hi)``: the selected experts (sorted tuple) and
    bf16 [H] interval ends of the token's output row under that selection.
    """
    nv = isinstance(logical, NVFP4Experts)
    dev = x.device
    M, H = x.shape
    I = logical.w13.shape[1] // 2  # noqa: E741
    racc = router_accumulate(x, router_weight, model=router_model)
    llo, lhi = logit_intervals(racc)
    gu_cache: dict[int, Accumulation] = {}
    w2_cache: dict[int, torch.Tensor] = {}

    def gate_up(e: int) -> Accumulation:
        if e not in gu_cache:
            w13 = logical.w13[e].to(dev)
            acc = gate_up_accumulate(x, w13, logical.w13_scale[e].to(dev)) if nv else gate_up_accumulate_bf16(x, w13)
            gu_cache[e] = acc.with_model(expert_model)
        return gu_cache[e]

    def w2(e: int) -> torch.Tensor:
        if e not in w2_cache:
            w2_cache[e] = (
                dequant_nvfp4(logical.w2[e].to(dev), logical.w2_scale[e].to(dev)).to(torch.float64)
                if nv
                else logical.w2[e].to(dev).to(torch.float64)
            )
        return w2_cache[e]

    rel_d = gamma(expert_model.depth(I), expert_model.u)
    eta_d = expert_model.eta_count(I) * expert_model.eta * (1.0 + rel_d)
    sh = None if shared is None else shared.to(dev).to(torch.float64)
    rows: list[list[tuple[tuple[int, ...], torch.Tensor, torch.Tensor]] | None] = []
    for m in range(M):
        sels = _possible_selections(llo[m], lhi[m], top_k)
        if sels is None:
            rows.append(None)
            continue
        row = []
        for sel in sels:
            # steps 3-4: scores and routing weights, any slot order
            idx = torch.tensor(sel, device=dev)
            s_lo = routing_scores(llo[m, idx]).to(torch.float64) * (1 - 4 * _U)
            s_hi = routing_scores(lhi[m, idx]).to(torch.float64) * (1 + 4 * _U)
            k = len(sel)
            tot_lo = (s_lo.sum() + RENORM_EPS) * (1 - gamma(k + 1, _U))
            tot_hi = (s_hi.sum() + RENORM_EPS) * (1 + gamma(k + 1, _U))
            tw_lo = _bf16_of(_down(s_lo / tot_hi * (1 - 2 * _U)))
            tw_hi = _bf16_of(_up(s_hi / tot_lo * (1 + 2 * _U)))
            c_lo = torch.zeros(H, dtype=torch.float64, device=dev)
            c_hi = torch.zeros_like(c_lo)
            c_abs = torch.zeros_like(c_lo)
            for j, e in enumerate(sel):
                acc = gate_up(e)[m]
                glo, ghi = _acc_interval(acc[:I])
                ulo, uhi = _acc_interval(acc[I:])
                if nv:
                    gs1 = float(logical.w13_gs[e])
                    glo, ghi = _scale(glo, ghi, gs1)
                    ulo, uhi = _scale(ulo, uhi, gs1)
                slo, shi = _silu_interval(glo, ghi)
                plo, phi = _mul_interval(ulo, uhi, slo, shi)
                a_lo, a_hi = _bf16_of(_down(plo)), _bf16_of(_up(phi))
                W = w2(e)
                mid, rad = (a_lo + a_hi) / 2, (a_hi - a_lo) / 2
                amax = torch.maximum(a_lo.abs(), a_hi.abs())
                center = W @ mid
                S = W.abs() @ amax
                spread = (W.abs() @ rad) * (1 + I * 2.0**-52) + S * (rel_d + I * 2.0**-52) + eta_d
                d_lo, d_hi = _down(center - spread), _up(center + spread)
                if nv:
                    gs2 = float(logical.w2_gs[e])
                    d_lo, d_hi = _down(d_lo * gs2), _up(d_hi * gs2)
                y_lo, y_hi = _bf16_of(d_lo), _bf16_of(d_hi)
                p_lo, p_hi = _mul_interval(tw_lo[j], tw_hi[j], y_lo, y_hi)
                c_lo, c_hi = c_lo + p_lo, c_hi + p_hi
                c_abs = c_abs + torch.maximum(p_lo.abs(), p_hi.abs())
            err = c_abs * (gamma(k, _U) + k * 2.0**-52) + k * 2.0**-149
            r_lo, r_hi = _bf16_of(_down(c_lo - err)), _bf16_of(_up(c_hi + err))
            if sh is not None:
                r_lo, r_hi = _bf16_of(r_lo + sh[m]), _bf16_of(r_hi + sh[m])
            row.append((tuple(sorted(sel)), to_bf16(r_lo.to(torch.float32)), to_bf16(r_hi.to(torch.float32))))
        rows.append(row)
    return rows


def compare_blackbox(
    fn,
    x: torch.Tensor,
    router_weight: torch.Tensor,
    weights,
    top_k: int,
    logical: NVFP4Experts | BF16Experts,
    *,
    shared: torch.Tensor | None = None,
    name: str = "black-box",
    case_id: str | None = None,
    router_model: SummationModel = FP32_RN,
    expert_model: SummationModel = FP32_TRUNCATE,
) -> CaseResult:
    """Run ``fn(x, router_weight, weights, top_k)`` once and judge its output end to end (module docstring).

    Args:
        fn: the kernel under test; returns bf16 [M, H] (it adds ``shared`` itself when one is given).
        x: bf16 [M, H]; router_weight: bf16 [E, H]; weights: whatever ``fn`` reads (passed through);
        top_k: int in [1, E]; logical: the same experts in checkpoint layout for the golden model
            (``NVFP4Experts`` or ``BF16Experts``); shared: bf16 [M, H] or None (the golden output is then
            the routed sum).
        name: the result's ``path`` label; case_id: the result's id (default ``"<name>/M<m>"``).
        router_model / expert_model: summation models of the kernel's reductions (bounds).
    Returns:
        ``CaseResult`` with ``mode="black-box"``, ``stages=[]``, ``end_to_end`` (mode "black-box"), verdict
        EXACT / EXPLAINED / FAIL, ``digests["out"]``.
    Raises:
        TypeError / ValueError naming ``x``, ``router_weight``, ``logical``, ``top_k`` or ``shared``.
    """
    check_tensor("x", x, dtype=torch.bfloat16, ndim=2)
    M, H = x.shape
    check_tensor("router_weight", router_weight, dtype=torch.bfloat16, shape=(None, H))
    if not isinstance(logical, (NVFP4Experts, BF16Experts)):
        raise TypeError(f"logical: expected NVFP4Experts or BF16Experts, got {type(logical).__name__}")
    if not isinstance(top_k, int) or not 1 <= top_k <= router_weight.shape[0]:
        raise ValueError(f"top_k: must be an int in [1, E = {router_weight.shape[0]}], got {top_k!r}")
    if shared is not None:
        check_tensor("shared", shared, dtype=torch.bfloat16, shape=(M, H))
    cid = case_id or f"{name}/M{M}"
    meta = {"M": M, "H": H, "E": int(router_weight.shape[0]), "k": top_k, "mode": "black-box",
            "device": str(x.device), "router_model": router_model.name, "expert_model": expert_model.name}  # fmt: skip
    with torch.no_grad():
        out = fn(x, router_weight, weights, top_k)
    golden = (moe_nvfp4 if isinstance(logical, NVFP4Experts) else moe_bf16)(x, router_weight, logical, top_k, shared)
    gout = golden.out
    if not (isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16 and tuple(out.shape) == (M, H)):
        got = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        none = torch.zeros_like(gout, dtype=torch.bool)
        e2e = _e2e_result("black-box", gout, gout, none, none, torch.zeros_like(none, dtype=torch.long), {})
        e2e.verdict, e2e.note = FAIL, f"fn returned {got}, expected torch.bfloat16 {(M, H)}"
        return CaseResult(cid, name, FAIL, [], meta, {}, end_to_end=e2e, mode="black-box")
    out = out.detach().to(x.device)
    diff = ~_bits_equal(out, gout)
    rows = output_intervals(
        x, router_weight, logical, top_k, shared, router_model=router_model, expert_model=expert_model
    )
    key, kg = _bf16_key(out), _bf16_key(gout)
    expl = torch.zeros_like(diff)
    cause = torch.full(diff.shape, CAUSES.index("interval"), dtype=torch.long, device=diff.device)
    lo = torch.full((M, H), math.nan, dtype=torch.float32, device=diff.device)
    hi = lo.clone()
    why = {}
    for m in range(M):
        gsel = tuple(sorted(int(i) for i in golden.ids[m].tolist()))
        if rows[m] is None:
            why[m] = f"more than {MAX_SELECTIONS} possible top-k selections: not bounded"
            continue
        best = None
        for sel, slo, shi in rows[m]:  # the row must fit ONE selection's intervals
            klo, khi = _bf16_key(slo), _bf16_key(shi)
            if sel == gsel:
                klo, khi = torch.minimum(klo, kg[m]), torch.maximum(khi, kg[m])
            ok = torch.isfinite(slo) & torch.isfinite(shi) & torch.isfinite(gout[m]) & ~torch.isnan(out[m])
            ok &= (key[m] >= klo) & (key[m] <= khi)
            ok |= ~diff[m]
            score = (int(ok.sum()), sel == gsel)
            if best is None or score > best[0]:
                best = (score, sel, ok, slo, shi)
        _, sel, ok, slo, shi = best
        expl[m] = diff[m] & ok
        lo[m], hi[m] = slo.float(), shi.float()
        if sel != gsel:
            cause[m] = CAUSES.index("routing")
        if bool((diff[m] & ~ok).any()):
            why[m] = f"outside the interval of outputs a conforming kernel can reach (best selection {sel})"
    note = "black-box: intervals carried through the rule steps after each accumulation"
    e2e = _e2e_result("black-box", out, gout, diff, expl, cause, why, lo=lo, hi=hi, note=note)
    return CaseResult(
        case_id=cid,
        path=name,
        verdict=e2e.verdict,
        stages=[],
        meta=meta,
        digests={"out": tensor_digest(out)},
        end_to_end=e2e,
        mode="black-box",
    )
