#!/usr/bin/env bash
# One H200 run: every GPU-side check of the project, results under $OUT (default reports/h200-run).
# Usage on the GPU machine, from the repository root:
#   bash scripts/h200.sh [verify] [tests] [conformance] [pending] [shards] [modules] [bench] [sweep] [gluon] [gluon-ncu] [gluon-ws]
# (no argument = verify tests conformance bench; sweep = the BF16 launch-config sweep, on request; shards = the gpu
# profile as FLINT_SHARDS shards one after another, merged; gluon = the Gluon grouped GEMMs (config ENGINE "gluon"):
# their GPU test against the Triton kernels, then the --ab layers at AB_CASES and DeepSeek-V3 M = 128 / 256 (under
# gluon/); gluon-ncu = Nsight Compute over the Gluon GEMMs and the default kernels (benchmarks.tune.ncu_kernels,
# under gluon-ncu/); gluon-ws = the warp-specialised Gluon GEMMs (config ENGINE "gluon_ws"): their GPU tests, the
# --ab layers at AB_CASES and M = 128 / 256 (the default engines against the Triton kernels), Nsight Compute of the
# default at DeepSeek-V3 M = 4096 (under gluon-ws/); pending = the paths whose kernels have not yet passed
# an H200 run, scripts/h200_pending.py, their report under pending/; FLINT_TESTS=paths narrows the tests step).
# FLINT_CONFORMANCE_TIMEOUT / FLINT_PENDING_TIMEOUT / FLINT_TESTS_TIMEOUT / FLINT_BENCH_TIMEOUT / FLINT_WS_TIMEOUT
# (default 240: a hung mbarrier ring ends there): seconds per step.
# FLINT_BENCH=a,b: the bench step runs only the cases whose module.name contains a or b (e.g. ll.,pertoken).
# FLINT_GIT_COMMIT names the commit the tree was sent from (the device copy has no .git).
# The machine has torch 2.11 / triton 3.6 and no nox, so this runs python directly.
# FLINT_BASELINE=reports/h200/report.json: compare the conformance outputs' digests with that report.
# FLINT_TAR=1: write everything to a scratch folder and pack it as $OUT/h200-run.tgz (one file to fetch).
set -uo pipefail
FINAL_OUT=${OUT:-reports/h200-run}
if [ "${FLINT_TAR:-0}" = 1 ]; then OUT=$(mktemp -d)/h200-run; else OUT=$FINAL_OUT; fi
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
steps=${*:-verify tests conformance bench}
rc=0
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  echo "git commit: ${FLINT_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
for step in $steps; do
  case $step in
    verify) python3 -m flint_moe.tools.mufu verify --report "$OUT/mufu-verify.txt" > "$OUT/mufu-verify.log" 2>&1 || rc=1
            tail -3 "$OUT/mufu-verify.log" ;;
    tests)  timeout "${FLINT_TESTS_TIMEOUT:-3000}" python3 -m pytest -m gpu -n "${FLINT_GPU_WORKERS:-6}" -q -rfEs \
              -p no:cacheprovider --durations=15 ${FLINT_TESTS:-tests} --ignore=tests/checkpoints \
              > "$OUT/pytest-gpu.txt" 2>&1 || rc=1
            tail -15 "$OUT/pytest-gpu.txt" ;;
    conformance) t0=$(date +%s); timeout "${FLINT_CONFORMANCE_TIMEOUT:-3000}" python3 -m flint_moe.conformance --profile gpu \
              --out "$OUT/conformance" ${FLINT_BASELINE:+--baseline "$FLINT_BASELINE"} > "$OUT/conformance.log" 2>&1 || rc=1
            echo "conformance wall: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/conformance.log"
            tail -5 "$OUT/conformance.log" ;;
    pending) t0=$(date +%s); timeout "${FLINT_PENDING_TIMEOUT:-3000}" python3 scripts/h200_pending.py \
              --out "$OUT/pending" > "$OUT/pending.log" 2>&1 || rc=1
            echo "pending wall: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/pending.log"
            tail -4 "$OUT/pending.log" ;;
    shards) # the gpu profile as FLINT_SHARDS (default 2) shards run one after another, then merged: the merged
            # report must carry the same output digests as a single run (compare with --baseline on the next run)
            n=${FLINT_SHARDS:-2}; t0=$(date +%s); dirs=""
            for k in $(seq 1 "$n"); do
              python3 -m flint_moe.conformance --profile gpu --shard "$k/$n" --out "$OUT/shard-$k" \
                > "$OUT/shard-$k.log" 2>&1; dirs="$dirs $OUT/shard-$k"
            done
            python3 -m flint_moe.conformance.merge $dirs --out "$OUT/merged" > "$OUT/merge.log" 2>&1 || rc=1
            echo "shards wall: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/merge.log"
            tail -3 "$OUT/merge.log" ;;
    modules) python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/modules > "$OUT/pytest-modules.txt" 2>&1 || rc=1
            tail -5 "$OUT/pytest-modules.txt" ;;
    sweep)  python3 -m benchmarks.bench_decode_bf16 --sweep > "$OUT/sweep-bf16.txt" 2>&1 || rc=1
            tail -20 "$OUT/sweep-bf16.txt" ;;
    bench)  filters=(); IFS=, read -ra sel <<< "${FLINT_BENCH:-}"; for f in "${sel[@]}"; do filters+=(--filter "$f"); done
            timeout "${FLINT_BENCH_TIMEOUT:-3000}" python3 -m benchmarks.runner --out "$OUT" "${filters[@]}" \
              > "$OUT/bench.log" 2>&1 || rc=1
            tail -30 "$OUT/bench.log" ;;
    gluon)  mkdir -p "$OUT/gluon"
            python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider tests/kernels/test_nvfp4_grouped_gluon_gpu.py \
              > "$OUT/gluon/pytest.txt" 2>&1 || rc=1
            tail -3 "$OUT/gluon/pytest.txt"
            python3 benchmarks/bench_grouped_nvfp4.py --ab --out "$OUT/gluon/large" > "$OUT/gluon/ab-large.log" 2>&1 || rc=1
            python3 benchmarks/bench_grouped_nvfp4.py --ab --model deepseek-v3 --M 128,256 --out "$OUT/gluon/small" \
              > "$OUT/gluon/ab-small.log" 2>&1 || rc=1
            grep -h "M=\|^| \(default\|gluon\|bf16\)" "$OUT"/gluon/ab-*.log ;;
    gluon-ws) # the warp-specialised Gluon GEMMs: GPU tests, A/B of the default engines, Nsight Compute of the default
            mkdir -p "$OUT/gluon-ws"
            timeout "${FLINT_WS_TIMEOUT:-240}" python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider \
              -k "gluon_ws or refusals" tests/kernels/test_nvfp4_grouped_gluon_gpu.py > "$OUT/gluon-ws/pytest.txt" 2>&1 || rc=1
            tail -3 "$OUT/gluon-ws/pytest.txt"
            python3 benchmarks/bench_grouped_nvfp4.py --ab --out "$OUT/gluon-ws/large" \
              --variants triton,gluon_ws+tail-tile,gluon_ws+tail-s2,gluon_ws+tail64 > "$OUT/gluon-ws/ab-large.log" 2>&1 || rc=1
            python3 benchmarks/bench_grouped_nvfp4.py --ab --model deepseek-v3 --model qwen3-235b-a22b \
              --model gpt-oss-120b --M 128,256 --variants triton --out "$OUT/gluon-ws/small" > "$OUT/gluon-ws/ab-small.log" 2>&1 || rc=1
            grep -h "M=\|refused\|^| \(default\|gluon\|bf16\|triton\)\|copy " "$OUT"/gluon-ws/ab-*.log
            python3 -m benchmarks.tune.ncu_kernels --out "$OUT/gluon-ws/ncu" grouped:deepseek-v3:4096 \
              > "$OUT/gluon-ws/ncu.log" 2>&1 || rc=1
            cat "$OUT/gluon-ws/ncu.log" ;;
    gluon-ncu) # stall reasons, tensor-pipe and shared-memory use of the Gluon GEMMs against the default kernels
            python3 -m benchmarks.tune.ncu_kernels --out "$OUT/gluon-ncu" gluontail:deepseek-v3:4096 \
              grouped:deepseek-v3:4096 gluon:deepseek-v3:128 > "$OUT/gluon-ncu.log" 2>&1 || rc=1
            cat "$OUT/gluon-ncu.log" ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
done
if [ "${FLINT_TAR:-0}" = 1 ]; then
  mkdir -p "$FINAL_OUT" && tar czf "$FINAL_OUT/h200-run.tgz" -C "$(dirname "$OUT")" h200-run && ls -la "$FINAL_OUT"
fi
exit $rc
