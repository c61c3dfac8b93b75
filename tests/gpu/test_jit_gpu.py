"""The emulated drivers' PTX ceiling on a real GPU: PTX from the host's NVRTC, its `.version`
set to each side of every ceiling, loaded with cuModuleLoadData (directly and through
cuGetProcAddress) under the real driver and emulated 12.4, 12.8 and 12.9 drivers.

A real driver compiles PTX up to its own release's ISA (docs/facts.md section 11): the real
13.0 driver loads all of them; an emulated X.Y answers 222 for PTX newer than X.Y's ISA and
hands the rest to the real JIT, which loads it.  Needs a GPU, gcc and NVRTC (libnvrtc.so.13 or
.12 on the library path); skipped with the reason otherwise (``CUMATRIX_REQUIRE_GPU=1`` turns
the skip into a failure).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cumatrix.core.model import CudaVersion
from cumatrix.execute.driverquery import read_driver_version
from cumatrix.host.fingerprint import find_real_libcuda
from cumatrix.provision import drivers as D
from cumatrix.provision import headers as H
from cumatrix.provision.runtimes import headers_for
from helpers.gpu import gpu_reason

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def interposers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, D.Interposer]:
    reason = gpu_reason()
    if reason:
        if os.environ.get("CUMATRIX_REQUIRE_GPU") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_GPU=1 but {reason}")
        pytest.skip(reason)
    real = find_real_libcuda()
    assert real is not None
    inc = headers_for("13.0")
    cache = tmp_path_factory.mktemp("interposers")
    return {v: D.build_interposer(CudaVersion.parse(v), real_libcuda=real, introductions=H.load_introductions(inc),
                                  real_driver_version=read_driver_version(real),
                                  base_introductions=H.load_base_introductions(inc), cache=cache)
            for v in ("12.4", "12.8", "12.9")}


# The child: NVRTC compiles a kernel to PTX for the device; its .version is set to each ISA
# asked, and each is loaded with cuModuleLoadData and through cuGetProcAddress's pointer.
_CHILD = r'''
import ctypes, json, re, sys
cuda = ctypes.CDLL("libcuda.so.1")
for name in ("libnvrtc.so.13", "libnvrtc.so.12"):
    try:
        nvrtc = ctypes.CDLL(name)
        break
    except OSError:
        nvrtc = None
if nvrtc is None:
    print(json.dumps({"skip": "no NVRTC (libnvrtc.so.13/.12) on the library path"}))
    sys.exit(0)
assert cuda.cuInit(0) == 0
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
major, minor = ctypes.c_int(), ctypes.c_int()
cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
prog = ctypes.c_void_p()
src = b'extern "C" __global__ void add1(int *x) { x[threadIdx.x] += 1; }'
assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
arch = f"--gpu-architecture=compute_{major.value}{minor.value}".encode()
assert nvrtc.nvrtcCompileProgram(prog, 1, (ctypes.c_char_p * 1)(arch)) == 0
size = ctypes.c_size_t()
nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
buf = ctypes.create_string_buffer(size.value)
nvrtc.nvrtcGetPTX(prog, buf)
ptx = buf.value
native = re.search(rb"\.version\s+(\d+\.\d+)", ptx).group(1).decode()
pfn, status = ctypes.c_void_p(), ctypes.c_int()
assert cuda.cuGetProcAddress_v2(b"cuModuleLoadData", ctypes.byref(pfn), 12000, ctypes.c_ulonglong(0),
                                ctypes.byref(status)) == 0
via_gpa = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(pfn.value)
out = {"native": native}
for isa in sys.argv[1].split(","):
    image = re.sub(rb"\.version\s+\d+\.\d+", b".version " + isa.encode(), ptx, count=1)
    mod = ctypes.c_void_p()
    out[isa] = [cuda.cuModuleLoadData(ctypes.byref(mod), image), via_gpa(ctypes.byref(mod), image)]
print(json.dumps(out))
'''

ISAS = ("8.4", "8.5", "8.7", "8.8", "9.0")


def _loads(lib_dir: str | None) -> dict[str, object]:
    env = dict(os.environ)
    if lib_dir:
        env["LD_LIBRARY_PATH"] = lib_dir + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    proc = subprocess.run([sys.executable, "-c", _CHILD, ",".join(ISAS)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    if "skip" in result:
        pytest.skip(str(result["skip"]))
    return result


def test_emulated_drivers_refuse_ptx_beyond_their_ceiling(interposers: dict[str, D.Interposer]) -> None:
    real = _loads(None)
    assert real["native"] == "9.0"  # NVRTC 13.0 (docs/facts.md section 11)
    assert all(real[isa] == [0, 0] for isa in ISAS), real
    ceilings = {"12.4": "8.4", "12.8": "8.7", "12.9": "8.8"}
    for version, ip in interposers.items():
        got = _loads(str(ip.lib_dir))
        for isa in ISAS:
            want = 0 if tuple(map(int, isa.split("."))) <= tuple(map(int, ceilings[version].split("."))) else 222
            assert got[isa] == [want, want], (version, isa, got)
