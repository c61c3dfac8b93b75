"""Runtime classes the gate must see beyond DT_NEEDED, on wheels built here by gcc (and
NVIDIA's ``fatbinary``, shipped with nvcc, for PTX of a given ISA).

STAND-INS: no CUDA 11 static library exists on this machine (NVIDIA's CUDA 11 runtime wheel
ships only ``libcudart.so.11.0``), so a "static CUDA 11 runtime" is a gcc-built module that
carries what a linked ``libcudart_static.a`` leaves in a binary and what the audit reads: the
runtime's table of entry-point names (taken from the real 11.8 wheel's ``.dynsym``), its
error-name table entry ``cudaErrorCudartUnloading``, the driver it opens (``libcuda.so.1``)
and the name of the hidden driver interface it resolves (``cuGetExportTable``).  The CUDA 12 control is
built the same way from the 12.9 wheel's exports.  ``cudart_stub``-style loaders (XLA's) are
built the same way: a table of names, no runtime code, an RPATH into ``nvidia/cu13/lib``.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from cumatrix.audit.static import load_audit_data
from cumatrix.binary.elf import elf_defined_symbols
from cumatrix.provision import runtimes
from helpers.build import shared_library
from helpers.gate import gate
from helpers.wheels import CP311_LINUX, make_wheel

pytestmark = pytest.mark.network  # runtime wheels, fetched once into the cache

FATBINARY = shutil.which("fatbinary")
NVCC = shutil.which("nvcc")


def _exports(requirement: str) -> list[str]:
    """The cuda* names the real libcudart of ``requirement``'s wheel exports."""
    wheel = runtimes.fetch_wheel(requirement)
    with zipfile.ZipFile(wheel) as zf:
        lib = next(n for n in zf.namelist() if "/lib/libcudart.so." in n)
        elf = ELFFile(io.BytesIO(zf.read(lib)))
        return sorted(n for n in elf_defined_symbols(elf) if n.startswith("cuda"))


def _table(names: list[str], *extra: str) -> str:
    """C source holding ``names`` (and ``extra``) as NUL-terminated strings in .rodata."""
    items = ",\n".join(f'  "{n}"' for n in [*names, *extra])
    return (f"const char *const name_table[] __attribute__((used)) = {{\n{items}\n}};\n"
            "const char *name_at(int i) { return name_table[i]; }\n")


# What a linked libcudart_static carries besides its name table (see the module docstring).
RUNTIME_CODE = ("cudaErrorCudartUnloading", "cuGetExportTable", "libcuda.so.1")


@pytest.fixture(scope="module", autouse=True)
def _headers_fetched() -> None:
    load_audit_data()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("runtimes")
    (d / "stubs").mkdir()
    # Link stubs (STAND-INS for the CUDA 11 math libraries): only a SONAME for DT_NEEDED.
    shared_library(d / "stubs/libcublas.so", "int cublasCreate_v2(void *h) { return h != 0; }\n",
                   "-Wl,-soname,libcublas.so.11")
    shared_library(d / "stubs/libnvrtc.so", "int nvrtcVersion(int *a, int *b) { return a == b; }\n",
                   "-Wl,-soname,libnvrtc.so.11.2")
    cu11 = _exports("nvidia-cuda-runtime-cu11==11.8.89")
    cu12 = _exports(runtimes.KNOWN_WHEELS["12.9"])
    cu13 = _exports(runtimes.KNOWN_WHEELS["13.0"])
    out: dict[str, Path] = {}

    def wheel(name: str, files: dict[str, Path], requires: tuple[str, ...] = ()) -> None:
        pkg = f"rt_{name}"
        members = {f"{pkg}/__init__.py": b""}
        members.update({f"{pkg}/{rel}": p.read_bytes() for rel, p in files.items()})
        out[name] = make_wheel(d, pkg, members, requires=requires, tag=CP311_LINUX)

    static11 = shared_library(d / "_static11.so", _table(cu11, *RUNTIME_CODE),
                              "-Lstubs", "-lcublas", "-lnvrtc")
    wheel("static11", {"_ext.so": static11})
    static12 = shared_library(d / "_static12.so", _table(cu12, *RUNTIME_CODE))
    wheel("static12", {"_ext.so": static12})
    # cuda-bindings' layout: a wrapper module whose docstrings name every runtime function and
    # error (no runtime code), beside the module that carries the runtime.
    wrapper = shared_library(d / "_wrapper.so", _table(cu12, "cudaErrorCudartUnloading"))
    wheel("bindings", {"runtime.so": wrapper, "_bindings/cyruntime.so": static12})
    dl11 = shared_library(d / "_dl11.so", (
        "#include <dlfcn.h>\n"
        "void *load(void) { return dlopen(\"libcudart.so.11.0\", RTLD_NOW | RTLD_LOCAL); }\n"),
        "-ldl")
    wheel("dlopen11", {"_dl.so": dl11})
    stub13 = shared_library(d / "_stub13.so", _table(cu13, "libcuda.so.1"),
                            "-Wl,--disable-new-dtags,-rpath,$ORIGIN/../nvidia/cu13/lib")
    wheel("stub13", {"_stub.so": stub13}, ("nvidia-cuda-runtime>=13.0.48; extra == 'with-cuda'",))
    wheel("stub13_nodep", {"_stub.so": stub13})
    return out


def test_static_cuda11_runtime_is_dated_11(built: dict[str, Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    ok = gate(built["static11"], "--static-only", "--min-driver", "11.2", capsys=capsys)
    assert ok.rc == 0, ok.out + ok.err
    assert "static libcudart 12" not in ok.out
    assert "runtime-needs-newer-driver" not in ok.out
    bad = gate(built["static11"], "--static-only", "--min-driver", "11.2", "--runtimes", "12",
               capsys=capsys)
    assert bad.rc == 1, bad.out + bad.err
    assert "ERROR    runtime-major          static libcudart 11" in bad.out
    # The CUDA 12 control: the same build from the 12.9 runtime's names needs a 12.0 driver.
    c12 = gate(built["static12"], "--static-only", "--min-driver", "11.2", capsys=capsys)
    assert c12.rc == 1, c12.out
    assert "runtime-needs-newer-driver static libcudart 12" in c12.out, c12.out


def test_static_runtime_is_attributed_to_the_file_that_carries_it(
        built: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(built["bindings"], "--static-only", "--min-driver", "11.2", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    assert "  rt_bindings/runtime.so: ok" in r.out, r.out
    assert ("  rt_bindings/_bindings/cyruntime.so\n    ERROR    runtime-needs-newer-driver "
            "static libcudart 12") in r.out, r.out


def test_dlopen_of_a_literal_soname_is_a_warning(built: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(built["dlopen11"], "--static-only", "--runtimes", "12", capsys=capsys)
    assert r.rc == 0, r.out + r.err
    assert "WARNING  runtime-major          dlopen libcudart.so.11.0" in r.out, r.out
    assert "loads libcudart.so.11.0 at run time" in r.out
    quiet = gate(built["dlopen11"], "--static-only", "--runtimes", "11,12", "--min-driver",
                 "11.8", capsys=capsys)
    assert quiet.rc == 0, quiet.out
    assert "dlopen libcudart" not in quiet.out, quiet.out


def test_cudart_stub_with_agreeing_path_and_dependency_is_an_error(
        built: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    for floor in ("12.0", "12.8"):
        r = gate(built["stub13"], "--static-only", "--min-driver", floor, capsys=capsys)
        assert r.rc == 1, r.out + r.err
        assert "ERROR    runtime-needs-newer-driver dlopen libcudart (CUDA 13)" in r.out, r.out
        assert "cudart_stub-style table" in r.out
        assert "nvidia/cu13/lib" in r.out
        assert "Requires-Dist nvidia-cuda-runtime>=13.0.48" in r.out
    ok = gate(built["stub13"], "--static-only", "--min-driver", "13.0", capsys=capsys)
    assert ok.rc == 0, ok.out
    assert "runtime-needs-newer-driver" not in ok.out, ok.out
    major = gate(built["stub13"], "--static-only", "--min-driver", "13.0", "--runtimes", "12",
                 capsys=capsys)
    assert major.rc == 1, major.out
    assert "ERROR    runtime-major" in major.out, major.out
    # Without the wheel's dependency only the search path says 13: a warning.
    weak = gate(built["stub13_nodep"], "--static-only", "--min-driver", "12.8", capsys=capsys)
    assert weak.rc == 0, weak.out + weak.err
    assert "WARNING  runtime-needs-newer-driver dlopen libcudart (CUDA 13)" in weak.out


def test_runtime_symbols_are_dated_by_exports(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "stubs").mkdir()
    shared_library(tmp_path / "stubs/libcudart.so", "int cudaGetDriverEntryPointByVersion(void) { return 0; }\n",
                   "-Wl,-soname,libcudart.so.12")
    so = shared_library(tmp_path / "_floor.so", ("extern int cudaGetDriverEntryPointByVersion(void);\n"
                                                 "int f(void) { return cudaGetDriverEntryPointByVersion(); }\n"),
                        "-Lstubs", "-lcudart")
    wheel = make_wheel(tmp_path, "rt_floor", {"rt_floor/_floor.so": so.read_bytes()}, tag=CP311_LINUX)
    r = gate(wheel, "--static-only", "--min-runtime", "12.4", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    flat = " ".join(r.out.split())
    assert "first exported by libcudart 12.5 (libcudart 11.7-13.5 read)" in flat, r.out
    assert "declared" not in flat
    ok = gate(wheel, "--static-only", "--min-runtime", "12.5", capsys=capsys)
    assert ok.rc == 0, ok.out


def test_notes_of_one_kind_are_folded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = ("#include <dlfcn.h>\nextern int cudaRuntimeGetVersion(int *);\n"
           "void *batch(void) { int v = 0; cudaRuntimeGetVersion(&v);\n"
           "  void *h = dlopen(\"libcudart.so.12\", RTLD_NOW);\n"
           "  return h && v >= 12080 ? dlsym(h, \"cudaMemcpyBatchAsync\") : 0; }\n")
    (tmp_path / "stubs").mkdir()
    shared_library(tmp_path / "stubs/libcudart.so", "int cudaRuntimeGetVersion(int *v) { return !v; }\n",
                   "-Wl,-soname,libcudart.so.12")
    a = shared_library(tmp_path / "_a.so", src, "-Lstubs", "-lcudart", "-ldl")
    wheel = make_wheel(tmp_path, "rt_notes", {"rt_notes/_a.so": a.read_bytes(),
                                              "rt_notes/_b.so": a.read_bytes()}, tag=CP311_LINUX)
    r = gate(wheel, "--static-only", capsys=capsys)
    assert r.rc == 0, r.out + r.err
    assert "NOTE     abi-lookup-runtime-version x2 (-v lists each)" in r.out, r.out
    assert "rt_notes/_a.so: ok (1 note folded below)" in r.out
    assert r.out.count("NOTE     abi-lookup-runtime-version") == 1
    v = gate(wheel, "--static-only", "-v", capsys=capsys)
    assert v.out.count("NOTE     abi-lookup-runtime-version cudaMemcpyBatchAsync") == 2, v.out


def _ptx_module(d: Path, name: str, arch: int, isa: str) -> Path:
    """A shared object whose ``.nv_fatbin`` holds PTX for ``compute_<arch>`` of ISA ``isa``:
    nvcc writes the PTX (ISA 9.0), its ``.version`` line is set to ``isa`` as an older
    toolkit would have written it, NVIDIA's ``fatbinary`` packs it, objcopy adds the section."""
    assert NVCC is not None
    assert FATBINARY is not None
    (d / "k.cu").write_text("__global__ void fill(int *p) { p[threadIdx.x] = threadIdx.x; }\n")
    subprocess.run([NVCC, "-ptx", f"-arch=compute_{arch}", "k.cu", "-o", f"{name}.ptx"],
                   cwd=d, check=True, capture_output=True)
    ptx = (d / f"{name}.ptx").read_text()
    (d / f"{name}.ptx").write_text(ptx.replace(".version 9.0", f".version {isa}", 1))
    subprocess.run([FATBINARY, f"--create={name}.fatbin", "-64", "--compress=false",
                    f"--image3=kind=ptx,sm={arch},file={name}.ptx"], cwd=d, check=True,
                   capture_output=True)
    host = shared_library(d / f"{name}_host.so", "int f(void) { return 1; }\n")
    out = d / f"{name}.so"
    subprocess.run(["objcopy", "--add-section", f".nv_fatbin={name}.fatbin",
                    "--set-section-flags", ".nv_fatbin=alloc,readonly", str(host), str(out)],
                   cwd=d, check=True, capture_output=True)
    return out


@pytest.mark.skipif(NVCC is None or FATBINARY is None or shutil.which("objcopy") is None,
                    reason="needs nvcc, fatbinary and objcopy (builds PTX of a given ISA)")
def test_ptx_floor_is_raised_by_the_gpu_generation(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    def wheel(name: str, arch: int, isa: str) -> Path:
        so = _ptx_module(tmp_path, name, arch, isa)
        return make_wheel(tmp_path, f"ptx_{name}", {f"ptx_{name}/_k.so": so.read_bytes()}, tag=CP311_LINUX)

    # PTX ISA 8.5 (CUDA 12.5) for 12.0: a CC 12.0 GPU needs a 12.8 driver, which JITs it.
    ok = gate(wheel("sm120_85", 120, "8.5"), "--static-only", "--min-driver", "12.0",
              "--arch-list", "12.0", capsys=capsys)
    assert ok.rc == 0, ok.out
    assert "ptx-too-new" not in ok.out, ok.out
    # PTX ISA 8.8 (CUDA 12.9) is still too new for the 12.8 floor; the message says why.
    new = gate(wheel("sm120_88", 120, "8.8"), "--static-only", "--min-driver", "12.0",
               "--arch-list", "12.0", capsys=capsys)
    assert new.rc == 1, new.out
    assert "ptx-too-new" in new.out, new.out
    assert ("needs CUDA 12.8 (driver >= 570.26) anyway" in " ".join(
        new.out.split())), new.out
    # PTX ISA 8.7 (CUDA 12.8) for sm_90 under a 12.0 driver: a real failure, still caught.
    h = gate(wheel("sm90_87", 90, "8.7"), "--static-only", "--min-driver", "12.0",
             "--arch-list", "9.0", capsys=capsys)
    assert h.rc == 1, h.out
    assert "ptx-too-new" in h.out, h.out
    assert "anyway" not in h.out, h.out
