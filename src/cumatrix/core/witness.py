"""What a cell's processes did, as the kernel saw it: the tracer's record, read by the harness.

The spawn helper (``csrc/spawn.c``, ``--trace FD``) traces a cell's whole process tree with
ptrace and, at each process's exit (a signal's included), before each ``execve`` and when
the cell's first process ends, reads ``/proc/PID/maps`` and writes every
mapped file to a pipe that no process of the cell holds.  This module reads that record.

Why the kernel and not the process: anything written inside the process tree (an rtld-audit
log, a verdict file, a message on stderr) can be written by the program under test.  The
tracer's pipe cannot: its write end is close-on-exec in the helper, the helper is not
dumpable (the cell's processes, though of the same user, cannot open its ``/proc/PID/fd``),
and a traced process can neither be traced by another nor detach itself.  Unsetting
``LD_AUDIT``, linking statically or exec'ing a set-uid binary (which runs without its
privilege under ptrace) changes nothing the kernel reports.

Where ptrace is refused (a container without ``CAP_SYS_PTRACE`` and an old seccomp profile,
Yama's ``ptrace_scope`` 3) the record says so (``traced: False``, the reason) and the cell
falls back to what the rtld-audit log claims, named as such in its record.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from cumatrix.core.readers import BoundedChannel, SeekableReader

#: The most a tracer may write for one cell; past it the record is marked incomplete.
MAX_TRACE_BYTES = 16 << 20

#: ``$CUMATRIX_NO_TRACE=1``: spawn cells untraced (to measure what tracing costs).
NO_TRACE_ENV = "CUMATRIX_NO_TRACE"

_PYTHON_RE = re.compile(r"^python\d*(?:\.\d+)*[a-z]*$")


def _basename(path: str) -> str:
    """The last component of a path (``os.path.basename``, without building a ``Path``)."""
    return path.rpartition("/")[2]


def tracing_enabled() -> bool:
    """Whether cells are spawned under the tracer (the default; ``$CUMATRIX_NO_TRACE=1`` turns it off)."""
    return os.environ.get(NO_TRACE_ENV, "").strip().lower() in ("", "0", "no", "off", "false")


@dataclass(frozen=True, kw_only=True, slots=True)
class TracedProcess:
    """One process of the cell: the images it exec'd, and how it ended."""

    pid: int
    images: tuple[str, ...] = ()  # every image it exec'd, in order (its last is what ran at the end)
    status: int | None = None  # its wait status (``os.waitstatus_to_exitcode`` reads it); None: not seen end
    exe: str | None = None  # its image when it ended

    @property
    def exit_code(self) -> int | None:
        """The code it exited with; None where a signal ended it or its end was not seen."""
        if self.status is None or not os.WIFEXITED(self.status):
            return None
        return os.WEXITSTATUS(self.status)

    @property
    def signal(self) -> int | None:
        if self.status is None or not os.WIFSIGNALED(self.status):
            return None
        return os.WTERMSIG(self.status)


@dataclass(frozen=True, kw_only=True, slots=True)
class TracedObject:
    """A file some process of the cell mapped, as ``/proc/PID/maps`` named it."""

    path: str  # the kernel's name for it (`` (deleted)`` kept: a runtime loaded and removed)
    device: str  # MAJOR:MINOR, hex, as the kernel prints it
    inode: int
    pids: tuple[int, ...] = ()
    #: Its DT_SONAME, read by the tracer from its bytes when it was mapped, where it had no name
    #: on disk (a memfd, a removed file); None: the harness reads the file by its path.
    soname: str | None = None
    #: (SHA-256 in hex, bytes hashed) of such a file's bytes, read by the tracer at the same
    #: moment: what it ran is on the record even where no SONAME or version says it.
    digest: tuple[str, int] | None = None

    @property
    def name(self) -> str:
        return _basename(self.path.removesuffix(" (deleted)"))


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelTrace:
    """The tracer's record of one cell."""

    traced: bool  # the tree was traced; False: ptrace was refused (``note`` says why) or no tracer ran
    #: The tracer wrote its last line: every process of the tree was followed from its first
    #: instruction (none could escape with CLONE_UNTRACED) to its end (those that outlived the
    #: first, to their kill), and nothing was cut.
    complete: bool
    note: str | None = None
    processes: tuple[TracedProcess, ...] = ()
    objects: tuple[TracedObject, ...] = ()
    notes: tuple[str, ...] = ()
    #: (path as the audit log spells it, the path it resolves to), resolved by the tracer in the
    #: cell's own file system (a container's), where the harness cannot resolve it.
    resolved: tuple[tuple[str, str], ...] = ()
    #: The tracer resolved the log's paths itself: they name files of another file system than
    #: the harness's, and are never looked up here.
    resolved_inside: bool = False
    #: Attempts to make a process no tracer hears of that the tracer stopped by killing the
    #: process (another ABI's clone; the native one is refused with EPERM by the filter).
    escapes: tuple[str, ...] = ()
    #: Processes still running when the first one ended (followed by the tracer until they
    #: ended or were killed with the cell).
    left: int = 0

    def mapped_by(self, pid: int) -> tuple[TracedObject, ...]:
        return tuple(o for o in self.objects if pid in o.pids)

    def to_json(self) -> dict[str, object]:
        """The record's ``trace``: whether the kernel was asked, and how many processes it saw."""
        out: dict[str, object] = {"traced": self.traced, "complete": self.complete,
                                  "processes": len(self.processes), "objects": len(self.objects)}
        if self.note:
            out["note"] = self.note
        if self.notes:
            out["notes"] = list(self.notes)
        return out


UNTRACED = KernelTrace(traced=False, complete=False, note="no tracer (the spawn helper could not be built)")


@dataclass(kw_only=True, slots=True)
class _Side:
    """What a record says beside processes and objects, gathered line by line."""

    resolved: dict[str, str] = field(default_factory=dict)
    sonames: dict[tuple[str, int], str] = field(default_factory=dict)
    digests: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    resolved_inside: bool = False
    left: int = 0
    escapes: list[str] = field(default_factory=list)
    #: (path, device, inode, pid) of each file seen mapped executable at its mmap ("M").
    mapped_at_mmap: list[tuple[str, str, int, int]] = field(default_factory=list)

    def take(self, tag: str, parts: list[str]) -> None:
        """r: a log's path resolved in the container; c: the log's paths were; s: a nameless
        file's SONAME; h: its bytes' SHA-256; l: the first process ended, leaving N; u: an escape,
        stopped; M: a file mapped executable at its mmap.  Lines of other tags, and lines with
        fewer fields than their tag has, are left."""
        line = _SIDE_LINES.get(tag)
        if line is not None and len(parts) >= line[0]:
            line[1](self, parts)

    def _resolved(self, parts: list[str]) -> None:
        self.resolved.setdefault(parts[1], parts[2])

    def _inside(self, _parts: list[str]) -> None:  # a line of no fields
        self.resolved_inside = True

    def _soname(self, parts: list[str]) -> None:
        self.sonames.setdefault((parts[1], int(parts[2])), parts[3])

    def _digest(self, parts: list[str]) -> None:
        self.digests.setdefault((parts[1], int(parts[2])), (parts[3], int(parts[4])))

    def _left(self, parts: list[str]) -> None:
        self.left = int(parts[2])

    def _escape(self, parts: list[str]) -> None:
        self.escapes.append(f"process {int(parts[1])} tried {parts[2]}")

    def _mapped(self, parts: list[str]) -> None:
        self.mapped_at_mmap.append((parts[4], parts[2], int(parts[3]), int(parts[1])))


#: A side line's tag -> the fields it must have at the least (the tag's included), and its reader.
_SIDE_LINES: dict[str, tuple[int, Callable[[_Side, list[str]], None]]] = {
    "r": (3, _Side._resolved), "c": (0, _Side._inside), "s": (4, _Side._soname),
    "h": (5, _Side._digest), "l": (3, _Side._left), "u": (3, _Side._escape),
    "M": (5, _Side._mapped),
}


@dataclass(kw_only=True, slots=True)
class _Tree:
    """The processes and objects a record names, and whether it is whole, line by line."""

    traced: bool = False
    complete: bool = False
    note: str | None = None
    notes: list[str] = field(default_factory=list)
    procs: dict[int, dict[str, object]] = field(default_factory=dict)
    objects: dict[tuple[str, str, int], list[int]] = field(default_factory=dict)

    def proc(self, pid: int) -> dict[str, object]:
        return self.procs.setdefault(pid, {"images": [], "status": None, "exe": None})

    def take(self, tag: str, parts: list[str]) -> bool:
        """t: traced; n: a note; e: an image a process ran; m: an object mapped; x: a process's
        exit; z: the record is whole.  False for a line of another tag (or one with fewer
        fields than its tag has)."""
        line = _TREE_LINES.get(tag)
        if line is None or len(parts) < line[0]:
            return False
        line[1](self, parts)
        return True

    def _traced(self, _parts: list[str]) -> None:  # a line of no fields
        self.traced = True

    def _note(self, parts: list[str]) -> None:
        if self.traced:
            self.notes.append(parts[1])
        else:
            self.note = parts[1]

    def _image(self, parts: list[str]) -> None:
        images = self.proc(int(parts[1]))["images"]
        assert isinstance(images, list)
        images.append(parts[2])

    def _map_line(self, parts: list[str]) -> None:
        self.mapped(parts[4], parts[2], int(parts[3]), int(parts[1]))

    def _exit(self, parts: list[str]) -> None:
        p = self.proc(int(parts[1]))
        p["status"], p["exe"] = int(parts[2]), parts[3] or None

    def _whole(self, _parts: list[str]) -> None:  # a line of no fields
        self.complete = True

    def mapped(self, path: str, dev: str, ino: int, pid: int) -> None:
        pids = self.objects.setdefault((path, dev, ino), [])
        if pid not in pids:
            pids.append(pid)


#: A tree line's tag -> the fields it must have at the least (the tag's included), and its reader.
_TREE_LINES: dict[str, tuple[int, Callable[[_Tree, list[str]], None]]] = {
    "t": (0, _Tree._traced), "n": (2, _Tree._note), "e": (3, _Tree._image),
    "m": (5, _Tree._map_line), "x": (4, _Tree._exit), "z": (0, _Tree._whole),
}


def parse_trace(raw: bytes, *, overflow: bool = False) -> KernelTrace:
    """Read the tracer's lines (see ``csrc/spawn.c``); a torn last line is dropped."""
    tree, side = _Tree(), _Side()
    for line in raw.decode(errors="replace").split("\n")[:-1]:
        parts = line.split("\t")
        try:
            if not tree.take(parts[0], parts):
                side.take(parts[0], parts)
        except ValueError:
            continue  # a line the tracer did not write this way: ignored
    # The maps' lines give the order (as before the mmap stops); what only an mmap stop saw
    # (a library unloaded before any maps were read, a memfd) follows.
    for path, dev, ino, pid in side.mapped_at_mmap:
        tree.mapped(path, dev, ino, pid)
    processes = tuple(TracedProcess(pid=pid, images=tuple(v["images"]), status=v["status"],  # type: ignore[arg-type]
                                    exe=v["exe"]) for pid, v in tree.procs.items())  # type: ignore[arg-type]
    objs = tuple(TracedObject(path=p, device=d, inode=i, pids=tuple(pids), soname=side.sonames.get((d, i)),
                              digest=side.digests.get((d, i)))
                 for (p, d, i), pids in tree.objects.items())
    notes = list(tree.notes)
    if overflow:
        notes.append(f"the tracer's record passed {MAX_TRACE_BYTES} bytes; the rest was not read")
    return KernelTrace(traced=tree.traced, complete=tree.complete and not overflow, note=tree.note,
                       processes=processes, objects=objs, notes=tuple(notes), resolved=tuple(side.resolved.items()),
                       resolved_inside=side.resolved_inside, left=side.left, escapes=tuple(side.escapes))


class TraceChannel(BoundedChannel):
    """The pipe the tracer writes to: its write end goes to the spawn helper alone."""

    limit = MAX_TRACE_BYTES

    def __init__(self) -> None:
        super().__init__(*os.pipe2(os.O_CLOEXEC))

    def result(self) -> KernelTrace:
        return parse_trace(bytes(self.buffer), overflow=self.overflow)


# --------------------------------------------------------------------------- loader outcomes

_SYMBOL_LOOKUP_RE = re.compile(r"symbol lookup error: (.+?): undefined symbol: ([A-Za-z_][A-Za-z0-9_]*)")
_IMPORT_ERROR_RE = re.compile(r"^(?:ImportError|OSError): .*undefined symbol: ([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
_TRACEBACK = "Traceback (most recent call last):"


def loader_undefined_symbol(stderr: str, trace: KernelTrace | None, *, returncode: int | None) -> tuple[str, str] | None:
    """``(symbol, why it is the loader's)`` where the dynamic loader (or Python's import of an
    extension) really reported an undefined symbol; None where only some text says so.

    Two shapes are the loader's:

    - ld.so failing a process at start or at a lazy binding: it exits 127 after printing
      ``PROG: symbol lookup error: OBJ: undefined symbol: SYM``.  With a trace, a process of
      the cell must have exited 127 with ``OBJ`` mapped (the loader leaves it mapped); without
      one, the cell's exit status must be 127.
    - Python's import (or ``ctypes``) refusing an extension: a traceback ending in
      ``ImportError``/``OSError: ... undefined symbol: SYM``, and (with a trace) a process whose
      image is a Python interpreter exited non-zero.

    A shell that prints such a line and exits 3 is ``exit:3``.
    """
    if trace is not None and trace.traced:
        return _traced_undefined_symbol(stderr, trace)
    lookup = _SYMBOL_LOOKUP_RE.search(stderr)
    if lookup and returncode == 127:
        return lookup.group(2), "exit status 127 with the dynamic loader's message (untraced)"
    imported = _IMPORT_ERROR_RE.search(stderr)
    if imported and _TRACEBACK in stderr and returncode not in (None, 0):
        return imported.group(1), "a Python traceback ending in an import error (untraced)"
    return None


def _traced_undefined_symbol(stderr: str, trace: KernelTrace) -> tuple[str, str] | None:
    """:func:`loader_undefined_symbol` where the kernel traced the cell: the message counts only
    beside the process that the loader (or Python's import) really ended."""
    ended = _loader_ended(stderr, trace)
    if ended is not None:
        return ended
    m2 = _IMPORT_ERROR_RE.search(stderr)
    if m2 and _TRACEBACK in stderr:
        for p in trace.processes:
            code = p.exit_code
            if code not in (None, 0) and p.exe and _PYTHON_RE.match(_basename(p.exe)):
                return m2.group(1), f"Python ({p.exe}, process {p.pid}) failed an import and exited {code}"
    return None


def _loader_ended(stderr: str, trace: KernelTrace) -> tuple[str, str] | None:
    """A ``symbol lookup error`` line beside a process that exited 127 with the object it names mapped."""
    for m in _SYMBOL_LOOKUP_RE.finditer(stderr):
        obj, sym = m.group(1), m.group(2)
        for p in trace.processes:
            if p.exit_code == 127 and _maps(trace, p.pid, obj):
                return sym, f"the dynamic loader ended process {p.pid} ({p.exe}) with 127, {obj} mapped"
    return None


def _maps(trace: KernelTrace, pid: int, obj: str) -> bool:
    base = _basename(obj)
    for o in trace.mapped_by(pid):
        if o.path == obj or (not obj.startswith("/") and o.name == base):
            return True
        if obj.startswith("/") and o.path.removesuffix(" (deleted)") == os.path.normpath(obj):
            return True
        if "/" in obj and o.name == base and _same(o, obj):
            return True
    return False


def _same(o: TracedObject, path: str) -> bool:
    return file_key(path) == (o.device, o.inode)


# --------------------------------------------------------------------------- reading a cell's files


class UnsafeFile(OSError):
    """A file on a cell's side that is not a plain file of ours (a FIFO, a link, a device), or
    one that could not be read within its bounds."""


#: How long the harness spends reading one file a cell names before it gives up on it.
CELL_READ_SECONDS = 30.0
#: The most the harness reads of one file a cell names (an ELF header reader reads a little of it).
CELL_READ_LIMIT = 8 << 30

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)


class _Bounded(SeekableReader):
    """A regular file's descriptor read with a byte bound and a deadline (checked at each read)."""

    def __init__(self, fd: int, name: str, *, limit: int, deadline: float) -> None:
        super().__init__()
        self._fd, self.name, self._left, self._deadline = fd, name, limit, deadline

    def fileno(self) -> int:
        return self._fd

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return os.lseek(self._fd, offset, whence)

    def tell(self) -> int:
        return os.lseek(self._fd, 0, os.SEEK_CUR)

    def readinto(self, buffer: Any) -> int:
        if time.monotonic() > self._deadline:
            raise UnsafeFile(f"{self.name}: not read within {CELL_READ_SECONDS:g} s")
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._left)
        if want <= 0 < len(view):
            raise UnsafeFile(f"{self.name}: larger than the harness reads of a cell's file")
        n = os.readv(self._fd, [view[:want]])
        self._left -= n
        return n

    def close(self) -> None:
        if not self.closed and self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        super().close()


def open_cell_file(path: str | os.PathLike[str], *, links: bool = False, limit: int = CELL_READ_LIMIT,
                   seconds: float = CELL_READ_SECONDS) -> io.BufferedReader:
    """Open, for reading, a file a cell names or could have replaced (a path the kernel said was
    mapped, an audit log's requester, anything under the cell's directories, another host's
    results): never blocking on a FIFO, never opening a device, never following a link the
    cell put there meanwhile; a regular file only (``fstat``), read with a byte bound and a
    deadline.

    ``links``: the path may name a file through links (the loader's ``libcudart.so.12``): they
    are resolved first without opening anything, and the file they resolve to is opened
    without following one.  ``FileNotFoundError`` where nothing is there; :class:`UnsafeFile`
    (its text says ``not a regular file``) for anything but a regular file.
    """
    name = os.fspath(path)
    target = os.path.realpath(name) if links else name
    # Checked before the open too: opening a device or a FIFO is what must not happen (a tape
    # rewinds, a FIFO's open waits for a writer); the fstat after it closes the race.
    mode = os.lstat(target).st_mode
    if stat.S_ISLNK(mode):
        raise OSError(errno.ELOOP, f"{name}: a symbolic link, not followed")
    _regular(name, mode)
    fd = os.open(target, _OPEN_FLAGS)
    try:
        _regular(name, os.fstat(fd).st_mode)
        raw = _Bounded(fd, name, limit=limit, deadline=time.monotonic() + seconds)
    except BaseException:
        os.close(fd)
        raise
    return io.BufferedReader(raw, buffer_size=1 << 16)


def _regular(name: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise UnsafeFile(f"{name}: not a regular file ({stat.filemode(mode)})")


def read_cell_file(path: Path | str, *, limit: int = 64 << 20, links: bool = False,
                   seconds: float = CELL_READ_SECONDS) -> bytes:
    """Read a file a cell could have replaced (:func:`open_cell_file`): at most ``limit`` bytes.

    ``FileNotFoundError`` where it does not exist; :class:`UnsafeFile` where it is not a
    regular file or was not read in ``seconds``.
    """
    chunks = []
    left = limit
    with open_cell_file(path, links=links, limit=limit, seconds=seconds) as f:
        while left > 0:
            chunk = f.read1(min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    return b"".join(chunks)


def cell_file_sha256(path: str) -> str:
    """The sha256 of a file a cell names (:func:`open_cell_file`, links resolved), hashed once
    per file version."""
    real = os.path.realpath(path)
    st = os.lstat(real)
    _regular(path, st.st_mode)
    return _cell_sha256(real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=8192)
def _cell_sha256(path: str, dev: int, ino: int, size: int, mtime_ns: int) -> str:  # noqa: ARG001
    # (dev, ino, size, mtime_ns) are the cache key only: a file version is hashed once.
    h = hashlib.sha256()
    with open_cell_file(path) as f:
        while chunk := f.read1(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- content keys


@lru_cache(maxsize=8192)
def _sha256_by_identity(path: str, dev: int, ino: int, size: int, mtime_ns: int) -> str:  # noqa: ARG001
    # (dev, ino, size, mtime_ns) are the cache key only: a file version is hashed once.
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes, hashed once per file version (device, inode, size, mtime)."""
    st = Path(path).stat()
    return _sha256_by_identity(os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, kw_only=True, slots=True)
class Seen:
    """What the kernel backs of an in-process claim list: the paths kept, and those refused."""

    kept: tuple[str, ...] = ()
    unbacked: tuple[str, ...] = field(default_factory=tuple)


def claim_key(path: str, trace: KernelTrace, index: ClaimIndex | None = None) -> tuple[str, int] | None:
    """(device, inode) of the object the kernel saw that a path an in-process log claims names;
    None where it names none.

    The same path names it; so does the same file (links followed).  Where the tracer resolved
    the log's paths in the cell's own file system (a container's), its resolution is the only
    one used: the path names nothing on the harness's side, or something else.
    """
    ix = index if index is not None else ClaimIndex.of(trace)
    plain = os.path.normpath(path)
    if plain in ix.by_path:
        return ix.by_path[plain]
    if trace.resolved_inside:
        real = ix.resolved.get(path)
        return ix.by_path.get(real) if real is not None else None
    key = file_key(path)
    return key if key is not None and key in ix.files else None


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimIndex:
    """A trace's objects by path and by file, and the tracer's resolutions: built once per cell
    and shared by every claim of its log."""

    by_path: dict[str, tuple[str, int]]
    files: frozenset[tuple[str, int]]
    resolved: dict[str, str]

    @classmethod
    def of(cls, trace: KernelTrace) -> ClaimIndex:
        by_path = {o.path.removesuffix(" (deleted)"): (o.device, o.inode) for o in trace.objects}
        return cls(by_path=by_path, files=frozenset(by_path.values()), resolved=dict(trace.resolved))


def back_claims(claimed: Iterable[str], trace: KernelTrace) -> Seen:
    """Split paths an in-process log claims were mapped into those the kernel saw
    (:func:`claim_key`) and the rest."""
    kept: list[str] = []
    unbacked: list[str] = []
    index = ClaimIndex.of(trace)
    for path in dict.fromkeys(claimed):
        if "/" not in path:
            continue  # the vDSO
        (kept if claim_key(path, trace, index) is not None else unbacked).append(path)
    return Seen(kept=tuple(kept), unbacked=tuple(unbacked))


def file_key(path: str) -> tuple[str, int] | None:
    """(MAJOR:MINOR in the kernel's hex, inode) of the file ``path`` names, links followed."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}", st.st_ino
