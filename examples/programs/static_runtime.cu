// A C program with a statically linked CUDA runtime (nvcc's default): one kernel launch,
// checked with cudaGetLastError and cudaDeviceSynchronize.  Built by scripts/gpu/programs.sh
// twice: for the GPU's own architecture (static13) and with machine code for sm_100 only, no
// PTX (sass_miss: on an sm_90 GPU the launch reports cudaErrorNoKernelImageForDevice, 209).
// Exits 2 on any CUDA error, as a C program may choose to (not 1, as Python does).
#include <cstdio>
#include <cuda_runtime.h>
__global__ void fill(int *p) { p[threadIdx.x] = (int)threadIdx.x; }
static int check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    std::fprintf(stderr, "%s: %s (%d)\n", what, cudaGetErrorName(e), (int)e);
    return 2;
}
int main() {
    int *p = nullptr, v = 0;
    if (check(cudaRuntimeGetVersion(&v), "cudaRuntimeGetVersion")) return 2;
    if (check(cudaMalloc(&p, 32 * sizeof(int)), "cudaMalloc")) return 2;
    fill<<<1, 32>>>(p);
    if (check(cudaGetLastError(), "launch")) return 2;
    if (check(cudaDeviceSynchronize(), "cudaDeviceSynchronize")) return 2;
    int h[32];
    if (check(cudaMemcpy(h, p, sizeof h, cudaMemcpyDeviceToHost), "cudaMemcpy")) return 2;
    for (int i = 0; i < 32; i++) if (h[i] != i) { std::fprintf(stderr, "wrong result at %d\n", i); return 2; }
    std::printf("static runtime %d ok\n", v);
    return 0;
}
