"""The tensor-core probes compile for sm_90 on the CPU to exactly the instructions they claim.

``mma_probes.probe_ptx`` in a subprocess without ``TRITON_INTERPRET`` (tests/conftest.py sets it here): the
mma.sync probe holds one ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`` and no wgmma; the K = 16
``tl.dot`` probe one ``wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16``; the K = 32 probe two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json
from flint_moe.kernels.audit.mma_probes import probe_ptx
out = {}
for name in ("mma.sync", "wgmma", "wgmma_k32"):
    lines = [l.strip() for l in probe_ptx(name).splitlines()]
    out[name] = {
        "mma_sync": sum(l.startswith("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") for l in lines),
        "wgmma": sum(l.startswith("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") for l in lines),
        "any_wgmma": sum("wgmma.mma_async" in l for l in lines),
    }
print(json.dumps(out))
"""


def test_probe_instructions() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["mma.sync"] == {"mma_sync": 1, "wgmma": 0, "any_wgmma": 0}
    assert counts["wgmma"] == {"mma_sync": 0, "wgmma": 1, "any_wgmma": 1}
    assert counts["wgmma_k32"] == {"mma_sync": 0, "wgmma": 2, "any_wgmma": 2}
