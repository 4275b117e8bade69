"""Compiling the NVFP4 decode kernels for sm_90 on the CPU (no GPU), shared by test_nvfp4_mma_layout.py and
test_nvfp4_cuda_core_order_ptx.py: the preamble of their build scripts (imports and the pointer signatures of
``nvfp4_gate_up`` / ``nvfp4_down``) and the fresh interpreter, without TRITON_INTERPRET, that runs one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Script text that a build script starts with: ``triton``, ``GPUTarget``, ``ASTSource``, the kernel modules
#: ``G`` (gate_up) and ``D`` (down_combine), and ``GSIG`` / ``DSIG``, the Triton type of every pointer argument.
PREAMBLE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from flint_moe.kernels.nvfp4 import down_combine as D, gate_up as G

GSIG = {"x_ptr": "*i32", "ids_ptr": "*i32", "w_ptr": "*u8", "s_ptr": "*u8", "alpha_ptr": "*fp32",
        "act_ptr": "*bf16", "gacc_ptr": "*fp32", "uacc_ptr": "*fp32"}
DSIG = {"act_ptr": "*i32", "ids_ptr": "*i32", "tw_ptr": "*fp32", "w_ptr": "*u8", "s_ptr": "*u8",
        "alpha_ptr": "*fp32", "shared_ptr": "*bf16", "out_ptr": "*bf16", "dacc_ptr": "*fp32", "y_ptr": "*bf16",
        "cnt_ptr": "*i32"}
"""


def run_build_script(script: str, timeout: int) -> list:
    """Run ``script`` (Python source) in a new interpreter at the repository root, with TRITON_INTERPRET unset
    and the root first on PYTHONPATH; returns the JSON of its last stdout line. AssertionError with the tail of
    its stderr when it exits non-zero; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
