#!/usr/bin/env bash
# Round 7 confirmation on the H200, one device call on a clean snapshot of the commit with the round-7 defaults
# (repository root, $OUT set):
#  1. benchmarks/bench_decode_nvfp4.py --ab7: gate/up + down at M = 1, 2, 4, 8, committed default down against
#     the round-6 down at DeepSeek-V3, gpt-oss-120b's own down with and without EARLY 1 (diagnostic);
#  2. the runner on the committed defaults;
#  3. the GPU tests of the NVFP4 decode kernels on those defaults.
set -u
mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
  > "$OUT/env.txt" 2>&1
cp COMMIT.txt "$OUT/commit.txt" 2>/dev/null
export PYTHONPATH=$PWD
timeout "${AB_S:-80}" python3 benchmarks/bench_decode_nvfp4.py --ab7 --out "$OUT" > "$OUT/ab7.log" 2>&1
echo "ab7 rc $?"
timeout "${RUNNER_S:-60}" python3 -m benchmarks.runner --filter decode_nvfp4 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "runner rc $?"
cp "$OUT/bench/bench.md" "$OUT/bench_runner.md" 2>/dev/null
rm -rf "$OUT/bench"
timeout "${PYTEST_S:-200}" python3 -m pytest -p no:cacheprovider -m gpu -q tests/kernels -k nvfp4 \
  > "$OUT/pytest_gpu.txt" 2>&1
echo "pytest rc $?"
cat "$OUT/ab7.md"; tail -14 "$OUT/bench_runner.md"; tail -4 "$OUT/pytest_gpu.txt"
