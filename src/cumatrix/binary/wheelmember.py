"""The members of a wheel as seekable streams, read straight from the archive.

A wheel can be hundreds of megabytes, so nothing here extracts it to a directory.  Each
member is read through a seekable stream (:func:`open_member`): a stored member is a
window on the archive file (``seek`` is free); a deflated member is inflated once, in one
sequential pass with python-isal, into memory (up to 8 MiB) or an anonymous temporary file
(the page cache holds it, not this process), because every reader of an ELF file seeks back
and forth: pyelftools reads the section header table at the end of the file first, then
the sections, and the fat binary reader walks ``.nv_fatbin`` after that.  ``zipfile``'s own
member streams cannot serve it (in Python 3.11 a backward ``seek`` rewinds the member and
re-reads it from the start).  The on-demand reader (``spool=False``, and for members over
4 GiB) inflates in blocks with checkpoints of the decompressor every few MiB and a small
cache of decoded blocks instead: bounded memory and no temporary file, but re-inflation.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections import OrderedDict
from typing import IO, Any, cast

from cumatrix.core.readers import SeekableReader

try:
    # Inflating 242 MiB of vLLM 0.19.1's _moe_C.abi3.so in 64 KiB steps took 1.63 s with
    # zlib, 0.91 s with zlib-ng and 0.73 s with python-isal (ISA-L): isal inflates spooled
    # members.  Its decompressor cannot be copied, so the on-demand reader keeps zlib.
    from isal import isal_zlib as _fast_zlib
except ImportError:  # pragma: no cover - a declared dependency; zlib still works
    _fast_zlib = zlib  # type: ignore[misc]

__all__ = ["MEMFD_MAX", "SPOOL_MAX", "data_start", "member_magic", "open_member", "spool_file"]

# Local file header of a zip entry: signature, then fixed fields; the name and extra
# field lengths sit at offsets 26 and 28 (APPNOTE 4.3.7).
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"

_BLOCK = 1 << 20  # bytes per decoded block of a deflated member
_CHECKPOINT_EVERY = 8  # blocks between decompressor checkpoints (8 MiB)
_CACHED_BLOCKS = 16  # decoded blocks kept (16 MiB)
_INPUT_CHUNK = 1 << 16  # compressed bytes fed to zlib at a time
_IN_MEMORY = 8 << 20  # deflated members up to this size are inflated into memory
MEMFD_MAX = 1 << 30  # larger ones are spooled to a file on disk, not to memory
SPOOL_MAX = 4 << 30  # larger ones are read on demand: no zip bomb fills the disk
_SPOOL_CHUNK = 1 << 20  # compressed bytes inflated at a time when spooling
_COPY_CHUNK = 4 << 20  # bytes copied at a time from a member of any other method


class _MemberView(SeekableReader):
    """Common ``seek``/``tell``/``read`` over a member of known uncompressed size."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"bad whence {whence}")
        if pos < 0:
            raise ValueError("negative seek position")
        self._pos = pos
        return pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        n = len(data)
        memoryview(buffer)[:n] = data
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        if end <= self._pos:
            return b""
        data = self._read_range(self._pos, end)
        self._pos = end
        return data

    def _read_range(self, start: int, end: int) -> bytes:
        raise NotImplementedError


class _StoredMember(_MemberView):
    """A stored (uncompressed) member: a window on the archive file."""

    def __init__(self, raw: IO[bytes], data_start: int, size: int) -> None:
        super().__init__(size)
        self._raw = raw
        self._start = data_start

    def _read_range(self, start: int, end: int) -> bytes:
        self._raw.seek(self._start + start)
        return self._raw.read(end - start)


class _InflatedMember(_MemberView):
    """A deflated member, inflated on demand.

    Decoded in blocks of ``_BLOCK`` bytes; the decompressor state is saved every
    ``_CHECKPOINT_EVERY`` blocks (``zlib`` objects can be copied), so a backward seek
    restarts from the nearest checkpoint instead of the start of the member.
    """

    def __init__(self, raw: IO[bytes], data_start: int, compressed: int, size: int) -> None:
        super().__init__(size)
        self._raw = raw
        self._cstart = data_start
        self._cend = data_start + compressed
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        # block index -> (compressed offset, pending input, decompressor) at that block's start
        self._checkpoints: dict[int, tuple[int, bytes, Any]] = {
            0: (data_start, b"", zlib.decompressobj(-zlib.MAX_WBITS)),
        }
        self._cur_block = -1  # the block the live decompressor would produce next; -1: none
        self._cur: tuple[int, bytes, Any] | None = None

    def _read_range(self, start: int, end: int) -> bytes:
        first, last = start // _BLOCK, (end - 1) // _BLOCK
        parts = [self._block(i) for i in range(first, last + 1)]
        joined = parts[0] if len(parts) == 1 else b"".join(parts)
        off = start - first * _BLOCK
        return joined[off:off + (end - start)]

    def _block(self, index: int) -> bytes:
        cached = self._blocks.get(index)
        if cached is not None:
            self._blocks.move_to_end(index)
            return cached
        if not (self._cur is not None and self._cur_block <= index
                and index - self._cur_block <= _CHECKPOINT_EVERY):
            cp = (index // _CHECKPOINT_EVERY) * _CHECKPOINT_EVERY
            while cp not in self._checkpoints:
                cp -= _CHECKPOINT_EVERY
            if not (self._cur is not None and cp <= self._cur_block <= index):
                coff, pending, d = self._checkpoints[cp]
                self._cur, self._cur_block = (coff, pending, d.copy()), cp
        while True:
            data = self._decode_next()
            if self._cur_block - 1 == index:
                return data

    def _decode_next(self) -> bytes:
        """Decode the block at ``self._cur_block`` and advance the live decompressor."""
        assert self._cur is not None  # set by _block before any decode
        coff, pending, d = self._cur
        want = min(_BLOCK, self._size - self._cur_block * _BLOCK)
        out: list[bytes] = []
        got = 0
        while got < want:
            if not pending:
                if coff >= self._cend:
                    raise zipfile.BadZipFile("deflated member ends before its declared size")
                self._raw.seek(coff)
                pending = self._raw.read(min(_INPUT_CHUNK, self._cend - coff))
                coff += len(pending)
            chunk = d.decompress(pending, want - got)
            pending = d.unconsumed_tail
            out.append(chunk)
            got += len(chunk)
            if not chunk and d.eof:
                raise zipfile.BadZipFile("deflated member ends before its declared size")
        data = b"".join(out)
        index = self._cur_block
        self._cur_block += 1
        self._cur = (coff, pending, d)
        if self._cur_block % _CHECKPOINT_EVERY == 0 and self._cur_block not in self._checkpoints:
            self._checkpoints[self._cur_block] = (coff, pending, d.copy())
        self._blocks[index] = data
        if len(self._blocks) > _CACHED_BLOCKS:
            self._blocks.popitem(last=False)
        return data


def data_start(raw: IO[bytes], info: zipfile.ZipInfo) -> int:
    """Where the data of the member ``info`` starts in the archive (after its local header)."""
    raw.seek(info.header_offset)
    header = raw.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
        raise zipfile.BadZipFile(f"{info.filename}: bad local file header")
    fields = _LOCAL_HEADER.unpack(header)
    name_len, extra_len = fields[-2], fields[-1]
    return int(info.header_offset) + _LOCAL_HEADER.size + int(name_len) + int(extra_len)


def _inflate_all(raw: IO[bytes], data_start: int, compressed: int, size: int,
                 out: IO[bytes]) -> None:
    """Inflate a whole deflated member into ``out`` in one sequential pass."""
    d = _fast_zlib.decompressobj(-zlib.MAX_WBITS)
    raw.seek(data_start)
    left, written = compressed, 0
    while left > 0:
        chunk = raw.read(min(_SPOOL_CHUNK, left))
        if not chunk:
            break
        left -= len(chunk)
        data = d.decompress(chunk)
        written += len(data)
        if written > size:
            raise zipfile.BadZipFile("deflated member is longer than its declared size")
        out.write(data)
    data = d.flush()
    written += len(data)
    out.write(data)
    if written != size:
        raise zipfile.BadZipFile(f"deflated member holds {written} bytes, not the {size} "
                                 "its entry declares")
    out.seek(0)


def _inflate_small(raw: IO[bytes], data_start: int, compressed: int, size: int) -> bytes:
    """A small deflated member inflated in one call (as :func:`_inflate_all` checks it): a
    cubin-heavy wheel inflates thousands, and the chunked reading cost as much as inflating."""
    raw.seek(data_start)
    d = _fast_zlib.decompressobj(-zlib.MAX_WBITS)
    data = d.decompress(raw.read(compressed))
    if len(data) > size:
        raise zipfile.BadZipFile("deflated member is longer than its declared size")
    data += d.flush()
    if len(data) != size:
        raise zipfile.BadZipFile(f"deflated member holds {len(data)} bytes, not the {size} "
                                 "its entry declares")
    return data


def spool_file(size: int) -> IO[bytes]:
    """An anonymous file for an inflated member: a memfd (tmpfs) up to ``MEMFD_MAX`` where
    the system has one (writing cuFFT's 278 MiB took 0.15 s there, 0.4-0.9 s on a disk's
    file system), else a temporary file; neither is mapped, so neither counts as the
    process's resident memory."""
    # Larger within a quarter of free memory: over 1 GiB, a disk's file cost a third more time.
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if size > MEMFD_MAX else 0
    if (size <= MEMFD_MAX or size <= free // 4) and hasattr(os, "memfd_create"):
        try:
            return os.fdopen(os.memfd_create("cumatrix-member", os.MFD_CLOEXEC), "w+b")
        except OSError:  # no memfd in this kernel or sandbox
            pass
    return tempfile.TemporaryFile()


def open_member(zf: zipfile.ZipFile, raw: IO[bytes], info: zipfile.ZipInfo, *,
                spool: bool = True) -> IO[bytes]:
    """A seekable, read-only stream over one member of ``zf``.

    ``raw`` is the archive opened in binary mode (a handle separate from the one ``zf``
    reads through).  A stored member is read in place.  A deflated member is inflated once,
    sequentially, with the fastest inflater installed: into memory up to 8 MiB, else into
    an anonymous temporary file (the page cache, not this process, holds it), because
    every reader of a large ELF file seeks back and forth (pyelftools reads the section
    table at the end first) and re-inflating is what costs.  With ``spool=False`` it is
    inflated on demand instead (bounded memory, no temporary file, several passes).  Any
    other method (bzip2, lzma: never seen in wheels) is copied once into a temporary file.
    """
    if info.flag_bits & 0x1:
        raise zipfile.BadZipFile(f"{info.filename}: encrypted member")
    if info.compress_type == zipfile.ZIP_STORED:
        return cast(IO[bytes], _StoredMember(raw, data_start(raw, info), info.file_size))
    if info.compress_type == zipfile.ZIP_DEFLATED:
        start = data_start(raw, info)
        if not spool or info.file_size > SPOOL_MAX:
            return cast(IO[bytes], _InflatedMember(raw, start, info.compress_size,
                                                   info.file_size))
        if info.file_size <= _IN_MEMORY:
            return io.BytesIO(_inflate_small(raw, start, info.compress_size, info.file_size))
        out = spool_file(info.file_size)
        try:
            _inflate_all(raw, start, info.compress_size, info.file_size, out)
        except BaseException:
            out.close()
            raise
        return out
    copy = tempfile.TemporaryFile()  # noqa: SIM115 - the caller closes it
    with zf.open(info) as src:
        shutil.copyfileobj(src, copy, _COPY_CHUNK)
    copy.seek(0)
    return copy


def member_magic(raw: IO[bytes], info: zipfile.ZipInfo, n: int = 4) -> bytes:
    """The first ``n`` bytes of a member, inflating only what they need."""
    start = data_start(raw, info)
    raw.seek(start)
    if info.compress_type == zipfile.ZIP_STORED:
        return raw.read(min(n, info.file_size))
    if info.compress_type != zipfile.ZIP_DEFLATED:
        return b""
    d = zlib.decompressobj(-zlib.MAX_WBITS)
    out = b""
    left = info.compress_size
    while len(out) < n and left > 0 and not d.eof:
        chunk = raw.read(min(4096, left))
        if not chunk:
            break
        left -= len(chunk)
        out += d.decompress(chunk, n - len(out))
    return out[:n]
