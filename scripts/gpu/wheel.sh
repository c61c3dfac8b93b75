#!/usr/bin/env bash
# The platform wheel on the GPU host, as a user installs it: the wheel from ./.dist (built
# where there is a compiler: `python -m build --wheel --outdir .dist .`), installed without its
# dependencies (the host's, or ./.whl's, serve) into a directory of its own that comes first on
# the path, with a cache of its own (nothing compiled before is found), then
# examples/h200-wheel.yaml run and every record checked: the kernel's mappings, a trace, the
# runtime seen mapped, no missing evidence, and the probes passing on the real driver.
# Then, with every C compiler hidden (a PATH of links to everything else, CC unset), an
# emulated driver from the wheel's prebuilt interposer: patched for this host, checked with
# ctypes (the version, a hidden entry point, a forwarded call), and a CUDA 13 runtime's probe
# under it (expected cuda-error:35, as from the compiled interposer in reports/gpu-h200-drivers).
set -euo pipefail
OUT=${OUT:?}
wheel=$(ls .dist/cumatrix-*-linux_*.whl 2>/dev/null | head -n 1 || true)
[ -n "$wheel" ] || { echo "wheel: no platform wheel in .dist/ (python -m build --wheel --outdir .dist .)"; exit 2; }
site=/tmp/cumatrix-wheel-site
rm -rf "$site" && python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel"
export PYTHONPATH="$site:${PYTHONPATH#"$PWD/src:"}" XDG_CACHE_HOME=/tmp/cumatrix-wheel-cache
mkdir -p "$XDG_CACHE_HOME/cumatrix/wheels" && cp -n .wheels/*.whl "$XDG_CACHE_HOME/cumatrix/wheels/" 2>/dev/null || true
echo "gcc on PATH: $(command -v gcc || echo none)"
python3 -c 'import cumatrix, sys; print("cumatrix from", cumatrix.__file__); sys.exit(0 if cumatrix.__file__.startswith("/tmp/cumatrix-wheel-site/") else 1)'
python3 -m cumatrix doctor | grep -E "evidence|gpu"
python3 -m cumatrix run examples/h200-wheel.yaml --require-gpu --out "$OUT/gpu-h200-wheel" -q
python3 - "$OUT/gpu-h200-wheel/results.jsonl" <<'PY'
import json, sys
recs = [json.loads(ln) for ln in open(sys.argv[1]) if ln.strip()]
cells = {r["id"]: r for r in recs if r.get("type") == "cell"}
assert len(cells) == 4, sorted(cells)
for cid, r in sorted(cells.items()):
    fp = r["fingerprint"]
    assert r["status"] == "pass", (cid, r["observed"], r.get("mismatch"))
    assert fp.get("mappings_from") == "kernel" and fp.get("trace"), (cid, fp.get("mappings_from"))
    assert "missing_evidence" not in fp, (cid, fp.get("missing_evidence_why"))
    assert fp.get("runtime_version"), cid
    print(f"{cid}: {r['observed']['outcome']}, runtime {fp['runtime_version']} seen mapped by the kernel")
print("wheel: every cell observed in full from the installed wheel")
PY

# ------------------------------------------------------------------ emulated, no compiler
nocc=/tmp/cumatrix-wheel-nocc
rm -rf "$nocc" && mkdir -p "$nocc"
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
  for f in "$d"/*; do
    n=${f##*/}
    [[ -x "$f" && ! -e "$nocc/$n" ]] || continue
    [[ "$n" =~ ^((x86_64-linux-gnu-)?(cc|c89|c99|gcc|g\+\+|c\+\+|clang|clang\+\+|tcc))(-[0-9.]+)?$ ]] && continue
    ln -s "$f" "$nocc/$n"
  done
done
nocc_env=(env -u CC PATH="$nocc")
if "${nocc_env[@]}" sh -c 'command -v gcc || command -v cc'; then echo "wheel: a compiler is still on PATH"; exit 1; fi
"${nocc_env[@]}" python3 - <<'PY'
import ctypes, json, os, subprocess, sys
from pathlib import Path
from cumatrix.core.model import CudaVersion
from cumatrix.execute.driverquery import read_driver_version
from cumatrix.host.fingerprint import find_real_libcuda
from cumatrix.provision import drivers as D, headers as H
from cumatrix.provision.runtimes import headers_for
real = find_real_libcuda()
inc = headers_for("13.0")
ip = D.build_interposer(CudaVersion(12, 8), real_libcuda=real, introductions=H.load_introductions(inc),
                        base_introductions=H.load_base_introductions(inc), real_driver_version=read_driver_version(real))
assert ip.prebuilt, ip
print(f"emulated 12.8 from the prebuilt over {real}: {ip.exported} exports, {len(ip.hidden)} hidden, "
      f"{len(ip.missing)} of the real driver's not carried: {', '.join(ip.missing) or 'none'}")
probe = r"""
import ctypes, json
c = ctypes.CDLL("libcuda.so.1"); v = ctypes.c_int()
out = {"version": [c.cuDriverGetVersion(ctypes.byref(v)), v.value], "init": c.cuInit(0)}
for n in ("cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2"):
    try:
        getattr(c, n); out[n] = "exported"
    except AttributeError as e:
        out[n] = str(e).split(": ", 1)[-1]
n = ctypes.c_int(); out["devices"] = [c.cuDeviceGetCount(ctypes.byref(n)), n.value]
print(json.dumps(out))
"""
got = json.loads(subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, LD_LIBRARY_PATH=str(ip.lib_dir)),
                                capture_output=True, text=True, check=True).stdout)
print(got)
assert got["version"] == [0, 12080] and got["init"] == 0, got
assert got["cuMemcpyBatchAsync"] == "exported", got
assert got["cuMemcpyBatchAsync_v2"] == "undefined symbol: cuMemcpyBatchAsync_v2", got
assert got["devices"][0] == 0 and got["devices"][1] >= 1, got  # forwarded to the real driver
PY
cat >"$OUT/emulated.yaml" <<'YAML'
version: 1
runtimes:
  cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}
drivers: [emulated-12.8]
YAML
"${nocc_env[@]}" python3 -m cumatrix run "$OUT/emulated.yaml" --require-gpu --out "$OUT/gpu-h200-wheel-emulated" -q
python3 - "$OUT/gpu-h200-wheel-emulated/results.jsonl" <<'PY'
import json, sys
cells = {r["id"]: r for r in map(json.loads, filter(str.strip, open(sys.argv[1]))) if r.get("type") == "cell"}
r = cells["cu13.0/emulated-12.8/probe"]
fp = r["fingerprint"]
assert r["status"] == "pass" and r["observed"]["outcome"] == "cuda-error:35", (r["observed"], r.get("mismatch"))
assert fp.get("mappings_from") == "kernel" and fp.get("trace"), fp.get("mappings_from")
assert set(fp.get("missing_evidence", [])) <= {"interposer"}, fp.get("missing_evidence_why")
print(f"cu13.0/emulated-12.8/probe: {r['observed']['outcome']} from the prebuilt interposer, no compiler; "
      f"missing: {fp.get('missing_evidence_why') or 'nothing'}")
print("wheel: an emulated driver from the prebuilt interposer, with no compiler on the host")
PY
