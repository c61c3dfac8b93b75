"""ELF facts read straight from wheels: real gcc-built shared objects, real zip archives."""

from __future__ import annotations

import io
import os
import random
import shutil
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from cumatrix.binary.elf import (
    elf_defined_symbols,
    elf_needed,
    elf_soname,
    elf_strings,
    elf_undefined_symbols,
    iter_wheel_elves,
    member_magic,
    open_member,
)
from helpers.build import shared_library
from helpers.wheels import write_zip

if shutil.which("gcc") is None:
    if os.environ.get("CUMATRIX_REQUIRE_GCC") == "1":
        raise RuntimeError("CUMATRIX_REQUIRE_GCC=1 but gcc is not on PATH")
    pytest.skip("gcc is not on PATH (these tests build real ELF files)", allow_module_level=True)


# A build-time link stub, like the toolkit's stubs/libcuda.so: a STAND-IN for the driver,
# which this machine does not have; it only gives the linker a SONAME and symbols.
STUB = """
int cuInit(unsigned flags) { return (int)flags; }
int cuMemcpyBatchAsync(void) { return 0; }
"""

USER = r"""
#include <stddef.h>
extern int cuInit(unsigned);
extern int cuMemcpyBatchAsync(void);
extern int cuOptionalThing(void) __attribute__((weak));
static const char *lookups[] = {"cudaMemcpyBatchAsync", "cudaRuntimeGetVersion", "xcudaNope",
                                "cudaTail"};
/* A string in a big constant array, far from the start of .rodata. */
struct blob { char pad[3 << 20]; char name[32]; };
const struct blob big = {{1}, "cudaFarAway"};
const char *name_at(int i) { return lookups[i & 3]; }
int user_swap(void) {
    if (cuOptionalThing) cuOptionalThing();
    return cuInit(0) + cuMemcpyBatchAsync();
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("elf")
    stubs = d / "stubs"
    stubs.mkdir()
    shared_library(stubs / "libcuda.so", STUB, "-Wl,-soname,libcuda.so.1")
    user = shared_library(d / "libuser.so", USER, f"-L{stubs}", "-lcuda")
    return {"stub": stubs / "libcuda.so", "user": user}


def _elf(path: Path) -> ELFFile:
    return ELFFile(io.BytesIO(path.read_bytes()))


def test_needed_and_soname(built: dict[str, Path]) -> None:
    assert "libcuda.so.1" in list(elf_needed(_elf(built["user"])))
    assert elf_soname(_elf(built["stub"])) == "libcuda.so.1"
    assert elf_soname(_elf(built["user"])) is None


def test_undefined_symbols_skip_weak(built: dict[str, Path]) -> None:
    undefined = set(elf_undefined_symbols(_elf(built["user"])))
    assert {"cuInit", "cuMemcpyBatchAsync"} <= undefined
    assert "cuOptionalThing" not in undefined  # weak: NULL when absent, never a load failure
    assert "user_swap" not in undefined
    assert "user_swap" in set(elf_defined_symbols(_elf(built["user"])))


def test_strings_in_data(built: dict[str, Path]) -> None:
    found = elf_strings(_elf(built["user"]), "cuda")
    assert {"cudaMemcpyBatchAsync", "cudaRuntimeGetVersion", "cudaTail", "cudaFarAway"} <= found
    assert "xcudaNope" not in found
    assert "cudaNope" not in found
    # Directly linked names live in .dynstr, scanned only on request.
    assert "cuInit" not in elf_strings(_elf(built["user"]), "cu")
    assert "cuInit" in elf_strings(_elf(built["user"]), "cu", string_tables=True)


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED],
                         ids=["stored", "deflated"])
def test_wheel_members_match_extracted_files(built: dict[str, Path], tmp_path: Path,
                                             compression: int) -> None:
    user = built["user"].read_bytes()
    wheel = write_zip(tmp_path / "w-1.0-py3-none-any.whl", {
        "pkg/__init__.py": b"",
        "pkg/libuser.so": user,
        "pkg/notes.txt": b"\x7fEL",  # shorter than the magic
        "pkg/data.bin": os.urandom(1000),
        "pkg.libs/libcuda-stub.so.1": built["stub"].read_bytes(),
    }, compression)
    seen = {}
    for name, elf in iter_wheel_elves(wheel):
        ref = _elf(built["user"] if name.endswith("libuser.so") else built["stub"])
        assert list(elf_needed(elf)) == list(elf_needed(ref))
        assert sorted(elf_undefined_symbols(elf)) == sorted(elf_undefined_symbols(ref))
        assert elf_strings(elf, "cuda") == elf_strings(ref, "cuda")
        seen[name] = True
    assert list(seen) == ["pkg/libuser.so", "pkg.libs/libcuda-stub.so.1"]


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED],
                         ids=["stored", "deflated"])
@pytest.mark.parametrize("spool", [True, False], ids=["spooled", "on-demand"])
def test_member_stream_random_access(tmp_path: Path, compression: int, spool: bool) -> None:
    # Half incompressible, half repetitive: both kinds of deflate blocks, 40 MiB so that
    # reads cross decoded blocks, checkpoints and evictions from the block cache.
    data = os.urandom(20 << 20) + bytes(range(256)) * (80 << 10)
    wheel = write_zip(tmp_path / "w.whl", {"a/big.bin": data}, compression)
    rng = random.Random(7)
    with zipfile.ZipFile(wheel) as zf, wheel.open("rb") as raw:
        stream = open_member(zf, raw, zf.getinfo("a/big.bin"), spool=spool)
        assert member_magic(raw, zf.getinfo("a/big.bin"), 4) == data[:4]
        assert stream.seek(0, io.SEEK_END) == len(data)
        for _ in range(200):
            start = rng.randrange(len(data))
            size = rng.choice([1, 17, 4096, 1 << 20, 3 << 20])
            stream.seek(start)
            assert stream.read(size) == data[start:start + size]
            assert stream.tell() == min(len(data), start + size)
        stream.seek(len(data) - 5)
        assert stream.read() == data[-5:]
        assert stream.read(10) == b""
        stream.close()


def test_malformed_elf_goes_to_on_error(tmp_path: Path) -> None:
    wheel = write_zip(tmp_path / "w.whl", {"pkg/broken.so": b"\x7fELF" + b"\x00" * 8},
                   zipfile.ZIP_DEFLATED)
    errors: list[str] = []
    assert list(iter_wheel_elves(wheel, on_error=lambda n, _e: errors.append(n))) == []
    assert errors == ["pkg/broken.so"]


def test_not_a_zip(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.whl"
    bogus.write_bytes(b"not a zip")
    with pytest.raises(zipfile.BadZipFile):
        list(iter_wheel_elves(bogus))


def test_strings_several_prefixes_in_one_scan(built: dict[str, Path]) -> None:
    elf = _elf(built["user"])
    both = elf_strings(elf, ("cuda", "xcuda"))
    assert both == elf_strings(elf, "cuda") | elf_strings(elf, "xcuda")
    assert "xcudaNope" in both
    assert "cudaFarAway" in both


def test_device_code_is_not_scanned_for_names(tmp_path: Path) -> None:
    # A host string and the same kind of string placed in a .nv_fatbin section.
    src = ('__attribute__((section(".nv_fatbin"), used)) static const char dev[] = '
           '"cudaInDeviceCode";\nconst char *host = "cudaOnHost";\n')
    so = shared_library(tmp_path / "libdev.so", src)
    names = elf_strings(_elf(so), "cuda")
    assert "cudaOnHost" in names
    assert "cudaInDeviceCode" not in names


def test_symbols_match_pyelftools(built: dict[str, Path]) -> None:
    from elftools.elf.sections import SymbolTableSection
    for path in built.values():
        elf = _elf(path)
        dynsym = elf.get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        syms = [s for s in dynsym.iter_symbols() if s.name]
        undefined = [s.name for s in syms if s["st_shndx"] == "SHN_UNDEF"
                     and s["st_info"]["bind"] != "STB_WEAK"]
        defined = [s.name for s in syms if s["st_shndx"] != "SHN_UNDEF"]
        assert list(elf_undefined_symbols(elf)) == undefined
        assert list(elf_defined_symbols(elf)) == defined
