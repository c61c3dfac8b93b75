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
import sys
from collections.abc import Mapping
from pathlib import Path

from elftools.elf.elffile import ELFFile

from cumatrix.audit.static import load_audit_data
from cumatrix.binary.elf import elf_undefined_symbols
from cumatrix.child.swapcell import MAPS_ENV
from cumatrix.core.cache import cache_location
from cumatrix.core.errors import EnvironmentProblem, UsageError, did_you_mean
from cumatrix.core.jobs import Job
from cumatrix.core.model import NO_RUNTIME, Cell, CudaVersion, Kind, Matrix, is_neutral, is_ok, outcome_kind
from cumatrix.core.options import RunOptions
from cumatrix.core.private import write_new
from cumatrix.execute.observe import ENFORCE_ENV, LOG_ENV
from cumatrix.front.repro.args import add_repro_parser
from cumatrix.front.repro.native import GDB_TIMEOUT_EXTRA, NativeTrace, find_debugger, gdb_backtrace, parse_maps
from cumatrix.front.repro.report import CellRun, _env_table, _fence, bug_report, cell_report
from cumatrix.front.run_cmd import matrix_arg
from cumatrix.judge.reproduce import BugVerdict, judge_bug, judge_build_only, judge_static
from cumatrix.load import matrix as _matrix
from cumatrix.load.catalog import Bug, Catalog, load_catalog
from cumatrix.load.matrix import cells
from cumatrix.orchestrate import Orchestrator
from cumatrix.provision import build as _build
from cumatrix.provision import runtimes as _runtimes
from cumatrix.provision.cell import PACKAGE_PARENT

#: Names callers used from here before the report and the debugger run had modules of their own.
__all__ = ["GDB_TIMEOUT_EXTRA", "CellRun", "NativeTrace", "add_repro_parser", "cmd_repro", "find_debugger", "gdb_backtrace",
           "parse_maps", "run_one", "standalone_command"]

DEFAULT_OUT = "repro"
NO_GPU = "needs an NVIDIA GPU and driver; this host has none"

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
        return _docker_command(runner, job, env, [m for m in mounts if m != audit_lib])
    if log is not None:
        env[LOG_ENV] = os.devnull
    if job.lib_path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(job.lib_path)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    # The case's cwd:, else its matrix file's directory (GNU env's --chdir); none for the
    # bundled default matrix, whose cases start where the command is run.
    chdir = ["-C", job.cwd] if job.cwd else []
    return _portable(["env", *chdir, *(f"{k}={v}" for k, v in env.items()), *job.argv])


def _docker_command(runner: Orchestrator, job: Job, env: dict[str, str], mounts: list[str]) -> str:
    """The ``docker run`` command of :func:`standalone_command`: ``job`` in its image, with
    ``env`` (the audit's variables gone) and ``mounts`` read-only."""
    own = list(job.lib_path)
    if own:
        env["LD_LIBRARY_PATH"] = ":".join(own)
    env.setdefault("PYTHONPATH", PACKAGE_PARENT)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    parts = ["docker", "run", "--rm", "--init", "--network", "none"]
    if runner.host().driver_version is not None:
        parts += ["--gpus", "all"]
    for m in dict.fromkeys([PACKAGE_PARENT, *mounts, *([job.cwd] if job.cwd else [])]):
        parts += ["-v", f"{m}:{m}:ro"]
    if job.cwd:  # the case's cwd: (else its matrix file's directory), as the backend mounts it
        parts += ["-w", job.cwd]
    for k, v in env.items():
        parts += ["-e", f"{k}={v}"]
    parts.append(job.image or "IMAGE")
    return _portable([*parts, *job.argv])


#: How the standalone command finds cumatrix's cache: as cumatrix does (core.cache.cache_location).
_CACHE_SH = 'CUMATRIX_CACHE="${CUMATRIX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cumatrix}"'


def _portable(words: list[str]) -> str:
    """``words`` as one shell command that names no cache path of this machine: the cache's
    root (runtimes, builds, the audit library) is ``$CUMATRIX_CACHE``, found as cumatrix finds it,
    so the command runs for another user, or on another host, whose cache holds the same files
    (``cumatrix fetch`` and a run of the cell there put them in it)."""
    root = str(cache_location())
    if not any(root in w for w in words):
        return " ".join(shlex.quote(w) for w in words)

    def word(w: str) -> str:
        return '"$CUMATRIX_CACHE"'.join(shlex.quote(p) if p else "" for p in w.split(root))

    return f"{_CACHE_SH}; " + " ".join(word(w) for w in words)


def run_one(runner: Orchestrator, cell: Cell) -> CellRun:
    """Run ``cell`` once; on a crash, re-run its job under gdb (local backend)."""
    ran = runner.run(cell)
    record, job = ran.record, ran.job
    command = standalone_command(runner, job) if job is not None else _build_command(cell)
    build_log = _build_log(runner, cell, record.observed.outcome)
    native = _native_trace(runner, job, record.observed.outcome)
    return CellRun(cell=cell, record=record, command=command, native=native, build_log=build_log)


def _build_command(cell: Cell) -> str | None:
    """The command that builds a swap cell's variant, for a cell that ran no job."""
    if cell.kind == "swap" and cell.build is not None and cell.variant:
        return " ".join(shlex.quote(p) for p in ("python3", "-m", "cumatrix", "build", cell.variant,
                                                 "--headers", str(cell.build), "--family", str(cell.family)))
    return None


def _build_log(runner: Orchestrator, cell: Cell, outcome: str) -> str:
    """The compiler's message of a cell whose variant did not build (else empty)."""
    if outcome == "build-error" and cell.build is not None and cell.variant and cell.family:
        headers = _runtimes.headers_for(cell.build, wheel_dir=runner.wheel_dir, runtimes=runner.matrix.runtimes)
        return _build.build_variant(cell.variant, cell.family, headers).log  # cached: no recompile
    return ""


def _native_trace(runner: Orchestrator, job: Job | None, outcome: str) -> NativeTrace | None:
    """A crashed cell's native backtrace: its job re-run under gdb (local backend only)."""
    if outcome_kind(outcome) is not Kind.CRASH:
        return None
    if runner.backend == "docker":
        return NativeTrace(tool=None, backtrace="", libraries="", maps=(),
                           note="docker backend: the image carries no gdb; fallback to the faulthandler stack only")
    return gdb_backtrace(job, policy=runner.policy) if job is not None else None


# --------------------------------------------------------------------------- commands


_ID_RE = re.compile(r"^[^/\s]+/(host|emulated-\d+\.\d+)/(?:[^/\s]+|[a-z-]+/h\d+\.\d+/[^/\s]+)$")


def find_cell(m: Matrix, cell_id: str) -> Cell:
    """The cell of ``m`` with this id, or a :class:`UsageError` that helps find the right one."""
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
    return _foreign_swap(m, variant=parts[2], build=parts[3][1:], workload=parts[4])


def _foreign_swap(m: Matrix, *, variant: str, build: str, workload: str) -> bool:
    """Whether a swap cell's variant, build headers or workload is none of ``m``'s."""
    return (variant not in m.variants or build not in {str(b) for b in m.builds}
            or workload not in {w.name for w in m.workloads})


def _report_name(ident: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "--", ident) + ".md"


def _check_out(out: Path) -> None:
    """``--out`` can be made a directory here: the nearest part of it that exists is one
    (:class:`EnvironmentProblem`, exit 3, when it is a file).  Nothing is created: a cell with
    nothing to reproduce writes nothing."""
    for p in (out, *out.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise EnvironmentProblem(f"--out {out}: {p} is a file, not a directory; choose another --out")
            return


def _write(out: Path, name: str, text: str) -> Path:
    try:
        out.mkdir(parents=True, exist_ok=True)
        p = out / name
        write_new(p, text, replace=True)  # a new file renamed into place: never through a planted link
    except OSError as e:
        raise EnvironmentProblem(f"--out {out}: cannot write the report: {e.strerror or e}") from None
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
    mpath = matrix_arg(args.matrix)  # the matrix `run` takes: a cell id of its run is found here
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


def _build_logs(runner: Orchestrator, bug: Bug) -> dict[str, str]:
    """The compiler's command and whole message for each of the entry's variants (the builds
    provisioning made for its cells, read back from the cache: no recompile), for the report."""
    logs: dict[str, str] = {}
    for which, c in (("bad", bug.bad), ("good", bug.good)):
        headers = _runtimes.headers_for(c.build, wheel_dir=runner.wheel_dir)
        res = _build.build_variant(c.variant, c.family, headers)
        logs[f"{which}: {c.variant} ({c.family} family) with CUDA {c.build} headers -> "
             f"{'built ' + str(res.library.name) if res.ok and res.library else 'build-error'}"] = (
            " ".join(shlex.quote(a) for a in res.command) + "\n\n" + (res.log or "(no compiler output)"))
    return logs


def _build_only(args: argparse.Namespace, runner: Orchestrator, bug: Bug) -> int:
    """Without a GPU: both cells run as far as provisioning goes, which builds each variant;
    the judge decides from that whether the build alone reproduces the bug."""
    bad = run_one(runner, bug.bad.cell())
    good = run_one(runner, bug.good.cell())
    v = judge_build_only(bug, bad=bad.record.observed, bad_log=bad.detail, good=good.record.observed)
    note = ("This host has no NVIDIA GPU or driver: only the build step ran, for both variants. "
            "The build alone proves this bug; on a GPU host the good cell also runs.")
    return _no_gpu_report(args, runner, bug, v, note, "build step only")


def _no_gpu_report(args: argparse.Namespace, runner: Orchestrator, bug: Bug, v: BugVerdict, note: str,
                   evidence: str) -> int:
    """The bug report of a host without a GPU, from the builds alone; exit 0 where they reproduce the bug."""
    p = _write(Path(args.out), _report_name(bug.id),
               bug_report(runner, bug, None, None, v.word, v.why, note, _build_logs(runner, bug)))
    print(f"{bug.id}: {v.word} ({v.why}; {evidence}: no GPU here)\nreport: {p}")
    return 0 if v.reproduced else 1


def _too_new(library: Path, driver: int, introductions: Mapping[str, int]) -> tuple[str, ...]:
    """The driver entry points ``library`` links directly that a driver of ``driver`` lacks."""
    with library.open("rb") as f:
        undefined = set(elf_undefined_symbols(ELFFile(f)))
    return tuple(sorted(s for s in undefined if introductions.get(s, 0) > driver))


def _static_only(args: argparse.Namespace, runner: Orchestrator, bug: Bug, driver: CudaVersion) -> int:
    """Without a GPU, for a bug whose evidence is in the binaries: both variants built, their
    directly linked driver symbols read and dated against the emulated driver (what the gate's
    static audit does), and the judge decides from that."""
    intros = load_audit_data(wheel_dir=runner.wheel_dir).introductions
    found: dict[str, tuple[str, ...] | None] = {}
    for which, c in (("bad", bug.bad), ("good", bug.good)):
        res = _build.build_variant(c.variant, c.family, _runtimes.headers_for(c.build, wheel_dir=runner.wheel_dir))
        found[which] = _too_new(res.library, int(driver), intros) if res.ok and res.library else None
    v = judge_static(bug, driver=str(driver), bad=found["bad"], good=found["good"])
    note = ("This host has no NVIDIA GPU or driver: the evidence was read from the built binaries (the symbols "
            "each links directly, dated by the CUDA headers), not from loading them; on a GPU host both cells run.")
    return _no_gpu_report(args, runner, bug, v, note, "static evidence only")


def repro_bug(args: argparse.Namespace, bug: Bug) -> int:
    """Run one catalog entry; write ``<out>/<id>.md``; 0 reproduced, 1 not, 3 cannot run here
    (the report is then a skeleton holding the command to run on a host that can)."""
    m = bug.matrix()
    runner = _runner(args, m)
    host = runner.host()
    if shutil.which("gcc") is None:
        # Every entry's evidence starts with its variants built on this host, GPU or not.
        return _cannot_run_here(args, runner, bug, "needs gcc to build its variants, and there is no gcc on PATH "
                                                   "(install it: apt-get install gcc, or dnf install gcc)")
    if host.driver_version is None:
        if bug.needs.build_only_without_gpu:
            return _build_only(args, runner, bug)
        if bug.needs.static_without_gpu and bug.bad.driver.emulated is not None:
            return _static_only(args, runner, bug, bug.bad.driver.emulated)
        return _cannot_run_here(args, runner, bug, NO_GPU)
    if bug.needs.driver_min is not None and host.driver_version < int(bug.needs.driver_min):
        return _cannot_run_here(args, runner, bug, f"needs a driver for CUDA {bug.needs.driver_min} or newer; this "
                                f"host's driver is CUDA {CudaVersion.from_int(host.driver_version)}")
    bad = run_one(runner, bug.bad.cell())
    good = run_one(runner, bug.good.cell())
    v: BugVerdict = judge_bug(bug, bad_id=bad.cell.id, bad=bad.record.observed, bad_detail=bad.detail,
                              good_id=good.cell.id, good=good.record.observed, good_detail=good.detail)
    p = _write(Path(args.out), _report_name(bug.id), bug_report(runner, bug, bad, good, v.word, v.why))
    print(f"{bug.id}: {v.word}: {v.why}\nreport: {p}")
    return 0 if v.reproduced else 1


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
    parts += ["--out", out if not Path(out).is_absolute() else DEFAULT_OUT]
    return " ".join(shlex.quote(p) for p in parts)


def _cannot_run_here(args: argparse.Namespace, runner: Orchestrator, bug: Bug, why: str) -> int:
    """Write the report's skeleton (what the entry needs, its cells, the command to run where it
    can) and say so; exit :data:`EXIT_CANNOT_RUN_HERE`."""
    command = portable_command(args, bug)
    lines = [f"# {bug.id}: not run here", "", bug.title + ".", "",
             (f"**Not run on this host:** it {why}. Run the command below on a host that meets "
              f"its needs ({bug.needs_text()}); it writes the full report in place of this one."), "",
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
    if not args.list:
        _check_out(Path(args.out))  # a file where --out belongs: exit 3 before anything runs, not a traceback
    if args.cell_id:
        return repro_cell(args)
    catalog = load_catalog()
    if args.list:
        return list_bugs(catalog)
    if args.bug:
        return repro_bug(args, catalog.get(args.bug))
    return _repro_catalog(args, catalog)


def _repro_catalog(args: argparse.Namespace, catalog: Catalog) -> int:
    """``repro --all``: every entry; 1 when one did not reproduce, or (without
    ``--allow-missing``) when one could not run here."""
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
