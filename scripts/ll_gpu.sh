#!/usr/bin/env bash
# The decode block's GPU run (flint_moe_ll: Triton router + CuTe DSL experts) on the H200, results under $OUT.
# Run from the repository root with CuTe DSL already importable, e.g.
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
#   bash scripts/ll_gpu.sh
# Steps, each writing its own file: the cutlass import check (ll-import.txt); the CuTe audit / host-side CPU
# tests in the background (ll-cute-cpu.txt); the GPU tests of the op and of the router kernel (ll-gpu-tests.txt);
# the benchmark (ll-bench.txt, bench-ll/bench_ll.{md,json}). A short summary is printed last (ll-summary.txt).
# Each step has a time limit so the whole run stays under 4 minutes (a cut benchmark keeps its per-case lines).
set -uo pipefail
OUT=${OUT:-reports/ll-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
status=()

python3 - > "$OUT/ll-import.txt" 2>&1 <<'PY'
import sys
import torch
import cutlass
import cutlass.cute
from cutlass.cute.runtime import from_dlpack  # noqa: F401
import cuda.bindings.driver  # noqa: F401
from importlib.metadata import version
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("nvidia-cutlass-dsl", version("nvidia-cutlass-dsl"), "from", cutlass.__file__)
print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
PY
rc=$?; status+=("import cutlass: rc=$rc"); cat "$OUT/ll-import.txt"

# CPU-side CuTe checks (sm_90a PTX audit, launcher arguments compiled, declared orders, the op end to end with a
# CPU model of the kernels): CPU only, in parallel; the router runs under Triton's interpreter there
TRITON_INTERPRET=1 timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/kernels/test_cute_ptx.py \
  tests/kernels/test_cute_ll_gate_up.py tests/kernels/test_cute_ll_down.py tests/kernels/test_cute_ll_launch.py \
  tests/kernels/test_ll_orders.py tests/reference/test_orders_chain_axes.py tests/ops/test_moe_ll.py \
  > "$OUT/ll-cute-cpu.txt" 2>&1 &
cpu_pid=$!

timeout 130 python3 -m pytest -m gpu -q -rs -p no:cacheprovider --durations=10 tests/ops/test_moe_ll_gpu.py \
  tests/kernels/test_ll_router_gpu.py > "$OUT/ll-gpu-tests.txt" 2>&1
rc=$?; status+=("gpu tests: rc=$rc ($(tail -1 "$OUT/ll-gpu-tests.txt"))")

timeout 100 python3 benchmarks/bench_ll.py --out "$OUT/bench-ll" > "$OUT/ll-bench.txt" 2>&1
rc=$?; status+=("benchmark: rc=$rc")

wait "$cpu_pid"
rc=$?; status+=("cute cpu tests: rc=$rc ($(tail -1 "$OUT/ll-cute-cpu.txt"))")

{
  echo "== ll_gpu.sh summary ($(( $(date +%s) - t0 )) s) =="
  printf '%s\n' "${status[@]}"
  echo "-- gpu test failures / skips:"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/ll-gpu-tests.txt" | head -20
  echo "-- benchmark:"
  if grep -q "^copy bandwidth (2 GiB" "$OUT/ll-bench.txt"; then
    sed -n '/^copy bandwidth (2 GiB/,$p' "$OUT/ll-bench.txt" | head -40
  else  # cut by its time limit: the cases timed so far
    tail -30 "$OUT/ll-bench.txt"
  fi
} | tee "$OUT/ll-summary.txt"
