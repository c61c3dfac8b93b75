#!/usr/bin/env bash
# The reference swap on a GPU host: the benchmark (every policy alone and beside a computation)
# and the swap GPU tests, everything under "$OUT/swap/".  About 3 minutes on an H200.
#   OUT=DIR bash scripts/gpu/swap.sh            (SWAP_SWEEP=0 leaves out the copy-engine and SM-budget sweeps)
# Runtime wheels come from ./.wheels (offline).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT/swap"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/cumatrix-cache}
mkdir -p "$XDG_CACHE_HOME/cumatrix/wheels" && cp -n .wheels/*.whl "$XDG_CACHE_HOME/cumatrix/wheels/" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/swap/nvidia-smi.csv" 2>&1
start=$(date +%s)
python3 benchmarks/swap_bench.py --wheel-dir .wheels --repetitions "${SWAP_REPS:-10}" $( [ "${SWAP_SWEEP:-1}" = 1 ] && echo --sweep) \
  --json "$OUT/swap/swap-h200.json" --plot "$OUT/swap/swap-h200.png" 2>&1 | tee "$OUT/swap/bench.log"
echo "benchmark: $(( $(date +%s) - start )) s" | tee -a "$OUT/swap/bench.log"
start=$(date +%s)
CUMATRIX_REQUIRE_GPU=1 timeout "${SWAP_TEST_TIMEOUT:-150}" python3 -m pytest -p no:cacheprovider -c /dev/null \
  --rootdir . -q -o markers=gpu -m gpu ${SWAP_TESTS:-tests/gpu/test_kernel_gpu.py tests/gpu/test_reference_gpu.py} \
  --junitxml "$OUT/swap/gpu-tests.xml" 2>&1 | tail -40 | tee "$OUT/swap/gpu-tests.log"
echo "gpu tests: $(( $(date +%s) - start )) s" | tee -a "$OUT/swap/gpu-tests.log"
