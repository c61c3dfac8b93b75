#!/usr/bin/env bash
# Sandboxed cells as an ordinary user on a GPU host: the fork server in a user namespace of its
# own (no bubblewrap per cell), the cells reaching the GPU, and what it costs there.  Run by
# root: it makes a local user (cmxgpu, useradd) and a copy of the checkout that user owns, then,
# as that user: which holder serves, a probe and a swap cell of the reference matrix sandboxed
# and not (the same outcome, the GPU reached), the attacks of test_cell_kernel_state.py, and the
# costs: benchmarks/sandbox_overhead.py (1,000 cells of `python3 -c pass` each way, interleaved)
# and benchmarks/harness_scale.py (a default run of 1,000 such cells, sandboxed and not, against
# a bare spawn loop).
# Output: ${OUT:-gpu-out}/sandbox-user/ (sandbox-user.log, cells.json, overhead.txt, harness-scale.txt, kernel-state.xml).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=$(realpath -m "${OUT:-gpu-out}")
S="$OUT/sandbox-user"
mkdir -p "$S"
exec > >(tee "$S/sandbox-user.log") 2>&1
[ "$(id -u)" = 0 ] || { echo "FAILED: run as root (it makes the ordinary user)"; exit 1; }
id cmxgpu >/dev/null 2>&1 || useradd --no-create-home --shell /bin/sh cmxgpu || { echo "FAILED: useradd"; exit 1; }
U=/tmp/cumatrix-user
rm -rf "$U" && mkdir -p "$U/home" "$U/cache/cumatrix/wheels"
cp -a src tests benchmarks examples reference pyproject.toml "$U/" && cp -a .wheels "$U/" 2>/dev/null
cp -n .wheels/*.whl "$U/cache/cumatrix/wheels/" 2>/dev/null
[ -d /tmp/cumatrix-site ] && cp -a /tmp/cumatrix-site "$U/site"
chown -R cmxgpu: "$U" && chmod 700 "$U/cache"
as_user() {  # as_user COMMAND...: the ordinary user, with its own home and cache
  setpriv --reuid=cmxgpu --regid="$(id -g cmxgpu)" --init-groups env -C "$U" HOME="$U/home" XDG_CACHE_HOME="$U/cache" \
    XDG_STATE_HOME="$U/home/state" XDG_DATA_HOME="$U/home/data" TMPDIR="$U/home" PATH="$PATH" PYTHONUNBUFFERED=1 \
    PYTHONPATH="$U/src:$U/site" CUMATRIX_WHEEL_DIR="$U/.wheels" "$@"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || echo "nvidia-smi failed"
echo "user namespaces: max $(cat /proc/sys/user/max_user_namespaces), apparmor restriction $(cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns 2>/dev/null || echo none)"
ls -l /dev/nvidia* 2>&1 | head -5
as_user python3 - "$S" <<'PY'
import json, sys
from pathlib import Path
from cumatrix.core.jobs import Job
from cumatrix.execute import forkserver, sandbox
from cumatrix.execute.local import run_local
from cumatrix.judge.classify import classify
from cumatrix.load import matrix as M
from cumatrix.orchestrate import Orchestrator
out = Path(sys.argv[1])
print("holder:", sandbox.describe(sandbox.Policy(sandbox="on")), "server check:", forkserver.why_not())
check = run_local(Job(cell_id="c", kind="command", timeout=60, argv=("sh", "-c",
                  "id; cat /proc/self/uid_map; ls /dev | grep -c nvidia; nvidia-smi -L")), policy=sandbox.Policy(sandbox="on"), cwd="/")
print("check cell:", check.extra, check.stdout_tail, check.stderr_tail)
m = M.load("examples/h200-reference.yaml")
orch = Orchestrator(matrix=m, wheel_dir=Path(".wheels"))
want = ["cu12.9/host/probe", "cu13.0/host/probe", "cu13.0/host/runtime-dispatch/h13.0/kv-16k-h2d"]
rows = []
for cell in [c for c in M.cells(m) if c.id in want]:
    job = orch.provisioner.prepare(cell)
    if not isinstance(job, Job):
        rows.append({"id": cell.id, "not_run": job.why})
        continue
    row = {"id": cell.id}
    for mode in ("off", "on"):
        res = run_local(job, policy=sandbox.Policy(sandbox=mode))
        obs = classify(res, kind=cell.kind)
        row[mode] = {"outcome": obs.outcome, "path": obs.path, "extra": res.extra, "device": obs.facts.gpu_name,
                     "traced": bool(res.trace and res.trace.complete)}
    rows.append(row)
    print(f"{cell.id}: unsandboxed {row['off']['outcome']}; sandboxed {row['on']['outcome']} {row['on']['extra']}")
(Path("cells.json")).write_text(json.dumps(rows, indent=1, default=str))  # the user's own directory
ok = rows and all(r.get("on", {}).get("outcome") == r.get("off", {}).get("outcome") and
                  r["on"]["extra"].get("sandbox") == "namespaces" for r in rows)
print("SANDBOXED CELLS OF AN ORDINARY USER REACH THE GPU" if ok else "MISMATCH: see cells.json")
PY
cp "$U/cells.json" "$S/cells.json" 2>/dev/null
# The kernel-state attacks, run by root: each as a root harness and as a second local user's
# harness (the test makes that user and drops to it).
python3 -m pytest -p no:cacheprovider -q -rfs tests/integration/test_cell_kernel_state.py \
  --junitxml "$S/kernel-state.xml" 2>&1 | tail -12
# The cost as that user: per cell, interleaved, then a default run against the bare loop
# (SANDBOX_USER_BENCH=0 leaves them out; =overhead runs the first alone).
[ "${SANDBOX_USER_BENCH:-1}" = 0 ] && exit 0
as_user python3 benchmarks/sandbox_overhead.py -N 1000 --only 'python3 -c pass' 2>&1 | tee "$S/overhead.txt"
[ "${SANDBOX_USER_BENCH:-1}" = overhead ] && exit 0  # the per-cell figure alone
as_user python3 benchmarks/harness_scale.py --sizes 1000 --reps 1 --configs floor cumatrix cumatrix-nosb 2>&1 \
  | tee "$S/harness-scale.txt" | tail -4
