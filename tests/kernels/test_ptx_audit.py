"""sm_90 PTX audit of every registered kernel specialisation (all flint_moe.kernels modules).

Each specialisation is compiled for ``GPUTarget("cuda", 90, 32)`` on the CPU (Triton bundles ptxas) and its
PTX checked: the rule's instructions present (``require``), ``div.full.f32`` and fp64 absent (``forbid``).

The compile runs in a subprocess (``python -m flint_moe.kernels.audit audit NAME``) whose environment has
no ``TRITON_INTERPRET``: in this pytest process tests/kernels/conftest.py may have set it, and then every
``@triton.jit`` is an interpreter object that cannot be compiled (and the helpers would take their shim
branch). One subprocess per chunk of at most ``CHUNK`` specialisations of one module (process start-up
costs about as much as one compile), so pytest-xdist spreads them; Triton's on-disk cache makes reruns fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flint_moe.kernels.audit.registry import collect_audit_specs

BACKEND = "any"
ROOT = Path(__file__).resolve().parents[2]
_REGISTRY = collect_audit_specs()
SPECS = sorted(_REGISTRY)
CHUNK = 8


def _chunks() -> dict[str, list[str]]:
    by_module: dict[str, list[str]] = {}
    for name in SPECS:
        kernel = _REGISTRY[name].kernel
        module = getattr(getattr(kernel, "fn", kernel), "__module__", "?").removeprefix("flint_moe.kernels.")
        by_module.setdefault(module, []).append(name)
    out = {}
    for module, names in sorted(by_module.items()):
        for i in range(0, len(names), CHUNK):
            out[f"{module}-{i // CHUNK}"] = names[i : i + CHUNK]
    return out


CHUNKS = _chunks()


def _audit(names: list[str]) -> dict[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-m", "flint_moe.kernels.audit", "audit", *names],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        pytest.fail(f"audit subprocess failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_registry_is_populated() -> None:
    assert "common.helpers" in SPECS
    for name in ("router.gemv_topk.E256_k8", "router.gemv_topk.E256_k8_tap", "router.topk.E512_k10"):
        assert name in SPECS, name


@pytest.mark.parametrize("chunk", sorted(CHUNKS))
def test_ptx_audit(chunk: str) -> None:
    names = CHUNKS[chunk]
    result = _audit(names)
    assert sorted(result) == sorted(names)
    bad = {n: p for n, p in result.items() if p}
    assert not bad, "\n".join(f"{n}: " + "; ".join(p) for n, p in sorted(bad.items()))


def test_audit_catches_a_bad_kernel(tmp_path: Path) -> None:
    """The subprocess path really compiles PTX: a spec that requires an absent instruction fails."""
    code = (
        "import json\n"
        "from flint_moe.kernels.audit.ptx import audit_ptx, compile_ptx_sm90\n"
        "from flint_moe.kernels.audit.registry import collect_audit_specs\n"
        "s = collect_audit_specs()['common.helpers']\n"
        "ptx = compile_ptx_sm90(s.kernel, s.signature, s.constexprs)\n"
        "print(json.dumps([audit_ptx(ptx, ['sin.approx.f32']), 'rcp.approx.ftz.f32' in ptx]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-4000:]
    problems, has_rcp = json.loads(out.stdout.strip().splitlines()[-1])
    assert problems == ["required instruction missing: sin.approx.f32"] and has_rcp
