"""The audit reads an ELF file's dynamic linking as the loader does: program headers and
PT_DYNAMIC, never section headers (cumatrix.binary.loader), on shared objects gcc builds here.

A file whose section header table was stripped, or whose .dynsym/.dynamic sections were
renamed or retyped, loads and binds exactly as the original: it must be flagged the same.
The libcuda here is a STAND-IN link stub (this machine has no driver): it only gives the
linker a SONAME and a symbol to bind.
"""

from __future__ import annotations

import io
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from cumatrix.audit.static import AuditData, AuditSettings, audit_wheel
from cumatrix.binary.elf import elf_defined_symbols, elf_needed, elf_search_paths, elf_soname, elf_undefined_symbols
from cumatrix.binary.fatbin import find_fatbin, read_fatbin
from cumatrix.binary.loader import loader_view
from cumatrix.core.model import CudaVersion
from helpers.build import shared_library
from helpers.wheels import write_zip

if shutil.which("gcc") is None:
    pytest.skip("gcc is not on PATH (these tests build real ELF files)", allow_module_level=True)

SOURCE = r"""
extern int cuMemcpyBatchAsync(void *, void *, void *, unsigned long, void *, unsigned long *,
                              unsigned long, unsigned long *, void *);
extern int cuInit(unsigned);
__attribute__((weak)) extern int cuOptional(void);
int shim_version = 1;
extern char *getenv(const char *);
int batch(void *d) {
    cuInit(getenv("X") != 0);
    if (cuOptional) cuOptional();
    return cuMemcpyBatchAsync(d, d, d, 1, d, 0, 0, 0, d);
}
"""
STUB = "int cuInit(unsigned f) { return (int)f; }\nint cuMemcpyBatchAsync(void) { return 0; }\n"

# Facts small enough to type against: cuMemcpyBatchAsync came with CUDA 12.8.
DATA = AuditData(introductions={"cuInit": 2000, "cuMemcpyBatchAsync": 12080}, abi_changes={},
                 sources=())
SETTINGS = AuditSettings(min_driver=CudaVersion(12, 0))


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("loader")
    (d / "stubs").mkdir()
    shared_library(d / "stubs" / "libcuda.so", STUB, "-Wl,-soname,libcuda.so.1")
    return shared_library(d / "m.so", SOURCE, "-Lstubs", "-lcuda", "-Wl,-soname,libm_demo.so.3",
                          "-Wl,-rpath,$ORIGIN/../lib", "-Wl,--hash-style=gnu").read_bytes()


def _sections(b: bytes) -> list[tuple[int, int, int]]:
    """``(header offset, sh_name, sh_type)`` of each section header."""
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", b, 0x3A)
    return [(shoff + i * shentsize, *struct.unpack_from("<II", b, shoff + i * shentsize))
            for i in range(shnum)]


def strip_section_headers(elf: bytes) -> bytes:
    """The file with no section header table: e_shoff, e_shnum and e_shstrndx zeroed, the
    table itself cut off (it is the file's last part, as ld writes it)."""
    b = bytearray(elf)
    shoff, = struct.unpack_from("<Q", b, 0x28)
    struct.pack_into("<Q", b, 0x28, 0)
    struct.pack_into("<HH", b, 0x3C, 0, 0)  # e_shnum, e_shstrndx
    return bytes(b[:shoff])


def rename_dynamic_sections(elf: bytes) -> bytes:
    """The file with ``.dynsym`` and ``.dynamic`` renamed (``.xynsym``, ``.xynamic``) and
    retyped to PROGBITS, as a packer or obfuscator leaves them."""
    b = bytearray(elf)
    for name in (b".dynsym\0", b".dynamic\0"):
        at = b.find(name)
        assert at > 0
        b[at + 1] = ord("x")
    for off, _, kind in _sections(bytes(b)):
        if kind in (6, 11):  # SHT_DYNAMIC, SHT_DYNSYM
            struct.pack_into("<I", b, off + 4, 1)  # SHT_PROGBITS
    return bytes(b)


def _facts(data: bytes) -> tuple[object, ...]:
    elf = ELFFile(io.BytesIO(data))
    return (tuple(elf_needed(elf)), elf_soname(elf), elf_search_paths(elf),
            sorted(elf_undefined_symbols(elf)), sorted(elf_defined_symbols(elf)))


def _findings(tmp_path: Path, name: str, data: bytes) -> list[tuple[str, str, str]]:
    wheel = write_zip(tmp_path / f"{name}.whl", {"demo/m.so": data,
                                                   "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n"})
    a = audit_wheel(wheel, min_driver=SETTINGS.min_driver, runtimes=None, strict=False,
                    optional=(), introductions=DATA.introductions, abi_changed=DATA.abi_changes,
                    settings=SETTINGS, data=DATA, jobs=1)
    assert not [f.message for f in a.findings if f.code == "unreadable-elf"]
    return sorted((f.severity, f.code, f.subject) for f in a.findings)


def test_loader_view_matches_the_sections_of_an_intact_file(original: bytes) -> None:
    elf = ELFFile(io.BytesIO(original))
    view = loader_view(elf)
    assert view is not None
    assert view.needed == tuple(t.needed for t in elf.get_section_by_name(".dynamic").iter_tags()
                                if t.entry.d_tag == "DT_NEEDED")
    assert view.soname == "libm_demo.so.3"
    assert "$ORIGIN/../lib" in (*view.rpath, *view.runpath)
    dynsym = elf.get_section_by_name(".dynsym")
    want = [(s.name, s["st_shndx"] != "SHN_UNDEF", s["st_info"]["bind"] == "STB_WEAK")
            for s in dynsym.iter_symbols() if s.name and s["st_info"]["bind"] != "STB_LOCAL"]
    assert list(view.symbols) == want  # DT_GNU_HASH counted every symbol of .dynsym
    assert ("cuOptional", False, True) in view.symbols
    assert any(lib.startswith("libc.so") for lib, _ in view.versions_needed)


@pytest.mark.parametrize("damage", [strip_section_headers, rename_dynamic_sections])
def test_damaged_section_headers_change_nothing_the_loader_reads(original: bytes, damage,  # type: ignore[no-untyped-def]
                                                                 tmp_path: Path) -> None:
    damaged = damage(original)
    assert _facts(damaged) == _facts(original)
    want = _findings(tmp_path, "original", original)
    assert ("error", "driver-symbol-too-new", "cuMemcpyBatchAsync") in want
    # Before, both files were "ok": no .dynsym section, so no symbol, no DT_NEEDED.
    assert _findings(tmp_path, damage.__name__, damaged) == want


def test_fat_binary_found_by_its_magic_without_section_headers(tmp_path: Path) -> None:
    # A fat binary container placed in the read-only data of a gcc-built library, then the
    # section headers stripped: it is found in the loadable segment by its magic.
    entries = b""
    for kind, sm, payload in ((2, 80, b"\x7fELF" + b"\0" * 60), (1, 90, b".version 8.0\n\0\0\0")):
        pad = payload + b"\0" * (-len(payload) % 8)
        entries += struct.pack("<HHIIIIIIIIIQQQ", kind, 0x101, 64, len(pad), 0, 0, 0,
                               0x80000 if kind == 1 else 0x10008, sm, 0, 0, 0x11, 0, 0) + pad
    blob = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entries)) + entries
    array = ", ".join(str(x) for x in blob)
    src = (f'__attribute__((aligned(8), used)) static const unsigned char fatbin[] = {{{array}}};\n'
           "const void *get(void) { return fatbin; }\n")
    so = shared_library(tmp_path / "dev.so", src).read_bytes()
    with_sections = ELFFile(io.BytesIO(so))
    assert find_fatbin(with_sections) is None  # no .nv_fatbin section: nothing by name
    stripped = ELFFile(io.BytesIO(strip_section_headers(so)))
    where = find_fatbin(stripped)
    assert where is not None
    assert not where[2]
    codes = read_fatbin(stripped.stream, where[0], 16 + len(entries))
    assert [c.name for c in codes] == ["sm_80", "compute_90"]
    with zipfile.ZipFile(write_zip(tmp_path / "d.whl", {"d/dev.so": strip_section_headers(so)})) as zf:
        assert zf.namelist() == ["d/dev.so"]
