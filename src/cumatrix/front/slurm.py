"""A nightly over several hosts through Slurm: one job-array task per host of the plan, and a
merge that runs after them whatever became of them.

``cumatrix plan MATRIX --format slurm --out DIR`` writes the scripts (``DIR/slurm/``);
``cumatrix submit --slurm MATRIX --out DIR`` submits them, waits, merges and exits with the
merge's status.  Array task *i* runs ``cumatrix run MATRIX --host HOST_i --out DIR/HOST_i``;
a host entry's ``partition:`` and ``constraint:`` are set on its own task (the array is
submitted held, each task updated, then released: one array can span partitions that way).
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cumatrix.core.errors import CumatrixError, EnvironmentProblem, UsageError
from cumatrix.core.private import write_new
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
    """One array task: the host it runs as, and where Slurm should place it.

    Not :class:`cumatrix.core.model.Host` again, though it carries its partition and
    constraint: a task is an array index with its count of cells, what the scripts and the
    placement check read, while a Host is the matrix's declaration (driver, label, CUDA)."""

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


def _q(words: Iterable[str | Path]) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


def write_scripts(matrix: Path, out: Path, *, run_args: Sequence[str] = (), sbatch_args: Sequence[str] = (),
                  job_name: str = "cumatrix") -> SlurmPlan:
    """Plan ``matrix`` over its ``hosts:`` and write ``out/slurm/{array.sbatch, merge.sbatch,
    submit.sh}``.  Paths in the scripts are absolute: a job starts in whatever directory
    Slurm gives it.

    Every value is a word quoted for the shell (:func:`shlex.quote`), never inside double
    quotes or a comment, where ``$(...)`` in a directory's name would run; a value that cannot
    be written into a script line at all (a control character in the matrix's path or in
    ``out``) is refused, naming it.  Paths go to sbatch on its command line (``--chdir``,
    ``--output``), not as ``#SBATCH`` lines, which sbatch reads with rules of its own.
    """
    matrix = matrix.resolve()
    out = out.resolve()
    _check_paths(matrix, out)
    tasks = _host_tasks(matrix)
    _check_placement(matrix, tasks)
    d = out / "slurm"
    d.mkdir(parents=True, exist_ok=True)
    cm = cumatrix_command()
    hosts = _q(t.host for t in tasks)
    extra = "".join(f"#SBATCH {check_text(a, '--sbatch-arg')}\n" for a in sbatch_args)
    merged = out / "merged"
    nobody = (f"cumatrix: merge: no host wrote results of this submission ({' '.join(t.host for t in tasks)}); "
              f"see the array's logs in {d}")
    array = f"""#!/bin/bash
# One task per host of the plan (`cumatrix plan --format slurm`): task i runs the cells the
# plan gives host i, its results in OUT/HOST.  Submit with submit.sh (or `cumatrix submit
# --slurm`): it sets CUMATRIX_SUBMISSION, the id each host's run records.
#SBATCH --job-name={job_name}
#SBATCH --array=0-{len(tasks) - 1}
{extra}set -u
submission="${{CUMATRIX_SUBMISSION:?submit with submit.sh or cumatrix submit --slurm (CUMATRIX_SUBMISSION is unset)}}"
cd {_q([out])}
hosts=({hosts})
host="${{hosts[$SLURM_ARRAY_TASK_ID]}}"
echo "cumatrix: array task $SLURM_ARRAY_TASK_ID runs as host $host on $(hostname)"
exec {_q(cm)} run {_q([matrix])} --host "$host" --submission "$submission" --out {_q([out])}/"$host" {_q(run_args)}
"""
    merge = f"""#!/bin/bash
# The merge of every host's run: submitted with --dependency=afterany on the array, so it runs
# whatever became of the hosts; a host with no results of this submission is named by the
# merge (exit 1).
#SBATCH --job-name={job_name}-merge
{extra}set -u
submission="${{CUMATRIX_SUBMISSION:?submit with submit.sh or cumatrix submit --slurm (CUMATRIX_SUBMISSION is unset)}}"
cd {_q([out])}
dirs=()
for h in {hosts}; do
  [ -s {_q([out])}/"$h"/results.jsonl ] && dirs+=({_q([out])}/"$h")
done
if [ "${{#dirs[@]}}" -eq 0 ]; then
  echo {_q([nobody])} >&2
  exit 1
fi
exec {_q(cm)} merge "${{dirs[@]}}" --matrix {_q([matrix])} --submission "$submission" --out {_q([merged])}
"""
    paths = []
    for name, text in (("array.sbatch", array), ("merge.sbatch", merge), ("submit.sh", _submit_text(d, out, tasks))):
        p = d / name
        write_new(p, text, replace=True, mode=0o755)  # a new file renamed into place: never through a link
        paths.append(p)
    return SlurmPlan(matrix=matrix, out=out, tasks=tasks, array_script=paths[0], merge_script=paths[1],
                     submit_script=paths[2])


def _check_paths(matrix: Path, out: Path) -> None:
    """The matrix's path and ``out`` can be written into the scripts and reach Slurm as they are."""
    check_text(str(matrix), "the matrix's path")
    check_text(str(out), "--out")
    if "\\" in str(out):
        # Slurm reads a backslash in a file-name pattern (--output) as "replace nothing" and drops
        # it: the log's directory then does not exist and every task fails before it starts.
        raise UsageError(f"--out {str(out)!r}: a backslash cannot reach Slurm's --output (its file-name patterns "
                         "read it as an escape and drop it); choose a directory without one")


def _host_tasks(matrix: Path) -> tuple[HostTask, ...]:
    """One array task per host of ``matrix``'s plan, with its count of cells and its placement."""
    m = _matrix.load(matrix)
    cells = _matrix.cells(m)
    return tuple(HostTask(index=i, host=h.name, cells=sum(1 for c in cells if c.driver in ds),
                          partition=h.partition, constraint=h.constraint)
                 for i, (h, ds) in enumerate(assign(m, matrix, cells)))


def _submit_text(d: Path, out: Path, tasks: Sequence[HostTask]) -> str:
    """submit.sh: the array (held while its tasks are placed, when any is), then the merge after it."""
    merged = out / "merged"
    updates = "".join(_update_line(t) for t in tasks if t.partition or t.constraint)
    held = "--hold " if updates else ""
    logs = _q([f"--output={_pattern(d)}/%x-%A_%a.out"])
    merge_logs = _q([f"--output={_pattern(d)}/%x-%j.out"])
    chdir = _q([f"--chdir={out}"])
    return f"""#!/bin/bash
# Submit the nightly of the plan: the host array, then the merge after it, both under a new
# submission id (each host's run records it; the merge takes only results that carry it).
# (`cumatrix submit --slurm` does the same, waits, and exits with the merge's status.)
set -euo pipefail
submission="s$(date -u +%Y%m%d%H%M%S)-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \\n')"
array=$(sbatch --parsable {held}--export="ALL,CUMATRIX_SUBMISSION=$submission" {chdir} {logs} {_q([d / "array.sbatch"])})
array=${{array%%;*}}
{updates}{"scontrol release " + chr(36) + "array" + chr(10) if updates else ""}merge=$(sbatch --parsable --dependency=afterany:$array --export="ALL,CUMATRIX_SUBMISSION=$submission" {chdir} {merge_logs} {_q([d / "merge.sbatch"])})
echo "submission $submission: array job $array, merge job ${{merge%%;*}}; results in "{_q([merged])}
"""


def _pattern(d: Path) -> str:
    """``d`` in a Slurm file-name pattern: a ``%`` of the directory's own name doubled (Slurm
    reads ``%%`` as ``%``), so that only the pattern's own ``%x``, ``%A``... are replaced."""
    return str(d).replace("%", "%%")


def new_submission() -> str:
    """A fresh submission id: when (UTC) and 48 random bits, a name ``check_name`` accepts."""
    return f"s{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{secrets.token_hex(6)}"


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


def submit(plan: SlurmPlan, submission: str, *, sbatch_args: Sequence[str] = ()) -> tuple[str, str]:
    """Submit the array (held while each task gets its partition and constraint) and the merge
    after it, both under ``submission``; return (array job id, merge job id)."""
    sbatch, scontrol = _tool("sbatch"), _tool("scontrol")
    updates = [t for t in plan.tasks if t.partition or t.constraint]
    hold = ["--hold"] if updates else []
    d = plan.array_script.parent
    common = [f"--export=ALL,CUMATRIX_SUBMISSION={submission}", f"--chdir={plan.out}"]
    array = _call([sbatch, "--parsable", *hold, *common, f"--output={_pattern(d)}/%x-%A_%a.out", *sbatch_args,
                   str(plan.array_script)]).strip().split(";")[0]
    try:
        for t in updates:
            _call([scontrol, "update", *_update_args(t, array)])
        if updates:
            _call([scontrol, "release", array])
        merge = _call([sbatch, "--parsable", f"--dependency=afterany:{array}", *common, f"--output={_pattern(d)}/%x-%j.out",
                       *sbatch_args, str(plan.merge_script)]).strip().split(";")[0]
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
    found = _scontrol_states(jid)
    if found or shutil.which("sacct") is None:
        return found
    return _sacct_states(jid)


def _scontrol_states(jid: str) -> dict[str, str]:
    """``{job id: state}`` of job ``jid`` (its array tasks as ``ARRAY_TASK``) as ``scontrol show job`` has them."""
    proc = subprocess.run([_tool("scontrol"), "show", "job", "-o", jid], capture_output=True, text=True,
                          timeout=60, check=False)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if "JobState" in kv:
            found[_job_key(kv, jid)] = kv["JobState"]
    return found


def _job_key(kv: Mapping[str, str], jid: str) -> str:
    """The id of the job an ``scontrol show job`` line describes: ``ARRAY_TASK`` for an array task."""
    if kv.get("ArrayTaskId") and kv.get("ArrayJobId"):
        return f"{kv['ArrayJobId']}_{kv['ArrayTaskId']}"
    return kv.get("JobId", jid)


def _sacct_states(jid: str) -> dict[str, str]:
    """``{job id: state}`` of job ``jid`` from Slurm's accounting (when scontrol has forgotten it)."""
    proc = subprocess.run(["sacct", "-n", "-X", "-P", "-j", jid, "-o", "JobID,State"], capture_output=True,
                          text=True, timeout=60, check=False)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        job, _, state = line.partition("|")
        if job:
            found[job] = state.split()[0] if state else "UNKNOWN"
    return found


def wait(plan: SlurmPlan, array: str, merge: str, *, poll: float = 5.0,
         say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict[str, str]:
    """Poll until every array task and the merge job have ended; say each change of state.
    Returns the final ``{host or 'merge': state}``."""
    last: dict[str, str] = {}
    while True:
        now = _host_states(plan, array, merge)
        if now != last:
            done = sum(1 for t in plan.tasks if _final(now[t.host]))
            say(f"cumatrix: slurm: {done} of {len(plan.tasks)} hosts done ("
                + ", ".join(f"{t.host} {now[t.host]}" for t in plan.tasks) + f"); merge job {merge} {now['merge']}")
            last = now
        if all(_final(now[t.host]) for t in plan.tasks) and (_final(now["merge"]) or now["merge"] == "UNKNOWN"):
            return now
        time.sleep(poll)


def _host_states(plan: SlurmPlan, array: str, merge: str) -> dict[str, str]:
    """``{host or 'merge': state}`` now: a task not yet split out of the pending array has the
    array's state (else PENDING), a merge job Slurm no longer knows is UNKNOWN."""
    names = {f"{array}_{t.index}": t.host for t in plan.tasks}
    states = job_states([array, merge])
    now = {names.get(k, k): v for k, v in states.items() if k in names}
    for t in plan.tasks:  # a task squeue has not split out of the pending array yet
        now.setdefault(t.host, states.get(array, states.get(f"{array}_[0-{len(plan.tasks) - 1}]", "PENDING")))
    now["merge"] = states.get(merge, "UNKNOWN")
    return now


def _final(state: str) -> bool:
    return state.split(maxsplit=1)[0].rstrip("+") in FINAL_STATES


def check_args(words: Sequence[str], flag: str) -> list[str]:
    """Words for the scripts: no newline could end a #SBATCH line or a command early."""
    return [check_text(w, flag) for w in words]


def check_text(value: str, what: str) -> str:
    """``value`` when it can stand on one line of a script: no control character (a newline
    would end a ``#SBATCH`` line or a command early, an escape would rewrite a terminal that
    shows the script).  Quoting is the writer's job; this is what quoting cannot carry."""
    bad = next((ch for ch in value if ord(ch) < 0x20 or ord(ch) == 0x7F), None)
    if bad is not None:
        raise UsageError(f"{what} {value!r}: a control character ({bad!r}) cannot be written into a script line; "
                         "rename it")
    return value
