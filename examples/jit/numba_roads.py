"""numba-cuda as its users run it: its own driver lookup (``libcuda.so`` before ``libcuda.so.1``),
then a kernel compiled by libNVVM and loaded by the driver, run and checked.  Prints the driver
the lookup reached and its cuDriverGetVersion; exits 1 naming the error where the kernel does
not load (a driver older than the PTX's ISA: CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222)."""

import ctypes
import sys

import numpy as np

if not hasattr(np, "row_stack"):
    # numba-cuda 0.30.4 calls np.row_stack, which NumPy 2.5 removed (a fact of the host's
    # packages, not of its driver: examples/h200-jit.yaml's numba-cuda case fails on it).
    np.row_stack = np.vstack

from numba import cuda
from numba.cuda.cudadrv import driver as numba_driver

dll, path = numba_driver.load_driver(*numba_driver.locate_driver_and_loader())
version = ctypes.c_int()
dll.cuDriverGetVersion(ctypes.byref(version))
print(f"numba-cuda's driver lookup: {path}, cuDriverGetVersion {version.value}", file=sys.stderr)


@cuda.jit
def add1(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


try:
    a = cuda.to_device(np.arange(32, dtype=np.int32))
    add1[1, 32](a)
    assert (a.copy_to_host() == np.arange(1, 33)).all()
except Exception as e:  # noqa: BLE001  the program reports what the driver said, whatever it is
    print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(1)
print("ok")
