"""The results store: ``results.jsonl`` in the ``--out`` directory, one record a line.

One run at a time.  :meth:`Store.open` takes an exclusive ``flock`` on ``.cumatrix.lock``
in the directory for the whole run (the kernel drops it when the process dies, so a
killed run leaves no stale lock); a second run fails with :class:`OutDirBusy` (exit 2)
naming the holder's pid and command line.

Durability.  Each record is one ``write()`` of a whole line to a file opened with
``O_APPEND``, so a killed harness (SIGKILL included) loses nothing it finished: the
bytes are in the kernel once ``append`` returns.  ``fdatasync`` runs once per
:data:`SYNC_EVERY` records, at most :data:`SYNC_INTERVAL` seconds after an unsynced
record (a timer thread), and at :meth:`Store.close`; a power cut or kernel crash can
therefore lose the records of the last second of the run, never a record written
before the last sync.  A line cut mid-write (a killed writer) is ignored on reading.

Resuming.  :func:`cell_digest` names everything a cell's result depends on: its
definition, the runtime, driver and headers it uses, the expectations that select it,
and the harness version.  :meth:`Store.resume` keeps a finished record only where the
digest is unchanged, drops foreign lines (another matrix's cells, unknown ids,
unreadable text) with a warning naming their line numbers, rewrites the file
atomically (the previous one kept as ``results.jsonl.prev``), and says which cells
must run again and whether the reports must be rewritten.

Environment problems (an ``--out`` that is a file, unwritable, or on a full
filesystem) raise :class:`EnvironmentProblem` (exit 3) before any cell runs.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import shlex
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from cumatrix.core.errors import ConfigError, EnvironmentProblem, OutDirBusy
from cumatrix.core.private import replace_new, write_new
from cumatrix.core.witness import UnsafeFile, read_cell_file
from cumatrix.results import recordkey
from cumatrix.results.digests import LazyDigests, cell_digest, cell_digests, dumps, wheel_sha256

JSONL = "results.jsonl"
PREVIOUS = "results.jsonl.prev"
LOCK = ".cumatrix.lock"
#: The report files a run writes; removed when a fresh run starts so none outlives its data.
REPORTS = ("results.json", "junit.xml", "summary.md", "index.html")
SYNC_EVERY = 64
SYNC_INTERVAL = 1.0
#: Free space below which ``--out`` counts as full before the run starts.
MIN_FREE_BYTES = 1 << 20


# Re-exported: the JSON encoding and the digests of a cell's inputs live in results.digests.
__all__ = ["LazyDigests", "cell_digest", "cell_digests", "dumps", "wheel_sha256"]


# --------------------------------------------------------------------------- environment


def _environment(path: Path, e: OSError, doing: str) -> EnvironmentProblem:
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        why = "the filesystem is full (or over quota)"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        why = "permission denied (or a read-only filesystem)"
    elif e.errno == errno.ELOOP:
        why = "it is a symbolic link, which cumatrix never writes through"
    elif isinstance(e, FileExistsError | NotADirectoryError):
        why = "it (or a parent) is a file, not a directory"
    else:
        why = e.strerror or str(e)
    return EnvironmentProblem(f"{path}: cannot {doing}: {why}; choose another --out or fix the directory")


def prepare_out(out_dir: Path) -> Path:
    """Create ``out_dir`` and check it is a writable directory with space; :class:`EnvironmentProblem` if not."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _environment(out, e, "create the output directory") from None
    if not out.is_dir():
        raise EnvironmentProblem(f"{out}: --out is a file, not a directory; choose another --out")
    if not os.access(out, os.W_OK | os.X_OK):
        raise EnvironmentProblem(f"{out}: cannot write the output directory: permission denied; choose another --out")
    try:
        free = shutil.disk_usage(out).free
    except OSError as e:
        raise _environment(out, e, "read the output directory") from None
    if free < MIN_FREE_BYTES:
        raise EnvironmentProblem(f"{out}: the filesystem is full ({free // 1024} KiB free); "
                                 "free some space or choose another --out")
    return out


# --------------------------------------------------------------------------- resume


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumePlan:
    """What :meth:`Store.resume` decided."""

    reuse: frozenset[str]  #: ids whose stored record stands (inputs unchanged)
    rerun: tuple[str, ...]  #: ids of the current cells to run, in the given order
    changed: tuple[str, ...]  #: ids with a record whose inputs changed (a subset of rerun)
    ignored_lines: tuple[int, ...]  #: line numbers of foreign or unreadable lines dropped
    warnings: tuple[str, ...]  #: one line each, for the terminal
    reports_stale: bool  #: the reports on disk do not show the stored results: rewrite them


@dataclass(slots=True)
class _Group:
    header: dict[str, Any] | None
    cells: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    other: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    end: dict[str, Any] | None = None


def _first_five(ids: Sequence[str]) -> str:
    return ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def _lines_text(numbers: Sequence[int]) -> str:
    shown = ", ".join(map(str, numbers[:10]))
    return shown + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")


class _Reader:
    """Sorts the lines of a results file into runs, this matrix's cells, and foreign lines."""

    def __init__(self, digests: Mapping[str, str]) -> None:
        self.digests = digests
        self.groups: list[_Group] = [_Group(header=None)]
        self.latest: dict[str, tuple[int, dict[str, Any]]] = {}
        self.foreign: list[int] = []
        self.cut: list[int] = []
        self.unsigned: list[str] = []  # records of unchanged inputs without a valid signature

    def read(self, raw: bytes) -> None:
        numbered = [(i + 1, ln) for i, ln in enumerate(raw.split(b"\n")) if ln.strip()]
        for pos, (lineno, line) in enumerate(numbered):
            rec = _record(line)
            if rec is None:
                nxt = _record(numbered[pos + 1][1]) if pos + 1 < len(numbered) else None
                last_of_run = (nxt is None and pos + 1 == len(numbered)) or (nxt or {}).get("type") == "run"
                (self.cut if last_of_run else self.foreign).append(lineno)
            else:
                self.place(lineno, rec)

    def place(self, lineno: int, rec: dict[str, Any]) -> None:
        kind = rec.get("type")
        group = self.groups[-1]
        if kind == "run":
            self.groups.append(_Group(header=rec))
        elif kind == "cell" and isinstance(rec.get("id"), str) and rec["id"] in self.digests:
            self.latest[rec["id"]] = (len(self.groups) - 1, rec)
        elif kind == "end" and group.header is not None:
            group.end = rec
        elif kind not in ("cell", "end") and group.header is not None:
            group.other.append(rec)
        else:
            self.foreign.append(lineno)

    def reusable(self) -> set[str]:
        """Records whose inputs are unchanged and that this harness wrote (signed with the user's key)."""
        same = {cid for cid, (_, rec) in self.latest.items() if rec.get("digest") == self.digests[cid]}
        self.unsigned = sorted(cid for cid in same if not recordkey.signed(self.latest[cid][1]))
        return same - set(self.unsigned)

    def seals(self, reuse: set[str]) -> dict[str, str]:
        """``{cell id: seal}`` of the records kept."""
        return {cid: str(self.latest[cid][1][recordkey.FIELD]) for cid in reuse}

    def changed(self, reuse: set[str]) -> tuple[str, ...]:
        """The cells with a record that is not kept, though signed: their inputs changed."""
        return tuple(cid for cid in self.latest if cid not in reuse and cid not in self.unsigned)

    def compacted(self, reuse: set[str]) -> list[dict[str, Any]]:
        for cid, (g, rec) in self.latest.items():
            if cid in reuse:
                self.groups[g].cells.append(rec)
        out: list[dict[str, Any]] = []
        for group in self.groups:
            if group.header is None or not group.cells:
                continue
            ids = [c["id"] for c in group.cells]
            out.append({**group.header, "cells": ids, "cells_total": len(ids)})
            out += group.cells + group.other
            if group.end is not None:
                out.append(group.end)
        return out


def reusable_ids(out_dir: Path, digests: Mapping[str, str]) -> frozenset[str]:
    """The ids :meth:`Store.resume` keeps, read without locking or rewriting anything.

    For processes that only select cells (pytest-xdist workers): the answer is the same
    before and after the run's writer compacts the file.
    """
    path = Path(out_dir) / JSONL
    reader = _Reader(digests)
    raw = read_results_bytes(path)
    if raw is None:
        return frozenset()
    reader.read(raw)
    return frozenset(reader.reusable())


def read_results_bytes(path: Path) -> bytes | None:
    """The bytes of a results file, or None where there is none; a FIFO, a device or a link
    there is refused (exit 2) instead of blocking or following it."""
    try:
        return read_cell_file(path, limit=1 << 40)
    except FileNotFoundError:
        return None
    except UnsafeFile as e:
        raise ConfigError(f"{path}: not a regular file: refusing to read it as results ({e})") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ConfigError(f"{path}: a symbolic link: refusing to read it as results") from None
        raise _environment(path, e, "read the results file") from None


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


# --------------------------------------------------------------------------- the store


def _holder_text() -> str:
    argv = getattr(sys, "orig_argv", sys.argv)
    return dumps({"pid": os.getpid(), "argv": " ".join(shlex.quote(a) for a in argv),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


#: Writers this process holds, by directory: a second :meth:`Store.open` of one directory in
#: the same process (the CLI, then the pytest plugin it runs in-process) shares the first.
_HELD: dict[Path, Store] = {}


#: The runs' output directories this user's harness wrote, one absolute path a line, newest
#: last, beside the signing key (``$XDG_STATE_HOME/cumatrix/outs``): the sandbox masks each
#: from every cell (:func:`cumatrix.execute.sandbox.kept_paths` reads it), wherever it lies,
#: a project's ``out/`` of last week included.
OUTS = "outs"
#: How many it keeps (the oldest, and those gone, drop out).
OUTS_KEPT = 64


def remember_out(out_dir: Path) -> None:
    """Add ``out_dir`` to :data:`OUTS` (once; the list rewritten, newest last, when it is not its
    last line).  Best effort: a state directory that cannot be written costs only the mask."""
    path = recordkey.key_path().parent / OUTS
    entry = str(Path(out_dir).absolute())
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    if lines and lines[-1] == entry:
        return
    kept = [ln for ln in lines if ln != entry and ln.startswith("/") and os.path.lexists(ln)][-(OUTS_KEPT - 1):]
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_new(path, "".join(f"{ln}\n" for ln in [*kept, entry]), replace=True, mode=0o600)
    except OSError:
        return


class Store:
    """``results.jsonl`` of one ``--out`` directory.

    ``Store(out)`` reads and appends without a lock (reports, merge, older callers);
    :meth:`open` is the run's writer: lock held, file kept open, syncs grouped.
    """

    def __init__(self, out_dir: Path) -> None:
        self.dir = prepare_out(Path(out_dir))
        self.path = self.dir / JSONL
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._mutex = threading.Lock()
        self._unsynced = 0
        self._timer: threading.Timer | None = None
        self._users = 0
        #: cell id -> signature of the latest record of it this writer holds (appended, or kept
        #: by :meth:`resume`): what the run reads its results back against (``records.Seal``).
        self.sealed: dict[str, str] = {}

    @classmethod
    def open(cls, out_dir: Path, *, fresh: bool, holder: str | None = None) -> Store:
        """The writer of a run: lock ``out_dir`` for this process, then open ``results.jsonl``.

        ``fresh``: start empty (a new run) and remove the previous run's reports, so none
        outlives its data; otherwise keep the file for :meth:`resume`.  Raises
        :class:`OutDirBusy` (exit 2) if another run holds the directory and
        :class:`EnvironmentProblem` (exit 3) if it cannot be written.  A second ``open`` of
        the same directory in this process returns the writer it holds (``fresh`` ignored);
        the lock goes when every opener has closed.
        """
        held = _HELD.get(Path(out_dir).resolve())
        if held is not None:  # this process is the holder already: share its writer
            held._users += 1
            return held
        store = cls(out_dir)
        store._lock(holder or _holder_text())
        store._users = 1
        remember_out(store.dir)
        _HELD[store.dir.resolve()] = store
        try:
            if fresh:
                for name in (JSONL, *REPORTS):
                    (store.dir / name).unlink(missing_ok=True)
            store._open_file()
        except OSError as e:
            store.close()
            raise _environment(store.dir, e, "write the output directory") from None
        except BaseException:
            store.close()
            raise
        return store

    def _lock(self, holder: str) -> None:
        path = self.dir / LOCK
        try:
            # Never through a link: a planted `.cumatrix.lock -> ~/file` would be truncated.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise _environment(path, e, "create the lock file") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = _read_holder(fd)
            os.close(fd)
            raise OutDirBusy(f"{self.dir}: another cumatrix run is writing here (pid {info.get('pid', '?')}: "
                             f"{info.get('argv', 'command line unknown')}); wait for it to finish, "
                             "or give this run another --out") from None
        self._lock_fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (holder + "\n").encode(), 0)
        except OSError as e:
            self.close()
            raise _environment(path, e, "write the lock file") from None

    def _open_file(self) -> None:
        # Never blocking on a FIFO nor writing through a link someone put there.
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                         | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.ELOOP):  # a FIFO without a reader; a link
                raise ConfigError(f"{self.path}: not a regular file: refusing to write results to it") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise ConfigError(f"{self.path}: not a regular file: refusing to write results to it")
        os.set_blocking(fd, True)
        size = st.st_size
        if size:
            with self.path.open("rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":  # a writer killed mid-line: start on a fresh line
                    os.write(fd, b"\n")
        self._fd = fd

    # -- resume --------------------------------------------------------------------

    def resume(self, digests: Mapping[str, str]) -> ResumePlan:
        """Keep the records whose cell inputs are unchanged; drop the rest; say what to run.

        ``digests``: :func:`cell_digests` of the cells this run selects.  The file is
        rewritten atomically (the previous one kept as ``results.jsonl.prev``) when any
        line is dropped.  Call it on a store from :meth:`open` (``fresh=False``), before
        appending the new run's header.
        """
        raw = read_results_bytes(self.path) or b""
        reader = _Reader(digests)
        reader.read(raw)
        reuse = reader.reusable()
        self.sealed.update(reader.seals(reuse))
        changed = reader.changed(reuse)
        kept = reader.compacted(reuse)
        text = "".join(dumps(r) + "\n" for r in kept).encode()
        warnings = self._resume_warnings(reader.foreign, changed, reader.unsigned)
        rewritten = text != raw
        if rewritten:
            self._replace(text, keep_previous=bool(reader.foreign or changed))
        rerun = tuple(cid for cid in digests if cid not in reuse)
        return ResumePlan(reuse=frozenset(reuse), rerun=rerun, changed=changed,
                          ignored_lines=tuple(reader.foreign), warnings=tuple(warnings),
                          reports_stale=rewritten or bool(rerun) or not self._reports_fresh())

    def _resume_warnings(self, foreign: Sequence[int], changed: Sequence[str], unsigned: Sequence[str]) -> list[str]:
        """What :meth:`resume` tells the user: lines it ignored, cells it runs again and why."""
        warnings = []
        if foreign:
            word = "line" if len(foreign) == 1 else "lines"
            warnings.append(f"{self.path}: {word} {_lines_text(foreign)}: not records of this matrix's cells "
                            f"(another matrix, unknown cell ids, or unreadable text); ignored, previous file kept "
                            f"as {PREVIOUS}")
        if changed:
            warnings.append(f"{len(changed)} finished cell(s) changed since they ran (definition, runtime, driver, "
                            f"headers, expectations or harness version); running them again: {_first_five(changed)}")
        if unsigned:
            warnings.append(f"{len(unsigned)} finished cell record(s) carry no valid signature of this harness "
                            f"(edited by hand, or written by another user or machine); running them again: "
                            f"{_first_five(unsigned)}")
        return warnings

    def _reports_fresh(self) -> bool:
        try:
            data = self.path.stat().st_mtime_ns
            return all((self.dir / r).stat().st_mtime_ns >= data for r in REPORTS)
        except OSError:
            return False

    def _replace(self, text: bytes, *, keep_previous: bool) -> None:
        tmp = self.dir / f".{JSONL}.{os.getpid()}.tmp"
        try:
            with os.fdopen(replace_new(tmp), "wb") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            if keep_previous and self.path.exists():
                (self.dir / PREVIOUS).unlink(missing_ok=True)
                os.link(self.path, self.dir / PREVIOUS)
            Path(tmp).replace(self.path)
            _sync_dir(self.dir)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise _environment(self.path, e, "rewrite the results file") from None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._open_file()

    # -- writing -------------------------------------------------------------------

    def append(self, record: Mapping[str, Any], *, digest: str | None = None) -> None:
        """Write one record (one ``write()``); ``digest``: the cell's :func:`cell_digest`.

        Raises :class:`EnvironmentProblem` when the filesystem refuses the write.
        """
        if digest is not None:
            record = recordkey.sign({**record, "digest": digest})
        line = (dumps(record) + "\n").encode()
        with self._mutex:
            if digest is not None and record.get("type") == "cell":
                self.sealed[str(record["id"])] = str(record[recordkey.FIELD])
            if self._lock_fd is None:  # not the run's writer: open, write, close
                self._write_once(line)
                return
            try:
                if self._fd is None:
                    self._open_file()
                assert self._fd is not None  # opened just above
                _write_all(self._fd, line)
            except OSError as e:
                raise _environment(self.path, e, "write results") from None
            self._unsynced += 1
            if self._unsynced >= SYNC_EVERY:
                self._sync_locked()
            elif self._timer is None:
                self._timer = threading.Timer(SYNC_INTERVAL, self.sync)
                self._timer.daemon = True
                self._timer.start()

    def _write_once(self, line: bytes) -> None:
        try:
            self._open_file()
            assert self._fd is not None  # opened just above
            try:
                _write_all(self._fd, line)
            finally:
                os.close(self._fd)
                self._fd = None
        except OSError as e:
            raise _environment(self.path, e, "write results") from None

    def sync(self) -> None:
        """Make every appended record durable now."""
        with self._mutex:
            self._sync_locked()

    def _sync_locked(self) -> None:
        self._timer, timer = None, self._timer
        if timer is not None:
            timer.cancel()
        if self._fd is not None and self._unsynced:
            try:
                os.fdatasync(self._fd)
            except OSError as e:
                raise _environment(self.path, e, "write results") from None
            self._unsynced = 0

    def close(self) -> None:
        """Sync, close the file, and release the ``--out`` lock (when the last user closes)."""
        if self._users > 1:
            self._users -= 1
            self.sync()
            return
        self._users = 0
        if _HELD.get(self.dir.resolve()) is self:
            del _HELD[self.dir.resolve()]
        try:
            if self._fd is not None:
                self.sync()
                os.close(self._fd)
                self._fd = None
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # closing the descriptor drops the flock
                self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------

    def records(self) -> Iterator[dict[str, Any]]:
        yield from read_records(self.path)

    def finished_ids(self) -> set[str]:
        return {str(r["id"]) for r in self.records() if r.get("type") == "cell"}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # a regular file takes a line in one write; a short write finishes it
        view = view[os.write(fd, view):]


def _read_holder(fd: int) -> dict[str, Any]:
    """The lock holder's pid and command line (it writes them right after locking)."""
    for _ in range(20):
        try:
            raw = os.pread(fd, 4096, 0)
        except OSError:
            return {}
        rec = _record(raw.strip())
        if rec is not None:
            return rec
        time.sleep(0.025)
    return {}


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open("rb") as f:
        for line in f:
            raw = line.strip()
            if not raw:
                continue
            rec = _record(raw)
            if rec is not None:  # None: a line cut mid-write
                yield rec
