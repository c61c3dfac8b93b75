"""The device code of an ELF file: which SASS and PTX its ``.nv_fatbin`` section carries.

A fat binary is a run of containers, each a 16-byte header (magic ``0xBA55ED50``, version,
header size, size of the entries that follow) and entries of one header each (kind 1 PTX,
2 SASS cubin; the header's size, the padded payload size, the compressed payload size, the
code version, the SM number, flags, the uncompressed size) followed by the payload.  Only
the headers are read, so compressed entries (zstd: nvcc 13's ``--compress-mode`` default,
``size`` and ``balance``; LZ4: nvcc before 12.8 and ``speed``) cost nothing
to list: the payload is skipped with a seek.  The layout was checked against the fat binaries
nvcc 13.0 writes for ``sm_80``, ``sm_90a``, ``sm_100a``, ``sm_100f``, ``compute_90`` and
``compute_120``, compressed and not (``tests/unit/test_fatbin.py`` builds them).

What a GPU of compute capability X.Y can run (CUDA C++ Programming Guide, "Binary
Compatibility" and "PTX Compatibility"; "Feature Availability" for ``a`` and ``f``):

* SASS for ``sm_XZ`` runs on X.Y when Z <= Y: later minors of the same major only;
* SASS for ``sm_XYa`` (arch-specific) runs only on X.Y itself; ``sm_XYf`` (family-specific)
  on later minors of the same major, like plain SASS;
* PTX for ``compute_P`` is compiled by the driver for any GPU of capability >= P, but only
  by a driver that knows its PTX ISA version; ``compute_XYa`` PTX only on X.Y, ``compute_XYf``
  on later minors of X.
"""

from __future__ import annotations

import contextlib
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, Literal

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from cumatrix.binary.loader import load_segments, section_headers
from cumatrix.binary.ptx import ptx_isa_cuda, ptx_version
from cumatrix.binary.ranges import range_chunks

__all__ = [
    "DeviceCode",
    "FatbinError",
    "FatbinModule",
    "ModuleKernels",
    "covering",
    "cubin_kernels",
    "entry_payload",
    "file_device_code",
    "find_fatbin",
    "module_kernel",
    "module_kernels",
    "parse_arch",
    "ptx_isa_cuda",
    "read_fatbin",
    "read_fatbin_modules",
]

FATBIN_MAGIC = 0xBA55ED50
_CONTAINER = struct.Struct("<IHHQ")
# kind, version, header size, padded payload size, (unused), compressed payload size,
# (unused), code version (major << 16 | minor), SM number, (unused x2), flags, (unused),
# uncompressed payload size.
_ENTRY = struct.Struct("<HHIIIIIIIIIQQQ")
_KIND_PTX = 1
_KIND_SASS = 2
_FLAG_COMPRESSED_LZ4 = 0x2000
_FLAG_COMPRESSED_ZSTD = 0x8000
_FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a, sm_100a
_FLAG_FAMILY = 0x200000  # sm_100f
_MAX_ENTRIES = 1 << 20  # a bound on a crafted file, far above any real one (cuBLASLt: ~5k)
_PTX_HEAD = 65536  # the PTX read first for its .version

Variant = Literal["", "a", "f"]


class FatbinError(ValueError):
    """A ``.nv_fatbin`` section that does not parse."""


@dataclass(frozen=True, kw_only=True, slots=True, order=True)
class DeviceCode:
    """One entry of a fat binary."""

    kind: Literal["sass", "ptx"]
    arch: int  #: SM number: 90 for 9.0
    variant: Variant = ""  #: "a" arch-specific, "f" family-specific
    isa: tuple[int, int] | None = None  #: PTX ISA version (PTX entries)
    compressed: bool = False

    @property
    def name(self) -> str:
        """``sm_90a`` or ``compute_90``, as nvcc's ``-gencode`` spells it."""
        return f"{'sm' if self.kind == 'sass' else 'compute'}_{self.arch}{self.variant}"

    def label(self) -> str:
        if self.kind == "ptx" and self.isa is not None:
            return f"{self.name} (PTX ISA {self.isa[0]}.{self.isa[1]})"
        return self.name

    def runs_on(self, arch: int) -> bool:
        """Whether this entry can serve a GPU of SM number ``arch`` (module docstring)."""
        if self.variant == "a":
            return arch == self.arch
        if self.kind == "sass" or self.variant == "f":
            return arch // 10 == self.arch // 10 and arch >= self.arch
        return arch >= self.arch

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "arch": self.arch, "variant": self.variant,
                "isa": list(self.isa) if self.isa else None, "compressed": self.compressed}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> DeviceCode:
        isa = data.get("isa")
        kind = data["kind"]
        variant = data.get("variant", "")
        if kind not in ("sass", "ptx") or variant not in ("", "a", "f"):
            raise ValueError(f"not a device code record: {data!r}")
        return cls(kind=kind, arch=int(str(data["arch"])), variant=variant,
                   isa=(int(isa[0]), int(isa[1])) if isinstance(isa, list) else None,
                   compressed=bool(data.get("compressed", False)))


def parse_arch(text: str) -> tuple[int, Variant]:
    """``"9.0"``, ``"9.0a"``, ``"90"``, ``"sm_90a"`` -> ``(90, "a")``.

    The ``+PTX`` suffix of ``TORCH_CUDA_ARCH_LIST`` is accepted and ignored (it says what to
    build, not which GPUs to cover).  Raises :class:`ValueError` on anything else.
    """
    t = text.strip().removesuffix("+PTX").removeprefix("sm_").removeprefix("compute_")
    m = re.fullmatch(r"(\d{1,2})\.(\d)([af]?)|(\d{2,3})([af]?)", t)
    if not m:
        raise ValueError(f"not a GPU architecture: {text!r} (want e.g. 8.0, 9.0a or sm_90)")
    if m.group(1) is not None:
        arch, suffix = int(m.group(1)) * 10 + int(m.group(2)), m.group(3)
    else:
        arch, suffix = int(m.group(4)), m.group(5)
    if suffix == "a":
        return arch, "a"
    if suffix == "f":
        return arch, "f"
    return arch, ""


def covering(codes: tuple[DeviceCode, ...], arch: int) -> tuple[list[DeviceCode], list[DeviceCode]]:
    """The SASS and the PTX entries of ``codes`` that can serve SM ``arch``."""
    sass = [c for c in codes if c.kind == "sass" and c.runs_on(arch)]
    ptx = [c for c in codes if c.kind == "ptx" and c.runs_on(arch)]
    return sass, ptx


def _read_exact(stream: IO[bytes], offset: int, n: int) -> bytes:
    stream.seek(offset)
    data = stream.read(n)
    if len(data) != n:
        raise FatbinError(f"fat binary cut short at offset {offset:#x}")
    return data


def _ptx_isa(stream: IO[bytes], payload: int, size: int, version: int,
             compressed: bool) -> tuple[int, int] | None:
    if not compressed and size > 0:
        # Read as the driver's JIT reads it (:func:`ptx_version`): any number of comment lines
        # may come first, so a head that decides nothing is followed by the whole payload.
        head = _read_exact(stream, payload, min(size, _PTX_HEAD))
        if size > len(head):
            head = head[:head.rfind(b"\n") + 1]  # whole lines only: a directive is never cut
        isa = ptx_version(head)
        if isa is None and size > _PTX_HEAD:
            isa = ptx_version(_read_exact(stream, payload, size))
        if isa is not None:
            return isa
    if version:
        return version >> 16, version & 0xFFFF
    return None


def read_fatbin(stream: IO[bytes], start: int, size: int) -> tuple[DeviceCode, ...]:
    """Every entry of the fat binaries in ``stream[start:start + size]``, in order.

    Reads headers only (payloads are skipped).  Raises :class:`FatbinError` when the
    section does not parse.
    """
    out: list[DeviceCode] = []
    pos, end = start, start + size
    while pos + _CONTAINER.size <= end:
        magic, _, header_size, body = _CONTAINER.unpack(_read_exact(stream, pos, _CONTAINER.size))
        if magic != FATBIN_MAGIC:
            if magic == 0 and not out:
                pos += 8  # alignment padding before a container
                continue
            if magic == 0:
                break  # padding at the end of the section
            raise FatbinError(f"no fat binary magic at offset {pos - start:#x} of .nv_fatbin")
        if header_size < _CONTAINER.size or pos + header_size + body > end:
            raise FatbinError(f"fat binary at offset {pos - start:#x} overruns .nv_fatbin")
        cend = pos + header_size + body
        _read_container(stream, start, pos + header_size, cend, out)
        pos = cend
    return tuple(out)


def _variant(flags: int) -> Variant:
    """An entry's variant, by its flags: ``"a"`` arch-specific, ``"f"`` family-specific."""
    if flags & _FLAG_ARCH_SPECIFIC:
        return "a"
    return "f" if flags & _FLAG_FAMILY else ""


def _read_container(stream: IO[bytes], start: int, entry: int, cend: int,
                    out: list[DeviceCode]) -> None:
    """Append to ``out`` the entries of one fat binary container, from its first entry header
    at ``entry`` to its end ``cend`` (offsets in ``stream``; ``start``: the section's)."""
    while entry + _ENTRY.size <= cend:
        if len(out) >= _MAX_ENTRIES:
            raise FatbinError(f"more than {_MAX_ENTRIES} fat binary entries")
        (kind, _, ehs, padded, _, csize, _, version, sm, _, _, flags, _,
         _) = _ENTRY.unpack(_read_exact(stream, entry, _ENTRY.size))
        if ehs < _ENTRY.size or entry + ehs + padded > cend:
            raise FatbinError(f"fat binary entry at offset {entry - start:#x} overruns "
                              "its container")
        compressed = bool(flags & (_FLAG_COMPRESSED_LZ4 | _FLAG_COMPRESSED_ZSTD))
        variant = _variant(flags)
        if kind == _KIND_SASS:
            out.append(DeviceCode(kind="sass", arch=sm, variant=variant,
                                  compressed=compressed))
        elif kind == _KIND_PTX:
            psize = csize if compressed and csize else padded
            out.append(DeviceCode(kind="ptx", arch=sm, variant=variant,
                                  isa=_ptx_isa(stream, entry + ehs, psize, version,
                                               compressed),
                                  compressed=compressed))
        entry += ehs + padded


_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
_SEGMENT_SCAN = 16 << 20  # bytes of a segment read at a time when looking for the magic
_PF_X = 1


def find_fatbin(elf: ELFFile) -> tuple[int, int, bool] | None:
    """Where ``elf``'s device code lies: ``(offset, size, by_name)``.  The ``.nv_fatbin``
    section where the file has section headers (``by_name`` true); without them (a table
    stripped or never written: the loader reads program headers only, and registers the
    fat binary through a pointer in the data, never through the section), the first fat
    binary container found by its magic, 8-byte aligned, in a loadable non-executable
    segment, running to that segment's end (so too where the sections cannot be made:
    :func:`cumatrix.binary.loader.section_headers`) (``by_name`` false: the run of containers ends
    where none follows).  ``None`` where there is none."""
    pairs = section_headers(elf)
    if pairs is not None:
        for name, h in pairs:
            if name == ".nv_fatbin":
                return None if h.sh_type == "SHT_NOBITS" else (h.sh_offset, h.sh_size, True)
        return None
    for start, size, _, flags in load_segments(elf):
        if not flags & _PF_X:
            found = _container_in_segment(elf.stream, start, size)
            if found is not None:
                return found
    return None


def _container_in_segment(stream: IO[bytes], start: int, size: int) -> tuple[int, int, bool] | None:
    """``(offset, size, False)`` of the first fat binary container in the segment
    ``stream[start:start + size]`` (:func:`find_fatbin`), or ``None``."""
    for pos, chunk in range_chunks(stream, start, size, _SEGMENT_SCAN, overlap=_CONTAINER.size):
        at = chunk.find(_MAGIC_BYTES)
        while at != -1:
            if _is_container(chunk, at, start + pos, size - pos):
                return start + pos + at, size - pos - at, False
            at = chunk.find(_MAGIC_BYTES, at + 1)
    return None


def _is_container(chunk: bytes, at: int, offset: int, left: int) -> bool:
    """Whether the magic at ``chunk[at]`` (``chunk`` read at ``offset``, ``left`` bytes of its
    segment from there) starts an 8-byte aligned container header that fits the segment."""
    if (offset + at) % 8 or at + _CONTAINER.size > len(chunk):
        return False
    _, _, header_size, body = _CONTAINER.unpack_from(chunk, at)
    return bool(header_size == _CONTAINER.size and at + header_size + body <= left)


def file_device_code(path: str | BinaryIO) -> tuple[DeviceCode, ...]:
    """The entries of the ``.nv_fatbin`` section of the ELF file at ``path`` (or an open,
    seekable binary file: a caller reading a file a cell could replace opens it its own safe
    way): none where it has no such section, is no ELF file, cannot be read or does not parse
    (the observation of a cell reads what its processes mapped, and a file it cannot read says
    nothing of them)."""
    try:
        with contextlib.ExitStack() as stack:
            fh = stack.enter_context(Path(path).open("rb")) if isinstance(path, str) else path
            if fh.read(4) != b"\x7fELF":
                return ()
            where = find_fatbin(ELFFile(fh))
            if where is None:
                return ()
            start, size, by_name = where
            if by_name:
                return read_fatbin(fh, start, size)
            return tuple(c for m in read_fatbin_modules(fh, start, size, strict=False)
                         for c in m.codes)
    except (OSError, ELFError, FatbinError, ValueError):
        return ()


# ------------------------------------------------------------------ one module at a time
# Each translation unit nvcc compiles registers its own fat binary container
# (__cudaRegisterFatBinary), so a container is a module: a kernel launched from it runs only
# where one of *its* entries runs.  These functions leave the whole-section reading above as
# it is and read the same containers one by one.

_PTX_ENTRY_RE = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$%]{0,1023})")
#: The largest entry inflated to read its kernels: far above any cubin seen (cuBLASLt's
#: largest, 11 MiB; TensorRT's, 60 MiB), low enough that a crafted size cannot exhaust memory.
MAX_INFLATED = 512 << 20
_STO_CUDA_ENTRY = 0x10  # st_other of a cubin's kernel (entry function) symbol
_STT_FUNC = 2
_SHT_SYMTAB = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class FatbinModule:
    """One fat binary container of a ``.nv_fatbin`` section: the device code of one module."""

    offset: int  #: of the container in the stream
    size: int  #: the container's bytes, header included
    codes: tuple[DeviceCode, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModuleKernels:
    """The kernels of one module, as its code names them."""

    names: tuple[str, ...]  #: sorted; empty when the module's code has no kernel
    unread: str | None = None  #: why no entry of the module could be read (then ``names`` is empty)


def read_fatbin_modules(stream: IO[bytes], start: int, size: int, *,
                        strict: bool = True) -> tuple[FatbinModule, ...]:
    """The containers of the fat binaries in ``stream[start:start + size]``, each with its
    entries (:func:`read_fatbin` of that container alone).  Raises :class:`FatbinError` as
    :func:`read_fatbin` does; with ``strict=False`` the run of containers simply ends where
    no container follows (a ``.nv_fatbin`` found by its magic inside a segment, which holds
    other data after it)."""
    out: list[FatbinModule] = []
    pos, end = start, start + size
    while pos + _CONTAINER.size <= end:
        magic, _, header_size, body = _CONTAINER.unpack(_read_exact(stream, pos, _CONTAINER.size))
        if magic == 0:
            if out:
                break  # padding at the end of the section
            pos += 8  # alignment padding before a container
            continue
        if magic != FATBIN_MAGIC or header_size < _CONTAINER.size or pos + header_size + body > end:
            if not strict and out:
                break
            raise FatbinError(f"no fat binary container at offset {pos - start:#x} of .nv_fatbin")
        length = header_size + body
        out.append(FatbinModule(offset=pos, size=length, codes=read_fatbin(stream, pos, length)))
        pos += length
    return tuple(out)


def _entries(stream: IO[bytes], module: FatbinModule) -> list[tuple[int, ...]]:
    head = _CONTAINER.unpack(_read_exact(stream, module.offset, _CONTAINER.size))[2]
    entry, cend = module.offset + head, module.offset + module.size
    out: list[tuple[int, ...]] = []
    while entry + _ENTRY.size <= cend:
        kind, _, ehs, padded, _, csize, _, _, _, _, _, flags, _, usize = _ENTRY.unpack(
            _read_exact(stream, entry, _ENTRY.size))
        if ehs < _ENTRY.size or entry + ehs + padded > cend:
            break
        out.append((kind, entry + ehs, padded, csize, flags, usize))
        entry += ehs + padded
    return out


def entry_payload(stream: IO[bytes], payload: int, padded: int, csize: int, flags: int,
                  usize: int) -> bytes:
    """An entry's code, inflated where it is compressed (LZ4 before CUDA 12.8, zstd from
    12.8 on: nvcc's ``--compress-mode``), at most :data:`MAX_INFLATED` bytes.  Raises
    :class:`FatbinError` with the reason when it cannot be read."""
    if not flags & (_FLAG_COMPRESSED_LZ4 | _FLAG_COMPRESSED_ZSTD):
        if padded > MAX_INFLATED:
            raise FatbinError(f"an entry of {padded >> 20} MiB, over the {MAX_INFLATED >> 20} "
                              "MiB read")
        return _read_exact(stream, payload, padded)
    if not 0 < csize <= padded:
        raise FatbinError(f"a compressed entry declares {csize} bytes in a payload of {padded}")
    if not 0 < usize <= MAX_INFLATED:
        raise FatbinError(f"a compressed entry declares {usize} bytes inflated (at most "
                          f"{MAX_INFLATED >> 20} MiB are read)")
    data = _read_exact(stream, payload, csize)
    if flags & _FLAG_COMPRESSED_ZSTD:
        import zstandard  # imported here: only modules that fail a check are ever inflated

        try:
            out = zstandard.ZstdDecompressor().decompress(data, max_output_size=usize)
        except zstandard.ZstdError as e:
            raise FatbinError(f"its zstd data does not inflate ({e})") from None
    else:
        import lz4.block  # deferred: only modules that fail a check are ever inflated

        # An LZ4 block (no frame), inflated into at most the declared size: a block that
        # would write more fails instead.
        try:
            out = lz4.block.decompress(data, uncompressed_size=usize)
        except lz4.block.LZ4BlockError as e:
            raise FatbinError(f"its LZ4 data does not inflate ({e})") from None
    if len(out) != usize:
        raise FatbinError(f"it inflates to {len(out)} bytes, not the {usize} declared")
    return out


def cubin_kernels(data: bytes) -> tuple[str, ...]:
    """The kernels a cubin defines: its function symbols marked as entries (``st_other``
    ``STO_CUDA_ENTRY``, 0x10; a ``__device__`` function has no mark), else the names of its
    ``.nv.info.<kernel>`` sections.  Raises :class:`FatbinError` when it is no 64-bit
    little-endian ELF file or its tables lie outside it."""
    sections, shstrndx = _cubin_sections(data)
    shnum = len(sections)

    def blob(i: int) -> bytes:
        _, _, _, _, off, size, _, _, _, _ = sections[i]
        if off + size > len(data):
            raise FatbinError("a section of its cubin lies outside it")
        return data[off:off + size]

    found: set[str] = set()
    for i, (_, sh_type, _, _, _, _, link, _, _, entsize) in enumerate(sections):
        if sh_type == _SHT_SYMTAB and entsize == 24 and link < shnum:
            found |= _entry_symbols(blob(i), blob(link))
    if not found:
        found = _info_kernels(blob(shstrndx), sections)
    return tuple(sorted(found))


def _cubin_sections(data: bytes) -> tuple[list[tuple[int, ...]], int]:
    """The section headers of a cubin (:func:`cubin_kernels`), checked to lie inside it, and
    the index of its section name table."""
    if data[:6] != b"\x7fELF\x02\x01" or len(data) < 64:
        raise FatbinError("its cubin is no 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize != 64 or shoff + shnum * 64 > len(data) or shstrndx >= max(shnum, 1):
        raise FatbinError("its cubin's section table lies outside it")
    return [struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * i) for i in range(shnum)], shstrndx


def _info_kernels(names: bytes, sections: list[tuple[int, ...]]) -> set[str]:
    """The kernels named by a cubin's ``.nv.info.<kernel>`` sections (``names``: its section
    name table)."""
    return {n.removeprefix(".nv.info.") for s in sections
            if (n := _cstring(names, s[0])).startswith(".nv.info.")}


def _entry_symbols(symtab: bytes, strtab: bytes) -> set[str]:
    """The names of the function symbols of a cubin's ``symtab`` marked as kernel entries."""
    found: set[str] = set()
    for st_name, info, other, _, _, _ in struct.iter_unpack(
            "<IBBHQQ", symtab[: len(symtab) - len(symtab) % 24]):
        if info & 0xF == _STT_FUNC and other & _STO_CUDA_ENTRY and st_name:
            found.add(_cstring(strtab, st_name))
    return found


def _cstring(table: bytes, off: int) -> str:
    """The NUL-terminated string at ``off`` of ``table`` (to its end where none ends it)."""
    stop = table.find(b"\0", off)
    return table[off:stop if stop >= 0 else len(table)].decode("utf-8", "replace")


def module_kernels(stream: IO[bytes], module: FatbinModule) -> ModuleKernels:
    """The kernels of ``module``, read from one of its entries (every entry of a module is
    the same translation unit compiled for another target, so any names them all): the
    smallest cubin first, then PTX ``.entry`` directives; compressed entries are inflated
    (:func:`entry_payload`).  A module none of whose entries can be read has ``unread`` say
    why."""
    reasons: list[str] = []
    entries = sorted(_entries(stream, module), key=lambda e: (e[0] != _KIND_SASS, e[5] or e[2]))
    for kind, payload, padded, csize, flags, usize in entries:
        try:
            data = entry_payload(stream, payload, padded, csize, flags, usize)
            if kind == _KIND_SASS:
                return ModuleKernels(names=cubin_kernels(data))
            if kind == _KIND_PTX:
                return ModuleKernels(names=tuple(sorted(
                    {m.group(1).decode("ascii") for m in _PTX_ENTRY_RE.finditer(data)})))
        except FatbinError as e:
            reasons.append(str(e))
    return ModuleKernels(names=(), unread="; ".join(dict.fromkeys(reasons)) or "it has no entry")


def module_kernel(stream: IO[bytes], module: FatbinModule) -> str | None:
    """A kernel of ``module`` (:func:`module_kernels`); ``""`` when it has none (the CUDA
    runtime's own module: nothing to launch); ``None`` when it cannot be read."""
    k = module_kernels(stream, module)
    if k.unread is not None:
        return None
    return k.names[0] if k.names else ""
