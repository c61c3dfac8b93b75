"""PTX as the driver's JIT reads it: NVRTC's PTX for the device, behind comments (a block comment
before `.version`, a commented-out older `.version` first, 70 KB of comment lines), loaded with
cuModuleLoadData and linked with cuLinkAddData (CU_JIT_INPUT_PTX) through cuda-bindings; the
first form's kernel is run and checked.  Exits 1 naming the first CUDA error: a driver older
than the PTX's ISA answers CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222) to every form."""

import sys

import numpy as np
from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

SRC = b'extern "C" __global__ void add1(int *x, int n) { int i = threadIdx.x; if (i < n) x[i] += 1; }'


def check(result, what):
    err, *rest = result
    if err not in (cu.CUresult.CUDA_SUCCESS, nvrtc.nvrtcResult.NVRTC_SUCCESS):
        print(f"{what}: error: {err!r} ({int(err)})", file=sys.stderr)
        sys.exit(1)
    return rest[0] if len(rest) == 1 else rest


check(cu.cuInit(0), "cuInit")
dev = check(cu.cuDeviceGet(0), "cuDeviceGet")
major = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc")
minor = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc")
ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
prog = check(nvrtc.nvrtcCreateProgram(SRC, b"add1.cu", 0, [], []), "nvrtcCreateProgram")
check(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=compute_{major}{minor}".encode()]), "nvrtc")
size = check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
ptx = b" " * size
check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
ptx = ptx.rstrip(b"\0")
forms = {
    "block-comment-before": b"/* compiled at run time */ " + ptx,
    "commented-out-older-version": b"// .version 8.0\n/*\n.version 8.0\n*/\n" + ptx,
    "long-comment-prefix": b"// a comment line of the kind nvcc writes first\n" * 1500 + ptx,
}
print("nvrtc", check(nvrtc.nvrtcVersion(), "nvrtcVersion"), "PTX", len(ptx), "bytes")
modules = {}
for name, text in forms.items():
    modules[name] = check(cu.cuModuleLoadData(text + b"\0"), f"cuModuleLoadData {name}")
    state = check(cu.cuLinkCreate(0, [], []), "cuLinkCreate")
    check(cu.cuLinkAddData(state, cu.CUjitInputType.CU_JIT_INPUT_PTX, text + b"\0", len(text) + 1, name.encode(),
                           0, [], []), f"cuLinkAddData {name}")
    check(cu.cuLinkComplete(state), f"cuLinkComplete {name}")
    check(cu.cuLinkDestroy(state), "cuLinkDestroy")
fn = check(cu.cuModuleGetFunction(modules["block-comment-before"], b"add1"), "cuModuleGetFunction")
n = 32
host = np.arange(n, dtype=np.int32)
dptr = check(cu.cuMemAlloc(host.nbytes), "cuMemAlloc")
check(cu.cuMemcpyHtoD(dptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
arg_ptr = np.array([int(dptr)], dtype=np.uint64)
arg_n = np.array([n], dtype=np.int32)
args = np.array([arg_ptr.ctypes.data, arg_n.ctypes.data], dtype=np.uint64)
check(cu.cuLaunchKernel(fn, 1, 1, 1, n, 1, 1, 0, 0, args.ctypes.data, 0), "cuLaunchKernel")
check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
out = np.empty_like(host)
check(cu.cuMemcpyDtoH(out.ctypes.data, dptr, out.nbytes), "cuMemcpyDtoH")
assert (out == host + 1).all(), out
print("ok")
