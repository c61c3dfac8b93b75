"""Reading the ELF members of a wheel for the static audit, on a pool of processes.

The members whose first bytes are the ELF magic are listed once (:func:`candidates`); each is
read straight from the archive (:func:`cumatrix.binary.wheelmember.open_member`) and audited
(:func:`cumatrix.audit.checks.audit_one`); any failure to read one is its own
``unreadable-elf`` finding.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import zipfile
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from elftools.elf.elffile import ELFFile

from cumatrix.audit.checks import DATA_SCANS, audit_one
from cumatrix.audit.findings import AuditData, AuditSettings, Finding, Linkage
from cumatrix.binary.elf import ELF_MAGIC, check_bounds, scan_names
from cumatrix.binary.fastelf import reader as fastelf_reader
from cumatrix.binary.fatbin import DeviceCode
from cumatrix.binary.streamscan import StreamedNames, StreamUnavailable, stream_member
from cumatrix.binary.wheelmember import SPOOL_MAX, data_start, member_magic, open_member

# Below this much inflated ELF data a wheel is audited in-process (a pool costs more).
_PARALLEL_BYTES = 64 << 20
_SMALL_MEMBER = 1 << 20  # members up to this size are sent to workers in batches
# Deflated members from this size on are inflated by a second process while this one scans
# them (binary/streamscan.py): one pass over their bytes, on two cores.
_STREAM_MIN = 32 << 20


def _unreadable(name: str, err: BaseException) -> Finding:
    what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return Finding(
        file=name, severity="error", code="unreadable-elf", subject=name,
        message=f"{name} starts with the ELF magic but could not be read: {what}",
        fix="rebuild the file; the audit cannot vouch for what it cannot read",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _MemberResult:
    name: str
    is_elf: bool
    findings: tuple[Finding, ...]
    codes: tuple[DeviceCode, ...]
    link: Linkage | None = None  #: None where the file could not be read


def _audit_member(wheel: Path, member: str, s: AuditSettings, data: AuditData,
                  abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str]
                  ) -> _MemberResult:
    """Audit one member; any failure to read it (a damaged zip entry, an ELF that pyelftools
    or the fat binary reader rejects, however it fails) is an ``unreadable-elf`` finding."""
    try:
        info = _INFOS.get(member)
        if info is None or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            # Not listed by candidates, or a method only zipfile reads: the slow way.
            with zipfile.ZipFile(wheel) as zf, wheel.open("rb") as raw:
                zinfo = zf.getinfo(member)
                return _audit_stream(member, open_member(zf, raw, zinfo), zinfo.file_size, s,
                                     data, abi_changed)
        archive = _archive(wheel)
        if _streamed(info):
            try:
                stream, names = stream_member(wheel, data_start(archive, info),
                                              info.compress_size, info.file_size, DATA_SCANS)
                return _audit_stream(member, stream, info.file_size, s, data, abi_changed, names)
            except StreamUnavailable:
                pass  # no second process here: read below, in this one
        # Stored and deflated members need only the archive handle: no central directory
        # is parsed again per member (2,000 entries took 40 ms a member in CuPy's wheel).
        return _audit_stream(member, open_member(cast(zipfile.ZipFile, None), archive, info),
                             info.file_size, s, data, abi_changed)
    except Exception as e:  # noqa: BLE001 - a hostile file may break any parser in any way
        return _MemberResult(name=member, is_elf=True, findings=(_unreadable(member, e),),
                             codes=())


def _streamed(info: zipfile.ZipInfo) -> bool:
    """Whether a member is inflated by a second process while this one scans it: one larger
    than a core's share of the wheel's ELF data (the other cores would wait for it; a smaller
    one's second process takes a core from another member's audit)."""
    return (info.compress_type == zipfile.ZIP_DEFLATED and not info.flag_bits & 0x1
            and max(_STREAM_MIN, _PLAN.get("share", 0)) <= info.file_size <= SPOOL_MAX
            and hasattr(os, "fork"))


#: The wheel's ELF bytes per process auditing it, set before the members are audited.
_PLAN: dict[str, int] = {}


#: The archive handle of this process, by wheel: one open per process, not one per member.
_RAW: dict[tuple[int, Path], IO[bytes]] = {}


def _archive(wheel: Path) -> IO[bytes]:
    key = (os.getpid(), wheel)
    raw = _RAW.get(key)
    if raw is None:
        raw = _RAW[key] = wheel.open("rb")  # closed by audit_members
    return raw


def _close_archives() -> None:
    for raw in _RAW.values():
        raw.close()
    _RAW.clear()


def _audit_stream(member: str, stream: Any, size: int, s: AuditSettings, data: AuditData,
                  abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str],
                  names: StreamedNames | None = None) -> _MemberResult:
    try:
        try:
            if stream.read(len(ELF_MAGIC)) != ELF_MAGIC:
                return _MemberResult(name=member, is_elf=False, findings=(), codes=())
            stream.seek(0)
            elf = ELF_READER(stream)
            check_bounds(elf, size)  # header counts bounded before any is read
            scanned = None
            if names is not None:
                scanned = (names.resolve(elf) if hasattr(elf, "named_headers")
                           else scan_names(elf, DATA_SCANS))
            findings, codes, link = audit_one(member, elf, s, data, abi_changed, scanned)
        finally:
            stream.close()
    except Exception as e:  # noqa: BLE001 - a hostile file may break any parser in any way
        return _MemberResult(name=member, is_elf=True, findings=(_unreadable(member, e),),
                             codes=())
    return _MemberResult(name=member, is_elf=True, findings=tuple(findings), codes=codes, link=link)


#: The reader of a member's ELF file: :class:`FastELFFile` parses the section table once
#: (same values as pyelftools' :class:`ELFFile`, which the equivalence test swaps in), on a
#: pyelftools whose internals it was checked against (:data:`fastelf.PYELFTOOLS_TESTED`).
ELF_READER: Callable[[Any], ELFFile] = fastelf_reader()


#: The zip entries of the wheel being audited, by member name: read once by candidates in
#: the parent (plain data, no file handle, so forked workers inherit them safely).
_INFOS: dict[str, zipfile.ZipInfo] = {}


# Set in the parent before the pool forks, so workers inherit the (large) header facts.
_WORKER_STATE: dict[str, tuple[Path, AuditSettings, AuditData,
                               Mapping[str, tuple[str, str]] | AbstractSet[str]]] = {}


def _worker(member: str) -> _MemberResult:
    wheel, s, data, abi = _WORKER_STATE["audit"]  # set before the fork
    return _audit_member(wheel, member, s, data, abi)


def candidates(wheel: Path) -> list[tuple[str, int]]:
    """(member, uncompressed size) of the members that start with the ELF magic."""
    out: list[tuple[str, int]] = []
    _INFOS.clear()
    with zipfile.ZipFile(wheel) as zf, wheel.open("rb") as raw:
        for info in zf.infolist():
            if info.is_dir() or info.file_size < len(ELF_MAGIC):
                continue
            _INFOS[info.filename] = info
            try:
                head = member_magic(raw, info, len(ELF_MAGIC))
            except Exception:  # noqa: BLE001 - audited (and reported) member by member
                head = ELF_MAGIC
            if head == ELF_MAGIC:
                out.append((info.filename, info.file_size))
    return out


def workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _run_members(wheel: Path, members: list[tuple[str, int]], s: AuditSettings,
                 data: AuditData, abi: Mapping[str, tuple[str, str]] | AbstractSet[str],
                 jobs: int | None) -> dict[str, _MemberResult]:
    n = min(jobs or workers(), len(members))
    total = sum(size for _, size in members)
    _PLAN["share"] = total // max(1, n)
    if not _parallel(n, total):
        return _in_process(wheel, members, s, data, abi)
    _WORKER_STATE["audit"] = (wheel, s, data, abi)
    try:
        return _pooled(wheel, members, n, s, data, abi)
    finally:
        _WORKER_STATE.clear()


def _parallel(n: int, total: int) -> bool:
    """Whether ``total`` bytes of members are worth ``n`` forked workers (and fork exists)."""
    return n > 1 and total >= _PARALLEL_BYTES and "fork" in multiprocessing.get_all_start_methods()


def _in_process(wheel: Path, members: list[tuple[str, int]], s: AuditSettings, data: AuditData,
                abi: Mapping[str, tuple[str, str]] | AbstractSet[str]) -> dict[str, _MemberResult]:
    return {m: _audit_member(wheel, m, s, data, abi) for m, _ in members}


def _pooled(wheel: Path, members: list[tuple[str, int]], n: int, s: AuditSettings,
            data: AuditData, abi: Mapping[str, tuple[str, str]] | AbstractSet[str]
            ) -> dict[str, _MemberResult]:
    """The members audited on ``n`` forked workers (:data:`_WORKER_STATE` set)."""
    # Largest first, so the long members start at once and the small ones fill in.
    order = [m for m, _ in sorted(members, key=lambda x: -x[1])]
    big = [m for m, size in sorted(members, key=lambda x: -x[1]) if size > _SMALL_MEMBER]
    small = order[len(big):]
    # Small members go to the workers in batches: one round trip per cubin cost more
    # than auditing it in a wheel of thousands.  Large ones one at a time, for balance.
    batch = max(1, min(64, len(small) // (n * 8)))
    try:
        with ProcessPoolExecutor(max_workers=n,
                                 mp_context=multiprocessing.get_context("fork")) as pool:
            first = pool.map(_worker, big)
            rest = pool.map(_worker, small, chunksize=batch)
            return {r.name: r for r in itertools.chain(first, rest)}
    except BrokenProcessPool:
        # A worker died (out of memory, a crash in a native inflater on a hostile file):
        # audit in this process instead, where each member's failure is its own finding.
        return _in_process(wheel, members, s, data, abi)


def audit_members(wheel: Path, s: AuditSettings, data: AuditData,
                  abi: Mapping[str, tuple[str, str]] | AbstractSet[str], jobs: int | None
                  ) -> tuple[list[tuple[str, int]], dict[str, _MemberResult]]:
    """The ELF candidates of ``wheel`` (member, size) and the audit of each, by member."""
    members = candidates(wheel)
    try:
        return members, _run_members(wheel, members, s, data, abi, jobs)
    finally:
        _INFOS.clear()
        _PLAN.clear()
        _close_archives()
