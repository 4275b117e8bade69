#!/usr/bin/env bash
# Round 6 confirmation on the H200, one device call on a clean snapshot of a commit (repository root, $OUT set):
#  1. benchmarks/bench_decode_nvfp4.py --probe: a few gate/up variants the round-6 tune did not try (diagnostic,
#     nothing written);
#  2. the runner on the committed defaults (flint_moe/kernels/nvfp4/tuned.py as written by the round-6 tune);
#  3. the GPU tests of the NVFP4 kernels on those defaults.
set -u
mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
  > "$OUT/env.txt" 2>&1
export PYTHONPATH=$PWD
git log --oneline -1 > "$OUT/commit.txt" 2>&1
timeout 60 python3 benchmarks/bench_decode_nvfp4.py --probe --out "$OUT" > "$OUT/probe.log" 2>&1
echo "probe rc $?"
timeout 90 python3 -m benchmarks.runner --filter decode_nvfp4 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "runner rc $?"
cp "$OUT/bench/bench.md" "$OUT/bench_runner.md"
rm -rf "$OUT/bench"
timeout "${PYTEST_S:-200}" python3 -m pytest -p no:cacheprovider -m gpu -q tests/kernels -k nvfp4 \
  > "$OUT/pytest_gpu.txt" 2>&1
echo "pytest rc $?"
cat "$OUT/probe.md"; tail -14 "$OUT/bench_runner.md"; tail -4 "$OUT/pytest_gpu.txt"
