"""Triton through torch: a kernel compiled at run time (PTX from Triton's LLVM, assembled by
ptxas into a cubin the driver loads); run and check."""

import torch
import triton
import triton.language as tl


@triton.jit
def add1(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


x = torch.arange(32, device="cuda", dtype=torch.int32)
add1[(1,)](x, 32, BLOCK=32)
assert x.cpu().tolist() == list(range(1, 33))
print(torch.__version__, triton.__version__, "ok")
