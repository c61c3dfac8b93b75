#!/usr/bin/env bash
# A sandboxed probe and swap cell must still reach the GPU: run them under bubblewrap (no
# network, only system directories and what the cell names bound read-only, no host sockets,
# private size-limited /tmp, the GPU's device nodes bound in; as root, the cell runs as
# nobody) on a GPU host.
# Runtime wheels come from ./.wheels, extra Python packages from ./.whl (as gpu-evidence.sh);
# bubblewrap from the host, else from a Debian .deb in ./.bwrap (`apt-get download bubblewrap`).
# Output: ${OUT:-gpu-out}/sandbox/ (sandbox.log, cells.json, bwrap-check.txt, bwrap-argv.txt, run/ reports).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-out}
S="$OUT/sandbox"
mkdir -p "$S"
exec > >(tee "$S/sandbox.log") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/cumatrix-site .whl/*.whl
  export PYTHONPATH=/tmp/cumatrix-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-} XDG_CACHE_HOME=${XDG_CACHE_HOME:-/var/cache} PYTHONUNBUFFERED=1
install -d -m 700 "$XDG_CACHE_HOME/cumatrix" && mkdir -p "$XDG_CACHE_HOME/cumatrix/wheels" && cp -n .wheels/*.whl "$XDG_CACHE_HOME/cumatrix/wheels/" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || echo "nvidia-smi failed"
ls -l /dev/nvidia* /dev/dri 2>&1 | head -20

if ! command -v bwrap >/dev/null; then
  if ls .bwrap/bubblewrap_*.deb >/dev/null 2>&1; then
    mkdir -p /tmp/cumatrix-bwrap && dpkg -x .bwrap/bubblewrap_*.deb /tmp/cumatrix-bwrap
    export PATH=/tmp/cumatrix-bwrap/usr/bin:$PATH
    echo "bubblewrap unpacked from $(ls .bwrap/bubblewrap_*.deb)"
  else
    echo "FAILED: no bwrap on this host and no .bwrap/bubblewrap_*.deb carried"; exit 1
  fi
fi
echo "bwrap: $(command -v bwrap) $(bwrap --version 2>&1)"
# The sandbox exactly as cells get it (the harness builds the command line), once by hand:
# what fails here is what the host refuses.  It also shows the boundary: the cell's uid (not
# root), no /run (no host sockets), a read-only /proc/sys, a size-limited /tmp.
python3 - "$S/bwrap-argv.txt" <<'PY' >"$S/bwrap-check.txt" 2>&1
import os, shlex, subprocess, sys
from cumatrix.execute import sandbox
from cumatrix.core.jobs import Job
bw, why = sandbox.bubblewrap()
if bw is None:
    sys.exit(f"no sandbox: {why}")
check = ('echo "inside: uid $(id -u), $(ls /dev | grep -c nvidia) nvidia nodes, tmp: $(ls -A /tmp | wc -l) entries, '
         '/run: $(test -e /run && echo present || echo absent), /proc/sys: $(test -w /proc/sys/vm/swappiness '
         '&& echo writable || echo read-only), tmp size: $(df -k /tmp | tail -1 | tr -s " " | cut -d" " -f2) KiB"; '
         'nvidia-smi -L')
job = Job(cell_id="check", kind="command", argv=("sh", "-c", check))
argv = sandbox.bwrap_argv(bw, job, sandbox.child_env(job), "/")
open(sys.argv[1], "w").write(shlex.join(argv) + "\n")
sys.exit(subprocess.run(argv, stdin=subprocess.DEVNULL).returncode)
PY
rc=$?
cat "$S/bwrap-check.txt"
if [ $rc -ne 0 ]; then echo "FAILED: bubblewrap cannot create the sandbox on this host (exit $rc; see above and $S/bwrap-argv.txt)"; exit 1; fi

# A probe and swap cells of the reference matrix, built and run through the harness with
# --sandbox semantics (CUMATRIX_SANDBOX=on: a cell without a sandbox is a harness error).
python3 - "$S" <<'PY'
import json, sys
from cumatrix.load import matrix as M
from cumatrix.execute import sandbox
from cumatrix.judge.classify import classify
from cumatrix.core.jobs import Job
from cumatrix.execute.local import run_local
from cumatrix.orchestrate import Orchestrator
from pathlib import Path
out = Path(sys.argv[1])
m = M.load("examples/h200-reference.yaml")
orch = Orchestrator(matrix=m, wheel_dir=Path(".wheels"))
want = ["cu12.9/host/probe", "cu13.0/host/probe", "cu12.9/host/runtime-dispatch/h12.8/kv-16k-d2h",
        "cu13.0/host/runtime-dispatch/h13.0/kv-16k-h2d"]
cells = [c for c in M.cells(m) if c.id in want]
rows = []
for cell in cells:
    job = orch.provisioner.prepare(cell)
    if not isinstance(job, Job):  # a fact (NotRun) decides the cell before any child
        rows.append({"id": cell.id, "not_run": job.why, "detail": job.detail})
        continue
    row = {"id": cell.id}
    for mode in ("off", "on"):
        res = run_local(job, policy=sandbox.Policy(sandbox=mode))
        obs = classify(res, kind=cell.kind)
        row[mode] = {"outcome": obs.outcome, "path": obs.path, "detail": obs.detail[:300], "extra": res.extra,
                     "device": obs.facts.gpu_name}
    rows.append(row)
    print(f"{cell.id}: unsandboxed {row['off']['outcome']} [{row['off']['path']}]; "
          f"sandboxed {row['on']['outcome']} [{row['on']['path']}] {row['on']['extra']}")
(out / "cells.json").write_text(json.dumps(rows, indent=1, default=str))
same = all(r.get("on", {}).get("outcome") == r.get("off", {}).get("outcome") for r in rows)
boxed = all(r.get("on", {}).get("extra", {}).get("sandbox") in ("bubblewrap", "namespaces") for r in rows)
print("SANDBOXED CELLS REACH THE GPU" if same and boxed and rows else "MISMATCH: see cells.json")
PY
# The same through the CLI as a user runs it (sandboxed by default; --require-sandbox: exit 3
# rather than an unsandboxed run where the host refuses), every probe and one swap family of
# two runtimes.
python3 -m cumatrix run examples/h200-reference.yaml --wheel-dir .wheels --out "$S/run" -q --require-sandbox \
  -k "(cu12.9 or cu13.0) and (probe or kv-16k-d2h)" 2>&1 | tail -20
# The host's own CUDA programs (torch, CuPy, JAX, cuda-bindings) under the sandbox, real driver.
python3 -m cumatrix run examples/h200-clients.yaml --wheel-dir .wheels --out "$S/clients" -q --require-sandbox \
  -k "host" 2>&1 | tail -20
python3 -c 'import json, sys; [print(d, "sandbox:", json.load(open(f"{d}/results.json"))["run"]["sandbox"]) for d in sys.argv[1:]]' \
  "$S/run" "$S/clients"
# The sandbox's cost per cell here: 1,000 cells of `python3 -c pass` each way, interleaved.
python3 benchmarks/sandbox_overhead.py -N 1000 --only 'python3 -c pass' 2>&1 | tee "$S/overhead.txt"
# The same with bubblewrap per cell (the holder before the fork server), 300 cells each way.
CUMATRIX_FORK_SERVER=off python3 benchmarks/sandbox_overhead.py -N 300 --only 'python3 -c pass' 2>&1 \
  | tee "$S/overhead-bubblewrap.txt"
# The fork server's own promises and every boundary test against both holders, on this host.
python3 -m pytest -p no:cacheprovider -q tests/integration/test_fork_server.py tests/integration/test_sandbox_boundary.py \
  --junitxml "$S/boundary-tests.xml" 2>&1 | tail -5
# A default run of 1,000 trivial cells, sandboxed and not, against a bare spawn loop.
python3 benchmarks/harness_scale.py --sizes 1000 --reps 1 --configs floor cumatrix cumatrix-nosb 2>&1 \
  | tee "$S/harness-scale.txt" | tail -4
