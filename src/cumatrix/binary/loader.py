"""An ELF file's dynamic linking as the loader reads it: program headers and ``PT_DYNAMIC``.

``ld.so`` never reads section headers: it maps the ``PT_LOAD`` segments, finds the dynamic
array through ``PT_DYNAMIC`` and from it the string table (``DT_STRTAB``/``DT_STRSZ``), the
symbol table (``DT_SYMTAB``; its length from ``DT_HASH``'s chain count or by walking
``DT_GNU_HASH``), ``DT_NEEDED``, ``DT_SONAME``, ``DT_RPATH``/``DT_RUNPATH`` and the symbol
versions (``DT_VERSYM``, ``DT_VERNEED``).  A file whose section header table was stripped
(``e_shoff = 0``), or whose ``.dynsym``/``.dynamic`` sections were renamed or retyped, loads
and binds exactly as before, so the audit reads what the loader reads (System V gABI,
"Dynamic Section" and "Hash Table"; the GNU hash layout of glibc's ``dl-lookup.c``).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, cast

from elftools.common.exceptions import ELFError

__all__ = ["LoaderError", "LoaderView", "load_segments", "loader_view", "section_headers"]

PT_LOAD = 1
PT_DYNAMIC = 2
PF_X = 1
DT_NULL, DT_NEEDED, DT_HASH, DT_STRTAB, DT_SYMTAB = 0, 1, 4, 5, 6
DT_STRSZ, DT_SYMENT, DT_SONAME, DT_RPATH, DT_RUNPATH = 10, 11, 14, 15, 29
DT_GNU_HASH = 0x6FFFFEF5
DT_VERSYM, DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFF0, 0x6FFFFFFE, 0x6FFFFFFF
_STB_LOCAL, _STB_WEAK = 0, 2
#: Bounds on what a crafted file can make this read: dynamic entries, symbols, string bytes.
MAX_DYNAMIC = 1 << 16
MAX_SYMBOLS = 1 << 22
MAX_STRINGS = 256 << 20


_UNREAD = object()


class LoaderError(ValueError):
    """Program headers or a dynamic array that the loader could not use either."""


@dataclass(frozen=True, slots=True)
class LoaderView:
    """What the loader reads of one ELF file's dynamic linking."""

    needed: tuple[str, ...]  #: DT_NEEDED, in order
    soname: str | None
    rpath: tuple[str, ...]  #: DT_RPATH entries, split at ``:``
    runpath: tuple[str, ...]  #: DT_RUNPATH entries, split at ``:``
    #: ``(name, defined, weak)`` of each named non-local dynamic symbol, in table order
    symbols: tuple[tuple[str, bool, bool], ...]
    #: the versions each DT_NEEDED library must define (DT_VERNEED): ``(library, version)``
    versions_needed: tuple[tuple[str, str], ...]
    #: ``(offset, size)`` in the file of the dynamic string and symbol tables
    tables: tuple[tuple[int, int], ...]


def _segments(stream: IO[bytes], header: Any, elfclass: int, end: str) -> list[tuple[int, ...]]:
    phoff, phnum, phentsize = header["e_phoff"], header["e_phnum"], header["e_phentsize"]
    fmt = struct.Struct(end + ("IIQQQQQQ" if elfclass == 64 else "IIIIIIII"))
    if not phoff or not phnum or phentsize < fmt.size or phnum > 0xFFFF:
        return []
    stream.seek(phoff)
    raw = stream.read(phnum * phentsize)
    if len(raw) < phnum * phentsize:
        raise LoaderError("its program header table lies beyond the file")
    out: list[tuple[int, ...]] = []
    for i in range(phnum):
        f = fmt.unpack_from(raw, i * phentsize)
        if elfclass == 64:  # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
            out.append((f[0], f[1], f[2], f[3], f[5]))
        else:  # p_type, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_flags, p_align
            out.append((f[0], f[6], f[1], f[2], f[4]))
    return out


class _Mapped:
    """Reads by virtual address through the ``PT_LOAD`` segments, as the loader maps them."""

    def __init__(self, stream: IO[bytes], loads: list[tuple[int, ...]]) -> None:
        self.stream = stream
        self.loads = loads

    def offset(self, vaddr: int, size: int = 1) -> int:
        for _, _, off, addr, filesz in self.loads:
            if addr <= vaddr and vaddr + size <= addr + filesz:
                return off + vaddr - addr
        raise LoaderError(f"address {vaddr:#x} is in no loaded segment")

    def read(self, vaddr: int, size: int) -> bytes:
        self.stream.seek(self.offset(vaddr, max(size, 1)))
        data = self.stream.read(size)
        if len(data) != size:
            raise LoaderError(f"the file ends inside {size} bytes at address {vaddr:#x}")
        return data


def _count_gnu_hash(m: _Mapped, addr: int, elfclass: int, end: str) -> int:
    header: tuple[int, int, int, int] = struct.unpack(end + "IIII", m.read(addr, 16))
    nbuckets, symoffset, bloom_size, _ = header
    if nbuckets > MAX_SYMBOLS or bloom_size > MAX_SYMBOLS:
        raise LoaderError("its DT_GNU_HASH table is implausibly large")
    buckets_at = addr + 16 + bloom_size * (8 if elfclass == 64 else 4)
    buckets: tuple[int, ...] = struct.unpack(end + f"{nbuckets}I", m.read(buckets_at, 4 * nbuckets))
    last = max(buckets, default=0)
    if last < symoffset:
        return symoffset  # no hashed (defined) symbol
    chain_at = buckets_at + 4 * nbuckets
    i = last
    while True:  # the last chain ends at the table's last symbol: its hash has bit 0 set
        if i - symoffset > MAX_SYMBOLS:
            raise LoaderError("its DT_GNU_HASH chains do not end")
        (h,) = struct.unpack(end + "I", m.read(chain_at + 4 * (i - symoffset), 4))
        if h & 1:
            return i + 1
        i += 1


def loader_view(elf: Any) -> LoaderView | None:
    """What the loader reads of ``elf``'s dynamic linking (a pyelftools ``ELFFile``; only its
    stream and header are used), or ``None`` when it has no ``PT_DYNAMIC`` (a relocatable
    object, a cubin, a static executable).  Cached on ``elf``.  Raises :class:`LoaderError`
    where the loader would fail too (an address outside every loaded segment, a table cut
    short)."""
    cached = getattr(elf, "_cumatrix_loader_view", _UNREAD)
    if cached is not _UNREAD:
        return cast(LoaderView | None, cached)
    view = _read(elf)
    with contextlib.suppress(AttributeError):  # a reader with __slots__ reads again
        elf._cumatrix_loader_view = view
    return view


def _read(elf: Any) -> LoaderView | None:
    stream, header = elf.stream, elf.header
    elfclass, end = elf.elfclass, "<" if elf.little_endian else ">"
    segs = _segments(stream, header, elfclass, end)
    dyn = [s for s in segs if s[0] == PT_DYNAMIC]
    if not dyn:
        return None
    m = _Mapped(stream, [s for s in segs if s[0] == PT_LOAD])
    tags = _dynamic_tags(stream, dyn[0], elfclass, end)
    first = _first_values(tags)
    strsz, text = _string_table(m, first)
    needed, soname = _names(tags, first, text)
    rpath = _search_path(tags, DT_RPATH, text)
    runpath = _search_path(tags, DT_RUNPATH, text)
    tables = [(m.offset(first[DT_STRTAB], strsz), strsz)]
    symbols, symtab = _symbols(m, first, elfclass, end, text)
    if symtab is not None:
        tables.append(symtab)
    versions = _versions(m, first, end, text) if DT_VERNEED in first else []
    return LoaderView(needed=needed, soname=soname, rpath=rpath, runpath=runpath,
                      symbols=tuple(symbols), versions_needed=tuple(versions),
                      tables=tuple(tables))


def _dynamic_tags(stream: IO[bytes], dyn: tuple[int, ...], elfclass: int,
                  end: str) -> list[tuple[int, int]]:
    """``(tag, value)`` of each entry of the ``PT_DYNAMIC`` segment ``dyn``, up to ``DT_NULL``."""
    _, _, doff, _, dsize = dyn
    entry = struct.Struct(end + ("qQ" if elfclass == 64 else "iI"))
    stream.seek(doff)
    raw = stream.read(min(dsize, MAX_DYNAMIC * entry.size))
    tags: list[tuple[int, int]] = []
    for tag, val in entry.iter_unpack(raw[: len(raw) - len(raw) % entry.size]):
        if tag == DT_NULL:
            break
        tags.append((tag, val))
    return tags


def _first_values(tags: list[tuple[int, int]]) -> dict[int, int]:
    """The value of each tag's first entry (the loader reads the first of a tag it holds one of)."""
    first: dict[int, int] = {}
    for tag, val in tags:
        first.setdefault(tag, val)
    return first


def _names(tags: list[tuple[int, int]], first: dict[int, int],
           text: Callable[[int], str]) -> tuple[tuple[str, ...], str | None]:
    """``DT_NEEDED``, in order, and ``DT_SONAME`` (``None`` without one)."""
    needed = tuple(text(v) for t, v in tags if t == DT_NEEDED)
    return needed, text(first[DT_SONAME]) if DT_SONAME in first else None


def _string_table(m: _Mapped, first: dict[int, int]) -> tuple[int, Callable[[int], str]]:
    """``DT_STRSZ`` and a reader of the string at an offset into ``DT_STRTAB``."""
    if DT_STRTAB not in first:
        raise LoaderError("its dynamic array has no DT_STRTAB")
    strsz = first.get(DT_STRSZ, 0)
    if not 0 < strsz <= MAX_STRINGS:
        raise LoaderError(f"its DT_STRSZ ({strsz}) is not a plausible size")
    strtab = m.read(first[DT_STRTAB], strsz)

    def text(off: int) -> str:
        if off >= len(strtab):
            raise LoaderError(f"a string offset ({off}) lies beyond DT_STRSZ")
        stop = strtab.find(b"\0", off)
        return strtab[off: stop if stop != -1 else len(strtab)].decode("utf-8", "replace")

    return strsz, text


def _search_path(tags: list[tuple[int, int]], kind: int,
                 text: Callable[[int], str]) -> tuple[str, ...]:
    """The directories of every ``kind`` (``DT_RPATH``, ``DT_RUNPATH``) entry, in order."""
    return tuple(p for t, v in tags if t == kind for p in text(v).split(":") if p)


def _symbol_count(m: _Mapped, first: dict[int, int], elfclass: int, end: str) -> int:
    """How many symbols ``DT_SYMTAB`` holds, as its hash table says."""
    if DT_HASH in first:
        count = struct.unpack(end + "II", m.read(first[DT_HASH], 8))[1]
    elif DT_GNU_HASH in first:
        count = _count_gnu_hash(m, first[DT_GNU_HASH], elfclass, end)
    else:
        count = 0  # no table says how many: the loader could look none of them up
    if count > MAX_SYMBOLS:
        raise LoaderError(f"its hash table declares {count} symbols")
    return int(count)


def _symbols(m: _Mapped, first: dict[int, int], elfclass: int, end: str,
             text: Callable[[int], str]
             ) -> tuple[list[tuple[str, bool, bool]], tuple[int, int] | None]:
    """The named non-local symbols of ``DT_SYMTAB``, as many as the hash table says."""
    if DT_SYMTAB not in first:
        return [], None
    count = _symbol_count(m, first, elfclass, end)
    sym = struct.Struct(end + ("IBBHQQ" if elfclass == 64 else "IIIBBH"))
    iname, iinfo, ishndx = (0, 1, 3) if elfclass == 64 else (0, 3, 5)
    data = m.read(first[DT_SYMTAB], count * sym.size) if count else b""
    out: list[tuple[str, bool, bool]] = []
    for f in sym.iter_unpack(data):
        if not f[iname] or f[iinfo] >> 4 == _STB_LOCAL:
            continue
        out.append((text(f[iname]), f[ishndx] != 0, f[iinfo] >> 4 == _STB_WEAK))
    return out, (m.offset(first[DT_SYMTAB]), len(data))


def _versions(m: _Mapped, first: dict[int, int], end: str,
              text: Callable[[int], str]) -> list[tuple[str, str]]:
    """``(library, version)`` of each ``DT_VERNEED`` entry (Elf_Verneed, Elf_Vernaux)."""
    out: list[tuple[str, str]] = []
    at, left = first[DT_VERNEED], min(first.get(DT_VERNEEDNUM, 0), MAX_DYNAMIC)
    while left > 0:
        _, cnt, vfile, aux, nxt = struct.unpack(end + "HHIII", m.read(at, 16))
        lib, a = text(vfile), at + aux
        for _ in range(min(cnt, MAX_DYNAMIC)):
            _, _, _, vname, anext = struct.unpack(end + "IHHII", m.read(a, 16))
            out.append((lib, text(vname)))
            if not anext:
                break
            a += anext
        left -= 1
        if not nxt:
            break
        at += nxt
    return out


def section_headers(elf: Any) -> list[tuple[str, Any]] | None:
    """``(name, header)`` of each section of ``elf``, or ``None`` where it has none or they
    cannot be made (a section linked to one of the wrong kind, as a retyped ``.dynsym``
    leaves ``.gnu.version``): then what the sections would tell is read from the segments,
    as the loader reads them, instead of failing the file."""
    try:
        if not elf.num_sections():
            return None
        # FastELFFile lists the headers without making a Section object for each.
        named = getattr(elf, "named_headers", None)
        return list(named()) if named else [(s.name, s.header) for s in elf.iter_sections()]
    except (ELFError, struct.error, ValueError, AssertionError):
        return None


def load_segments(elf: Any) -> list[tuple[int, int, int, int]]:
    """``(offset, size in the file, virtual address, flags)`` of each ``PT_LOAD`` segment of
    ``elf``, read from its program headers with :mod:`struct` (pyelftools' segment objects
    read the sections too, and fail where those are damaged); ``[]`` where they cannot be
    read."""
    try:
        segs = _segments(elf.stream, elf.header, elf.elfclass, "<" if elf.little_endian else ">")
    except LoaderError:
        return []
    return [(off, filesz, vaddr, flags) for kind, flags, off, vaddr, filesz in segs
            if kind == PT_LOAD]
