#!/usr/bin/env bash
# Every road to libcuda, under the real driver and emulated 12.4 and 12.8 (docs/emulation.md),
# into "$OUT/gpu-h200-driver-roads/": C programs that reach the driver as numba-cuda's lookup does
# (dlopen "libcuda.so" first), by the real driver's full path, and through a DT_RPATH naming the
# real driver's directory (built here with gcc: examples/jit/driver_roads.c); NVRTC's PTX behind
# comments loaded and linked through cuda-bindings (examples/jit/nvrtc_comments.py); a numba-cuda
# kernel with numba-cuda's own driver lookup (examples/jit/numba_roads.py).  Each emulated cell
# must end at the emulated driver (the C programs exit 0 when cuDriverGetVersion is the cell's
# emulated version) or fail as a real driver of that version fails (PTX ISA 9.0:
# CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222).  roads.txt says, cell by cell, whether it did.
# Run it after the JIT matrix: scripts/gpu/all.sh jit driver-roads.
#   OUT=/some/dir bash scripts/gpu/driver_roads.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
dest="$OUT/gpu-h200-driver-roads"
mkdir -p "$dest" examples/jit/bin
real=$(ldconfig -p | awk '/^\tlibcuda\.so\.1 .*x86-64/ {print $NF; exit}')
real=$(realpath "${real:-/usr/lib/x86_64-linux-gnu/libcuda.so.1}")
echo "real driver: $real" | tee "$dest/host.txt"
c_cases=""
if command -v gcc >/dev/null && [ -f "$real" ]; then
  gcc -O2 -o examples/jit/bin/driver-roads examples/jit/driver_roads.c -ldl \
    && gcc -O2 -DLINKED -o examples/jit/bin/driver-roads-rpath examples/jit/driver_roads.c "$real" \
         -Wl,--disable-new-dtags -Wl,-rpath,"$(dirname "$real")" \
    && c_cases=yes
  readelf -d examples/jit/bin/driver-roads-rpath 2>/dev/null | grep -E 'RPATH|RUNPATH|NEEDED' >> "$dest/host.txt"
else
  echo "C programs: not run: no gcc on PATH or no real driver at $real" | tee -a "$dest/host.txt"
fi
{
  echo "version: 1"
  echo "probe: false"
  echo "runtimes: {cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}}"
  echo "drivers: [host, emulated-12.4, emulated-12.8]"
  echo "cases:"
  if [ -n "$c_cases" ]; then
    echo "  - {name: numba-style-lookup, argv: [jit/bin/driver-roads, cell, libcuda.so, libcuda.so.1], cwd: $PWD/examples}"
    echo "  - {name: versioned-name, argv: [jit/bin/driver-roads, cell, $(basename "$real")], cwd: $PWD/examples}"
    echo "  - {name: full-path, argv: [jit/bin/driver-roads, cell, $real], cwd: $PWD/examples}"
    echo "  - {name: dt-rpath, argv: [jit/bin/driver-roads-rpath, cell], cwd: $PWD/examples}"
  fi
  echo "  - {name: nvrtc-comments, argv: [python3, jit/nvrtc_comments.py], timeout: 180, python: harness, cwd: $PWD/examples}"
  echo "  - {name: numba-kernel, argv: [python3, jit/numba_roads.py], timeout: 300, python: harness, cwd: $PWD/examples}"
} > "$dest/roads.yaml"
python3 -m cumatrix run "$dest/roads.yaml" --out "$dest/run" -q -n "${NPROC:-4}" 2>&1 | tee "$dest/run.log" | tail -30
# One line per cell: what it did, and whether it ended where emulation must end.
python3 - "$dest/run/results.json" <<'PY' | tee "$dest/roads.txt"
import json, sys
refused = ("222", "UNSUPPORTED_PTX_VERSION")
bad = 0
for c in json.load(open(sys.argv[1])).get("cells", []):
    if c.get("type", "cell") != "cell":
        continue
    cid, out = c["id"], c["observed"]["outcome"]
    tail = (c.get("stderr_tail") or "") + (c.get("stdout_tail") or "")
    emulated = "/emulated-" in cid
    if cid.split("/")[2] in ("numba-style-lookup", "versioned-name", "full-path", "dt-rpath"):
        good, want = out == "ok", "the cell's driver's version"
    elif emulated and cid.split("/")[2] == "numba-kernel":
        # fails as on a real old driver: 222 where the driver's JIT gets the PTX, or numba-cuda's
        # own refusal of the driver's version before any PTX (said on the line)
        good = out.startswith(("exit:", "crash:", "cuda-error:", "cannot-emulate"))
        want = "a failure (222 seen)" if any(r in tail for r in refused) else "a failure (no 222 seen)"
    elif emulated:
        good, want = out != "ok" and any(r in tail for r in refused), "refused with 222"
    else:
        good, want = out == "ok", "ok"
    bad += not good
    last = tail.strip().splitlines()[-1][:160] if tail.strip() else ""
    print(f"{'PASS' if good else 'FAIL'} {cid:50s} {out:28s} want {want}: {last}")
print(f"{bad} cell(s) did not end where emulation must end")
sys.exit(1 if bad else 0)
PY
