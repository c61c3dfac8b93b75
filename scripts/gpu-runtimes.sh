#!/usr/bin/env bash
# Runtimes on an offline GPU host: wheel runtimes and environment runtimes (built by uv
# from the wheel directory alone) on the real GPU, then the GPU tests, with nothing in
# the cache beforehand and CUMATRIX_WHEEL_DIR standing for --wheel-dir everywhere.
#
# Prepare where there is network (python version = the GPU host's):
#   cumatrix fetch scripts/gpu-runtimes.yaml --gate --harness --dest .wheels --python-version 3.12
#   cumatrix fetch examples/h200-reference.yaml --dest .wheels --python-version 3.12   # the GPU tests' headers
# On the GPU host (carry .wheels):  bash scripts/gpu-runtimes.sh
# Output: $OUT/runtimes/ (run/ with the reports, doctor.json, gpu-tests.log, run.log).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}/runtimes"
mkdir -p "$out/run"
wheels="${CUMATRIX_WHEEL_DIR:-$PWD/.wheels}"
[ -d "$wheels" ] || { echo "no wheel directory $wheels: run cumatrix fetch first (see above)"; exit 2; }
export CUMATRIX_WHEEL_DIR="$wheels" PYTHONUNBUFFERED=1
# cumatrix's own dependencies (uv among them) from the same directory, without an index
python3 -m pip install -q --no-index --no-compile --no-cache-dir --find-links "$wheels" --target /tmp/cumatrix-site \
  pyyaml fastjsonschema jsonschema pytest pytest-xdist cuda-pathfinder pyelftools docker uv || exit 2
export PYTHONPATH="$PWD/src:/tmp/cumatrix-site:${PYTHONPATH:-}" PATH="/tmp/cumatrix-site/bin:$PATH"
# an empty cache: whatever a run needs must come from the wheel directory
export XDG_CACHE_HOME="$(mktemp -d)" CUMATRIX_CACHE=""
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 -m cumatrix doctor --json > "$out/doctor.json"
echo "=== run ($(date -u +%H:%M:%S))"
python3 -m cumatrix run scripts/gpu-runtimes.yaml --out "$out/run" -v 2>&1 | tee "$out/run.log" | tail -40
rm -f "$out/run/index.html"  # 5 files back at most: results.jsonl/json, junit.xml, summary.md
echo "=== gpu tests ($(date -u +%H:%M:%S))"
# load the plugin by hand only where no installed cumatrix registers it (twice is an error)
plugin=(-p cumatrix.front.pytest_plugin.hooks)
python3 -c "from importlib import metadata as m; import sys; sys.exit(0 if any(e.value == 'cumatrix.front.pytest_plugin.hooks' for e in
  m.entry_points(group='pytest11')) else 1)" && plugin=()
python3 -m pytest -p no:cacheprovider -c /dev/null --rootdir . -q -m gpu tests/gpu "${plugin[@]}" -o markers=gpu \
  2>&1 | tee "$out/gpu-tests.log" | tail -40
