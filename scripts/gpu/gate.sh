#!/usr/bin/env bash
# The gate's device-code classes on a real GPU (no network needed).
#
# Builds with nvcc three wheels whose extension launches one kernel:
#   sass-miss  SASS for sm_80 only, no PTX: imports everywhere; on an sm_90 GPU the launch
#              fails with "no kernel image is available for execution on the device".
#   ptx-only   PTX for compute_90 only (nvcc 13.0 writes PTX ISA 9.0, which needs a CUDA 13.0
#              driver to JIT): runs on the host's 13.x driver; the static audit with
#              --min-driver 12.8 says ptx-too-new.
#   ptx-future nvcc's PTX for compute_90 with its ISA version raised to 9.9, embedded as text
#              in a gcc-built extension that loads it through the driver API
#              (cuModuleLoadData), so the real driver itself refuses it:
#              CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222).  (The emulated driver forwards JIT to
#              the real one, so it cannot refuse PTX on its own.)
# then gates each with `cumatrix gate ... --smoke` on a matrix of the host driver and the
# emulated 12.8 driver x the cu12.8 and cu13.0 runtimes (wheels from ./.wheels).
# Everything goes under "$OUT/gate/".
#   OUT=gpu-out bash scripts/gpu/gate.sh
# (GATE_STATIC_ONLY=1 stops each gate after the static audit: a check on a machine without a GPU.)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
G="$OUT/gate"
mkdir -p "$G"
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} XDG_CACHE_HOME=${XDG_CACHE_HOME:-/var/cache} PYTHONUNBUFFERED=1
mkdir -p "$XDG_CACHE_HOME/cumatrix/wheels" && cp -n .wheels/*.whl "$XDG_CACHE_HOME/cumatrix/wheels/" 2>/dev/null
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
{ nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader; "$NVCC" --version | tail -2; } \
  > "$G/host.txt" 2>&1
cat "$G/host.txt"

cat > "$W/k.cu" <<'EOF'
#include <cstdio>
#include <cuda_runtime.h>
__global__ void fill(int *p) { p[threadIdx.x] = (int)threadIdx.x; }
static char msg[256];
extern "C" const char *run(void) {
    int *d = 0;
    cudaError_t e = cudaMalloc(&d, 64 * sizeof(int));
    if (e == cudaSuccess) { fill<<<1, 64>>>(d); e = cudaGetLastError(); }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaSuccess) return 0;
    snprintf(msg, sizeof msg, "%s (%d): %s", cudaGetErrorName(e), (int)e, cudaGetErrorString(e));
    return msg;
}
EOF
cat > "$W/drv.c" <<'EOF'
#include <dlfcn.h>
#include <stdio.h>
extern const char ptx_text[];
static char msg[256];
typedef int (*f_i)(unsigned);
typedef int (*f_dev)(int *, int);
typedef int (*f_ctx)(void **, unsigned, int);
typedef int (*f_load)(void **, const void *);
typedef int (*f_str)(int, const char **);
const char *run(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return "libcuda.so.1 not found";
    f_i init = (f_i)dlsym(h, "cuInit"); f_dev dev = (f_dev)dlsym(h, "cuDeviceGet");
    f_ctx ctx = (f_ctx)dlsym(h, "cuCtxCreate_v2"); f_load load = (f_load)dlsym(h, "cuModuleLoadData");
    f_str name = (f_str)dlsym(h, "cuGetErrorName");
    int d = 0; void *c = 0, *m = 0; int r = init(0);
    if (!r) r = dev(&d, 0);
    if (!r) r = ctx(&c, 0, d);
    if (!r) r = load(&m, ptx_text);
    if (!r) return 0;
    const char *n = "?"; name(r, &n);
    snprintf(msg, sizeof msg, "cuModuleLoadData: %s (%d)", n, r);
    return msg;
}
EOF

# The package: importing it loads the extension; `python3 -m <pkg>.smoke` launches the kernel.
make_wheel() {  # make_wheel DIST SOFILE
  python3 - "$1" "$2" "$W" <<'EOF'
import base64, hashlib, sys, zipfile
from pathlib import Path
dist, so, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
tag = "py3-none-linux_x86_64"
info = f"{dist}-1.0.dist-info"
files = {
    # Importing the package loads the extension (no GPU needed for that).
    f"{dist}/__init__.py": (
        b"import ctypes, os\n"
        b"lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), '_ext.so'))\n"),
    f"{dist}/_ext.so": so.read_bytes(),
    f"{dist}/smoke.py": (
        b"import ctypes, sys\n"
        + f"from {dist} import lib\n".encode()
        + b"lib.run.restype = ctypes.c_char_p\n"
        b"err = lib.run()\n"
        b"if err:\n    sys.exit('kernel launch failed: ' + err.decode())\n"
        b"print('kernel ran')\n"),
    f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n".encode(),
    f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: gate.sh\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
    f"{info}/top_level.txt": f"{dist}\n".encode(),
}
rec = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
       for n, d in files.items()] + [f"{info}/RECORD,,"]
files[f"{info}/RECORD"] = ("\n".join(rec) + "\n").encode()
path = out / f"{dist}-1.0-{tag}.whl"
with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
    for n, d in files.items():
        zf.writestr(n, d)
print(path)
EOF
}

(cd "$W" && "$NVCC" -shared -Xcompiler -fPIC -gencode arch=compute_80,code=sm_80 k.cu -o sass_miss.so \
   && "$NVCC" -shared -Xcompiler -fPIC -gencode arch=compute_90,code=compute_90 k.cu -o ptx_only.so \
   && "$NVCC" -ptx -arch=compute_90 k.cu -o k.ptx \
   && sed 's/^\.version .*/.version 9.9/' k.ptx > future.ptx \
   && { printf 'const char ptx_text[] = '; sed 's/\\/\\\\/g; s/"/\\"/g; s/^/"/; s/$/\\n"/' future.ptx; echo ';'; } > ptx.c \
   && gcc -shared -fPIC drv.c ptx.c -o ptx_future.so -ldl) > "$G/build.log" 2>&1 \
  || { echo "nvcc build failed:"; tail -20 "$G/build.log"; exit 1; }
SASS=$(make_wheel gate_sass_miss "$W/sass_miss.so")
PTX=$(make_wheel gate_ptx_only "$W/ptx_only.so")
FUT=$(make_wheel gate_ptx_future "$W/ptx_future.so")
# The gates run on relative paths under the checkout (a neutral place under all.sh), so the
# reports name gate-run/..., not where this machine keeps its output or temporary files.
R=gate-run
rm -rf "$R" && mkdir -p "$R"
cp "$SASS" "$PTX" "$FUT" "$R/"
SASS="$R/$(basename "$SASS")" PTX="$R/$(basename "$PTX")" FUT="$R/$(basename "$FUT")"

cat > "$R/matrix.yaml" <<'EOF'
version: 1
runtimes:
  cu12.8: {wheel: nvidia-cuda-runtime-cu12==12.8.90}
  cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}
drivers: [host, emulated-12.8]
EOF

run_gate() {  # run_gate NAME WHEEL PKG [static options...]
  local name=$1 wheel=$2 pkg=$3; shift 3
  echo "=== gate $name ($(date -u +%H:%M:%S))"
  python3 -m cumatrix gate "$wheel" --matrix "$R/matrix.yaml" --wheel-dir .wheels \
    --smoke "python3 -m $pkg.smoke" --out "$R/$name" ${GATE_STATIC_ONLY:+--static-only} "$@" \
    > "$G/$name.log" 2>&1
  echo "exit $?" | tee -a "$G/$name.log"
  tail -25 "$G/$name.log"
}
run_gate sass-miss "$SASS" gate_sass_miss --min-driver 13.0 --arch-list "8.0 9.0"
run_gate ptx-only "$PTX" gate_ptx_only --min-driver 12.8 --forward-compat --arch-list "9.0"
run_gate ptx-future "$FUT" gate_ptx_future --min-driver 12.8 --arch-list "9.0"
rm -rf "$R"/*/gate-sites "$R"/*/.cumatrix.lock
cp -a "$R"/. "$G/"
echo "reports under \$OUT/gate/"
