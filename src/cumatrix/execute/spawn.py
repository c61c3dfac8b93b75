"""The spawn of a cell's child: the compiled shim (or a ``preexec_fn``), and this harness's own
hardening (not dumpable, no secrets, dies with its parent)."""

# Paths stay strings here on purpose (ruff's PTH rules off for this module): they are what
# bwrap's argv, /proc and the kernel take, and this runs for every cell.
# ruff: noqa: PTH105, PTH123

from __future__ import annotations

import ctypes
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from cumatrix.core.cache import cache_dir
from cumatrix.core.errors import EnvironmentProblem
from cumatrix.execute.childenv import _ENVIRON_SEEN, _SECRET_RE, _pattern
from cumatrix.execute.prebuilt import SPAWN, prebuilt

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_CSRC = Path(__file__).resolve().parents[1] / "csrc"
#: The spawn helper's main unit; the others (``spawn_*.c``, each with its header) are built with it.
_SPAWN_SOURCE = _CSRC / "spawn.c"
#: How the helper is compiled, at first use and by setup.py alike (warnings are errors).
SPAWN_CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")


def spawn_sources() -> list[Path]:
    """The helper's C units (``spawn.c`` and ``spawn_*.c``), in a stable order."""
    return sorted(_CSRC.glob("spawn*.c"))


def spawn_source_bytes() -> bytes:
    """Every unit and header of the helper, concatenated with their names: what its build is
    keyed by (a change to any of them builds it again)."""
    return b"".join(p.name.encode() + b"\0" + p.read_bytes()
                    for p in sorted([*_CSRC.glob("spawn*.c"), *_CSRC.glob("spawn*.h")]))


# --------------------------------------------------------------------------- the spawn shim


_SHIM: dict[str, Path | None] = {}
_LOCK = threading.RLock()  # the watcher's start asks for the shim from within containment()


def spawn_shim() -> Path | None:
    """The compiled ``cumatrix-spawn``: the one a platform wheel carries, else built once per source
    and machine; None without either."""
    with _LOCK:
        if "shim" in _SHIM:
            return _SHIM["shim"]
        _SHIM["shim"] = _build_shim()
        return _SHIM["shim"]


def forget_shim() -> None:
    """Look for (or build) the spawn helper again at the next cell: the one found is gone."""
    with _LOCK:
        _SHIM.pop("shim", None)


def _build_shim() -> Path | None:
    if os.environ.get("CUMATRIX_NO_SPAWN_SHIM"):
        return None
    shipped = prebuilt(SPAWN)
    if shipped is not None and os.access(shipped, os.X_OK):
        return shipped
    target = _shim_target()
    if target is None or os.access(target, os.X_OK):
        return target
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    return _compile_shim(cc, target)


def _shim_target() -> Path | None:
    """Where the helper built from this source lies in the user cache (None: no source, or no
    cache of this user's alone)."""
    try:
        source = spawn_source_bytes()
    except OSError:
        return None
    tag = hashlib.sha256(source + os.uname().machine.encode() + b" static").hexdigest()[:16]
    try:
        return cache_dir("bin") / f"cumatrix-spawn-{tag}"
    except (OSError, EnvironmentProblem):
        return None  # a cache that is not this user's alone: nothing in it is executed


def _compile_shim(cc: str, target: Path) -> Path | None:
    """Build the helper at ``target`` with ``cc`` (None: it did not build)."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        if not _compiled(cc, tmp):
            return None
        os.replace(tmp, target)  # atomic: parallel workers may build it at once
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _compiled(cc: str, out: Path) -> bool:
    """Whether ``cc`` built the helper at ``out``."""
    # Linked statically where the C library allows it (libc.a): it then starts without the
    # dynamic loader, and so without the cell's LD_AUDIT library, which the cell's
    # environment would otherwise load into the shim too (0.5 ms a cell).
    for static in (["-static"], []):
        proc = subprocess.run([cc, *SPAWN_CFLAGS, *static, "-o", str(out), *map(str, spawn_sources())],
                              capture_output=True,
                              timeout=120, stdin=subprocess.DEVNULL, check=False)
        if proc.returncode == 0:
            return True
    return False


def _prctl() -> Callable[..., int] | None:
    try:
        fn: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return fn


_PR_SET_DUMPABLE = 4


def harden(pass_env: Iterable[str] = ()) -> list[str]:
    """Make this harness process a poor target for the cells it runs (``cumatrix run`` and
    ``gate`` call it first; their pytest-xdist workers too).

    - Not dumpable (``PR_SET_DUMPABLE`` 0): its ``/proc/PID/environ``, ``mem`` and ``maps`` are
      unreadable to a cell running as the same user, and no cell of that user may ptrace it.
    - No secret it does not need: variables whose names look like one (``*TOKEN*``,
      ``*SECRET*``, ``*KEY*``, ...) leave ``os.environ``, unless ``--pass-env`` names them
      for the cells.  Cells never got them (the allowlist); now neither do ancestors hold them.

    Returns the names it dropped.
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    wanted = _pattern(tuple(pass_env))
    dropped = [k for k in list(os.environ) if _SECRET_RE.search(k) and not wanted.match(k)]
    for k in dropped:
        del os.environ[k]
    _ENVIRON_SEEN.clear()
    return dropped


def dumpable() -> bool | None:
    """Whether this process is dumpable (None where prctl is not to be had)."""
    prctl = _prctl()
    return None if prctl is None else bool(prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE


def die_with_parent() -> None:
    """Make this process die when its parent does (pytest-xdist workers call this)."""
    prctl = _prctl()
    if prctl is None:
        return
    parent = os.getppid()
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(128 + int(signal.SIGKILL))


def _preexec(parent: int, procs: str | None, lims: list[tuple[str, int, int]]) -> Callable[[], None]:
    """The shim's steps as a ``preexec_fn``, where no C compiler built the shim."""
    prctl = _prctl()  # looked up before fork, not in the child
    codes = {"core": resource.RLIMIT_CORE, "nofile": resource.RLIMIT_NOFILE,
             "nproc": resource.RLIMIT_NPROC, "cpu": resource.RLIMIT_CPU, "fsize": resource.RLIMIT_FSIZE}

    def preexec() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:
                os._exit(128 + int(signal.SIGKILL))
        if procs is not None:
            with open(procs, "w") as f:
                f.write("0\n")
        for name, soft, hard in lims:
            resource.setrlimit(codes[name], (soft, hard))

    return preexec


