"""Measure layout-conversion cost on this machine (time, peak RSS) for real MoE layer sizes.

Each case runs in a fresh subprocess so its peak RSS (VmHWM) is its own. Inputs are random codes/scales
synthesised directly (no quantisation). Usage:

    PYTHONPATH=. python benchmarks/layout_conversion.py [case ...]

Cases: nvfp4-deepseek (E=256, H=7168, I=2048, out of place), nvfp4-deepseek-inplace, bf16-qwen3
(E=128, H=2048, I=768, out of place), bf16-qwen3-inplace. Prints one JSON line per case.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def _status_kib(field: str) -> int:
    """``field`` (``VmHWM``: peak RSS, ``VmRSS``: current RSS) of /proc/self/status in KiB; -1 if absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def run_case(case: str) -> dict:
    import torch

    from flint_moe.layouts import FlintMoEWeights, to_trtllm_bf16

    torch.manual_seed(0)
    res: dict = {"case": case, "threads": torch.get_num_threads()}
    if case.startswith("nvfp4"):
        E, H, I = 256, 7168, 2048
        w13 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8)
        s13 = torch.randint(0, 0x7F, (E, 2 * I, H // 16), dtype=torch.uint8).view(torch.float8_e4m3fn)
        w2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8)
        s2 = torch.randint(0, 0x7F, (E, H, I // 16), dtype=torch.uint8).view(torch.float8_e4m3fn)
        gs = torch.rand(E)
        inputs = [w13, s13, w2, s2]
        res["input_gb"] = sum(t.numel() * t.element_size() for t in inputs) / 1e9
        base = _status_kib("VmRSS")
        t0 = time.perf_counter()
        W = FlintMoEWeights.from_modelopt(w13, s13, (gs, gs), w2, s2, gs, inplace=case.endswith("inplace"))
        res["seconds"] = time.perf_counter() - t0
        del W
    else:
        E, H, I = 128, 2048, 768
        w13 = torch.randn(E, 2 * I, H, dtype=torch.bfloat16)
        w2 = torch.randn(E, H, I, dtype=torch.bfloat16)
        res["input_gb"] = (w13.numel() + w2.numel()) * 2 / 1e9
        base = _status_kib("VmRSS")
        t0 = time.perf_counter()
        out = to_trtllm_bf16(w13, w2, inplace=case.endswith("inplace"))
        res["seconds"] = time.perf_counter() - t0
        del out
    res["rss_before_gib"] = base / 2**20
    res["peak_rss_gib"] = _status_kib("VmHWM") / 2**20
    res["peak_extra_over_inputs_gib"] = (_status_kib("VmHWM") - base) / 2**20
    res["shape"] = {"E": E, "H": H, "I": I}
    return res


CASES = ["nvfp4-deepseek-inplace", "nvfp4-deepseek", "bf16-qwen3-inplace", "bf16-qwen3"]

if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(run_case(sys.argv[2])))
        sys.exit(0)
    for case in sys.argv[1:] or CASES:
        out = subprocess.run([sys.executable, __file__, "--child", case], capture_output=True, text=True)
        print(
            out.stdout.strip() or f'{{"case": "{case}", "error": {json.dumps(out.stderr[-2000:])}}}',
            flush=True,
        )
