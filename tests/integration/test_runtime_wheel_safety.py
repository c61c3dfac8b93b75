"""Hostile runtime wheels: crafted in the test, unpacked and judged without running their code.

The wheels here are real zip archives written with ``zipfile``; the libraries inside are
real gcc-built ELF files whose constructor would leave a marker file if anything loaded
them on the host.  No network: everything comes from ``--wheel-dir``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core.errors import RuntimeNotFound, UnsafeArchive
from cumatrix.provision import runtimes as R

GCC = shutil.which("gcc")

#: A STAND-IN libcudart (the real one needs NVIDIA's wheel): it exports cudaRuntimeGetVersion
#: storing VERSION, the way NVIDIA's does, and a constructor that betrays any load.
FAKE_CUDART = r"""
#include <stdio.h>
__attribute__((constructor)) static void loaded(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("loaded on the host\n", f); fclose(f); }
}
int cudaRuntimeGetVersion(int *v) { if (!v) return 1; *v = VERSION; return 0; }
int cudaMemcpyBatchAsync(void) { return 0; }
"""


def _metadata(name: str, version: str) -> str:
    return f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"


def make_wheel(directory: Path, name: str, version: str, members: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    """A wheel file ``name-version-py3-none-any.whl`` with METADATA and the given members."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members:
            zf.writestr(member, data)
        zf.writestr(f"{dist}.dist-info/METADATA", _metadata(name, version))
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n")
    return path


def _typed(name: str, kind: int, perm: int = 0o644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (kind | perm) << 16
    return info


ATTACKS: list[tuple[str, zipfile.ZipInfo | str, str]] = [
    ("dotdot", "../escaped.txt", "`..` component"),
    ("deep-dotdot", "nvidia/cu13/lib/../../../../escaped.txt", "`..` component"),
    ("absolute", "/tmp/cumatrix-absolute-escape.txt", "absolute path"),
    ("drive", "C:/escaped.txt", "absolute path"),
    ("symlink", _typed("nvidia/cu13/lib/libcudart.so.13", stat.S_IFLNK, 0o777), "symbolic link"),
    ("fifo", _typed("nvidia/cu13/fifo", stat.S_IFIFO), "FIFO"),
    ("chardev", _typed("nvidia/cu13/null", stat.S_IFCHR), "character device"),
]


@pytest.mark.parametrize(("member", "why"), [(m, w) for _, m, w in ATTACKS], ids=[i for i, _, _ in ATTACKS])
def test_unsafe_members_are_refused_before_anything_is_written(tmp_path: Path, member: zipfile.ZipInfo | str,
                                                               why: str) -> None:
    data = b"/etc/passwd" if isinstance(member, zipfile.ZipInfo) else b"pwned\n"
    wheel = make_wheel(tmp_path / "wheels", "evil-runtime", "13.0.1",
                       [("nvidia/cu13/lib/libcudart.so.13", b"\x7fELF"), (member, data)]
                       if getattr(member, "filename", member) != "nvidia/cu13/lib/libcudart.so.13" else [(member, data)])
    target = tmp_path / "deep" / "target"
    with pytest.raises(UnsafeArchive) as e:
        R.unpack_wheel(wheel, target)
    name = getattr(member, "filename", member)
    assert wheel.name in str(e.value)
    assert repr(name) in str(e.value)
    assert why in str(e.value)
    assert not target.exists()  # refused before the first write
    assert not (tmp_path / "deep" / "escaped.txt").exists()
    assert not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/cumatrix-absolute-escape.txt").exists()


def test_duplicate_member_names_are_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "dup-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("a/libcudart.so.12", b"first")
        with pytest.warns(UserWarning, match="Duplicate name"):
            zf.writestr("a/libcudart.so.12", b"second")
    with pytest.raises(UnsafeArchive, match=r"dup-1\.0.*'a/libcudart\.so\.12'.*second member of the same name"):
        R.unpack_wheel(wheel, tmp_path / "t")


def test_a_safe_wheel_unpacks_inside_its_target(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", "fine", "1.0", [("pkg/a/../b.txt".replace("a/../", ""), b"b"),
                                                        (_typed("pkg/run.sh", stat.S_IFREG, 0o755), b"#!/bin/sh\n")])
    root = R.unpack_wheel(wheel, tmp_path / "t")
    assert (root / "pkg" / "b.txt").read_bytes() == b"b"
    assert os.access(root / "pkg" / "run.sh", os.X_OK)
    assert all(p.resolve().is_relative_to(root) for p in root.rglob("*"))


@pytest.fixture
def fake_cudart(tmp_path: Path) -> Any:
    """Build a STAND-IN ``libcudart.so.<major>`` storing ``version``; its constructor writes ``marker``."""
    if GCC is None:
        if os.environ.get("CUMATRIX_REQUIRE_GCC") == "1":
            raise RuntimeError("CUMATRIX_REQUIRE_GCC=1 but gcc is not on PATH")
        pytest.skip("gcc is not on PATH (this test builds a real ELF library)")

    def build(version: int, marker: Path) -> Path:
        src = tmp_path / "fake_cudart.c"
        src.write_text(FAKE_CUDART)
        out = tmp_path / f"libcudart.so.{version // 1000}"
        subprocess.run([GCC, "-O2", "-shared", "-fPIC", f"-Wl,-soname,{out.name}", f"-DVERSION={version}",
                        f"-DMARKER=\"{marker}\"", "-o", str(out), str(src)], check=True)
        return out

    return build


def _runtime_wheel(d: Path, name: str, release: str, lib: Path) -> Path:
    return make_wheel(d, name, release, [(f"nvidia/cuda_runtime/lib/{lib.name}", lib.read_bytes())])


def test_version_is_read_as_data_and_the_library_never_loaded(tmp_path: Path, fake_cudart: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUMATRIX_CACHE", str(tmp_path / "cache"))
    marker = tmp_path / "LOADED"
    wheels = tmp_path / "wheels"
    _runtime_wheel(wheels, "nvidia-cuda-runtime-cu12", "12.9.79", fake_cudart(12090, marker))
    rt = R.from_wheel("cu12.9", "nvidia-cuda-runtime-cu12==12.9.79", wheel_dir=wheels)
    assert rt.version == 12090
    assert rt.batch_exported
    assert rt.version_source == "METADATA 12.9.79; DT_SONAME libcudart.so.12; code constant 12090"
    assert not marker.exists(), "the runtime's constructor ran on the host"


def test_what_the_checks_found_is_noted_and_read_back_until_the_library_changes(
        tmp_path: Path, fake_cudart: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUMATRIX_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    _runtime_wheel(wheels, "nvidia-cuda-runtime-cu12", "12.9.79", fake_cudart(12090, tmp_path / "LOADED"))
    first = R.from_wheel("cu12.9", "nvidia-cuda-runtime-cu12==12.9.79", wheel_dir=wheels)

    def not_again(*_: Any, **__: Any) -> Any:
        raise AssertionError("the library was read again")

    monkeypatch.setattr(R, "library_facts", not_again)
    again = R.from_wheel("cu12.9", "nvidia-cuda-runtime-cu12==12.9.79", wheel_dir=wheels)
    assert again == first
    assert again.soname == "libcudart.so.12"
    # The requirement is held to the noted METADATA every time.
    note = first.libcudart.parents[3] / ".cumatrix-wheel-facts.json"
    saved = note.read_text()
    note.write_text(saved.replace('"version": "12.9.79"', '"version": "12.9.80"'))
    with pytest.raises(RuntimeNotFound, match=r"is nvidia-cuda-runtime-cu12==12\.9\.80 by its METADATA"):
        R.from_wheel("cu12.9", "nvidia-cuda-runtime-cu12==12.9.79", wheel_dir=wheels)
    note.write_text(saved)
    # A library changed in the cache is read again (and so checked again).
    with first.libcudart.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(AssertionError, match="read again"):
        R.from_wheel("cu12.9", "nvidia-cuda-runtime-cu12==12.9.79", wheel_dir=wheels)


def test_a_library_that_contradicts_its_wheel_is_refused(tmp_path: Path, fake_cudart: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUMATRIX_CACHE", str(tmp_path / "cache"))
    marker = tmp_path / "LOADED"
    wheels = tmp_path / "wheels"
    _runtime_wheel(wheels, "nvidia-cuda-runtime-cu12", "12.9.79", fake_cudart(12040, marker))
    with pytest.raises(RuntimeNotFound, match=r"says 12\.9\.79 \(12090\) but the version its "
                                              r"cudaRuntimeGetVersion stores is 12040"):
        R.from_wheel("cu12.9", "nvidia-cuda-runtime-cu12==12.9.79", wheel_dir=wheels)
    assert not marker.exists()


def test_soname_of_another_major_is_refused(tmp_path: Path, fake_cudart: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUMATRIX_CACHE", str(tmp_path / "cache"))
    lib = fake_cudart(13000, tmp_path / "LOADED")  # libcudart.so.13, shipped as a 12.x wheel
    renamed = lib.with_name("libcudart.so.12")
    lib.rename(renamed)
    _runtime_wheel(tmp_path / "wheels", "nvidia-cuda-runtime-cu12", "12.9.79", renamed)
    with pytest.raises(RuntimeNotFound, match=r"DT_SONAME libcudart\.so\.13 is of CUDA 13"):
        R.from_wheel("cu12.9", "nvidia-cuda-runtime-cu12==12.9.79", wheel_dir=tmp_path / "wheels")


def test_the_cli_names_the_matrix_entry_of_a_wheel_that_is_no_runtime(tmp_path: Path, write_matrix: Any,
                                                                      cli: Any) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "anything", "1.0", [("anything/__init__.py", b"import os; os.system('touch PWNED')\n")])
    m = write_matrix("""
        runtimes:
          cu12.9: {wheel: anything==1.0}
        drivers: [host]
        cases: [{name: a, argv: [true]}]
    """)
    env = {"CUMATRIX_CACHE": str(tmp_path / "cache")}
    proc = cli("run", m, "--out", tmp_path / "out", "--wheel-dir", wheels, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{m}:2:19: runtimes.cu12.9: anything==1.0 is not a CUDA runtime wheel" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "PWNED").exists()


def test_the_cli_refuses_a_zip_slip_runtime_with_exit_2(tmp_path: Path, write_matrix: Any, cli: Any) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "nvidia-cuda-runtime-cu12", "12.9.79",
               [("nvidia/cuda_runtime/lib/libcudart.so.12", b"\x7fELF"), ("../../../slipped.txt", b"pwned")])
    m = write_matrix("""
        runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}
        drivers: [host]
        cases: [{name: a, argv: [true]}]
    """)
    cache = tmp_path / "a" / "b" / "cache"
    proc = cli("run", m, "--out", tmp_path / "out", "--wheel-dir", wheels, cwd=tmp_path,
               env={"CUMATRIX_CACHE": str(cache)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "refusing to unpack member '../../../slipped.txt'" in proc.stderr
    assert "nvidia_cuda_runtime_cu12-12.9.79-py3-none-any.whl" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("slipped.txt"))
