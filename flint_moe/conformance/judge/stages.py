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

End to end (:func:`end_to_end_taps`, ``CaseResult.end_to_end``): the RETURNED output against the golden model
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
on ``inputs.x``'s device.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field

import torch

from flint_moe.reference.combine import add_shared, combine, fma_f32
from flint_moe.reference.exact import (
    FP32_RN,
    FP32_TRUNCATE,
    Accumulation,
    SummationModel,
    block_model,
    check_accumulator,
    ulp_fp32,
)
from flint_moe.reference.experts import (
    apply_global_scale,
    down_accumulate,
    down_accumulate_bf16,
    down_output,
    down_output_bf16,
    gate_up_accumulate,
    gate_up_accumulate_bf16,
    swiglu,
)
from flint_moe.reference.formats import to_bf16
from flint_moe.reference.model import _AccBuffer  # per-(token, slot) assembly, shared with the golden model
from flint_moe.reference.routing import (
    logits_from_accumulator,
    renormalize,
    router_accumulate,
    routing_scores,
    topk_total_order,
)
from flint_moe.reference.weights import BF16Experts, NVFP4Experts

__all__ = [
    "EXACT",
    "WITHIN_BOUND",
    "EXPLAINED",
    "FAIL",
    "VERDICT_ORDER",
    "STAGES",
    "ACCUMULATION_STAGES",
    "PATH_MODELS",
    "expert_models",
    "WARN_FACTOR",
    "StageResult",
    "EndToEndResult",
    "CaseResult",
    "compare_case",
    "compare_bits",
    "compare_accumulation",
    "end_to_end_taps",
    "logit_intervals",
    "routing_explained",
    "ulp_distance",
    "worst_verdict",
    "tensor_digest",
]

EXACT = "EXACT"
WITHIN_BOUND = "WITHIN-BOUND"
EXPLAINED = "EXPLAINED"
FAIL = "FAIL"
#: Verdicts from best to worst.
VERDICT_ORDER = (EXACT, WITHIN_BOUND, EXPLAINED, FAIL)

#: Stages in rule order (docs/ARCHITECTURE.md section 2).
STAGES = ("router_acc", "logits", "ids", "weights", "gate_acc", "up_acc", "act", "down_acc", "y", "out")
ACCUMULATION_STAGES = ("router_acc", "gate_acc", "up_acc", "down_acc")

#: Summation model of each path's expert reductions (the router is always FP32_RN); for nvfp4_decode the
#: CUDA-core default, the kernels' own declaration wins (:func:`expert_models`).
#: ``nvfp4_grouped``: tensor-core dots of the dequantised weights, plain any-order truncating model
#: (flint_moe/kernels/nvfp4/grouped_gate_up.py, docs/kernels/nvfp4-grouped.md).
PATH_MODELS: dict[str, SummationModel] = {
    "nvfp4_decode": block_model(16),
    "bf16_decode": FP32_RN,
    "nvfp4_grouped": FP32_TRUNCATE,
    "nvfp4_module": block_model(16),  # modules.FlintNvfp4Experts: decode or grouped by M (expert_models)
    "bf16_module": FP32_RN,  # modules.FlintBf16DecodeMoE: the BF16 decode kernels
}


def expert_models(path: str, config: str = "default", M: int | None = None) -> tuple[SummationModel, SummationModel]:
    """(gate/up model, down model): the summation models bounding a path's expert reductions.

    ``nvfp4_decode``: what the kernels declare for the launch configuration ``config`` (a
    ``cases.PATH_CONFIGS`` name; ``paths.kernel_configs`` gives its overrides),
    ``flint_moe.kernels.nvfp4.gate_up.accumulation_model()`` / ``nvfp4_down.accumulation_model()``
    (``block_model(16)`` on CUDA cores, ``FP32_TRUNCATE`` on the tensor-core (MMA) path; imported lazily, so
    TRITON_INTERPRET must be settled first, as for any kernel import). Other paths, or kernels without
    the declaration: :data:`PATH_MODELS` for both. Raises KeyError for an unknown path."""
    if path == "nvfp4_module":  # the module runs flint_moe: the decode kernels up to DECODE_MAX_TOKENS, then grouped
        from flint_moe.ops import DECODE_MAX_TOKENS

        return expert_models("nvfp4_decode" if M is None or M <= DECODE_MAX_TOKENS else "nvfp4_grouped")
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


def _split_models(model) -> tuple[SummationModel, SummationModel]:
    return tuple(model) if isinstance(model, tuple) else (model, model)


#: WARNING when an accumulation error exceeds this many times the probabilistic estimate sqrt(d) * u * S.
WARN_FACTOR = 10.0

#: Coordinates listed per stage (first failures, worst warnings).
MAX_COORDS = 5

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------


@dataclass
class StageResult:
    """Outcome of one stage of one case.

    Fields:
        stage: stage name (:data:`STAGES`). kind: ``"bits"`` (order-free step) or ``"accumulation"``.
        verdict: EXACT / WITHIN-BOUND / FAIL.
        elements: elements compared. mismatches: elements failing the stage's criterion (bits differ, or
            outside the bound for accumulations). exact: elements bitwise equal to the golden value (for
            accumulations: to RN32 of the exact sum).
        max_ulp: largest ulp distance kernel vs golden over all elements (ordered-integer keys of the
            kernel's dtype; inf where exactly one is NaN; None for integer stages such as ``ids``).
        first_failures: up to 5 coordinates (index lists) of failing elements, in row-major order.
        note: free text (why a stage could not be checked, what was compared).
        Accumulations only: model (summation model name); max_err_ulps (largest ``|kernel - exact|`` in
        binary32 ulps of the exact value); max_bound_fraction (largest ``|kernel - exact| / bound``);
        warnings (elements whose error exceeds WARN_FACTOR * sqrt(d) * u * sum|terms|, see module docs) and
        worst_warnings (up to 5 of them, worst first: {"index", "err_ulps", "ratio", "bound_fraction"}).
        map: ``maps.mismatch_map`` of the failing elements when the verdict is FAIL, else None.
        ulp_hist: ``maps.ulp_histogram`` of the ulp distances kernel vs golden (float stages), else None.
    """

    stage: str
    kind: str
    verdict: str
    elements: int = 0
    mismatches: int = 0
    exact: int = 0
    max_ulp: float | None = None
    first_failures: list[list[int]] = field(default_factory=list)
    note: str = ""
    model: str | None = None
    max_err_ulps: float | None = None
    max_bound_fraction: float | None = None
    warnings: int = 0
    worst_warnings: list[dict] = field(default_factory=list)
    map: dict | None = None
    ulp_hist: list[int] | None = None

    def to_json(self) -> dict:
        """JSON-ready dict (non-finite floats written as the strings "inf" / "nan")."""
        return _json_safe(asdict(self))


#: Causes an end-to-end difference can be traced to (``EndToEndResult.causes`` keys).
CAUSES = ("routing", "router_acc", "gate_up_acc", "down_acc", "interval")


@dataclass
class EndToEndResult:
    """The returned output against the golden model run on its own (not teacher-forced), every differing
    element traced to an accumulation difference upstream.

    Fields:
        mode: ``"taps"`` (traced through the kernel's taps) or ``"black-box"`` (intervals, ``blackbox.py``).
        verdict: EXACT (all bits equal), EXPLAINED (every differing element explained), FAIL.
        elements: output elements (M * H). differing: elements whose bits differ from the golden output
            (NaN as NaN-ness, signed zeros compared). explained / unexplained: split of ``differing``.
        nan_mismatches: elements where exactly one side is NaN. signed_zero_mismatches: +0 vs -0.
        max_ulp: largest bf16 ulp distance (inf where a NaN position differs).
        first_differences / first_failures: up to 5 coordinates [m, h] of differing / unexplained elements.
        causes: explained elements per cause (:data:`CAUSES`; the first cause found for each element).
        rows: per token row with differences: {"row", "differing", "unexplained", "causes"} (<= 64 rows).
        failure_details: up to 5 {"index", "kernel", "golden", "lo", "hi", "why"} for unexplained elements
            (lo / hi: the black-box interval of reachable outputs, None in taps mode).
        map: ``maps.mismatch_map`` of the differing elements (None when none differ).
        ulp_hist: ``maps.ulp_histogram`` of the bf16 ulp distances. note: free text.
    """

    mode: str
    verdict: str
    elements: int = 0
    differing: int = 0
    explained: int = 0
    unexplained: int = 0
    nan_mismatches: int = 0
    signed_zero_mismatches: int = 0
    max_ulp: float | None = None
    first_differences: list[list[int]] = field(default_factory=list)
    first_failures: list[list[int]] = field(default_factory=list)
    causes: dict[str, int] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)
    failure_details: list[dict] = field(default_factory=list)
    map: dict | None = None
    ulp_hist: list[int] | None = None
    note: str = ""

    def to_json(self) -> dict:
        """JSON-ready dict (non-finite floats written as the strings "inf" / "nan")."""
        return _json_safe(asdict(self))


@dataclass
class CaseResult:
    """Outcome of one case: the worst stage's verdict, every stage, output digests.

    Fields:
        case_id: ``case.id``. path: ``case.path``. verdict: worst stage verdict.
        stages: one :class:`StageResult` per entry of :data:`STAGES` (in that order).
        meta: case parameters (shape, M, k, E, H, I, profile, seed where the case has them; device).
        digests: SHA-256 (hex) of the bytes of the returned output ``out`` and of every tap tensor.
        invariance: ``invariance.InvarianceResult`` list (empty unless the runner checked them).
        diagnosis: catalogued faults reproducing a failing stage (``faults.diagnose``).
        end_to_end: :class:`EndToEndResult` (returned output vs the golden model's own run) or None.
        mode: ``"taps"`` (stage by stage) or ``"black-box"`` (``blackbox.compare_blackbox``: no stages).
    """

    case_id: str
    path: str
    verdict: str
    stages: list[StageResult]
    meta: dict = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    invariance: list = field(default_factory=list)  # invariance.InvarianceResult, filled by the runner
    diagnosis: list[str] = field(default_factory=list)  # faults.diagnose() names, for FAIL cases
    end_to_end: EndToEndResult | None = None
    mode: str = "taps"

    def stage(self, name: str) -> StageResult:
        """The result of stage ``name`` (KeyError if absent)."""
        for s in self.stages:
            if s.stage == name:
                return s
        raise KeyError(f"no stage {name!r} in case {self.case_id}")

    @property
    def failed_stages(self) -> list[str]:
        """Names of the stages whose verdict is FAIL."""
        return [s.stage for s in self.stages if s.verdict == FAIL]

    @property
    def warnings(self) -> int:
        """Total accumulation WARNING elements."""
        return sum(s.warnings for s in self.stages)

    def to_json(self) -> dict:
        """JSON-ready dict: case_id, path, mode, verdict, warnings, meta, digests, stages (list of dicts),
        end_to_end (dict or None), invariance, diagnosis (docs/ARCHITECTURE.md section 2)."""
        return {
            "case_id": self.case_id,
            "path": self.path,
            "mode": self.mode,
            "verdict": self.verdict,
            "warnings": self.warnings,
            "end_to_end": None if self.end_to_end is None else self.end_to_end.to_json(),
            "meta": _json_safe(dict(self.meta)),
            "digests": dict(self.digests),
            "stages": [s.to_json() for s in self.stages],
            "invariance": [i.to_json() for i in self.invariance],
            "diagnosis": list(self.diagnosis),
        }


def worst_verdict(verdicts) -> str:
    """The worst of ``verdicts`` in :data:`VERDICT_ORDER` (EXACT for an empty sequence)."""
    worst = 0
    for v in verdicts:
        if v not in VERDICT_ORDER:
            raise ValueError(f"unknown verdict {v!r}; expected one of {VERDICT_ORDER}")
        worst = max(worst, VERDICT_ORDER.index(v))
    return VERDICT_ORDER[worst]


def _json_safe(obj):
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 (hex) of a tensor's bytes in row-major order (dtype and shape are not part of the digest)."""
    b = t.detach().contiguous().cpu().reshape(-1)
    return hashlib.sha256(b.view(torch.uint8).numpy().tobytes()).hexdigest()


# ---------------------------------------------------------------------------------------------------------
# Element-wise metrics
# ---------------------------------------------------------------------------------------------------------


def _ordered_key(t: torch.Tensor) -> torch.Tensor:
    """int64 key monotone in the value of a float tensor (+0 and -0 share key 0); NaN keys are meaningless."""
    iv = _INT_VIEW[t.element_size()]
    b = t.contiguous().view(iv).to(torch.int64)
    mag_mask = (1 << (8 * t.element_size() - 1)) - 1
    return torch.where(b < 0, -(b & mag_mask), b)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 ulp distance of two float tensors of one dtype/shape: |key(a) - key(b)| on the ordered
    integer keys of the dtype (fp32: binary32 ulps, bf16: bf16 ulps); 0 where both are NaN, inf where exactly
    one is NaN. +0 and -0 are at distance 0 (compare bits to see the sign)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"ulp_distance: {a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}")
    na, nb = torch.isnan(a), torch.isnan(b)
    d = (_ordered_key(a) - _ordered_key(b)).abs().to(torch.float64)
    d = torch.where(na & nb, 0.0, d)
    return torch.where(na ^ nb, math.inf, d)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bool mask: bitwise equal, NaN == NaN (payload ignored), +0 != -0."""
    if not a.is_floating_point():
        return a == b
    na, nb = torch.isnan(a), torch.isnan(b)
    iv = _INT_VIEW[a.element_size()]
    eq = a.contiguous().view(iv) == b.contiguous().view(iv)
    return torch.where(na | nb, na & nb, eq)


def _coords(mask: torch.Tensor, limit: int = MAX_COORDS) -> list[list[int]]:
    return (
        [[int(i) for i in row] for row in torch.nonzero(mask)[:limit].tolist()]
        if mask.dim()
        else ([[]] if bool(mask) else [])
    )


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


def _map(mask: torch.Tensor) -> dict | None:
    from flint_moe.conformance.report.maps import mismatch_map

    return mismatch_map(mask.reshape(1, -1) if mask.dim() == 0 else mask)


def _hist(dist: torch.Tensor) -> list[int]:
    from flint_moe.conformance.report.maps import ulp_histogram

    return ulp_histogram(dist)


def compare_accumulation(stage: str, kernel: torch.Tensor | None, acc: Accumulation, *, note: str = "") -> StageResult:
    """Accumulation stage: ``kernel`` fp32 within ``acc``'s certified bound everywhere (rule "Accumulation").

    Also reports the observed error in ulps and as a fraction of the bound, and WARNING elements whose
    error exceeds ``WARN_FACTOR * (sqrt(d) * u * S + eta_term)`` (d = the model's rounding depth, S the
    exact sum of |terms|): what fp32 summation in any order practically never produces, e.g. a bf16
    accumulation or a dropped small term.
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
    if bad:
        verdict = FAIL
    elif bool(exact_bits.all()):
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
        exact=int(exact_bits.sum()),
        max_ulp=float(dist.max()) if n else None,
        map=_map(~ok) if bad else None,
        ulp_hist=_hist(dist) if n else None,
        first_failures=_coords(~ok),
        note=note,
        model=model.name,
        max_err_ulps=float(err_ulps.max()) if n else 0.0,
        max_bound_fraction=float(frac.max()) if n else 0.0,
        warnings=int(warn.sum()),
        worst_warnings=worst,
    )


# ---------------------------------------------------------------------------------------------------------
# Golden side helpers
# ---------------------------------------------------------------------------------------------------------


def _tap(taps: dict, name: str, dev: torch.device):
    t = taps.get(name)
    return t.detach().to(dev) if isinstance(t, torch.Tensor) else t


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
    """``inputs.weights_logical`` (brief) or ``inputs.logical`` (cases.CaseInputs); clear error if neither."""
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


def compare_case(case, inputs, taps: dict, out: torch.Tensor) -> CaseResult:
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
    model = expert_models(path, getattr(case, "config", "default"), int(case.M) if hasattr(case, "M") else None)
    x = inputs.x.detach()
    dev = x.device
    router_w = inputs.router_weight.detach().to(dev)
    shared = inputs.shared.detach().to(dev)
    k = int(case.k)
    M, H = x.shape
    E = router_w.shape[0]
    t = {name: _tap(taps, name, dev) for name in STAGES}
    res: dict[str, StageResult] = {}

    # Steps 1-4: routing.
    racc = router_accumulate(x, router_w)
    res["router_acc"] = compare_accumulation("router_acc", t["router_acc"], racc)
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
        res.update(_expert_stages(path, model, wl, x, ids, t, M, k, H, cache))
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
    e2e = end_to_end_taps(path, model, wl, x, router_w, shared, k, taps, out, racc=racc, cache=cache)
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
        z(acc.inner_abs_sum, 0.0), z(acc.exact_error, 0.0),
    )  # fmt: skip


class _Pairs:
    """A routing ``ids`` [M, k] grouped by expert on the host, from one device read (a per-expert
    ``nonzero`` / ``unique`` / ``tolist`` on the device would synchronise several times per expert).

    ``experts``: the distinct ids, ascending. Per expert e: ``tokens[e]``, ``slots[e]`` (device int64, the
    pairs in row-major order, as ``torch.nonzero(ids == e, as_tuple=True)``), ``uniq[e]`` (device, ascending
    distinct tokens), ``inv[e]`` (device, each pair's index into ``uniq[e]``), ``pairs[e]`` (host list of
    (token, slot)), ``uniq_host[e]`` (host tuple). The device tensors are views of one host-to-device copy."""

    def __init__(self, ids: torch.Tensor, dev: torch.device):
        import numpy as np

        h = ids.detach().to("cpu", torch.int64).numpy()
        k = h.shape[1]
        flat = h.reshape(-1)
        order = np.argsort(flat, kind="stable")  # within one expert: ascending flat index = row-major
        vals, starts = np.unique(flat[order], return_index=True)
        ends = [*starts[1:].tolist(), flat.size]
        parts, spans, off = [], {}, 0
        self.pairs: dict[int, list] = {}
        self.uniq_host: dict[int, tuple] = {}
        for e, a, b in zip(vals.tolist(), starts.tolist(), ends, strict=True):
            idx = order[a:b]
            tok, slot = idx // k, idx % k
            uq, inv = np.unique(tok, return_inverse=True)
            spans[e] = (off, len(idx), len(uq))
            parts += [tok, slot, inv.reshape(-1), uq]
            off += 3 * len(idx) + len(uq)
            self.pairs[e] = list(zip(tok.tolist(), slot.tolist(), strict=True))
            self.uniq_host[e] = tuple(uq.tolist())
        big = torch.from_numpy(np.concatenate(parts).astype(np.int64)).to(dev) if parts else None
        self.experts: list[int] = vals.tolist()
        self.tokens, self.slots, self.inv, self.uniq = {}, {}, {}, {}
        for e, (o, n, u) in spans.items():
            self.tokens[e], self.slots[e] = big[o : o + n], big[o + n : o + 2 * n]
            self.inv[e], self.uniq[e] = big[o + 2 * n : o + 3 * n], big[o + 3 * n : o + 3 * n + u]


def _gate_up_rows(cache: dict, e: int, tokens: torch.Tensor, compute, host: tuple) -> Accumulation:
    """Golden gate/up Accumulation [len(tokens), 2I] of expert ``e`` for the (sorted, unique) ``tokens``
    (device; ``host``: the same tokens as a host tuple): from ``cache["gu"][e] = (host tokens, Accumulation)``
    when it covers them, else computed (``compute(tokens)``) and cached. Rows are independent, so a subset
    gives the same values as all M tokens."""
    gu = cache.setdefault("gu", {})
    hit = gu.get(e)
    if hit is not None:
        have, acc = hit
        if have == host:
            return acc
        at = {t: i for i, t in enumerate(have)}
        if all(t in at for t in host):
            return acc[torch.tensor([at[t] for t in host], dtype=torch.int64).to(tokens.device)]
    acc = compute(tokens)
    gu[e] = (host, acc)
    return acc


def _expert_stages(path, model, wl, x, ids, t, M, k, H, cache=None) -> dict[str, StageResult]:
    """gate_acc, up_acc, act, down_acc, y for every (token, slot) pair, teacher-forced, one golden call per
    distinct expert over the tokens the kernel routed to it. ``cache`` (a dict) receives the golden
    accumulations for reuse by :func:`end_to_end_taps`: ``"gu"`` {expert: (tokens, Accumulation [n, 2I])},
    ``"down"`` {expert: (pairs, act rows, Accumulation)}."""
    cache = {} if cache is None else cache
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
        def run(tokens):
            xs = x[tokens].contiguous()
            w13 = wl.w13[e].to(dev)
            if nv:
                return gate_up_accumulate(xs, w13, wl.w13_scale[e].to(dev), model=gu_model)
            return gate_up_accumulate_bf16(xs, w13, model=gu_model)

        return run

    # gate/up accumulations: one golden call per distinct expert over its tokens, rows scattered per pair.
    g_acc, u_acc = _AccBuffer(M, k, dev), _AccBuffer(M, k, dev)  # the golden model's own assembler
    for e in experts:
        tokens, slots = where[e]
        uniq, inv = routing.uniq[e], routing.inv[e]
        acc = _gate_up_rows(cache, e, uniq, compute_gu(e), routing.uniq_host[e])[inv]
        g_acc.put(tokens, slots, acc[..., :I])
        u_acc.put(tokens, slots, acc[..., I:])
    cache.setdefault("down", {})
    note = f"{len(experts)} experts, padded columns {width - I}" if width > I else f"{len(experts)} experts"
    res["gate_acc"] = compare_accumulation("gate_acc", g_tap, _pad_cols(g_acc.get(), width), note=note)
    res["up_acc"] = compare_accumulation("up_acc", u_tap, _pad_cols(u_acc.get(), width), note=note)

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
        for e in experts:
            tokens, slots = where[e]
            act_e = a_tap[tokens, slots, :I].contiguous()
            w2 = wl.w2[e].to(dev)
            if nv:
                acc = down_accumulate(act_e, w2, wl.w2_scale[e].to(dev), model=d_model)
            else:
                acc = down_accumulate_bf16(act_e, w2, model=d_model)
            d_acc.put(tokens, slots, acc)
            cache["down"][e] = (routing.pairs[e], act_e, acc)
        res["down_acc"] = compare_accumulation("down_acc", d_tap, d_acc.get())
    else:
        res["down_acc"] = StageResult("down_acc", "accumulation", FAIL, note="act tap unusable: not checked")

    # y from the kernel's own down accumulator.
    if _usable(d_tap, (M, k, H), torch.float32):
        if nv:
            gs2 = wl.w2_gs.to(dev)
            gold_y = torch.zeros((M, k, H), dtype=torch.bfloat16, device=dev)
            for e in experts:
                tokens, slots = where[e]
                gold_y[tokens, slots] = down_output(d_tap[tokens, slots].contiguous(), gs2[e : e + 1])
        else:
            gold_y = down_output_bf16(d_tap.contiguous())
        res["y"] = compare_bits("y", y_tap, gold_y)
    else:
        res["y"] = StageResult("y", "bits", FAIL, note="down_acc tap unusable: y not checked")
    return res


def _usable(t, shape, dtype) -> bool:
    return isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(shape) and t.dtype == dtype


# ---------------------------------------------------------------------------------------------------------
# End to end: the returned output against the golden model's own run, every difference traced upstream
# ---------------------------------------------------------------------------------------------------------

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


def _golden_own(path, model, wl, x, router_w, shared, k, racc, cache):
    """The golden model on its own (rule steps 1-10, every accumulation RN32 of its exact sum): dict of
    logits, ids, weights, gate/up (rounded accumulators, logical I), act, down (rounded), y, out."""
    gu_model, d_model = _split_models(model)
    nv = path.startswith("nvfp4_")
    dev = x.device
    M, H = x.shape
    I = wl.w13.shape[1] // 2  # noqa: E741
    logits = logits_from_accumulator(racc.exact.to(torch.float32))
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
            w13 = wl.w13[e].to(dev)
            xs = x[rows].contiguous()
            if nv:
                return gate_up_accumulate(xs, w13, wl.w13_scale[e].to(dev), model=gu_model)
            return gate_up_accumulate_bf16(xs, w13, model=gu_model)

        uniq, inv = routing.uniq[e], routing.inv[e]
        r = _gate_up_rows(cache, e, uniq, run, routing.uniq_host[e]).exact.to(torch.float32)[inv]
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
            dr[~redo] = prev[2].exact.to(torch.float32)[~redo]
        if bool(redo.any()):
            a_r = a_e[redo].contiguous()
            if nv:
                d = down_accumulate(a_r, wl.w2[e].to(dev), wl.w2_scale[e].to(dev), model=d_model)
            else:
                d = down_accumulate_bf16(a_r, wl.w2[e].to(dev), model=d_model)
            dr[redo] = d.exact.to(torch.float32)
        y_e = down_output(dr, wl.w2_gs[e : e + 1].to(dev)) if nv else down_output_bf16(dr)
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
    path, model, wl, x, router_w, shared, k, taps: dict, out, *, racc=None, cache=None
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
    :class:`EndToEndResult` (mode ``"taps"``).
    """
    dev = x.device
    M, H = x.shape
    I = wl.w13.shape[1] // 2  # noqa: E741
    racc = router_accumulate(x, router_w) if racc is None else racc
    gold = _golden_own(path, model, wl, x, router_w, shared, k, racc, {} if cache is None else cache)
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
