/* A STAND-IN for the real NVIDIA driver (libcuda.so.1), for hosts without a GPU: it exists
 * only so the emulated-driver interposer can be built and exercised without one. It mimics
 * the pieces of a CUDA 13.0 driver the interposer touches (docs/facts.md section 3): the version,
 * cuGetProcAddress gating by requested version, both ABIs of cuMemcpyBatchAsync. The copies
 * work on host memory only. Built by the tests with
 *   gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 libcuda_stand_in.c
 */
#include <stddef.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;

CUresult cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }

CUresult cuDriverGetVersion(int *v) {
    if (!v) return 1;
    *v = 13000;
    return 0;
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
    (void)stream;
    memcpy((void *)dst, (const void *)src, n);
    return 0;
}

/* 12.8 ABI: 9 parameters, failIdx before the stream. */
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                            void *attrs, size_t *attrIdxs, size_t numAttrs, size_t *failIdx,
                            CUstream stream) {
    (void)attrs; (void)attrIdxs; (void)numAttrs; (void)stream;
    for (size_t i = 0; i < count; i++) memcpy((void *)dsts[i], (const void *)srcs[i], sizes[i]);
    if (failIdx) *failIdx = (size_t)-1;
    return 0;
}

/* 13.0 ABI: 8 parameters, no failIdx. */
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                               void *attrs, size_t *attrIdxs, size_t numAttrs, CUstream stream) {
    (void)attrs; (void)attrIdxs; (void)numAttrs; (void)stream;
    for (size_t i = 0; i < count; i++) memcpy((void *)dsts[i], (const void *)srcs[i], sizes[i]);
    return 0;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    if (!name) return 1;
    *name = error == 0 ? "CUDA_SUCCESS" : "CUDA_ERROR_STAND_IN";
    return 0;
}

/* In no PFN_ typedef: the interposer keeps exports of unknown introduction version. */
int cuStandInUntyped(void) { return 42; }

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
    int status = 0;
    return cuGetProcAddress_v2(symbol, pfn, version, flags, &status);
}

/* As measured on driver 13.0 (docs/facts.md section 3): below a symbol's introduction the answer is
 * CUDA_SUCCESS, NULL, status 2 (CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT). */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status) {
    (void)flags;
    if (!symbol || !pfn) return 1;
    void *p = 0;
    int intro = 2000;
    if (strcmp(symbol, "cuMemcpyBatchAsync") == 0) {
        intro = 12080;
        p = version >= 13000 ? (void *)cuMemcpyBatchAsync_v2 : (void *)cuMemcpyBatchAsync;
    } else if (strcmp(symbol, "cuGetProcAddress") == 0) {
        intro = 11030;
        p = version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    } else if (strcmp(symbol, "cuInit") == 0) p = (void *)cuInit;
    else if (strcmp(symbol, "cuDriverGetVersion") == 0) p = (void *)cuDriverGetVersion;
    else if (strcmp(symbol, "cuMemcpyAsync") == 0) { intro = 4000; p = (void *)cuMemcpyAsync; }
    else if (strcmp(symbol, "cuGetErrorName") == 0) { intro = 6000; p = (void *)cuGetErrorName; }
    else {
        *pfn = 0;
        if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
        return 500;              /* CUDA_ERROR_NOT_FOUND */
    }
    if (version < intro) {
        *pfn = 0;
        if (status) *status = 2;
        return 0;
    }
    *pfn = p;
    if (status) *status = 0;
    return 0;
}
