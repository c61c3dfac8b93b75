"""The device code of an ELF file: which SASS and PTX its ``.nv_fatbin`` section carries.

A fat binary is a run of containers, each a 16-byte header (magic ``0xBA55ED50``, version,
header size, size of the entries that follow) and entries of one header each (kind 1 PTX,
2 SASS cubin; the header's size, the padded payload size, the compressed payload size, the
code version, the SM number, flags, the uncompressed size) followed by the payload.  Only
the headers are read, so compressed entries (LZ4 before CUDA 12.8, zstd after) cost nothing
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

from cumatrix.binary.ptx import ptx_isa_cuda, ptx_version

__all__ = [
    "DeviceCode",
    "FatbinError",
    "FatbinModule",
    "covering",
    "file_device_code",
    "module_kernel",
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
        entry, cend = pos + header_size, pos + header_size + body
        while entry + _ENTRY.size <= cend:
            if len(out) >= _MAX_ENTRIES:
                raise FatbinError(f"more than {_MAX_ENTRIES} fat binary entries")
            (kind, _, ehs, padded, _, csize, _, version, sm, _, _, flags, _,
             _) = _ENTRY.unpack(_read_exact(stream, entry, _ENTRY.size))
            if ehs < _ENTRY.size or entry + ehs + padded > cend:
                raise FatbinError(f"fat binary entry at offset {entry - start:#x} overruns "
                                  "its container")
            compressed = bool(flags & (_FLAG_COMPRESSED_LZ4 | _FLAG_COMPRESSED_ZSTD))
            variant: Variant = ("a" if flags & _FLAG_ARCH_SPECIFIC
                                else "f" if flags & _FLAG_FAMILY else "")
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
        pos = cend
    return tuple(out)


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
            elf = ELFFile(fh)
            section = elf.get_section_by_name(".nv_fatbin")
            if section is None or section["sh_type"] == "SHT_NOBITS":
                return ()
            return read_fatbin(fh, section["sh_offset"], section["sh_size"])
    except (OSError, ELFError, FatbinError, ValueError):
        return ()


# ------------------------------------------------------------------ one module at a time
# Each translation unit nvcc compiles registers its own fat binary container
# (__cudaRegisterFatBinary), so a container is a module: a kernel launched from it runs only
# where one of *its* entries runs.  These functions leave the whole-section reading above as
# it is and read the same containers one by one.

_SASS_KERNEL_RE = re.compile(rb"\.text\.([A-Za-z_$][\w$.]{0,255})\x00")
_PTX_ENTRY_RE = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]{0,255})")
_NAME_SCAN = 4 << 20  # bytes of a payload searched for a kernel name


@dataclass(frozen=True, kw_only=True, slots=True)
class FatbinModule:
    """One fat binary container of a ``.nv_fatbin`` section: the device code of one module."""

    offset: int  #: of the container in the stream
    size: int  #: the container's bytes, header included
    codes: tuple[DeviceCode, ...]


def read_fatbin_modules(stream: IO[bytes], start: int, size: int) -> tuple[FatbinModule, ...]:
    """The containers of the fat binaries in ``stream[start:start + size]``, each with its
    entries (:func:`read_fatbin` of that container alone).  Raises :class:`FatbinError` as
    :func:`read_fatbin` does."""
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
            raise FatbinError(f"no fat binary container at offset {pos - start:#x} of .nv_fatbin")
        length = header_size + body
        out.append(FatbinModule(offset=pos, size=length, codes=read_fatbin(stream, pos, length)))
        pos += length
    return tuple(out)


def module_kernel(stream: IO[bytes], module: FatbinModule) -> str | None:
    """A kernel of ``module`` as its uncompressed code names it (a cubin's ``.text.<kernel>``
    section, a PTX ``.entry``); ``""`` when its code, all of it read, has no kernel (the CUDA
    runtime's own module: nothing to launch); ``None`` when that cannot be told (compressed)."""
    head = _CONTAINER.unpack(_read_exact(stream, module.offset, _CONTAINER.size))[2]
    entry, cend = module.offset + head, module.offset + module.size
    known = True
    while entry + _ENTRY.size <= cend:
        kind, _, ehs, padded, _, csize, _, _, _, _, _, flags, _, usize = _ENTRY.unpack(
            _read_exact(stream, entry, _ENTRY.size))
        if ehs < _ENTRY.size or entry + ehs + padded > cend:
            return None
        payload: bytes | None = None
        if flags & _FLAG_COMPRESSED_ZSTD and 0 < csize <= padded and usize <= _NAME_SCAN:
            payload = _zstd(_read_exact(stream, entry + ehs, csize), usize)
        elif not flags & (_FLAG_COMPRESSED_LZ4 | _FLAG_COMPRESSED_ZSTD) and padded <= _NAME_SCAN:
            payload = _read_exact(stream, entry + ehs, padded)
        if payload is None:
            known = False  # LZ4 (CUDA before 12.8), or too large to read for a name
        else:
            m = (_SASS_KERNEL_RE if kind == _KIND_SASS else _PTX_ENTRY_RE).search(payload)
            if m:
                return m.group(1).decode("ascii")
        entry += ehs + padded
    return "" if known else None


def _zstd(data: bytes, size: int) -> bytes | None:
    """``data`` inflated (a zstd frame of at most ``size`` bytes), or ``None`` if it is not one."""
    # Imported here: only a module that fails a coverage check is ever inflated, and the
    # audit reads the rest of a fat binary's headers without it.
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    except zstandard.ZstdError:
        return None
