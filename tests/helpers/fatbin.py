"""Fat binaries written byte by byte, in the layout nvcc writes (cumatrix.binary.fatbin's
docstring: a 16-byte container header, then per entry a 64-byte header and its payload), and
cubins as small ELF files whose symbol table names kernels the way ptxas marks them
(``STT_FUNC`` with ``st_other`` 0x10, ``STO_CUDA_ENTRY``; a ``__device__`` function has no mark,
as ``readelf -s`` shows on a cubin nvcc 13.0 builds).  The code in them is no real SASS: the
gate reads only headers, symbols and PTX directives, which are what these carry.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from helpers.build import shared_library

FLAG_64BIT_LINUX = 0x11
FLAG_LZ4 = 0x2000
FLAG_ZSTD = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000


def cubin(kernels: Sequence[str], device_functions: Sequence[str] = ()) -> bytes:
    """A 64-bit ELF file with ``.shstrtab``, ``.strtab`` and ``.symtab``: each of ``kernels`` a
    global function symbol marked as an entry, each of ``device_functions`` a local one."""
    shstr = b"\0.shstrtab\0.strtab\0.symtab\0.text\0"
    strtab = b"\0"
    syms = [struct.pack("<IBBHQQ", 0, 0, 0, 0, 0, 0)]
    for name, entry in [*((d, False) for d in device_functions), *((k, True) for k in kernels)]:
        off = len(strtab)
        strtab += name.encode() + b"\0"
        bind = 1 if entry else 0  # STB_GLOBAL, STB_LOCAL
        syms.append(struct.pack("<IBBHQQ", off, bind << 4 | 2, 0x10 if entry else 0, 4, 0, 16))
    symtab = b"".join(syms)
    text = b"\0" * 16
    body_at = 64
    parts = [shstr, strtab, symtab, text]
    offsets = []
    pos = body_at
    for p in parts:
        pos += -pos % 8
        offsets.append(pos)
        pos += len(p)
    pos += -pos % 8
    shoff = pos
    out = bytearray(shoff + 5 * 64)
    struct.pack_into("<4sBBBBB7xHHIQQQIHHHHHH", out, 0, b"\x7fELF", 2, 1, 1, 0x33, 7, 2, 190, 1,
                     0, 0, shoff, 0x5500550, 64, 0, 0, 64, 5, 1)
    for p, off in zip(parts, offsets, strict=True):
        out[off:off + len(p)] = p
    first_local = 1 + len(device_functions)
    headers = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0),
        (1, 3, 0, offsets[0], len(shstr), 0, 0, 1, 0),  # .shstrtab
        (11, 3, 0, offsets[1], len(strtab), 0, 0, 1, 0),  # .strtab
        (19, 2, 0, offsets[2], len(symtab), 2, first_local, 8, 24),  # .symtab -> .strtab
        (27, 1, 6, offsets[3], len(text), 0, 0, 128, 0),  # .text (alloc, exec)
    ]
    for i, (name, kind, flags, off, size, link, info, align, entsize) in enumerate(headers):
        struct.pack_into("<IIQQQQIIQQ", out, shoff + 64 * i, name, kind, flags, 0, off, size,
                         link, info, align, entsize)
    return bytes(out)


def ptx(kernels: Sequence[str], version: str = "8.0", target: str = "sm_90") -> bytes:
    """PTX text declaring each of ``kernels`` as an ``.entry``."""
    body = "".join(f".visible .entry {k}()\n{{\n\tret;\n}}\n" for k in kernels)
    return f".version {version}\n.target {target}\n.address_size 64\n\n{body}".encode() + b"\0"


@dataclass(frozen=True)
class Entry:
    """One entry: ``kind`` "sass" or "ptx", SM number, its code, a/f variant, compression."""

    kind: str
    sm: int
    code: bytes
    variant: str = ""
    compress: str = ""  #: "", "lz4" or "zstd"
    corrupt: bool = False  #: compressed bytes that do not inflate


def _compressed(e: Entry) -> tuple[bytes, int]:
    if e.compress == "lz4":
        import lz4.block

        data = lz4.block.compress(e.code, store_size=False)
        flag = FLAG_LZ4
    elif e.compress == "zstd":
        import zstandard

        data = zstandard.ZstdCompressor().compress(e.code)
        flag = FLAG_ZSTD
    else:
        return e.code, 0
    if e.corrupt:
        data = b"\xff" * len(data)
    return data, flag


def container(entries: Sequence[Entry]) -> bytes:
    """One fat binary container (one module) holding ``entries``."""
    body = b""
    for e in entries:
        payload, flag = _compressed(e)
        pad = payload + b"\0" * (-len(payload) % 8)
        flags = FLAG_64BIT_LINUX | flag | (FLAG_ARCH_SPECIFIC if e.variant == "a" else 0) | (
            FLAG_FAMILY if e.variant == "f" else 0)
        kind = 2 if e.kind == "sass" else 1
        version = 0x80000 if kind == 1 else 0x10008
        body += struct.pack("<HHIIIIIIIIIQQQ", kind, 0x101, 64, len(pad), 0,
                            len(payload) if flag else 0, 0, version, e.sm, 0, 0, flags, 0,
                            len(e.code) if flag else 0) + pad
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def sass(sm: int, kernels: Sequence[str], variant: str = "", compress: str = "",
         corrupt: bool = False) -> Entry:
    return Entry("sass", sm, cubin(kernels), variant, compress, corrupt)


def library(out: Path, modules: Sequence[Sequence[Entry]],
            in_data: Sequence[Sequence[Entry]] = ()) -> Path:
    """A shared object built by gcc whose ``.nv_fatbin`` section holds one container per
    module of ``modules``, in order; ``in_data``: containers kept in its read-only data
    instead, as a library that loads its own kernels keeps them (cuFFT)."""
    source = "int present(void) { return 1; }\n"
    for i, (section, mods) in enumerate(((".nv_fatbin", modules), (".rodata", in_data))):
        if not mods:
            continue
        array = ",".join(str(b) for b in b"".join(container(m) for m in mods))
        where = f'section("{section}"), ' if section == ".nv_fatbin" else ""
        source += (f"__attribute__(({where}aligned(8), used)) "
                   f"static const unsigned char blob{i}[] = {{{array}}};\n"
                   f"const void *get{i}(void) {{ return blob{i}; }}\n")
    return shared_library(out, source)
