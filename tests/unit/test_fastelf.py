"""The fast section-table reader gives the audit exactly what pyelftools gives it.

Real gcc-built ELF files (a shared object that looks up a runtime function by name, a
relocatable object, an executable), whole and damaged: section headers, section names and
the audit's findings of a wheel holding them are compared between
:class:`cumatrix.binary.fastelf.FastELFFile` and pyelftools' own :class:`ELFFile`.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from cumatrix.audit import members
from cumatrix.audit.static import AuditData, AuditSettings, audit_wheel
from cumatrix.binary.fastelf import FastELFFile
from cumatrix.core.model import CudaVersion

if shutil.which("gcc") is None:
    pytest.skip("gcc is not on PATH (these tests build real ELF files)", allow_module_level=True)

SOURCE = r"""
#include <dlfcn.h>
extern int cuInit(unsigned);
extern int cuMemcpyBatchAsync(void);
static const char name[] = "cudaMemcpyBatchAsync";
void *entry(void) { cuInit(0); cuMemcpyBatchAsync();
                    void *h = dlopen("libcudart.so.12", RTLD_NOW); return h ? dlsym(h, name) : 0; }
"""
MAIN = "int main(void) { return 0; }\n"

DATA = AuditData(introductions={"cuInit": 2000, "cuMemcpyBatchAsync": 12080},
                 abi_changes={"cudaMemcpyBatchAsync": ("a", "b")}, sources=())
SETTINGS = AuditSettings(min_driver=CudaVersion(12, 0))


@pytest.fixture(scope="module")
def elves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("fastelf")
    (d / "m.c").write_text(SOURCE)
    (d / "main.c").write_text(MAIN)
    for args in (["-shared", "-fPIC", "-O1", "-o", "m.so", "m.c", "-ldl",
                  "-Wl,--unresolved-symbols=ignore-all", "-Wl,-soname,libm_demo.so.1"],
                 ["-c", "-O1", "-o", "m.o", "m.c"],
                 ["-O1", "-o", "main", "main.c"],
                 ["-m32", "-c", "-O1", "-o", "m32.o", "m.c"]):
        p = subprocess.run(["gcc", *args], cwd=d, capture_output=True, check=False)
        if p.returncode and "-m32" not in args:  # 32-bit support is optional on a host
            raise AssertionError(p.stderr.decode())
    out = {p.name: p.read_bytes() for p in d.iterdir() if p.suffix != ".c"}
    so = out["m.so"]
    shoff = struct.unpack_from("<Q", so, 0x28)[0]
    out["cut-table.so"] = so[: shoff + 64 * 3]  # section headers past the end of the file
    names = bytearray(so)
    struct.pack_into("<H", names, 0x3A, 60)  # a non-standard e_shentsize: pyelftools' path
    out["odd-entsize.so"] = bytes(names)
    # .symtab linked to section 0 (not a string table): pyelftools raises on making it.
    elf = ELFFile(io.BytesIO(so))
    index = elf.get_section_index(".symtab")
    assert index is not None, "gcc left no .symtab"
    bad = bytearray(so)
    struct.pack_into("<I", bad, shoff + 64 * index + 40, 0)  # sh_link
    out["bad-symtab-link.so"] = bytes(bad)
    return out


def _fields(header: Any) -> dict[str, object]:
    """A header's fields, whether a named tuple (FastELFFile's rows) or a Container."""
    return dict(header._asdict()) if hasattr(header, "_asdict") else dict(header)


def _headers(elf: ELFFile) -> list[tuple[str, dict[str, object]]]:
    return [(s.name, dict(s.header)) for s in elf.iter_sections()]


def test_same_sections_as_pyelftools(elves: dict[str, bytes]) -> None:
    for name in ("m.so", "m.o", "main", *(["m32.o"] if "m32.o" in elves else [])):
        data = elves[name]
        fast, slow = FastELFFile(io.BytesIO(data)), ELFFile(io.BytesIO(data))
        assert _headers(fast) == _headers(slow), name
        fresh = FastELFFile(io.BytesIO(data))  # before any Section object is made
        assert [(n, _fields(h)) for n, h in fresh.named_headers()] == [
            (s.name, dict(s.header)) for s in slow.iter_sections()]
        assert fresh._section_name_map == slow._section_name_map
        assert fast.get_section_by_name(".dynsym") is not None or name != "m.so"
        for sec in (".dynsym", ".dynstr", ".rodata", ".nosuch"):
            a, b = fast.get_section_by_name(sec), slow.get_section_by_name(sec)
            assert (a is None) == (b is None)
            if a is not None:
                assert a.data() == b.data()


def test_wheel_findings_identical(elves: dict[str, bytes], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for i, (name, data) in enumerate(sorted(elves.items())):
            zf.writestr(f"demo/{name}", data,
                        zipfile.ZIP_STORED if i % 2 else zipfile.ZIP_DEFLATED)
        zf.writestr("demo/__init__.py", "from . import m\n")
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")

    def run() -> tuple[object, ...]:
        a = audit_wheel(wheel, min_driver=SETTINGS.min_driver, runtimes=None, strict=False,
                        optional=(), introductions=DATA.introductions,
                        abi_changed=DATA.abi_changes, settings=SETTINGS, data=DATA, jobs=1)
        return a.elves, a.findings, a.device

    fast = run()
    monkeypatch.setattr(members, "ELF_READER", ELFFile)
    slow = run()
    assert fast == slow
    codes = {(f.file, f.code) for f in fast[1]}  # type: ignore[attr-defined]
    # The findings the comparison covers: real checks fired, and damage reported.
    assert ("demo/m.so", "driver-symbol-too-new") in codes
    assert ("demo/m.so", "abi-lookup") in codes
    assert ("demo/cut-table.so", "unreadable-elf") in codes
    # .symtab is no part of what the loader reads (it binds through PT_DYNAMIC): a file whose
    # .symtab is linked to no string table loads as m.so does, and is audited as m.so is.
    assert ("demo/bad-symtab-link.so", "driver-symbol-too-new") in codes


def test_string_scan_per_prefix_matches_alternation(elves: dict[str, bytes]) -> None:
    """elf_strings searches one literal prefix at a time; an alternation (forced here by a
    prefix that is not an identifier, and never occurs) must find the very same names."""
    from cumatrix.binary.elf import elf_strings
    from cumatrix.binary.staticcudart import MARK

    for name in ("m.so", "m.o"):
        for tables in (False, True):
            elf = FastELFFile(io.BytesIO(elves[name]))
            fast = elf_strings(elf, ("cu", "dl", MARK), string_tables=tables)
            slow = elf_strings(elf, ("cu", "dl", MARK, "\x01\x02"), string_tables=tables)
            assert fast == slow, (name, tables)
    so = elf_strings(FastELFFile(io.BytesIO(elves["m.so"])), ("cu", "dl"), string_tables=True)
    assert {"cudaMemcpyBatchAsync", "cuInit", "dlsym"} <= so


def test_the_pyelftools_whose_internals_it_reads_is_pinned() -> None:
    # FastELFFile overrides pyelftools' private methods: an upgrade must come with this test
    # (and the equivalence tests above) passing on it, PYELFTOOLS_TESTED and the pin raised.
    import tomllib

    import elftools
    from packaging.requirements import Requirement

    from cumatrix.binary.fastelf import PYELFTOOLS_TESTED, reader

    assert elftools.__version__ in PYELFTOOLS_TESTED, (
        f"pyelftools {elftools.__version__} is not among the releases FastELFFile was checked against")
    assert reader() is FastELFFile
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (pin,) = [Requirement(d) for d in project["project"]["dependencies"] if d.startswith("pyelftools")]
    assert all(pin.specifier.contains(v) for v in PYELFTOOLS_TESTED)
    newest = max(PYELFTOOLS_TESTED, key=lambda v: tuple(map(int, v.split("."))))
    major, minor = map(int, newest.split("."))
    assert not pin.specifier.contains(f"{major}.{minor + 1}"), "pyproject must pin pyelftools below the next release"
