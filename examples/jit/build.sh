#!/usr/bin/env bash
# Build the JIT matrix's C programs with nvcc (run where nvcc 13.0 is installed; the GPU host
# has none): examples/jit/bin/ (git-ignored; carried to the GPU host with the checkout).
#   add1-sm100: machine code for sm_100 only, no PTX (cudaErrorNoKernelImageForDevice on sm_90)
#   add1-sm90:  machine code for sm_90, the CUDA 13 runtime linked statically (nvcc's default)
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p bin
nvcc --version | tail -1 > bin/nvcc-version.txt
nvcc -cudart static -gencode arch=compute_100,code=sm_100 -o bin/add1-sm100 add1.cu
nvcc -cudart static -gencode arch=compute_90,code=sm_90 -o bin/add1-sm90 add1.cu
ls -l bin
