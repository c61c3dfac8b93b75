#!/usr/bin/env bash
# Code compiled at run time and machine code for another GPU: examples/h200-jit.yaml (7 programs
# x host, emulated-12.4, emulated-12.8, emulated-12.9), into "$OUT/gpu-h200-jit/".
# The C programs come from examples/jit/bin/ (built by examples/jit/build.sh where nvcc 13.0 is,
# and carried with the checkout); where they are absent they are built here if nvcc is on PATH,
# else their cells are left out with the reason in "$OUT/gpu-h200-jit/skipped.txt".
#   OUT=/some/dir bash scripts/gpu/jit.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
dest="$OUT/gpu-h200-jit"
mkdir -p "$dest"
select=()
if [ ! -x examples/jit/bin/add1-sm100 ] || [ ! -x examples/jit/bin/add1-sm90 ]; then
  if command -v nvcc >/dev/null; then
    bash examples/jit/build.sh > "$dest/build.log" 2>&1
  else
    echo "nvcc-sm100-only, nvcc-sm90-static: not run: examples/jit/bin/ is absent and this host has no nvcc (build them with examples/jit/build.sh where nvcc 13.0 is)" | tee "$dest/skipped.txt"
    select=(-k "not nvcc")
  fi
fi
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader || true
  cat examples/jit/bin/nvcc-version.txt 2>/dev/null
  python3 - <<'PY'
import importlib.metadata as md
for dist in ("torch", "triton", "cupy-cuda13x", "jax", "jax-cuda13-plugin", "numba-cuda", "cuda-bindings",
             "nvidia-cuda-nvrtc", "nvidia-cuda-nvcc", "nvidia-nvjitlink"):
    try:
        print(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist}: not installed")
PY
} > "$dest/programs.txt" 2>&1
python3 -m cumatrix run examples/h200-jit.yaml "${select[@]}" --out "$dest" -q -n "${NPROC:-4}" 2>&1 | tee "$dest/run.log" | tail -40
status=${PIPESTATUS[0]}
# One line per cell: id, status, outcome, expected, and the rule's reason.
python3 - "$dest/results.json" <<'PY' | tee "$dest/cells.txt"
import json, sys
data = json.load(open(sys.argv[1]))
for c in data.get("cells", []):
    if c.get("type", "cell") != "cell":
        continue
    print(f"{c['id']:40s} {c['status']:5s} {c['observed']['outcome']:26s} expected {'|'.join(c['expected']['outcomes'])}")
    print(f"    {c['expected']['rule']}: {c['expected']['reason'][:300]}")
PY
exit "$status"
