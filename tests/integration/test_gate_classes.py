"""The failure classes real CUDA wheels ship, on wheels built here by gcc and by nvcc.

gcc builds host-only extensions against link stubs (STAND-INS for libcuda/libcudart, which
this machine does not have: they only give the linker a SONAME and symbols); nvcc (when on
PATH) builds real device code with its default, statically linked runtime.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from cumatrix.audit.static import StaticAudit, load_audit_data
from helpers.build import shared_library
from helpers.gate import gate
from helpers.wheels import CP311_LINUX, make_wheel

pytestmark = pytest.mark.network  # runtime wheel headers, fetched once into the cache

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH (builds device code)")

STUBS = {
    "libcuda.so": (("int cuInit(unsigned f) { return (int)f; }\n"
                    "int cuMemAlloc_v2(void *p, unsigned long n) { return p && n; }\n"),
                   "libcuda.so.1"),
    "libcudart.so": (("int cudaRuntimeGetVersion(int *v) { *v = 12040; return 0; }\n"
                      "int cudaDriverGetVersion(int *v) { *v = 13000; return 0; }\n"
                      "int cudaGetDriverEntryPointByVersion(void) { return 0; }\n"),
                     "libcudart.so.12"),
    "libcudart13.so": ("int cudaRuntimeGetVersion(int *v) { *v = 13000; return 0; }\n",
                       "libcudart.so.13"),
}

# The batch copy looked up by name, its ABI picked from the driver's version (the SIGSEGV of
# SGLang PR 23172) or from the runtime's (the fix, SGLang PR 23183).
DISPATCH = r"""
#include <dlfcn.h>
extern int {query}(int *);
void *batch_entry(void) {{
    int v = 0;
    {query}(&v);
    void *h = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    /* the caller casts the result to the 12.x or the 13.x prototype by v */
    return h && v >= 12080 ? dlsym(h, "cudaMemcpyBatchAsync") : 0;
}}
"""

HOST_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    # Calls the driver API but was linked without -lcuda (Mooncake issue 724).
    "underlinked": (("extern int cuMemAlloc_v2(void *, unsigned long);\n"
                     "int alloc(void *p) { return cuMemAlloc_v2(p, 16); }\n"), ()),
    "by_driver": (DISPATCH.format(query="cudaDriverGetVersion"), ("-Lstubs", "-lcudart", "-ldl")),
    "by_runtime": (DISPATCH.format(query="cudaRuntimeGetVersion"),
                   ("-Lstubs", "-lcudart", "-ldl")),
    # Links a runtime entry point that CUDA 12.5 introduced.
    "floor": (("extern int cudaGetDriverEntryPointByVersion(void);\n"
               "int f(void) { return cudaGetDriverEntryPointByVersion(); }\n"),
              ("-Lstubs", "-lcudart")),
    # Needs libcudart.so.13.
    "cudart13": (("extern int cudaRuntimeGetVersion(int *);\n"
                  "int f(void) { int v; return cudaRuntimeGetVersion(&v); }\n"),
                 ("-Lstubs", "-lcudart13")),
}

KERNEL = r"""
__global__ void fill(int *p) { p[threadIdx.x] = threadIdx.x; }
extern "C" int run(void) {
    int *d = 0;
    if (cudaMalloc(&d, 64 * sizeof(int)) != cudaSuccess) return 1;
    fill<<<1, 64>>>(d);
    return (int)cudaDeviceSynchronize();
}
"""

NVCC_BUILDS: dict[str, tuple[str, ...]] = {
    "sass_only": ("-gencode", "arch=compute_80,code=sm_80"),
    "ptx_only": ("-gencode", "arch=compute_90,code=compute_90"),
    "full": ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
             "-gencode", "arch=compute_90a,code=sm_90a",
             "-gencode", "arch=compute_90,code=compute_90"),
    "compressed": ("-gencode", "arch=compute_75,code=[sm_75,compute_75]",
                   "-Xfatbin=-compress-all"),
}


@pytest.fixture(scope="module", autouse=True)
def _headers_fetched() -> None:
    load_audit_data()


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("classes")
    (d / "stubs").mkdir()
    for lib, (src, soname) in STUBS.items():
        shared_library(d / f"stubs/{lib}", src, f"-Wl,-soname,{soname}")
    out: dict[str, Path] = {}
    for name, (src, args) in HOST_SOURCES.items():
        so = shared_library(d / f"_{name}.so", src, *args)
        pkg = f"demo_{name}"
        files = {f"{pkg}/__init__.py": f"from . import _{name}\n".encode(),
                 f"{pkg}/_{name}.so": so.read_bytes()}
        if name == "underlinked":
            files[f"{pkg}/__init__.py"] = (
                f"try:\n    from . import _{name}\nexcept ImportError:\n    _{name} = None\n"
            ).encode()
        out[name] = make_wheel(d, pkg, files, tag=CP311_LINUX)
    return out


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if NVCC is None:
        pytest.skip("nvcc is not on PATH (builds device code)")
    d = tmp_path_factory.mktemp("nvcc")
    (d / "k.cu").write_text(KERNEL)
    out: dict[str, Path] = {}
    for name, flags in NVCC_BUILDS.items():
        so = d / f"_{name}.so"
        subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", *flags, "k.cu", "-o", so.name],
                       cwd=d, check=True, capture_output=True)
        pkg = f"dev_{name}"
        out[name] = make_wheel(d, pkg, {f"{pkg}/__init__.py": f"from . import _{name}\n".encode(),
                                        f"{pkg}/_{name}.so": so.read_bytes()}, tag=CP311_LINUX)
    return out


def test_underlinked_driver_symbols(host: dict[str, Path],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(host["underlinked"], "--static-only", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    assert "ERROR    underlinked-libcuda" in r.out
    assert "cuMemAlloc_v2" in r.out
    assert "cuGetProcAddress" in r.out
    assert "Mooncake issue 724" in r.out
    # It is imported only under try/except ImportError: said so, with the option to use.
    assert "NOTE     optional-import" in r.out
    assert "--optional 'demo_underlinked/_underlinked.so'" in r.out
    ok = gate(host["underlinked"], "--static-only", "--optional", "*/_underlinked.so",
              capsys=capsys)
    assert ok.rc == 0, ok.out


def test_dispatch_from_driver_version_is_an_error(host: dict[str, Path],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(host["by_driver"], "--static-only", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    assert "ERROR    abi-lookup-driver-version" in r.out
    assert "cudaDriverGetVersion" in r.out
    assert "SGLang PR 23172" in r.out


def test_dispatch_from_runtime_version_is_a_note(host: dict[str, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(host["by_runtime"], "--static-only", capsys=capsys)
    assert r.rc == 0, r.out + r.err
    assert "NOTE     abi-lookup-runtime-version" in r.out
    assert "ERROR" not in r.out
    assert "WARNING  abi-lookup" not in r.out


def test_runtime_floor(host: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    old = gate(host["floor"], "--static-only", "--min-runtime", "12.4", capsys=capsys)
    assert old.rc == 1, old.out + old.err
    assert "runtime-symbol-too-new" in old.out
    assert "cudaGetDriverEntryPointByVersion" in old.out
    new = gate(host["floor"], "--static-only", "--min-runtime", "12.8", capsys=capsys)
    assert new.rc == 0, new.out + new.err
    # The default floor is X.0 of the lowest --runtimes major.
    default = gate(host["floor"], "--static-only", "--runtimes", "12", capsys=capsys)
    assert default.rc == 1
    assert "runtime-symbol-too-new" in default.out


def test_runtime_major_needs_driver(host: dict[str, Path],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(host["cudart13"], "--static-only", "--min-driver", "12.8", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    assert "runtime-needs-newer-driver" in r.out
    assert "580.65.06" in r.out
    fc = gate(host["cudart13"], "--static-only", "--min-driver", "12.8", "--forward-compat",
              capsys=capsys)
    assert fc.rc == 0, fc.out + fc.err
    assert "NOTE     runtime-needs-newer-driver" in fc.out
    assert "cuda-compat" in fc.out
    at13 = gate(host["cudart13"], "--static-only", "--min-driver", "13.0", capsys=capsys)
    assert at13.rc == 0
    assert "runtime-needs-newer-driver" not in at13.out


def test_findings_round_trip(host: dict[str, Path], tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(host["by_driver"], host["underlinked"], "--static-only", "--out", tmp_path,
             capsys=capsys)
    assert r.rc == 1
    record = json.loads((tmp_path / "static.json").read_text())
    audit = StaticAudit.from_json(record)
    assert audit.to_json() == record
    assert audit.errors == 2
    assert [w.wheel.name for w in audit.wheels] == [
        host["by_driver"].name, host["underlinked"].name]


@needs_nvcc
def test_static_cudart_is_seen_and_not_lookups(device: dict[str, Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(device["sass_only"], "--static-only", "--min-driver", "12.8", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    assert "static libcudart 13" in r.out
    assert "runtime-needs-newer-driver" in r.out
    # The static runtime's own tables name cudaMemcpyBatchAsync & co: not lookups.
    assert "abi-lookup" not in r.out
    ok = gate(device["sass_only"], "--static-only", "--min-driver", "13.0", capsys=capsys)
    assert ok.rc == 0, ok.out


@needs_nvcc
def test_sass_only_coverage(device: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    # sm_80 SASS runs on 8.0 and 8.6 (a later minor), not on 9.0; no PTX to JIT.
    r = gate(device["sass_only"], "--static-only", "--min-driver", "13.0",
             "--arch-list", "8.0 8.6 9.0", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    assert "no-device-code" in r.out
    assert "sm_90" in r.out
    assert "no kernel image is available for execution on the device" in r.out
    assert "sm_86" not in r.out
    assert "sm_80 " not in r.out.split("[SASS")[0]


@needs_nvcc
def test_ptx_only_needs_a_driver_for_its_isa(device: dict[str, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # nvcc 13.0 writes PTX ISA 9.0, which a driver older than CUDA 13.0 cannot JIT.
    old = gate(device["ptx_only"], "--static-only", "--min-driver", "12.8", "--forward-compat",
               "--arch-list", "9.0;10.0", capsys=capsys)
    assert old.rc == 1, old.out + old.err
    assert "ptx-too-new" in old.out
    assert "PTX ISA 9.0" in old.out
    assert "(222)" in old.out
    new = gate(device["ptx_only"], "--static-only", "--min-driver", "13.0",
               "--arch-list", "9.0 10.0 12.0", capsys=capsys)
    assert new.rc == 0, new.out + new.err
    # PTX compiles forward only: 8.0 is older than compute_90.
    below = gate(device["ptx_only"], "--static-only", "--min-driver", "13.0",
                 "--arch-list", "8.0", capsys=capsys)
    assert below.rc == 1
    assert "no-device-code" in below.out


@needs_nvcc
def test_full_build_and_arch_table(device: dict[str, Path], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(device["full"], device["compressed"], "--static-only", "--min-driver", "13.0",
             "--arch-list", "7.5 8.0 8.9 9.0 10.0 12.0", "--out", tmp_path, capsys=capsys)
    summary = (tmp_path / "summary.md").read_text()
    assert "### Device code per file" in summary
    assert ("| `dev_full/_full.so` | sm_80, sm_90, sm_90a | compute_90 (PTX ISA 9.0) | "
            in summary), summary
    assert "| `dev_compressed/_compressed.so` | sm_75 | compute_75 (PTX ISA 9.0) | yes |" \
        in summary
    record = StaticAudit.from_json(json.loads((tmp_path / "static.json").read_text()))
    full = record.wheels[0]
    assert full.device[0].sass == ("sm_80", "sm_90", "sm_90a")
    # full covers everything from 8.0 up (SASS, then compute_90 PTX); 7.5 only the other.
    assert r.rc == 1
    errors = {(f.file, f.subject) for w in record.wheels for f in w.findings
              if f.severity == "error"}
    assert errors == {("dev_full/_full.so", "sm_75")}, errors


@needs_nvcc
def test_arch_specific_sass_runs_only_on_its_arch(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert NVCC is not None
    (tmp_path / "k.cu").write_text(KERNEL)
    subprocess.run([NVCC, "-shared", "-Xcompiler", "-fPIC", "-gencode",
                    "arch=compute_90a,code=sm_90a", "k.cu", "-o", "_a.so"], cwd=tmp_path,
                   check=True, capture_output=True)
    wheel = make_wheel(tmp_path, "dev_a", {"dev_a/_a.so": (tmp_path / "_a.so").read_bytes()}, tag=CP311_LINUX)
    ok = gate(wheel, "--static-only", "--min-driver", "13.0", "--arch-list", "9.0",
              capsys=capsys)
    assert ok.rc == 0, ok.out
    # Code for sm_90a only is a Hopper kernel set that a library loads on 9.0 alone (vLLM's
    # _flashmla_C): a dispatch target for 10.0, said as a note, never an error.
    other = gate(wheel, "--static-only", "--min-driver", "13.0", "--arch-list", "9.0 10.0",
                 capsys=capsys)
    assert other.rc == 0, other.out
    assert "dispatch-target" in other.out
    assert "sm_100" in other.out


def test_bad_arch_list_exits_2(host: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(host["floor"], "--static-only", "--arch-list", "nine", capsys=capsys)
    assert r.rc == 2
    assert "not a GPU architecture" in r.err


def test_optional_import_only_when_every_import_is_guarded(
        host: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with zipfile.ZipFile(host["underlinked"]) as zf:
        so = zf.read("demo_underlinked/_underlinked.so")
    wheel = make_wheel(tmp_path, "demo_plain", {
        "demo_plain/__init__.py": b"try:\n    from . import _x\nexcept ImportError:\n    pass\n",
        "demo_plain/ops.py": b"from demo_plain._x import alloc\n",  # unguarded: not optional
        "demo_plain/_x.so": so,
    }, tag=CP311_LINUX)
    r = gate(wheel, "--static-only", capsys=capsys)
    assert r.rc == 1
    assert "underlinked-libcuda" in r.out
    assert "optional-import" not in r.out


MODULES = {
    # SASS for 8.0 and 9.0 only: no code a 10.0 GPU can run
    "rows.cu": (("__global__ void scale_rows(float *p) { p[threadIdx.x] *= 2.0f; }\n"
                "extern \"C\" int run_rows(float *p) { scale_rows<<<1, 32>>>(p); return (int)cudaGetLastError(); }\n"),
                ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90")),
    # SASS for 8.0 and PTX: the driver compiles it for any newer GPU
    "fill.cu": (("__global__ void fill(int *p) { p[threadIdx.x] = threadIdx.x; }\n"
                "extern \"C\" int run_fill(int *p) { fill<<<1, 32>>>(p); return (int)cudaGetLastError(); }\n"),
                ("-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_80,code=compute_80")),
}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One library of two kernel modules (two translation units) built with different -gencode lists."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH (builds device code)")
    d = tmp_path_factory.mktemp("mixed")
    objects = []
    for name, (src, flags) in MODULES.items():
        (d / name).write_text(src)
        obj = name.replace(".cu", ".o")
        subprocess.run([NVCC, "-c", "-Xcompiler", "-fPIC", *flags, name, "-o", obj], cwd=d, check=True,
                       capture_output=True)
        objects.append(obj)
    subprocess.run([NVCC, "-shared", *objects, "-o", "_mixed.so"], cwd=d, check=True, capture_output=True)
    return make_wheel(d, "dev_mixed", {"dev_mixed/__init__.py": b"from . import _mixed\n",
                                       "dev_mixed/_mixed.so": (d / "_mixed.so").read_bytes()}, tag=CP311_LINUX)


def test_coverage_is_per_module(mixed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, coverage was the union over the file: fill's PTX "covered" 10.0 for scale_rows
    too, and the gate passed a library whose scale_rows has no kernel image on a 10.0 GPU."""
    r = gate(mixed, "--static-only", "--min-driver", "13.0", "--arch-list", "8.0 9.0 10.0", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    text = " ".join(r.out.split())
    assert "ERROR no-device-code sm_100" in text
    # The CUDA runtime's own module (no kernel) is not counted; one kernel of the failing module is named.
    assert "1 of 2 kernel modules (fat binary containers)" in text
    assert "e.g. kernel _Z10scale_rowsPf" in text
    assert "sm_90 " not in text.split("ERROR", 1)[1]  # 9.0 is covered by every module
    # One cause, one line: 10.0 and 12.0 lack code in the same module.
    both = gate(mixed, "--static-only", "--min-driver", "13.0", "--arch-list", "9.0 10.0 12.0", capsys=capsys)
    assert both.out.count("ERROR") == 1, both.out
    assert "ERROR    no-device-code         sm_100, sm_120" in both.out
    assert "the same for compute capability 12.0" in " ".join(both.out.split())
    ok = gate(mixed, "--static-only", "--min-driver", "13.0", "--arch-list", "8.0 9.0", capsys=capsys)
    assert ok.rc == 0, ok.out
