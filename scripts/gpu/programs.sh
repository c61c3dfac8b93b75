#!/usr/bin/env bash
# Programs that use NVRTC or a static CUDA runtime from C, under the real and emulated drivers:
# examples/h200-programs.yaml.  Builds the C programs with nvcc (the GPU host's toolkit) into
# /tmp/cumatrix-programs, copies the NVRTC program there, runs the matrix.
# Output: "$OUT/programs/" (the run's reports, run.log, cells.txt: one line per cell).
#   OUT=/some/dir bash scripts/gpu/programs.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
dest="$OUT/programs"
P=/tmp/cumatrix-programs
mkdir -p "$dest" "$P"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cumatrix-site .whl/*.whl
  export PYTHONPATH=/tmp/cumatrix-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
cp examples/programs/nvrtc_driver.py "$P/"
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader; "$NVCC" --version | tail -2; } \
  > "$dest/host.txt" 2>&1
"$NVCC" -o "$P/static13" examples/programs/static_runtime.cu -gencode arch=compute_90,code=sm_90 >> "$dest/host.txt" 2>&1
"$NVCC" -o "$P/sass_miss" examples/programs/static_runtime.cu -gencode arch=compute_100,code=sm_100 >> "$dest/host.txt" 2>&1
cat "$dest/host.txt"
wheels=()
if ls .wheels/*.whl >/dev/null 2>&1; then wheels=(--wheel-dir .wheels); fi
python3 -m cumatrix run examples/h200-programs.yaml "${wheels[@]}" --out "$dest" 2>&1 | tee "$dest/run.log" | tail -40
status=${PIPESTATUS[0]}
python3 - "$dest/results.json" <<'PY' | tee "$dest/cells.txt"
import json, sys
data = json.load(open(sys.argv[1]))
cells = data.get("cells", data) if isinstance(data, dict) else data
for c in cells if isinstance(cells, list) else []:
    if c.get("type", "cell") != "cell":
        continue
    fp = c.get("fingerprint", {})
    print(f"{c['id']:36s} {c['status']:5s} {c['observed']['outcome']:26s} expected {'|'.join(sorted(c['expected']['outcomes']))}"
          f" ({c['expected']['rule']})  runtime {fp.get('runtime_file')} ({fp.get('runtime_version')})")
    note = c.get("mismatch") or fp.get("runtime_not_used") or c["observed"].get("detail") or ""
    if note:
        print(f"    {note.splitlines()[0][:300]}")
PY
exit "$status"
