"""Out of device memory is never judged as a property of the kernel: the judges' broad ``except`` blocks re-raise
``torch.OutOfMemoryError`` (the runner retries it, then reports the case NOT-JUDGED), while any other error keeps
its meaning (a failed invariance or stage, a fault that does not apply)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flint_moe.conformance.judge import faults, invariance, pertoken
from flint_moe.conformance.judge.results import FAIL, NOT_JUDGED, fail_counts


def _raise(exc):
    def fn(*args, **kwargs):
        raise exc

    return fn


def _oom():
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def _cuda_inputs():
    return SimpleNamespace(x=SimpleNamespace(device=torch.device("cuda")))


def test_cuda_graph_reraises_out_of_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Stream", _raise(_oom()))
    with pytest.raises(torch.OutOfMemoryError):
        invariance.cuda_graph(None, _cuda_inputs(), None, None, None, {})
    monkeypatch.setattr(torch.cuda, "Stream", _raise(RuntimeError("capture not supported")))
    r = invariance.cuda_graph(None, _cuda_inputs(), None, None, None, {})
    assert (r.name, r.required, r.outcome, r.runs) == ("cuda_graph", True, FAIL, 1)
    assert r.note == "capture/replay raised RuntimeError: capture not supported"


def _pertoken_fakes():
    notes = {"routing_map": torch.zeros(3, 2, dtype=torch.int32), "local_expert_offset": 0, "token_capacity": None}
    inputs = SimpleNamespace(x=torch.zeros(3, 4), notes=notes, logical=SimpleNamespace(num_experts=2))
    return SimpleNamespace(path="nvfp4_pertoken_swiglu"), inputs


def test_compare_pertoken_reraises_out_of_memory(monkeypatch):
    case, inputs = _pertoken_fakes()
    monkeypatch.setattr(pertoken, "golden_stage", _raise(_oom()))
    with pytest.raises(torch.OutOfMemoryError):
        pertoken.compare_pertoken(case, inputs, {}, torch.zeros(3, 4), orders=None)


def test_diagnose_pertoken_reraises_out_of_memory():
    case, inputs = _pertoken_fakes()
    result = SimpleNamespace(failed_stages=["h"])

    def fault(exc):
        return SimpleNamespace(name="probe", stage="h", what="w", applies=lambda path: True, fn=_raise(exc))

    with pytest.raises(torch.OutOfMemoryError):
        pertoken.diagnose_pertoken(case, inputs, {}, torch.zeros(3, 4), result, [fault(_oom())])
    assert pertoken.diagnose_pertoken(case, inputs, {}, torch.zeros(3, 4), result, [fault(KeyError("h"))]) == []


def test_fault_reproduction_reraises_out_of_memory(monkeypatch):
    f = SimpleNamespace(stage="act", name="probe")
    case = SimpleNamespace(path="nvfp4_decode")
    taps = {"act": torch.zeros(2, dtype=torch.bfloat16)}
    monkeypatch.setattr(faults, "faulty_stage", _raise(_oom()))
    with pytest.raises(torch.OutOfMemoryError):
        faults._reproduces_stage(f, case, None, taps, None)
    monkeypatch.setattr(faults, "faulty_stage", _raise(ValueError("taps unusable")))
    assert faults._reproduces_stage(f, case, None, taps, None) is False
    monkeypatch.setattr(faults, "faulty_weights", _raise(_oom()))
    with pytest.raises(torch.OutOfMemoryError):
        faults._reproduces_weights(f, case, None, taps, None)
    monkeypatch.setattr(faults, "faulty_weights", _raise(faults.NotApplicable("no")))
    assert faults._reproduces_weights(f, case, None, taps, None) is False


def test_fail_counts():
    rows = [{"verdict": "FAIL"}, {"verdict": NOT_JUDGED}, SimpleNamespace(verdict="EXACT"), {"verdict": NOT_JUDGED}]
    assert fail_counts(rows) == (1, 2)
