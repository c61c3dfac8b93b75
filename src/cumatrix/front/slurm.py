"""A nightly over several hosts through Slurm: one job-array task per host of the plan, and a
merge that runs after them whatever became of them.

``cumatrix plan MATRIX --format slurm --out DIR`` writes the scripts (``DIR/slurm/``);
``cumatrix submit --slurm MATRIX --out DIR`` submits them, waits, merges and exits with the
merge's status.  Array task *i* runs ``cumatrix run MATRIX --host HOST_i --out DIR/HOST_i``;
a host entry's ``partition:`` and ``constraint:`` are set on its own task (the array is
submitted held, each task updated, then released: one array can span partitions that way).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cumatrix.core.errors import CumatrixError, EnvironmentProblem, UsageError
from cumatrix.front.plan import assign
from cumatrix.load import matrix as _matrix

#: Job states after which a job will not run again (``squeue``/``scontrol`` spelling).
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                          "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})


class SlurmError(CumatrixError):
    """Slurm refused or failed a request (sbatch, scontrol): exit 3, its message quoted."""

    exit_code = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class HostTask:
    """One array task: the host it runs as, and where Slurm should place it."""

    index: int
    host: str
    cells: int
    partition: str | None = None
    constraint: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SlurmPlan:
    """The scripts of a Slurm nightly and what submitting them needs."""

    matrix: Path
    out: Path
    tasks: tuple[HostTask, ...]
    array_script: Path
    merge_script: Path
    submit_script: Path

    def host_dir(self, host: str) -> Path:
        """Where host ``host``'s run writes its results."""
        return self.out / host

    @property
    def merged_dir(self) -> Path:
        return self.out / "merged"


def cumatrix_command() -> list[str]:
    """How a job starts this cumatrix: this interpreter, ``-m cumatrix`` (a batch job's PATH
    may lack the virtual environment's bin directory)."""
    return [sys.executable, "-m", "cumatrix"]


def _check_placement(matrix: Path, tasks: Sequence[HostTask]) -> None:
    """A host with neither ``partition:`` nor ``constraint:`` gets whichever node Slurm picks:
    with other hosts in the plan that may be another host's node (another driver), so the plan
    is refused (exit 2); alone, it is said on stderr."""
    loose = [t.host for t in tasks if not (t.partition or t.constraint)]
    if not loose:
        return
    what = (f"{matrix}: hosts: {', '.join(loose)} name{'s' if len(loose) == 1 else ''} no `partition:` or "
            "`constraint:`: its array task would run on whichever node Slurm gives it")
    if len(tasks) > 1:
        raise UsageError(f"{what}, perhaps another host's, with another driver; add `partition: P` (or "
                         "`constraint: FEATURE`) to each host so every task lands on its own nodes")
    print(f"cumatrix: warning: {what} (the partition's default); add `partition: P` to pin it", file=sys.stderr)


def _q(words: Sequence[str | Path]) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


def write_scripts(matrix: Path, out: Path, *, run_args: Sequence[str] = (), sbatch_args: Sequence[str] = (),
                  job_name: str = "cumatrix") -> SlurmPlan:
    """Plan ``matrix`` over its ``hosts:`` and write ``out/slurm/{array.sbatch, merge.sbatch,
    submit.sh}``.  Paths in the scripts are absolute: a job starts in whatever directory
    Slurm gives it."""
    matrix = matrix.resolve()
    out = out.resolve()
    m = _matrix.load(matrix)
    cells = _matrix.cells(m)
    tasks = tuple(HostTask(index=i, host=h.name, cells=sum(1 for c in cells if c.driver in ds),
                           partition=h.partition, constraint=h.constraint)
                  for i, (h, ds) in enumerate(assign(m, matrix, cells)))
    _check_placement(matrix, tasks)
    d = out / "slurm"
    d.mkdir(parents=True, exist_ok=True)
    cm = cumatrix_command()
    hosts = " ".join(shlex.quote(t.host) for t in tasks)
    extra = "".join(f"#SBATCH {a}\n" for a in sbatch_args)
    array = f"""#!/bin/bash
# One task per host of the plan of {matrix.name} (`cumatrix plan --format slurm`).
# Task i runs the cells the plan gives host i; its results go to {out}/HOST.
#SBATCH --job-name={job_name}
#SBATCH --array=0-{len(tasks) - 1}
#SBATCH --chdir={out}
#SBATCH --output={d}/%x-%A_%a.out
{extra}set -u
hosts=({hosts})
host="${{hosts[$SLURM_ARRAY_TASK_ID]}}"
echo "cumatrix: array task $SLURM_ARRAY_TASK_ID runs as host $host on $(hostname)"
exec {_q(cm)} run {shlex.quote(str(matrix))} --host "$host" --out {shlex.quote(str(out))}/"$host" {_q(run_args)}
"""
    merge = f"""#!/bin/bash
# The merge of every host's run: submitted with --dependency=afterany on the array, so it runs
# whatever became of the hosts; a host with no results is named by the merge (exit 1).
#SBATCH --job-name={job_name}-merge
#SBATCH --chdir={out}
#SBATCH --output={d}/%x-%j.out
{extra}set -u
dirs=()
for h in {hosts}; do
  [ -s {shlex.quote(str(out))}/"$h"/results.jsonl ] && dirs+=({shlex.quote(str(out))}/"$h")
done
if [ "${{#dirs[@]}}" -eq 0 ]; then
  echo "cumatrix: merge: no host wrote results ({hosts}); see the array's logs in {d}" >&2
  exit 1
fi
exec {_q(cm)} merge "${{dirs[@]}}" --matrix {shlex.quote(str(matrix))} --out {shlex.quote(str(out / "merged"))}
"""
    updates = "".join(_update_line(t) for t in tasks if t.partition or t.constraint)
    held = "--hold " if updates else ""
    submit = f"""#!/bin/bash
# Submit the nightly of {matrix.name}: the host array, then the merge after it.
# (`cumatrix submit --slurm` does the same, waits, and exits with the merge's status.)
set -euo pipefail
array=$(sbatch --parsable {held}{shlex.quote(str(d / "array.sbatch"))})
array=${{array%%;*}}
{updates}{"scontrol release " + chr(36) + "array" + chr(10) if updates else ""}merge=$(sbatch --parsable --dependency=afterany:$array {shlex.quote(str(d / "merge.sbatch"))})
echo "array job $array, merge job ${{merge%%;*}}; results in {out}/merged"
"""
    paths = []
    for name, text in (("array.sbatch", array), ("merge.sbatch", merge), ("submit.sh", submit)):
        p = d / name
        p.write_text(text, encoding="utf-8")
        p.chmod(0o755)
        paths.append(p)
    return SlurmPlan(matrix=matrix, out=out, tasks=tasks, array_script=paths[0], merge_script=paths[1],
                     submit_script=paths[2])


def _update_line(t: HostTask) -> str:
    rest = _update_args(t, "")[1:]
    return f'scontrol update JobId="${{array}}_{t.index}" {_q(rest)}\n'


def _update_args(t: HostTask, job: str) -> list[str]:
    args = [f"JobId={job}_{t.index}"]
    if t.partition:
        args.append(f"Partition={t.partition}")
    if t.constraint:
        args.append(f"Features={t.constraint}")
    return args


# --------------------------------------------------------------------------- submit and wait


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise EnvironmentProblem(f"{name} is not on PATH: `cumatrix submit --slurm` needs a Slurm client "
                                 "(apt-get install slurm-client) on a machine that can reach slurmctld")
    return path


def _call(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired as e:
        raise SlurmError(f"{_q(argv)}: no answer in 120 s") from e
    if proc.returncode != 0:
        raise SlurmError(f"{_q(argv)} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def submit(plan: SlurmPlan, *, sbatch_args: Sequence[str] = ()) -> tuple[str, str]:
    """Submit the array (held while each task gets its partition and constraint) and the merge
    after it; return (array job id, merge job id)."""
    sbatch, scontrol = _tool("sbatch"), _tool("scontrol")
    updates = [t for t in plan.tasks if t.partition or t.constraint]
    hold = ["--hold"] if updates else []
    array = _call([sbatch, "--parsable", *hold, *sbatch_args, str(plan.array_script)]).strip().split(";")[0]
    try:
        for t in updates:
            _call([scontrol, "update", *_update_args(t, array)])
        if updates:
            _call([scontrol, "release", array])
        merge = _call([sbatch, "--parsable", f"--dependency=afterany:{array}", *sbatch_args,
                       str(plan.merge_script)]).strip().split(";")[0]
    except SlurmError:
        subprocess.run([_tool("scancel"), array], capture_output=True, check=False)  # no half-submitted nightly
        raise
    return array, merge


def job_states(job_ids: Sequence[str]) -> dict[str, str]:
    """``{job id: state}`` of the jobs (array tasks as ``ARRAY_TASK``) that Slurm still knows:
    ``squeue`` for queued and running ones, ``scontrol show job`` for those that ended (no
    accounting database needed); ``sacct`` when scontrol has forgotten a job."""
    states: dict[str, str] = {}
    out = _call([_tool("squeue"), "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-o", "%i %T"]) \
        if job_ids else ""
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    for jid in job_ids:
        if any(k == jid or k.startswith(f"{jid}_") for k in states):
            continue
        states.update(_ended(jid))
    return states


def _ended(jid: str) -> dict[str, str]:
    proc = subprocess.run([_tool("scontrol"), "show", "job", "-o", jid], capture_output=True, text=True,
                          timeout=60, check=False)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
        key = kv.get("JobId", jid)
        if kv.get("ArrayTaskId") and kv.get("ArrayJobId"):
            key = f"{kv['ArrayJobId']}_{kv['ArrayTaskId']}"
        if "JobState" in kv:
            found[key] = kv["JobState"]
    if found or shutil.which("sacct") is None:
        return found
    proc = subprocess.run(["sacct", "-n", "-X", "-P", "-j", jid, "-o", "JobID,State"], capture_output=True,
                          text=True, timeout=60, check=False)
    for line in proc.stdout.splitlines():
        job, _, state = line.partition("|")
        if job:
            found[job] = state.split()[0] if state else "UNKNOWN"
    return found


def wait(plan: SlurmPlan, array: str, merge: str, *, poll: float = 5.0,
         say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, str]:
    """Poll until every array task and the merge job have ended; say each change of state.
    Returns the final ``{host or 'merge': state}``."""
    names = {f"{array}_{t.index}": t.host for t in plan.tasks}
    last: dict[str, str] = {}
    while True:
        states = job_states([array, merge])
        now = {names.get(k, k): v for k, v in states.items() if k in names}
        for t in plan.tasks:  # a task squeue has not split out of the pending array yet
            now.setdefault(t.host, states.get(array, states.get(f"{array}_[0-{len(plan.tasks) - 1}]", "PENDING")))
        now["merge"] = states.get(merge, "UNKNOWN")
        if now != last:
            done = sum(1 for t in plan.tasks if _final(now[t.host]))
            say(f"cumatrix: slurm: {done} of {len(plan.tasks)} hosts done ("
                + ", ".join(f"{t.host} {now[t.host]}" for t in plan.tasks) + f"); merge job {merge} {now['merge']}")
            last = now
        if all(_final(now[t.host]) for t in plan.tasks) and (_final(now["merge"]) or now["merge"] == "UNKNOWN"):
            return now
        time.sleep(poll)


def _final(state: str) -> bool:
    return state.split(maxsplit=1)[0].rstrip("+") in FINAL_STATES


def check_args(words: Sequence[str], flag: str) -> list[str]:
    """Words for the scripts: no newline could end a #SBATCH line or a command early."""
    for w in words:
        if "\n" in w or "\r" in w or "\0" in w:
            raise UsageError(f"{flag} {w!r}: no newlines in an argument")
    return list(words)
