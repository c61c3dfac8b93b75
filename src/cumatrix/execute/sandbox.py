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
  limits that cannot break CUDA programs, and where bubblewrap is installed (the default of
  ``run`` and the gate) a sandbox with no network, a read-only root, a private ``/tmp`` and
  the GPU device nodes bound in: written once as bubblewrap's operations (:func:`sandbox_ops`),
  built by the fork server (:mod:`.forkserver`) for a root harness that traces its cells in
  cgroups, by bubblewrap per cell elsewhere.  What a path shows is decided by where it leads
  (a bind follows its source's links): each is bound from its resolved path, and one that
  leads into the host's ``/run``, ``/dev``, root or what the harness keeps is refused, naming
  the link (:func:`_refusal`); what the harness keeps is masked wherever a bind shows it.

A watcher process per harness process holds the read end of a pipe (the spawn shim in
``--watch`` mode, or ``watch_main`` without a C compiler); when the harness dies, even by
SIGKILL, the pipe reaches EOF and the watcher kills what the harness's cells left and removes
their docker containers.

The spawn lives in :mod:`.spawn`, the tree in :mod:`.containment`, the environment and
limits in :mod:`.childenv`; this module decides, per job, how they combine (:func:`prepare`).
Which sandbox a job gets is its :class:`~cumatrix.core.options.SandboxPolicy`, handed in by the
caller (the run's options); a caller that hands none gets the environment's.

Knobs: ``CUMATRIX_SANDBOX`` (off | auto | on; read by :mod:`cumatrix.core.options`),
``CUMATRIX_CONTAINMENT=subreaper`` (skip the cgroup, e.g. to compare), and
``CUMATRIX_NO_SPAWN_SHIM=1`` (spawn through ``preexec_fn``, e.g. to measure the shim).
"""

# Paths stay strings here on purpose (ruff's PTH rules off for this module): they are what
# bwrap's argv, /proc and the kernel take, and this runs for every cell.
# ruff: noqa: PTH109, PTH112, PTH113, PTH114, PTH115, PTH116, PTH118

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cumatrix.core.options import (
    NOBODY,
    WRITE_LIMIT,
    WRITE_LIMIT_RANGE,
    SandboxPolicy,
    parse_size,
    sandbox_policy,
)
from cumatrix.core.witness import TraceChannel, tracing_enabled
from cumatrix.execute import driverview, forkserver
from cumatrix.execute.childenv import (
    _SECRET_RE,
    CPU_SLACK_S,
    ENV_ALLOW,
    ENV_ALLOW_HARNESS,
    ENV_ALLOW_PATTERNS,
    HARNESS_KINDS,
    NOFILE_MAX,
    NPROC_MAX,
    SCOPE_ENV,
    child_env,
    harness_paths,
    limits,
)
from cumatrix.execute.containment import (
    Containment,
    Scope,
    _cgroup2_home,
    containment,
    unwatch_container,
    watch_cleanup,
    watch_container,
    watch_main,
)
from cumatrix.execute.spawn import (
    _LOCK,
    _SHIM,
    _SPAWN_SOURCE,
    _preexec,
    die_with_parent,
    dumpable,
    forget_shim,
    harden,
    spawn_shim,
)
from cumatrix.execute.viewpaths import (
    HIDDEN_ALWAYS,
    PRIVATE_DIRS,
    RUN_FILES,
    SYSTEM_DIRS,
    Refused,
    _bind_dir,
    _enterable,
    _environments,
    _hidden_roots,
    _masks,
    _outermost,
    _private_points,
    _refusal,
    _run_files,
    _searchable,
    _system_dirs,
    _under,
    _unseen_cwd,
    earlier_outs,
    gpu_nodes,
    host_mount,
    kept_paths,
)

if TYPE_CHECKING:
    from cumatrix.core.jobs import Job

#: The policy of a cell (built by :mod:`cumatrix.core.options` from options and environment).
Policy = SandboxPolicy
#: How a sandboxed cell is held: bubblewrap per cell, or namespaces made by the fork server.
SANDBOXED = ("bubblewrap", "namespaces")

__all__ = [
    "BWRAP_ENV",
    "CPU_SLACK_S",
    "ENV_ALLOW",
    "ENV_ALLOW_HARNESS",
    "ENV_ALLOW_PATTERNS",
    "HARNESS_KINDS",
    "HIDDEN_ALWAYS",
    "NOBODY",
    "NOFILE_MAX",
    "NPROC_MAX",
    "PRIVATE_DIRS",
    "RUN_FILES",
    "SANDBOXED",
    "SCOPE_ENV",
    "SYSTEM_DIRS",
    "WRITE_LIMIT",
    "WRITE_LIMIT_RANGE",
    "_LOCK",
    "_SECRET_RE",
    "_SHIM",
    "_SPAWN_SOURCE",
    "Containment",
    "Plan",
    "Policy",
    "Refused",
    "Scope",
    "_cgroup2_home",
    "_preexec",
    "bubblewrap",
    "bwrap_argv",
    "bwrap_command",
    "child_env",
    "containment",
    "describe",
    "die_with_parent",
    "dumpable",
    "earlier_outs",
    "fix_for",
    "forget_shim",
    "gpu_nodes",
    "harden",
    "harness_paths",
    "host_mount",
    "kept_paths",
    "limits",
    "parse_size",
    "prepare",
    "spawn_shim",
    "unwatch_container",
    "watch_cleanup",
    "watch_container",
    "watch_main",
]


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
    #: The cell as the fork server runs it (``argv`` is then the program's own); None: spawned here.
    served: forkserver.ServedCell | None = None


# --------------------------------------------------------------------------- bubblewrap


_BWRAP: dict[str, tuple[str | None, str]] = {}


def bubblewrap() -> tuple[str | None, str]:
    """(path of a bwrap that runs here, None) or (None, why there is none)."""
    with _LOCK:
        if "bwrap" not in _BWRAP:
            _BWRAP["bwrap"] = _find_bwrap()
        return _BWRAP["bwrap"]


def _find_bwrap() -> tuple[str | None, str]:
    named = os.environ.get(BWRAP_ENV, "").strip()
    path = named or shutil.which("bwrap")
    if named and not (os.path.isfile(named) and os.access(named, os.X_OK)):
        return None, f"${BWRAP_ENV}={named}: no such program"
    if path is None:
        return None, "bubblewrap is not installed"
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            return None, "the harness runs as root and setpriv (util-linux) is missing to drop the cell's uid"
        real = os.path.realpath(setpriv)
        if not any(real == d or real.startswith(d + "/") for d in SYSTEM_DIRS):
            # It runs inside the sandbox, which shows the cell the system directories only.
            return None, (f"the harness runs as root and its setpriv ({setpriv}) lies outside the directories the "
                          f"sandbox shows a cell ({', '.join(SYSTEM_DIRS)}), so the cell's uid cannot be dropped")
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


#: The bubblewrap to use where it is not on ``PATH`` (a copy unpacked from a ``.deb``).
BWRAP_ENV = "CUMATRIX_BWRAP"


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return None


def fix_for(why: str) -> str:
    """What would let this host sandbox its cells, for the reason :func:`bubblewrap` gave."""
    if "not installed" in why or "no such program" in why:
        return f"install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap), or name one in ${BWRAP_ENV}"
    if "setpriv" in why and "lies outside" in why:
        return ("put a setpriv under a system directory (util-linux's own: apt-get install util-linux, "
                "/usr/bin/setpriv), or run cumatrix as a user other than root")
    if "setpriv" in why:
        return "install util-linux's setpriv (apt-get install util-linux), or run cumatrix as a user other than root"
    if _sysctl("kernel.apparmor_restrict_unprivileged_userns") == "1":
        # Ubuntu 23.10+ (https://ubuntu.com/blog/ubuntu-23-10-restricted-unprivileged-user-namespaces)
        return ("AppArmor restricts unprivileged user namespaces: allow them to bwrap with an AppArmor "
                "profile ('userns,' for /usr/bin/bwrap), or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")
    if _sysctl("kernel.unprivileged_userns_clone") == "0":
        return "user namespaces are off: sysctl -w kernel.unprivileged_userns_clone=1"
    if _sysctl("user.max_user_namespaces") == "0":
        return "user namespaces are off: sysctl -w user.max_user_namespaces=10000"
    return "let this user create user namespaces (or run bwrap setuid)"


def describe(policy: Policy) -> tuple[str, str | None]:
    """How a run's local cells are held, for its header and reports (``bubblewrap``, ``off``,
    or ``none: why``), and the one line to print when a sandbox was wanted and there is none."""
    if policy.sandbox == "off":
        return "off", None
    bwrap, why = bubblewrap()
    if bwrap is not None:
        return ("namespaces" if forkserver.serves(policy.sandbox, _probe_ops) else "bubblewrap"), None
    line = (f"cumatrix: cells run WITHOUT a sandbox (as this user, within reach of its files): {why}; "
            f"fix: {fix_for(why)}; --no-sandbox says it is meant, --require-sandbox makes it an error")
    return f"none: {why}", line


def bwrap_argv(bwrap: str, job: Job, env: dict[str, str], cwd: str, policy: Policy | None = None,
               write_dirs: Iterable[str] = ()) -> list[str]:
    """The bubblewrap command line that runs ``job.argv`` confined (see :func:`bwrap_command`),
    with what the job names bound read-only and its audit log (a file) writable; ``write_dirs``
    (the gate's install target, never a cell's) writable too."""
    read, write = _job_view(job, env, cwd, write_dirs)
    return bwrap_command(bwrap, list(job.argv), cwd=cwd, policy=policy, read=read, write=write, job=job)


def job_ops(job: Job, env: dict[str, str], cwd: str, policy: Policy, *, idmap: bool = False) -> list[str]:
    """What :func:`bwrap_argv` tells bubblewrap to build for ``job``, as the fork server is told
    it (:func:`sandbox_ops`; ``idmap``: see there)."""
    read, write = _job_view(job, env, cwd, ())
    return sandbox_ops(cwd=cwd, policy=policy, read=read, write=write, job=job, idmap=idmap)


def _job_view(job: Job, env: dict[str, str], cwd: str, write_dirs: Iterable[str]) -> tuple[list[str], list[str]]:
    """The host paths a job's cell reads (its mounts, libraries, working directory, programs,
    search paths and their environments) and the files it may write."""
    named = [*job.mounts, *job.lib_path, cwd, *(a for a in job.argv if a.startswith("/"))]
    if cwd == "/tmp":
        # The cell's /tmp is its own: of the host's, it sees what its command names there.
        named += [p for p in (os.path.join(cwd, a) for a in job.argv if a and not a.startswith("/"))
                  if os.path.lexists(p)]
    for var in ("PYTHONPATH", "LD_LIBRARY_PATH", "PATH"):
        named += env.get(var, "").split(os.pathsep)
    writable = [os.path.normpath(p) for p in job.writable if os.path.isfile(p)]
    writable += [os.path.normpath(d) for d in write_dirs if os.path.isdir(d)]
    return list(_reached(tuple(dict.fromkeys(named)))), writable  # each once (a PATH names some twice)


@functools.lru_cache(maxsize=256)
def _reached(named: tuple[str, ...]) -> tuple[str, ...]:
    """The paths a cell reads for the paths its job names: those, the Python environments their
    programs live in, and what links among them lead to.  Kept per harness process (a run's
    cells name the same few sets; each look-up is some 40 stat calls): a path that appears later
    under a name already looked up is not shown, and a cell then misses it, it never gains one."""
    wanted = list(named)
    wanted += _environments(wanted)
    # What links lead to (a venv's python -> a pyenv or conda install under a private home).
    wanted += [r for r in (os.path.realpath(p) for p in wanted if p.startswith("/")) if r not in wanted]
    return tuple(wanted)


def _views(points: Mapping[str, str], masks: list[tuple[str, str]], write: Iterable[str],
           private: Iterable[str] = ()) -> list[str]:
    """bubblewrap's arguments for what the cell sees of the host beyond the system: ``points``
    (path in the view -> the host path it shows) read-only, ``masks`` (what the harness keeps,
    where a point shows it: path in the view, path on the host) empty, the files in ``write``
    writable, and the host's socket directories hidden under a point.  Every source is the
    resolved path that was checked (:func:`_refusal`), never a link the bind would follow."""
    out: list[str] = []
    made = {"/tmp"}
    at_mask = {view for view, _ in masks}
    dir_mask = {view for view, real in masks if os.path.isdir(real)}

    def above(p: str) -> None:
        # The directories above a bind point: made searchable (bubblewrap makes them 0700,
        # which an unprivileged cell could not pass), and nothing of the host's in them;
        # those inside a mask are the mask's (empty) and made too.
        parts = p.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:i])
            shown = any(_under(d, q) for q in points if q != p) and not any(
                _under(d, m) and m != d for m in at_mask)
            if d not in made and not shown:
                out.extend(["--perms", "0755", "--dir", d])
                made.add(d)

    # A mask is an empty tmpfs over a directory, /dev/null over a file, mounted before what
    # the job names inside it (sorted: a directory comes before what it holds), read-only last.
    for p in sorted({*points, *at_mask}):
        above(p)
        if p in dir_mask:
            out += ["--perms", "0755", "--size", "4096", "--tmpfs", p]
        elif p in at_mask:
            out += ["--ro-bind", "/dev/null", p]
        else:
            out += ["--ro-bind-idmap" if p in private else "--ro-bind", points[p], p]
    for view, src in points.items():  # a real directory (not a link to /run) under a bound one
        for hide in _hidden_roots():
            if _under(hide, src) and hide != src and os.path.isdir(hide) and not os.path.islink(hide):
                at = os.path.join(view, os.path.relpath(hide, src))
                out += ["--perms", "0555", "--size", "4096", "--tmpfs", at, "--remount-ro", at]
    for f in write:  # the file alone, never its directory (a directory only where named)
        above(f)
        out += ["--bind", os.path.realpath(f), f]
    for m in sorted(dir_mask):
        out += ["--remount-ro", m]
    return out


def bwrap_command(bwrap: str, argv: list[str], *, cwd: str, policy: Policy | None = None,
                  read: Iterable[str] = (), write: Iterable[str] = (), job: Job | None = None) -> list[str]:
    """A bubblewrap command line: no network, no host IPC, its own pid, UTS and cgroup
    namespaces, and the view of :func:`sandbox_ops`.

    The cell's root is never the host's: a root harness runs bubblewrap with every capability
    dropped but the three ``setpriv`` needs to become ``policy.uid`` (``nobody``) with none left
    and no way to gain one (``no_new_privs``); anyone else's bubblewrap creates a user namespace
    that maps the cell to its own unprivileged uid and forbids further ones.
    """
    policy = policy or sandbox_policy()
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
    out += sandbox_ops(cwd=cwd, policy=policy, read=read, write=write, job=job)
    out.append("--")
    if root:
        setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        out += [setpriv, f"--reuid={policy.uid}", f"--regid={policy.uid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return [*out, *argv]


def sandbox_ops(*, cwd: str, policy: Policy, read: Iterable[str] = (), write: Iterable[str] = (),
                job: Job | None = None, idmap: bool = False) -> list[str]:
    """What the cell sees, in bubblewrap's words: the system directories, the GPU's device nodes
    and ``read`` read-only (``/proc/sys`` and ``/sys`` too); no ``/run``, ``/var/run`` or other
    host socket; a private ``/tmp`` and ``/dev/shm`` of ``policy.write_limit`` bytes each; the
    files in ``write`` (which must exist) the only writable host paths; ``cwd`` its directory.
    bubblewrap builds it per cell, the fork server from the same list; ``job``'s driver: :mod:`.driverview`.
    ``idmap`` (the fork server of a root harness, whose cells have uids of their own): a bind
    point the cell's uid could not enter (a 0700 project, pytest's ``tmp_path``) is bound as
    ``--ro-bind-idmap``, an idmapped mount showing the harness's files there as the cell's."""
    size = str(policy.write_limit)
    out: list[str] = []
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
    # What the harness keeps, with whether each exists now: one made since the last look (the
    # key, the history) is masked from the next cell on.
    kept = tuple((k, os.path.lexists(k)) for k in (*kept_paths(), *policy.hidden))
    # The runs' --out directories existed when listed: looked at again only where they are
    # masked (a mask over one removed since would have nothing to go on).
    outs = earlier_outs()
    points, masks, refused = _points_and_masks(tuple(read), kept, outs)
    if any(not os.path.lexists(real) for _, real in masks):
        points, masks, refused = _points_and_masks.__wrapped__(tuple(read), kept, outs)
    if refused is not None:
        raise Refused(refused)
    for f in write:  # the harness's own files (a cell's audit log): through a link only where it was planted
        if os.path.realpath(f) != os.path.normpath(f):
            why = _refusal(f, [(os.path.normpath(k), os.path.realpath(k)) for k, _ in kept])
            if why is not None:
                raise Refused(why)
    private = _private_points(tuple(p for p, _ in points), tuple(read)) if idmap else ()
    out += _views(dict(points), list(masks), write, private)
    out += driverview.job_ops(job, lambda f: any(_under(f, d) for d in (*_system_dirs(), *(p for p, _ in points))))
    return [*out, "--chdir", cwd]


@functools.lru_cache(maxsize=256)
def _points_and_masks(read: tuple[str, ...], kept: tuple[tuple[str, bool], ...], outs: tuple[str, ...] = ()
                      ) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...], str | None]:
    """The directories to bind for ``read`` (path in the view, the host path it shows: where
    it leads), the kept paths (and runs' ``outs``) they would show (to mask: path in the view,
    path on the host), and why the view is refused (None: it is not), once per harness process
    for the same paths and kept paths present (as :func:`_reached`)."""
    known = [(os.path.normpath(k), os.path.realpath(k)) for k in (*(k for k, _ in kept), *outs)]
    source: dict[str, str] = {}
    for n in read:
        d = _bind_dir(n)
        if d is None or d in source:
            continue
        why = _refusal(d, known, named=n)
        if why is not None:
            return (), (), why
        source[d] = os.path.realpath(d)
    outer = {p: source[p] for p in _outermost(set(source))}
    masks = _masks([*(k for k, _ in kept), *_run_files(outs, outer.values())], outer)
    at_mask = [view for view, _ in masks]
    # What a mask would hide of a job's own paths, bound again; a kept directory itself never.
    points = [p for p in _outermost(set(source), at_mask) if p not in at_mask]
    if os.geteuid() == 0:
        _searchable([source[p] for p in points])
    return tuple((p, source[p]) for p in points), tuple(masks), None


# --------------------------------------------------------------------------- the plan


def prepare(job: Job, *, base_env: Mapping[str, str] | None = None, cwd: str | None = None,
            policy: Policy | None = None, trace: bool = True, serve: bool = True) -> tuple[Plan, Scope]:
    """The final argv, env and fds of a job's child, and the scope that ends its tree.

    ``trace`` False spawns the tree untraced (a debugger's run: it traces the tree itself, and
    one process has one tracer); its containment, limits and sandbox are the same.  ``serve``
    False holds a sandboxed cell in bubblewrap, not in the fork server."""
    policy = policy or sandbox_policy()
    env = child_env(job, base_env=base_env, policy=policy)
    box = containment()
    scope = box.open_scope()
    if scope.cgroup is None:
        env[SCOPE_ENV] = scope.marker
    extra: dict[str, object] = {"containment": scope.mode}
    shim = spawn_shim()
    # A root harness ends a served cell by its cgroup; anyone else's by its first process.
    served_here = scope.cgroup is not None or os.geteuid() != 0
    serve = serve and trace and served_here and forkserver.serves(policy.sandbox, _probe_ops)
    argv, signal_in_exit, problem, ops = _sandboxed(job, env, policy, cwd, extra, serve=serve)
    lims = limits(job) if policy.limits else []
    if extra.get("sandbox") in SANDBOXED:
        lims.append(("fsize", policy.write_limit, policy.write_limit))
    procs = str(scope.cgroup / "cgroup.procs") if scope.cgroup is not None else None
    if shim is not None:
        served = ops if ops is not None and served_here and problem is None else None
        return _with_shim(shim, argv, env, extra, lims, procs=procs, policy=policy, scope=scope, served=served,
                          trace=trace and tracing_enabled() and problem is None, signal_in_exit=signal_in_exit,
                          problem=problem), scope
    extra["spawn"] = "preexec"
    return Plan(argv=argv, env=env, preexec_fn=_preexec(os.getpid(), procs, lims), extra=extra,
                signal_in_exit=signal_in_exit, problem=problem), scope


def _with_shim(shim: Path, argv: tuple[str, ...], env: dict[str, str], extra: dict[str, object],
               lims: list[tuple[str, int, int]], *, procs: str | None, policy: Policy, scope: Scope,
               served: list[str] | None, trace: bool, signal_in_exit: bool, problem: str | None) -> Plan:
    """The plan of a job the compiled helper spawns: built by the fork server (``served``: its
    operations), traced by the helper (``trace``), or spawned alone."""
    spec = ",".join(f"{n}={s}:{h}" for n, s, h in lims) or "-"
    if served is not None:
        extra["spawn"] = "fork-server"
        return Plan(argv=argv, env=env, extra=extra, signal_in_exit=True, trace=TraceChannel(),
                    served=forkserver.ServedCell(ops=served, uid=policy.uid, procs=procs, limits=spec,
                                                 cgroup=scope.cgroup))
    if trace:
        chan = TraceChannel()
        return Plan(argv=(str(shim), "--trace", str(chan.write_fd), str(os.getpid()), procs or "-", spec, "--",
                          *argv), env=env, pass_fds=(chan.write_fd,), extra=extra, signal_in_exit=signal_in_exit,
                    problem=problem, trace=chan)
    return Plan(argv=(str(shim), str(os.getpid()), procs or "-", spec, "--", *argv), env=env,
                extra=extra, signal_in_exit=signal_in_exit, problem=problem)


def served_without_cgroup(policy: Policy | None) -> bool:
    """Whether a non-root harness's fork server holds this policy's sandboxed cells (no cgroup:
    each cell ends with its pid namespace)."""
    policy = policy or sandbox_policy()
    return (os.geteuid() != 0 and policy.sandbox in ("auto", "on") and bubblewrap()[0] is not None
            and forkserver.serves(policy.sandbox, _probe_ops))


def _probe_ops() -> list[str]:
    return sandbox_ops(cwd="/", policy=Policy(sandbox="on"))


def _sandboxed(job: Job, env: dict[str, str], policy: Policy, cwd: str | None, extra: dict[str, object], *,
               serve: bool = False) -> tuple[tuple[str, ...], bool, str | None, list[str] | None]:
    """The job's argv inside bubblewrap where the policy asks for a sandbox and one can run
    (``env`` made the cell's, ``extra["sandbox"]`` says which), whether a signal shows in the
    exit status, why the cell cannot run as asked (None: it can), and, where ``serve`` says the
    fork server builds the sandbox, its operations (the argv is then the job's own)."""
    if policy.sandbox not in ("auto", "on"):
        return job.argv, False, None, None
    bwrap, why = bubblewrap()
    here = cwd or os.getcwd()
    # The fork server of a root harness gives each cell a uid of its own, to which what it
    # cannot enter is shown by an idmapped mount; bubblewrap runs it as nobody.
    idmap = serve and os.geteuid() == 0 and forkserver.cell_uids() is not None
    if bwrap is not None and os.geteuid() == 0 and not idmap and not _enterable(here):
        extra["sandbox"] = "bubblewrap"
        return job.argv, False, (
            f"the sandbox runs the cell as uid {policy.uid} (nobody), which may not enter its working "
            f"directory {here} (mode {os.stat(here).st_mode & 0o777:o}; the matrix file's directory unless "
            "the case names a cwd:): let others enter it (chmod o+rx), name another with cwd:, or --no-sandbox"), None
    if bwrap is not None:
        env["TMPDIR"] = "/tmp"
        env["HOME"] = "/tmp"  # the host's home is not there: a writable one of the cell's own
        extra["sandbox"] = "namespaces" if serve else "bubblewrap"
        refused = _unseen_cwd(here)
        try:
            if refused is None and serve:
                return job.argv, True, None, job_ops(job, env, here, policy, idmap=idmap)
            if refused is None:
                return tuple(bwrap_argv(bwrap, job, env, here, policy)), True, None, None
        except Refused as e:
            refused = str(e)
        return job.argv, False, refused, None
    if policy.sandbox == "on":
        extra["sandbox"] = "none"
        return job.argv, False, f"--sandbox asked for a sandbox and there is none: {why}; fix: {fix_for(why)}", None
    extra["sandbox"] = f"none: {why}"
    return job.argv, False, None, None
