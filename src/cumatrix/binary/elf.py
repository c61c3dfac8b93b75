"""Small pure functions over ELF files, read with pyelftools straight from a wheel.

A wheel can be hundreds of megabytes, so nothing here extracts it to a directory.  Each
ELF member is read through a seekable stream (:func:`open_member`): a stored member is a
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
import re
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

try:
    # Inflating 242 MiB of vLLM 0.19.1's _moe_C.abi3.so in 64 KiB steps took 1.63 s with
    # zlib, 0.91 s with zlib-ng and 0.73 s with python-isal (ISA-L): isal inflates spooled
    # members.  Its decompressor cannot be copied, so the on-demand reader keeps zlib.
    from isal import isal_zlib as _fast_zlib
except ImportError:  # pragma: no cover - a declared dependency; zlib still works
    _fast_zlib = zlib  # type: ignore[misc]

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from cumatrix.binary.loader import LoaderError, LoaderView, load_segments, loader_view, section_headers

__all__ = [
    "ELF_MAGIC",
    "data_ranges",
    "elf_defined_symbols",
    "elf_needed",
    "elf_search_paths",
    "elf_soname",
    "elf_strings",
    "elf_undefined_symbols",
    "iter_wheel_elves",
    "open_member",
]

ELF_MAGIC = b"\x7fELF"

# Local file header of a zip entry: signature, then fixed fields; the name and extra
# field lengths sit at offsets 26 and 28 (APPNOTE 4.3.7).
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"

_BLOCK = 1 << 20  # bytes per decoded block of a deflated member
_CHECKPOINT_EVERY = 8  # blocks between decompressor checkpoints (8 MiB)
_CACHED_BLOCKS = 16  # decoded blocks kept (16 MiB)
_INPUT_CHUNK = 1 << 16  # compressed bytes fed to zlib at a time
_SCAN_CHUNK = 4 << 20  # bytes of a section scanned at a time by elf_strings
_IN_MEMORY = 8 << 20  # deflated members up to this size are inflated into memory
MEMFD_MAX = 1 << 30  # larger ones are spooled to a file on disk, not to memory
SPOOL_MAX = 4 << 30  # larger ones are read on demand: no zip bomb fills the disk
_SPOOL_CHUNK = 1 << 20  # compressed bytes inflated at a time when spooling
_MAX_NAME = 512  # longest name elf_strings reports; also the overlap between chunks


class _MemberView(io.RawIOBase):
    """Common ``seek``/``tell``/``read`` over a member of known uncompressed size."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

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
        shutil.copyfileobj(src, copy, _SCAN_CHUNK)
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


def iter_wheel_elves(
    wheel: Path,
    *,
    on_error: Callable[[str, Exception], None] | None = None,
) -> Iterator[tuple[str, ELFFile]]:
    """Yield ``(member path, ELFFile)`` for every ELF member of ``wheel``, in archive order.

    Members are recognised by the ELF magic, not by their name.  Each ``ELFFile`` reads
    from the archive and is valid only until the iterator advances.  A member that starts
    with the magic but does not parse goes to ``on_error`` (when given) or raises
    :class:`elftools.common.exceptions.ELFError`.  Raises :class:`zipfile.BadZipFile`
    when ``wheel`` is not a zip archive.
    """
    with zipfile.ZipFile(wheel) as zf, wheel.open("rb") as raw:
        for info in zf.infolist():
            if info.is_dir() or info.file_size < len(ELF_MAGIC):
                continue
            stream = open_member(zf, raw, info)
            try:
                if stream.read(len(ELF_MAGIC)) != ELF_MAGIC:
                    continue
                stream.seek(0)
                try:
                    elf = ELFFile(stream)
                    check_bounds(elf, info.file_size)
                except Exception as e:
                    # AssertionError, struct.error, ValueError, IndexError, ... (not only ELFError)
                    if on_error is None:
                        raise ELFError(f"{info.filename}: {e}") from e
                    on_error(info.filename, e)
                    continue
                yield info.filename, elf
            finally:
                stream.close()


#: The most section headers (and program headers) an ELF file may declare to be read: 65535,
#: the most the 16-bit ``e_shnum`` holds without the extended-numbering escape.  A crafted file
#: declaring 400,000 in a 25 KB wheel took the static audit 26 s.
MAX_HEADERS = 65535


def check_bounds(elf: ELFFile, file_size: int) -> None:
    """ELFError unless ``elf``'s header tables are within :data:`MAX_HEADERS` entries and inside
    the file (``file_size`` bytes); read before any section is."""
    h = elf.header
    shnum, phnum = elf.num_sections(), elf.num_segments()
    if shnum > MAX_HEADERS or phnum > MAX_HEADERS:
        raise ELFError(f"declares {shnum} section and {phnum} program headers (at most {MAX_HEADERS} are read)")
    for what, off, num, size in (("section", h["e_shoff"], shnum, h["e_shentsize"]),
                                 ("program", h["e_phoff"], phnum, h["e_phentsize"])):
        if num and off + num * size > file_size:
            raise ELFError(f"its {what} header table ({num} x {size} bytes at {off}) lies beyond the file's "
                           f"{file_size} bytes")


def _dynamic(elf: ELFFile) -> DynamicSection | None:
    named = getattr(elf, "named_headers", None)
    if named is not None:
        # FastELFFile: every section is known to be made without error (named_headers made
        # them or proved it), so only the first dynamic section is made: the same one.
        for i, (_, header) in enumerate(named()):
            if header.sh_type == "SHT_DYNAMIC":
                section = elf.get_section(i)
                return section if isinstance(section, DynamicSection) else None
        return None
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            return section
    return None


def _view(elf: ELFFile) -> LoaderView | None:
    """The loader's reading of ``elf`` (:func:`cumatrix.binary.loader.loader_view`), or
    ``None`` where the file has no usable ``PT_DYNAMIC``: then its sections are read."""
    try:
        return loader_view(elf)
    except (LoaderError, struct.error, OSError):
        return None


def elf_needed(elf: ELFFile) -> Iterator[str]:
    """The ``DT_NEEDED`` entries of ``elf``, in order, as the loader reads them (through
    ``PT_DYNAMIC``; the ``.dynamic`` section only where the file has no program headers)."""
    view = _view(elf)
    if view is not None:
        yield from view.needed
        return
    dynamic = _dynamic(elf)
    if dynamic is None:
        return
    for tag in dynamic.iter_tags():
        if tag.entry.d_tag == "DT_NEEDED":
            yield str(tag.needed)  # type: ignore[attr-defined]


def elf_soname(elf: ELFFile) -> str | None:
    """The ``DT_SONAME`` of ``elf``, or ``None`` (read as :func:`elf_needed` reads)."""
    view = _view(elf)
    if view is not None:
        return view.soname
    dynamic = _dynamic(elf)
    if dynamic is None:
        return None
    for tag in dynamic.iter_tags():
        if tag.entry.d_tag == "DT_SONAME":
            return str(tag.soname)  # type: ignore[attr-defined]
    return None


def elf_search_paths(elf: ELFFile) -> tuple[str, ...]:
    """The ``DT_RPATH`` and ``DT_RUNPATH`` entries of ``elf``, split at ``:`` (read as
    :func:`elf_needed` reads)."""
    view = _view(elf)
    if view is not None:
        return tuple(dict.fromkeys((*view.rpath, *view.runpath)))
    dyn = _dynamic(elf)
    out: list[str] = []
    if dyn is None:
        return ()
    for tag in dyn.iter_tags():
        if tag.entry.d_tag == "DT_RPATH":
            out.extend(str(tag.rpath).split(":"))  # type: ignore[attr-defined]
        elif tag.entry.d_tag == "DT_RUNPATH":
            out.extend(str(tag.runpath).split(":"))  # type: ignore[attr-defined]
    return tuple(dict.fromkeys(p for p in out if p))


_STB_LOCAL = 0
_STB_WEAK = 2
_MAX_DYNSYM = 256 << 20  # a bound on a crafted section size


def _dynsym(elf: ELFFile) -> list[tuple[str, bool, bool]]:
    """``(name, defined, weak)`` of every named non-local dynamic symbol (glibc's lookup skips local
    ones), read with ``struct`` in one pass over ``.dynsym`` and its string table: pyelftools'
    per-symbol parsing took 3.9 s for the 15,756 symbols of vLLM's ``_C.abi3.so``.  The
    table the loader binds from (``DT_SYMTAB``, :func:`_view`), else the ``.dynsym`` section."""
    view = _view(elf)
    if view is not None:
        return list(view.symbols)
    section = elf.get_section_by_name(".dynsym")
    if not isinstance(section, SymbolTableSection):
        return []
    strtab = elf.get_section(section["sh_link"])
    size, ssize = section["sh_size"], strtab["sh_size"]
    if size > _MAX_DYNSYM or ssize > _MAX_DYNSYM:
        raise ELFError(f".dynsym or its string table is implausibly large ({size}, {ssize})")
    stream = elf.stream
    stream.seek(section["sh_offset"])
    data = stream.read(size)
    stream.seek(strtab["sh_offset"])
    names = stream.read(ssize)
    end = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:  # st_name, st_info, st_other, st_shndx, st_value, st_size
        fmt, iname, iinfo, ishndx = struct.Struct(end + "IBBHQQ"), 0, 1, 3
    else:  # st_name, st_value, st_size, st_info, st_other, st_shndx
        fmt, iname, iinfo, ishndx = struct.Struct(end + "IIIBBH"), 0, 3, 5
    out: list[tuple[str, bool, bool]] = []
    for entry in fmt.iter_unpack(data[: len(data) - len(data) % fmt.size]):
        off = entry[iname]
        if not off or off >= len(names) or entry[iinfo] >> 4 == _STB_LOCAL:
            continue
        stop = names.find(b"\0", off)
        name = names[off: stop if stop != -1 else len(names)].decode("utf-8", "replace")
        out.append((name, entry[ishndx] != 0, entry[iinfo] >> 4 == _STB_WEAK))
    return out


def elf_undefined_symbols(elf: ELFFile) -> Iterator[str]:
    """Names of the undefined dynamic symbols of ``elf``; weak ones are skipped.

    A weak undefined symbol resolves to NULL when absent instead of failing the load,
    so it cannot cause ``undefined symbol`` at import.
    """
    for name, defined, weak in _dynsym(elf):
        if not defined and not weak:
            yield name


def elf_defined_symbols(elf: ELFFile) -> Iterator[str]:
    """Names of the dynamic symbols ``elf`` defines (exports), weak ones included."""
    for name, defined, _ in _dynsym(elf):
        if defined:
            yield name


def is_data_section(header: Any, string_tables: bool) -> bool:
    """Whether a section (its header) is loaded, non-executable data (with ``string_tables``,
    a loaded string table too)."""
    kind = header.sh_type
    flags = header.sh_flags
    if kind == "SHT_STRTAB":
        # .dynstr holds the names of imported symbols; .strtab/.shstrtab are not loaded.
        return string_tables and bool(flags & 0x2)
    if kind != "SHT_PROGBITS" or not flags & 0x2:  # SHF_ALLOC
        return False  # not loaded: .comment, .debug_* (names of declarations, not lookups)
    return not flags & 0x4  # SHF_EXECINSTR: code, not data


#: Sections never scanned for names: device code (a host ``dlsym`` never reads it);
#: ``__nv_relfatbin`` holds relocatable device code (215 MB of NCCL 2.32's 490 MB).
DEVICE_SECTIONS = frozenset({".nv_fatbin", ".nvFatBinSegment", "__nv_relfatbin"})


_IDENT = [bool(re.fullmatch(rb"[A-Za-z0-9_]", bytes([b]))) for b in range(256)]


def data_ranges(elf: ELFFile, *, string_tables: bool = False) -> list[tuple[int, int]]:
    """``(offset, size)`` of the loaded, non-executable data of ``elf`` (device code left
    out): its data sections (:func:`is_data_section`), or, in a file without section
    headers, its loadable non-executable segments less the dynamic symbol table, the
    dynamic string table (unless ``string_tables``) and the fat binary; so too where its
    sections cannot be made (:func:`cumatrix.binary.loader.section_headers`)."""
    pairs = section_headers(elf)
    if pairs is not None:
        # (a NOBITS section is no PROGBITS or STRTAB one)
        return [(h.sh_offset, h.sh_size) for name, h in pairs
                if is_data_section(h, string_tables) and name not in DEVICE_SECTIONS]
    # deferred: fatbin imports this module's neighbour loader; only a file without usable
    # section headers needs it here
    from cumatrix.binary.fatbin import FatbinError, find_fatbin, read_fatbin_modules

    holes: list[tuple[int, int]] = []
    view = _view(elf)
    if view is not None:
        holes += view.tables[1:] if string_tables else view.tables
    try:
        where = find_fatbin(elf)
        if where is not None:
            mods = read_fatbin_modules(elf.stream, where[0], where[1], strict=False)
            if mods:
                holes.append((where[0], mods[-1].offset + mods[-1].size - where[0]))
    except (FatbinError, OSError):
        pass
    out: list[tuple[int, int]] = []
    for offset, filesz, _, flags in load_segments(elf):
        if flags & 1:  # PF_X: code
            continue
        pieces = [(offset, offset + filesz)]
        for hs, hn in holes:
            he = hs + hn
            pieces = [q for a, b in pieces
                      for q in ((a, min(b, hs)), (max(a, he), b)) if q[0] < q[1]]
        out += [(a, b - a) for a, b in pieces]
    return out


def data_chunks(elf: ELFFile, *, string_tables: bool = False, keep: int) -> Iterator[bytes]:
    """The loaded, non-executable sections of ``elf`` (device code left out), read in chunks.

    Each chunk comes after the last ``keep`` bytes of the one before it in the same section (a
    NUL before a section's first chunk: its start is a string boundary), so a string cut by a
    chunk boundary is seen whole in the next; position 0 is context, never a match's start.
    """
    stream = elf.stream
    for start, size in data_ranges(elf, string_tables=string_tables):
        carry = b"\x00"
        pos = 0
        while pos < size:
            stream.seek(start + pos)
            chunk = stream.read(min(_SCAN_CHUNK, size - pos))
            if not chunk:
                break
            pos += len(chunk)
            buf = carry + chunk
            yield buf
            carry = buf[-keep:]


@dataclass(frozen=True, slots=True)
class NameScan:
    """Names a scan of the loaded data looks for: ``patterns`` (each ends at the NUL that ends
    the name) and which byte may stand before a name (``before``: 256 booleans; the start of
    a section counts as a NUL)."""

    patterns: tuple[re.Pattern[bytes], ...]
    before: tuple[bool, ...]
    longest: int  #: the longest match, NUL included


def _name_patterns(prefixes: tuple[str, ...]) -> tuple[re.Pattern[bytes], ...]:
    alt = b"|".join(re.escape(p.encode()) for p in prefixes)
    # No look-behind: a pattern that starts with literals lets the regex engine skip ahead
    # fast; the character before a match is checked apart (a look-behind made the scan of
    # NCCL's 215 MB of relocatable device code take 39 s).
    if all(re.fullmatch(r"[A-Za-z0-9_]+", p) for p in prefixes):
        # One pattern per prefix: a pattern that starts with one literal is searched for
        # fast, an alternation is tried at every byte (8x slower over cuFFT's .rodata).
        # The same names are found: a match spans identifier characters up to its NUL, so
        # any match it could hide starts after an identifier character and is dropped.
        return tuple(re.compile(re.escape(p.encode()) + rb"[A-Za-z0-9_]{0,%d}\x00" % _MAX_NAME)
                     for p in prefixes)
    return (re.compile(rb"(?:" + alt + rb")[A-Za-z0-9_]{0,%d}\x00" % _MAX_NAME),)


def name_scan(prefix: str | tuple[str, ...]) -> NameScan:
    """The scan :func:`elf_strings` makes: identifiers starting with ``prefix``, not preceded
    by an identifier character, followed by identifier characters and a NUL."""
    prefixes = (prefix,) if isinstance(prefix, str) else prefix
    return NameScan(patterns=_name_patterns(prefixes),
                    before=tuple(not ident for ident in _IDENT),
                    longest=_MAX_NAME + max(len(p) for p in prefixes) + 1)


def scan_names(elf: ELFFile, scans: tuple[NameScan, ...], *,
               string_tables: bool = False) -> list[set[str]]:
    """The names each of ``scans`` finds in ``elf``'s loaded data (as :func:`elf_strings`
    describes), in one reading of the data for all of them."""
    found: list[set[str]] = [set() for _ in scans]
    keep = max(s.longest for s in scans) + 1
    # Names seen twice (in a chunk and again in the next one's context) collapse in the set.
    for buf in data_chunks(elf, string_tables=string_tables, keep=keep):
        for scan, out in zip(scans, found, strict=True):
            before = scan.before
            for pattern in scan.patterns:
                for m in pattern.finditer(buf, 1):
                    if before[buf[m.start() - 1]]:
                        out.add(m.group()[:-1].decode("ascii"))
    return found


def elf_strings(elf: ELFFile, prefix: str | tuple[str, ...], *,
                string_tables: bool = False) -> set[str]:
    """Identifiers starting with ``prefix`` that appear as NUL-terminated strings in data.

    Scans the loaded, non-executable sections (``.rodata``, ``.data.rel.ro``, ...), where a
    name passed to ``dlsym`` lives, except device code (``.nv_fatbin``); with
    ``string_tables=True`` also ``.dynstr``, where the names of directly linked symbols live.
    A name counts when it is not preceded by an identifier character and is followed by
    identifier characters and a NUL.  ``prefix`` may be a tuple: one scan finds them all.
    Sections are read in chunks, so a large constant array costs time, not memory.
    """
    return scan_names(elf, (name_scan(prefix),), string_tables=string_tables)[0]
