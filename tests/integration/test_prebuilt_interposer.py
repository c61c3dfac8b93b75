"""The prebuilt interposer (a platform wheel's ``libexec/libcumatrix_cuda.so``), configured per
host by patching a copy, against the interposer compiled per host: the same exports, the same
answers.

The "real" driver is a STAND-IN (tests/stand_ins/libcuda_stand_in.c, a 13.0 driver's exports
and cuGetProcAddress gating, host memory only): this host has no GPU.  The prebuilt is built
here by gcc with the flags setup.py uses; both interposers, the ELF files and the dynamic
loader are real.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from cumatrix.binary.elf import elf_defined_symbols, elf_undefined_symbols
from cumatrix.core.model import CudaVersion
from cumatrix.execute.driverquery import read_driver_version
from cumatrix.provision import drivers as D
from cumatrix.provision import headers as H
from cumatrix.provision import prebuilt_driver as P
from cumatrix.provision.runtimes import headers_for
from helpers.build import run_gcc

ROOT = Path(__file__).resolve().parents[2]
STAND_INS = ROOT / "tests" / "stand_ins"
VERSIONS = ("12.4", "12.8", "13.0")
#: The stand-in's own exports, in no PFN_ typedef: the prebuilt cannot carry them.
NOT_CARRIED = ("cuStandInLoads", "cuStandInUntyped")
INTEROP = ("cudaEGLTypedefs.h", "cudaGLTypedefs.h", "cudaVDPAUTypedefs.h", "cudaProfilerTypedefs.h")

if shutil.which("gcc") is None:
    if os.environ.get("CUMATRIX_REQUIRE_GCC") == "1":
        raise RuntimeError("CUMATRIX_REQUIRE_GCC=1 but gcc is not on PATH")
    pytest.skip("gcc is not on PATH (the stand-in driver and the prebuilt are built with it)",
                allow_module_level=True)

pytestmark = pytest.mark.network  # introduction versions come from a real runtime wheel's headers


def build_prebuilt(out: Path) -> Path:
    """The prebuilt interposer, as setup.py builds it into a platform wheel."""
    source = Path(str(resources.files("cumatrix").joinpath("data/interposer.c")))
    run_gcc(*P.COMPILE_FLAGS, "-Wall", "-Wextra", "-Werror", "-o", out, source, "-ldl")
    return out


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("stand-in-driver")
    run_gcc("-shared", "-fPIC", "-Wall", "-Werror", "-Wl,-soname,libcuda.so.1", "-o", d / "libcuda.so.1",
            STAND_INS / "libcuda_stand_in.c")
    return d / "libcuda.so.1"


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_prebuilt(tmp_path_factory.mktemp("libexec") / P.PREBUILT_NAME)


@pytest.fixture(scope="module")
def pairs(stand_in: Path, prebuilt: Path,
          tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[D.Interposer, D.Interposer]]:
    """Per emulated version: (compiled here, patched from the prebuilt)."""
    inc = headers_for("13.5")
    intro, bases = H.load_introductions(inc), H.load_base_introductions(inc)
    real = read_driver_version(stand_in)
    compiled, patched = tmp_path_factory.mktemp("compiled"), tmp_path_factory.mktemp("patched")
    out = {}
    for v in VERSIONS:
        args = {"real_libcuda": stand_in, "introductions": intro, "real_driver_version": real,
                "base_introductions": bases}
        out[v] = (D.build_interposer(CudaVersion.parse(v), cache=compiled, **args),  # type: ignore[arg-type]
                  D.build_interposer(CudaVersion.parse(v), cache=patched, prebuilt=prebuilt,
                                     **args))  # type: ignore[arg-type]
    return out


def _bindings(path: Path) -> dict[str, str]:
    with path.open("rb") as fh:
        sec = ELFFile(fh).get_section_by_name(".dynsym")
        assert isinstance(sec, SymbolTableSection)
        return {s.name: s["st_info"]["bind"] for s in sec.iter_symbols() if s["st_shndx"] != "SHN_UNDEF"}


def test_the_patched_prebuilt_exports_what_the_compiled_one_does(
        pairs: dict[str, tuple[D.Interposer, D.Interposer]], prebuilt: Path) -> None:
    carried = set(D.exported_functions(prebuilt))
    assert len(carried) == len(P.entry_points()) + len(D._OWN) + len(D.JIT_ENTRIES)
    for v, (compiled, patched) in pairs.items():
        assert (compiled.prebuilt, patched.prebuilt) == (False, True)
        assert (compiled.missing, patched.missing) == ((), NOT_CARRIED), v
        assert set(D.exported_functions(patched.library)) == set(D.exported_functions(compiled.library)) - set(
            NOT_CARRIED), v
        assert patched.hidden == compiled.hidden
        # every other name is still in .dynsym, made local: the file is the prebuilt's, patched
        binds = _bindings(patched.library)
        local = {n for n, b in binds.items() if b == "STB_LOCAL"}
        assert local == carried - set(D.exported_functions(patched.library)), v
        assert len(local) > 600
        text = (patched.lib_dir / "interposer.txt").read_text()
        assert "missing: cuStandInUntyped" in text
    assert "cuMemcpyBatchAsync" not in D.exported_functions(pairs["12.4"][1].library)
    assert "cuMemcpyBatchAsync" in D.exported_functions(pairs["12.8"][1].library)
    assert "cuMemcpyBatchAsync_v2" not in D.exported_functions(pairs["12.8"][1].library)
    assert "cuMemcpyBatchAsync_v2" in D.exported_functions(pairs["13.0"][1].library)


_PROBE = r"""
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
real = ctypes.CDLL(sys.argv[1])
out = {}
v = ctypes.c_int(0)
out["version"] = [cuda.cuDriverGetVersion(ctypes.byref(v)), v.value]
def addr(lib, name):
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    except AttributeError as e:
        return str(e).split(": ", 1)[-1]
def gpa(name, version):
    p = ctypes.c_void_p(0); st = ctypes.c_int(-1)
    rc = cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(p), version, ctypes.c_ulonglong(0), ctypes.byref(st))
    return [rc, "real" if p.value and p.value == addr(real, name) else p.value and "other", st.value]
for name in ("cuMemcpyBatchAsync", "cuModuleLoadData", "cuDriverGetVersion", "cuInit"):
    out["gpa " + name] = [gpa(name, 12040), gpa(name, 12080), gpa(name, 13000)]
p = ctypes.c_void_p(0)
out["gpa v1 batch"] = [cuda.cuGetProcAddress(b"cuMemcpyBatchAsync", ctypes.byref(p), 13000, ctypes.c_ulonglong(0)),
                       bool(p.value)]
# the version entry handed out by cuGetProcAddress is the interposer's
cuda.cuGetProcAddress_v2(b"cuDriverGetVersion", ctypes.byref(p), 13000, ctypes.c_ulonglong(0), None)
w = ctypes.c_int(0)
ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))(p.value)(ctypes.byref(w))
out["version via gpa"] = w.value
# a forwarded call reaches the stand-in, arguments intact
src = ctypes.create_string_buffer(b"forwarded", 16); dst = ctypes.create_string_buffer(16)
out["memcpy"] = [cuda.cuMemcpyAsync(ctypes.c_ulonglong(ctypes.addressof(dst)),
                                    ctypes.c_ulonglong(ctypes.addressof(src)), ctypes.c_size_t(16), None),
                 dst.value.decode()]
# what dlsym says of a name this version hides, and of one no driver has
out["dlsym hidden"] = [n for n in ("cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2", "cuLinkAddData", "cuNoSuchEntry")
                       if not isinstance(addr(cuda, n), int) and addr(cuda, n).endswith("undefined symbol: " + n)]
# PTX newer than the emulated driver's JIT (9.9), and PTX every driver here compiles (8.0),
# handed to the export and to the entry cuGetProcAddress gives out
module = ctypes.c_void_p(0)
new, old = b".version 9.9\n.target sm_90\n", b".version 8.0\n.target sm_90\n"
out["load new"] = cuda.cuModuleLoadData(ctypes.byref(module), new)
out["load old"] = cuda.cuModuleLoadData(ctypes.byref(module), old)
cuda.cuGetProcAddress_v2(b"cuModuleLoadData", ctypes.byref(p), 12000, ctypes.c_ulonglong(0), None)
load = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(p.value)
out["gpa load new"] = load(ctypes.byref(module), new)
out["reached the real driver"] = real.cuStandInLoads()
print(json.dumps(out, sort_keys=True))
"""


def _probe(ip: D.Interposer) -> dict[str, object]:
    env = dict(os.environ, LD_LIBRARY_PATH=str(ip.lib_dir))
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(ip.real_libcuda)], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def test_the_patched_prebuilt_answers_as_the_compiled_one(
        pairs: dict[str, tuple[D.Interposer, D.Interposer]]) -> None:
    probes = {v: (_probe(c), _probe(p)) for v, (c, p) in pairs.items()}
    for v, (compiled, patched) in probes.items():
        assert patched == compiled, v
    at_124 = probes["12.4"][1]
    assert at_124["version"] == [0, 12040]
    assert at_124["version via gpa"] == 12040
    assert at_124["gpa cuMemcpyBatchAsync"] == [[0, None, 2]] * 3  # CUDA_SUCCESS, NULL, VERSION_NOT_SUFFICIENT
    assert at_124["gpa v1 batch"] == [0, False]
    assert at_124["memcpy"] == [0, "forwarded"]
    # hidden exactly as missing: dlsym says "undefined symbol: NAME" for both kinds
    assert at_124["dlsym hidden"] == ["cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2", "cuLinkAddData", "cuNoSuchEntry"]
    # PTX 9.9 refused with CUDA_ERROR_UNSUPPORTED_PTX_VERSION on both paths, 8.0 handed on
    assert (at_124["load new"], at_124["load old"], at_124["gpa load new"]) == (222, 0, 222)
    assert at_124["reached the real driver"] == 1
    at_128 = probes["12.8"][1]
    assert at_128["version"] == [0, 12080]
    assert at_128["gpa cuMemcpyBatchAsync"] == [[0, None, 2], [0, "real", 0], [0, "real", 0]]
    assert at_128["dlsym hidden"] == ["cuMemcpyBatchAsync_v2", "cuLinkAddData", "cuNoSuchEntry"]
    assert probes["13.0"][1]["version"] == [0, 13000]


def test_a_program_linking_a_hidden_name_fails_to_load(pairs: dict[str, tuple[D.Interposer, D.Interposer]],
                                                      stand_in: Path, tmp_path: Path) -> None:
    exe = tmp_path / "direct_link"
    run_gcc("-o", exe, STAND_INS / "direct_link.c", stand_in)

    def run(ip: D.Interposer, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=False,
                              env=dict(os.environ, LD_LIBRARY_PATH=str(ip.lib_dir), **env))

    for bind_now in ({}, {"LD_BIND_NOW": "1"}):
        old = run(pairs["12.4"][1], **bind_now)
        assert old.returncode == 127, old.stderr
        assert "symbol lookup error" in old.stderr
        assert "undefined symbol: cuMemcpyBatchAsync" in old.stderr
        compiled = run(pairs["12.4"][0], **bind_now)
        assert old.stderr.replace(str(pairs["12.4"][1].lib_dir), "") == compiled.stderr.replace(
            str(pairs["12.4"][0].lib_dir), "")
        new = run(pairs["12.8"][1], **bind_now)
        assert (new.returncode, new.stdout.strip()) == (0, "rc=0 copied=batch"), new.stderr


def test_patching_is_cached_and_refuses_a_file_without_the_block(
        pairs: dict[str, tuple[D.Interposer, D.Interposer]], stand_in: Path, prebuilt: Path) -> None:
    compiled, patched = pairs["12.4"]
    inc = headers_for("13.5")
    again = D.build_interposer(CudaVersion(12, 4), real_libcuda=stand_in, introductions=H.load_introductions(inc),
                               real_driver_version=13000, base_introductions=H.load_base_introductions(inc),
                               cache=patched.lib_dir.parent, prebuilt=prebuilt)
    assert (again.cache_hit, again.lib_dir, patched.cache_hit) == (True, patched.lib_dir, False)
    with pytest.raises(D.InterposerError, match=r"config blocks in \.data, want one: not a prebuilt interposer"):
        D.build_interposer(CudaVersion(12, 4), real_libcuda=stand_in, introductions=H.load_introductions(inc),
                           real_driver_version=13000, cache=patched.lib_dir.parent / "other",
                           prebuilt=compiled.library)


def test_without_a_compiler_the_installed_prebuilt_is_used(stand_in: Path, prebuilt: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no compiler on it
    monkeypatch.setattr(P, "LIBEXEC", prebuilt.parent)
    inc = headers_for("13.5")
    ip = D.build_interposer(CudaVersion(12, 8), real_libcuda=stand_in, introductions=H.load_introductions(inc),
                            real_driver_version=13000, cache=tmp_path / "cache")
    assert ip.prebuilt
    assert ip.missing == NOT_CARRIED
    assert ip.library.is_file()
    assert not (ip.lib_dir / "interposer.c").exists()


def test_the_entry_point_list_is_every_pfn_typedef_of_its_headers() -> None:
    inc = headers_for("13.5")
    names = set(H.load_introductions(inc))
    for header in INTEROP:
        names |= set(H.pfn_introductions((inc / header).read_text()))
    assert set(P.entry_points()) == names - set(D._OWN) - set(D.JIT_ENTRIES)


def test_setup_py_builds_the_prebuilt_as_the_tests_do() -> None:
    tree = ast.parse((ROOT / "setup.py").read_text())
    flags = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "INTERPOSER_FLAGS" for t in n.targets))
    assert tuple(flags) == P.COMPILE_FLAGS



def test_the_gate_reads_a_hidden_name_as_not_exported(pairs: dict[str, tuple[D.Interposer, D.Interposer]]) -> None:
    for compiled, patched in pairs.values():
        for ip in (compiled, patched):
            with ip.library.open("rb") as fh:
                elf = ELFFile(fh)
                exported, undefined = set(elf_defined_symbols(elf)), set(elf_undefined_symbols(elf))
            assert exported == set(D.exported_functions(ip.library))
            assert not undefined & set(D.exported_functions(patched.library))
        assert not set(patched.hidden) & set(D.exported_functions(patched.library))


def test_a_cell_under_the_prebuilt_names_what_it_lacks(stand_in: Path, prebuilt: Path, tmp_path: Path,
                                                      wheel_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run on a host without a compiler (PATH without gcc): the emulated driver is the
    prebuilt, patched, and the cell's record names the two stand-in exports it lacks."""
    from cumatrix.host.fingerprint import FoundLibcuda  # the search's result type, here only
    from cumatrix.load.matrix import cells as matrix_cells  # the run's own parts, here only
    from cumatrix.load.matrix import load as load_matrix
    from cumatrix.orchestrate import Orchestrator
    from cumatrix.provision import cell as provision_cell

    check = ("import ctypes; v = ctypes.c_int(); ctypes.CDLL('libcuda.so.1').cuDriverGetVersion(ctypes.byref(v)); "
             "raise SystemExit(0 if v.value == 12080 else 1)")
    m = tmp_path / "m.yaml"
    m.write_text(f"runtimes: {{cu12.9: {{wheel: nvidia-cuda-runtime-cu12==12.9.79}}}}\ndrivers: [emulated-12.8]\n"
                 f"probe: false\ncases:\n  - {{name: version, argv: [{sys.executable}, -c, \"{check}\"]}}\n")
    matrix = load_matrix(m)
    no_cc = tmp_path / "bin"
    no_cc.mkdir()
    monkeypatch.setenv("PATH", str(no_cc))
    monkeypatch.setattr(P, "LIBEXEC", prebuilt.parent)
    # This host has no NVIDIA driver: the search finds the stand-in.
    monkeypatch.setattr(provision_cell, "search_real_libcuda",
                        lambda _log: FoundLibcuda(path=stand_in, found_by="stand-in"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    orch = Orchestrator(matrix=matrix)
    orch._host_fp = {"driver_version": 13000}  # the stand-in's version, as the fingerprint would report it
    try:
        (cell,) = matrix_cells(matrix)
        rec = orch.run(cell).record
    finally:
        orch.close()
    assert rec.observed.outcome == "ok", rec.observed
    fp = rec.fingerprint
    assert "interposer" in fp["missing_evidence"]  # type: ignore[operator]
    why = next(w for w in fp["missing_evidence_why"] if w.startswith("interposer:"))  # type: ignore[attr-defined]
    assert "cuStandInLoads, cuStandInUntyped" in why
    assert not list((tmp_path / "cache").rglob("interposer.c"))  # nothing compiled


def test_the_run_warns_of_no_compiler_only_where_no_prebuilt_serves(prebuilt: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from cumatrix.front.run_cmd import _check_compiler  # the run's first lines, here only
    from cumatrix.load.matrix import load as load_matrix

    m = tmp_path / "m.yaml"
    m.write_text("runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}\ndrivers: [emulated-12.8]\n")
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler
    monkeypatch.setattr(P, "LIBEXEC", tmp_path / "none")
    _check_compiler(load_matrix(m))
    assert "emulated drivers are compiled with gcc at run time" in capsys.readouterr().err
    monkeypatch.setattr(P, "LIBEXEC", prebuilt.parent)
    _check_compiler(load_matrix(m))
    err = capsys.readouterr().err
    assert "compiled with gcc" not in err
    assert "the emulated drivers are made from the prebuilt interposer of this install" in err
