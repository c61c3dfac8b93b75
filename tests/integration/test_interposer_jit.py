"""The emulated driver's PTX ceiling: PTX newer than the emulated driver's JIT is refused with
CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222) before the real driver sees it.

The "real" driver is a STAND-IN (tests/stand_ins/libcuda_stand_in.c: its load and link entry
points compile nothing and count the calls that reach them); the PTX and fat binaries are
real, made by nvcc on this machine and by NVRTC from the ``nvidia-cuda-nvrtc`` wheels (NVRTC
compiles without a GPU); the interposer, gcc and the dynamic loader are real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from cumatrix.binary.fatbin import file_device_code, read_fatbin
from cumatrix.binary.ptx import ptx_version
from cumatrix.core.model import CudaVersion
from cumatrix.predict.jit import no_usable_code
from cumatrix.provision import drivers as D
from cumatrix.provision import headers as H
from cumatrix.provision.runtimes import fetch_wheel, headers_for
from helpers.build import run_gcc
from helpers.results import read_cells

STAND_INS = Path(__file__).resolve().parents[1] / "stand_ins"
KERNEL = 'extern "C" __global__ void add1(int *x) { x[threadIdx.x] += 1; }\n'

if shutil.which("gcc") is None:
    pytest.skip("gcc is not on PATH (the interposer is compiled with it)", allow_module_level=True)

pytestmark = pytest.mark.network  # NVRTC and the headers come from real wheels


def _nvcc() -> str:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed (the CUDA toolkit's compiler makes the fat binaries)")
    return nvcc


@pytest.fixture(scope="module")
def interposers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, D.Interposer]:
    d = tmp_path_factory.mktemp("stand-in-driver")
    run_gcc("-shared", "-fPIC", "-Wall", "-Werror", "-Wl,-soname,libcuda.so.1", "-o", d / "libcuda.so.1",
            STAND_INS / "libcuda_stand_in.c")
    inc = headers_for("13.5")
    intro, bases = H.load_introductions(inc), H.load_base_introductions(inc)
    cache = tmp_path_factory.mktemp("interposers")
    return {v: D.build_interposer(CudaVersion.parse(v), real_libcuda=d / "libcuda.so.1", introductions=intro,
                                  real_driver_version=13000, base_introductions=bases, cache=cache)
            for v in ("12.4", "12.8", "12.9", "13.0")}


def _nvrtc_lib(requirement: str, member_dir: str, out: Path) -> Path:
    """The directory of a real NVRTC wheel's libraries, unpacked under ``out``."""
    with zipfile.ZipFile(fetch_wheel(requirement)) as zf:
        for m in zf.namelist():
            if m.startswith(member_dir) and ".alt." not in m and ".so" in m:
                zf.extract(m, out)
    return out / member_dir


# PTX for compute_90 from a real NVRTC, through its C API, in a child of its own (two NVRTC
# majors in one process would share libnvrtc-builtins names).
_NVRTC_CHILD = r"""
import ctypes, sys
from pathlib import Path
lib = Path(sys.argv[1])
for builtins in lib.glob("libnvrtc-builtins.so.*"):
    ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)  # NVRTC dlopen()s it by name
nvrtc = ctypes.CDLL(str(lib / sys.argv[2]))
prog = ctypes.c_void_p()
kernel = b'extern "C" __global__ void add1(int *x) { x[threadIdx.x] += 1; }'
assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), kernel, b"k.cu", 0, None, None) == 0
opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=compute_90")
assert nvrtc.nvrtcCompileProgram(prog, 1, opts) == 0
size = ctypes.c_size_t()
assert nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size)) == 0
buf = ctypes.create_string_buffer(size.value)
assert nvrtc.nvrtcGetPTX(prog, buf) == 0
sys.stdout.buffer.write(buf.raw.rstrip(b"\0"))
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Device code made by real compilers: PTX from NVRTC 13.0 and 12.8, fat binaries from nvcc."""
    d = tmp_path_factory.mktemp("images")
    out = {}
    for name, req, member, soname in (
            ("nvrtc13.ptx", "nvidia-cuda-nvrtc==13.0.88", "nvidia/cu13/lib", "libnvrtc.so.13"),
            ("nvrtc128.ptx", "nvidia-cuda-nvrtc-cu12==12.8.93", "nvidia/cuda_nvrtc/lib", "libnvrtc.so.12")):
        lib = _nvrtc_lib(req, member, d / name.removesuffix(".ptx"))
        code = subprocess.run([sys.executable, "-c", _NVRTC_CHILD, str(lib), soname],
                              capture_output=True, check=False, timeout=300)
        assert code.returncode == 0, code.stderr.decode()
        (d / name).write_bytes(code.stdout)
        out[name] = d / name
    (d / "k.cu").write_text(KERNEL)
    nvcc = _nvcc()
    for name, gencode in (("ptx-only.fatbin", "arch=compute_90,code=compute_90"),
                          ("sm90-and-ptx.fatbin", "arch=compute_90,code=[sm_90,compute_90]"),
                          ("sm100-only.fatbin", "arch=compute_100,code=sm_100"),
                          ("ptx90a.fatbin", "arch=compute_90a,code=compute_90a")):
        subprocess.run([nvcc, "-fatbin", "-gencode", gencode, "-o", str(d / name), str(d / "k.cu")],
                       check=True, capture_output=True, timeout=300)
        out[name] = d / name
    subprocess.run([nvcc, "-ptx", "-arch=compute_90", "-o", str(d / "nvcc.ptx"), str(d / "k.cu")],
                   check=True, capture_output=True, timeout=300)
    out["nvcc.ptx"] = d / "nvcc.ptx"
    return out


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Executables built by nvcc: machine code for sm_100 only, and for sm_90 plus its PTX."""
    d = tmp_path_factory.mktemp("programs")
    (d / "k.cu").write_text(KERNEL + "int main() { return 0; }\n")
    out = {}
    for name, gencode in (("add1-sm100", "arch=compute_100,code=sm_100"),
                          ("add1-sm90", "arch=compute_90,code=[sm_90,compute_90]")):
        subprocess.run([_nvcc(), "-gencode", gencode, "-o", str(d / name), str(d / "k.cu")],
                       check=True, capture_output=True, timeout=300)
        out[name] = d / name
    return out


def test_device_code_of_a_mapped_program(programs: dict[str, Path]) -> None:
    """What the observation reads of each object a cell mapped, and what the oracle makes of it."""
    sm100 = file_device_code(str(programs["add1-sm100"]))
    assert {c.label() for c in sm100} == {"sm_100"}
    found = no_usable_code(((str(programs["add1-sm100"]), sm100),), 90, 13000)
    assert found is not None
    assert found[0] == "no-kernel-image"
    assert "add1-sm100 has no code for sm_90 (it has sm_100)" in found[1]
    sm90 = file_device_code(str(programs["add1-sm90"]))
    assert {c.label() for c in sm90} == {"compute_90 (PTX ISA 9.0)", "sm_90"}
    assert no_usable_code(((str(programs["add1-sm90"]), sm90),), 90, 12040) is None
    # the PTX alone would not do on a 12.x driver: on sm_100 only the PTX serves, and it is 9.0
    refused = no_usable_code(((str(programs["add1-sm90"]), sm90),), 100, 12080)
    assert refused is not None
    assert refused[0] == "jit-ptx-too-new"
    assert file_device_code(str(STAND_INS / "libcuda_stand_in.c")) == ()  # no ELF file: nothing


def test_the_ptx_reader_on_real_compilers(images: dict[str, Path]) -> None:
    assert ptx_version(images["nvrtc13.ptx"].read_bytes()) == (9, 0)
    assert ptx_version(images["nvrtc128.ptx"].read_bytes()) == (8, 7)
    assert ptx_version(images["nvcc.ptx"].read_bytes()) == (9, 0)

    def codes(name: str) -> list[str]:
        data = images[name].read_bytes()
        with images[name].open("rb") as fh:
            return [c.label() for c in read_fatbin(fh, 0, len(data))]

    # nvcc 13.0 compresses the PTX of a fat binary: the ISA comes from the entry's header
    assert codes("ptx-only.fatbin") == ["compute_90 (PTX ISA 9.0)"]
    assert sorted(codes("sm90-and-ptx.fatbin")) == ["compute_90 (PTX ISA 9.0)", "sm_90"]
    assert codes("sm100-only.fatbin") == ["sm_100"]
    assert codes("ptx90a.fatbin") == ["compute_90a (PTX ISA 9.0)"]


_LOADS = r"""
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
real = ctypes.CDLL(sys.argv[1])
images = json.loads(sys.argv[2])
out = {}
def counted(call):
    before = real.cuStandInLoads()
    rc = call()
    return [rc, real.cuStandInLoads() - before]
def gpa(name):
    p = ctypes.c_void_p(0); st = ctypes.c_int(-1)
    assert cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(p), 13000, ctypes.c_ulonglong(0), ctypes.byref(st)) == 0
    return p.value
mod = ctypes.c_void_p()
for name, path in images.items():
    data = open(path, "rb").read()
    image = ctypes.create_string_buffer(data, len(data) + 1)  # PTX is handed over NUL-terminated
    out[name] = {
        "cuModuleLoadData": counted(lambda: cuda.cuModuleLoadData(ctypes.byref(mod), image)),
        "cuModuleLoadDataEx": counted(lambda: cuda.cuModuleLoadDataEx(ctypes.byref(mod), image, 0, None, None)),
        "cuModuleLoadFatBinary": counted(lambda: cuda.cuModuleLoadFatBinary(ctypes.byref(mod), image)),
        "cuModuleLoad": counted(lambda: cuda.cuModuleLoad(ctypes.byref(mod), path.encode())),
        "cuLibraryLoadData": counted(lambda: cuda.cuLibraryLoadData(ctypes.byref(mod), image, None, None, 0, None, None, 0)),
        "cuLibraryLoadFromFile": counted(lambda: cuda.cuLibraryLoadFromFile(ctypes.byref(mod), path.encode(), None, None, 0, None, None, 0)),
        # CU_JIT_INPUT_PTX (1) / CU_JIT_INPUT_FATBINARY (2), the size given, no NUL
        "cuLinkAddData_v2": counted(lambda: cuda.cuLinkAddData_v2(None, 2 if path.endswith("fatbin") else 1, image, ctypes.c_size_t(len(data)), b"k", 0, None, None)),
        "cuLinkAddFile_v2": counted(lambda: cuda.cuLinkAddFile_v2(None, 2 if path.endswith("fatbin") else 1, path.encode(), 0, None, None)),
    }
    # the same entry points fetched through cuGetProcAddress (as the CUDA runtime and
    # cuda-bindings get them) are the interposer's too
    load = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(gpa("cuModuleLoadData"))
    out[name]["gpa:cuModuleLoadData"] = counted(lambda: load(ctypes.byref(mod), image))
    add = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p)(gpa("cuLinkAddData"))
    out[name]["gpa:cuLinkAddData"] = counted(lambda: add(None, 2 if path.endswith("fatbin") else 1, image, len(data), b"k", 0, None, None))
print(json.dumps(out))
"""

REFUSED, PASSED = [222, 0], [0, 1]


def _loads(ip: D.Interposer, images: dict[str, Path], cc: str = "90") -> dict[str, dict[str, list[int]]]:
    env = dict(os.environ, LD_LIBRARY_PATH=str(ip.lib_dir), STAND_IN_CC=cc)
    proc = subprocess.run([sys.executable, "-c", _LOADS, str(ip.real_libcuda),
                           json.dumps({k: str(v) for k, v in images.items()})],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, dict[str, list[int]]] = json.loads(proc.stdout)
    return result


def _all(result: dict[str, list[int]]) -> set[tuple[int, int]]:
    return {(rc, reached) for rc, reached in result.values()}


def test_ptx_newer_than_the_emulated_driver_is_refused(interposers: dict[str, D.Interposer],
                                                       images: dict[str, Path]) -> None:
    at = {v: _loads(ip, images) for v, ip in interposers.items()}
    # PTX ISA 9.0 (NVRTC 13.0, nvcc 13.0) needs a 13.0 driver: 222 below it, at every entry
    # point, without the real driver being called
    for v in ("12.4", "12.8", "12.9"):
        for name in ("nvrtc13.ptx", "nvcc.ptx", "ptx-only.fatbin", "ptx90a.fatbin"):
            assert _all(at[v][name]) == {tuple(REFUSED)}, (v, name, at[v][name])
    # PTX ISA 8.7 (NVRTC 12.8) needs 12.8
    assert _all(at["12.4"]["nvrtc128.ptx"]) == {tuple(REFUSED)}
    assert _all(at["12.8"]["nvrtc128.ptx"]) == {tuple(PASSED)}
    assert _all(at["12.9"]["nvrtc128.ptx"]) == {tuple(PASSED)}
    # machine code for the device goes to the real driver; so does a fat binary with none for
    # it and no PTX (the real driver answers 209 for that, as an old one would)
    for v in at:
        assert _all(at[v]["sm90-and-ptx.fatbin"]) == {tuple(PASSED)}, v
        assert _all(at[v]["sm100-only.fatbin"]) == {tuple(PASSED)}, v
        assert _all(at[v]["nvrtc13.ptx"]) == ({tuple(PASSED)} if v == "13.0" else {tuple(REFUSED)})


def test_fatbin_ptx_for_another_device_is_the_real_drivers_to_answer(interposers: dict[str, D.Interposer],
                                                                     images: dict[str, Path]) -> None:
    # compute_90a PTX serves sm_90 only: on an sm_100 device it is no code for the device, so
    # the real driver answers (no kernel image), not the ceiling
    on_100 = _loads(interposers["12.8"], {"ptx90a.fatbin": images["ptx90a.fatbin"],
                                          "sm90-and-ptx.fatbin": images["sm90-and-ptx.fatbin"]}, cc="100")
    assert _all(on_100["ptx90a.fatbin"]) == {tuple(PASSED)}
    # sm_90 SASS does not run on sm_100: the only code for it is compute_90 PTX ISA 9.0
    assert _all(on_100["sm90-and-ptx.fatbin"]) == {tuple(REFUSED)}


def test_tables_carry_the_ceiling_and_the_jit_entry_points(interposers: dict[str, D.Interposer]) -> None:
    tables = {v: (ip.lib_dir / "tables.h").read_text() for v, ip in interposers.items()}
    assert "#define PTX_CEILING 804" in tables["12.4"]
    assert "#define PTX_CEILING 807" in tables["12.8"]
    assert "#define PTX_CEILING 808" in tables["12.9"]
    assert "#define PTX_CEILING 900" in tables["13.0"]
    assert "#define HAS_cuModuleLoadData 1" in tables["12.4"]
    assert "#define HAS_cuLinkAddData 0" in tables["12.4"]  # the stand-in exports only _v2
    assert "X(cuModuleLoadData," not in tables["12.4"]  # the interposer's own, not forwarded


def test_a_cell_records_the_device_code_of_what_it_mapped(programs: dict[str, Path], write_matrix: Any,
                                                          cli: Any, tmp_path: Path) -> None:
    """The observation reads the fat binaries of the objects a cell's processes mapped (here the
    nvcc-built executable itself): what the oracle weighs against the GPU."""
    m = write_matrix(f"""
        version: 1
        runtimes: {{cu13.0: {{wheel: nvidia-cuda-runtime==13.0.96}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: sm100, argv: [{programs["add1-sm100"]}]}}
    """)
    cli("run", m, "--out", tmp_path / "out")
    [rec] = read_cells(tmp_path / "out").values()
    assert rec["fingerprint"]["device_code"] == {str(programs["add1-sm100"]): ["sm_100"]}


def test_the_prebuilt_interposer_refuses_as_the_compiled_one(interposers: dict[str, D.Interposer],
                                                             images: dict[str, Path],
                                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    # The platform wheel's prebuilt (data/interposer.c with -DCUMATRIX_RUNTIME_CONFIG, as setup.py
    # builds it), patched per version: every image, every entry point, the same answers.
    from cumatrix.provision import prebuilt_driver as P  # the prebuilt's build flags, here only

    prebuilt = tmp_path_factory.mktemp("libexec") / P.PREBUILT_NAME
    run_gcc(*P.COMPILE_FLAGS, "-o", prebuilt, Path(str(resources.files("cumatrix").joinpath("data/interposer.c"))),
            "-ldl")
    inc = headers_for("13.5")
    intro, bases = H.load_introductions(inc), H.load_base_introductions(inc)
    cache = tmp_path_factory.mktemp("patched")
    for v, compiled in interposers.items():
        patched = D.build_interposer(CudaVersion.parse(v), real_libcuda=compiled.real_libcuda, introductions=intro,
                                     real_driver_version=13000, base_introductions=bases, cache=cache,
                                     prebuilt=prebuilt)
        assert patched.prebuilt
        assert _loads(patched, images) == _loads(compiled, images), v


CORPUS = Path(__file__).resolve().parents[1] / "ptx_corpus"
#: PTX ISA 9.0 as the driver's JIT reads it, written in the ways a reader of the first
#: `.version` line missed (tests/ptx_corpus: the same files the C and Python readers share).
COMMENT_FORMS = ("block-comment-before.ptx", "line-comment-decoy.ptx", "block-comment-decoy-across-lines.ptx",
                 "byte-order-mark.ptx", "long-comment-prefix.ptx", "comment-inside-directive.ptx")


def test_ptx_behind_comments_is_refused_at_every_entry_point(interposers: dict[str, D.Interposer]) -> None:
    forms = {name: CORPUS / name for name in COMMENT_FORMS}
    for v in ("12.4", "12.8"):
        at = _loads(interposers[v], forms)
        assert {name: _all(r) for name, r in at.items()} == {n: {tuple(REFUSED)} for n in COMMENT_FORMS}, v
    at_13 = _loads(interposers["13.0"], forms)
    assert {name: _all(r) for name, r in at_13.items()} == {n: {tuple(PASSED)} for n in COMMENT_FORMS}


_LINK_INPUTS = r"""
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
real = ctypes.CDLL(sys.argv[1])
inputs = json.loads(sys.argv[2])  # path -> CUjitInputType
def counted(call):
    before = real.cuStandInLoads()
    rc = call()
    return [rc, real.cuStandInLoads() - before]
def gpa(name):
    p = ctypes.c_void_p(0); st = ctypes.c_int(-1)
    assert cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(p), 13000, ctypes.c_ulonglong(0), ctypes.byref(st)) == 0
    return p.value
add = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                       ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p)(gpa("cuLinkAddData"))
add_file = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint,
                            ctypes.c_void_p, ctypes.c_void_p)(gpa("cuLinkAddFile"))
out = {}
for path, kind in inputs.items():
    data = open(path, "rb").read()
    buf = ctypes.create_string_buffer(data, len(data))
    out[path] = {
        "cuLinkAddData_v2": counted(lambda: cuda.cuLinkAddData_v2(None, kind, buf, ctypes.c_size_t(len(data)), b"k", 0, None, None)),
        "cuLinkAddFile_v2": counted(lambda: cuda.cuLinkAddFile_v2(None, kind, path.encode(), 0, None, None)),
        "gpa:cuLinkAddData": counted(lambda: add(None, kind, buf, len(data), b"k", 0, None, None)),
        "gpa:cuLinkAddFile": counted(lambda: add_file(None, kind, path.encode(), 0, None, None)),
    }
print(json.dumps(out))
"""

CU_JIT_INPUT_OBJECT, CU_JIT_INPUT_LIBRARY = 3, 4


def test_ptx_inside_host_objects_and_libraries_is_refused(interposers: dict[str, D.Interposer],
                                                          tmp_path: Path) -> None:
    """A PTX-only fat binary inside a host object's .nv_fatbin (CU_JIT_INPUT_OBJECT) and inside
    an ar archive (CU_JIT_INPUT_LIBRARY), compressed by nvcc's default and not, by data and by
    file: refused below 13.0 as a fat binary of the same PTX is; an object with SASS for the
    device goes to the real driver."""
    nvcc, ar = _nvcc(), shutil.which("ar")
    if ar is None:
        pytest.skip("ar (binutils) is not installed")
    (tmp_path / "k.cu").write_text(KERNEL)
    inputs: dict[str, int] = {}
    for tag, gencode, flags in (("ptx", "arch=compute_90,code=compute_90", []),
                                ("ptx-plain", "arch=compute_90,code=compute_90", ["--no-compress"]),
                                ("sass", "arch=compute_90,code=[sm_90,compute_90]", [])):
        obj, lib = tmp_path / f"{tag}.o", tmp_path / f"lib{tag}.a"
        subprocess.run([nvcc, "-c", "-gencode", gencode, *flags, "-o", str(obj), str(tmp_path / "k.cu")],
                       check=True, capture_output=True, timeout=300)
        subprocess.run([ar, "rcs", str(lib), str(obj)], check=True, capture_output=True, timeout=60)
        inputs[str(obj)], inputs[str(lib)] = CU_JIT_INPUT_OBJECT, CU_JIT_INPUT_LIBRARY

    def run(ip: D.Interposer) -> dict[str, set[tuple[int, int]]]:
        env = dict(os.environ, LD_LIBRARY_PATH=str(ip.lib_dir), STAND_IN_CC="90")
        proc = subprocess.run([sys.executable, "-c", _LINK_INPUTS, str(ip.real_libcuda), json.dumps(inputs)],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        return {Path(p).name: _all(r) for p, r in json.loads(proc.stdout).items()}

    refused, passed = {tuple(REFUSED)}, {tuple(PASSED)}
    at_128 = run(interposers["12.8"])
    assert at_128 == {"ptx.o": refused, "libptx.a": refused, "ptx-plain.o": refused, "libptx-plain.a": refused,
                      "sass.o": passed, "libsass.a": passed}
    assert run(interposers["13.0"]) == dict.fromkeys(at_128, passed)
