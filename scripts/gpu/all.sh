#!/usr/bin/env bash
# Every GPU run of the project in one command, for a GPU host with no network:
#   OUT=DIR bash scripts/gpu/all.sh [STAGE...]
# Stages (default: reference drivers clients gate sandbox kernel): reference, drivers (the
# H200 matrices, then a cell-by-cell comparison with the committed reports/gpu-h200*), clients
# (the host's torch/CuPy/JAX/cuda-bindings), gate (nvcc-built wheels), sandbox (bubblewrap),
# kernel, programs (NVRTC and static-runtime C programs under real and emulated drivers),
# nightly (the default matrix.yaml, as a user's first GPU run), tests (pytest -m gpu), repro (the bug catalog), swap (the swap benchmark),
# jit (code compiled at run time and code for another GPU: examples/h200-jit.yaml),
# driver-roads (every road to libcuda and PTX behind comments, a numba-cuda kernel, under host,
# emulated-12.4 and emulated-12.8: scripts/gpu/driver_roads.sh; run it as `all.sh jit driver-roads`),
# wheel (the platform wheel from ./.dist installed as a user would, every cell observed from it),
# clients-tmp (the clients matrix kept directly in /tmp, its cases starting there: CuPy and JAX
# write their caches and temporary files in the cell's own /tmp),
# sandbox-user (sandboxed cells of an ordinary user reaching the GPU, and their cost),
# harness-root (a root harness's default run of 1,000 trivial cells against a bare spawn loop;
# HARNESS_REPS=N interleaved reps, 3 by default: the host's python3 -c pass takes ~57 ms, 2 fit its limit),
# cell-cycle (the time between two cells' programs: benchmarks/cell_cycle.py, 1,000 cells of a 9 ms program).
# Runtime wheels from ./.wheels, extra Python packages from ./.whl, bubblewrap from ./.bwrap.
# CUMATRIX_EVIDENCE_ROOT=DIR runs from a copy of the checkout in DIR.
# Everything lands under $OUT/e/ and is packed into $OUT/evidence.tgz after every stage, so a
# run cut short still brings back what it finished.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=$(realpath -m "${OUT:-gpu-out}")
# Run from a neutral place (CUMATRIX_EVIDENCE_ROOT), so that the reports name it, not wherever
# the checkout happens to be.
if [ -n "${CUMATRIX_EVIDENCE_ROOT:-}" ] && [ "$PWD" != "$CUMATRIX_EVIDENCE_ROOT" ]; then
  mkdir -p "$CUMATRIX_EVIDENCE_ROOT" && cp -a . "$CUMATRIX_EVIDENCE_ROOT/" && cd "$CUMATRIX_EVIDENCE_ROOT"
fi
E="$OUT/e"
mkdir -p "$E"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cumatrix-site .whl/*.whl
  export PYTHONPATH=/tmp/cumatrix-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/cumatrix-cache}
export CUMATRIX_WHEEL_DIR=$PWD/.wheels
mkdir -p "$XDG_CACHE_HOME/cumatrix/wheels" && cp -n .wheels/*.whl "$XDG_CACHE_HOME/cumatrix/wheels/" 2>/dev/null
# Cells are sandboxed by default (bubblewrap): the host's, else the Debian .deb carried in
# ./.bwrap (`apt-get download bubblewrap`), unpacked once for every stage.
if ! command -v bwrap >/dev/null && ls .bwrap/bubblewrap_*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/cumatrix-bwrap && dpkg -x .bwrap/bubblewrap_*.deb /tmp/cumatrix-bwrap
  export PATH=/tmp/cumatrix-bwrap/usr/bin:$PATH
fi
NPROC=${NPROC:-8}
pack() { tar -C "$OUT" -czf "$OUT/evidence.tgz.part" e && mv "$OUT/evidence.tgz.part" "$OUT/evidence.tgz"; }
stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  echo "=== $name (limit ${limit}s, $(date -u +%H:%M:%S))"
  timeout --kill-after=10 "$limit" "$@" > "$E/$name.log" 2>&1
  local rc=$?
  echo "=== $name: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$E/stages.txt"
  tail -8 "$E/$name.log"
  pack
}
held() {  # held OUTDIR: how the run's cells were held (the run header's "sandbox")
  python3 -c 'import json, sys; print("=== " + sys.argv[2] + ": sandbox", json.load(open(sys.argv[1]))["run"].get("sandbox"))' \
    "$1/results.json" "$(basename "$1")" 2>/dev/null | tee -a "$E/stages.txt"
}
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader; uname -r; echo "bwrap: $(command -v bwrap) $(bwrap --version 2>&1)"; } > "$E/host.txt" 2>&1
python3 -m cumatrix doctor --json > "$E/doctor.json" 2>&1
for s in ${*:-reference drivers clients gate sandbox kernel}; do
  case $s in
    reference) stage reference 200 python3 -m cumatrix run examples/h200-reference.yaml --out "$E/gpu-h200" -q -n "$NPROC"
               python3 scripts/compare-runs.py reports/gpu-h200/results.json "$E/gpu-h200/results.json" \
                 > "$E/gpu-h200/comparison.md"; head -3 "$E/gpu-h200/comparison.md"; held "$E/gpu-h200"; pack ;;
    drivers) stage drivers 120 python3 -m cumatrix run examples/h200-drivers.yaml --out "$E/gpu-h200-drivers" -q -n "$NPROC"
             python3 scripts/compare-runs.py reports/gpu-h200-drivers/results.json "$E/gpu-h200-drivers/results.json" \
               > "$E/gpu-h200-drivers/comparison.md"; head -3 "$E/gpu-h200-drivers/comparison.md"; held "$E/gpu-h200-drivers"; pack ;;
    clients) stage clients 200 env OUT="$E" bash scripts/gpu/clients.sh ;;
    clients-tmp) m=/tmp/cumatrix-clients-$$.yaml; cp examples/h200-clients.yaml "$m"
                 stage clients-tmp 300 python3 -m cumatrix run "$m" --out "$E/clients-tmp" -q
                 rm -f "$m"; held "$E/clients-tmp" ;;
    gate) stage gate 200 env OUT="$E" bash scripts/gpu/gate.sh ;;
    programs) stage programs 200 env OUT="$E" bash scripts/gpu/programs.sh ;;
    sandbox) stage sandbox 480 env OUT="$E" bash scripts/gpu/sandbox.sh ;;
    sandbox-user) stage sandbox-user 420 env OUT="$E" bash scripts/gpu/sandbox-user.sh ;;
    nightly) stage nightly 300 python3 -m cumatrix run matrix.yaml --require-gpu --out "$E/gpu-h200-nightly" -q -n "$NPROC"
             held "$E/gpu-h200-nightly" ;;
    kernel) stage kernel 120 python3 -m cumatrix run examples/h200-kernel.yaml --out "$E/gpu-h200-kernel" -q -n 2
            held "$E/gpu-h200-kernel" ;;
    tests) stage tests 200 python3 -m pytest -p no:cacheprovider -c /dev/null --rootdir . -q -m gpu tests/gpu \
             -o markers=gpu --junitxml "$E/gpu-tests.xml" ;;
    repro) stage repro 150 python3 -m cumatrix repro --all --out "$E/repro" ;;
    jit) stage jit 420 env OUT="$E" NPROC=4 bash scripts/gpu/jit.sh ;;
    driver-roads) stage driver-roads 300 env OUT="$E" NPROC=4 bash scripts/gpu/driver_roads.sh ;;
    wheel) stage wheel 200 env OUT="$E" bash scripts/gpu/wheel.sh ;;
    harness-root) mkdir -p "$E/harness-root"
                  stage harness-root 420 python3 benchmarks/harness_scale.py --sizes 1000 --reps "${HARNESS_REPS:-3}" \
                    --configs floor cumatrix cumatrix-nosb --wheel-dir "$PWD/.wheels" --json "$E/harness-root/harness-scale.json"
                  tail -6 "$E/harness-root.log" > "$E/harness-root/harness-scale.txt" ;;
    cell-cycle) stage cell-cycle 300 python3 benchmarks/cell_cycle.py -N 1000 --reps 3 --wheel-dir "$PWD/.wheels" ;;
    swap) stage swap 330 env OUT="$E" SWAP_SWEEP="${SWAP_SWEEP:-0}" bash scripts/gpu/swap.sh ;;
    *) echo "unknown stage $s" ;;
  esac
done
cat "$E/stages.txt"
