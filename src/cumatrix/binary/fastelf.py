"""A pyelftools :class:`ELFFile` that parses its section header table once.

pyelftools parses one section header through ``construct`` each time a section is asked
for, and ``iter_sections`` asks for every one: the audit's helpers walk the table several
times per file (names, ``.dynamic``, ``.dynsym``, string sections), so a CUDA cubin of
185 sections cost about 15 ms, most of a cubin-heavy wheel's audit.  :class:`FastELFFile`
unpacks the whole table with :mod:`struct` in one read, keeps the :class:`Section`
objects, and shares the ``construct`` structures between files of the same layout.  The
values are the ones pyelftools itself gives (``sh_type`` goes through pyelftools' own
mapping for the file's machine); any table that does not lie whole inside the file, or whose
entry size is not the standard one, is left to pyelftools, so a damaged file fails with
pyelftools' own error, as before.
"""

from __future__ import annotations

import io
import struct
from collections import namedtuple
from collections.abc import Iterator
from functools import cached_property
from typing import IO, Any

from elftools.construct.lib.container import Container
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import Section
from elftools.elf.structs import ELFStructs

__all__ = ["PYELFTOOLS_TESTED", "FastELFFile", "reader"]

#: The pyelftools releases whose internals this reader is checked against (its equivalence
#: tests pass there): it overrides ``_get_section_header``, ``_identify_file``,
#: ``_parse_elf_header`` and reads ``construct`` structures, none of them public API.
#: pyproject.toml pins pyelftools below the next release; tests/unit/test_fastelf.py fails on
#: any other, and :func:`reader` falls back to pyelftools' own ELFFile there.
PYELFTOOLS_TESTED = ("0.33",)

_SHDR_FORMAT = {32: "IIIIIIIIII", 64: "IIQQQQIIQQ"}

#: A section header's fields (Elf32_Shdr / Elf64_Shdr, in file order, System V gABI), as
#: pyelftools decodes them (``sh_type`` by name).
_Shdr = namedtuple("_Shdr", ("sh_name", "sh_type", "sh_flags", "sh_addr", "sh_offset",  # noqa: PYI024
                             "sh_size", "sh_link", "sh_info", "sh_addralign", "sh_entsize"))

# Built structures by file layout: create_advanced_structs took 1.3 ms a file.
_STRUCTS: dict[tuple[Any, ...], ELFStructs] = {}
_BASIC: dict[tuple[bool, int], ELFStructs] = {}


# sh_type value -> pyelftools' name for it, per built structures (the mapping depends on the
# machine): decoding through construct took a third of a cubin's section table.
_TYPES: dict[int, dict[int, Any]] = {}
# (REL, RELA) entry sizes per built structures: construct's sizeof walks the structure.
_REL_SIZES: dict[int, tuple[int, int]] = {}


def _decoded_types(structs: ELFStructs) -> dict[int, Any]:
    return _TYPES.setdefault(id(structs), {})


def _sh_type_adapter(structs: ELFStructs) -> Any:
    for sub in structs.Elf_Shdr.subcons:
        if sub.name == "sh_type":
            return sub
    raise LookupError("Elf_Shdr has no sh_type")  # pragma: no cover - pyelftools' layout


#: Section kinds whose pyelftools object is made without reading the file or checking a
#: field (Section, NullSection, StringTableSection, NoteSection); unknown numeric kinds (a
#: cubin's) stay ints and make a plain Section too.
_PLAIN_KINDS = frozenset({"SHT_NULL", "SHT_PROGBITS", "SHT_NOBITS", "SHT_STRTAB", "SHT_NOTE",
                          "SHT_INIT_ARRAY", "SHT_FINI_ARRAY", "SHT_PREINIT_ARRAY"})
_SYMBOL_KINDS = frozenset({"SHT_SYMTAB", "SHT_DYNSYM", "SHT_SUNW_LDYNSYM"})
_SHF_COMPRESSED = 0x800


def _plain_section(h: Any, name: str, table: list[Container],
                   rel_sizes: tuple[int, int]) -> bool:
    """Whether pyelftools makes this section's object without raising, by the checks its
    constructors make (elftools.elf.elffile._make_section and the classes it makes)."""
    kind = h.sh_type
    if h.sh_flags & _SHF_COMPRESSED:
        return False  # its compression header is read and parsed
    if isinstance(kind, int):
        return True
    if kind in _PLAIN_KINDS:
        return not (kind == "SHT_PROGBITS" and name == ".stab")
    if kind in ("SHT_REL", "SHT_RELA"):
        return bool(h.sh_entsize == rel_sizes[kind == "SHT_RELA"])
    if kind in _SYMBOL_KINDS:
        return _plain_symbol_table(h, table)
    return False  # dynamic, hash, version and other sections: pyelftools decides


def _plain_symbol_table(h: Any, table: list[Container]) -> bool:
    """Whether a symbol table's section is made without raising: linked to a plain string
    table, of whole entries."""
    link = h.sh_link
    if not 0 <= link < len(table):
        return False
    linked: Any = table[link]
    return bool(linked.sh_type == "SHT_STRTAB" and not linked.sh_flags & _SHF_COMPRESSED
                and h.sh_entsize > 0 and h.sh_size % h.sh_entsize == 0)


class FastELFFile(ELFFile):
    """:class:`ELFFile` with the section header table parsed once (same values)."""

    def __init__(self, stream: IO[bytes]) -> None:
        # ELFFile.__init__, with the construct structures shared between files.
        self.stream = stream
        self.stream.seek(0, io.SEEK_END)
        self.stream_len = self.stream.tell()
        self._identify_file()
        basic_key = (self.little_endian, self.elfclass)
        basic = _BASIC.get(basic_key)
        if basic is None:
            basic = ELFStructs(little_endian=self.little_endian, elfclass=self.elfclass)
            basic.create_basic_structs()
            _BASIC[basic_key] = basic
        self.structs = basic
        self.header = self._parse_elf_header()
        key = (*basic_key, self["e_type"], self["e_machine"], self["e_ident"]["EI_OSABI"])
        full = _STRUCTS.get(key)
        if full is None:
            full = ELFStructs(little_endian=self.little_endian, elfclass=self.elfclass)
            full.create_basic_structs()
            full.create_advanced_structs(*key[2:])
            _STRUCTS[key] = full
        self.structs = full
        self.stream.seek(0)
        self.e_ident_raw = self.stream.read(16)
        self.stream_loader = None
        self._headers: list[Any] | None = None
        self._containers: dict[int, Container] = {}
        self._sections: dict[int, Section] = {}
        self._names: bytes | None = None  # the section name table, read once
        self._all_made = False
        self._named: list[tuple[str, Container]] | None = None

    def _rows(self) -> list[Any]:
        """Every section header as a named tuple of pyelftools' values (a :class:`Container`
        is made only for a section pyelftools is asked for), or an empty list where
        pyelftools must parse them."""
        if self._headers is not None:
            return self._headers
        self._headers = []
        fmt = ("<" if self.little_endian else ">") + _SHDR_FORMAT[self.elfclass]
        size = struct.calcsize(fmt)
        shoff, shnum, shentsize = self["e_shoff"], self["e_shnum"], self["e_shentsize"]
        if (shoff <= 0 or shnum <= 0 or shentsize != size
                or shoff + shnum * size > self.stream_len):
            return self._headers  # the odd cases keep pyelftools' own reading and errors
        self.stream.seek(shoff)
        raw = self.stream.read(shnum * size)
        if len(raw) != shnum * size:
            return self._headers
        types = _decoded_types(self.structs)

        def decode(kind: int) -> Any:
            types[kind] = _sh_type_adapter(self.structs)._decode(kind, None)
            return types[kind]

        make = _Shdr._make
        # Concatenation, not unpacking: it is the faster of the two here (~35 rows a cubin).
        rows = [make((v[0], types[v[1]] if v[1] in types else decode(v[1])) + v[2:])  # noqa: RUF005
                for v in struct.iter_unpack(fmt, raw)]
        self._headers = rows
        return rows

    def _get_section_header(self, n: int) -> Container:
        rows = self._rows()
        if 0 <= n < len(rows):
            header = self._containers.get(n)
            if header is None:
                header = Container.__new__(Container)
                header.__dict__ = rows[n]._asdict()  # what Container(**fields) does
                self._containers[n] = header
            return header
        return super()._get_section_header(n)

    def _get_section_name(self, section_header: Container) -> str:
        # StringTableSection.get_string reads the name through the stream, one read per
        # section; the table is read once here.  A name that does not end inside the
        # table is left to pyelftools (it reads on past the table's end).
        if self._names is None:
            table = self._section_header_stringtable
            size = table["sh_size"]
            self._names = b""
            if table["sh_type"] != "SHT_NOBITS" and size <= self.stream_len:
                self.stream.seek(table["sh_offset"])
                self._names = self.stream.read(size)
        off = section_header.sh_name
        end = self._names.find(b"\0", off)
        if end < 0 or off >= len(self._names):
            return super()._get_section_name(section_header)
        s = self._names[off:end]
        return s.decode("utf-8", errors="replace") if s else ""

    def _make_all(self) -> None:
        # pyelftools makes every Section (in order) on the first walk of the table, and a
        # damaged one (a symbol table linked to a section that is not a string table) raises
        # there: made once here, so a damaged file fails as, and where, it did with ELFFile.
        # A table whose every section is of a kind pyelftools makes without reading or
        # checking anything further (_plain) cannot fail there: its objects are made only
        # when asked for (a cubin has ~35 sections; making them took most of its audit).
        if not self._all_made:
            if self._plain_names() is None:
                for i in range(self.num_sections()):
                    self.get_section(i)
            self._all_made = True

    def _plain_names(self) -> list[str] | None:
        """The section names, when making every section could not raise; else None."""
        table = self._rows()
        if not table:
            return None
        try:
            if self._names is None:
                self._get_section_name(self._get_section_header(0))  # reads the name table
        except Exception:  # noqa: BLE001 - left to pyelftools, which raises its own error
            return None
        blob = self._names
        assert blob is not None
        names: list[str] = []
        sizes = self._entry_sizes()
        for h in table:
            # As _get_section_name answers from the table it read (else pyelftools decides).
            off = h.sh_name
            end = blob.find(b"\0", off)
            if end < 0 or off >= len(blob):
                return None
            name = blob[off:end].decode("utf-8", errors="replace") if end > off else ""
            if not _plain_section(h, name, table, sizes):
                return None
            names.append(name)
        return names

    def _entry_sizes(self) -> tuple[int, int]:
        """The sizes pyelftools asserts for REL and RELA entries of this layout."""
        sizes = _REL_SIZES.get(id(self.structs))
        if sizes is None:
            sizes = _REL_SIZES[id(self.structs)] = (self.structs.Elf_Rel.sizeof(),
                                                    self.structs.Elf_Rela.sizeof())
        return sizes

    @cached_property
    def _section_name_map(self) -> dict[str, int]:
        # As ELFFile's (later sections win a shared name).
        if not self._rows():
            return super()._section_name_map
        return {name: i for i, (name, _) in enumerate(self.named_headers())}

    def named_headers(self) -> list[tuple[str, Any]]:
        """``(name, header)`` of every section, in order, as ``iter_sections`` gives them
        (each header's fields are attributes: ``header.sh_type``)."""
        table = self._rows()
        if not table:
            return [(s.name, s.header) for s in self.iter_sections()]
        if self._named is None:
            plain = self._plain_names()
            if plain is None:
                self._make_all()
                plain = [self.get_section(i).name for i in range(len(table))]
            self._all_made = True
            self._named = list(zip(plain, table, strict=True))
        return self._named

    def iter_sections(self, type: str | None = None) -> Iterator[Section]:
        """As :meth:`ELFFile.iter_sections`, from the kept sections."""
        get = self.get_section
        for i in range(self.num_sections()):
            section = get(i)
            if type is None or section["sh_type"] == type:
                yield section

    def get_section(self, n: int, type: Any = None) -> Section:
        """Section ``n`` (kept: asking again costs nothing)."""
        if type is None:
            section = self._sections.get(n)
            if section is None:
                section = super().get_section(n)
                self._sections[n] = section
            return section
        return super().get_section(n, type)


def reader() -> Any:
    """:class:`FastELFFile` on a pyelftools it was checked against, else pyelftools' own
    :class:`ELFFile` (slower, the same values)."""
    # deferred: the version is needed once, by the audit's members module
    import elftools

    return FastELFFile if elftools.__version__ in PYELFTOOLS_TESTED else ELFFile

