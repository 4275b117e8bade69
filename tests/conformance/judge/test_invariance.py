"""flint_moe.conformance.judge.invariance on tiny interpreter cases (the builders of test_stages.py).

The real kernels pass determinism and row independence; a path that adds noise on its 2nd call fails
determinism, a path that mixes rows fails row independence; CUDA-graph replay is skipped with a reason on
the CPU; batch invariance is measured, never a FAIL.
"""

from __future__ import annotations

import json

import pytest
import torch

from flint_moe.conformance.judge.invariance import (
    FAIL,
    MEASURED,
    PASS,
    SKIP,
    check_invariances,
    determinism,
    production_build,
    required_failed,
    row_independence,
)
from flint_moe.conformance.judge.stages import compare_case
from tests.conformance.judge import test_stages as TC


class _Path:
    """A KernelPath stand-in running the tiny case's op (the real kernel); ``mutate(call, out) -> out``."""

    def __init__(self, case, mutate=None):
        self.case, self.mutate, self.calls = case, mutate, 0

    def run(self, inputs, counter, taps=None):
        from flint_moe.ops import flint_moe, flint_moe_bf16_decode

        self.calls += 1
        if self.case.path == "nvfp4_decode":
            out = flint_moe(inputs.x, inputs.router_weight, inputs.stored, self.case.k, counter, inputs.shared,
                            taps=taps)  # fmt: skip
        else:
            g1, g2, maps = inputs.stored
            out = flint_moe_bf16_decode(inputs.x, inputs.router_weight, g1, g2, maps, self.case.k, counter,
                                        inputs.shared, taps=taps)  # fmt: skip
        return out if self.mutate is None else self.mutate(self.calls, inputs, out)


def _with_stored(built):
    case, inputs, taps, out = built
    if not hasattr(inputs, "stored"):  # the bf16 builder keeps no stored layout: rebuild it
        from flint_moe.layouts import pad_intermediate_bf16, to_trtllm_bf16, trtllm_bf16_row_maps

        wl = inputs.weights_logical
        w13p, w2p, ip = pad_intermediate_bf16(wl.w13, wl.w2, 128)
        g1, g2 = to_trtllm_bf16(w13p, w2p)
        inputs.stored = (g1, g2, trtllm_bf16_row_maps(inputs.x.shape[1], ip))
    return case, inputs, taps, out


@pytest.fixture(scope="module", params=["nvfp4", "bf16"])
def built(request):
    return _with_stored(TC._build_nvfp4() if request.param == "nvfp4" else TC._build_bf16())


def _counter():
    from flint_moe.ops import make_route_counter

    return make_route_counter("cpu")


def test_real_kernels_pass(built) -> None:
    case, inputs, taps, out = built
    res = check_invariances(case, inputs, _Path(case), _counter(), out, taps)
    by = {r.name: r for r in res}
    assert by["production_build"].outcome == PASS and by["production_build"].required
    assert by["determinism"].outcome == PASS and by["determinism"].runs == 2
    assert by["row_independence"].outcome == PASS, by["row_independence"].note
    assert by["cuda_graph"].outcome == SKIP and "CUDA" in by["cuda_graph"].note
    assert by["batch_invariance"].outcome == MEASURED and not by["batch_invariance"].required
    assert by["batch_invariance"].details["rows"] == case.M
    assert required_failed(res) == []
    json.dumps([r.to_json() for r in res])
    cr = compare_case(case, inputs, taps, out)
    cr.invariance = res
    assert [i["name"] for i in cr.to_json()["invariance"]] == [r.name for r in res]


def test_production_only_fault_fails_production_build(built) -> None:
    """A fault in the build without taps (the one a server runs) fails, naming the first differing element;
    the clean path passes."""
    case, inputs, taps, out = built

    class _ProdFault(_Path):
        def run(self, inputs, counter, taps=None):
            o = super().run(inputs, counter, taps)
            if taps is None:
                o = o.clone()
                o.view(torch.int16)[1, 2] ^= 1
            return o

    r = production_build(case, inputs, _ProdFault(case), _counter(), out, taps)
    assert r.outcome == FAIL and r.failed and r.details == {"differing_elements": 1, "first": [1, 2]}
    assert "no taps" in r.note
    assert production_build(case, inputs, _Path(case), _counter(), out, taps).outcome == PASS


def test_noise_on_second_call_fails_determinism(built) -> None:
    case, inputs, taps, out = built

    def noisy(call, _inputs, o):
        if call == 2:
            o = o.clone()
            o.view(torch.int16)[0, 1] ^= 1
        return o

    r = determinism(case, inputs, _Path(case, noisy), _counter(), out, taps, repeats=3)
    assert r.outcome == FAIL and r.failed and "out" in r.details["differing"]


def test_row_mixing_fails_row_independence(built) -> None:
    case, inputs, taps, out = built

    def mix(call, inp, o):  # row 0 picks up a trace of row 1's input
        o = o.clone()
        o[0] = (o[0].float() + inp.x[1].float() * 0.5).to(o.dtype)
        return o

    p = _Path(case, mix)
    base_taps: dict = {}
    base = p.run(inputs, _counter(), base_taps)
    r = row_independence(case, inputs, p, _counter(), base, base_taps)
    assert r.outcome == FAIL and r.failed and 0 in r.details["rows_differing"]
    assert r.details["differing"] == ["out"]
    # and a clean path is deterministic on the same data
    assert determinism(case, inputs, _Path(case), _counter(), out, taps).outcome == PASS


def test_report_lists_invariances(tmp_path, built) -> None:
    from flint_moe.conformance.report.report import write_report

    case, inputs, taps, out = built
    cr = compare_case(case, inputs, taps, out)
    cr.invariance = check_invariances(case, inputs, _Path(case), _counter(), out, taps, repeats=2)
    paths = write_report([cr], {"backend": "cpu"}, tmp_path)
    md = paths["summary_full"].read_text()
    assert "## Invariances" in md and "No required invariance failed." in md and "Batch invariance:" in md
    data = json.loads(paths["json"].read_text())
    assert {i["name"] for i in data["cases"][0]["invariance"]} == {
        "production_build",
        "determinism",
        "row_independence",
        "cuda_graph",
        "batch_invariance",
    }


def test_cli_invariance_flag(tmp_path) -> None:
    from flint_moe.conformance.__main__ import main

    argv = ["--profile", "cpu", "--filter", "/M1/", "--filter", "cpu-E6-H96-I48-P64-k3", "--out", str(tmp_path)]
    assert main([*argv, "--invariance"]) == 0
    case = json.loads((tmp_path / "report.json").read_text())["cases"][0]
    by = {i["name"]: i["outcome"] for i in case["invariance"]}
    assert by == {"production_build": PASS, "determinism": PASS, "row_independence": SKIP, "cuda_graph": SKIP,
                  "batch_invariance": SKIP}  # fmt: skip
    assert case["diagnosis"] == []
    assert "## Invariances" in (tmp_path / "summary-full.md").read_text()


def test_batch_invariance_samples_rows_of_large_batches(built, monkeypatch) -> None:
    from flint_moe.conformance.judge import invariance as inv

    case, inputs, taps, out = built
    big = inv._with(inputs, x=torch.cat([inputs.x, inputs.x.flip(0)]), shared=torch.cat([inputs.shared] * 2))
    M = big.x.shape[0]
    assert M == 2 * case.M >= 4
    path = _Path(case)
    out_big = path.run(big, _counter())
    monkeypatch.setattr(inv, "BATCH_INVARIANCE_ROWS", 3)
    r = inv.batch_invariance(case, big, path, _counter(), out_big, None)
    assert path.calls == 1 + 3 and r.runs == 3  # the first, a middle and the last token alone
    assert r.details["rows"] == 3 and r.details["rows_total"] == M
    assert r.details["rows_equal"] + len(r.details["rows_differing"]) == 3
    assert set(r.details["rows_differing"]) <= {0, round((M - 1) / 2), M - 1}
    assert f"of {M}" in r.note
