#!/usr/bin/env bash
# Round 7 of docs/kernels/nvfp4-decode.md on the H200, one device call on a clean snapshot of a commit
# (repository root, $OUT set):
#  1. benchmarks/bench_decode_nvfp4.py --round7: bit checks of the down candidates (row blocks per program RB,
#     weights before the grid-dependency wait EARLY, register cap MAXNREG, FENCE) against the round-6 default
#     down at DeepSeek-V3 M = 1, 3; down alone and gate/up + down timings (3 rounds); the choice written into
#     flint_moe/kernels/nvfp4/tuned.py only if it beats the round-6 down in every round (copied to $OUT);
#  2. the runner on the resulting defaults (every model, M = 1, 2, 4, 8);
#  3. the GPU tests of the NVFP4 decode kernels on those defaults.
set -u
mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
  > "$OUT/env.txt" 2>&1
cp COMMIT.txt "$OUT/commit.txt" 2>/dev/null
export PYTHONPATH=$PWD
timeout "${TUNE_S:-150}" python3 benchmarks/bench_decode_nvfp4.py --round7 \
  --write-tuned flint_moe/kernels/nvfp4/tuned.py --out "$OUT" > "$OUT/round7.log" 2>&1
echo "round7 rc $?"
cp flint_moe/kernels/nvfp4/tuned.py "$OUT/nvfp4_tuned.py"
timeout "${RUNNER_S:-90}" python3 -m benchmarks.runner --filter decode_nvfp4 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "runner rc $?"
cp "$OUT/bench/bench.md" "$OUT/bench_runner.md" 2>/dev/null
rm -rf "$OUT/bench"
timeout "${PYTEST_S:-230}" python3 -m pytest -p no:cacheprovider -m gpu -q tests/kernels -k nvfp4 \
  > "$OUT/pytest_gpu.txt" 2>&1
echo "pytest rc $?"
tail -22 "$OUT/round7.log"; tail -14 "$OUT/bench_runner.md"; tail -6 "$OUT/pytest_gpu.txt"
