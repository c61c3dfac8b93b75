"""A cell is every process it starts: its cgroup (or the subreaper's sweep) ends them all, and a
watcher per harness process ends what a dead harness left (docker containers included)."""

# Paths stay strings here on purpose (ruff's PTH rules off for this module): they are what
# bwrap's argv, /proc and the kernel take, and this runs for every cell.
# ruff: noqa: PTH123, PTH208

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cumatrix.execute.childenv import _SECRET_RE, ENV_ALLOW, SCOPE_ENV, _pattern
from cumatrix.execute.spawn import _LOCK, _PR_SET_CHILD_SUBREAPER, _prctl, spawn_shim

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
            with contextlib.suppress(FileExistsError):
                cg.mkdir()
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
    #: Held by the fork server without a cgroup: every process of the cell is in its own pid
    #: namespace, which ends with it; nothing is left to sweep.
    served: bool = False

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
            elif self.served:
                self.killed = 0
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
                with contextlib.suppress(OSError):
                    kill.write_text("1")
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
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)


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


#: Children of the harness that no sweep takes for a cell's leftovers: the fork server (a
#: non-root harness's has no cgroups), which ends its own cells' trees (their pid namespaces).
_KEPT: set[int] = set()


def keep_out_of_sweeps(pid: int) -> None:
    """Never sweep ``pid`` nor what it started (see :data:`_KEPT`)."""
    _KEPT.add(pid)


def _sweep(scope: Scope, *, sole: bool) -> int:
    """Kill what a cell left where there is no cgroup (the harness is the subreaper)."""
    me, watcher = os.getpid(), scope.owner.watcher_pid
    if sole and _only_known_children(me, {p for p in (watcher, scope.leader, *_KEPT) if p}):
        return 0
    marker = f"{SCOPE_ENV}={scope.marker}".encode()
    found: set[int] = set()
    for _ in range(5):  # a process may fork while the sweep runs: sweep until none is left
        victims = _sweep_once(scope, me, watcher, sole=sole, marker=marker)
        if not victims:
            break
        found |= victims
    return len(found - ({scope.leader} if scope.leader else set()))


def _sweep_once(scope: Scope, me: int, watcher: int | None, *, sole: bool, marker: bytes) -> set[int]:
    """One pass of :func:`_sweep`: what the cell left now, killed and reaped."""
    table = _table()
    kept = [p for p in (watcher, *_KEPT) if p and p in table]
    mine = _descendants(table, [me]) - {me} - _descendants(table, kept)
    seeds = {pid for pid in mine if _left_by(scope, table, pid, me=me, sole=sole, marker=marker)}
    victims = _descendants(table, seeds) & mine
    if victims:
        _kill_and_reap(victims, table, me)
    return victims


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
from cumatrix.execute.containment import watch_cleanup
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
        # deferred: the docker SDK costs ~80 ms and ~200 modules; only the docker backend needs it
        import docker
        import docker.errors
    except ImportError:
        return
    try:
        client = docker.from_env(timeout=60)
    except docker.errors.DockerException:
        return
    for name in names:
        with contextlib.suppress(docker.errors.DockerException):
            client.containers.get(name).remove(force=True)
    client.close()


