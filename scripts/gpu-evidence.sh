#!/usr/bin/env bash
# Runs the GPU evidence of the project on a host with an NVIDIA GPU and no network:
# runtime wheels come from ./.wheels (pip download them first), extra Python packages
# from ./.whl.  Output: one folder per run under ${OUT:-gpu-out}.
#   bash scripts/gpu-evidence.sh [tests] [reference] [drivers] [kernel] [repro] [bench]
set -uo pipefail
cd "$(dirname "$0")/.."
# Run from a neutral place so that the reports name the GPU host's paths, not the checkout's.
if [ -n "${CUMATRIX_EVIDENCE_ROOT:-}" ] && [ "$PWD" != "$CUMATRIX_EVIDENCE_ROOT" ]; then
  mkdir -p "$CUMATRIX_EVIDENCE_ROOT" && cp -a . "$CUMATRIX_EVIDENCE_ROOT/" && cd "$CUMATRIX_EVIDENCE_ROOT"
fi
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cumatrix-site .whl/*.whl
  export PYTHONPATH=/tmp/cumatrix-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} XDG_CACHE_HOME=${XDG_CACHE_HOME:-/var/cache} PYTHONUNBUFFERED=1
# Seed the wheel cache so that code paths without --wheel-dir find the wheels offline too.
mkdir -p "$XDG_CACHE_HOME/cumatrix/wheels" && cp -n .wheels/*.whl "$XDG_CACHE_HOME/cumatrix/wheels/" 2>/dev/null
stages=${*:-tests reference drivers}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 -m cumatrix doctor --json > "$OUT/doctor.json"
for stage in $stages; do
  echo "=== $stage ($(date -u +%H:%M:%S))"
  case $stage in
    tests) python3 -m pytest -p no:cacheprovider -c /dev/null --rootdir . -q -m gpu tests/gpu -p cumatrix.plugin \
             -o markers=gpu --junitxml "$OUT/gpu-tests.xml" 2>&1 | tail -40 ;;
    reference) python3 -m cumatrix run examples/h200-reference.yaml --wheel-dir .wheels --out "$OUT/gpu-h200" -q ${NPROC:+-n $NPROC} | tail -60 ;;
    drivers) python3 -m cumatrix run examples/h200-drivers.yaml --wheel-dir .wheels --out "$OUT/gpu-h200-drivers" -q ${NPROC:+-n $NPROC} | tail -60 ;;
    kernel) python3 -m cumatrix run examples/h200-kernel.yaml --wheel-dir .wheels --out "$OUT/gpu-h200-kernel" -q | tail -40 ;;
    repro) python3 -m cumatrix repro --all --wheel-dir .wheels --out "$OUT/repro" 2>&1 | tail -40 ;;
    bench) mkdir -p "$OUT/bench" && python3 benchmarks/swap_bench.py --wheel-dir .wheels --json "$OUT/bench/swap-h200.json" --plot "$OUT/bench/swap-h200.png" 2>&1 | tail -40 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
