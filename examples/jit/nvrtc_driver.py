"""NVRTC through cuda-bindings, the PTX loaded with cuModuleLoadData: compile a kernel for the
device's own compute_XY, run it, check the result.  Exits 1 on any CUDA error (named)."""

import sys

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

SRC = b'extern "C" __global__ void add1(int *x, int n) { int i = threadIdx.x; if (i < n) x[i] += 1; }'


def check(result):
    err, *rest = result
    ok = err in (cu.CUresult.CUDA_SUCCESS, nvrtc.nvrtcResult.NVRTC_SUCCESS)
    if not ok:
        print(f"error: {err!r}", file=sys.stderr)
        sys.exit(1)
    return rest[0] if len(rest) == 1 else rest


check(cu.cuInit(0))
dev = check(cu.cuDeviceGet(0))
major = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
minor = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
ctx = check(cu.cuDevicePrimaryCtxRetain(dev))
check(cu.cuCtxSetCurrent(ctx))
prog = check(nvrtc.nvrtcCreateProgram(SRC, b"add1.cu", 0, [], []))
check(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=compute_{major}{minor}".encode()]))
size = check(nvrtc.nvrtcGetPTXSize(prog))
ptx = b" " * size
check(nvrtc.nvrtcGetPTX(prog, ptx))
print("nvrtc", check(nvrtc.nvrtcVersion()), ptx.split(b"\n.target")[0].split(b".version")[-1].strip().decode())
module = check(cu.cuModuleLoadData(ptx))
fn = check(cu.cuModuleGetFunction(module, b"add1"))
n = 32
host = np.arange(n, dtype=np.int32)
dptr = check(cu.cuMemAlloc(host.nbytes))
check(cu.cuMemcpyHtoD(dptr, host.ctypes.data, host.nbytes))
arg_ptr = np.array([int(dptr)], dtype=np.uint64)
arg_n = np.array([n], dtype=np.int32)
args = np.array([arg_ptr.ctypes.data, arg_n.ctypes.data], dtype=np.uint64)
check(cu.cuLaunchKernel(fn, 1, 1, 1, n, 1, 1, 0, 0, args.ctypes.data, 0))
check(cu.cuCtxSynchronize())
out = np.empty_like(host)
check(cu.cuMemcpyDtoH(out.ctypes.data, dptr, out.nbytes))
assert (out == host + 1).all(), out
print("ok")
