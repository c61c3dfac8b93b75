"""NVRTC 13 through the driver API, no CUDA runtime at all: compile a kernel to PTX for
compute_90, load it with cuModuleLoadData, launch it, check the result.  Its process maps
libcuda.so.1, libnvrtc.so.13 and libnvrtc-builtins, never a libcudart (FACTS.md section 12).
Exits 0 when the kernel wrote what it should, 1 on any CUDA or NVRTC error."""

import ctypes
import sys

from cuda.bindings import driver as d
from cuda.bindings import nvrtc as n

SRC = b'extern "C" __global__ void fill(int *p) { p[threadIdx.x] = 2 * (int)threadIdx.x; }'


def ok(result: tuple, what: str) -> tuple:
    err = result[0]
    if int(err) != 0:
        print(f"{what}: {err}", file=sys.stderr)
        sys.exit(1)
    return result[1:]


(prog,) = ok(n.nvrtcCreateProgram(SRC, b"fill.cu", 0, [], []), "nvrtcCreateProgram")
ok(n.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=compute_90"]), "nvrtcCompileProgram")
(size,) = ok(n.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
ptx = b" " * size
ok(n.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
ok(d.cuInit(0), "cuInit")
(dev,) = ok(d.cuDeviceGet(0), "cuDeviceGet")
(ctx,) = ok(d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
ok(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
(mod,) = ok(d.cuModuleLoadData(ptx), "cuModuleLoadData")
(fn,) = ok(d.cuModuleGetFunction(mod, b"fill"), "cuModuleGetFunction")
(buf,) = ok(d.cuMemAlloc(32 * 4), "cuMemAlloc")
arg = ctypes.c_void_p(int(buf))
args = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
ok(d.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, ctypes.addressof(args), 0), "cuLaunchKernel")
ok(d.cuCtxSynchronize(), "cuCtxSynchronize")
out = (ctypes.c_int * 32)()
ok(d.cuMemcpyDtoH(ctypes.addressof(out), buf, 32 * 4), "cuMemcpyDtoH")
if list(out) != [2 * i for i in range(32)]:
    print(f"wrong result: {list(out)[:8]}", file=sys.stderr)
    sys.exit(1)
print("nvrtc", n.nvrtcVersion()[1:], "driver", d.cuDriverGetVersion()[1], "ok")
