"""``cumatrix repro``: re-run one cell, or one known real-world bug, and write a bug report.

A cell of a matrix is re-run alone through :meth:`cumatrix.orchestrate.Orchestrator.run`.  A
catalog entry (``data/bugs.json``) is a bad cell that must show the bug's signature and a
good cell, on the same pairing, that must pass; only both together reproduce the bug.
Each report is Markdown: the environment, expected against observed with the oracle's
reason, on a crash a native backtrace (``gdb``) and the libraries the child had mapped, the
upstream reference, and one shell command that reproduces the cell without pytest.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cumatrix import __version__
from cumatrix.load.catalog import Bug, Catalog, load_catalog
from cumatrix.core.errors import UsageError, did_you_mean
from cumatrix.core.jobs import Job
from cumatrix.core.options import BACKENDS, DEFAULT_BACKEND, RunOptions
from cumatrix.core.model import NO_RUNTIME, Cell, CudaVersion, Kind, Matrix, is_neutral, is_ok, outcome_kind
from cumatrix.execute.observe import ENFORCE_ENV, LOG_ENV
from cumatrix.orchestrate import Orchestrator
from cumatrix.provision.cell import PACKAGE_PARENT
from cumatrix.core.record import CellRecord
from cumatrix.child.swapcell import MAPS_BEGIN, MAPS_END, MAPS_ENV

DEFAULT_OUT = "repro"
NO_GPU = "needs an NVIDIA GPU and driver; this host has none"
GDB_TIMEOUT_EXTRA = 120.0

# --------------------------------------------------------------------------- running


def standalone_command(runner: Orchestrator, job: Job) -> str:
    """One shell command that runs ``job`` as the harness does, without pytest.

    It outlives the run, so it names none of the run's temporary files: the audit's log (in
    the run's temporary directory, removed when the command ends) becomes ``/dev/null``, which
    keeps the audit's enforcement of the cell's runtime; a container's audit goes entirely
    (its library was copied into that directory)."""
    env = dict(job.env)
    log = env.get(LOG_ENV)
    mounts = [m for m in job.mounts if m != log]
    if runner.backend == "docker":
        audit_lib = env.pop("LD_AUDIT", None)
        env.pop(LOG_ENV, None)
        env.pop(ENFORCE_ENV, None)
        mounts = [m for m in mounts if m != audit_lib]
    elif log is not None:
        env[LOG_ENV] = os.devnull
    if runner.backend == "docker":
        own = list(job.lib_path)
        if own:
            env["LD_LIBRARY_PATH"] = ":".join(own)
        env.setdefault("PYTHONPATH", PACKAGE_PARENT)
        env.setdefault("PYTHONFAULTHANDLER", "1")
        parts = ["docker", "run", "--rm", "--init", "--network", "none"]
        if runner.host().driver_version is not None:
            parts += ["--gpus", "all"]
        for m in dict.fromkeys([PACKAGE_PARENT, *mounts]):
            parts += ["-v", f"{m}:{m}:ro"]
        for k, v in env.items():
            parts += ["-e", f"{k}={v}"]
        parts.append(job.image or "IMAGE")
        return " ".join(shlex.quote(p) for p in [*parts, *job.argv])
    if job.lib_path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(job.lib_path)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return " ".join(shlex.quote(p) for p in ["env", *(f"{k}={v}" for k, v in env.items()), *job.argv])


def child_environment(job: Job) -> dict[str, str]:
    """The environment :func:`cumatrix.execute.local.run_local` gives the child (the same allowlist)."""
    from cumatrix.execute.sandbox import child_env

    env = child_env(job)
    env[MAPS_ENV] = "1"
    return env


@dataclass(frozen=True, kw_only=True, slots=True)
class NativeTrace:
    """What re-running a crashed child under gdb gave (or why it could not)."""

    tool: str | None  # "gdb", or None for the faulthandler fallback
    backtrace: str
    libraries: str
    maps: tuple[str, ...]
    note: str


def gdb_backtrace(job: Job, *, gdb: str | None = None) -> NativeTrace:
    """Re-run ``job`` under ``gdb -batch``: the crashing thread's backtrace and the loaded libraries."""
    gdb = gdb or find_debugger()
    if gdb is None:
        return NativeTrace(tool=None, backtrace="", libraries="", maps=(),
                           note="neither gdb nor cuda-gdb is installed: fallback to the faulthandler (Python) stack only")
    tool = Path(gdb).name
    argv = list(job.argv)
    exe = shutil.which(argv[0]) if not os.path.isabs(argv[0]) else argv[0]
    argv[0] = exe or argv[0]
    cmd = [gdb, "-nx", "-batch", "-iex", "set debuginfod enabled off", "-ex", "run", "-ex", "bt",
           "-ex", "info sharedlibrary", "--args", *argv]
    try:
        proc = subprocess.run(cmd, env=child_environment(job), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=job.timeout + GDB_TIMEOUT_EXTRA,
                              start_new_session=True, check=False)
    except subprocess.TimeoutExpired:
        return NativeTrace(tool=tool, backtrace="", libraries="", maps=(),
                           note=f"{tool} did not finish within {job.timeout + GDB_TIMEOUT_EXTRA:.0f} s")
    text = proc.stdout + "\n" + proc.stderr
    lines = text.splitlines()
    bt = [ln for ln in lines if re.match(r"^#\d+\s", ln)]
    sig = [ln for ln in lines if ln.startswith("Program received signal") or ln.startswith("Thread ") and "received signal" in ln]
    libs: list[str] = []
    in_libs = False
    for ln in lines:
        if ln.startswith("From") and "Shared Object Library" in ln:
            in_libs = True
        if in_libs:
            libs.append(ln)
            if ln.startswith("(*)"):
                break
    if not bt:
        tail = "\n".join(lines[-15:])
        return NativeTrace(tool=tool, backtrace="", libraries="\n".join(libs), maps=parse_maps(text),
                           note=f"under {tool} the child did not crash (it may depend on timing or memory layout); gdb said:\n{tail}")
    return NativeTrace(tool=tool, backtrace="\n".join([*sig, *bt]), libraries="\n".join(libs),
                       maps=parse_maps(text), note="")


def find_debugger() -> str | None:
    """gdb, else cuda-gdb (which also debugs host-only programs; GPU hosts often have only it)."""
    for name in ("gdb", "cuda-gdb"):
        found = shutil.which(name)
        if found:
            return found
    for candidate in ("/usr/local/cuda/bin/cuda-gdb",):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_maps(text: str) -> tuple[str, ...]:
    """The lines of the child's ``CUMATRIX-MAPS`` block (the last one printed), if any."""
    if MAPS_BEGIN not in text:
        return ()
    block = text.rsplit(MAPS_BEGIN, 1)[1].split(MAPS_END, 1)[0]
    return tuple(ln.strip() for ln in block.splitlines() if ln.strip())


@dataclass(kw_only=True)
class CellRun:
    """One cell run for a report: its record and what was gathered around it."""

    cell: Cell
    record: CellRecord
    command: str | None
    native: NativeTrace | None = None
    build_log: str = ""  # the compiler's whole message, for a build-error (the record keeps its tail)

    @property
    def outcome(self) -> str:
        return self.record.observed.outcome

    @property
    def path(self) -> str | None:
        return self.record.observed.path

    @property
    def detail(self) -> str:
        return self.build_log or self.record.observed.detail

    def shown(self) -> str:
        p = self.path
        return f"{self.outcome}:{p}" if self.outcome == "ok" and p and p != "n/a" else self.outcome


def run_one(runner: Orchestrator, cell: Cell) -> CellRun:
    """Run ``cell`` once; on a crash, re-run its job under gdb (local backend)."""
    ran = runner.run(cell)
    record, job = ran.record, ran.job
    command = None
    if job is not None:
        command = standalone_command(runner, job)
    elif cell.kind == "swap" and cell.build is not None and cell.variant:
        command = " ".join(shlex.quote(p) for p in ("python3", "-m", "cumatrix", "build", cell.variant,
                                                    "--headers", str(cell.build), "--family", str(cell.family)))
    native = None
    build_log = ""
    if record.observed.outcome == "build-error" and cell.build is not None and cell.variant and cell.family:
        from cumatrix.provision import build as _build
        from cumatrix.provision import runtimes as _runtimes

        headers = _runtimes.headers_for(cell.build, wheel_dir=runner.wheel_dir, runtimes=runner.matrix.runtimes)
        build_log = _build.build_variant(cell.variant, cell.family, headers).log  # cached: no recompile
    if outcome_kind(record.observed.outcome) is Kind.CRASH:
        if runner.backend == "docker":
            native = NativeTrace(tool=None, backtrace="", libraries="", maps=(),
                                 note="docker backend: the image carries no gdb; fallback to the faulthandler stack only")
        elif job is not None:
            native = gdb_backtrace(job)
    return CellRun(cell=cell, record=record, command=command, native=native, build_log=build_log)


# --------------------------------------------------------------------------- the report


def _fence(text: str, lang: str = "") -> list[str]:
    body = text.rstrip() or "(empty)"
    ticks = "```"
    while ticks in body:
        ticks += "`"
    return [f"{ticks}{lang}", body, ticks]


def _env_table(runner: Orchestrator, runs: list[CellRun]) -> list[str]:
    fp = runner.host_fingerprint()
    dv = fp.get("driver_version")
    raw_gpus = fp.get("gpus")
    gpus = [g for g in raw_gpus if isinstance(g, dict)] if isinstance(raw_gpus, list) else []
    rows = [
        ("cumatrix", __version__),
        ("host", f"{fp.get('hostname')} ({fp.get('platform')})"),
        ("python", str(fp.get("python"))),
        ("driver", (f"CUDA {CudaVersion.from_int(int(str(dv)))} ({dv})" if dv else "none")
         + (f", {fp['driver_string']}" if fp.get("driver_string") else "")),
        ("GPUs", ", ".join(f"{g.get('name')} (cc {g.get('compute_capability')})" for g in gpus) or "none"),
        ("forward compatibility", "in use" if fp.get("forward_compat") else "not in use"),
        ("backend", runner.backend),
        ("debugger", find_debugger() or "gdb/cuda-gdb not installed"),
    ]
    for r in runs:
        f = r.record.fingerprint
        if f.get("runtime_file"):
            rows.append((f"runtime of {r.cell.id}", f"{f['runtime_file']} ({f.get('runtime_version')})"))
        if f.get("libcuda_file"):
            rows.append((f"libcuda of {r.cell.id}", str(f["libcuda_file"])))
        if f.get("image"):
            rows.append((f"image of {r.cell.id}", f"{f['image']} ({f.get('image_id')})"))
    out = ["| | |", "|---|---|"]
    out += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
    return out


def _python_stack(stderr: str) -> str:
    i = stderr.find("Fatal Python error")
    return stderr[i:] if i >= 0 else stderr[-3000:]


def _cell_section(r: CellRun, title: str, want: str | None = None) -> list[str]:
    """One cell's part of a report: the verdict, why, the crash's stacks, what was loaded."""
    rec = r.record
    lines = [f"## {title}: `{r.cell.id}`", "", *_cell_table(r, want)]
    lines += ["", f"**The oracle's reason** ({rec.expected.rule or 'no rule'}): {rec.expected.reason}", ""]
    if rec.mismatch:
        lines += [f"**Mismatch:** {rec.mismatch}", ""]
    crashed = outcome_kind(r.outcome) is Kind.CRASH
    if r.detail and not crashed:  # a crash's detail is the stderr tail shown below
        lines += ["Detail:", "", *_fence(r.detail), ""]
    if crashed:
        lines += _crash_stacks(r)
    lines += _loaded_libraries(r, crashed)
    if r.command:
        lines += ["### Standalone command", "", *_fence(r.command, "sh"), ""]
    tail = rec.stderr_tail.strip()
    if tail and not crashed:
        lines += ["<details><summary>stderr tail</summary>", "", *_fence(tail[-3000:]), "", "</details>", ""]
    return lines


def _cell_table(r: CellRun, want: str | None) -> list[str]:
    rec = r.record
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.cell.axes().items()]
    if want:
        lines.append(f"| catalog says | {want} |")
    lines += [f"| oracle expects | {' or '.join(sorted(rec.expected.outcomes))} |",
              f"| observed | **{r.shown()}** |", f"| oracle verdict | {rec.status} |"]
    return lines


def _crash_stacks(r: CellRun) -> list[str]:
    lines = ["### Python stack (faulthandler)", "", *_fence(_python_stack(r.record.stderr_tail)), "",
             "### Native backtrace of the crashing thread", ""]
    n = r.native
    if n is not None and n.backtrace:
        lines += [f"From `{n.tool or 'gdb'} -batch -ex run -ex bt -ex \"info sharedlibrary\" --args <the command below>`:",
                  "", *_fence(n.backtrace), ""]
        if n.note:
            lines += [n.note, ""]
    else:
        lines += [f"Not available: {n.note if n else 'the child could not be re-run'}.", ""]
    return lines


def _loaded_libraries(r: CellRun, crashed: bool) -> list[str]:
    listed = r.record.observed.data.get("loaded_libraries")
    maps = tuple(str(x) for x in listed) if isinstance(listed, list) else ()
    maps = maps or parse_maps(r.record.stderr_tail)
    if not maps and r.native is not None:
        maps = r.native.maps
    native_libs = r.native.libraries if r.native is not None else ""
    if not maps and not native_libs:
        if not crashed:
            return []
        return ["### Libraries the child had loaded before the call", "",
                "Not captured (the child printed no CUMATRIX-MAPS block and gdb gave no library list).", ""]
    lines = ["### Libraries the child had loaded before the call", ""]
    if maps:
        lines += ["From the child's `/proc/self/maps` right before the variant ran:", "", *_fence("\n".join(maps)), ""]
    if native_libs:
        lines += ["gdb's `info sharedlibrary` at the crash:", "", *_fence(native_libs), ""]
    return lines


def cell_report(runner: Orchestrator, r: CellRun, matrix_path: str) -> str:
    """The Markdown report of one re-run cell."""
    lines = [f"# cumatrix repro: `{r.cell.id}`", "",
             (f"Cell of `{matrix_path}`, re-run alone; expected {' or '.join(sorted(r.record.expected.outcomes))}, "
              f"observed **{r.shown()}** (oracle verdict: {r.record.status})."), "",
             "## Environment", "", *_env_table(runner, [r]), "", *_cell_section(r, "Cell")]
    refs = sorted(set(re.findall(r"(?:vLLM|SGLang) (?:PR|issue) \d+", r.record.expected.reason)))
    lines += ["## Upstream reference", "", (", ".join(refs) if refs else "none named by the oracle's rule"), ""]
    return "\n".join(lines)


def bug_report(runner: Orchestrator, bug: Bug, bad: CellRun | None, good: CellRun | None, verdict: str,
               why: str, note: str = "", build_logs: dict[str, str] | None = None) -> str:
    """The Markdown report of one catalog entry."""
    lines = [f"# {bug.id}: {verdict}", "", bug.title + ".", "", f"**Verdict: {verdict}.** {why}", ""]
    if note:
        lines += [note, ""]
    lines += ["## Upstream reference", ""]
    lines += [f"- [{ref}]({ref.url})" for ref in bug.refs]
    lines += ["", f"Needs: {bug.needs_text()}.", "", "## Environment", "",
              *_env_table(runner, [r for r in (bad, good) if r is not None]), ""]
    if bad is not None:
        lines += _cell_section(bad, "Bad cell (must show the bug's signature)",
                               f"{bug.bad.outcome}" + (f" with '{bug.bad.detail_contains}'" if bug.bad.detail_contains else ""))
    if good is not None:
        lines += _cell_section(good, "Good cell (the correct pattern, same pairing)", bug.good.outcome)
    for name, log in (build_logs or {}).items():
        lines += [f"## Build: {name}", "", *_fence(log), ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- commands


_ID_RE = re.compile(r"^[^/\s]+/(host|emulated-\d+\.\d+)/(?:[^/\s]+|[a-z-]+/h\d+\.\d+/[^/\s]+)$")


def find_cell(m: Matrix, cell_id: str) -> Cell:
    """The cell of ``m`` with this id, or a :class:`UsageError` that helps find the right one."""
    from cumatrix.load.matrix import cells

    all_cells = cells(m)
    for c in all_cells:
        if c.id == cell_id:
            return c
    ids = [c.id for c in all_cells]
    hint = did_you_mean(cell_id, ids)
    if _ID_RE.match(cell_id) and _foreign_axis(m, cell_id):
        raise UsageError(f"{cell_id} is not a cell of {m.path}; it looks like a cell id of another matrix: "
                         f"pass --matrix{hint}")
    raise UsageError(f"unknown cell id {cell_id!r} in {m.path}{hint} (`cumatrix validate {m.path} --list` lists them)")


def _foreign_axis(m: Matrix, cell_id: str) -> bool:
    parts = cell_id.split("/")
    runtimes = {r.name for r in m.runtimes} | {NO_RUNTIME}
    drivers = {d.name for d in m.drivers}
    if parts[0] not in runtimes or parts[1] not in drivers:
        return True
    if len(parts) == 3:
        return parts[2] != "probe" and parts[2] not in {c.name for c in m.cases}
    variant, build, workload = parts[2], parts[3][1:], parts[4]
    return (variant not in m.variants or build not in {str(b) for b in m.builds}
            or workload not in {w.name for w in m.workloads})


def _report_name(ident: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "--", ident) + ".md"


def _write(out: Path, name: str, text: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    p = out / name
    p.write_text(text)
    return p


#: The orchestrators this command opened, closed (their temporary files removed) when it ends.
_OPENED: list[Orchestrator] = []


def _runner(args: argparse.Namespace, m: Matrix) -> Orchestrator:
    """The orchestrator of a repro: its swap children list the libraries they mapped."""
    wd = Path(args.wheel_dir) if args.wheel_dir else None
    if wd is not None and not wd.is_dir():
        raise UsageError(f"--wheel-dir {args.wheel_dir}: no such directory")
    opts = RunOptions.from_cli(args)
    orch = Orchestrator(matrix=m, backend=opts.backend, wheel_dir=wd, timeout=opts.timeout, policy=opts.policy,
                        child_env=((MAPS_ENV, "1"),))
    _OPENED.append(orch)
    return orch


def repro_cell(args: argparse.Namespace) -> int:
    """``cumatrix repro CELL_ID``."""
    from cumatrix.load import matrix as _matrix

    mpath = Path(args.matrix)
    if not mpath.is_file():
        raise UsageError(f"{mpath}: no such matrix file (name one with --matrix)")
    m = _matrix.load(mpath)
    cell = find_cell(m, args.cell_id)
    runner = _runner(args, m)
    r = run_one(runner, cell)
    rec = r.record
    expected = sorted(rec.expected.outcomes)
    signature = any(not is_ok(e) and not is_neutral(e) for e in expected)
    if outcome_kind(r.outcome) is Kind.SKIPPED:
        print(f"cumatrix: cell {cell.id} did not run here ({r.outcome}: {r.detail}); nothing reproduced", file=sys.stderr)
        return 2
    if rec.status in ("pass", "skip") and not signature:
        print(f"cell {cell.id} behaves as expected ({r.shown()}): nothing to reproduce")
        return 0
    p = _write(Path(args.out), _report_name(cell.id), cell_report(runner, r, str(mpath)))
    what = "as the oracle predicted" if rec.status == "pass" else f"not as predicted: {rec.mismatch}"
    print(f"cell {cell.id}: {r.shown()} ({what})")
    if r.command:
        print(f"standalone: {r.command}")
    print(f"report: {p}")
    return 0 if rec.status == "pass" else 1


def _build_only(runner: Orchestrator, bug: Bug) -> tuple[bool, str, dict[str, str]]:
    """Without a GPU: build the bad and the good variant; the build alone proves a build bug."""
    from cumatrix.provision import build as _build
    from cumatrix.provision import runtimes as _runtimes

    logs: dict[str, str] = {}
    results = {}
    for which, c in (("bad", bug.bad), ("good", bug.good)):
        headers = _runtimes.headers_for(c.build, wheel_dir=runner.wheel_dir)
        res = _build.build_variant(c.variant, c.family, headers)
        results[which] = res
        logs[f"{which}: {c.variant} ({c.family} family) with CUDA {c.build} headers -> "
             f"{'built ' + str(res.library.name) if res.ok and res.library else 'build-error'}"] = (
            " ".join(shlex.quote(a) for a in res.command) + "\n\n" + (res.log or "(no compiler output)"))
    bad_ok = (not results["bad"].ok and "build-error" in bug.bad.outcomes
              and (bug.bad.detail_contains is None or bug.bad.detail_contains in results["bad"].log))
    good_ok = results["good"].ok
    why = (f"bad cell: {'build-error' if not results['bad'].ok else 'built'}"
           + (f" ({'contains' if bug.bad.detail_contains and bug.bad.detail_contains in results['bad'].log else 'lacks'}"
              f" '{bug.bad.detail_contains}')" if bug.bad.detail_contains else "")
           + f"; good cell: {'builds' if good_ok else 'build-error'}")
    return bad_ok and good_ok, why, logs


def repro_bug(args: argparse.Namespace, bug: Bug) -> int:
    """Run one catalog entry; write ``<out>/<id>.md``; 0 reproduced, 1 not, 3 cannot run here
    (the report is then a skeleton holding the command to run on a host that can)."""
    m = bug.matrix()
    runner = _runner(args, m)
    host = runner.host()
    out = Path(args.out)
    if host.driver_version is None:
        if bug.needs.build_only_without_gpu:
            ok, why, logs = _build_only(runner, bug)
            verdict = "reproduced" if ok else "not reproduced"
            note = ("This host has no NVIDIA GPU or driver: only the build step ran, for both variants. "
                    "The build alone proves this bug; on a GPU host the good cell also runs.")
            p = _write(out, _report_name(bug.id), bug_report(runner, bug, None, None, verdict, why, note, logs))
            print(f"{bug.id}: {verdict} ({why}; build step only: no GPU here)\nreport: {p}")
            return 0 if ok else 1
        return _cannot_run_here(args, runner, bug, NO_GPU)
    if bug.needs.driver_min is not None and host.driver_version < int(bug.needs.driver_min):
        return _cannot_run_here(args, runner, bug, f"needs a driver for CUDA {bug.needs.driver_min} or newer; this "
                                f"host's driver is CUDA {CudaVersion.from_int(host.driver_version)}")
    bad = run_one(runner, bug.bad.cell())
    good = run_one(runner, bug.good.cell())
    bad_ok = bug.bad.shows(bad.outcome, bad.path, bad.detail)
    good_ok = bug.good.shows(good.outcome, good.path, good.detail)
    verdict = "reproduced" if bad_ok and good_ok else "not reproduced"
    why = (f"bad cell {bad.cell.id}: {bad.shown()} ({'the signature' if bad_ok else 'not the signature ' + bug.bad.outcome}); "
           f"good cell {good.cell.id}: {good.shown()} ({'passes' if good_ok else 'expected ' + bug.good.outcome})")
    p = _write(out, _report_name(bug.id), bug_report(runner, bug, bad, good, verdict, why))
    print(f"{bug.id}: {verdict}: {why}\nreport: {p}")
    return 0 if bad_ok and good_ok else 1


#: Exit code of ``repro --bug`` on a host that cannot run the entry (as ``run``'s 3: the run
#: cannot happen here, said before anything ran).
EXIT_CANNOT_RUN_HERE = 3


def portable_command(args: argparse.Namespace, bug: Bug) -> str:
    """The ``cumatrix repro`` command that runs ``bug`` on another host: only what travels
    (a relative --out; an absolute one, a wheel directory or a temporary path would not)."""
    parts = ["cumatrix", "repro", "--bug", bug.id]
    if args.backend != "local":
        parts += ["--backend", args.backend]
    out = str(args.out)
    parts += ["--out", out if not os.path.isabs(out) else DEFAULT_OUT]
    return " ".join(shlex.quote(p) for p in parts)


def _cannot_run_here(args: argparse.Namespace, runner: Orchestrator, bug: Bug, why: str) -> int:
    """Write the report's skeleton (what the entry needs, its cells, the command to run where it
    can) and say so; exit :data:`EXIT_CANNOT_RUN_HERE`."""
    command = portable_command(args, bug)
    lines = [f"# {bug.id}: not run here", "", bug.title + ".", "",
             f"**Not run on this host:** it {why}. Run the command below on a host that meets "
             f"its needs ({bug.needs_text()}); it writes the full report in place of this one.", "",
             "## Command to run on a host that can", "", *_fence(command, "sh"), "",
             "## Upstream reference", "", *[f"- [{ref}]({ref.url})" for ref in bug.refs], "",
             "## Cells", "", "| | cell | must show |", "|---|---|---|",
             f"| bad | `{bug.bad.cell().id}` | {bug.bad.outcome}"
             + (f" with '{bug.bad.detail_contains}'" if bug.bad.detail_contains else "") + " |",
             f"| good | `{bug.good.cell().id}` | {bug.good.outcome} |", "",
             "## Environment of this host", "", *_env_table(runner, []), ""]
    p = _write(Path(args.out), _report_name(bug.id), "\n".join(lines))
    print(f"cumatrix: {bug.id} {why}: not run here (exit {EXIT_CANNOT_RUN_HERE})", file=sys.stderr)
    print(f"{bug.id}: not run here; on a host that can: {command}\nreport: {p}")
    return EXIT_CANNOT_RUN_HERE


def list_bugs(catalog: Catalog) -> int:
    """Print every catalog entry with its references and needs."""
    for b in catalog.bugs:
        print(f"{b.id}: {b.title}")
        print(f"    bad:   {b.bad.cell().id} -> {b.bad.outcome}"
              + (f" ('{b.bad.detail_contains}')" if b.bad.detail_contains else ""))
        print(f"    good:  {b.good.cell().id} -> {b.good.outcome}")
        print(f"    refs:  {'; '.join(f'{r} {r.url}' for r in b.refs)}")
        print(f"    needs: {b.needs_text()}")
    return 0


def cmd_repro(args: argparse.Namespace) -> int:
    """Handler of ``cumatrix repro``."""
    try:
        return _repro(args)
    finally:
        while _OPENED:
            _OPENED.pop().close()


def _repro(args: argparse.Namespace) -> int:
    modes = [bool(args.cell_id), bool(args.bug), args.list, args.all]
    if sum(modes) != 1:
        raise UsageError("give one of: a CELL_ID, --bug ID, --list, --all")
    if args.cell_id:
        return repro_cell(args)
    catalog = load_catalog()
    if args.list:
        return list_bugs(catalog)
    if args.bug:
        return repro_bug(args, catalog.get(args.bug))
    codes = {b.id: repro_bug(args, b) for b in catalog.bugs}
    words = {0: "reproduced", 1: "not reproduced", EXIT_CANNOT_RUN_HERE: "not run here"}
    print(f"catalog: {', '.join(f'{k}: {words[v]}' for k, v in codes.items())}")
    missing = [k for k, v in codes.items() if v == EXIT_CANNOT_RUN_HERE]
    if any(v == 1 for v in codes.values()):
        return 1
    if missing and not args.allow_missing:
        # A nightly job that reproduced nothing because its GPU vanished must not read as a pass.
        print(f"cumatrix: {len(missing)} of {len(codes)} entries could not run here ({', '.join(missing)}): exit 1; "
              "--allow-missing accepts that", file=sys.stderr)
        return 1
    return 0


def add_repro_parser(sub: Any) -> None:
    """Register ``cumatrix repro`` on the CLI's subparsers."""
    p = sub.add_parser(
        "repro", help="re-run one cell, or a known real-world bug, and write a bug report",
        description="Re-run one cell of a matrix alone (or a catalog entry: a bad cell that must show a known "
                    "bug's signature and a good cell that must pass), and write a Markdown bug report with a "
                    "standalone command.",
        epilog="examples:\n  cumatrix repro cu12.9/host/driver-dispatch/h12.8/kv-16k-d2h\n"
               "  cumatrix repro --list\n  cumatrix repro --bug vllm-cuda13-build --out reports/repro\n"
               "  cumatrix repro --all --out reports/repro\n\n"
               "exit: 0 reproduced / as predicted; 1 not reproduced / not as predicted (--all: or an entry could not\n"
               "run here, unless --allow-missing); 2 bad input, or a cell that did not run here; 3 --bug: this host\n"
               "cannot run the entry (the report is a skeleton with the command to run on a host that can)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cell_id", nargs="?", metavar="CELL_ID", help="a cell id of the matrix")
    p.add_argument("--matrix", default="matrix.yaml", metavar="M", help="matrix file (default: matrix.yaml)")
    p.add_argument("--bug", metavar="ID", help="run a catalog entry (see --list)")
    p.add_argument("--list", action="store_true", help="print the catalog of known bugs")
    p.add_argument("--all", action="store_true", help="run every catalog entry, one report each")
    p.add_argument("--allow-missing", action="store_true",
                   help="--all: exit 0 even when some entries could not run on this host")
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND)
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"reports go here (default: {DEFAULT_OUT}/)")
    p.add_argument("--wheel-dir", metavar="DIR", help="take runtime wheels from DIR; no network")
    p.set_defaults(func=cmd_repro)
