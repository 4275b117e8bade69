#!/usr/bin/env bash
# A/B of the decode block's streaming expert kernels (flint_moe_ll(..., streaming=True), kernels/cute/ll_stream.py)
# against the first kernels on the H200; everything under "$OUT/ll". Run from the repository root with CuTe DSL
# already importable (PYTHONPATH), e.g.   OUT=/tmp/out bash scripts/ll_ab.sh
# Steps (each with its own time limit, so the whole run stays under 150 s; a failing step does not stop the next):
#   1. GPU tests of the streaming kernels (golden model + bitwise equal to the first kernels): ab-tests.txt
#   2. benchmark, DeepSeek-V3 at M = 1, 2, 4, 8: ll / ll_stream / triton, ll_stream checked bit for bit
#      against ll on every input set before timing: ab-bench.txt, bench/bench_ll.{json,md}
# Exit codes of every step: rc.txt; a short summary last: summary.txt.
set -uo pipefail
OUT=${OUT:-reports/ll-ab}
D="$OUT/ll"
mkdir -p "$D/bench"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
t0=$(date +%s)
: > "$D/rc.txt"

sel="test_streaming_kernels_match_the_golden_model and (dsv3-1 or dsv3-8 or ling-3 or glm45air-3 or padded-2)"
sel="$sel or test_streaming_shared_experts_across_tokens"
timeout 75 python3 -m pytest -m gpu -q -rs -p no:cacheprovider --durations=10 tests/ops/test_moe_ll_gpu.py \
  -k "$sel" > "$D/ab-tests.txt" 2>&1
echo "gpu tests: rc=$? ($(tail -1 "$D/ab-tests.txt"))" >> "$D/rc.txt"

left=$(( 140 - ($(date +%s) - t0) ))
(( left < 30 )) && left=30
timeout "$left" python3 benchmarks/bench_ll.py --out "$D/bench" --models deepseek-v3 --tokens 1,2,4,8 \
  > "$D/ab-bench.txt" 2>&1
echo "benchmark: rc=$? (time limit ${left} s)" >> "$D/rc.txt"

{
  echo "== ll_ab.sh summary ($(( $(date +%s) - t0 )) s) =="
  cat "$D/rc.txt"
  echo "-- test failures / skips:"
  grep -E "^(FAILED|ERROR|SKIPPED)|Error" "$D/ab-tests.txt" | head -20
  echo "-- benchmark:"
  if [ -f "$D/bench/bench_ll.md" ]; then cat "$D/bench/bench_ll.md"; else tail -20 "$D/ab-bench.txt"; fi
} | tee "$D/summary.txt"
