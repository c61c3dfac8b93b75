// A CUDA runtime program that runs a kernel and checks the result: exit 0 only when the
// kernel ran and every element is right; exit 1 naming the CUDA error otherwise (the launch's
// error comes from cudaGetLastError: cudaDeviceSynchronize alone would not report a kernel
// that never ran, docs/facts.md section 11).
#include <cstdio>
#include <cuda_runtime.h>

__global__ void add1(int *x, int n) {
    int i = threadIdx.x;
    if (i < n) x[i] += 1;
}

static int fail(const char *what, cudaError_t e) {
    std::fprintf(stderr, "%s: %s (%d): %s\n", what, cudaGetErrorName(e), (int)e, cudaGetErrorString(e));
    return 1;
}

int main() {
    const int n = 32;
    int host[n], *dev = nullptr;
    for (int i = 0; i < n; i++) host[i] = i;
    cudaError_t e = cudaMalloc(&dev, sizeof host);
    if (e != cudaSuccess) return fail("cudaMalloc", e);
    if ((e = cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice)) != cudaSuccess) return fail("cudaMemcpy", e);
    add1<<<1, n>>>(dev, n);
    if ((e = cudaGetLastError()) != cudaSuccess) return fail("launch", e);
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return fail("cudaDeviceSynchronize", e);
    if ((e = cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost)) != cudaSuccess) return fail("cudaMemcpy", e);
    for (int i = 0; i < n; i++)
        if (host[i] != i + 1) {
            std::fprintf(stderr, "wrong result at %d: %d\n", i, host[i]);
            return 1;
        }
    std::printf("ok\n");
    return 0;
}
