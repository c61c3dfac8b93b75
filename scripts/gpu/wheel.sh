#!/usr/bin/env bash
# The platform wheel on the GPU host, as a user installs it: the wheel from ./.dist (built
# where there is a compiler: `python -m build --wheel --outdir .dist .`), installed without its
# dependencies (the host's, or ./.whl's, serve) into a directory of its own that comes first on
# the path, with a cache of its own (nothing compiled before is found), then
# examples/h200-wheel.yaml run and every record checked: the kernel's mappings, a trace, the
# runtime seen mapped, no missing evidence, and the probes passing on the real driver.
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
