"""Hostile input to the static audit: every parser failure is an ``unreadable-elf`` finding.

Real gcc-built ELF files, damaged on purpose: a crafted ``.dynamic`` whose ``sh_link`` is 0
(pyelftools raises AssertionError on it), a wheel with bytes cut from its middle, and
seeded, bounded property-based mutations (hypothesis) of a real ELF and of a real fat binary.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cumatrix.audit.static import AuditData, AuditSettings, audit_wheel
from cumatrix.binary.fatbin import FatbinError, read_fatbin
from cumatrix.core.model import CudaVersion
from helpers.build import shared_library
from helpers.wheels import write_zip

if shutil.which("gcc") is None:
    pytest.skip("gcc is not on PATH (these tests build real ELF files)", allow_module_level=True)

SOURCE = r"""
#include <dlfcn.h>
extern int cuInit(unsigned);
static const char name[] = "cudaMemcpyBatchAsync";
void *entry(void) { cuInit(0); void *h = dlopen("libcudart.so.12", RTLD_NOW); return h ? dlsym(h, name) : 0; }
"""

# Facts small enough to type the test's expectations against (the audit's logic is the
# subject here, not the headers).
DATA = AuditData(introductions={"cuInit": 2000}, abi_changes={"cudaMemcpyBatchAsync": (
    "cudaError_t cudaMemcpyBatchAsync(void*, size_t*, size_t)",
    "cudaError_t cudaMemcpyBatchAsync(void*, size_t)")}, sources=())
SETTINGS = AuditSettings(min_driver=CudaVersion(12, 0))


@pytest.fixture(scope="module")
def elf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return shared_library(tmp_path_factory.mktemp("robust") / "m.so", SOURCE, "-ldl").read_bytes()


def _wheel(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    return write_zip(path, {**members, "demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\n"}, method)


def _audit(wheel: Path) -> list[tuple[str, str, str]]:
    a = audit_wheel(wheel, min_driver=SETTINGS.min_driver, runtimes=None, strict=False,
                    optional=(), introductions=DATA.introductions,
                    abi_changed=DATA.abi_changes, settings=SETTINGS, data=DATA, jobs=1)
    return [(f.file, f.code, f.message) for f in a.findings]


def _zero_dynamic_link(elf: bytes) -> bytes:
    """The same file with the ``.dynamic`` section header's ``sh_link`` set to 0."""
    b = bytearray(elf)
    shoff, = struct.unpack_from("<Q", b, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", b, 0x3A)
    for i in range(shnum):
        off = shoff + i * shentsize
        if struct.unpack_from("<I", b, off + 4)[0] == 6:  # SHT_DYNAMIC
            struct.pack_into("<I", b, off + 40, 0)  # sh_link
            return bytes(b)
    raise AssertionError("no .dynamic section")


def test_intact_file_is_audited(elf_bytes: bytes, tmp_path: Path) -> None:
    found = _audit(_wheel(tmp_path / "ok.whl", {"demo/m.so": elf_bytes}))
    codes = {c for _, c, _ in found}
    assert "unreadable-elf" not in codes
    assert "underlinked-libcuda" in codes


def test_dynamic_with_sh_link_0_is_read_as_the_loader_reads_it(elf_bytes: bytes,
                                                                 tmp_path: Path) -> None:
    # The loader never reads section headers: it finds the strings through PT_DYNAMIC's
    # DT_STRTAB, so a .dynamic section header pointing at no string table changes nothing of
    # what the file needs (before, the audit read that section and called the file unreadable).
    intact = _audit(_wheel(tmp_path / "ok.whl", {"demo/m.so": elf_bytes}))
    found = _audit(_wheel(tmp_path / "crafted.whl", {"demo/m.so": _zero_dynamic_link(elf_bytes)}))
    assert sorted((f, c) for f, c, _ in found) == sorted((f, c) for f, c, _ in intact)
    assert "underlinked-libcuda" in {c for _, c, _ in found}


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_bytes_cut_from_the_middle(elf_bytes: bytes, tmp_path: Path, method: int) -> None:
    whole = _wheel(tmp_path / "whole.whl", {"demo/a.so": elf_bytes, "demo/b.so": elf_bytes},
                   method).read_bytes()
    cut = tmp_path / "cut.whl"
    cut.write_bytes(whole[:300] + whole[300 + 64:])  # 64 bytes out of demo/a.so's data
    found = _audit(cut)
    # The damaged member is named; the intact one after it is still audited.
    assert [(f, c) for f, c, _ in found if f == "demo/a.so"] == [("demo/a.so", "unreadable-elf")]
    assert ("demo/b.so", "underlinked-libcuda") in [(f, c) for f, c, _ in found]


def _mutate(data: bytes, edits: list[tuple[int, int]], cut: int | None) -> bytes:
    b = bytearray(data)
    for pos, value in edits:
        b[pos % len(b)] = value
    return bytes(b[:cut] if cut is not None else b)


@settings(max_examples=150, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=24),
       cut=st.none() | st.integers(4, 1 << 16),
       header_only=st.booleans())
def test_fuzzed_elf_never_escapes(elf_bytes: bytes, tmp_path: Path, edits: list[tuple[int, int]],
                                  cut: int | None, header_only: bool) -> None:
    # Half the examples aim every edit at the ELF and section headers, where parsers break.
    if header_only:
        edits = [(p % 64 if i % 2 else len(elf_bytes) - 1 - p % 1024, v)
                 for i, (p, v) in enumerate(edits)]
    data = _mutate(elf_bytes, edits, cut)
    data = b"\x7fELF" + data[4:]
    found = _audit(_wheel(tmp_path / "fuzz.whl", {"demo/m.so": data}))
    # Anything may be found, but as findings: no exception leaves the audit.
    assert all(f == "demo/m.so" for f, _, _ in found)


def _fatbin(entries: list[tuple[int, int, int, bytes]]) -> bytes:
    body = b""
    for kind, sm, flags, payload in entries:
        pad = payload + b"\0" * (-len(payload) % 8)
        body += struct.pack("<HHIIIIIIIIIQQQ", kind, 0x101, 64, len(pad), 0, 0, 0,
                            0x90000 if kind == 1 else 0x10008, sm, 0, 0, flags, 0, 0) + pad
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_fatbin_reader_reads_what_it_is_given() -> None:
    blob = _fatbin([(2, 80, 0x11, b"\x7fELF"), (2, 90, 0x100011, b""),
                    (1, 90, 0x11, b".version 8.7\n.target sm_90\n")])
    codes = read_fatbin(io.BytesIO(blob), 0, len(blob))
    assert [c.label() for c in codes] == ["sm_80", "sm_90a", "compute_90 (PTX ISA 8.7)"]


@settings(max_examples=300, derandomize=True, deadline=None)
@given(edits=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=12),
       cut=st.none() | st.integers(0, 400))
def test_fuzzed_fatbin_raises_only_fatbin_error(edits: list[tuple[int, int]],
                                                cut: int | None) -> None:
    blob = _mutate(_fatbin([(2, 80, 0x11, b"x" * 40), (1, 90, 0x11, b".version 9.0\n")]),
                   edits, cut)
    with contextlib.suppress(FatbinError):
        read_fatbin(io.BytesIO(blob), 0, len(blob))
