"""Confine one cell: what its process sees, what it may use, and that all of it ends with it.

Three layers, each used where the host offers it:

- **The spawn.** A tiny C program (``csrc/spawn.c``, built once with the host's C compiler
  into the user cache) does the child's part between fork and exec: the death signal
  (``PR_SET_PDEATHSIG``), joining the cell's cgroup, resource limits.  subprocess then
  spawns with ``vfork`` instead of a full ``fork`` running Python in the child, whose cost
  grows with the harness's memory.  Without a C compiler the same steps run in a
  ``preexec_fn`` (slower, same effect).  The same program traces the cell's process tree
  (``--trace``, ptrace) and reports, on a pipe only the harness reads, what each process
  mapped (:mod:`cumatrix.core.witness`); ``CUMATRIX_NO_TRACE=1`` spawns untraced.
- **The tree.** A cell is every process it starts, ``setsid`` double-forked daemons
  included.  Where the harness may create cgroups in a cgroup v2 hierarchy, each cell gets
  one and ends with ``cgroup.kill`` (``containment: cgroup-v2``).  Elsewhere the harness is
  a child subreaper, so orphans of a cell stay its descendants, and a sweep kills what the
  cell left (``containment: subreaper``): its process group and session, every process
  carrying the cell's ``CUMATRIX_SCOPE`` marker, and their descendants.
- **The view.** Cells get an environment built from an allowlist (no CI secrets, none of
  the harness's ``PYTHONPATH`` for command cells; ``--pass-env NAME`` adds one), resource
  limits that cannot break CUDA programs, and where bubblewrap is installed (``--sandbox``;
  the gate's default) a sandbox with no network, a read-only root, a private ``/tmp`` and
  the GPU device nodes bound in.

A watcher process per harness process holds the read end of a pipe (the spawn shim in
``--watch`` mode, or ``watch_main`` without a C compiler); when the harness dies, even by
SIGKILL, the pipe reaches EOF and the watcher kills what the harness's cells left and removes
their docker containers.

Knobs: ``CUMATRIX_SANDBOX`` (off | auto | on; the flags set it per run),
``CUMATRIX_CONTAINMENT=subreaper`` (skip the cgroup, e.g. to compare), and
``CUMATRIX_NO_SPAWN_SHIM=1`` (spawn through ``preexec_fn``, e.g. to measure the shim).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import functools
import hashlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cumatrix.core.witness import TraceChannel, tracing_enabled

if TYPE_CHECKING:
    from cumatrix.core.jobs import Job

#: Variables a cell inherits from the harness's environment (names, then ``fnmatch`` patterns).
#: Everything else (tokens, cloud keys, the harness's own Python setup) stays out.
ENV_ALLOW = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
             "LD_LIBRARY_PATH", "DISPLAY", "SOURCE_DATE_EPOCH")
ENV_ALLOW_PATTERNS = ("LC_*", "CUDA_*", "NVIDIA_*", "__GL_*", "CUPTI_*", "NCCL_*")
#: ...for the harness's own children (probe, swap) as well: their knobs.
ENV_ALLOW_HARNESS = ("CUMATRIX_*", "KVSWAP_*", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE")
#: A pattern match is dropped all the same when the name says it holds a secret
#: (``NVIDIA_API_KEY``, ``NGC_API_KEY``-style names are common CI secrets).
_SECRET_RE = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
#: The kinds whose child is the harness's own code (``python -m cumatrix.child.case``).
HARNESS_KINDS = ("probe", "swap")
SCOPE_ENV = "CUMATRIX_SCOPE"

#: Resource limits (soft = hard).  No RLIMIT_AS or RLIMIT_DATA: CUDA reserves huge virtual
#: ranges (unified addressing) and fails to initialise under an address-space limit.
#: No RLIMIT_MEMLOCK change: pinned host memory is the driver's business.
NOFILE_MAX = 65536
NPROC_MAX = 32768
CPU_SLACK_S = 30

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_SPAWN_SOURCE = Path(__file__).resolve().parents[1] / "csrc" / "spawn.c"


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """How much of the host a cell sees.

    ``sandbox``: ``off``; ``auto`` (bubblewrap where it is installed and runs, else
    without, and the result says so); ``on`` (a cell fails with a harness error where
    bubblewrap cannot run).  ``pass_env``: names (or ``fnmatch`` patterns) of the
    harness's variables the cell gets beyond the allowlist.
    """

    sandbox: str = field(default_factory=lambda: _env_sandbox(os.environ.get("CUMATRIX_SANDBOX")))
    pass_env: tuple[str, ...] = ()
    limits: bool = True
    #: Bytes a sandboxed cell may write: the size of each of its tmpfs (``/tmp``, ``/dev/shm``)
    #: and the largest file it may write on the host (``RLIMIT_FSIZE``; the audit log).
    write_limit: int = field(default_factory=lambda: _env_size("CUMATRIX_SANDBOX_WRITE_LIMIT", WRITE_LIMIT))
    #: The host uid and gid a sandboxed cell runs as when the harness runs as root.
    uid: int = field(default_factory=lambda: _env_size("CUMATRIX_SANDBOX_UID", NOBODY, high=2**32 - 2))


#: What a sandboxed cell may write by default (``--sandbox-write-limit``).
WRITE_LIMIT = 1 << 30
#: The range ``--sandbox-write-limit`` accepts: a page to a tebibyte.
WRITE_LIMIT_RANGE = (4096, 1 << 40)
#: The host id a root harness's sandboxed cells run as (``nobody``; ``$CUMATRIX_SANDBOX_UID``).
NOBODY = 65534


def _env_size(name: str, default: int, *, high: int = WRITE_LIMIT_RANGE[1]) -> int:
    """An integer knob from the environment; a value that is not one in range is ignored."""
    raw = os.environ.get(name, "").strip()
    try:
        value = parse_size(raw) if raw else default
    except ValueError:
        return default
    return value if 0 < value <= high else default


def parse_size(text: str) -> int:
    """Bytes from ``1073741824``, ``512M``, ``1G``, ``1GiB`` (binary units); ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d{1,16})\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with K, M, G or T)")
    return int(m.group(1)) << (10 * " KMGT".index(m.group(2).upper() or " "))


def _env_sandbox(value: str | None) -> str:
    """``$CUMATRIX_SANDBOX``: unset/0/off: off; auto: where bubblewrap runs; anything else: on.

    The variable reaches pytest-xdist workers and every entry point; ``--sandbox`` is the flag.
    """
    v = (value or "").strip().lower()
    if v in ("", "0", "off", "no", "false"):
        return "off"
    return "auto" if v == "auto" else "on"


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """What run_local spawns for one job: the final argv, env and fds, and how it ends."""

    argv: tuple[str, ...]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()
    preexec_fn: Callable[[], None] | None = None
    extra: dict[str, object] = field(default_factory=dict)
    #: bubblewrap reports a child killed by signal N as exit 128+N.
    signal_in_exit: bool = False
    problem: str | None = None  # the cell cannot run as asked (a harness error)
    #: The kernel's record of the cell's processes (the spawn helper traces the tree); None:
    #: spawned untraced (no helper, or ``$CUMATRIX_NO_TRACE``).
    trace: TraceChannel | None = None


def _pattern(pats: Iterable[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in pats) or "(?!)")


_ALLOW_RE = _pattern(ENV_ALLOW_PATTERNS)
_ALLOW_HARNESS_RE = _pattern(ENV_ALLOW_PATTERNS + ENV_ALLOW_HARNESS)


@functools.lru_cache(maxsize=4096)
def _allowed(name: str, harness: bool, pass_env: tuple[str, ...]) -> bool:
    """Whether a child gets the variable ``name`` (decided once per name: every cell asks)."""
    if name in ENV_ALLOW:
        return True
    if _pattern(pass_env).match(name):
        return True  # asked for by name: the user's call, secret-looking or not
    pats = _ALLOW_HARNESS_RE if harness else _ALLOW_RE
    return pats.match(name) is not None and not _SECRET_RE.search(name)


_ENVIRON_SEEN: dict[tuple[bool, tuple[str, ...]], tuple[object, dict[str, str]]] = {}


def _allowed_environ(harness: bool, passed: tuple[str, ...]) -> dict[str, str]:
    """The allowlist of this process's environment, filtered again only when it changed.

    Every cell asks, and decoding each variable of ``os.environ`` is most of a child's
    environment's cost (50 variables: 0.3 ms a cell); the raw table is compared instead.
    """
    raw = getattr(os.environ, "_data", None)  # CPython's bytes table behind os.environ
    seen = dict(raw) if isinstance(raw, dict) else None
    if seen is not None and not _allowed("PYTEST_CURRENT_TEST", harness, passed):
        seen.pop(b"PYTEST_CURRENT_TEST", None)  # pytest sets it anew at every phase of every item
    key = (harness, passed)
    hit = _ENVIRON_SEEN.get(key)
    if seen is not None and hit is not None and hit[0] == seen:
        return hit[1]
    env = _filtered(os.environ, harness, passed)
    if seen is not None:
        _ENVIRON_SEEN[key] = (seen, env)
    return env


def _filtered(base: Mapping[str, str], harness: bool, passed: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k, v in base.items() if _allowed(k, harness, passed)}


def harness_paths() -> set[str]:
    """Directories of the harness's own Python packages (never on a command cell's path)."""
    import sysconfig

    out = {str(Path(__file__).resolve().parents[2])}
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            out.add(str(Path(p).resolve()))
    return out


@functools.lru_cache(maxsize=64)
def _without_harness_bin(path: str) -> str:
    """``PATH`` without the harness's own virtual environment's ``bin`` (where an activated venv
    put it first): a command cell's ``python3`` is then the system's, which lacks what only the
    harness installed.  A case that wants the harness's interpreter says ``python: harness``."""
    if sys.prefix == sys.base_prefix:
        return path  # not in a venv: its interpreter is the system's anyway
    own = os.path.realpath(os.path.join(sys.prefix, "bin"))
    kept = [p for p in path.split(os.pathsep) if p and os.path.realpath(p) != own]
    return os.pathsep.join(kept)


def child_env(job: Job, *, base_env: Mapping[str, str] | None = None,
              policy: Policy | None = None) -> dict[str, str]:
    """The environment of a job's child: the allowlist of ``base_env``, then the job's own.

    A command cell's ``PYTHONPATH`` loses the harness's package directories: a cell that
    runs a plain ``python3`` must not import what only the harness has installed.
    """
    policy = policy or default_policy()
    harness = job.reports_verdict or job.kind in HARNESS_KINDS
    passed = tuple(policy.pass_env)
    if base_env is None:
        env = dict(_allowed_environ(harness, passed))
    else:
        env = _filtered(base_env, harness, passed)
    if not harness and "PATH" in env:
        env["PATH"] = _without_harness_bin(env["PATH"])
        if job.harness_python:  # `python: harness`: asked for by the case, so first
            env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]])
    env.update(job.env)  # a case that sets PATH itself gets exactly that
    if not harness and "PYTHONPATH" in env:
        own = harness_paths()
        keep = [p for p in env["PYTHONPATH"].split(os.pathsep)
                if p and str(Path(p).resolve()) not in own]
        if keep:
            env["PYTHONPATH"] = os.pathsep.join(keep)
        else:
            del env["PYTHONPATH"]
    if job.lib_path:
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*job.lib_path, *([old] if old else [])])
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def limits(job: Job) -> list[tuple[str, int, int]]:
    """(name, soft, hard) resource limits of a job's child; none raises a current limit."""
    return list(_limits(job.timeout))


@functools.lru_cache(maxsize=16)
def _limits(timeout: float) -> tuple[tuple[str, int, int], ...]:
    """:func:`limits` for a timeout, worked out once (every cell of a run asks; a harness's own
    limits do not change while it runs)."""
    import resource

    cpus = os.cpu_count() or 1
    # CPU seconds: what every core could burn until the wall-clock timeout, and some.
    cpu = math.ceil(timeout * cpus) + CPU_SLACK_S if math.isfinite(timeout) else None
    wanted: list[tuple[str, int, int | None]] = [
        ("core", resource.RLIMIT_CORE, 0),
        ("nofile", resource.RLIMIT_NOFILE, NOFILE_MAX),
        ("nproc", resource.RLIMIT_NPROC, NPROC_MAX),
        ("cpu", resource.RLIMIT_CPU, cpu),
    ]
    out = []
    for name, res, cap in wanted:
        if cap is None:
            continue
        soft, hard = resource.getrlimit(res)
        new_hard = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        new_soft = new_hard if soft == resource.RLIM_INFINITY else min(soft, new_hard)
        out.append((name, new_soft, new_hard))
    return tuple(out)


# --------------------------------------------------------------------------- the spawn shim


_SHIM: dict[str, Path | None] = {}
_LOCK = threading.RLock()  # the watcher's start asks for the shim from within containment()


def spawn_shim() -> Path | None:
    """The compiled ``cumatrix-spawn``, built once per source and machine; None without a compiler."""
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
    try:
        source = _SPAWN_SOURCE.read_bytes()
    except OSError:
        return None
    from cumatrix.core.cache import cache_dir
    from cumatrix.core.errors import EnvironmentProblem

    tag = hashlib.sha256(source + os.uname().machine.encode() + b" static").hexdigest()[:16]
    try:
        target = cache_dir("bin") / f"cumatrix-spawn-{tag}"
    except (OSError, EnvironmentProblem):
        return None  # a cache that is not this user's alone: nothing in it is executed
    if os.access(target, os.X_OK):
        return target
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        # Linked statically where the C library allows it (libc.a): it then starts without the
        # dynamic loader, and so without the cell's LD_AUDIT library, which the cell's
        # environment would otherwise load into the shim too (0.5 ms a cell).
        for static in (["-static"], []):
            proc = subprocess.run([cc, "-O2", *static, "-o", str(tmp), str(_SPAWN_SOURCE)], capture_output=True,
                                  timeout=120, stdin=subprocess.DEVNULL, check=False)
            if proc.returncode == 0:
                break
        else:
            return None
        os.replace(tmp, target)  # atomic: parallel workers may build it at once
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _prctl() -> Callable[..., int] | None:
    try:
        import ctypes

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
    import resource

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


# --------------------------------------------------------------------------- bubblewrap


_BWRAP: dict[str, tuple[str | None, str]] = {}


def bubblewrap() -> tuple[str | None, str]:
    """(path of a bwrap that runs here, None) or (None, why there is none)."""
    with _LOCK:
        if "bwrap" not in _BWRAP:
            _BWRAP["bwrap"] = _find_bwrap()
        return _BWRAP["bwrap"]


def _find_bwrap() -> tuple[str | None, str]:
    path = shutil.which("bwrap")
    if path is None:
        return None, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return None, "the harness runs as root and setpriv (util-linux) is missing to drop the cell's uid"
    # The boundary itself, checked once: kernel settings and the host's sockets out of reach.
    probe = ["sh", "-c", "test ! -w /proc/sys/vm/swappiness && test ! -e /run/."]
    try:
        proc = subprocess.run(bwrap_command(path, probe, cwd="/", policy=Policy(sandbox="on")),
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{path} did not run: {e}"
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return None, f"{path} cannot create a sandbox here: {why}"
    return path, ""


#: Host directories every sandboxed cell reads (programs, their libraries, configuration, the
#: GPU's sysfs): bound read-only, a symbolic link (``/bin`` -> ``usr/bin``) recreated as one.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")
#: Never visible in the sandbox, even under a directory a job names: the host's sockets
#: (``docker.sock``, D-Bus, systemd) and container runtimes' state.
HIDDEN_ALWAYS = ("/run", "/var/run", "/var/lock", "/var/lib/docker", "/var/lib/containerd", "/proc", "/dev")


def gpu_nodes(dev: Path = Path("/dev")) -> list[str]:
    """The GPU's device nodes: ``/dev/nvidia*``, ``/dev/nvidia-caps/*``, ``/dev/dri``."""
    out = [str(p) for p in sorted(dev.glob("nvidia*")) if not p.is_dir()]
    caps = dev / "nvidia-caps"
    if caps.is_dir():
        out.append(str(caps))
    if (dev / "dri").is_dir():
        out.append(str(dev / "dri"))
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _bind_points(paths: Iterable[str]) -> list[str]:
    """Directories to bind so that every path is visible (a file: its directory), each once,
    outermost first; none under what the system directories already show, none that is or
    holds a host socket directory, never ``/``."""
    dirs = set()
    for p in paths:
        if not p or not p.startswith("/") or not os.path.exists(p):
            continue
        d = os.path.normpath(p if os.path.isdir(p) else os.path.dirname(p))
        if d == "/" or any(_under(d, h) for h in HIDDEN_ALWAYS if h not in ("/dev",)):
            continue
        if d.startswith("/dev/") and not d.startswith("/dev/nvidia"):
            continue
        if any(_under(d, s) for s in SYSTEM_DIRS if os.path.lexists(s)):
            continue  # shown already (a path under /bin, a link to usr/bin, too)
        dirs.add(d)
    out: list[str] = []
    for d in sorted(dirs):
        if not any(_under(d, o) for o in out):
            out.append(d)
    return out


def _searchable(points: Iterable[str]) -> None:
    """Bind points inside the harness's own cache made readable and searchable by the cell's
    unprivileged uid: builds land there from 0700 temporary directories.  The cache itself
    stays 0700, so no one else reaches them; the sandbox binds them past it."""
    from cumatrix.core.cache import cache_location

    cache = str(cache_location())
    for p in points:
        if not _under(p, cache) or p == cache:
            continue
        try:
            st = os.stat(p)
            if st.st_uid == os.geteuid() and st.st_mode & 0o005 != 0o005:
                os.chmod(p, st.st_mode | 0o055)
        except OSError:
            continue


def _environments(paths: Iterable[str]) -> list[str]:
    """The Python environments (a ``pyvenv.cfg`` beside ``bin/``) that paths' programs live in:
    a venv's interpreter needs its whole tree, not only the file named."""
    out: list[str] = []
    for p in paths:
        if not p:
            continue
        for root in (Path(p).parent, Path(p).parent.parent):
            if (root / "pyvenv.cfg").is_file():
                out.append(str(root))
                out += _venv_base(str(root / "pyvenv.cfg"))
    return out


@functools.lru_cache(maxsize=64)
def _venv_base(cfg: str) -> tuple[str, ...]:
    """The installation a venv's interpreter comes from (``home`` in ``pyvenv.cfg``, one level
    up: its ``lib/pythonX.Y`` too), which the sandbox must show when it lies outside ``/usr``."""
    try:
        lines = Path(cfg).read_text(errors="replace").splitlines()
    except OSError:
        return ()
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip().startswith("/"):
            return (os.path.dirname(os.path.realpath(value.strip())),)
    return ()


def bwrap_argv(bwrap: str, job: Job, env: dict[str, str], cwd: str, policy: Policy | None = None,
               write_dirs: Iterable[str] = ()) -> list[str]:
    """The bubblewrap command line that runs ``job.argv`` confined (see :func:`bwrap_command`),
    with what the job names bound read-only and its audit log (a file) writable; ``write_dirs``
    (the gate's install target, never a cell's) writable too."""
    wanted = [*job.mounts, *job.lib_path, cwd, *(a for a in job.argv if a.startswith("/"))]
    for var in ("PYTHONPATH", "LD_LIBRARY_PATH", "PATH"):
        wanted += env.get(var, "").split(os.pathsep)
    wanted += _environments(wanted)
    # What links lead to (a venv's python -> a pyenv or conda install under a private home).
    wanted += [r for r in (os.path.realpath(p) for p in wanted if p.startswith("/")) if r not in wanted]
    writable = [os.path.normpath(p) for p in job.writable if os.path.isfile(p)]
    writable += [os.path.normpath(d) for d in write_dirs if os.path.isdir(d)]
    return bwrap_command(bwrap, list(job.argv), cwd=cwd, policy=policy, read=wanted, write=writable)


def bwrap_command(bwrap: str, argv: list[str], *, cwd: str, policy: Policy | None = None,
                  read: Iterable[str] = (), write: Iterable[str] = ()) -> list[str]:
    """A bubblewrap command line: no network, no host IPC, its own pid, UTS and cgroup
    namespaces; the system directories, the GPU's device nodes and ``read`` read-only
    (``/proc/sys`` and ``/sys`` too); no ``/run``, ``/var/run`` or other host socket; a
    private ``/tmp`` and ``/dev/shm`` of ``policy.write_limit`` bytes each; the files in
    ``write`` (which must exist) the only writable host paths.

    The cell's root is never the host's: a root harness runs bubblewrap with every capability
    dropped but the three ``setpriv`` needs to become ``policy.uid`` (``nobody``) with none left
    and no way to gain one (``no_new_privs``); anyone else's bubblewrap creates a user namespace
    that maps the cell to its own unprivileged uid and forbids further ones.
    """
    policy = policy or default_policy()
    size = str(policy.write_limit)
    root = os.geteuid() == 0
    out = [bwrap, "--die-with-parent", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    if root:
        # No user namespace: in one made by root, the cell's uid 0 would still be the host's.
        # CAP_SETPCAP lets setpriv empty the bounding set (util-linux 2.39 drops every entry and
        # fails without it, as on Ubuntu 24.04); the change of uid then clears what is left.
        out += ["--unshare-cgroup", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                "--cap-add", "CAP_SETPCAP"]
    else:
        out += ["--unshare-user", "--disable-userns", "--unshare-cgroup-try", "--cap-drop", "ALL"]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            out += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            out += ["--ro-bind", d, d]
    out += ["--dev", "/dev"]
    for node in gpu_nodes():
        out += ["--dev-bind", node, node]
    out += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
            "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
            "--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    points = _bind_points(read)
    if root:
        _searchable(points)
    made = {"/tmp"}

    def above(p: str) -> None:
        # The directories above a bind point: made searchable (bubblewrap makes them 0700,
        # which an unprivileged cell could not pass), and nothing of the host's in them.
        parts = p.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:i])
            if d not in made and not any(_under(d, q) for q in points if q != p):
                out.extend(["--perms", "0755", "--dir", d])
                made.add(d)

    for p in points:
        above(p)
        out += ["--ro-bind", p, p]
    for hide in HIDDEN_ALWAYS[:-2]:  # a real directory (not a link to /run) under a bound one
        if any(_under(hide, p) for p in points) and os.path.isdir(hide) and not os.path.islink(hide):
            out += ["--perms", "0555", "--size", "4096", "--tmpfs", hide, "--remount-ro", hide]
    for f in write:  # the file alone, never its directory (a directory only where named)
        above(f)
        out += ["--bind", f, f]
    out += ["--chdir", cwd, "--"]
    if root:
        setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        out += [setpriv, f"--reuid={policy.uid}", f"--regid={policy.uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return [*out, *argv]


# --------------------------------------------------------------------------- the cell's tree


def _proc_token(pid: int) -> str | None:
    """``<pid>.<start time>``: a pid's identity (a reused pid has another start time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{pid}.{stat.rsplit(')', 1)[1].split()[19]}"


def _cgroup2_home() -> Path | None:
    """This process's directory in a cgroup v2 hierarchy, if one is mounted."""
    try:
        own = next((ln[3:].strip() for ln in Path("/proc/self/cgroup").read_text().splitlines()
                    if ln.startswith("0::")), None)
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    if own is None:
        return None
    for line in mounts:
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            fields = left.split()
            root, point = fields[3], fields[4]
            rel = own[len(root):] if root != "/" and own.startswith(root) else own
            home = Path(point) / rel.lstrip("/")
            if (home / "cgroup.procs").exists():
                return home
    return None


class Containment:
    """Per-process: how cells' trees are kept (cgroup v2 or subreaper) and the watcher."""

    def __init__(self) -> None:
        self.token = _proc_token(os.getpid()) or str(os.getpid())
        self.group: Path | None = None
        self.mode = "subreaper"
        self.why = ""
        self._seq = 0
        self._active = 0
        self._lock = threading.Lock()
        self._watcher_pid: int | None = None
        self._watch_fd: int | None = None
        self._pid = os.getpid()
        self._setup()

    def _setup(self) -> None:
        home = _cgroup2_home()
        if home is None:
            self.why = "no cgroup v2 hierarchy is mounted"
        elif os.environ.get("CUMATRIX_CONTAINMENT") == "subreaper":
            self.why = "CUMATRIX_CONTAINMENT=subreaper"
        elif not os.access(home / "cgroup.procs", os.W_OK):
            self.why = f"cgroup {home} is not writable by this user (not delegated)"
        else:
            _sweep_stale_groups(home)
            group = home / f"cumatrix-{self.token}"
            try:
                group.mkdir(exist_ok=True)
                self.group, self.mode = group, "cgroup-v2"
            except OSError as e:
                self.why = f"cannot create a cgroup under {home}: {e.strerror}"
        if self.group is None:
            prctl = _prctl()
            if prctl is not None:
                prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self._start_watcher()

    # ---------------------------------------------------------------- watcher

    def _start_watcher(self) -> None:
        # posix_spawn with a pipe of our own, not a Popen: the watcher outlives this process
        # on purpose, and only the write end, held here and inherited by no one (O_CLOEXEC),
        # keeps it waiting.
        # The watcher lives as long as the harness and as the same user: it gets no more of the
        # environment than it needs to find Python and the Docker daemon (no secrets to read).
        keep = _pattern(("DOCKER_*", "CUMATRIX_*", "PYTHON*", "XDG_*"))
        env = {k: v for k, v in os.environ.items()
               if (k in ENV_ALLOW or keep.match(k)) and not _SECRET_RE.search(k)}
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
        r, w = os.pipe()
        argv = [sys.executable, "-c", _WATCH_SCRIPT]
        shim = spawn_shim()
        if shim is not None:  # waits in C, and runs that Python only once the harness has died
            argv = [str(shim), "--watch", *argv]
        try:
            self._watcher_pid = os.posix_spawn(
                argv[0], argv,
                env, setsid=True,
                file_actions=[(os.POSIX_SPAWN_DUP2, r, 0),
                              (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                              (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
        except OSError:
            os.close(w)
            return
        finally:
            os.close(r)
        self._watch_fd = w
        self.tell(f"token {self.token}")
        if self.group is not None:
            self.tell(f"+cg {self.group}")

    def tell(self, line: str) -> None:
        """One line to the watcher (what to clean up if this process dies)."""
        if self._watch_fd is None:
            return
        try:
            os.write(self._watch_fd, line.encode() + b"\n")  # one write under PIPE_BUF: atomic
        except OSError:
            self._watch_fd = None

    @property
    def watcher_pid(self) -> int | None:
        return self._watcher_pid

    # ---------------------------------------------------------------- cells

    def open_scope(self) -> Scope:
        with self._lock:
            self._seq += 1
            self._active += 1
            seq = self._seq
        cg = None
        if self.group is not None:
            cg = self.group / f"c{seq}"
            try:
                cg.mkdir()
            except FileExistsError:
                pass
        return Scope(owner=self, marker=f"{self.token}/{seq}", cgroup=cg)

    def _closed(self) -> None:
        with self._lock:
            self._active -= 1

    def sole(self) -> bool:
        return self._active == 1


@dataclass(kw_only=True, slots=True)
class Scope:
    """One cell's processes: opened before the spawn, ended after the cell."""

    owner: Containment
    marker: str
    cgroup: Path | None
    leader: int | None = None
    start_ticks: int = 0
    ended: bool = False
    killed: int = 0  # processes the cell left running when it ended

    @property
    def mode(self) -> str:
        return "cgroup-v2" if self.cgroup is not None else "subreaper"

    def started(self, pid: int) -> None:
        self.leader = pid
        if self.cgroup is not None:
            return  # the start time serves the sweep alone
        token = _proc_token(pid)
        self.start_ticks = int(token.split(".")[1]) if token else 0

    def end(self) -> int:
        """Kill every process of the cell that is left; return how many were found."""
        if self.ended:
            return self.killed
        self.ended = True
        try:
            if self.cgroup is not None:
                self.killed = _kill_cgroup(self.cgroup, remove=True)
            else:
                self.killed = _sweep(self, sole=self.owner.sole())
        finally:
            self.owner._closed()
        return self.killed


_CONTAINMENT: dict[int, Containment] = {}


def containment() -> Containment:
    """This process's :class:`Containment` (made on first use; a forked child makes its own)."""
    pid = os.getpid()
    with _LOCK:
        got = _CONTAINMENT.get(pid)
        if got is None:
            _CONTAINMENT.clear()
            got = _CONTAINMENT[pid] = Containment()
        return got


def _kill_cgroup(group: Path, *, remove: bool) -> int:
    """Kill every process in ``group`` and its children groups; remove them (when asked)."""
    try:
        fd = os.open(group / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
        try:
            populated = b"populated 1" in os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return 0
    found = 0
    if populated:
        found = len((group / "cgroup.procs").read_text().split())
        kill = group / "cgroup.kill"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if kill.exists():  # Linux >= 5.14: the kernel kills the whole subtree at once
                try:
                    kill.write_text("1")
                except OSError:
                    pass
            else:
                _kill_listed(group)
            if "populated 0" in (group / "cgroup.events").read_text():
                break
            time.sleep(0.01)
    if remove:
        _rmdir(group)
    return found


def _kill_listed(group: Path) -> None:
    for procs in [group / "cgroup.procs", *group.rglob("cgroup.procs")]:
        try:
            pids = procs.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _rmdir(path: Path) -> None:
    """Remove a cgroup and the groups a cell made inside it."""
    for _ in range(100):  # a killed process leaves its cgroup a moment after it is reaped
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            for sub in (p for p in path.iterdir() if p.is_dir()):
                _rmdir(sub)
            time.sleep(0.002)


def _sweep_stale_groups(home: Path) -> None:
    """Remove the cgroups of harness processes that died without their watcher."""
    for group in home.glob("cumatrix-*"):
        token = group.name[len("cumatrix-"):]
        pid = token.split(".", 1)[0]
        if pid.isdigit() and _proc_token(int(pid)) == token:
            continue
        _kill_cgroup(group, remove=True)


def _table() -> dict[int, tuple[int, int, int, int]]:
    """pid -> (ppid, pgid, sid, start ticks) of every process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        out[int(entry.name)] = (int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]))
    return out


def _carries(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def _descendants(table: Mapping[int, tuple[int, int, int, int]], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def _only_known_children(me: int, known: set[int]) -> bool:
    """True when this process has no child but ``known`` ones: nothing was orphaned to us.

    Whatever a finished cell left running was re-parented to the subreaper (this process)
    when its parent ended, so a glance at our children spares the full /proc walk.
    """
    try:
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children") as f:
                if any(int(c) not in known for c in f.read().split()):
                    return False
    except OSError:
        return False  # no /proc/PID/task/TID/children: walk
    return True


def _sweep(scope: Scope, *, sole: bool) -> int:
    """Kill what a cell left where there is no cgroup (the harness is the subreaper)."""
    me, watcher = os.getpid(), scope.owner.watcher_pid
    if sole and _only_known_children(me, {p for p in (watcher, scope.leader) if p}):
        return 0
    marker = f"{SCOPE_ENV}={scope.marker}".encode()
    found: set[int] = set()
    for _ in range(5):  # a process may fork while the sweep runs: sweep until none is left
        table = _table()
        mine = _descendants(table, [me]) - {me} - _descendants(table, [watcher] if watcher else [])
        seeds = {pid for pid in mine if _left_by(scope, table, pid, me=me, sole=sole, marker=marker)}
        victims = _descendants(table, seeds) & mine
        if not victims:
            break
        _kill_and_reap(victims, table, me)
        found |= victims
    return len(found - ({scope.leader} if scope.leader else set()))


def _left_by(scope: Scope, table: Mapping[int, tuple[int, int, int, int]], pid: int, *, me: int, sole: bool,
             marker: bytes) -> bool:
    """Whether ``pid`` belongs to the cell: in its group or session, an orphan of it, or marked."""
    ppid, pgid, sid, start = table[pid]
    if scope.leader is not None and scope.leader in (pid, pgid, sid):
        return True
    if sole and start >= scope.start_ticks and ppid == me:
        return True  # an orphan of this cell (the only one running) that re-parented to us
    return _carries(pid, marker)


def _kill_and_reap(victims: set[int], table: Mapping[int, tuple[int, int, int, int]], me: int) -> None:
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for pid in victims:  # reap those that are our children (orphans re-parented to us)
        if table[pid][0] == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


# --------------------------------------------------------------------------- the plan


_DEFAULT: dict[str, Policy] = {}


def set_default(policy: Policy | None) -> Policy | None:
    """Make ``policy`` the policy of every job run without one (None: the plain default).

    Returns the policy it replaces, so that a command run inside another process (a gate or a
    pytest session started in-process, as the tests do) puts it back when it ends instead of
    leaving its own to whatever runs next.
    """
    previous = _DEFAULT.pop("policy", None)
    if policy is not None:
        _DEFAULT["policy"] = policy
    return previous


def default_policy() -> Policy:
    return _DEFAULT.get("policy") or Policy()


def prepare(job: Job, *, base_env: Mapping[str, str] | None = None, cwd: str | None = None,
            policy: Policy | None = None, trace: bool = True) -> tuple[Plan, Scope]:
    """The final argv, env and fds of a job's child, and the scope that ends its tree.

    ``trace`` False spawns the tree untraced (a debugger's run: it traces the tree itself, and
    one process has one tracer); its containment, limits and sandbox are the same."""
    policy = policy or default_policy()
    env = child_env(job, base_env=base_env, policy=policy)
    box = containment()
    scope = box.open_scope()
    if scope.cgroup is None:
        env[SCOPE_ENV] = scope.marker
    extra: dict[str, object] = {"containment": scope.mode}
    argv: tuple[str, ...] = job.argv
    signal_in_exit = False
    problem = None
    if policy.sandbox in ("auto", "on"):
        bwrap, why = bubblewrap()
        if bwrap is not None:
            env["TMPDIR"] = "/tmp"
            env["HOME"] = "/tmp"  # the host's home is not there: a writable one of the cell's own
            argv = tuple(bwrap_argv(bwrap, job, env, cwd or os.getcwd(), policy))
            extra["sandbox"] = "bubblewrap"
            signal_in_exit = True
        elif policy.sandbox == "on":
            extra["sandbox"] = "none"
            problem = f"--sandbox asked for a sandbox and there is none: {why}"
        else:
            extra["sandbox"] = f"none: {why}"
    lims = limits(job) if policy.limits else []
    if extra.get("sandbox") == "bubblewrap":
        lims.append(("fsize", policy.write_limit, policy.write_limit))
    procs = str(scope.cgroup / "cgroup.procs") if scope.cgroup is not None else None
    shim = spawn_shim()
    if shim is not None:
        spec = ",".join(f"{n}={s}:{h}" for n, s, h in lims) or "-"
        if trace and tracing_enabled() and problem is None:
            chan = TraceChannel()
            return Plan(argv=(str(shim), "--trace", str(chan.write_fd), str(os.getpid()), procs or "-", spec, "--",
                              *argv), env=env, pass_fds=(chan.write_fd,), extra=extra, signal_in_exit=signal_in_exit,
                        problem=problem, trace=chan), scope
        return Plan(argv=(str(shim), str(os.getpid()), procs or "-", spec, "--", *argv), env=env,
                    extra=extra, signal_in_exit=signal_in_exit, problem=problem), scope
    extra["spawn"] = "preexec"
    return Plan(argv=argv, env=env, preexec_fn=_preexec(os.getpid(), procs, lims), extra=extra,
                signal_in_exit=signal_in_exit, problem=problem), scope


# --------------------------------------------------------------------------- docker


def watch_container(name: str) -> None:
    """Ask the watcher to remove container ``name`` should this process die."""
    containment().tell(f"+ctr {name}")


def unwatch_container(name: str) -> None:
    containment().tell(f"-ctr {name}")


# --------------------------------------------------------------------------- the watcher


#: The watcher's cleanup, run once the harness has died with all it was told on stdin.  While
#: the harness lives, the spawn shim waits in its place (``cumatrix-spawn --watch``, 1 MB);
#: without a C compiler this script waits itself, a bare interpreter that imports this module
#: (and with it the means to kill and remove) only at the end.
_WATCH_SCRIPT = """
import signal, sys
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(sig, signal.SIG_IGN)  # only the harness's death ends the watch
lines = [raw.decode(errors="replace").rstrip("\\n") for raw in sys.stdin.buffer]
from cumatrix.execute.sandbox import watch_cleanup
watch_cleanup(lines)
"""


def watch_main() -> None:
    """The watcher: read what to clean up from stdin; at EOF (the harness died), clean it up."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the harness's death ends the watch
    watch_cleanup([raw.decode(errors="replace").rstrip("\n") for raw in sys.stdin.buffer])


def watch_cleanup(lines: Iterable[str]) -> None:
    """Clean up after a dead harness: what its watcher was told, one line each."""
    token = ""
    groups: list[str] = []
    containers: dict[str, None] = {}
    for line in lines:
        cmd, _, arg = line.partition(" ")
        if cmd == "token":
            token = arg
        elif cmd == "+cg":
            groups.append(arg)
        elif cmd == "+ctr":
            containers[arg] = None
        elif cmd == "-ctr":
            containers.pop(arg, None)
    for g in groups:
        _kill_cgroup(Path(g), remove=True)
    if token:
        _kill_marked(f"{SCOPE_ENV}={token}/".encode())
    if containers:
        _remove_containers(list(containers))


def _kill_marked(prefix: bytes) -> None:
    """Kill every process whose environment carries a marker starting with ``prefix``."""
    for _ in range(5):
        table = _table()
        seeds = set()
        for pid in table:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if any(v.startswith(prefix) for v in f.read().split(b"\0")):
                        seeds.add(pid)
            except OSError:
                continue
        victims = _descendants(table, seeds) - {os.getpid()}
        if not victims:
            return
        _kill_and_reap(victims, table, os.getpid())
        time.sleep(0.05)


def _remove_containers(names: list[str]) -> None:
    try:
        import docker
        import docker.errors
    except ImportError:
        return
    try:
        client = docker.from_env(timeout=60)
    except docker.errors.DockerException:
        return
    for name in names:
        try:
            client.containers.get(name).remove(force=True)
        except docker.errors.DockerException:
            pass
    client.close()


# --------------------------------------------------------------------------- options


def add_cli_options(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """``--sandbox`` / ``--no-sandbox`` and ``--pass-env NAME`` on a subcommand's parser.

    ``default`` is ``auto`` for ``gate`` (bubblewrap where it runs) and None for ``run``
    (off, unless ``$CUMATRIX_SANDBOX`` says otherwise).
    """
    now = ("by default each cell runs under bubblewrap where it is installed and runs"
           if default == "auto" else "off by default")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--sandbox", dest="sandbox", action="store_const", const="on", default=default,
                   help=f"run each cell under bubblewrap: no network, a read-only root, a private /tmp, "
                        f"the GPU's device nodes; a cell fails where bubblewrap cannot run ({now})")
    g.add_argument("--no-sandbox", dest="sandbox", action="store_const", const="off",
                   help="run cells without bubblewrap (environment allowlist and limits still apply)")
    parser.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                        help="also give cells this variable of the harness's environment (repeatable; "
                             "a glob such as 'MYAPP_*' works)")
    parser.add_argument("--sandbox-write-limit", type=_size_arg, default=None, metavar="SIZE",
                        help="what a sandboxed cell may write: the size of its /tmp and /dev/shm each and "
                             "of any file (default 1G; 4K to 1T; $CUMATRIX_SANDBOX_WRITE_LIMIT)")


def _size_arg(text: str) -> int:
    """``--sandbox-write-limit``: a size within :data:`WRITE_LIMIT_RANGE` (argparse: exit 2)."""
    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    low, high = WRITE_LIMIT_RANGE
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"{text}: expected from 4K to 1T, got {value} bytes")
    return value


def add_pytest_options(group: Any) -> None:
    """The same options for ``pytest matrix.yaml`` (a pytest option group)."""
    group.addoption("--cumatrix-sandbox", choices=("off", "auto", "on"), default=None,
                    help="bubblewrap per cell: off (default; or $CUMATRIX_SANDBOX), auto (where it runs), "
                         "on (required)")
    group.addoption("--cumatrix-pass-env", action="append", default=[], metavar="NAME",
                    help="also give cells this variable of the harness's environment (repeatable)")
    group.addoption("--cumatrix-sandbox-write-limit", type=_size_arg, default=None, metavar="SIZE",
                    help="what a sandboxed cell may write (default 1G; 4K to 1T)")


def policy(sandbox: str | None = None, pass_env: Iterable[str] | None = (), write_limit: int | None = None) -> Policy:
    """A :class:`Policy` from option values (``args.sandbox``, ``args.pass_env``,
    ``args.sandbox_write_limit``); None: the default."""
    extra: dict[str, Any] = {"pass_env": tuple(pass_env or ())}
    if write_limit is not None:
        extra["write_limit"] = write_limit
    if sandbox is None:
        return Policy(**extra)
    if sandbox not in ("off", "auto", "on"):
        raise ValueError(f"sandbox must be off, auto or on, not {sandbox!r}")
    return Policy(sandbox=sandbox, **extra)
