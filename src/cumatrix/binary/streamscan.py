"""One large deflated member inflated by a second process while this one scans it for names.

A single deflate stream cannot be inflated on two cores, and ISA-L holds the GIL while it
inflates, so a thread would not overlap it with the scans: a forked child inflates the member
into an anonymous file (:func:`cumatrix.binary.wheelmember.spool_file`) and reports how far it got on a
pipe, while this process runs the name scans (:class:`cumatrix.binary.elf.NameScan`) over
every byte written so far.  The scans do not know the sections yet (the section header table
is at the end of the file), so each records the names it finds with their offsets, and
:meth:`StreamedNames.resolve` keeps those inside the file's loaded data sections once the
table is known: the same names :func:`cumatrix.binary.elf.scan_names` finds section by
section, without reading the data a second time.

Why they are the same: a name counts inside a section when its pattern matches there and the
byte before it (a NUL at the section's start) may stand before a name.  A match that the
whole-file scan skips because an earlier match covers its start has an identifier character
before it (every byte of a ``cu``-prefixed name is one, and a soname holds no second ``lib``),
so it counts nowhere except at a section's very start, which is matched apart, anchored.  A
match counts only when it ends (its NUL included) inside the section.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import struct
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from cumatrix.binary.elf import DEVICE_SECTIONS, NameScan, is_data_section, scan_names
from cumatrix.binary.wheelmember import spool_file

try:
    from isal import isal_zlib as _fast_zlib
except ImportError:  # pragma: no cover - a declared dependency; zlib still works
    _fast_zlib = zlib  # type: ignore[misc]

__all__ = ["StreamUnavailable", "StreamedNames", "stream_member"]

_CHUNK = 4 << 20  # compressed bytes inflated at a time
_WINDOW = 32 << 20  # bytes of the spool file mapped and scanned at a time
_PROGRESS = struct.Struct("<q")
#: Names recorded before the scan gives up and the sections are scanned after inflation: a
#: bound on the memory a crafted member (a file of nothing but short names) can take.
MAX_RECORDS = 1 << 20


class StreamUnavailable(OSError):
    """No second process could be started: read the member the plain way instead."""


@dataclass(slots=True)
class StreamedNames:
    """What the scans found in a whole member: per scan, ``(start, end, name)`` of each match
    whose preceding byte may stand before a name (``end`` is past its NUL)."""

    scans: tuple[NameScan, ...]
    found: list[set[tuple[int, int, str]]] = field(default_factory=list)
    complete: bool = True  #: False when MAX_RECORDS was reached (then resolve rescans)

    def resolve(self, elf: Any) -> list[set[str]]:
        """The names each scan finds in ``elf``'s loaded data sections (``elf`` reads the
        member this scanned): as :func:`cumatrix.binary.elf.scan_names` finds them."""
        if not self.complete or not elf.num_sections():
            # (a file without section headers: its data is told by its segments)
            return scan_names(elf, self.scans)
        out: list[set[str]] = [set() for _ in self.scans]
        stream = elf.stream
        for start, end in _data_sections(elf):
            for scan, found, names in zip(self.scans, self.found, out, strict=True):
                names.update(t for s, e, t in found if start < s and e <= end)
                _anchored(stream, start, end, scan, names)
        return out


def _data_sections(elf: Any) -> Iterator[tuple[int, int]]:
    """``(start, end)`` in the file of each section of ``elf`` whose names are scanned (data,
    not device code: :func:`cumatrix.binary.elf.scan_names`)."""
    for name, header in elf.named_headers():
        if is_data_section(header, False) and name not in DEVICE_SECTIONS:
            yield header.sh_offset, header.sh_offset + header.sh_size


def _anchored(stream: IO[bytes], start: int, end: int, scan: NameScan, names: set[str]) -> None:
    """A name at the very start of a section (a NUL counts as the byte before it)."""
    if not scan.before[0] or start >= end:
        return
    stream.seek(start)
    head = stream.read(min(end - start, scan.longest))
    for pattern in scan.patterns:
        m = pattern.match(head)
        if m:
            names.add(m.group()[:-1].decode("ascii"))


def _child(archive: Path, data_start: int, compressed: int, size: int, fd: int,
           report: int) -> None:
    """Inflate the member into ``fd``, writing the count of bytes written to ``report``
    after each step; -1 and the pickled exception when it fails."""
    try:
        d = _fast_zlib.decompressobj(-zlib.MAX_WBITS)
        written = 0
        with archive.open("rb") as raw:
            raw.seek(data_start)
            left = compressed
            while left > 0:
                chunk = raw.read(min(_CHUNK, left))
                if not chunk:
                    break
                left -= len(chunk)
                written = _put(fd, d.decompress(chunk), written, size)
                os.write(report, _PROGRESS.pack(written))
            written = _put(fd, d.flush(), written, size)
        if written != size:
            raise zipfile.BadZipFile(f"deflated member holds {written} bytes, not the {size} "
                                     "its entry declares")
        os.write(report, _PROGRESS.pack(written))
    except BaseException as e:  # noqa: BLE001 - handed to the parent, which raises it
        try:
            blob = pickle.dumps(e)
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            blob = pickle.dumps(zipfile.BadZipFile(f"{type(e).__name__}: {e}"))
        os.write(report, _PROGRESS.pack(-1) + blob)


def _put(fd: int, data: bytes, written: int, size: int) -> int:
    if written + len(data) > size:
        raise zipfile.BadZipFile("deflated member is longer than its declared size")
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, written)
        written += n
        view = view[n:]
    return written


class _Scanner:
    """Scans the bytes of the spool file as they are written, in order, through windows of
    it mapped read-only (no copy; a window's pages leave this process's memory when it is
    unmapped)."""

    def __init__(self, fd: int, scans: tuple[NameScan, ...]) -> None:
        self.fd = fd
        self.scans = scans
        self.keep = max(s.longest for s in scans) + 1
        self.done = 0  # bytes scanned
        self.result = StreamedNames(scans=scans, found=[set() for _ in scans])
        self.count = 0

    def upto(self, avail: int) -> None:
        while self.done < avail and self.result.complete:
            end = min(avail, self.done + _WINDOW)
            # The window starts a page-aligned context before the new bytes, so a name cut
            # by the last window's end is seen whole here; names seen twice collapse.
            off = max(0, self.done - self.keep) // mmap.ALLOCATIONGRANULARITY \
                * mmap.ALLOCATIONGRANULARITY
            with mmap.mmap(self.fd, end - off, offset=off, access=mmap.ACCESS_READ) as view:
                self._scan(view, off, max(0, self.done - self.keep + 1) - off)
            self.done = end
        self.done = max(self.done, avail)

    def _scan(self, view: mmap.mmap, base: int, pos: int) -> None:
        for scan, found in zip(self.scans, self.result.found, strict=True):
            before = scan.before
            for pattern in scan.patterns:
                for m in pattern.finditer(view, pos):
                    s = m.start()
                    # The byte before the file's first one counts as a NUL.
                    if before[view[s - 1] if s + base > 0 else 0]:
                        found.add((base + s, base + m.end(), m.group()[:-1].decode("ascii")))
                        self.count += 1
        if self.count > MAX_RECORDS:
            self.result.complete = False
            self.result.found = [set() for _ in self.scans]


def stream_member(archive: Path, data_start: int, compressed: int, size: int,
                  scans: Sequence[NameScan]) -> tuple[IO[bytes], StreamedNames]:
    """Inflate the deflated member whose data starts at ``data_start`` of ``archive`` into an
    anonymous file (returned at offset 0; the caller closes it) while ``scans`` run over it.

    Raises what inflating raises (:class:`zipfile.BadZipFile` for a member whose size is not
    the declared one, the inflater's error for a damaged stream), and
    :class:`StreamUnavailable` when no second process can be started."""
    out = spool_file(size)
    try:
        os.ftruncate(out.fileno(), 0)
        result = _run(archive, data_start, compressed, size, out.fileno(), tuple(scans))
    except BaseException:
        out.close()
        raise
    out.seek(0)
    return out, result


def _run(archive: Path, data_start: int, compressed: int, size: int, fd: int,
         scans: tuple[NameScan, ...]) -> StreamedNames:
    r, pid = _start_child(archive, data_start, compressed, size, fd)
    # This core allocates the file's pages while the child inflates on the other: its writes
    # then only copy.  Where the file system has no fallocate, the child's writes allocate them.
    with contextlib.suppress(OSError):
        os.posix_fallocate(fd, 0, size)
    scanner = _Scanner(fd, scans)
    try:
        with os.fdopen(r, "rb", buffering=0) as pipe:
            failure = _follow(pipe, scanner)
    finally:
        _, status = os.waitpid(pid, 0)
    if failure is not None:
        raise pickle.loads(failure)
    if status != 0 or scanner.done != size:
        raise zipfile.BadZipFile(f"inflating the member stopped after {scanner.done} of its "
                                 f"{size} bytes")
    return scanner.result


def _start_child(archive: Path, data_start: int, compressed: int, size: int,
                 fd: int) -> tuple[int, int]:
    """Fork the child that inflates the member into ``fd`` (:func:`_child`): the read end of
    its progress pipe and its pid."""
    try:
        r, w = os.pipe()
    except OSError as e:
        raise StreamUnavailable(str(e)) from e
    try:
        pid = os.fork()
    except OSError as e:  # no second process here (a limit, a sandbox)
        os.close(r)
        os.close(w)
        raise StreamUnavailable(str(e)) from e
    if pid == 0:  # the child: inflate, report, and leave without running any cleanup
        code = 0
        try:
            os.close(r)
            _child(archive, data_start, compressed, size, fd, w)
        except BaseException:  # noqa: BLE001 - the parent sees the pipe close early
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    return r, pid


def _follow(pipe: IO[bytes], scanner: _Scanner) -> bytes | None:
    """Scan as far as the child reports, until its pipe closes; the pickled exception it
    reported, or ``None``."""
    pending = b""
    failure: bytes | None = None
    while True:
        got = pipe.read(1 << 16)
        if not got:
            break
        pending += got
        if failure is not None:
            failure += got
            continue
        usable = len(pending) - len(pending) % _PROGRESS.size
        marks = [v for (v,) in _PROGRESS.iter_unpack(pending[:usable])]
        if -1 in marks:
            at = marks.index(-1)
            scanner.upto(max([0, *marks[:at]]))
            failure = pending[(at + 1) * _PROGRESS.size:]
            continue
        pending = pending[usable:]
        if marks:
            scanner.upto(marks[-1])
    return failure
