"""sm_90 PTX audit of every kernel specialisation the conformance matrix launches (on the CPU, in CI).

``flint_moe.conformance.audit`` records the launches of every case of ``cases.matrix("gpu")`` and
``matrix("cpu")`` and the paths pending their first H200 run (every path and PATH_CONFIGS entry, tapped and
production builds; the decode block's Triton router, its CuTe DSL kernels being test_cute_ptx.py's) on fake
CUDA tensors, deduplicates them by (kernel, argument types, constexprs, compile options), and turns the ones no kernel
module's ``audit_specs()`` covers into audit specs (``matrix.<kernel>...``) with that kernel's own
require / forbid lists. This module:

- derives them once per pytest worker (subprocess ``python -m flint_moe.conformance.audit report``, without
  ``TRITON_INTERPRET``: the recorder needs real JITFunctions);
- ``test_matrix_launches_are_all_audited``: fails when a matrix case launches a specialisation that neither a
  kernel module's spec nor a derived spec covers, when a case launches no kernel, or when a path launches
  fewer kernels than its op runs (the recorder would be blind to part of it);
- ``test_matrix_ptx_audit[k]``: compiles the derived specs ``k::CHUNKS`` for sm_90 and audits their PTX (one
  subprocess per chunk, like tests/kernels/test_ptx_audit.py, so pytest-xdist spreads them);
- ``test_new_matrix_shape_is_caught``: a matrix with one more shape launches specialisations the kernel
  modules' registry lacks, and the derivation covers them;
- ``test_self_test_cases_are_recorded``: the mutation self-test's CUDA cases (catalogued mutations outside the
  decode block, sub-bound cases) are recorded, each with its one tapped run of the default path;
- ``test_case_runs_follow_the_invariances``: a case records the runs the harness makes (no M = 1 run for the
  per-token paths, whose batch invariance is skipped; no extra default-path run for a launch configuration);
- ``test_matrix_audit_reports_problems``: the ``--specs`` audit path really compiles and reports a missing
  instruction;
- ``test_stable_cache_keys``: two processes compute the same kernel cache keys (Triton's on-disk cache serves
  reruns) and the same PTX, and Triton's launch-time check of the kernels' globals passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BACKEND = "any"
ROOT = Path(__file__).resolve().parents[2]
#: Fixed number of audit chunks (the derived specs are known only after the derivation subprocess; spec i goes
#: to chunk i % CHUNKS). About 12 compiles per chunk at today's ~250 derived specs (each subprocess spends
#: ~3 s importing torch / triton / the kernels, about two compiles' worth).
CHUNKS = 20


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout
    )


def _json_tail(proc: subprocess.CompletedProcess, ok: tuple[int, ...] = (0,)):
    if proc.returncode not in ok or not proc.stdout.strip():
        pytest.fail(f"subprocess failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def matrix_report(tmp_path_factory) -> dict:
    """``coverage_report()`` of the current matrix, and the derived records written to a JSON file."""
    report = _json_tail(_run(["-m", "flint_moe.conformance.audit", "report"]))
    path = tmp_path_factory.mktemp("matrix_audit") / "specs.json"
    path.write_text(json.dumps(report["records"]))
    report["specs_file"] = str(path)
    return report


#: Kernels each path's op launches (flint_moe/ops: route -> GEMV+top-k for M <= ROUTE_GEMV_MAX_TOKENS, the router
#: GEMM + top-k above; decode gate/up + split-K down; grouped gate/up + down + combine above ``flint_moe``'s
#: per-shape limit, ``ops.decode_max_tokens(E, k)``; on the fake H200 the grouped GEMMs' default engine,
#: ``grouped_gate_up.default_engine``: the Gluon kernels at row blocks of 16 pairs, the Triton ones where those
#: refuse the shape (the CPU shapes' short reductions); the engine config cases add the warp-specialised kernel).
_ROUTER = {"router._router_gemv_topk_kernel"}
_NVFP4_DECODE = _ROUTER | {"nvfp4.gate_up._nvfp4_gate_up_kernel", "nvfp4.down_combine._nvfp4_down_split_kernel"}
_GROUPED = _ROUTER | {
    "router._topk_kernel",
    "nvfp4.grouped_gate_up._grouped_gate_up_kernel",
    "nvfp4.grouped_down._grouped_down_kernel",
    "nvfp4.grouped_down._grouped_combine_kernel",
    "nvfp4.grouped_gluon._gluon_gate_up_kernel",
    "nvfp4.grouped_gluon._gluon_down_kernel",
}
_BF16 = _ROUTER | {"bf16.gate_up._bf16_gate_up_kernel", "bf16.down_combine._bf16_down_combine_kernel"}
#: The per-token op (no router): the per-token quantizer (of the tokens and of FC2's input, each writing the
#: operand's exact values), FC1 + activation, FC2 and the weighted combine.
_PERTOKEN = {
    "nvfp4.pertoken_quant._pertoken_quant_kernel",
    "nvfp4.pertoken_fc1._pertoken_fc1_kernel",
    "nvfp4.pertoken_fc2._pertoken_fc2_kernel",
    "nvfp4.pertoken_fc2._pertoken_combine_kernel",
}
EXPECTED_KERNELS = {
    "nvfp4_decode": _NVFP4_DECODE,
    "nvfp4_grouped": _GROUPED | {"nvfp4.grouped_gluon_ws._ws_grouped_kernel"},
    "nvfp4_module": _NVFP4_DECODE | _GROUPED,
    "bf16_decode": _BF16,
    "bf16_module": _BF16,
    "nvfp4_dispatch": _NVFP4_DECODE | _GROUPED,
    "nvfp4_pertoken_swiglu": _PERTOKEN,
    "nvfp4_pertoken_relu2": _PERTOKEN,
    # the decode block's Triton kernel (its CuTe DSL kernels: tests/kernels/test_cute_ptx.py)
    "ll_block": {"ll_router._ll_router_kernel"},
    "ll_module": {"ll_router._ll_router_kernel"},
}


def test_matrix_launches_are_all_audited(matrix_report: dict) -> None:
    """Every specialisation any matrix case launches is in the audit registry (kernel modules' + derived)."""
    r = matrix_report
    assert r["uncovered"] == [], f"{len(r['uncovered'])} matrix launches not audited, e.g. {r['uncovered'][:3]}"
    assert r["cases"] > 0 and r["silent_cases"] == [], f"cases that launched no kernel: {r['silent_cases'][:5]}"
    assert sorted(r["kernels_by_path"]) == sorted(EXPECTED_KERNELS)
    for path, kernels in r["kernels_by_path"].items():  # the recorder sees the whole op of every path
        assert EXPECTED_KERNELS[path] <= set(kernels), (path, kernels)
    names = [rec["name"] for rec in r["records"]]
    assert len(names) == len(set(names)) and all(n.startswith("matrix.") for n in names)
    # every derived spec is a launch the kernel modules' registry lacks, and its kernel has specs there
    for kernel, (launches, covered, module_specs) in r["per_kernel"].items():
        derived = sum(rec["kernel"].endswith(":" + kernel.split(".")[-1]) for rec in r["records"])
        assert derived == launches - covered, kernel
        assert launches == 0 or module_specs > 0, kernel


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_matrix_ptx_audit(chunk: int, matrix_report: dict) -> None:
    names = [rec["name"] for rec in matrix_report["records"]][chunk::CHUNKS]
    if not names:
        return  # fewer derived specs than chunks: nothing left for this one (the coverage test counts them)
    proc = _run(["-m", "flint_moe.conformance.audit", "audit", "--specs", matrix_report["specs_file"], *names])
    result = _json_tail(proc, ok=(0, 1))
    assert sorted(result) == sorted(names)
    bad = {n: p for n, p in result.items() if p}
    assert not bad, "\n".join(f"{n}: " + "; ".join(p) for n, p in sorted(bad.items()))


_NEW_SHAPE = """
import json
from flint_moe.conformance import audit as A
from flint_moe.conformance.inputs import cases as C
from flint_moe.kernels.audit.registry import collect_audit_specs
s = C.ShapeSpec("audit-probe", 48, 3584, 1792, 6)
C.SHAPES[s.name] = s
C.matrix = lambda profile: [C.Case.make("nvfp4_decode", s, 1, "gaussian"), C.Case.make("bf16_decode", s, 2, "gaussian")]
C.pending_gpu_cases = lambda: []
A.self_test_cases = lambda: []
launches = A.matrix_launches(("gpu",))
before = A.uncovered_launches(launches, collect_audit_specs())
names = A.register_matrix_audit(("gpu",))
after = A.uncovered_launches(launches, collect_audit_specs())
print(json.dumps([len(launches), sorted(ln.kernel_name for ln, _ in before.values()), len(names), len(after)]))
"""


def test_new_matrix_shape_is_caught() -> None:
    """A shape the kernel modules never registered (H 3584, I 1792, E 48, k 6): its launches are missing from the
    modules' registry, and ``register_matrix_audit`` adds exactly those."""
    n_launches, before, n_names, n_after = _json_tail(_run(["-c", _NEW_SHAPE]))
    # per path: the router, gate/up and down kernels, each a production and a tapped build
    assert n_launches == 10  # the router GEMV+top-k for E48/k6 at H 3584 is shared by both paths
    assert sorted(before) == sorted(
        ["router._router_gemv_topk_kernel"] * 2
        + ["nvfp4.gate_up._nvfp4_gate_up_kernel"] * 2
        + ["nvfp4.down_combine._nvfp4_down_split_kernel"] * 2
        + ["bf16.gate_up._bf16_gate_up_kernel"] * 2
        + ["bf16.down_combine._bf16_down_combine_kernel"] * 2
    )
    assert (n_names, n_after) == (10, 0)


_SELF_TEST = """
import json
from flint_moe.conformance import audit as A
from flint_moe.conformance.inputs import cases as C
C.matrix = lambda profile: []
C.pending_gpu_cases = lambda: []
ids = [c.id for c in A.self_test_cases()]
recorded = {}
for ln, cs in A.matrix_launches(("gpu",)).values():
    for cid in cs:
        recorded.setdefault(cid, []).append([ln.kernel_name, dict(ln.constexprs).get("TAP")])
print(json.dumps([ids, {k: sorted(v) for k, v in recorded.items()}]))
"""

#: The mutation self-test's CUDA cases: the catalogued mutations' (decode block left out), then the sub-bound ones.
SELF_TEST_IDS = [
    "nvfp4_decode/cpu-E6-H96-I64-k3/M2/gaussian/s0",
    "bf16_decode/mut-E6-H128-I64-k3/M2/gaussian/s0",
    "nvfp4_decode/mut-E6-H96-I128-k3/M2/gaussian/s0",
    "nvfp4_decode/cpu-E6-H96-I64-k3/M2/asymmetric/s0",
    "nvfp4_decode/cpu-E6-H96-I64-k3/M2/tied_logits/s0",
    "bf16_decode/mut-E6-H128-I64-k3/M2/tied_logits/s0",
    "nvfp4_decode/cpu-E6-H96-I64-k3/M2/tiny_sigmoids/s0",
    "nvfp4_grouped/mut-E6-H256-I256-k3/M2/gaussian/s0",
    "nvfp4_pertoken_swiglu/pt-cpu-E5-H160-I176-P256-k3/M2/gaussian/s0",
    "nvfp4_pertoken_relu2/pt-cpu-E5-H160-I176-P256-k3/M2/gaussian/s0",
    "nvfp4_pertoken_swiglu/pt-cpu-E5-H160-I176-P256-k3/M2/dispatcher/s0",
    "nvfp4_decode/deepseek-v3/M1/gaussian/s0",
    "bf16_decode/qwen3-30b-a3b/M1/gaussian/s0",
]


def test_self_test_cases_are_recorded() -> None:
    """``matrix_launches(("gpu",))`` records the self-test's CUDA cases (here with an empty matrix): every case,
    each with one tapped run of its default path (the pertoken quantiser has no TAP)."""
    ids, recorded = _json_tail(_run(["-c", _SELF_TEST]))
    assert ids == SELF_TEST_IDS
    assert sorted(recorded) == sorted(SELF_TEST_IDS)
    tapped = {
        "nvfp4_decode": [
            ["nvfp4.down_combine._nvfp4_down_split_kernel", True], ["nvfp4.gate_up._nvfp4_gate_up_kernel", True],
            ["router._router_gemv_topk_kernel", True],
        ],
        "bf16_decode": [
            ["bf16.down_combine._bf16_down_combine_kernel", True], ["bf16.gate_up._bf16_gate_up_kernel", True],
            ["router._router_gemv_topk_kernel", True],
        ],
        "nvfp4_grouped": [  # on the H200 the Gluon kernels (row blocks of 16 pairs, K 256)
            ["nvfp4.grouped_down._grouped_combine_kernel", None], ["nvfp4.grouped_gluon._gluon_down_kernel", True],
            ["nvfp4.grouped_gluon._gluon_gate_up_kernel", True], ["router._router_gemv_topk_kernel", True],
        ],
        "pertoken": [  # the quantiser once for FC1's operand, once for FC2's
            ["nvfp4.pertoken_fc1._pertoken_fc1_kernel", True], ["nvfp4.pertoken_fc2._pertoken_combine_kernel", True],
            ["nvfp4.pertoken_fc2._pertoken_fc2_kernel", True], ["nvfp4.pertoken_quant._pertoken_quant_kernel", None],
            ["nvfp4.pertoken_quant._pertoken_quant_kernel", None],
        ],
    }  # fmt: skip
    for cid, launches in recorded.items():
        path = cid.split("/")[0]
        assert launches == tapped["pertoken" if path.startswith("nvfp4_pertoken_") else path], cid


_CASE_RUNS = """
import json, torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flint_moe.conformance import audit as A
from flint_moe.conformance.inputs.cases import Case
ids = ["nvfp4_pertoken_swiglu/pt-E16-H7168-I2048-P256-k8/M512/gaussian/s0", "nvfp4_decode/deepseek-v3/M6/asymmetric/s0",
       "nvfp4_decode/deepseek-v3/M1/gaussian/s0/c-gu-cuda-core"]
out = []
with FakeTensorMode():
    counter = torch.zeros(64, dtype=torch.int32, device="cuda")
    for cid in ids:
        runs = A._case_launches(Case.from_id(cid), counter)
        out.append([cid, [dict(ln.constexprs).get("TAP") for ln in runs]])
print(json.dumps(out))
"""


def test_case_runs_follow_the_invariances() -> None:
    """The runs ``_case_launches`` records are the harness's: tapped + production (+ the M = 1 batch-invariance
    run, tapped, except on the per-token paths); a launch configuration records its own path only."""
    pt, nv, cfg = _json_tail(_run(["-c", _CASE_RUNS]))
    # per-token: quant, FC1, quant, FC2, combine; TAP on FC1 / FC2 / combine only
    one = [None, "T", None, "T", "T"]
    assert pt[1] == [x if x is None else True for x in one] + [x if x is None else False for x in one]
    assert nv[1] == [True] * 3 + [False] * 3 + [True] * 3  # tapped, production, M = 1 alone
    assert cfg[1] == [True] * 3 + [False] * 3  # M = 1: no batch invariance; no default-path run


def test_matrix_audit_reports_problems(matrix_report: dict, tmp_path: Path) -> None:
    """The ``--specs`` path compiles real PTX: a derived spec that also requires an absent instruction fails."""
    rec = dict(matrix_report["records"][0])
    rec["name"] = "matrix.probe.requires_sin"
    rec["require"] = [*rec["require"], "sin.approx.f32"]
    f = tmp_path / "probe.json"
    f.write_text(json.dumps([rec]))
    proc = _run(["-m", "flint_moe.conformance.audit", "audit", "--specs", str(f), rec["name"]])
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert _json_tail(proc, ok=(1,)) == {rec["name"]: ["required instruction missing: sin.approx.f32"]}


_KEYS = """
import hashlib, json, sys
from flint_moe.kernels.audit.ptx import compile_ptx_sm90
from flint_moe.kernels.audit.registry import collect_audit_specs
S = collect_audit_specs()
keys = {n: S[n].kernel.cache_key for n in ("common.helpers", "router.topk.E256_k8", "bf16_gate_up.H2048_I768_k8")}
s = S["common.helpers"]
ptx = compile_ptx_sm90(s.kernel, s.signature, s.constexprs, s.options)
# Triton's launch-time check (JITFunction.run): every global a kernel used still equals the deep copy taken
# when its cache key was computed; a differing one makes every launch raise "has changed since we compiled"
changed = sorted(name for n in keys for (name, _), (val, g) in S[n].kernel.used_global_vals.items()
                 if g.get(name) != val)
print(json.dumps([keys, hashlib.sha256(ptx.encode()).hexdigest(), changed]))
"""


def test_stable_cache_keys(tmp_path: Path) -> None:
    """Triton 3.6 hashes ``str()`` of every constexpr global a kernel names into its cache key; the
    ``_shims._SHIM_*`` shims print their function's name, not its address, so two processes compute the same
    keys (the on-disk cache serves the second) and the same PTX."""
    out = {}
    for i in range(2):
        env_dir = tmp_path / f"cache{i}"
        proc = subprocess.run(
            [sys.executable, "-c", _KEYS],
            cwd=ROOT,
            env={**_env(), "TRITON_CACHE_DIR": str(env_dir)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        out[i] = _json_tail(proc)
    (k0, ptx0, ch0), (k1, ptx1, ch1) = out[0], out[1]
    assert k0 == k1
    assert ptx0 == ptx1
    assert ch0 == ch1 == []  # the launch-time global check passes (shims compare equal to their deep copies)
