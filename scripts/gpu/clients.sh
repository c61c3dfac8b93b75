#!/usr/bin/env bash
# The GPU host's own CUDA programs (torch, CuPy, JAX, cuda-bindings) as command cells:
# examples/h200-clients.yaml (2 runtimes x host, emulated-12.4, emulated-12.8; no expect:).
# Runtime wheels come from ./.wheels when it holds them (offline), else pip fetches them.
# Output: "$OUT/clients/" (results.jsonl/json, junit.xml, summary.md, index.html, run.log,
# programs.txt: which torch/CuPy/JAX/cuda-bindings the host has).
#   OUT=/some/dir bash scripts/gpu/clients.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
dest="$OUT/clients"
mkdir -p "$dest"
# Extra Python packages the harness needs and the host lacks (pyelftools...), offline from ./.whl.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cumatrix-site .whl/*.whl
  export PYTHONPATH=/tmp/cumatrix-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} PYTHONUNBUFFERED=1
wheels=()
if ls .wheels/*.whl >/dev/null 2>&1; then wheels=(--wheel-dir .wheels); fi
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
  python3 - <<'PY'
import importlib.metadata as md
for dist in ("torch", "cupy-cuda13x", "cupy-cuda12x", "jax", "jax-cuda13-plugin", "jax-cuda12-plugin",
             "cuda-bindings", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12"):
    try:
        print(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        pass
PY
} > "$dest/programs.txt" 2>&1
cat "$dest/programs.txt"
python3 -m cumatrix run examples/h200-clients.yaml "${wheels[@]}" --out "$dest" 2>&1 | tee "$dest/run.log" | tail -60
status=${PIPESTATUS[0]}
# One line per cell: id, outcome, expected, and the runtime its processes really used.
python3 - "$dest/results.json" <<'PY' | tee "$dest/cells.txt"
import json, sys
data = json.load(open(sys.argv[1]))
cells = data.get("cells", data) if isinstance(data, dict) else data
for c in cells if isinstance(cells, list) else []:
    if c.get("type", "cell") != "cell":
        continue
    fp = c.get("fingerprint", {})
    print(f"{c['id']:40s} {c['status']:5s} {c['observed']['outcome']:26s} expected {'|'.join(c['expected']['outcomes'])}"
          f"  runtime {fp.get('runtime_file')} ({fp.get('runtime_version')})")
    if c["status"] != "pass":
        print(f"    {(c.get('mismatch') or c['observed'].get('detail') or '').splitlines()[0][:300] if (c.get('mismatch') or c['observed'].get('detail')) else ''}")
PY
exit "$status"
