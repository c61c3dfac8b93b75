"""``repro``'s native backtrace: a crashed cell's job re-run under ``gdb -batch``.

The debugger's run is a child like any cell's: the execute stage spawns it
(:func:`cumatrix.orchestrate.run_debugger`) with the cell's environment allowlist, limits,
sandbox policy, a timeout and the containment that ends every process the run started.  Only
the kernel tracer stays out (gdb traces the tree itself, and a process has one tracer): what
the debugger shows is evidence of the debugger's run, and the report says so.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from cumatrix.child.swapcell import MAPS_BEGIN, MAPS_END, MAPS_ENV
from cumatrix.core.jobs import ChildResult, Job
from cumatrix.core.options import SandboxPolicy
from cumatrix.execute.childenv import child_env
from cumatrix.execute.observe import LOG_ENV
from cumatrix.orchestrate import run_debugger

#: Seconds the debugger's run may take beyond the cell's own timeout (gdb loads symbols).
GDB_TIMEOUT_EXTRA = 120.0


@dataclass(frozen=True, kw_only=True, slots=True)
class NativeTrace:
    """What re-running a crashed child under gdb gave (or why it could not)."""

    tool: str | None  # "gdb", or None for the faulthandler fallback
    backtrace: str
    libraries: str
    maps: tuple[str, ...]
    note: str
    #: What the run's result says of where it ran: ``sandbox``, ``containment``, ``evidence``.
    spawn: dict[str, object] | None = None
    #: The debugger's own output (the program's, interleaved), as the run kept it.
    log: str = ""


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


def debugger_job(job: Job, gdb: str, *, extra_s: float = GDB_TIMEOUT_EXTRA) -> Job:
    """``job`` under ``gdb -batch``: the crashing thread's backtrace and the loaded libraries.

    The cell's audit log went with its run (its private directory is removed): the debugger's
    run writes the audit's log to ``/dev/null`` (the audit still enforces the cell's runtime)
    and mounts only what still exists.  Swap children list the libraries they mapped."""
    argv = list(job.argv)
    # Found on the cell's own PATH (less the harness's venv, its `python: harness` first), as the
    # cell found it: the harness's PATH may give another python3 (a pyenv shim, a script gdb cannot run).
    exe = shutil.which(argv[0], path=child_env(job).get("PATH")) if not Path(argv[0]).is_absolute() else argv[0]
    argv[0] = exe or argv[0]
    env = dict(job.env)
    if LOG_ENV in env:
        env[LOG_ENV] = os.devnull
    env[MAPS_ENV] = "1"
    cmd = (gdb, "-nx", "-batch", "-iex", "set debuginfod enabled off", "-ex", "run", "-ex", "bt",
           "-ex", "info sharedlibrary", "--args", *argv)
    return replace(job, argv=cmd, env=tuple(env.items()), timeout=job.timeout + extra_s, reports_verdict=False,
                   mounts=tuple(m for m in job.mounts if Path(m).exists()),
                   writable=tuple(w for w in job.writable if Path(w).exists()))


def gdb_backtrace(job: Job, *, gdb: str | None = None, extra_s: float = GDB_TIMEOUT_EXTRA,
                  policy: SandboxPolicy | None = None) -> NativeTrace:
    """Re-run ``job`` under ``gdb -batch`` through the execute stage (:func:`debugger_job`)."""
    gdb = gdb or find_debugger()
    if gdb is None:
        return NativeTrace(tool=None, backtrace="", libraries="", maps=(),
                           note="neither gdb nor cuda-gdb is installed: fallback to the faulthandler (Python) stack only")
    tool = Path(gdb).name
    djob = debugger_job(job, gdb, extra_s=extra_s)
    res = run_debugger(djob, policy=policy)
    spawn: dict[str, object] = {k: res.extra[k] for k in ("sandbox", "containment", "evidence", "killed_after") if k in res.extra}
    log = res.stdout_tail + "\n" + res.stderr_tail
    if res.timed_out:
        return NativeTrace(tool=tool, backtrace="", libraries="", maps=(), spawn=spawn, log=log,
                           note=f"{tool} did not finish within {djob.timeout:.0f} s; its run was killed")
    return _read_gdb(tool, log, res, spawn)


def _read_gdb(tool: str, text: str, res: ChildResult, spawn: dict[str, object]) -> NativeTrace:
    lines = text.splitlines()
    bt = [ln for ln in lines if re.match(r"^#\d+\s", ln)]
    sig = [ln for ln in lines if _is_signal_line(ln)]
    libs = _shared_libraries(lines)
    if not bt:
        tail = "\n".join(lines[-15:])
        why = "could not run it" if res.returncode is None and res.signal is None else "the child did not crash"
        return NativeTrace(tool=tool, backtrace="", libraries="\n".join(libs), maps=parse_maps(text), spawn=spawn,
                           log=text, note=f"under {tool} {why} (it may depend on timing or memory layout); "
                                          f"gdb said:\n{tail}")
    return NativeTrace(tool=tool, backtrace="\n".join([*sig, *bt]), libraries="\n".join(libs),
                       maps=parse_maps(text), note="", spawn=spawn, log=text)


def _is_signal_line(ln: str) -> bool:
    """gdb's line saying which signal stopped the program (of a thread, in a threaded one)."""
    return ln.startswith("Program received signal") or (ln.startswith("Thread ") and "received signal" in ln)


def _shared_libraries(lines: list[str]) -> list[str]:
    """The table of gdb's ``info sharedlibrary``: from its header to its ``(*)`` footnote."""
    libs: list[str] = []
    in_libs = False
    for ln in lines:
        if ln.startswith("From") and "Shared Object Library" in ln:
            in_libs = True
        if in_libs:
            libs.append(ln)
            if ln.startswith("(*)"):
                break
    return libs
