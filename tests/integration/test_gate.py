"""``cumatrix gate`` on real wheels holding real gcc-built extensions.

Introduction versions and ABI changes come from the headers of real runtime wheels
(fetched once into the cache), as in production.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from cumatrix.audit.static import load_audit_data
from helpers.build import shared_library
from helpers.gate import gate
from helpers.wheels import CP311_LINUX, make_wheel

if shutil.which("gcc") is None:
    if os.environ.get("CUMATRIX_REQUIRE_GCC") == "1":
        raise RuntimeError("CUMATRIX_REQUIRE_GCC=1 but gcc is not on PATH")
    pytest.skip("gcc is not on PATH (these tests build real ELF files)", allow_module_level=True)

pytestmark = pytest.mark.network  # runtime wheel headers, fetched once into the cache

# Build-time link stubs, like the toolkit's stubs/libcuda.so: STAND-INS for the NVIDIA driver
# and the CUDA runtime, which this machine does not have.  They exist only so the linker
# records a SONAME (DT_NEEDED) and undefined symbols, exactly as a real build would.
STUB_LIBCUDA = """
int cuInit(unsigned flags) { return (int)flags; }
int cuMemcpyBatchAsync(void) { return 0; }
"""
STUB_LIBCUDART = """
int cudaRuntimeGetVersion(int *v) { *v = 12090; return 0; }
"""

SOURCES = {
    # (a) links cuMemcpyBatchAsync directly, as the extension of vLLM PR 38460 did.
    "direct": ("""
#include <stddef.h>
extern int cuMemcpyBatchAsync(unsigned long long *, unsigned long long *, size_t *, size_t,
                              void *, size_t *, size_t, size_t *, void *);
int swap(void) { return cuMemcpyBatchAsync(0, 0, 0, 0, 0, 0, 0, 0, 0); }
""", ("-Lstubs", "-lcuda")),
    # (b) resolves it through cuGetProcAddress at version 12080, as vLLM PR 38919 does.
    "proc": (r"""
#include <dlfcn.h>
#include <stddef.h>
typedef int (*get_proc_t)(const char *, void **, int, unsigned long long, int *);
void *batch_entry(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return NULL;
    get_proc_t get = (get_proc_t)dlsym(h, "cuGetProcAddress_v2");
    void *fn = NULL; int status = 0;
    if (get && get("cuMemcpyBatchAsync", &fn, 12080, 0, &status) != 0) fn = NULL;
    return fn;
}
""", ("-ldl",)),
    # (c) looks the runtime's batch copy up by name, as SGLang does.
    "lookup": (r"""
#include <dlfcn.h>
void *batch_entry(void) {
    void *h = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    return h ? dlsym(h, "cudaMemcpyBatchAsync") : 0;
}
""", ("-ldl",)),
    # (d) links the CUDA 12 runtime.
    "cudart": ("""
extern int cudaRuntimeGetVersion(int *);
int runtime_version(void) { int v = 0; cudaRuntimeGetVersion(&v); return v; }
""", ("-Lstubs", "-lcudart")),
}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gate")
    (d / "stubs").mkdir()
    shared_library(d / "stubs/libcuda.so", STUB_LIBCUDA, "-Wl,-soname,libcuda.so.1")
    shared_library(d / "stubs/libcudart.so", STUB_LIBCUDART, "-Wl,-soname,libcudart.so.12")
    out: dict[str, Path] = {}
    for name, (source, args) in SOURCES.items():
        so = shared_library(d / f"_{name}.so", source, *args)
        pkg = f"demo_{name}"
        out[name] = make_wheel(d, pkg, {f"{pkg}/__init__.py": b"from . import _ext\n",
                                        f"{pkg}/_{name}.so": so.read_bytes()}, tag=CP311_LINUX)
    return out


@pytest.fixture(scope="module", autouse=True)
def _headers_fetched() -> None:
    # Fetch the runtime wheels' headers once, before any timed gate run.
    load_audit_data()


def test_direct_link_fails_below_12_8(wheels: dict[str, Path],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(wheels["direct"], "--static-only", "--min-driver", "12.4", capsys=capsys)
    assert r.rc == 1, r.out + r.err
    assert "driver-symbol-too-new" in r.out
    assert "cuMemcpyBatchAsync" in r.out
    assert "introduced in CUDA 12.8" in r.out
    assert "undefined symbol: cuMemcpyBatchAsync" in r.out
    assert "demo_direct/_direct.so" in r.out


def test_direct_link_passes_at_12_8_but_needs_libcuda(
        wheels: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(wheels["direct"], "--static-only", "--min-driver", "12.8", capsys=capsys)
    assert r.rc == 0, r.out + r.err
    assert "driver-symbol-too-new" not in r.out
    assert "WARNING  needs-libcuda" in r.out
    assert "libcuda.so.1" in r.out
    assert "cuGetProcAddress" in r.out  # the fix hint
    strict = gate(wheels["direct"], "--static-only", "--min-driver", "12.8", "--strict",
                  capsys=capsys)
    assert strict.rc == 1
    assert "ERROR    needs-libcuda" in strict.out


def test_proc_address_is_clean(wheels: dict[str, Path],
                               capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(wheels["proc"], "--static-only", "--min-driver", "12.0", "--strict",
             capsys=capsys)
    assert r.rc == 0, r.out + r.err
    assert "demo_proc/_proc.so: ok" in r.out
    assert "0 errors, 0 warnings" in r.out


def test_runtime_lookup_warns_about_abi(wheels: dict[str, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(wheels["lookup"], "--static-only", capsys=capsys)
    assert r.rc == 0, r.out + r.err
    assert "WARNING  abi-lookup" in r.out
    assert '"cudaMemcpyBatchAsync"' in r.out
    assert "cudaRuntimeGetVersion" in r.out
    assert "SGLang PR 23183" in r.out


def test_runtime_major_outside_declared(wheels: dict[str, Path],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = gate(wheels["cudart"], "--static-only", "--runtimes", "13", capsys=capsys)
    assert bad.rc == 1
    assert "runtime-major" in bad.out
    assert "libcudart.so.12" in bad.out
    for declared in ("12", "12,13"):
        good = gate(wheels["cudart"], "--static-only", "--runtimes", declared, capsys=capsys)
        assert good.rc == 0, good.out
        assert "runtime-major" not in good.out


def test_optional_downgrades(wheels: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(wheels["direct"], wheels["cudart"], "--static-only", "--min-driver", "12.4",
             "--runtimes", "13", "--strict", "--optional", "demo_direct/*.so",
             "--optional", "*/_cudart.so", capsys=capsys)
    assert r.rc == 0, r.out + r.err
    assert "ERROR" not in r.out
    assert r.out.count("[optional file]") == 3  # symbol, libcuda, runtime major


def test_out_dir_and_two_wheels(wheels: dict[str, Path], tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    r = gate(wheels["direct"], wheels["proc"], "--static-only", "--min-driver", "12.4",
             "--out", tmp_path / "out", capsys=capsys)
    assert r.rc == 1
    record = json.loads((tmp_path / "out" / "static.json").read_text())
    assert record["schema"] == 1
    assert record["type"] == "static"
    codes = {(f["wheel"], f["code"], f["subject"]) for f in record["findings"]}
    assert (wheels["direct"].name, "driver-symbol-too-new", "cuMemcpyBatchAsync") in codes
    assert [w["elves"] for w in record["wheels"]] == [["demo_direct/_direct.so"],
                                                      ["demo_proc/_proc.so"]]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("## Static audit: FAIL")
    assert "| `demo_direct/_direct.so` | error | driver-symbol-too-new |" in summary
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert junit.count("<testcase") == 2
    assert junit.count("<failure") == 1


@pytest.mark.parametrize("case", ["missing", "not-zip", "zip-not-wheel", "bad-min-driver",
                                  "bad-runtimes"])
def test_bad_input_exits_2(case: str, wheels: dict[str, Path], tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    argv: list[str | Path]
    if case == "missing":
        argv, expect = [tmp_path / "nope-1.0-py3-none-any.whl"], "no such file"
    elif case == "not-zip":
        bogus = tmp_path / "bogus-1.0-py3-none-any.whl"
        bogus.write_text("not a zip")
        argv, expect = [bogus], "not a wheel (not a zip archive)"
    elif case == "zip-not-wheel":
        plain = tmp_path / "plain-1.0-py3-none-any.whl"
        with zipfile.ZipFile(plain, "w") as zf:
            zf.writestr("x.txt", "x")
        argv, expect = [plain], "dist-info/WHEEL"
    elif case == "bad-min-driver":
        argv, expect = [wheels["proc"], "--min-driver", "12.x"], "--min-driver 12.4"
    else:
        argv, expect = [wheels["proc"], "--runtimes", "twelve"], "12,13"
    r = gate(*argv, "--static-only", capsys=capsys)
    assert r.rc == 2, r.out + r.err
    assert expect in r.err
    assert "Traceback" not in r.err
