/* A STAND-IN for the real NVIDIA driver (libcuda.so.1), for hosts without a GPU: it exists
 * only so the emulated-driver interposer can be built and exercised without one. It mimics
 * the pieces of a CUDA 13.0 driver the interposer touches (docs/facts.md section 3): the version,
 * cuGetProcAddress gating by requested version, both ABIs of cuMemcpyBatchAsync. The copies
 * work on host memory only. Its load and link entry points (cuModuleLoadData, cuLinkAddData_v2,
 * ...) compile nothing: they count the calls that reached them (cuStandInLoads), so a test can
 * tell an image the interposer refused from one it handed on; its device's compute capability
 * is STAND_IN_CC (e.g. 90), 9.0 by default. Built by the tests with
 *   gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o libcuda.so.1 libcuda_stand_in.c
 */
#include <stddef.h>
#include <stdlib.h>
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

/* Loads and links that reached this "real" driver. */
static int loads;
int cuStandInLoads(void) { return loads; }
static CUresult loaded(void **handle) {
    if (handle) *handle = (void *)0x1234;
    loads++;
    return 0;
}
CUresult cuCtxGetDevice(int *dev) {
    if (!dev) return 1;
    *dev = 0;
    return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    const char *cc = getenv("STAND_IN_CC");
    int sm = cc ? atoi(cc) : 90;
    if (!v || dev != 0) return 1;
    if (attr == 75) *v = sm / 10;      /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
    else if (attr == 76) *v = sm % 10; /* _MINOR */
    else return 1;
    return 0;
}
CUresult cuModuleLoadData(void **module, const void *image) { (void)image; return loaded(module); }
CUresult cuModuleLoadDataEx(void **module, const void *image, unsigned int n, int *options, void **values) {
    (void)image; (void)n; (void)options; (void)values;
    return loaded(module);
}
CUresult cuModuleLoadFatBinary(void **module, const void *fat) { (void)fat; return loaded(module); }
CUresult cuModuleLoad(void **module, const char *fname) { (void)fname; return loaded(module); }
CUresult cuLibraryLoadData(void **library, const void *code, int *jo, void **jv, unsigned int nj, int *lo,
                           void **lv, unsigned int nl) {
    (void)code; (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    return loaded(library);
}
CUresult cuLibraryLoadFromFile(void **library, const char *file, int *jo, void **jv, unsigned int nj, int *lo,
                               void **lv, unsigned int nl) {
    (void)file; (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    return loaded(library);
}
CUresult cuLinkAddData_v2(void *state, int type, void *data, size_t size, const char *name, unsigned int n,
                          int *options, void **values) {
    (void)state; (void)type; (void)data; (void)size; (void)name; (void)n; (void)options; (void)values;
    return loaded(0);
}
CUresult cuLinkAddFile_v2(void *state, int type, const char *path, unsigned int n, int *options, void **values) {
    (void)state; (void)type; (void)path; (void)n; (void)options; (void)values;
    return loaded(0);
}

/* What cuGetProcAddress hands out for these two is not the export's address, as a real
 * driver's answer need not be: the interposer must stand in front of what it was given. */
static CUresult gpa_module_load_data(void **module, const void *image) {
    (void)image;
    return loaded(module);
}
static CUresult gpa_link_add_data(void *state, int type, void *data, size_t size, const char *name, unsigned int n,
                                  int *options, void **values) {
    (void)state; (void)type; (void)data; (void)size; (void)name; (void)n; (void)options; (void)values;
    return loaded(0);
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
    else if (strcmp(symbol, "cuModuleLoadData") == 0) p = (void *)gpa_module_load_data;
    else if (strcmp(symbol, "cuModuleLoadDataEx") == 0) p = (void *)cuModuleLoadDataEx;
    else if (strcmp(symbol, "cuModuleLoadFatBinary") == 0) p = (void *)cuModuleLoadFatBinary;
    else if (strcmp(symbol, "cuModuleLoad") == 0) p = (void *)cuModuleLoad;
    else if (strcmp(symbol, "cuLibraryLoadData") == 0) { intro = 12000; p = (void *)cuLibraryLoadData; }
    else if (strcmp(symbol, "cuLibraryLoadFromFile") == 0) { intro = 12000; p = (void *)cuLibraryLoadFromFile; }
    else if (strcmp(symbol, "cuLinkAddData") == 0) { intro = 5050; p = (void *)gpa_link_add_data; }
    else if (strcmp(symbol, "cuLinkAddFile") == 0) { intro = 5050; p = (void *)cuLinkAddFile_v2; }
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
