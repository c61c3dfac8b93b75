"""The prebuilt interposer: one ``libcuda.so.1`` for every host, configured per host without a compiler.

A platform wheel's build (``setup.py``) compiles ``cumatrix/data/interposer.c`` with
``-DCUMATRIX_RUNTIME_CONFIG`` into ``cumatrix/libexec/libcumatrix_cuda.so``: it defines a
trampoline for every driver entry point in ``cumatrix/data/driver_entry_points.h`` (each
resolved by ``dlsym`` on the real driver when loaded) and reads what the per-host build fixes
at compile time (the emulated version, the real driver's path, the PTX ceiling, the
``cuGetProcAddress`` names to hide) from a block in ``.data`` that starts with
:data:`CONFIG_MAGIC`.  Per host and emulated version, :func:`patch_interposer` copies it and,
with plain file I/O at offsets pyelftools finds:

* writes that block;
* makes every export the copy must not have (introduced after the emulated version, or absent
  from the real driver) ``STB_LOCAL`` in ``.dynsym``.  glibc's symbol lookup ignores local
  symbols (``elf/dl-lookup.c``, ``do_lookup_x``), so ``dlsym`` and the dynamic linker fail on
  such a name exactly as on a missing one (``undefined symbol: NAME``), and our own readers of
  exports (:func:`cumatrix.provision.drivers.exported_functions`) count only global and weak
  definitions.

What the prebuilt cannot do is export a name it was not built with: where the real driver
exports one that is not in the list, :func:`cumatrix.provision.drivers.build_interposer` says
so on the result (``missing``) and every cell under that emulated driver records it.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

#: The file name of the prebuilt in ``cumatrix/libexec/`` (a platform wheel).
PREBUILT_NAME = "libcumatrix_cuda.so"
#: Where the wheel's build puts it (``cumatrix.execute.prebuilt.LIBEXEC``; the stages below
#: ``execute`` cannot import it).
LIBEXEC = Path(__file__).resolve().parents[1] / "libexec"
#: How ``setup.py`` compiles it (the same flags as the per-host build, plus the mode).
COMPILE_FLAGS = ("-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-DCUMATRIX_RUNTIME_CONFIG")

#: ``struct cumatrix_config`` of interposer.c (its _Static_asserts pin the same offsets).
CONFIG_MAGIC = b"cumatrix-interposer-config-v1\0"
_MAGIC_BYTES = 32
_PATH_BYTES = 4096
_HIDDEN_BYTES = 32768
_CONFIG_HEAD = struct.Struct("<iiii")

_STB_LOCAL = 0
_X_RE = re.compile(r"^\s*X\(([A-Za-z_][A-Za-z0-9_]*)\)", re.MULTILINE)


class PatchError(Exception):
    """The prebuilt is not the file this module writes into (no config block, no .dynsym)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeConfig:
    """What a per-host copy of the prebuilt is told (the per-host build's generated header)."""

    version: int  # EMULATED_VERSION
    ptx_ceiling: int  # PTX_CEILING
    real_libcuda: Path  # REAL_PATH
    has_gpa: bool  # HAS_GET_PROC_ADDRESS
    has_gpa_v2: bool  # HAS_GET_PROC_ADDRESS_V2
    hidden_bases: tuple[str, ...]  # HIDDEN

    def to_bytes(self) -> bytes:
        """The block as interposer.c lays it out; :class:`PatchError` where a field does not fit."""
        path = str(self.real_libcuda).encode()
        if len(path) >= _PATH_BYTES:
            raise PatchError(f"the real driver's path is longer than {_PATH_BYTES - 1} bytes: {self.real_libcuda}")
        hidden = b"".join(n.encode() + b"\0" for n in self.hidden_bases) + b"\0"
        if len(hidden) > _HIDDEN_BYTES:
            raise PatchError(f"{len(self.hidden_bases)} hidden cuGetProcAddress names take {len(hidden)} bytes, "
                             f"more than the prebuilt's {_HIDDEN_BYTES}")
        return b"".join([CONFIG_MAGIC.ljust(_MAGIC_BYTES, b"\0"),
                         _CONFIG_HEAD.pack(self.version, self.ptx_ceiling, int(self.has_gpa), int(self.has_gpa_v2)),
                         path.ljust(_PATH_BYTES, b"\0"), hidden.ljust(_HIDDEN_BYTES, b"\0")])


def prebuilt_interposer() -> Path | None:
    """``cumatrix/libexec/libcumatrix_cuda.so`` when the installed package carries it."""
    p = LIBEXEC / PREBUILT_NAME
    return p if p.is_file() else None


def entry_points() -> tuple[str, ...]:
    """The entry points the prebuilt forwards (``cumatrix/data/driver_entry_points.h``)."""
    text = resources.files("cumatrix").joinpath("data/driver_entry_points.h").read_text()
    return tuple(_X_RE.findall(text))


def entry_points_header(names: Iterable[str], *, source: str) -> str:
    """The text of ``driver_entry_points.h`` for ``names`` (sorted), saying where they came from."""
    rows = "".join(f"    X({n}) \\\n" for n in sorted(set(names)))
    return ("/* The CUDA driver's entry points the prebuilt interposer forwards (interposer.c built with\n"
            " * -DCUMATRIX_RUNTIME_CONFIG): " + source + ",\n"
            " * less those interposer.c defines itself.  Written by\n"
            " * cumatrix.provision.prebuilt_driver.entry_points_header; a test checks it against those\n"
            " * headers.  Data, one X(name) a line. */\n"
            "#define CUMATRIX_DRIVER_ENTRY_POINTS(X) \\\n" + rows + "\n")


def patch_interposer(prebuilt: Path, dest: Path, config: RuntimeConfig, hide: Collection[str]) -> None:
    """Write a copy of ``prebuilt`` to ``dest`` with ``config`` in its block and every name of
    ``hide`` made local in its ``.dynsym``; :class:`PatchError` if ``prebuilt`` has no block."""
    data = bytearray(prebuilt.read_bytes())
    with prebuilt.open("rb") as fh:
        elf = ELFFile(fh)
        if elf.elfclass != 64 or not elf.little_endian:
            raise PatchError(f"{prebuilt}: not a 64-bit little-endian ELF file")
        at = _config_offset(elf, bytes(data), prebuilt)
        block = config.to_bytes()
        data[at:at + len(block)] = block
        for offset in _symbol_info_offsets(elf, hide, prebuilt):
            data[offset] = (_STB_LOCAL << 4) | (data[offset] & 0xF)  # the binding, the type kept
    dest.write_bytes(bytes(data))


def _config_offset(elf: ELFFile, data: bytes, path: Path) -> int:
    sec = elf.get_section_by_name(".data")
    if sec is None:
        raise PatchError(f"{path}: no .data section: not a prebuilt interposer")
    start, size = int(sec["sh_offset"]), int(sec["sh_size"])
    found = [m.start() for m in re.finditer(re.escape(CONFIG_MAGIC), data[start:start + size])]
    if len(found) != 1:
        raise PatchError(f"{path}: {len(found)} config blocks in .data, want one: not a prebuilt interposer")
    at = start + found[0]
    if at + _MAGIC_BYTES + _CONFIG_HEAD.size + _PATH_BYTES + _HIDDEN_BYTES > start + size:
        raise PatchError(f"{path}: the config block runs past .data")
    return at


def _symbol_info_offsets(elf: ELFFile, names: Collection[str], path: Path) -> list[int]:
    """The file offset of ``st_info`` of each defined ``.dynsym`` entry named in ``names``."""
    dynsym = elf.get_section_by_name(".dynsym")
    if not isinstance(dynsym, SymbolTableSection):
        raise PatchError(f"{path}: no .dynsym")
    base, entsize = int(dynsym["sh_offset"]), int(dynsym["sh_entsize"])
    wanted = set(names)
    out = []
    for i, sym in enumerate(dynsym.iter_symbols()):
        if sym.name in wanted and sym["st_shndx"] != "SHN_UNDEF":
            # Elf64_Sym: st_name (4 bytes), then st_info
            out.append(base + i * entsize + 4)
    return out
