/*
 * STAND-IN for libcuda.so.1, for tests on machines without an NVIDIA driver.  It is NOT
 * CUDA: "device" memory is malloc()ed host memory, every copy is a synchronous memcpy,
 * streams and events are fake handles.  It exists to drive the reference swap's and the
 * swap cell's own logic (entry-point resolution, version gating, fallback, chunking,
 * error reporting, byte checks); it proves nothing about CUDA's behaviour.
 *
 * Knobs (environment): STANDIN_HIDE_BATCH=1 hides the batch entry from cuGetProcAddress.
 * Streams and events for the copy-engine fan-out are recorded (which stream each batch went to,
 * how many streams were made); standin_new_context() makes the current context a new one at the
 * same address (as the driver does when a context is destroyed and another created).
 * Built with -DSTANDIN_OLD_DRIVER it exports no cuMemcpyBatchAsync at all (a pre-12.8 driver).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { int srcAccessOrder; int lt, li, dt, di; unsigned flags; } attrs_t;

#define EXPORT __attribute__((visibility("default")))
static unsigned long n_memcpy, n_batch, max_batch, n_streams, n_waits, n_batch_streams;
static unsigned long long ctx_id = 1;
static __attribute__((unused)) void *batch_streams[64];
EXPORT unsigned long standin_count(int which) {
    switch (which) {
    case 0: return n_memcpy;
    case 1: return n_batch;
    case 2: return max_batch;
    case 3: return n_streams;       /* cuStreamCreateWithPriority calls */
    case 4: return n_batch_streams; /* distinct streams the batch calls went to */
    default: return n_waits;        /* cuStreamWaitEvent calls */
    }
}
EXPORT void standin_reset(void) { n_memcpy = n_batch = max_batch = n_waits = n_batch_streams = 0; }
EXPORT void standin_new_context(void) { ctx_id++; }
EXPORT CUresult cuCtxGetCurrent(void **ctx) { *ctx = (void *)0x10; return 0; }
EXPORT CUresult cuCtxGetId(void *ctx, unsigned long long *id) { (void)ctx; *id = ctx_id; return 0; }
EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest) { *least = 0; *greatest = -5; return 0; }
EXPORT CUresult cuStreamCreateWithPriority(void **s, unsigned flags, int prio) {
    (void)flags; (void)prio; n_streams++; *s = (void *)(uintptr_t)(0x2000 + n_streams); return 0;
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
    n_batch++; if (count > max_batch) max_batch = count;
    unsigned long j = 0;
    while (j < n_batch_streams && batch_streams[j] != stream) j++;
    if (j == n_batch_streams && j < 64) batch_streams[n_batch_streams++] = stream;
    for (size_t i = 0; i < count; i++) memcpy((void *)(uintptr_t)d[i], (void *)(uintptr_t)s[i], sz[i]);
    return 0;
}
EXPORT CUresult cuMemcpyBatchAsync(CUdeviceptr *d, CUdeviceptr *s, size_t *sz, size_t count, attrs_t *a, size_t *ai,
                                   size_t na, size_t *fail, void *stream) { return batch(d, s, sz, count, a, ai, na, fail, stream); }
EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *d, CUdeviceptr *s, size_t *sz, size_t count, attrs_t *a, size_t *ai,
                                      size_t na, void *stream) { return batch(d, s, sz, count, a, ai, na, NULL, stream); }
#endif

static void *lookup(const char *sym, int version, int *status) {
    *status = 0;
    if (!strcmp(sym, "cuMemcpyAsync")) return (void *)cuMemcpyAsync;
    if (!strcmp(sym, "cuGetErrorName")) return (void *)cuGetErrorName;
    /* What the copy-engine fan-out needs (not the kernel path: no module loading here). */
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
