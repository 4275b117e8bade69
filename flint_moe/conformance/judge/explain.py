"""End to end: the returned output against the golden model run on its own (not teacher-forced), every differing
element traced through the kernel's taps to an accumulation difference upstream or to a top-k choice between
experts whose logit intervals overlap (:func:`end_to_end_taps`; the verdict rules are in
:mod:`flint_moe.conformance.judge.stages`). Also the logit intervals (:func:`logit_intervals`), the routing
explanation (:func:`routing_explained`) and the assembly of an ``EndToEndResult`` from per-element masks,
shared with the black-box comparison (:mod:`flint_moe.conformance.judge.blackbox`).

The golden run here (``_golden_own``) follows rule steps 1-10 with every accumulation RN32 of its exact sum,
reusing the teacher-forced sums of the stage checks where the inputs agree (``cache``), which
``flint_moe.reference.model`` cannot do.
"""

from __future__ import annotations

import math

import torch

from flint_moe.conformance.judge.expert_steps import expert_down, expert_gate_up, expert_y
from flint_moe.conformance.judge.metrics import _bits_equal, _coords, _hist, _map, _tap, _usable, ulp_distance
from flint_moe.conformance.judge.pairs import _gate_up_rows, _Pairs, _split_models
from flint_moe.conformance.judge.results import CAUSES, EXACT, EXPLAINED, FAIL, STAGES, EndToEndResult
from flint_moe.reference.combine import add_shared, combine
from flint_moe.reference.exact import Accumulation
from flint_moe.reference.experts import apply_global_scale, swiglu
from flint_moe.reference.routing import (
    logits_from_accumulator,
    renormalize,
    router_accumulate,
    routing_scores,
    topk_total_order,
)

__all__ = ["MAX_ROWS", "end_to_end_taps", "logit_intervals", "routing_explained"]

MAX_ROWS = 64


def _bf16_key(t: torch.Tensor) -> torch.Tensor:
    """int64 totalOrder key of bf16 values (-0 < +0); monotone in the value."""
    b = t.contiguous().view(torch.int16).to(torch.int64)
    return torch.where(b < 0, -(b & 0x7FFF) - 1, b)


def logit_intervals(racc: Accumulation) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 [M, E] (lo, hi): every logit ``bf16(RN32(v))`` a conforming router accumulation ``v`` (within
    ``racc``'s bound of the exact sum, rule steps 1) can produce. RN32 and bf16 rounding are monotone, so the
    ends are the roundings of ``exact -+ bound`` (computed in float64 and widened by one float64 ulp).
    NaN / inf exact sums give that value at both ends."""
    e, b = racc.exact, racc.bound
    fin = torch.isfinite(e)
    lo = torch.where(fin, torch.nextafter(e - b, torch.full_like(e, -math.inf)), e)
    hi = torch.where(fin, torch.nextafter(e + b, torch.full_like(e, math.inf)), e)
    return logits_from_accumulator(lo.to(torch.float32)), logits_from_accumulator(hi.to(torch.float32))


def routing_explained(kernel_ids: torch.Tensor, golden_logits: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor):
    """Whether one token's top-k ``kernel_ids`` int [k] differs from the golden selection only between experts
    whose logit intervals overlap (rule step 2: a routing difference is explained only when the competing logits
    tie or differ within their bounds).

    ``golden_logits``, ``lo``, ``hi``: bf16 [E] (golden logits and the :func:`logit_intervals` row). Every
    pair ordered one way by the kernel (``a`` selected before ``b``, or ``a`` selected and ``b`` not) and the
    other way by the golden totalOrder ranking (value descending, lower index first) must have overlapping
    intervals. Returns (ok: bool, offending pair (a, b) or None)."""
    E = golden_logits.shape[0]
    gkey = _bf16_key(golden_logits) * (E + 1) + (E - torch.arange(E, device=golden_logits.device))
    grank = torch.argsort(gkey, descending=True)
    pos = torch.empty(E, dtype=torch.long, device=grank.device)
    pos[grank] = torch.arange(E, device=grank.device)
    klo, khi = _bf16_key(lo), _bf16_key(hi)
    ids = [int(i) for i in kernel_ids.tolist()]
    above: set[int] = set()
    for a in ids:
        for b in grank[: int(pos[a])].tolist():  # experts golden ranks above a
            if b in above:
                continue  # the kernel ranks b above a too
            if not (klo[a] <= khi[b] and klo[b] <= khi[a]):
                return False, (a, b)
        above.add(a)
    return True, None


def _fp32(acc) -> torch.Tensor:
    """An accumulation's fp32 value in the golden run: the replay of the declared order where there is one,
    else RN32 of the exact sum."""
    return acc.replay if acc.replay is not None else acc.exact.to(torch.float32)


def _golden_own(path, model, wl, x, router_w, shared, k, racc, cache, orders=None):
    """The golden model on its own (rule steps 1-10; every accumulation the replay of the kernel's declared
    order where ``orders`` gives one, else RN32 of its exact sum): dict of logits, ids, weights, gate/up
    (accumulators, logical I), act, down, y, out."""
    orders = orders or {}
    o_gu, o_dn = orders.get("gate_up"), orders.get("down")
    gu_model, d_model = _split_models(model)
    nv = path.startswith("nvfp4_")
    dev = x.device
    M, H = x.shape
    I = wl.w13.shape[1] // 2  # noqa: E741
    logits = logits_from_accumulator(_fp32(racc))
    ids = topk_total_order(logits, k)
    tw = renormalize(routing_scores(torch.gather(logits, 1, ids.long())))
    gacc = torch.zeros((M, k, I), dtype=torch.float32, device=dev)
    uacc, act = torch.zeros_like(gacc), torch.zeros((M, k, I), dtype=torch.bfloat16, device=dev)
    dacc = torch.zeros((M, k, H), dtype=torch.float32, device=dev)
    y = torch.zeros((M, k, H), dtype=torch.bfloat16, device=dev)
    downs = cache.get("down", {})
    routing = _Pairs(ids, dev)
    for e in routing.experts:
        tokens, slots = routing.tokens[e], routing.slots[e]

        def run(rows, e=e):
            return expert_gate_up(wl, e, x[rows].contiguous(), nv, dev, model=gu_model, order=o_gu)

        uniq, inv = routing.uniq[e], routing.inv[e]
        r = _fp32(_gate_up_rows(cache, e, uniq, run, routing.uniq_host[e]))[inv]
        g_e, u_e = r[:, :I].contiguous(), r[:, I:].contiguous()
        if nv:
            gs1 = wl.w13_gs[e : e + 1].to(dev)
            a_e = swiglu(apply_global_scale(g_e, gs1), apply_global_scale(u_e, gs1))
        else:
            a_e = swiglu(g_e, u_e)
        pairs = routing.pairs[e]
        prev = downs.get(e)  # the teacher-forced down sums: reuse the rows whose act agrees
        redo = torch.ones(len(pairs), dtype=torch.bool, device=dev)
        dr = torch.empty((len(pairs), H), dtype=torch.float32, device=dev)
        if prev is not None and prev[0] == pairs:
            redo = ~_bits_equal(prev[1], a_e).all(dim=1)
            dr[~redo] = _fp32(prev[2])[~redo]
        if bool(redo.any()):
            d = expert_down(wl, e, a_e[redo].contiguous(), nv, dev, model=d_model, order=o_dn)
            dr[redo] = _fp32(d)
        y_e = expert_y(wl, e, dr, nv, dev)
        gacc[tokens, slots], uacc[tokens, slots], act[tokens, slots] = g_e, u_e, a_e
        dacc[tokens, slots], y[tokens, slots] = dr, y_e
    out = add_shared(combine(tw, y), shared)
    return {"logits": logits, "ids": ids, "weights": tw, "gate_acc": gacc, "up_acc": uacc, "act": act,
            "down_acc": dacc, "y": y, "out": out}  # fmt: skip


def _w2_nonzero(path, wl, e: int, dev) -> torch.Tensor:
    """bool [H, I]: where expert e's down weight is non-zero (how an act element reaches an output)."""
    if path.startswith("nvfp4_"):
        from flint_moe.reference.experts import dequant_nvfp4

        return dequant_nvfp4(wl.w2[e].to(dev), wl.w2_scale[e].to(dev)) != 0
    return wl.w2[e].to(dev) != 0


def end_to_end_taps(
    path, model, wl, x, router_w, shared, k, taps: dict, out, *, racc=None, cache=None, orders=None
) -> EndToEndResult:
    """Returned output vs the golden model's own run, every differing element traced through the taps.

    A differing ``out[m, h]`` is EXPLAINED when (in this order): the token's top-k differs from the golden
    one only between experts whose logit intervals overlap (:func:`routing_explained`, cause ``routing``);
    or the ids agree and the routing weights differ because the selected logits differ (``router_acc``);
    or the weights agree and for some slot j ``y[m, j, h]`` differs, with the down accumulator
    ``down_acc[m, j, h]`` differing from the golden one (``down_acc``), or an ``act[m, j, i]`` difference
    caused by a ``gate_acc`` / ``up_acc`` difference at (m, j, i) and reaching h through a non-zero
    ``W2[h, i]`` (``gate_up_acc``), and no slot's ``y[m, j, h]`` differs without such a cause. Everything
    else is unexplained (FAIL). Whether each upstream difference is itself within its bound is the stage
    comparison's job (:func:`compare_case`). ``model``: a SummationModel or a (gate/up, down) pair (the
    bounds do not change the golden values; they only matter for the reused ``cache``). Returns
    :class:`EndToEndResult` (mode ``"taps"``). ``orders``: the kernels' declared summation orders (stage ->
    declaration, as for ``reference.model``): the golden run then accumulates in those orders, so a kernel that
    follows them returns the golden output bit for bit (EXACT); ``racc`` and ``cache`` must come from the same
    orders.
    """
    dev = x.device
    M, H = x.shape
    I = wl.w13.shape[1] // 2  # noqa: E741
    racc = router_accumulate(x, router_w) if racc is None else racc
    gold = _golden_own(path, model, wl, x, router_w, shared, k, racc, {} if cache is None else cache, orders)
    t = {n: _tap(taps, n, dev) for n in STAGES}
    if not _usable(out, (M, H), torch.bfloat16):
        return EndToEndResult("taps", FAIL, note="returned output unusable (missing, wrong shape or dtype)")
    out = out.detach().to(dev)
    diff = ~_bits_equal(out, gold["out"])
    expl = torch.zeros_like(diff)
    cause = torch.full((M, H), -1, dtype=torch.long, device=dev)
    why: dict[int, str] = {}
    need = {"ids": ((M, k), torch.int32), "logits": ((M, router_w.shape[0]), torch.bfloat16),
            "weights": ((M, k), torch.float32), "y": ((M, k, H), torch.bfloat16),
            "down_acc": ((M, k, H), torch.float32)}  # fmt: skip
    missing = [n for n, (shp, dt) in need.items() if not _usable(t[n], shp, dt)]
    if "ids" not in missing and bool(((t["ids"] < 0) | (t["ids"] >= router_w.shape[0])).any()):
        missing.append("ids")
    lo, hi = logit_intervals(racc)
    rows_d = diff.any(dim=1)
    if missing:
        for m in torch.nonzero(rows_d).flatten().tolist():
            why[m] = f"taps {missing} unusable: not traced"
        return _e2e_result("taps", out, gold["out"], diff, expl, cause, why)
    kids = t["ids"].long()
    ids_eq = (kids == gold["ids"].long()).all(dim=1)
    w_eq = _bits_equal(t["weights"], gold["weights"]).all(dim=1)
    # rows whose routing differs (few): traced one by one
    for m in torch.nonzero(rows_d & ~(ids_eq & w_eq)).flatten().tolist():
        kid = t["ids"][m]
        if not bool(ids_eq[m]):
            ok, pair = routing_explained(kid, gold["logits"][m], lo[m], hi[m])
            if ok:
                expl[m], cause[m] = diff[m], CAUSES.index("routing")
            else:
                why[m] = f"top-k differs between experts {pair} whose logit intervals do not overlap"
            continue
        sel = kid.long()
        if not bool(_bits_equal(t["logits"][m, sel], gold["logits"][m, sel]).all()):
            expl[m], cause[m] = diff[m], CAUSES.index("router_acc")
        else:
            why[m] = "routing weights differ although the selected logits agree"
    # rows with the same routing: every (token, slot, h) at once (a loop over rows would synchronise the
    # device several times per row: thousands of times for a large batch)
    same = rows_d & ids_eq & w_eq
    y_diff = ~_bits_equal(t["y"], gold["y"]) & same[:, None, None]  # [M, k, H]
    d_diff = ~_bits_equal(t["down_acc"], gold["down_acc"])
    reach_ok, reach_bad = _act_reach(path, wl, t, gold, kids, y_diff.any(dim=2), M, k, H, I, dev)
    ok = y_diff & d_diff & ~reach_bad  # a differing y explained by its own down_acc difference
    y_ok, y_bad = ok.any(dim=1), (y_diff & ~ok).any(dim=1)
    c_row = torch.full((M, H), -1, dtype=torch.long, device=dev)
    gu_c, dn_c = CAUSES.index("gate_up_acc"), CAUSES.index("down_acc")
    for j in range(k):  # the first slot that explains an element names its cause
        c_j = torch.where(reach_ok[:, j], gu_c, dn_c)
        c_row = torch.where((c_row < 0) & ok[:, j], c_j, c_row)
    row_ok = diff & y_ok & ~y_bad
    expl = torch.where(same[:, None], row_ok, expl)
    cause = torch.where(same[:, None], torch.where(row_ok, c_row, -1), cause)
    for m in torch.nonzero(same & (diff & ~row_ok).any(dim=1)).flatten().tolist():
        why[m] = "output differs where no upstream accumulation difference reaches it"
    return _e2e_result("taps", out, gold["out"], diff, expl, cause, why)


def _act_reach(path, wl, t, gold, kids, slots, M, k, H, I, dev):  # noqa: E741
    """(reach_ok, reach_bad) bool [M, k, H] for the (token, slot) pairs ``slots`` [M, k]: whether an ``act``
    difference at (m, j, i) reaches output h through a non-zero ``W2[h, i]`` of the pair's expert, with the
    gate/up accumulators differing there too (ok: explained upstream) or not (bad). One product per expert
    over its pairs; all False where the act / gate / up taps are unusable."""
    reach_ok = torch.zeros((M, k, H), dtype=torch.bool, device=dev)
    reach_bad = torch.zeros_like(reach_ok)
    a_tap, g_tap, u_tap = t["act"], t["gate_acc"], t["up_acc"]
    if not (isinstance(a_tap, torch.Tensor) and a_tap.dtype == torch.bfloat16 and a_tap.dim() == 3
            and tuple(a_tap.shape[:2]) == (M, k) and a_tap.shape[-1] >= I):  # fmt: skip
        return reach_ok, reach_bad
    a_diff = ~_bits_equal(a_tap[:, :, :I], gold["act"]) & slots[:, :, None]
    acc_diff = torch.ones_like(a_diff)
    if all(isinstance(g, torch.Tensor) and g.dim() == 3 and tuple(g.shape[:2]) == (M, k) and g.shape[-1] >= I
           for g in (g_tap, u_tap)):  # fmt: skip
        acc_diff = ~_bits_equal(g_tap[:, :, :I], gold["gate_acc"]) | ~_bits_equal(u_tap[:, :, :I], gold["up_acc"])
    pm, pj = torch.nonzero(a_diff.any(dim=2), as_tuple=True)
    if pm.numel() == 0:
        return reach_ok, reach_bad
    pe = kids[pm, pj]
    for e in torch.unique(pe).tolist():
        sel = pe == e
        m_e, j_e = pm[sel], pj[sel]
        w = _w2_nonzero(path, wl, e, dev).to(torch.float32)  # [H, I]; counts below 2^24 are exact
        a_e, c_e = a_diff[m_e, j_e].to(torch.float32), acc_diff[m_e, j_e].to(torch.float32)
        reach_ok[m_e, j_e] = (a_e * c_e) @ w.T > 0
        reach_bad[m_e, j_e] = (a_e * (1.0 - c_e)) @ w.T > 0
    return reach_ok, reach_bad


def _e2e_result(mode, out, gold_out, diff, expl, cause, why: dict, lo=None, hi=None, note="") -> EndToEndResult:
    """Assemble an :class:`EndToEndResult` from per-element masks (shared with ``blackbox.py``)."""
    n = diff.numel()
    bad = diff & ~expl
    n_diff, n_bad = int(diff.sum()), int(bad.sum())
    dist = ulp_distance(out, gold_out)
    nan_mm = torch.isnan(out) ^ torch.isnan(gold_out)
    zero_mm = (out == 0) & (gold_out == 0) & diff
    causes = {}
    for i, c in enumerate(CAUSES):
        cnt = int((expl & (cause == i)).sum())
        if cnt:
            causes[c] = cnt
    rows = []
    for m in torch.nonzero(diff.any(dim=1)).flatten().tolist()[:MAX_ROWS]:
        cs = sorted({CAUSES[int(c)] for c in cause[m][expl[m]].unique().tolist() if c >= 0})
        rows.append({"row": m, "differing": int(diff[m].sum()), "unexplained": int(bad[m].sum()), "causes": cs})
    details = []
    for idx in _coords(bad):
        m, h = idx
        details.append({
            "index": idx, "kernel": float(out[m, h]), "golden": float(gold_out[m, h]),
            "lo": None if lo is None else float(lo[m, h]), "hi": None if hi is None else float(hi[m, h]),
            "why": why.get(m, ""),
        })  # fmt: skip
    verdict = EXACT if n_diff == 0 else (EXPLAINED if n_bad == 0 else FAIL)
    return EndToEndResult(
        mode, verdict, elements=n, differing=n_diff, explained=n_diff - n_bad, unexplained=n_bad,
        nan_mismatches=int(nan_mm.sum()), signed_zero_mismatches=int(zero_mm.sum()),
        max_ulp=float(dist.max()) if n else None, first_differences=_coords(diff), first_failures=_coords(bad),
        causes=causes, rows=rows, failure_details=details, map=_map(diff) if n_diff else None,
        ulp_hist=_hist(dist) if n else None, note=note,
    )  # fmt: skip
