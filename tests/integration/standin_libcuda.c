/*
 * STAND-IN for libcuda.so.1, for tests on machines without an NVIDIA driver.  It is NOT
 * CUDA: "device" memory is malloc()ed host memory, every copy is a synchronous memcpy,
 * streams and events are fake handles.  It exists to drive the reference swap's and the
 * swap cell's own logic (entry-point resolution, version gating, fallback, chunking,
 * error reporting, byte checks); it proves nothing about CUDA's behaviour.
 *
 * Knobs (environment): STANDIN_HIDE_BATCH=1 hides the batch entry from cuGetProcAddress.
 * STANDIN_KERNEL=1 also hands out what the copy-kernel path needs (modules, launches, a memory
 * pool); a module loads only from the image standin_nvrtc.c "compiles", and a launch of
 * kvswap_copy_blocks / kvswap_copy_params does on the host what the kernel does on a GPU.
 * Thread-safe (atomic counters, a lock around the stream bookkeeping): the ThreadSanitizer test
 * drives it from several threads at once.
 * Streams and events for the copy-engine fan-out are recorded (which stream each batch went to,
 * how many streams were made); standin_new_context() makes the current context a new one at the
 * same address (as the driver does when a context is destroyed and another created).
 * Built with -DSTANDIN_OLD_DRIVER it exports no cuMemcpyBatchAsync at all (a pre-12.8 driver).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { int srcAccessOrder; int lt, li, dt, di; unsigned flags; } attrs_t;

#define EXPORT __attribute__((visibility("default")))
static _Atomic unsigned long n_memcpy, n_batch, max_batch, n_streams, n_waits, n_batch_streams, n_launch;
static _Atomic unsigned long long ctx_id = 1;
static __attribute__((unused)) void *batch_streams[64];
static __attribute__((unused)) pthread_mutex_t batch_mu = PTHREAD_MUTEX_INITIALIZER; /* guards batch_streams */
EXPORT unsigned long standin_count(int which) {
    switch (which) {
    case 0: return n_memcpy;
    case 1: return n_batch;
    case 2: return max_batch;
    case 3: return n_streams;       /* cuStreamCreateWithPriority calls */
    case 4: return n_batch_streams; /* distinct streams the batch calls went to */
    case 6: return n_launch;        /* cuLaunchKernel calls */
    default: return n_waits;        /* cuStreamWaitEvent calls */
    }
}
EXPORT void standin_reset(void) { n_memcpy = n_batch = max_batch = n_waits = n_batch_streams = n_launch = 0; }
EXPORT void standin_new_context(void) { ctx_id++; }
EXPORT CUresult cuCtxGetCurrent(void **ctx) { *ctx = (void *)0x10; return 0; }
EXPORT CUresult cuCtxGetId(void *ctx, unsigned long long *id) { (void)ctx; *id = ctx_id; return 0; }
EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) { *least = 0; *greatest = -5; return 0; }
EXPORT CUresult cuStreamCreateWithPriority(void **s, unsigned flags, int prio) {
    (void)flags; (void)prio; unsigned long k = ++n_streams; *s = (void *)(uintptr_t)(0x2000 + k); return 0;
}
EXPORT CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) { (void)s; (void)e; (void)flags; n_waits++; return 0; }

EXPORT CUresult cuInit(unsigned flags) { (void)flags; return 0; }
EXPORT CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
EXPORT CUresult cuDeviceGet(int *d, int ordinal) { *d = ordinal; return ordinal == 0 ? 0 : 101; }
EXPORT CUresult cuDeviceGetName(char *name, int len, int dev) { (void)dev; strncpy(name, "stand-in", (size_t)len); return 0; }
EXPORT CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) { (void)dev; *ctx = (void *)0x10; return 0; }
EXPORT CUresult cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
EXPORT CUresult cuCtxSynchronize(void) { return 0; }
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { *p = (CUdeviceptr)(uintptr_t)malloc(n); return *p ? 0 : 2; }
EXPORT CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) { (void)flags; *p = malloc(n); return *p ? 0 : 2; }
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return 0; }
EXPORT CUresult cuMemFreeHost(void *p) { free(p); return 0; }
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { memcpy((void *)(uintptr_t)d, s, n); return 0; }
EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return 0; }
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { memset((void *)(uintptr_t)d, v, n); return 0; }
EXPORT CUresult cuStreamCreate(void **s, unsigned flags) { (void)flags; *s = (void *)0x1000; return 0; }
EXPORT CUresult cuEventCreate(void **e, unsigned flags) { (void)flags; *e = calloc(1, sizeof(double)); return 0; }
EXPORT CUresult cuEventRecord(void *e, void *s) {
    (void)s; struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    *(double *)e = t.tv_sec * 1e3 + t.tv_nsec / 1e6; return 0;
}
EXPORT CUresult cuEventSynchronize(void *e) { (void)e; return 0; }
EXPORT CUresult cuEventElapsedTime(float *ms, void *a, void *b) { *ms = (float)(*(double *)b - *(double *)a); if (*ms <= 0) *ms = 1e-4f; return 0; }

EXPORT CUresult cuGetErrorName(CUresult rc, const char **s) {
    *s = rc == 0 ? "CUDA_SUCCESS" : rc == 1 ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, void *stream) {
    (void)stream; n_memcpy++; memcpy((void *)(uintptr_t)d, (void *)(uintptr_t)s, n); return 0;
}
#ifndef STANDIN_OLD_DRIVER
static CUresult batch(CUdeviceptr *d, CUdeviceptr *s, size_t *sz, size_t count, attrs_t *a, size_t *ai, size_t na,
                      size_t *fail, void *stream) {
    /* Like the real driver (vLLM issue 46345): the legacy stream is an invalid value at index 0. */
    if (stream == NULL || (uintptr_t)stream == 1) { if (fail) *fail = 0; return 1; }
    if (na != 1 || !a || !ai || ai[0] != 0 || a->srcAccessOrder != 1) { if (fail) *fail = SIZE_MAX; return 1; }
    n_batch++;
    pthread_mutex_lock(&batch_mu);
    if (count > max_batch) max_batch = count;
    unsigned long j = 0;
    while (j < n_batch_streams && batch_streams[j] != stream) j++;
    if (j == n_batch_streams && j < 64) batch_streams[n_batch_streams++] = stream;
    pthread_mutex_unlock(&batch_mu);
    for (size_t i = 0; i < count; i++) memcpy((void *)(uintptr_t)d[i], (void *)(uintptr_t)s[i], sz[i]);
    return 0;
}
EXPORT CUresult cuMemcpyBatchAsync(CUdeviceptr *d, CUdeviceptr *s, size_t *sz, size_t count, attrs_t *a, size_t *ai,
                                   size_t na, size_t *fail, void *stream) { return batch(d, s, sz, count, a, ai, na, fail, stream); }
EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *d, CUdeviceptr *s, size_t *sz, size_t count, attrs_t *a, size_t *ai,
                                      size_t na, void *stream) { return batch(d, s, sz, count, a, ai, na, NULL, stream); }
#endif

/* The copy-kernel path (STANDIN_KERNEL=1).  "Device" memory is host memory, so a launch copies
 * the blocks right away, as the kernel would; the parameter layout is kvswap_kernel.cu.h's. */
#define STANDIN_IMAGE "STANDIN-IMAGE"
#define FN_BLOCKS ((void *)0x4001)
#define FN_PARAMS ((void *)0x4002)
typedef struct { unsigned long long n, size; unsigned slices, pad; unsigned long long addr[2 * 2040]; } params_t;
EXPORT CUresult cuCtxGetDevice(int *dev) { *dev = 0; return 0; }
EXPORT CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    (void)dev;
    switch (attr) {
    case 75: *v = 9; break;  /* compute capability 9.0 */
    case 76: *v = 0; break;
    case 115: *v = 1; break; /* memory pools supported */
    case 41: *v = 1; break;  /* unified addressing */
    case 16: *v = 4; break;  /* multiprocessors */
    default: *v = 0;
    }
    return 0;
}
EXPORT CUresult cuModuleLoadData(void **mod, const void *image) {
    if (strncmp((const char *)image, STANDIN_IMAGE, strlen(STANDIN_IMAGE)) != 0) return 200; /* INVALID_IMAGE */
    *mod = (void *)0x3000;
    return 0;
}
EXPORT CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
    (void)mod;
    if (!strcmp(name, "kvswap_copy_blocks")) *fn = FN_BLOCKS;
    else if (!strcmp(name, "kvswap_copy_params")) *fn = FN_PARAMS;
    else return 500; /* NOT_FOUND */
    return 0;
}
EXPORT CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shmem, void *stream, void **args, void **extra) {
    (void)gy; (void)gz; (void)by; (void)bz; (void)shmem; (void)stream; (void)extra;
    if (!gx || !bx || !args) return 1;
    n_launch++;
    if (fn == FN_PARAMS) {
        const params_t *p = args[0];
        for (unsigned long long i = 0; i < p->n; i++)
            memcpy((void *)(uintptr_t)p->addr[2040 + i], (void *)(uintptr_t)p->addr[i], p->size);
        return 0;
    }
    if (fn != FN_BLOCKS) return 400; /* INVALID_HANDLE */
    const unsigned long long *srcs = *(unsigned long long **)args[0], *dsts = *(unsigned long long **)args[1];
    const unsigned long long *sizes = *(unsigned long long **)args[2];
    unsigned long long uniform = *(unsigned long long *)args[3], n = *(unsigned long long *)args[4];
    for (unsigned long long i = 0; i < n; i++)
        memcpy((void *)(uintptr_t)dsts[i], (void *)(uintptr_t)srcs[i], sizes ? sizes[i] : uniform);
    return 0;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *stream) {
    (void)stream; memcpy((void *)(uintptr_t)d, s, n); return 0;
}
EXPORT CUresult cuMemPoolCreate(void **pool, const void *props) { (void)props; *pool = (void *)0x5000; return 0; }
EXPORT CUresult cuMemPoolSetAttribute(void *pool, int attr, void *value) {
    (void)pool; (void)attr; (void)value; return 0;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, void *pool, void *stream) {
    (void)pool; (void)stream; *p = (CUdeviceptr)(uintptr_t)malloc(n); return *p ? 0 : 2;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, void *stream) { (void)stream; free((void *)(uintptr_t)p); return 0; }
/* No pointer attributes: callers of the kernel path here name the direction. */
EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
    (void)data; (void)attr; (void)p; return 1;
}
EXPORT CUresult cuEventQuery(void *e) { (void)e; return 0; }
EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void *fn, int threads, size_t shmem) {
    (void)fn; (void)threads; (void)shmem; *n = 8; return 0;
}

static void *kernel_lookup(const char *sym) {
    static const struct { const char *name; void *fn; } table[] = {
        {"cuCtxGetDevice", (void *)cuCtxGetDevice}, {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
        {"cuModuleLoadData", (void *)cuModuleLoadData}, {"cuModuleGetFunction", (void *)cuModuleGetFunction},
        {"cuLaunchKernel", (void *)cuLaunchKernel}, {"cuMemcpyHtoDAsync", (void *)cuMemcpyHtoDAsync_v2},
        {"cuMemPoolCreate", (void *)cuMemPoolCreate}, {"cuMemPoolSetAttribute", (void *)cuMemPoolSetAttribute},
        {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync}, {"cuMemFreeAsync", (void *)cuMemFreeAsync},
        {"cuPointerGetAttribute", (void *)cuPointerGetAttribute}, {"cuEventQuery", (void *)cuEventQuery},
        {"cuMemHostAlloc", (void *)cuMemHostAlloc}, {"cuMemFreeHost", (void *)cuMemFreeHost},
        {"cuOccupancyMaxActiveBlocksPerMultiprocessor", (void *)cuOccupancyMaxActiveBlocksPerMultiprocessor},
        {"cuDriverGetVersion", (void *)cuDriverGetVersion},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(sym, table[i].name)) return table[i].fn;
    return NULL;
}

static void *lookup(const char *sym, int version, int *status) {
    *status = 0;
    const char *kernel = getenv("STANDIN_KERNEL");
    void *k = kernel && !strcmp(kernel, "1") ? kernel_lookup(sym) : NULL;
    if (k) return k;
    if (!strcmp(sym, "cuMemcpyAsync")) return (void *)cuMemcpyAsync;
    if (!strcmp(sym, "cuGetErrorName")) return (void *)cuGetErrorName;
    /* What the copy-engine fan-out needs (the kernel path's entries: kernel_lookup). */
    if (!strcmp(sym, "cuCtxGetCurrent")) return (void *)cuCtxGetCurrent;
    if (!strcmp(sym, "cuCtxGetId")) return (void *)cuCtxGetId;
    if (!strcmp(sym, "cuCtxGetStreamPriorityRange")) return (void *)cuCtxGetStreamPriorityRange;
    if (!strcmp(sym, "cuStreamCreateWithPriority")) return (void *)cuStreamCreateWithPriority;
    if (!strcmp(sym, "cuEventCreate")) return (void *)cuEventCreate;
    if (!strcmp(sym, "cuEventRecord")) return (void *)cuEventRecord;
    if (!strcmp(sym, "cuStreamWaitEvent")) return (void *)cuStreamWaitEvent;
#ifndef STANDIN_OLD_DRIVER
    if (!strcmp(sym, "cuMemcpyBatchAsync") && !getenv("STANDIN_HIDE_BATCH")) {
        if (version < 12080) { *status = 2; return NULL; } /* CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT */
        return version >= 13000 ? (void *)cuMemcpyBatchAsync_v2 : (void *)cuMemcpyBatchAsync;
    }
#endif
    *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    return NULL;
}
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, unsigned long long flags, int *status) {
    (void)flags; int st; *pfn = lookup(sym, version, &st); if (status) *status = st; return 0;
}
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int version, unsigned long long flags) {
    (void)flags; int st; *pfn = lookup(sym, version, &st); return *pfn ? 0 : 500;
}
