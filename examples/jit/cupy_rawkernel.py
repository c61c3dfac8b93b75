"""CuPy RawKernel (NVRTC inside CuPy, the module loaded by the driver): run and check."""

import cupy as cp

k = cp.RawKernel(r'extern "C" __global__ void add1(int *x, int n) { int i = threadIdx.x; if (i < n) x[i] += 1; }',
                 "add1")
x = cp.arange(32, dtype=cp.int32)
k((1,), (32,), (x, cp.int32(32)))
assert (x.get() == list(range(1, 33))).all()
print(cp.__version__, "ok")
