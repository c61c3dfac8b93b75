"""numba-cuda: a kernel compiled by libNVVM to PTX and linked by the driver; run and check."""

import numpy as np
from numba import cuda


@cuda.jit
def add1(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


a = cuda.to_device(np.arange(32, dtype=np.int32))
add1[1, 32](a)
assert (a.copy_to_host() == np.arange(1, 33)).all()
print("ok")
