"""The streamed reading of a large deflated member (cumatrix.binary.streamscan): a second process
inflates it while this one scans every byte for names, and the names kept once the section
table is known are exactly those the section-by-section scan finds.  Real gcc-built ELF files,
real zip archives; window and chunk sizes are made small so names fall across boundaries."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from cumatrix.audit import members
from cumatrix.audit.checks import DATA_SCANS
from cumatrix.audit.static import AuditData, AuditSettings, audit_wheel
from cumatrix.binary import streamscan
from cumatrix.binary.elf import data_start, scan_names
from cumatrix.binary.fastelf import FastELFFile
from cumatrix.core.model import CudaVersion

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or not hasattr(os, "fork"),
                                reason="needs gcc and fork")

# A name at the very start of a section that follows one ending in identifier characters (a
# name there, though glued to them in the file), sonames alone and at the end of a path, and a
# large array of bytes full of partial names, so names fall at chunk and window boundaries.
SOURCE = r"""
#include <dlfcn.h>
__attribute__((section("cm_a"), used)) static const char a[16] = "abcdefghijklmnop";
__attribute__((section("cm_b"), used)) static const char b[] = "cudaAtStart\0libcudart.so.12";
__attribute__((section("cm_c"), used)) static const char c[] = "/opt/libcuda.so.1";
__attribute__((used)) static const unsigned char pad[] = { PAD };
__attribute__((used)) static const char *names[] = { "cudaMemcpyBatchAsync", "cuGetProcAddress",
  "libcudart_static_0123abcd", "cudaEnd", "xcudaGlued" };
void *entry(void) { void *h = dlopen("libcudart.so.13", RTLD_NOW); return h ? dlsym(h, names[0]) : 0; }
"""


def _library(tmp: Path, seed: int, *, mark: bool = True) -> Path:
    rnd = random.Random(seed)
    # Random bytes with many "cu" and NULs, so partial names abound near every boundary.
    pad = bytearray(rnd.randrange(256) for _ in range(40000))
    for i in range(0, len(pad) - 40, 97):
        pad[i:i + 8] = rnd.choice([b"cuda\0\0\0\0", b"\0cuX_1\0\0", b"libcuda.", b"cudaQq9\0"])
    src = tmp / f"lib{seed}.c"
    source = SOURCE if mark else SOURCE.replace('"libcudart_static_0123abcd", ', "")
    src.write_text(source.replace("PAD", ",".join(str(b) for b in pad)))
    out = tmp / f"lib{seed}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src), "-ldl"],
                   check=True, capture_output=True)
    return out


def _wheel(tmp: Path, lib: Path) -> Path:
    wheel = tmp / "demo-1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(lib, "demo/_big.so", zipfile.ZIP_DEFLATED)
        zf.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\n")
    return wheel


@pytest.mark.parametrize(("window", "chunk"), [(4096, 1000), (8192, 333), (32 << 20, 4 << 20)])
def test_streamed_names_are_the_section_scan_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   window: int, chunk: int) -> None:
    monkeypatch.setattr(streamscan, "_WINDOW", window)
    monkeypatch.setattr(streamscan, "_CHUNK", chunk)
    for seed in (1, 2):
        lib = _library(tmp_path, seed)
        wheel = _wheel(tmp_path, lib)
        with zipfile.ZipFile(wheel) as zf, wheel.open("rb") as raw:
            info = zf.getinfo("demo/_big.so")
            stream, names = streamscan.stream_member(wheel, data_start(raw, info),
                                                     info.compress_size, info.file_size,
                                                     DATA_SCANS)
        with stream:
            assert stream.read() == lib.read_bytes()
            got = names.resolve(FastELFFile(stream))
        with lib.open("rb") as f:
            want = scan_names(FastELFFile(f), DATA_SCANS)
        assert got == want
        assert {"cudaAtStart", "cudaMemcpyBatchAsync", "libcudart_static_0123abcd"} <= got[0]
        assert {"libcudart.so.12", "libcudart.so.13", "libcuda.so.1"} <= got[1]


def test_too_many_names_fall_back_to_the_section_scan(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streamscan, "MAX_RECORDS", 5)
    lib = _library(tmp_path, 3)
    wheel = _wheel(tmp_path, lib)
    with zipfile.ZipFile(wheel) as zf, wheel.open("rb") as raw:
        info = zf.getinfo("demo/_big.so")
        stream, names = streamscan.stream_member(wheel, data_start(raw, info), info.compress_size,
                                                 info.file_size, DATA_SCANS)
    assert not names.complete
    with stream, lib.open("rb") as f:
        assert names.resolve(FastELFFile(stream)) == scan_names(FastELFFile(f), DATA_SCANS)


def test_damaged_and_misdeclared_members_raise(tmp_path: Path) -> None:
    lib = _library(tmp_path, 4)
    wheel = _wheel(tmp_path, lib)
    with zipfile.ZipFile(wheel) as zf, wheel.open("rb") as raw:
        info = zf.getinfo("demo/_big.so")
        start = data_start(raw, info)
    with pytest.raises(zipfile.BadZipFile, match="not the"):
        streamscan.stream_member(wheel, start, info.compress_size, info.file_size + 10, DATA_SCANS)
    with pytest.raises(zipfile.BadZipFile, match="longer than"):
        streamscan.stream_member(wheel, start, info.compress_size, info.file_size - 10, DATA_SCANS)
    blob = bytearray(wheel.read_bytes())
    blob[start + 200:start + 260] = b"\xff" * 60  # garbage in the deflate stream
    bad = tmp_path / "bad.whl"
    bad.write_bytes(bytes(blob))
    with pytest.raises(Exception, match=r"\S"):
        streamscan.stream_member(bad, start, info.compress_size, info.file_size, DATA_SCANS)


def test_the_gate_finds_the_same_streamed_or_not(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = _wheel(tmp_path, _library(tmp_path, 5, mark=False))  # no static runtime in it
    data = AuditData(introductions={"cuGetProcAddress": 12000}, abi_changes={
        "cudaMemcpyBatchAsync": ("(a, b)", "(a, b, c)")}, sources=())
    s = AuditSettings(min_driver=CudaVersion(11, 8), runtimes=(12,))

    def audit() -> list[tuple[str, str, str]]:
        a = audit_wheel(wheel, min_driver=s.min_driver, runtimes=s.runtimes, strict=False,
                        optional=(), introductions=data.introductions,
                        abi_changed=data.abi_changes, settings=s, data=data, jobs=1)
        return sorted((f.file, f.code, f.subject) for f in a.findings)

    plain = audit()
    monkeypatch.setattr(members, "_STREAM_MIN", 0)
    assert audit() == plain
    # The wheel's findings name the runtime it loads and the ABI-changed lookup.
    assert ("demo/_big.so", "abi-lookup", "cudaMemcpyBatchAsync") in plain
    assert any(code.startswith("runtime") and "13" in subject for _, code, subject in plain)


def test_without_a_second_process_the_member_is_read_in_this_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = _wheel(tmp_path, _library(tmp_path, 6, mark=False))
    data = AuditData(introductions={}, abi_changes={
        "cudaMemcpyBatchAsync": ("(a, b)", "(a, b, c)")}, sources=())
    s = AuditSettings(min_driver=CudaVersion(11, 8), runtimes=(12,))

    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(members, "_STREAM_MIN", 0)
    monkeypatch.setattr(os, "fork", no_fork)
    a = audit_wheel(wheel, min_driver=s.min_driver, runtimes=s.runtimes, strict=False,
                    optional=(), introductions=data.introductions, abi_changed=data.abi_changes,
                    settings=s, data=data, jobs=1)
    codes = {(f.code, f.subject) for f in a.findings}
    assert ("abi-lookup", "cudaMemcpyBatchAsync") in codes
    assert not any(code == "unreadable-elf" for code, _ in codes)
