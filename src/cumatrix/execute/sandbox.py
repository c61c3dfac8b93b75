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
# ruff: noqa: PTH109, PTH113, PTH116

from __future__ import annotations

import functools
import os
import shutil
import stat
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
from cumatrix.execute import forkserver
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
from cumatrix.execute.viewops import _job_view, _points_and_masks, sandbox_ops
from cumatrix.execute.viewpaths import (
    HIDDEN_ALWAYS,
    PRIVATE_DIRS,
    RUN_FILES,
    SYSTEM_DIRS,
    Refused,
    _enterable,
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
    "_points_and_masks",
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
    "sandbox_ops",
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
    why = _setpriv_problem() if os.geteuid() == 0 else None
    if why is not None:
        return None, why
    return _probe_bwrap(path)


def _setpriv_problem() -> str | None:
    """Why a root harness could not drop its cells' uid with setpriv (None: it can)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "the harness runs as root and setpriv (util-linux) is missing to drop the cell's uid"
    real = os.path.realpath(setpriv)
    if any(real == d or real.startswith(d + "/") for d in SYSTEM_DIRS):
        return None
    # It runs inside the sandbox, which shows the cell the system directories only.
    return (f"the harness runs as root and its setpriv ({setpriv}) lies outside the directories the "
            f"sandbox shows a cell ({', '.join(SYSTEM_DIRS)}), so the cell's uid cannot be dropped")


def _probe_bwrap(path: str) -> tuple[str | None, str]:
    """``path`` where it sandboxes a probe here, else None and why not."""
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
    served_here = _served_here(scope)
    serve = serve and trace and served_here and forkserver.serves(policy.sandbox, _probe_ops)
    argv, signal_in_exit, problem, ops = _sandboxed(job, env, policy, cwd, extra, serve=serve)
    lims = _cell_limits(job, policy, extra)
    procs = _procs(scope)
    if shim is not None:
        served = ops if served_here and problem is None else None
        return _with_shim(shim, argv, env, extra, lims, procs=procs, policy=policy, scope=scope, served=served,
                          trace=trace and problem is None, signal_in_exit=signal_in_exit, problem=problem), scope
    extra["spawn"] = "preexec"
    return Plan(argv=argv, env=env, preexec_fn=_preexec(os.getpid(), procs, lims), extra=extra,
                signal_in_exit=signal_in_exit, problem=problem), scope


def _served_here(scope: Scope) -> bool:
    """Whether the fork server may hold this scope's cell."""
    # A root harness ends a served cell by its cgroup; anyone else's by its first process.
    return scope.cgroup is not None or os.geteuid() != 0


def _procs(scope: Scope) -> str | None:
    """The ``cgroup.procs`` file the cell's first process joins (None: no cgroup)."""
    return str(scope.cgroup / "cgroup.procs") if scope.cgroup is not None else None


def _cell_limits(job: Job, policy: Policy, extra: dict[str, object]) -> list[tuple[str, int, int]]:
    """The cell's resource limits where the policy sets them, and a sandboxed cell's file size
    limit (``policy.write_limit``) in any case."""
    lims = limits(job) if policy.limits else []
    if extra.get("sandbox") in SANDBOXED:
        lims.append(("fsize", policy.write_limit, policy.write_limit))
    return lims


def _with_shim(shim: Path, argv: tuple[str, ...], env: dict[str, str], extra: dict[str, object],
               lims: list[tuple[str, int, int]], *, procs: str | None, policy: Policy, scope: Scope,
               served: list[str] | None, trace: bool, signal_in_exit: bool, problem: str | None) -> Plan:
    """The plan of a job the compiled helper spawns: built by the fork server (``served``: its
    operations), traced by the helper (``trace``, where tracing is on), or spawned alone."""
    spec = ",".join(f"{n}={s}:{h}" for n, s, h in lims) or "-"
    if extra.get("sandbox") == "bubblewrap" and _bwrap_takes_filter():
        shim_argv: tuple[str, ...] = (str(shim), "--no-keys")  # no keyring, as in a served cell
    else:
        shim_argv = (str(shim),)
    if served is not None:
        extra["spawn"] = "fork-server"
        return Plan(argv=argv, env=env, extra=extra, signal_in_exit=True, trace=TraceChannel(),
                    served=forkserver.ServedCell(ops=served, uid=policy.uid, procs=procs, limits=spec,
                                                 cgroup=scope.cgroup))
    if trace and tracing_enabled():
        chan = TraceChannel()
        return Plan(argv=(*shim_argv, "--trace", str(chan.write_fd), str(os.getpid()), procs or "-", spec, "--",
                          *argv), env=env, pass_fds=(chan.write_fd,), extra=extra, signal_in_exit=signal_in_exit,
                    problem=problem, trace=chan)
    return Plan(argv=(*shim_argv, str(os.getpid()), procs or "-", spec, "--", *argv), env=env,
                extra=extra, signal_in_exit=signal_in_exit, problem=problem)


def _bwrap_takes_filter() -> bool:
    """Whether the cell's bubblewrap may start under the keyring filter: always for root (the
    filter needs no ``no_new_privs`` there); for anyone else only a bubblewrap that is not
    setuid (``no_new_privs``, which the filter then needs, would keep a setuid one from working)."""
    if os.geteuid() == 0:
        return True
    path = bubblewrap()[0]
    return path is not None and not _setuid(path)


@functools.lru_cache(maxsize=4)
def _setuid(path: str) -> bool:
    """Whether the program at ``path`` is setuid (looked at once per harness process, as
    :func:`bubblewrap` finds it once; unreadable: taken as setuid, so no filter)."""
    try:
        return bool(os.stat(path).st_mode & stat.S_ISUID)
    except OSError:
        return True


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
    if bwrap is None:
        return _unsandboxed(job, policy, why, extra)
    if os.geteuid() == 0 and not idmap and not _enterable(here):
        extra["sandbox"] = "bubblewrap"
        return job.argv, False, (
            f"the sandbox runs the cell as uid {policy.uid} (nobody), which may not enter its working "
            f"directory {here} (mode {os.stat(here).st_mode & 0o777:o}; the matrix file's directory unless "
            "the case names a cwd:): let others enter it (chmod o+rx), name another with cwd:, or --no-sandbox"), None
    env["TMPDIR"] = "/tmp"
    env["HOME"] = "/tmp"  # the host's home is not there: a writable one of the cell's own
    extra["sandbox"] = "namespaces" if serve else "bubblewrap"
    return _in_sandbox(bwrap, job, env, policy, here, serve=serve, idmap=idmap)


def _in_sandbox(bwrap: str, job: Job, env: dict[str, str], policy: Policy, here: str, *, serve: bool,
                idmap: bool) -> tuple[tuple[str, ...], bool, str | None, list[str] | None]:
    """:func:`_sandboxed` where bubblewrap runs: the cell's view as the fork server's operations
    (``serve``) or bubblewrap's command line, or why it is refused."""
    refused = _unseen_cwd(here)
    try:
        if refused is None and serve:
            return job.argv, True, None, job_ops(job, env, here, policy, idmap=idmap)
        if refused is None:
            return tuple(bwrap_argv(bwrap, job, env, here, policy)), True, None, None
    except Refused as e:
        refused = str(e)
    return job.argv, False, refused, None


def _unsandboxed(job: Job, policy: Policy, why: str, extra: dict[str, object]
                 ) -> tuple[tuple[str, ...], bool, str | None, list[str] | None]:
    """:func:`_sandboxed` where no bubblewrap runs: an error where the policy demands a sandbox."""
    if policy.sandbox == "on":
        extra["sandbox"] = "none"
        return job.argv, False, f"--sandbox asked for a sandbox and there is none: {why}; fix: {fix_for(why)}", None
    extra["sandbox"] = f"none: {why}"
    return job.argv, False, None, None
