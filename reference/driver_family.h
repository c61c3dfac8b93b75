/*
 * driver_family.h - driver-API variants that link nothing: libcuda.so.1 is dlopen()ed and
 * every entry point comes from cuGetProcAddress (vLLM PR 38919, the fix for PR 38460's
 * `undefined symbol: cuMemcpyBatchAsync` on drivers older than 12.8).
 *
 * A variant defines, before including this file:
 *   KV_VARIANT_NAME   its name
 *   KV_USE_BATCH      1: try cuMemcpyBatchAsync (pinned to the 12.8 ABI); 0: per-block loop only
 *   KV_USE_KERNEL     1: also the copy-kernel path and the path policy (kernel_path.h); default 0
 */
#ifndef KV_DRIVER_FAMILY_H
#define KV_DRIVER_FAMILY_H

#include <dlfcn.h>
#include <pthread.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "kvswap_internal.h"

#ifndef KV_USE_KERNEL
#define KV_USE_KERNEL 0
#endif

_Static_assert(sizeof(CUdeviceptr) == sizeof(void *), "CUdeviceptr must hold a pointer");

/* The 9-parameter ABI cuGetProcAddress hands out when asked for version 12080: it ends in
 * (size_t *failIdx, CUstream).  CUDA 13 headers #define the name to the 8-parameter _v2, so
 * the type is spelt out here rather than taken from the headers' prototype. */
#if CUDA_VERSION >= 12080
typedef CUmemcpyAttributes kv_cu_attrs;
typedef PFN_cuMemcpyBatchAsync_v12080 kv_cu_batch_fn;
#else
typedef struct {
    int srcAccessOrder; /* CUmemcpySrcAccessOrder */
    struct { int type; int id; } srcLocHint, dstLocHint;
    unsigned int flags;
} kv_cu_attrs;
typedef CUresult (*kv_cu_batch_fn)(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                   kv_cu_attrs *attrs, size_t *attrIdxs, size_t numAttrs, size_t *failIdx,
                                   CUstream hStream);
#endif
#define KV_CU_SRC_ACCESS_ORDER_STREAM 1 /* CU_MEMCPY_SRC_ACCESS_ORDER_STREAM */
#define KV_CU_BATCH_ABI_VERSION 12080

typedef CUresult (*kv_cu_gpa_v2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*kv_cu_gpa_v1_fn)(const char *, void **, int, cuuint64_t);
typedef CUresult (*kv_cu_memcpy_async_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*kv_cu_error_name_fn)(CUresult, const char **);

static struct {
    int code; /* 0, or KVSWAP_E_* when resolution failed */
    char message[200];
    kv_cu_memcpy_async_fn memcpy_async;
    kv_cu_batch_fn batch; /* NULL: the driver has no 12.8 batch entry -> fallback */
    kv_cu_error_name_fn error_name;
} kv_drv;

static pthread_once_t kv_drv_once = PTHREAD_ONCE_INIT;

static inline void *kv_drv_lookup(kv_cu_gpa_v2_fn gpa2, kv_cu_gpa_v1_fn gpa1, const char *name, int version) {
    void *fn = NULL;
    if (gpa2) {
        CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        if (gpa2(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS ||
            found != CU_GET_PROC_ADDRESS_SUCCESS)
            return NULL; /* e.g. status 2, VERSION_NOT_SUFFICIENT, for the batch copy below 12.8 */
    } else if (gpa1(name, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT) != CUDA_SUCCESS) {
        return NULL;
    }
    return fn;
}

#if KV_USE_KERNEL
static void kv_kernel_resolve(kv_cu_gpa_v2_fn gpa2, kv_cu_gpa_v1_fn gpa1);
#endif

static inline void kv_drv_resolve(void) {
    /* The driver is already in the process if CUDA was initialised; this just takes a reference. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        kv_drv.code = KVSWAP_E_NO_LIBRARY;
        snprintf(kv_drv.message, sizeof kv_drv.message, "cannot load libcuda.so.1: %s", why ? why : "?");
        return;
    }
    /* cuGetProcAddress_v2 (CUDA 12.0+) reports why a symbol is missing; the 11.3 one does not. */
    kv_cu_gpa_v2_fn gpa2 = (kv_cu_gpa_v2_fn)dlsym(lib, "cuGetProcAddress_v2");
    kv_cu_gpa_v1_fn gpa1 = gpa2 ? NULL : (kv_cu_gpa_v1_fn)dlsym(lib, "cuGetProcAddress");
    if (!gpa2 && !gpa1) {
        kv_drv.code = KVSWAP_E_MISSING_SYMBOL;
        snprintf(kv_drv.message, sizeof kv_drv.message, "libcuda.so.1 exports no cuGetProcAddress (driver older than 11.3)");
        return;
    }
    kv_drv.memcpy_async = (kv_cu_memcpy_async_fn)kv_drv_lookup(gpa2, gpa1, "cuMemcpyAsync", 4000);
    kv_drv.error_name = (kv_cu_error_name_fn)kv_drv_lookup(gpa2, gpa1, "cuGetErrorName", 6000);
#if KV_USE_BATCH
    /* Ask for 12080 exactly: that pins the 9-parameter ABI on every driver that has it (a
     * 13.x driver hands out the 8-parameter _v2 for 13000).  NULL below 12.8 -> fallback. */
    kv_drv.batch = (kv_cu_batch_fn)kv_drv_lookup(gpa2, gpa1, "cuMemcpyBatchAsync", KV_CU_BATCH_ABI_VERSION);
#endif
#if KV_USE_KERNEL
    kv_kernel_resolve(gpa2, gpa1);
#endif
    if (!kv_drv.memcpy_async) {
        kv_drv.code = KVSWAP_E_MISSING_SYMBOL;
        snprintf(kv_drv.message, sizeof kv_drv.message, "cuGetProcAddress found no cuMemcpyAsync");
    }
}

static inline const char *kv_drv_error_name(CUresult rc) {
    const char *name = NULL;
    if (kv_drv.error_name && kv_drv.error_name(rc, &name) == CUDA_SUCCESS && name) return name;
    return "unknown CUresult";
}

static inline int kv_drv_loop(void *const *src, void *const *dst, const size_t *sizes, size_t first, size_t count,
                       CUstream stream, kvswap_status *st) {
    for (size_t i = first; i < first + count; i++) {
        CUresult rc = kv_drv.memcpy_async((CUdeviceptr)dst[i], (CUdeviceptr)src[i], sizes[i], stream);
        if (rc != CUDA_SUCCESS)
            return kv_fail(st, (int)rc, (long)i, kv_drv_error_name(rc), "cuMemcpyAsync failed at block %zu: %s",
                           i, kv_drv_error_name(rc));
    }
    return 0;
}

#if KV_USE_BATCH
static inline int kv_drv_batch(void *const *src, void *const *dst, const size_t *sizes, size_t first, size_t count,
                        CUstream stream, kvswap_status *st) {
    kv_cu_attrs attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = KV_CU_SRC_ACCESS_ORDER_STREAM; /* keep ordinary stream semantics */
    size_t attr_index = 0;
    size_t fail = SIZE_MAX;
    /* The API takes non-const arrays but does not write them. */
    CUresult rc = kv_drv.batch((CUdeviceptr *)(uintptr_t)(dst + first), (CUdeviceptr *)(uintptr_t)(src + first),
                               (size_t *)(uintptr_t)(sizes + first), count, &attr, &attr_index, 1, &fail, stream);
    if (rc != CUDA_SUCCESS) {
        long index = fail < count ? (long)(first + fail) : -1;
        return kv_fail(st, (int)rc, index, kv_drv_error_name(rc),
                       "cuMemcpyBatchAsync failed (block %ld of %zu): %s", index, first + count,
                       kv_drv_error_name(rc));
    }
    return 0;
}
#endif

#if KV_USE_KERNEL
#include "kernel_path.h"
#endif

static int kv_drv_swap(void *const *src, void *const *dst, const size_t *sizes, size_t n, void *stream,
                       int direction, kvswap_path *path, kvswap_status *st) {
    kv_set_path(path, KVSWAP_PATH_NONE);
    kv_ok(st);
    int rc = kv_check_args(src, dst, sizes, n, st);
    if (rc) return rc;
    if (direction < KVSWAP_DIR_UNKNOWN || direction > KVSWAP_DIR_D2D)
        return kv_fail(st, KVSWAP_E_INVALID_ARGUMENT, -1, NULL, "direction %d is not a kvswap_direction", direction);
    pthread_once(&kv_drv_once, kv_drv_resolve);
    if (kv_drv.code) return kv_fail(st, kv_drv.code, -1, NULL, "%s", kv_drv.message);
    CUstream s = (CUstream)stream;
    int use_batch = KV_USE_BATCH;
#if KV_USE_KERNEL
    int policy = kv_policy_now();
    if (policy == KVSWAP_POLICY_LOOP) use_batch = 0;
    if (policy == KVSWAP_POLICY_FASTEST || policy == KVSWAP_POLICY_KERNEL) {
        int why = 0;
        int slot = kv_kernel_ready(src, dst, n, &direction, &why);
        int choice = KVSWAP_PATH_KERNEL;
        if (slot >= 0 && policy == KVSWAP_POLICY_FASTEST) {
            unsigned long long total = 0;
            for (size_t i = 0; i < n; i++) total += sizes[i];
            choice = kv_cal_pick(direction, total / n, n);
            if (choice == KVSWAP_PATH_FALLBACK) use_batch = 0;
        }
        if (slot >= 0 && choice == KVSWAP_PATH_KERNEL) {
            kv_set_path(path, KVSWAP_PATH_KERNEL);
            return kv_kernel_copy(slot, src, dst, sizes, n, s, st);
        }
        /* Forced kernel that cannot load (e.g. 222, PTX newer than the driver): say so, do not hide it. */
        if (policy == KVSWAP_POLICY_KERNEL && why) {
            kv_set_path(path, KVSWAP_PATH_KERNEL);
            return kv_fail(st, why, -1, why > 0 ? kv_drv_error_name((CUresult)why) : NULL,
                           "copy kernel unavailable: %s", kvswap_kernel_info());
        }
    }
#else
    (void)direction;
#endif
#if KV_USE_BATCH
    /* The legacy default stream goes to the per-block path: the batch call rejects it with
     * CUDA_ERROR_INVALID_VALUE at index 0 (vLLM issue 46345). */
    if (use_batch && kv_drv.batch && !kv_is_legacy_stream(stream)) {
        kv_set_path(path, KVSWAP_PATH_BATCH);
        size_t chunk = kv_chunk();
        for (size_t first = 0; first < n; first += chunk) {
            size_t count = n - first < chunk ? n - first : chunk;
            rc = kv_drv_batch(src, dst, sizes, first, count, s, st);
            if (rc) return rc;
        }
        return 0;
    }
#endif
    (void)use_batch;
    kv_set_path(path, KVSWAP_PATH_FALLBACK);
    return kv_drv_loop(src, dst, sizes, 0, n, s, st);
}

KVSWAP_API int kvswap_swap_blocks(void *const *src, void *const *dst, const size_t *sizes, size_t n,
                                  void *stream, kvswap_path *path, kvswap_status *st) {
    return kv_drv_swap(src, dst, sizes, n, stream, KVSWAP_DIR_UNKNOWN, path, st);
}

#if KV_USE_KERNEL
KVSWAP_API int kvswap_swap_blocks_dir(void *const *src, void *const *dst, const size_t *sizes, size_t n,
                                      void *stream, int direction, kvswap_path *path, kvswap_status *st) {
    return kv_drv_swap(src, dst, sizes, n, stream, direction, path, st);
}
#endif

KVSWAP_API const char *kvswap_variant_name(void) { return KV_VARIANT_NAME; }
KVSWAP_API const char *kvswap_family(void) { return "driver"; }

#endif /* KV_DRIVER_FAMILY_H */
