#!/usr/bin/env bash
# Round 5 of docs/kernels/nvfp4-decode.md on the H200, one device call (repository root, $OUT set):
#  1. benchmarks/bench_decode_nvfp4.py --tune: golden / bit checks of the CUDA-core and tensor-core candidates,
#     timings at DeepSeek-V3 M=1, the choice written into flint_moe/kernels/nvfp4/tuned.py (copied to $OUT);
#  2. the runner on the chosen defaults (bench.md, every model, M = 1, 2, 4, 8);
#  3. the GPU tests of the NVFP4 kernels (both paths on every matrix shape).
set -u
mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
  > "$OUT/env.txt" 2>&1
export PYTHONPATH=$PWD
timeout 170 python3 benchmarks/bench_decode_nvfp4.py --tune --write-tuned flint_moe/kernels/nvfp4/tuned.py \
  --out "$OUT" > "$OUT/tune.log" 2>&1
echo "tune rc $?"
cp flint_moe/kernels/nvfp4/tuned.py "$OUT/nvfp4_tuned.py"
timeout 110 python3 -m benchmarks.runner --filter decode_nvfp4 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "runner rc $?"
timeout 230 python3 -m pytest -p no:cacheprovider -m gpu -q tests/kernels -k nvfp4 > "$OUT/pytest_gpu.txt" 2>&1
echo "pytest rc $?"
tail -25 "$OUT/tune.log"; tail -16 "$OUT/bench/bench.md"; tail -8 "$OUT/pytest_gpu.txt"
