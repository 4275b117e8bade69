"""Stage-by-stage comparison of one kernel run against the golden model, with teacher forcing.

``compare_case(case, inputs, taps, out) -> CaseResult``. Each order-free rule step is recomputed by the golden
model (``flint_moe.reference``) from the kernel's OWN inputs to that step (its taps) and must match bit for
bit; each long reduction (``router_acc``, ``gate_acc``, ``up_acc``, ``down_acc``) must lie within the golden
model's certified bound for the kernel's documented summation order:

================  ============================================================  =========================
stage             golden value                                                  criterion
================  ============================================================  =========================
router_acc        exact ``x . Wr^T`` (plain fp32 RN model)                      within bound
logits            ``bf16(router_acc)``                                          bits
ids               totalOrder top-k of the kernel's ``logits``                   equal
weights           steps 3-4 on the kernel's logits at the kernel's ``ids``      bits
gate_acc/up_acc   exact ``x . W13^T`` of expert ``ids[m, j]``                   within bound
act               SwiGLU of ``RN(gate_acc * gs1)``, ``RN(up_acc * gs1)``        bits
                  (BF16 rule: of ``gate_acc``, ``up_acc`` directly)
down_acc          exact ``act . W2^T`` on the kernel's ``act``                  within bound
y                 ``bf16(RN(down_acc * gs2))`` (BF16: ``bf16(down_acc)``)        bits
out               step-9 combine of the kernel's ``weights`` and ``y`` + shared  bits (returned output)
================  ============================================================  =========================

"bits": every element bitwise equal, NaN compared as NaN-ness (payloads ignored), signed zeros compared.
Summation models (:func:`expert_models`): NVFP4 decode gate/up and down each use what its kernel declares
for its launch configuration (``accumulation_model()``: the block regrouping ``block_model(16)`` on CUDA
cores, ``FP32_TRUNCATE`` on the tensor-core path); the grouped NVFP4 path ``FP32_TRUNCATE``; the router and
the BF16 kernels plain fp32 round-to-nearest in any order (``FP32_RN``); see the kernel docstrings in
``flint_moe/kernels``.

Verdicts per stage: ``EXACT`` (all bits equal to the golden value; for an accumulation: to ``RN32`` of the
exact sum), ``WITHIN-BOUND`` (accumulations: every element within the certified bound), ``FAIL``.
Accumulations also report WARNING elements: error above ``WARN_FACTOR`` (10) times the probabilistic
estimate ``sqrt(d) * u * sum|terms|`` (d = the summation model's rounding depth), the worst 5 listed; inside
the bound they do not fail the stage (possible only for d > 100: real layers, not the tiny cpu shapes).

End to end (``explain.end_to_end_taps``, ``CaseResult.end_to_end``): the RETURNED output against the golden model
run on its own (every accumulation RN32 of its exact sum, its own top-k), per element: ``EXACT`` (all bits
equal), ``EXPLAINED`` (every differing element traced through the taps to an accumulation difference
upstream, or to a top-k difference between experts whose logit intervals overlap), else ``FAIL``. Verdict
order EXACT < WITHIN-BOUND < EXPLAINED < FAIL; the case verdict is the worst of the stages and the end-to-end
check. Everything is per element; nothing is averaged. ``blackbox.py`` is the same end-to-end check for a
kernel without taps (intervals instead of tracing).

Interface with the case objects (duck-typed, docs/ARCHITECTURE.md section 2): ``case.id``, ``case.path``
(``"nvfp4_decode"`` | ``"bf16_decode"``), ``case.k`` (optional ``shape``, ``M``, ``E``, ``H``, ``I``,
``profile``, ``seed`` are copied into the result when present); ``inputs.x``, ``inputs.router_weight``,
``inputs.shared``, ``inputs.weights_logical`` (or ``inputs.logical``; ``NVFP4Experts`` / ``BF16Experts``).
The golden model runs
on ``inputs.x``'s device. Result types and verdicts: ``results.py``; element metrics: ``metrics.py``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from flint_moe.conformance.judge import replay as _replay
from flint_moe.conformance.judge.expert_steps import expert_down, expert_gate_up, expert_replays, expert_y
from flint_moe.conformance.judge.explain import end_to_end_taps
from flint_moe.conformance.judge.metrics import (
    MAX_COORDS,
    _bits_equal,
    _coords,
    _hist,
    _map,
    _tap,
    _usable,
    tensor_digest,
    ulp_distance,
)
from flint_moe.conformance.judge.pairs import _gate_up_rows, _Pairs, _split_models
from flint_moe.conformance.judge.replay import case_orders, replay_sampled
from flint_moe.conformance.judge.results import (
    ACCUMULATION_STAGES,
    EXACT,
    FAIL,
    STAGES,
    WITHIN_BOUND,
    CaseResult,
    StageResult,
    worst_verdict,
)
from flint_moe.reference.combine import add_shared, fma_f32
from flint_moe.reference.exact import (
    FP32_RN,
    FP32_TRUNCATE,
    Accumulation,
    SummationModel,
    block_model,
    check_accumulator,
    ulp_fp32,
)
from flint_moe.reference.experts import apply_global_scale, down_output_bf16, swiglu
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.model import _AccBuffer  # per-(token, slot) assembly, shared with the golden model
from flint_moe.reference.orders import order_summary
from flint_moe.reference.routing import (
    logits_from_accumulator,
    renormalize,
    router_accumulate,
    routing_scores,
    topk_total_order,
)
from flint_moe.reference.weights import BF16Experts, NVFP4Experts

__all__ = [
    "PATH_MODELS",
    "expert_models",
    "WARN_FACTOR",
    "compare_case",
    "compare_bits",
    "compare_accumulation",
]

#: Summation model of each path's expert reductions (the router is always FP32_RN); for nvfp4_decode the
#: CUDA-core default, the kernels' own declaration wins (:func:`expert_models`).
#: ``nvfp4_grouped``: tensor-core dots of the dequantised weights, plain any-order truncating model
#: (flint_moe/kernels/nvfp4/grouped_gate_up.py, docs/kernels/nvfp4-grouped.md).
PATH_MODELS: dict[str, SummationModel] = {
    "nvfp4_decode": block_model(16),
    "bf16_decode": FP32_RN,
    "nvfp4_grouped": FP32_TRUNCATE,
    "nvfp4_module": block_model(16),  # modules.FlintNvfp4Experts: decode or grouped by M, E, k (expert_models)
    "bf16_module": FP32_RN,  # modules.FlintBf16DecodeMoE: the BF16 decode kernels
    "nvfp4_dispatch": block_model(16),  # ops.flint_moe at any M: decode or grouped by M, E, k (expert_models)
    "nvfp4_ll": FP32_RN,  # the decode block's routed stages (judge/block.py): CuTe fma chains, exact products
}


def expert_models(
    path: str, config: str = "default", M: int | None = None, E: int | None = None, k: int | None = None
) -> tuple[SummationModel, SummationModel]:
    """(gate/up model, down model): the summation models bounding a path's expert reductions.

    ``nvfp4_decode``: what the kernels declare for the launch configuration ``config`` (a
    ``cases.PATH_CONFIGS`` name; ``paths.kernel_configs`` gives its overrides),
    ``flint_moe.kernels.nvfp4.gate_up.accumulation_model()`` / ``nvfp4_down.accumulation_model()``
    (``block_model(16)`` on CUDA cores, ``FP32_TRUNCATE`` on the tensor-core (MMA) path; imported lazily, so
    TRITON_INTERPRET must be settled first, as for any kernel import). Other paths, or kernels without
    the declaration: :data:`PATH_MODELS` for both. ``nvfp4_module`` and ``nvfp4_dispatch`` (both run
    ``ops.flint_moe``): the models of the path it runs for ``M`` tokens, E experts, top_k ``k``
    (``run.paths.dispatch_path``: ``nvfp4_decode`` up to ``ops.decode_max_tokens(E, k)``, ``nvfp4_grouped``
    above; ``M`` None counts as decode). Raises KeyError for an unknown path, ValueError for those two paths
    with ``M`` but without ``E`` and ``k``."""
    if path in ("nvfp4_module", "nvfp4_dispatch"):  # flint_moe: decode kernels up to its per-shape limit, then grouped
        if M is None:
            return expert_models("nvfp4_decode")
        if E is None or k is None:
            raise ValueError(f"expert_models({path!r}, M={M}): E and k are needed (the dispatch depends on them)")
        from flint_moe.conformance.run.paths import dispatch_path

        return expert_models(dispatch_path(M, E, k))
    default = PATH_MODELS[path]
    if path == "nvfp4_decode":
        try:
            from flint_moe.conformance.run.paths import kernel_configs
            from flint_moe.kernels.nvfp4 import down_combine as nvfp4_down, gate_up as nvfp4_gate_up

            cfg = kernel_configs(path, config)
            return nvfp4_gate_up.accumulation_model(cfg.get("gate_up")), nvfp4_down.accumulation_model(cfg.get("down"))
        except (ImportError, AttributeError):
            pass
    return default, default


#: WARNING when an accumulation error exceeds this many times the probabilistic estimate sqrt(d) * u * S.
WARN_FACTOR = 10.0


def _shape_error(stage: str, kind: str, kernel, golden_shape, golden_dtype) -> StageResult | None:
    if kernel is None:
        return StageResult(stage, kind, FAIL, note=f"tap {stage!r} missing from the kernel's taps")
    if not isinstance(kernel, torch.Tensor):
        return StageResult(stage, kind, FAIL, note=f"tap {stage!r} is a {type(kernel).__name__}, not a tensor")
    if tuple(kernel.shape) != tuple(golden_shape) or kernel.dtype != golden_dtype:
        return StageResult(
            stage,
            kind,
            FAIL,
            note=f"kernel {kernel.dtype} {tuple(kernel.shape)}, golden {golden_dtype} {tuple(golden_shape)}",
        )
    return None


def compare_bits(stage: str, kernel: torch.Tensor | None, golden: torch.Tensor, *, note: str = "") -> StageResult:
    """Order-free stage: every element of ``kernel`` must equal ``golden`` bit for bit (NaN as NaN-ness)."""
    err = _shape_error(stage, "bits", kernel, golden.shape, golden.dtype)
    if err is not None:
        return err
    kernel = kernel.detach().to(golden.device)
    ok = _bits_equal(kernel, golden)
    n = ok.numel()
    bad = n - int(ok.sum())
    max_ulp, hist = None, None
    if golden.is_floating_point() and n:
        dist = ulp_distance(kernel, golden)
        max_ulp, hist = float(dist.max()), _hist(dist)
    return StageResult(
        stage,
        "bits",
        EXACT if bad == 0 else FAIL,
        elements=n,
        mismatches=bad,
        exact=n - bad,
        max_ulp=max_ulp,
        first_failures=_coords(~ok),
        note=note,
        map=_map(~ok) if bad else None,
        ulp_hist=hist,
    )


def compare_accumulation(
    stage: str,
    kernel: torch.Tensor | None,
    acc: Accumulation,
    *,
    note: str = "",
    order: dict | None = None,
    replay_cols: int | None = None,
) -> StageResult:
    """Accumulation stage: ``kernel`` fp32 within ``acc``'s certified bound everywhere (rule "Accumulation").

    Also reports the observed error in ulps and as a fraction of the bound, and WARNING elements whose
    error exceeds ``WARN_FACTOR * (sqrt(d) * u * S + eta_term)`` (d = the model's rounding depth, S the
    exact sum of |terms|): what fp32 summation in any order practically never produces, e.g. a bf16
    accumulation or a dropped small term.

    Order replay: when ``acc.replay`` holds the fp32 value of the kernel's declared summation order (``order``,
    :mod:`flint_moe.reference.orders`), the criterion is bitwise equality with it (NaN as NaN-ness, signed zeros
    compared) on the first ``replay_cols`` columns (all if None; later columns are padding judged by the bound):
    EXACT when every accumulator equals the replay, else FAIL with "order differs from declared" (the bound
    still reported as the order-free second check).
    """
    err = _shape_error(stage, "accumulation", kernel, acc.shape, torch.float32)
    if err is not None:
        return err
    kernel = kernel.detach().to(acc.exact.device)
    ok = check_accumulator(kernel, acc, name=stage)
    n = ok.numel()
    bad = n - int(ok.sum())
    rounded = acc.exact.to(torch.float32)
    exact_bits = _bits_equal(kernel, rounded)
    k64 = kernel.to(torch.float64)
    fin = torch.isfinite(k64) & torch.isfinite(acc.exact)
    abs_err = torch.where(fin, (k64 - acc.exact).abs(), 0.0)
    err_ulps = abs_err / ulp_fp32(acc.exact)
    frac = torch.where(acc.bound > 0, abs_err / acc.bound, torch.where(abs_err > 0, math.inf, 0.0))
    model = acc.model
    estimate = math.sqrt(model.depth(acc.n)) * model.u * acc.abs_sum + acc.eta_term
    ratio = torch.where(estimate > 0, abs_err / estimate, torch.where(abs_err > 0, math.inf, 0.0))
    warn = fin & (ratio > WARN_FACTOR)
    worst = []
    if bool(warn.any()):
        flat = torch.where(warn, ratio, -1.0).reshape(-1)
        top = torch.topk(flat, min(MAX_COORDS, int(warn.sum()))).indices
        for f in top.tolist():
            idx = [int(i) for i in torch.unravel_index(torch.tensor(f), ratio.shape)]
            worst.append(
                {
                    "index": idx,
                    "err_ulps": float(err_ulps.reshape(-1)[f]),
                    "ratio": float(ratio.reshape(-1)[f]),
                    "bound_fraction": float(frac.reshape(-1)[f]),
                }
            )
    replay_note, replay_bad = "", 0
    if acc.replay is not None:  # the kernel's declared order, replayed: bitwise is the criterion
        same = _bits_equal(kernel, acc.replay)
        if replay_cols is not None and replay_cols < same.shape[-1]:
            same[..., replay_cols:] = True  # padded columns (zero weights): judged by the bound alone
        replay_bad = int((~same).sum())
        what = f"declared order [{order_summary(order)}]" if order is not None else "declared order"
        if replay_bad:
            dr = ulp_distance(kernel, acc.replay)[~same]
            inside = replay_bad - int((~ok & ~same).sum())
            replay_note = (
                f"order differs from declared: {replay_bad} of {n} accumulators differ from the replay of the "
                f"{what} (max {float(dr.max()):.3g} ulp; {inside} of them within the any-order bound)"
            )
        else:
            replay_note = f"bitwise equal to the replay of the {what}"
        note = f"{note}; {replay_note}" if note else replay_note
    if bad or replay_bad:
        verdict = FAIL
    elif acc.replay is not None or bool(exact_bits.all()):
        verdict = EXACT
    else:
        verdict = WITHIN_BOUND
    dist = ulp_distance(kernel, rounded)
    return StageResult(
        stage,
        "accumulation",
        verdict,
        elements=n,
        mismatches=bad,
        exact=int(same.sum()) if acc.replay is not None else int(exact_bits.sum()),
        max_ulp=float(dist.max()) if n else None,
        map=_map(~ok) if bad else (_map(~same) if replay_bad else None),
        ulp_hist=_hist(dist) if n else None,
        first_failures=_coords(~ok) if bad or not replay_bad else _coords(~same),
        note=note,
        model=model.name,
        max_err_ulps=float(err_ulps.max()) if n else 0.0,
        max_bound_fraction=float(frac.max()) if n else 0.0,
        warnings=int(warn.sum()),
        worst_warnings=worst,
    )


def _meta(case, inputs, dev) -> dict:
    meta = {}
    for key in ("shape", "shape_name", "M", "k", "E", "H", "I", "pad_to", "profile", "seed"):
        v = getattr(case, key, None)
        if v is not None:
            meta[key] = v if isinstance(v, (int, float, str, bool)) else str(v)
    meta.setdefault("M", int(inputs.x.shape[0]))
    meta["device"] = str(dev)
    return meta


def _logical_weights(inputs):
    """``inputs.weights_logical`` (brief) or ``inputs.logical`` (profiles.CaseInputs); clear error if neither."""
    for name in ("weights_logical", "logical"):
        w = getattr(inputs, name, None)
        if w is not None:
            return w
    raise ValueError("inputs: no logical weights (expected attribute 'weights_logical' or 'logical')")


def _pair_ok(ids: torch.Tensor | None, E: int, M: int, k: int) -> tuple[bool, str]:
    if not isinstance(ids, torch.Tensor) or tuple(ids.shape) != (M, k) or ids.dtype != torch.int32:
        return False, "kernel ids unusable (missing or wrong shape/dtype): expert stages not checked"
    if bool(((ids < 0) | (ids >= E)).any()):
        return False, f"kernel ids outside [0, {E}): expert stages not checked"
    return True, ""


# ---------------------------------------------------------------------------------------------------------
# compare_case
# ---------------------------------------------------------------------------------------------------------


def compare_case(case, inputs, taps: dict, out: torch.Tensor, *, orders="auto") -> CaseResult:
    """Compare one kernel run (its taps and returned output) with the golden model, stage by stage.

    Args:
        case: object with ``id``, ``path`` ("nvfp4_decode" | "bf16_decode"), ``k``.
        inputs: object with ``x`` bf16 [M, H], ``router_weight`` bf16 [E, H], ``shared`` bf16 [M, H],
            ``weights_logical`` (``NVFP4Experts`` for nvfp4_decode, ``BF16Experts`` for bf16_decode).
        taps: the dict the path's launcher filled (docs/ARCHITECTURE.md section 2).
        out: the kernel's returned output bf16 [M, H].
    Returns:
        :class:`CaseResult` with one :class:`StageResult` per stage of :data:`STAGES`.
    Raises:
        ValueError: unknown ``case.path``, or logical weights of the wrong kind for the path.
        TypeError: ``taps`` not a dict.
    """
    path = case.path
    if path not in PATH_MODELS:
        raise ValueError(f"case {case.id}: unknown path {path!r}; expected one of {sorted(PATH_MODELS)}")
    if not isinstance(taps, dict):
        raise TypeError(f"taps: expected a dict, got {type(taps).__name__}")
    wl = _logical_weights(inputs)
    want = NVFP4Experts if path.startswith("nvfp4_") else BF16Experts
    if not isinstance(wl, want):
        raise ValueError(f"case {case.id}: path {path} needs weights_logical {want.__name__}, got {type(wl).__name__}")
    m_case = int(case.M) if hasattr(case, "M") else None
    model = expert_models(path, getattr(case, "config", "default"), m_case, inputs.router_weight.shape[0], case.k)
    x = inputs.x.detach()
    dev = x.device
    router_w = inputs.router_weight.detach().to(dev)
    shared = inputs.shared.detach().to(dev)
    k = int(case.k)
    M, H = x.shape
    E = router_w.shape[0]
    t = {name: _tap(taps, name, dev) for name in STAGES}
    res: dict[str, StageResult] = {}

    if isinstance(orders, str) and orders == "auto":
        orders = case_orders(case, dev)
    if orders is not None and M > _replay.replay_row_count():  # replay a deterministic sample of whole token rows
        return replay_sampled(compare_case, case, inputs, taps, out, orders, _logical_weights(inputs))
    orders = orders or {}

    # Steps 1-4: routing (the bound of route's path for M: imported here, after TRITON_INTERPRET is settled).
    from flint_moe.ops.route import router_accumulation_model

    racc = router_accumulate(x, router_w, model=router_accumulation_model(M), order=orders.get("router"))
    res["router_acc"] = compare_accumulation("router_acc", t["router_acc"], racc, order=orders.get("router"))
    if isinstance(t["router_acc"], torch.Tensor) and t["router_acc"].dtype == torch.float32:
        res["logits"] = compare_bits("logits", t["logits"], logits_from_accumulator(t["router_acc"].contiguous()))
    else:
        res["logits"] = StageResult("logits", "bits", FAIL, note="router_acc tap unusable: logits not checked")
    logits = t["logits"]
    logits_ok = isinstance(logits, torch.Tensor) and logits.dtype == torch.bfloat16 and tuple(logits.shape) == (M, E)
    if logits_ok:
        res["ids"] = compare_bits("ids", t["ids"], topk_total_order(logits.contiguous(), k))
    else:
        res["ids"] = StageResult("ids", "bits", FAIL, note="logits tap unusable: ids not checked")
    ids = t["ids"]
    ids_ok, ids_note = _pair_ok(ids, E, M, k)
    if logits_ok and ids_ok:
        sel = torch.gather(logits, 1, ids.long())
        res["weights"] = compare_bits(
            "weights", t["weights"], renormalize(routing_scores(sel)), note="steps 3-4 at the kernel's ids"
        )
    else:
        res["weights"] = StageResult("weights", "bits", FAIL, note=ids_note or "logits tap unusable")

    # Steps 5-8: experts, one (token, slot) pair at a time at the kernel's expert ids.
    cache: dict = {}
    if ids_ok:
        res.update(_expert_stages(path, model, wl, x, ids, t, M, k, H, cache, orders))
    else:
        for name in ("gate_acc", "up_acc", "act", "down_acc", "y"):
            kind = "accumulation" if name in ACCUMULATION_STAGES else "bits"
            res[name] = StageResult(name, kind, FAIL, note=ids_note)

    # Steps 9-10: combine (kernel weights and y) + shared, against the RETURNED output.
    tw, y = t["weights"], t["y"]
    if (
        isinstance(tw, torch.Tensor) and tw.dtype == torch.float32 and tuple(tw.shape) == (M, k)
        and isinstance(y, torch.Tensor) and y.dtype == torch.bfloat16 and tuple(y.shape) == (M, k, H)
    ):  # fmt: skip
        gold_out = add_shared(_combine_any(tw, y), shared)
        r = compare_bits("out", out, gold_out, note="combine of the kernel's weights and y, plus shared")
        tap_out = t["out"]
        if (
            isinstance(tap_out, torch.Tensor)
            and isinstance(out, torch.Tensor)
            and (tap_out.shape != out.shape or not bool(_bits_equal(tap_out, out.detach().to(dev)).all()))
        ):
            r.verdict = FAIL
            r.note += "; taps['out'] differs from the returned output"
        res["out"] = r
    else:
        res["out"] = StageResult("out", "bits", FAIL, note="weights or y tap unusable: out not checked")

    digests = {}
    if isinstance(out, torch.Tensor):
        digests["out"] = tensor_digest(out)
    for name, v in sorted(taps.items()):
        if isinstance(v, torch.Tensor):
            digests[f"taps.{name}"] = tensor_digest(v)
    stages = [res[name] for name in STAGES]
    e2e = end_to_end_taps(path, model, wl, x, router_w, shared, k, taps, out, racc=racc, cache=cache, orders=orders)
    return CaseResult(
        case_id=str(case.id),
        path=path,
        verdict=worst_verdict([*(s.verdict for s in stages), e2e.verdict]),
        stages=stages,
        meta=_meta(case, inputs, dev),
        digests=digests,
        end_to_end=e2e,
    )


def _combine_any(tw: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Step 9 on the kernel's own routing weights, bf16 values or not (``reference.combine`` insists on
    bf16 values; a kernel that skips step 4's rounding FAILs the weights stage, and its combine is still
    checked against its own weights): ``acc = fma(tw_j, y_j, acc)`` from +0, then bf16."""
    acc = torch.zeros((y.shape[0], y.shape[2]), dtype=torch.float32, device=y.device)
    y32 = y.to(torch.float32)
    for j in range(tw.shape[1]):
        acc = fma_f32(tw[:, j : j + 1].contiguous(), y32[:, j].contiguous(), acc)
    return to_bf16(acc)


def _pad_cols(acc: Accumulation, width: int) -> Accumulation:
    """``acc`` [..., W] extended to ``width`` columns with exact zero sums (bound 0: +0 or -0 accepted), for
    the padded intermediate columns whose weights are zero."""
    extra = width - acc.shape[-1]
    if extra <= 0:
        return acc

    def z(t, fill):
        return None if t is None else torch.cat([t, t.new_full((*t.shape[:-1], extra), fill)], dim=-1)

    return Accumulation(
        z(acc.exact, 0.0), z(acc.bound, 0.0), z(acc.abs_sum, 0.0), z(acc.eta_possible, False), acc.n, acc.model,
        z(acc.inner_abs_sum, 0.0), z(acc.exact_error, 0.0), z(acc.replay, 0.0),
    )  # fmt: skip


def _expert_stages(path, model, wl, x, ids, t, M, k, H, cache=None, orders=None) -> dict[str, StageResult]:
    """gate_acc, up_acc, act, down_acc, y for every (token, slot) pair, teacher-forced, one golden call per
    distinct expert over the tokens the kernel routed to it. ``cache`` (a dict) receives the golden
    accumulations for reuse by :func:`end_to_end_taps`: ``"gu"`` {expert: (tokens, Accumulation [n, 2I])},
    ``"down"`` {expert: (pairs, act rows, Accumulation)}."""
    cache = {} if cache is None else cache
    orders = orders or {}
    o_gu, o_dn = orders.get("gate_up"), orders.get("down")
    gu_model, d_model = _split_models(model)
    nv = path.startswith("nvfp4_")
    dev = x.device
    I = wl.w13.shape[1] // 2  # noqa: E741  (logical intermediate size)
    res: dict[str, StageResult] = {}
    g_tap, u_tap, a_tap = t["gate_acc"], t["up_acc"], t["act"]
    width = g_tap.shape[-1] if isinstance(g_tap, torch.Tensor) and g_tap.dim() == 3 else I
    if width < I:
        width = I
    routing = _Pairs(ids, dev)
    experts = routing.experts
    where = {e: (routing.tokens[e], routing.slots[e]) for e in experts}  # (tokens, slots), row-major

    def compute_gu(e):
        def run(tokens):  # the any-order sums; the declared order's replay is added for all experts at once
            return expert_gate_up(wl, e, x[tokens].contiguous(), nv, dev, model=gu_model)

        return run

    # gate/up accumulations: one golden call per distinct expert over its tokens, rows scattered per pair.
    g_acc, u_acc = _AccBuffer(M, k, dev), _AccBuffer(M, k, dev)  # the golden model's own assembler
    gu = {e: _gate_up_rows(cache, e, routing.uniq[e], compute_gu(e), routing.uniq_host[e]) for e in experts}
    if o_gu is not None:
        need = [e for e in experts if gu[e].replay is None]
        reps = expert_replays(wl, need, [x[routing.uniq[e]].contiguous() for e in need], nv, dev, o_gu, "w13")
        for e, r in zip(need, reps, strict=True):
            gu[e] = dataclasses.replace(gu[e], replay=r)
            if cache["gu"].get(e, (None,))[0] == routing.uniq_host[e]:
                cache["gu"][e] = (routing.uniq_host[e], gu[e])
    for e in experts:
        tokens, slots = where[e]
        acc = gu[e][routing.inv[e]]
        g_acc.put(tokens, slots, acc[..., :I])
        u_acc.put(tokens, slots, acc[..., I:])
    cache.setdefault("down", {})
    note = f"{len(experts)} experts, padded columns {width - I}" if width > I else f"{len(experts)} experts"
    res["gate_acc"] = compare_accumulation(
        "gate_acc", g_tap, _pad_cols(g_acc.get(), width), note=note, order=o_gu, replay_cols=I
    )
    res["up_acc"] = compare_accumulation(
        "up_acc", u_tap, _pad_cols(u_acc.get(), width), note=note, order=o_gu, replay_cols=I
    )

    # act from the kernel's own accumulators.
    shape3 = (M, k, width)
    g_ok = _usable(g_tap, shape3, torch.float32) and _usable(u_tap, shape3, torch.float32)
    if g_ok:
        if nv:
            gs1 = wl.w13_gs.to(dev)
            gold_act = torch.zeros(shape3, dtype=torch.bfloat16, device=dev)
            for e in experts:
                tokens, slots = where[e]
                g_e = apply_global_scale(g_tap[tokens, slots].contiguous(), gs1[e : e + 1])
                u_e = apply_global_scale(u_tap[tokens, slots].contiguous(), gs1[e : e + 1])
                gold_act[tokens, slots] = swiglu(g_e, u_e)
        else:
            gold_act = swiglu(g_tap.contiguous(), u_tap.contiguous())
        res["act"] = compare_bits("act", a_tap, gold_act)
    else:
        res["act"] = StageResult("act", "bits", FAIL, note="gate_acc/up_acc taps unusable: act not checked")

    # down accumulation on the kernel's act (logical I columns), one golden call per expert.
    d_tap, y_tap = t["down_acc"], t["y"]
    if _usable(a_tap, shape3, torch.bfloat16):
        d_acc = _AccBuffer(M, k, dev)
        acts = {e: a_tap[where[e][0], where[e][1], :I].contiguous() for e in experts}
        downs = {e: expert_down(wl, e, acts[e], nv, dev, model=d_model) for e in experts}
        if o_dn is not None:
            reps = expert_replays(wl, experts, [acts[e] for e in experts], nv, dev, o_dn, "w2")
            downs = {e: dataclasses.replace(downs[e], replay=r) for e, r in zip(experts, reps, strict=True)}
        for e in experts:
            tokens, slots = where[e]
            d_acc.put(tokens, slots, downs[e])
            cache["down"][e] = (routing.pairs[e], acts[e], downs[e])
        res["down_acc"] = compare_accumulation("down_acc", d_tap, d_acc.get(), order=o_dn)
    else:
        res["down_acc"] = StageResult("down_acc", "accumulation", FAIL, note="act tap unusable: not checked")

    # y from the kernel's own down accumulator.
    if _usable(d_tap, (M, k, H), torch.float32):
        if nv:
            gold_y = torch.zeros((M, k, H), dtype=torch.bfloat16, device=dev)
            for e in experts:
                tokens, slots = where[e]
                gold_y[tokens, slots] = expert_y(wl, e, d_tap[tokens, slots].contiguous(), True, dev)
        else:
            gold_y = down_output_bf16(d_tap.contiguous())
        res["y"] = compare_bits("y", y_tap, gold_y)
    else:
        res["y"] = StageResult("y", "bits", FAIL, note="down_acc tap unusable: y not checked")
    return res
