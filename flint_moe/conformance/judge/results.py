"""Result types of the conformance judgement and their JSON form: verdicts, stage names, ``StageResult``,
``EndToEndResult``, ``CaseResult`` and ``worst_verdict`` (the verdict order docs/ARCHITECTURE.md section 2
gives: EXACT < WITHIN-BOUND < EXPLAINED < FAIL; the first three pass).

The comparisons that fill these are :mod:`flint_moe.conformance.judge.stages` (stage by stage) and
:mod:`flint_moe.conformance.judge.explain` (end to end); ``to_json()`` writes non-finite floats as the
strings "inf" / "nan" (:func:`_json_safe`), so a report is strict JSON.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

__all__ = [
    "EXACT",
    "WITHIN_BOUND",
    "EXPLAINED",
    "FAIL",
    "NOT_JUDGED",
    "VERDICT_ORDER",
    "STAGES",
    "ACCUMULATION_STAGES",
    "CAUSES",
    "StageResult",
    "EndToEndResult",
    "CaseResult",
    "worst_verdict",
    "fail_counts",
]

EXACT = "EXACT"
WITHIN_BOUND = "WITHIN-BOUND"
EXPLAINED = "EXPLAINED"
FAIL = "FAIL"
#: Verdicts from best to worst.
VERDICT_ORDER = (EXACT, WITHIN_BOUND, EXPLAINED, FAIL)
#: A case the runner could not judge: it ran out of device memory on every attempt (``runner.raised_result``). Not a
#: pass and not a FAIL of the kernel: outside :data:`VERDICT_ORDER`, counted apart in the totals, exit status 1.
NOT_JUDGED = "NOT-JUDGED"

#: Stages in rule order (docs/ARCHITECTURE.md section 2).
STAGES = ("router_acc", "logits", "ids", "weights", "gate_acc", "up_acc", "act", "down_acc", "y", "out")
ACCUMULATION_STAGES = ("router_acc", "gate_acc", "up_acc", "down_acc")


@dataclass
class StageResult:
    """Outcome of one stage of one case.

    Fields:
        stage: stage name (:data:`STAGES`). kind: ``"bits"`` (order-free step) or ``"accumulation"``.
        verdict: EXACT / WITHIN-BOUND / FAIL.
        elements: elements compared. mismatches: elements failing the stage's criterion (bits differ, or
            outside the bound for accumulations). exact: elements bitwise equal to the golden value (for
            accumulations: to the replay of the kernel's declared order where the stage replays one, else to
            RN32 of the exact sum).
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


def fail_counts(results) -> tuple[int, int]:
    """(FAIL cases, NOT-JUDGED cases) of ``results`` (``CaseResult`` objects or their JSON dicts): either makes a
    run's exit status 1."""
    verdicts = [r["verdict"] if isinstance(r, dict) else r.verdict for r in results]
    return verdicts.count(FAIL), verdicts.count(NOT_JUDGED)


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
