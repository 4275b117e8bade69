"""Hand-built conformance results shared by the report / html / baseline tests (no kernel runs)."""

from __future__ import annotations

import torch

from flint_moe.conformance.judge.invariance import InvarianceResult
from flint_moe.conformance.judge.results import CaseResult, StageResult
from flint_moe.conformance.report.maps import mismatch_map, ulp_histogram

META = {"shape": "cpu-E6-H96-I64-k3", "k": 3, "E": 6, "H": 96, "I": 64, "profile": "gaussian"}


def stage(name, kind, verdict, **kw) -> StageResult:
    return StageResult(stage=name, kind=kind, verdict=verdict, **kw)


def ok_case(M: int = 1, path: str = "nvfp4_decode", seed: int = 0) -> CaseResult:
    """WITHIN-BOUND: router_acc 6*M elements, 5*M exact to RN32; out 96*M elements all exact."""
    stages = [
        stage("router_acc", "accumulation", "WITHIN-BOUND", elements=6 * M, exact=5 * M, max_ulp=2.0,
              model="fp32-rn", max_err_ulps=1.5, max_bound_fraction=0.0125),
        stage("out", "bits", "EXACT", elements=96 * M, exact=96 * M, max_ulp=0.0),
    ]  # fmt: skip
    return CaseResult(
        case_id=f"{path}/cpu-E6-H96-I64-k3/M{M}/gaussian/s{seed}", path=path, verdict="WITHIN-BOUND",
        stages=stages, meta=dict(META, M=M, seed=seed), digests={"out": f"{seed:064x}", "taps.y": "a" * 64},
    )  # fmt: skip


def fail_case() -> CaseResult:
    """FAIL at act (2 of 3*3*64 = 576 elements, max ulp 3) with a WARNING in gate_acc; diagnosed."""
    bad = torch.zeros(3, 3, 64, dtype=torch.bool)
    bad[0, 1, 2] = bad[2, 0, 63] = True
    stages = [
        stage("gate_acc", "accumulation", "WITHIN-BOUND", elements=576, exact=500, max_ulp=40.0, model="block16",
              max_err_ulps=40.0, max_bound_fraction=0.5, warnings=1,
              worst_warnings=[{"index": [1, 2, 3], "err_ulps": 40.0, "ratio": 12.5}]),
        stage("act", "bits", "FAIL", elements=576, mismatches=2, exact=574, max_ulp=3.0,
              first_failures=[[0, 1, 2], [2, 0, 63]]),
    ]  # fmt: skip
    r = CaseResult(
        case_id="nvfp4_decode/cpu-E6-H96-I64-k3/M3/tied_logits/s0", path="nvfp4_decode", verdict="FAIL",
        stages=stages, meta=dict(META, M=3, profile="tied_logits", seed=0), digests={"out": "f" * 64},
        diagnosis=["act_rounded_twice: matches the reference with act rounded twice"],
        invariance=[
            InvarianceResult("determinism", True, "PASS", runs=2),
            InvarianceResult("row_independence", True, "FAIL", runs=2, note="row 1 differs in out"),
            InvarianceResult("batch_invariance", False, "MEASURED", runs=3, note="rows 0, 2 differ",
                             details={"rows": 3, "rows_equal": 1, "rows_differing": [0, 2], "max_ulp": 1.0}),
        ],
    )  # fmt: skip
    d = r.to_json()
    d["stages"][1]["map"] = mismatch_map(bad)
    d["stages"][1]["ulp_hist"] = ulp_histogram(torch.tensor([0.0] * 574 + [3.0, 1.0]))
    return d


def black_box_explained() -> dict:
    """A black-box (no taps) bf16 case, EXPLAINED end to end: 4 of 2*192 = 384 output elements differ."""
    bad = torch.zeros(2, 192, dtype=torch.bool)
    bad[0, 1] = bad[0, 100] = bad[1, 2] = bad[1, 191] = True
    return {
        "case_id": "bf16_decode/cpu-E6-H192-I192-k3/M2/asymmetric/s0", "path": "bf16_decode",
        "verdict": "EXPLAINED", "mode": "black-box", "meta": dict(META, shape="cpu-E6-H192-I192-k3", M=2, H=192, I=192),
        "digests": {"out": "e" * 64}, "stages": [], "invariance": [], "diagnosis": [], "warnings": 0,
        "end_to_end": {
            "mode": "black-box", "verdict": "EXPLAINED", "elements": 384, "differing": 4, "explained": 4,
            "unexplained": 0, "nan_mismatches": 0, "signed_zero_mismatches": 0, "max_ulp": 1.0,
            "first_differences": [[0, 1], [0, 100], [1, 2], [1, 191]], "first_failures": [],
            "causes": {"interval": 4}, "rows": [{"row": 0, "differing": 2, "unexplained": 0, "causes": ["interval"]},
                                                {"row": 1, "differing": 2, "unexplained": 0, "causes": ["interval"]}],
            "failure_details": [], "map": mismatch_map(bad), "note": "",
        },
    }  # fmt: skip


MUTATION = {
    "killed": 3, "named": 2, "total": 4, "kill_rate": 0.5, "catalogue": ["gate_up_swapped", "nibble_swap",
    "act_rounded_twice", "no_epsilon"],
    "results": [
        {"fault": "gate_up_swapped", "path": "nvfp4_decode", "case_id": "c1", "injection": "weights", "killed": True,
         "named": True, "verdict": "FAIL", "failed_stages": ["act"], "diagnosis": ["gate_up_swapped: ..."], "note": ""},
        {"fault": "nibble_swap", "path": "nvfp4_decode", "case_id": "c1", "injection": "weights", "killed": True,
         "named": True, "verdict": "FAIL", "failed_stages": ["gate_acc"], "diagnosis": ["nibble_swap: ..."],
         "note": ""},
        {"fault": "act_rounded_twice", "path": "nvfp4_decode", "case_id": "c1", "injection": "tap", "killed": True,
         "named": False, "verdict": "FAIL", "failed_stages": ["act"], "diagnosis": [], "note": ""},
        {"fault": "no_epsilon", "path": "nvfp4_decode", "case_id": "c2", "injection": "path", "killed": False,
         "named": False, "verdict": "WITHIN-BOUND", "failed_stages": [], "diagnosis": [], "note": ""},
    ],
}  # fmt: skip


def results() -> list:
    """Mixed list: CaseResult objects and to_json() dicts (both are accepted by report.py)."""
    return [ok_case(1), fail_case(), ok_case(2, seed=1), black_box_explained(), ok_case(1, "bf16_decode")]
