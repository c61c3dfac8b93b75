"""The emulated-driver interposer, built with gcc over a STAND-IN driver.

This host has no GPU and no libcuda.so.1, so the "real" driver here is a stand-in built from
tests/stand_ins/libcuda_stand_in.c (a 13.0 driver's exports and cuGetProcAddress gating, host
memory only). The interposer, the gcc builds, the ELF files and the dynamic loader are real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from cumatrix.core.errors import ConfigError
from cumatrix.core.model import CudaVersion
from cumatrix.execute.driverquery import read_driver_version
from cumatrix.host.fingerprint import (
    SearchLog,
    compiler_identity,
    find_real_libcuda,
    headers_cuda_version,
    search_real_libcuda,
)
from cumatrix.provision import drivers as D
from cumatrix.provision import headers as H
from cumatrix.provision.runtimes import headers_for
from helpers.build import run_gcc

STAND_INS = Path(__file__).resolve().parents[1] / "stand_ins"

if shutil.which("gcc") is None:
    if os.environ.get("CUMATRIX_REQUIRE_GCC") == "1":
        raise RuntimeError("CUMATRIX_REQUIRE_GCC=1 but gcc is not on PATH")
    pytest.skip("gcc is not on PATH (the interposer is compiled with it)", allow_module_level=True)

pytestmark = pytest.mark.network  # introduction versions come from a real runtime wheel's headers


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in driver: ``<dir>/libcuda.so.1`` with SONAME libcuda.so.1."""
    d = tmp_path_factory.mktemp("stand-in-driver")
    run_gcc("-shared", "-fPIC", "-Wall", "-Werror", "-Wl,-soname,libcuda.so.1", "-o", d / "libcuda.so.1",
         STAND_INS / "libcuda_stand_in.c")
    return d / "libcuda.so.1"


@pytest.fixture(scope="module")
def direct_link(stand_in: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A program that links cuMemcpyBatchAsync directly (DT_NEEDED libcuda.so.1)."""
    exe = tmp_path_factory.mktemp("direct-link") / "direct_link"
    run_gcc("-o", exe, STAND_INS / "direct_link.c", stand_in)
    return exe


@pytest.fixture(scope="module")
def intro() -> tuple[dict[str, int], dict[str, int]]:
    inc = headers_for("13.5")
    return H.load_introductions(inc), H.load_base_introductions(inc)


@pytest.fixture(scope="module")
def interposers(stand_in: Path, intro: tuple[dict[str, int], dict[str, int]],
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, D.Interposer]:
    cache = tmp_path_factory.mktemp("interposers")
    real = read_driver_version(stand_in)
    return {v: D.build_interposer(CudaVersion.parse(v), real_libcuda=stand_in, introductions=intro[0],
                                  real_driver_version=real, base_introductions=intro[1], cache=cache)
            for v in ("12.4", "12.8", "13.0")}


def _dynsym(path: Path) -> set[str]:
    with path.open("rb") as fh:
        sec = ELFFile(fh).get_section_by_name(".dynsym")
        return {s.name for s in sec.iter_symbols() if s["st_shndx"] != "SHN_UNDEF"}  # type: ignore[union-attr]


def _soname(path: Path) -> str:
    with path.open("rb") as fh:
        dyn = ELFFile(fh).get_section_by_name(".dynamic")
        return next(t.soname for t in dyn.iter_tags() if t.entry.d_tag == "DT_SONAME")  # type: ignore[union-attr]


def test_exports_follow_the_emulated_version(interposers: dict[str, D.Interposer]) -> None:
    syms = {v: _dynsym(ip.library) for v, ip in interposers.items()}
    for v, ip in interposers.items():
        assert _soname(ip.library) == "libcuda.so.1"
        assert {"cuInit", "cuDriverGetVersion", "cuGetProcAddress", "cuGetProcAddress_v2",
                "cuMemcpyAsync", "cuGetErrorName", "cuStandInUntyped"} <= syms[v], v
    assert "cuMemcpyBatchAsync" not in syms["12.4"]
    assert "cuMemcpyBatchAsync_v2" not in syms["12.4"]
    assert "cuMemcpyBatchAsync" in syms["12.8"]
    assert "cuMemcpyBatchAsync_v2" not in syms["12.8"]
    assert {"cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2"} <= syms["13.0"]
    assert interposers["12.4"].hidden == ("cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2")
    assert interposers["12.8"].hidden == ("cuMemcpyBatchAsync_v2",)
    assert interposers["13.0"].hidden == ()
    # 7 and 9 of the memory and version entry points, plus the stand-in's 11 load, link and
    # device entry points and its load counter (test_interposer_jit.py)
    assert (interposers["12.4"].exported, interposers["13.0"].exported) == (7 + 11, 9 + 11)
    # kept although no PFN_ typedef says when it came
    assert "cuStandInUntyped" in (interposers["12.4"].lib_dir / "tables.h").read_text()


_PROBE = r"""
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
real = ctypes.CDLL(sys.argv[1])
v = ctypes.c_int(0)
out = {"rc_version": cuda.cuDriverGetVersion(ctypes.byref(v)), "version": v.value}
def gpa(name, version):
    p = ctypes.c_void_p(0); st = ctypes.c_int(-1)
    rc = cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(p), version, ctypes.c_ulonglong(0),
                                  ctypes.byref(st))
    return [rc, p.value, st.value]
def addr(name):
    return ctypes.cast(getattr(real, name), ctypes.c_void_p).value
out["batch_12080"] = gpa("cuMemcpyBatchAsync", 12080)
out["batch_13000"] = gpa("cuMemcpyBatchAsync", 13000)
out["real_batch"] = addr("cuMemcpyBatchAsync")
out["real_batch_v2"] = addr("cuMemcpyBatchAsync_v2")
# the version entry handed out by cuGetProcAddress is the interposer's, not the real one
rc, p, st = gpa("cuDriverGetVersion", 13000)
w = ctypes.c_int(0)
ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))(p)(ctypes.byref(w))
out["version_via_gpa"] = w.value
# v1 entry, capped too
p1 = ctypes.c_void_p(0)
out["v1_batch_13000"] = [cuda.cuGetProcAddress(b"cuMemcpyBatchAsync", ctypes.byref(p1), 13000,
                                               ctypes.c_ulonglong(0)), p1.value]
# a forwarded call reaches the stand-in, arguments intact
src = ctypes.create_string_buffer(b"forwarded", 16); dst = ctypes.create_string_buffer(16)
out["memcpy_rc"] = cuda.cuMemcpyAsync(ctypes.c_ulonglong(ctypes.addressof(dst)),
                                      ctypes.c_ulonglong(ctypes.addressof(src)), ctypes.c_size_t(16), None)
out["memcpy_dst"] = dst.value.decode()
out["init"] = cuda.cuInit(0)
out["untyped"] = cuda.cuStandInUntyped()
print(json.dumps(out))
"""


def _probe(ip: D.Interposer) -> dict[str, object]:
    env = dict(os.environ, LD_LIBRARY_PATH=str(ip.lib_dir))
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(ip.real_libcuda)], capture_output=True,
                          text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_version_and_proc_address_gating(interposers: dict[str, D.Interposer]) -> None:
    at_124 = _probe(interposers["12.4"])
    assert (at_124["rc_version"], at_124["version"], at_124["version_via_gpa"]) == (0, 12040, 12040)
    assert at_124["batch_12080"] == [0, None, 2]  # CUDA_SUCCESS, NULL, VERSION_NOT_SUFFICIENT
    assert at_124["batch_13000"] == [0, None, 2]
    assert at_124["v1_batch_13000"] == [0, None]

    at_128 = _probe(interposers["12.8"])
    assert at_128["version"] == 12080
    assert at_128["batch_12080"] == [0, at_128["real_batch"], 0]
    # asked for 13000, capped at 12080: the 9-parameter entry, never the 8-parameter one
    assert at_128["batch_13000"] == [0, at_128["real_batch"], 0]

    at_130 = _probe(interposers["13.0"])
    assert at_130["batch_13000"] == [0, at_130["real_batch_v2"], 0]

    for probe in (at_124, at_128, at_130):
        assert (probe["memcpy_rc"], probe["memcpy_dst"]) == (0, "forwarded")
        assert (probe["init"], probe["untyped"]) == (0, 42)


def test_direct_link_needs_the_symbol(interposers: dict[str, D.Interposer], direct_link: Path) -> None:
    def run(ip: D.Interposer) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(direct_link)], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, LD_LIBRARY_PATH=str(ip.lib_dir)), check=False)

    old = run(interposers["12.4"])
    assert old.returncode == 127
    assert "undefined symbol: cuMemcpyBatchAsync" in old.stderr
    new = run(interposers["12.8"])
    assert (new.returncode, new.stdout.strip()) == (0, "rc=0 copied=batch"), new.stderr


def test_second_build_is_a_cache_hit(stand_in: Path, intro: tuple[dict[str, int], dict[str, int]],
                                     interposers: dict[str, D.Interposer]) -> None:
    first = interposers["12.4"]
    again = D.build_interposer(CudaVersion(12, 4), real_libcuda=stand_in, introductions=intro[0],
                               real_driver_version=13000, base_introductions=intro[1], cache=first.lib_dir.parent)
    assert again.cache_hit
    assert not first.cache_hit
    assert again.lib_dir == first.lib_dir
    assert again.hidden == first.hidden


def test_no_gcc_is_an_interposer_error(stand_in: Path, intro: tuple[dict[str, int], dict[str, int]],
                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no compiler on it
    with pytest.raises(D.InterposerError, match="install gcc"):
        D.build_interposer(CudaVersion(12, 4), real_libcuda=stand_in, introductions=intro[0],
                           real_driver_version=13000, cache=tmp_path)


def test_emulating_a_newer_driver_is_a_config_error(stand_in: Path,
                                                    intro: tuple[dict[str, int], dict[str, int]],
                                                    tmp_path: Path) -> None:
    # the real (stand-in) driver's version is read from it: 13000
    real = read_driver_version(stand_in)
    assert real == 13000
    with pytest.raises(ConfigError, match=r"emulating 13.5 on a host whose driver is 13.0 cannot work"):
        D.build_interposer(CudaVersion(13, 5), real_libcuda=stand_in, introductions=intro[0],
                           real_driver_version=real, cache=tmp_path)


def test_no_real_driver_or_no_introductions(stand_in: Path, tmp_path: Path) -> None:
    with pytest.raises(D.InterposerError, match="no real NVIDIA driver"):
        D.build_interposer(CudaVersion(12, 4), real_libcuda=None, introductions={"cuInit": 2000},
                           real_driver_version=13000)
    with pytest.raises(D.InterposerError, match="no real NVIDIA driver"):
        D.build_interposer(CudaVersion(12, 4), real_libcuda=tmp_path / "libcuda.so.1",
                           introductions={"cuInit": 2000}, real_driver_version=13000)
    with pytest.raises(ConfigError, match=r"cudaTypedefs\.h"):
        D.build_interposer(CudaVersion(12, 4), real_libcuda=stand_in, introductions={}, real_driver_version=13000)


def test_parse_driver_name() -> None:
    assert D.parse_driver_name("host") is None
    assert D.parse_driver_name("emulated-12.4") == CudaVersion(12, 4)
    for bad in ("emulated-12", "emulated-abc", "emulated-", "emulated-12.4.1"):
        with pytest.raises(ValueError, match=r"MAJOR\.MINOR"):
            D.parse_driver_name(bad)
    with pytest.raises(ValueError, match=r"'host' or 'emulated-X\.Y'"):
        D.parse_driver_name("hots")


def test_search_steps_record_where() -> None:
    log = SearchLog()
    hit = search_real_libcuda(log)
    if hit is None:
        assert find_real_libcuda() is None  # this host has no driver: nothing invented
        message = log.not_found("libcuda.so.1")
        assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in message
        assert "/usr/local/nvidia/lib64/libcuda.so.1" in message
    else:
        assert hit.path.is_absolute()
        assert hit.found_by
        assert find_real_libcuda() == hit.path


def test_host_facts_compiler_and_headers() -> None:
    ident = compiler_identity("gcc")
    assert ident is not None
    assert "gcc" in ident.lower()
    assert compiler_identity("cumatrix-no-such-compiler") is None
    assert headers_cuda_version(headers_for("12.9")) == 12090


def test_interposer_template_is_c_on_its_own(tmp_path: Path) -> None:
    """The template reads and compiles as C without generated tables (an emulated 12.0 forwarding nothing)."""
    src = tmp_path / "interposer.c"
    src.write_text(D.interposer_template())
    proc = subprocess.run(["gcc", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(tmp_path / "libcuda.so.1"),
                           str(src), "-ldl"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
