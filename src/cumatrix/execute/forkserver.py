"""The sandbox's fork server: one per harness process, so that a sandboxed cell costs about a fork.

bubblewrap per cell costs an ``exec`` of bubblewrap and of ``setpriv``, a copy of the host's
mount table, a root assembled from scratch and new namespaces, 7 to 8 ms a cell before the
cell's own program starts (``benchmarks/sandbox_overhead.py``).  Where the harness runs as root
and the host gives it cgroups, the spawn helper (``csrc/spawn.c``) runs once per harness process
as a server (``cumatrix-spawn --serve``) and, per cell, forks the cell's tracer, which clones the
cell's first process into new mount, pid, IPC, UTS, network and cgroup namespaces and its own
cgroup; that process builds the cell's root from the same operations bubblewrap would be given
(:func:`cumatrix.execute.sandbox.sandbox_ops`), and forks the program as uid ``nobody`` with no
capability, no group and ``no_new_privs``.  What the cell sees and may do is what bubblewrap
gives it; what it costs is a fork, a clone and a few mounts.

Nothing of one cell is left for another in the kernel: each cell's network namespace is made
new for it, and its program is ``nobody`` inside a user namespace of its own (its user keyrings
that namespace's) with a session keyring of its own, then no keyring call at all (a seccomp
filter: a key is shown to every process of its host uid until the kernel collects it).  Under a
root harness each cell alive also has a host uid no other cell has (:func:`cell_uids`, held by the cell's tracer: see ``take_uid``
in csrc/spawn_server.c), so that nothing the kernel keeps per uid (processes under ``RLIMIT_NPROC``,
inotify instances, key quota, pipe buffers) is shared; a directory that uid may not enter is
shown to it read-only by an idmapped mount.  A non-root harness's server makes one user
namespace for the run (``--userns``), where its uid is root, and builds each cell from there as
a root server does: bubblewrap's cost per cell is gone, and its cells share that one uid.

A cell travels as one message on a Unix ``SOCK_SEQPACKET`` socket with its descriptors
(``SCM_RIGHTS``): its stdout and stderr, a status pipe, the tracer's pipe, a held cell's hold
pipe and a harness child's verdict channel.  A held cell (``hold=True``) is made ready up to
its program's exec (tracer, cgroup, namespaces, root, and the program's process as the cell's
user with its limits and filters) and its program starts at :meth:`Served.release`:
the local backend readies the next cell while one runs, so that what the sandbox costs is
paid beside a running cell, not between two.  The tracer writes ``z <wait status>`` on the status pipe when the
cell's tree has ended; a status pipe that closes without it is a lost cell, a harness error,
never an outcome.  :class:`Served` gives the local backend the part of :class:`subprocess.Popen`
it uses.

``CUMATRIX_FORK_SERVER=off`` spawns bubblewrap per cell instead (to compare, or to step around
a problem).
"""

from __future__ import annotations

import atexit
import contextlib
import grp
import os
import pwd
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cumatrix.core.options import NOBODY, uid_range
from cumatrix.core.witness import tracing_enabled
from cumatrix.execute.containment import containment, keep_out_of_sweeps
from cumatrix.execute.spawn import spawn_shim

#: The message's first field; the server refuses anything else.
MAGIC = "cumatrix-cell-2"
#: The largest message the server reads (csrc/spawn_server.c SERVE_MAX_MSG, less a byte).
MAX_MESSAGE = (1 << 20) - 1
ENV_SWITCH = "CUMATRIX_FORK_SERVER"


@dataclass(frozen=True, kw_only=True, slots=True)
class ServedCell:
    """What the server needs of a cell beyond its argv and environment."""

    ops: list[str]  # the sandbox, in bubblewrap's words (sandbox.sandbox_ops)
    uid: int  # the program's uid and gid (inside its own user namespace)
    procs: str | None  # the cell's cgroup.procs
    limits: str  # the spawn helper's LIMITS
    cgroup: Path | None  # None: no cgroup (a non-root harness), the cell is ended by its first process


class ServerGone(OSError):
    """The server cannot take the cell (it ended, or never started)."""


class TooLarge(ServerGone):
    """The cell's message is larger than the server reads (no other server would take it)."""


class ForkServer:
    """The running server of one harness process."""

    def __init__(self, helper: Path) -> None:
        how = server_mode()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(OSError):
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.sock = ours
        self.lock = threading.Lock()
        try:
            # No death signal: it ends at the socket's EOF, when this process has gone,
            # whichever thread started it (a death signal follows the thread).
            self.proc = subprocess.Popen([str(helper), "--serve", str(theirs.fileno()), "0", *how],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)
        except OSError as e:
            ours.close()
            raise ServerGone(f"the fork server cannot start ({helper}): {e}") from e
        finally:
            theirs.close()
        keep_out_of_sweeps(self.proc.pid)  # it ends its own cells; a sweep would end it

    def alive(self) -> bool:
        return self.proc.poll() is None

    def submit(self, fields: list[str], fds: list[int]) -> None:
        """Send one cell; raises :class:`ServerGone` where the server cannot take it."""
        payload = b"".join(f.encode("utf-8", "surrogateescape") + b"\0" for f in fields)
        if len(payload) > MAX_MESSAGE:
            raise TooLarge(f"the cell's command line and environment take {len(payload)} bytes, "
                           f"more than the fork server reads ({MAX_MESSAGE})")
        with self.lock:
            try:
                socket.send_fds(self.sock, [payload], fds)
            except OSError as e:
                raise ServerGone(f"the fork server is gone: {e}") from e

    def close(self) -> None:
        self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


_SERVERS: dict[int, ForkServer] = {}
_LOCK = threading.RLock()


def server(helper: Path) -> ForkServer:
    """This process's server (started on first use, again if it ended; a forked child starts its own)."""
    pid = os.getpid()
    with _LOCK:
        got = _SERVERS.get(pid)
        if got is None or not got.alive():
            for old in _SERVERS.values():  # one that ended, or a parent's inherited across a fork
                old.sock.close()
            _SERVERS.clear()
            got = _SERVERS[pid] = ForkServer(helper)
        return got


def server_mode() -> list[str]:
    """How the server is started beyond its socket: a root harness gives it the reserved range
    its cells' uids come from (``BASE:COUNT``; none where the range is not free of real users,
    and the cells are then ``nobody``, as under bubblewrap); anyone else's server makes its
    own user namespace (``--userns``)."""
    if os.geteuid() != 0:
        return ["--userns"]
    ids = cell_uids()
    return [] if ids is None else [f"{ids[0]}:{ids[1]}"]


_UIDS: dict[str, tuple[int, int] | None] = {}


def cell_uids() -> tuple[int, int] | None:
    """The range a root harness's served cells take their host uids from (:data:`CELL_UIDS`,
    or ``$CUMATRIX_SANDBOX_UIDS``), once it is checked that no user or group of this host, nor
    a subordinate id range (``/etc/subuid``, ``/etc/subgid``), lies in it; None otherwise
    (:func:`cell_uids_why` says why)."""
    with _LOCK:
        if "ids" not in _UIDS:
            ids, why = _check_uids(uid_range())
            _UIDS["ids"] = ids
            _UIDS_WHY["why"] = why
        return _UIDS["ids"]


_UIDS_WHY: dict[str, str | None] = {}


def cell_uids_why() -> str | None:
    """Why the cells' uid range is not used (None: it is, or was not looked at)."""
    return _UIDS_WHY.get("why")


def _check_uids(ids: tuple[int, int]) -> tuple[tuple[int, int] | None, str | None]:
    low, count = ids
    high = low + count - 1
    taken = [(e.pw_name, e.pw_uid) for e in pwd.getpwall() if low <= e.pw_uid <= high]
    taken += [(e.gr_name, e.gr_gid) for e in grp.getgrall() if low <= e.gr_gid <= high]
    if taken:
        return None, f"{taken[0][0]} has id {taken[0][1]}, inside the cells' range {low}-{high}"
    for path in ("/etc/subuid", "/etc/subgid"):
        why = _subids_across(path, low, high)
        if why is not None:
            return None, why
    return ids, None


def _subids_across(path: str, low: int, high: int) -> str | None:
    """Which subordinate id range of ``path`` lies across the cells' range (None: none, or no file)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            start, n = int(parts[1]), int(parts[2])
            if start <= high and low < start + n:
                return f"{path} gives {parts[0]} {start}-{start + n - 1}, across the cells' range {low}-{high}"
    return None


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in ("off", "0", "no", "false")


def serves(sandbox: str, probe_ops: Callable[[], list[str]]) -> bool:
    """Whether this process's sandboxed cells (policy ``sandbox``) go to the server: a harness
    that traces its cells (root: in their own cgroups), and the server's sandbox passed its
    check on this host."""
    shim = spawn_shim()
    if shim is None or not tracing_enabled() or sandbox == "off":
        return False
    # Root: the cells' cgroups are how the harness ends them.  Anyone else: the server makes
    # its own user namespace, and a cell is ended by its first process where it has no cgroup.
    if os.geteuid() == 0 and containment().group is None:
        return False
    return usable(shim, probe_ops)


_USABLE: dict[str, str | None] = {}
#: What the check's cell asserts from inside: the kernel's settings and the host's sockets out
#: of reach, its uid nobody's, no network but loopback.
_CHECK = ("test ! -w /proc/sys/vm/swappiness && test ! -e /run/. && test \"$(id -u)\" = "
          f"{NOBODY} && test \"$(grep -c : /proc/net/dev)\" = 1 && grep -q '^ *lo:' /proc/net/dev")


def usable(helper: Path, probe_ops: Callable[[], list[str]]) -> bool:
    """Whether the server runs sandboxed cells here: it is on, and a check cell passed (once
    per process; a kernel without mount_setattr or clone3 fails it, and bubblewrap serves)."""
    if not enabled():
        return False
    with _LOCK:
        if "why" not in _USABLE:
            _USABLE["why"] = _check(helper, probe_ops())
        return _USABLE["why"] is None


def why_not() -> str | None:
    """Why the check failed (None: it passed, or has not run)."""
    return _USABLE.get("why")


def _check(helper: Path, ops: list[str]) -> str | None:
    cell = ServedCell(ops=ops, uid=NOBODY, procs=None, limits="-", cgroup=None)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        proc = start(cell, helper, ["/bin/sh", "-c", _CHECK], {"PATH": "/usr/bin:/bin"}, devnull, [])
    except ServerGone as e:
        return str(e)
    finally:
        os.close(devnull)
    try:
        rc = proc.wait(timeout=30)
        err = proc.stderr.read(4096).decode(errors="replace").strip()
    except subprocess.TimeoutExpired:
        return "the fork server's check cell did not end in 30 s"
    finally:
        proc.stdout.close()
        proc.stderr.close()
        proc.close()
    if proc.lost or rc != 0:
        return f"the fork server's check cell failed (exit {rc}): {err.splitlines()[-1] if err else 'no message'}"
    return None


def start(cell: ServedCell, helper: Path, argv: list[str], env: dict[str, str], trace_fd: int,
          extra_fds: list[int], *, hold: bool = False) -> Served:
    """Hand a cell to this process's server; raises :class:`ServerGone` where it cannot take it
    (tried twice: a server that ended is started again).  ``hold``: the program waits for
    :meth:`Served.release`."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    st_r, st_w = os.pipe()
    hold_r, hold_w = os.pipe2(os.O_CLOEXEC) if hold else (-1, -1)
    fields = request(procs=cell.procs, limits=cell.limits, uid=cell.uid, ops=cell.ops, argv=argv, env=env,
                     targets=extra_fds, hold=hold)
    held = [hold_r] if hold else []
    try:
        _submit(helper, fields, [out_w, err_w, st_w, trace_fd, *held, *extra_fds])
    except BaseException:
        _close_open(out_r, err_r, st_r, hold_w)
        raise
    finally:
        _close_open(out_w, err_w, st_w, hold_r)
    return Served(out_r, err_r, st_r, cell.cgroup, hold=hold_w)


def _submit(helper: Path, fields: list[str], fds: list[int]) -> None:
    """Hand a request to the server, once more to a fresh one where the first has ended."""
    for attempt in (1, 2):
        try:
            server(helper).submit(fields, fds)
            return
        except ServerGone as e:
            if attempt == 2 or isinstance(e, TooLarge):
                raise
            _forget()


def _close_open(*fds: int) -> None:
    """Close each of ``fds`` that is open (-1: none)."""
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _forget() -> None:
    with _LOCK:
        for srv in _SERVERS.values():
            srv.close()
        _SERVERS.clear()


@atexit.register
def _close_all() -> None:
    """At the harness's exit: the server reads EOF and ends (it would anyway, a moment later)."""
    with _LOCK:
        for srv in _SERVERS.values():
            srv.close()
        _SERVERS.clear()


def request(*, procs: str | None, limits: str, uid: int | None, ops: list[str], argv: list[str],
            env: dict[str, str], targets: list[int], hold: bool = False) -> list[str]:
    """The fields of one cell's message (see ``serve`` in csrc/spawn_server.c)."""
    env_lines = [f"{k}={v}" for k, v in env.items()]
    return [MAGIC, procs or "-", limits, "-" if uid is None else str(uid), str(len(ops)), str(len(argv)),
            str(len(env_lines)), ",".join(map(str, targets)), "1" if hold else "0", *ops, *argv, *env_lines]


class Served:
    """A served cell, seen as the local backend sees a :class:`subprocess.Popen`: its output
    streams, ``poll``, ``wait`` and ``kill``.  ``lost`` is True where the status pipe closed
    without a status (the tracer was killed): the cell has no outcome."""

    pid = 0  # not this process's child: nothing to signal by pid (kill goes through the cgroup)

    def __init__(self, stdout: int, stderr: int, status: int, cgroup: Path | None, *, hold: int = -1) -> None:
        self.stdout: BinaryIO = os.fdopen(stdout, "rb", buffering=0)
        self.stderr: BinaryIO = os.fdopen(stderr, "rb", buffering=0)
        self._status = status
        self._hold = hold
        self._buf = b""
        self._cgroup = cgroup
        self.returncode: int | None = None
        self.lost = False
        #: Why the cell's sandbox could not be built (None: it was): a harness error, not an outcome.
        self.setup_failed: str | None = None
        self._init = -1  # a pidfd of the cell's first process (its namespace's init), where no cgroup ends it

    def release(self) -> None:
        """Start a held cell's program (its sandbox is ready, or is being made: the program
        starts once it is).  A cell whose hold pipe closes unwritten never runs its program."""
        if self._hold >= 0:
            try:
                os.write(self._hold, b"g")
            except OSError:
                pass  # its init is gone: the status pipe says what became of the cell
            finally:
                self._drop_hold()

    def _read(self, timeout: float | None) -> bool:
        """Read the status pipe until its end or ``timeout``; True once it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._status >= 0:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._status], [], [], left)
            if not ready:
                return False
            chunk = os.read(self._status, 256)
            if chunk:
                self._buf += chunk
                self._take_init()
                continue
            self._ended()
        return True

    def _ended(self) -> None:
        """The status pipe ended: the cell's exit status (or its sandbox's failure) from what it said."""
        os.close(self._status)
        self._status = -1
        if self._init >= 0:  # the cell has ended: nothing left to end by it
            os.close(self._init)
            self._init = -1
        for line in self._buf.decode(errors="replace").splitlines():
            word, _, value = line.partition("\t")
            if word == "z" and value.lstrip("-").isdigit():
                self.returncode = os.waitstatus_to_exitcode(int(value))
            elif word == "h":  # its sandbox was not built: nothing of its program ran
                self.setup_failed = value
        if self.returncode is None:
            self.lost = True
            self.returncode = -9  # never reported as the cell's: ``lost`` says it has none

    def _take_init(self) -> None:
        """A pidfd of the cell's first process, from its "p" line (written as it starts; the
        tracer, its parent, reaps it only once it ended: the pid is its until then)."""
        if self._init >= 0 or self._cgroup is not None or not self._buf.startswith(b"p\t"):
            return
        line, nl, _ = self._buf.partition(b"\n")
        if nl and line[2:].isdigit():
            with contextlib.suppress(OSError):
                self._init = os.pidfd_open(int(line[2:]))

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read(timeout):
            raise subprocess.TimeoutExpired("served cell", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """Kill the cell's tree (its cgroup); the tracer then ends and writes the status."""
        self._drop_hold()
        if self._cgroup is None:
            self._read(0)
            if self._init >= 0:  # the init of the cell's pid namespace: every process of it goes
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._init, signal.SIGKILL)
            return
        with contextlib.suppress(OSError):
            (self._cgroup / "cgroup.kill").write_text("1")

    def close(self) -> None:
        self._drop_hold()
        if self._init >= 0:
            os.close(self._init)
            self._init = -1
        if self._status >= 0:
            os.close(self._status)
            self._status = -1

    def _drop_hold(self) -> None:
        if self._hold >= 0:
            os.close(self._hold)  # a held program that was never released stays unstarted
            self._hold = -1
