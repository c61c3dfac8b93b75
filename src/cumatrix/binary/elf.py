"""Small pure functions over ELF files, read with pyelftools straight from a wheel.

The wheel's members are read as seekable streams without extracting the archive
(:mod:`cumatrix.binary.wheelmember`); here they are recognised as ELF files, checked for
plausible header tables, and read for what the gate needs: dynamic linking (as the loader
reads it, :mod:`cumatrix.binary.loader`), symbols, and the names in data sections.
"""

from __future__ import annotations

import re
import struct
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from cumatrix.binary.loader import LoaderError, LoaderView, load_segments, loader_view, section_headers
from cumatrix.binary.ranges import range_chunks
from cumatrix.binary.wheelmember import SPOOL_MAX, data_start, member_magic, open_member, spool_file

__all__ = [
    "ELF_MAGIC",
    "SPOOL_MAX",
    "data_ranges",
    "data_start",
    "elf_defined_symbols",
    "elf_needed",
    "elf_search_paths",
    "elf_soname",
    "elf_strings",
    "elf_undefined_symbols",
    "iter_wheel_elves",
    "member_magic",
    "open_member",
    "spool_file",
]

ELF_MAGIC = b"\x7fELF"

_SCAN_CHUNK = 4 << 20  # bytes of a section scanned at a time by elf_strings
_MAX_NAME = 512  # longest name elf_strings reports; also the overlap between chunks


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
    data, names = _dynsym_tables(elf, section)
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


def _dynsym_tables(elf: ELFFile, section: SymbolTableSection) -> tuple[bytes, bytes]:
    """The bytes of the ``.dynsym`` ``section`` and of its string table (bounded in size)."""
    strtab = elf.get_section(section["sh_link"])
    size, ssize = section["sh_size"], strtab["sh_size"]
    if size > _MAX_DYNSYM or ssize > _MAX_DYNSYM:
        raise ELFError(f".dynsym or its string table is implausibly large ({size}, {ssize})")
    stream = elf.stream
    stream.seek(section["sh_offset"])
    data = stream.read(size)
    stream.seek(strtab["sh_offset"])
    return data, stream.read(ssize)


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
    return _data_segments(elf, holes)


def _data_segments(elf: ELFFile, holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(offset, size)`` of the pieces of ``elf``'s loadable non-executable segments outside
    every ``(offset, size)`` of ``holes``."""
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
        for _, chunk in range_chunks(stream, start, size, _SCAN_CHUNK):
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
