/*
 * runtime_family.h - runtime-API variants that link nothing: the libcudart already loaded
 * in the process is found with dlopen(RTLD_NOLOAD) and cudaMemcpyBatchAsync is dlsym()ed
 * from it (the pattern of SGLang PR 23183).  The runtime headers cannot be used here (the
 * runtime wheels lack crt/host_defines.h), so the few types needed are spelt out.
 *
 * A variant defines, before including this file:
 *   KV_VARIANT_NAME           its name
 *   KV_LEGACY_STREAM_GUARD    1: the legacy stream takes the per-block path (vLLM issue 46345)
 * and implements, after including it:
 *   static int kv_rt_batch_abi(void);  0: never batch; 8 or 9: the parameter count to call
 *                                      cudaMemcpyBatchAsync with (only asked when it exists)
 */
#ifndef KV_RUNTIME_FAMILY_H
#define KV_RUNTIME_FAMILY_H

#include <dlfcn.h>
#include <pthread.h>

#include "kvswap_internal.h"

typedef int kv_rt_error;  /* cudaError_t */
typedef void *kv_rt_stream; /* cudaStream_t */
#define KV_RT_SUCCESS 0
#define KV_RT_ERROR_NOT_SUPPORTED 801             /* cudaErrorNotSupported */
#define KV_RT_ERROR_CALL_REQUIRES_NEWER_DRIVER 36 /* cudaErrorCallRequiresNewerDriver */
#define KV_RT_MEMCPY_DEFAULT 4                    /* cudaMemcpyDefault */
#define KV_RT_SRC_ACCESS_ORDER_STREAM 1           /* cudaMemcpySrcAccessOrderStream */

typedef struct { /* struct cudaMemcpyAttributes (CUDA 12.8+) */
    int srcAccessOrder;
    struct { int type; int id; } srcLocHint, dstLocHint;
    unsigned int flags;
} kv_rt_attrs;

/* CUDA 12.8/12.9: (..., size_t *failIdx, cudaStream_t).  CUDA 13.x: (..., cudaStream_t). */
typedef kv_rt_error (*kv_rt_batch9_fn)(void **dsts, void **srcs, size_t *sizes, size_t count, kv_rt_attrs *attrs,
                                       size_t *attrsIdxs, size_t numAttrs, size_t *failIdx, kv_rt_stream stream);
typedef kv_rt_error (*kv_rt_batch8_fn)(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t count,
                                       kv_rt_attrs *attrs, size_t *attrsIdxs, size_t numAttrs, kv_rt_stream stream);
typedef kv_rt_error (*kv_rt_memcpy_async_fn)(void *, const void *, size_t, int, kv_rt_stream);
typedef kv_rt_error (*kv_rt_version_fn)(int *);
typedef const char *(*kv_rt_error_name_fn)(kv_rt_error);

static struct {
    int code;
    char message[200];
    kv_rt_memcpy_async_fn memcpy_async;
    kv_rt_version_fn runtime_version;
    kv_rt_version_fn driver_version;
    kv_rt_error_name_fn error_name;
    void *batch; /* cudaMemcpyBatchAsync, or NULL (runtime older than 12.8) */
    int abi;     /* 0: no batch; 8 or 9 */
} kv_rt;

static _Atomic int kv_rt_batch_unsupported; /* set once the runtime said the batch cannot run here */
static pthread_once_t kv_rt_once = PTHREAD_ONCE_INIT;

static int kv_rt_batch_abi(void);

static inline void *kv_rt_open(void) {
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12"};
    /* The runtime the application already uses: two runtimes in one process would not share
     * streams or allocations. */
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
        if (h) return h;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) { /* last resort */
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
    }
    return NULL;
}

static inline void kv_rt_resolve(void) {
    void *lib = kv_rt_open();
    if (!lib) {
        kv_rt.code = KVSWAP_E_NO_LIBRARY;
        snprintf(kv_rt.message, sizeof kv_rt.message, "no libcudart.so.13 or libcudart.so.12 is loaded or loadable");
        return;
    }
    kv_rt.memcpy_async = (kv_rt_memcpy_async_fn)dlsym(lib, "cudaMemcpyAsync");
    kv_rt.runtime_version = (kv_rt_version_fn)dlsym(lib, "cudaRuntimeGetVersion");
    kv_rt.driver_version = (kv_rt_version_fn)dlsym(lib, "cudaDriverGetVersion");
    kv_rt.error_name = (kv_rt_error_name_fn)dlsym(lib, "cudaGetErrorName");
    kv_rt.batch = dlsym(lib, "cudaMemcpyBatchAsync"); /* absent before 12.8: fallback */
    if (!kv_rt.memcpy_async || !kv_rt.runtime_version || !kv_rt.driver_version) {
        kv_rt.code = KVSWAP_E_MISSING_SYMBOL;
        snprintf(kv_rt.message, sizeof kv_rt.message, "the loaded libcudart lacks cudaMemcpyAsync or a version query");
        return;
    }
    kv_rt.abi = kv_rt.batch ? kv_rt_batch_abi() : 0;
}

static inline const char *kv_rt_error_name(kv_rt_error rc) {
    const char *name = kv_rt.error_name ? kv_rt.error_name(rc) : NULL;
    return name ? name : "unknown cudaError_t";
}

static inline int kv_rt_loop(void *const *src, void *const *dst, const size_t *sizes, size_t first, size_t n,
                             kv_rt_stream stream, kvswap_status *st) {
    for (size_t i = first; i < n; i++) {
        kv_rt_error rc = kv_rt.memcpy_async(dst[i], src[i], sizes[i], KV_RT_MEMCPY_DEFAULT, stream);
        if (rc != KV_RT_SUCCESS)
            return kv_fail(st, rc, (long)i, kv_rt_error_name(rc), "cudaMemcpyAsync failed at block %zu: %s", i,
                           kv_rt_error_name(rc));
    }
    return 0;
}

/* One batch call for [first, first+count); *fail gets the index within the chunk, if reported. */
static inline kv_rt_error kv_rt_batch_call(void *const *src, void *const *dst, const size_t *sizes, size_t first,
                                           size_t count, kv_rt_stream stream, size_t *fail) {
    kv_rt_attrs attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = KV_RT_SRC_ACCESS_ORDER_STREAM;
    size_t attr_index = 0;
    /* Zero, as callers write it.  A 9-parameter call into a 13.x runtime passes this pointer
     * where the stream belongs: what the runtime then does depends on the bytes it points at
     * (zeroes: cudaErrorInvalidResourceHandle; all ones: a dereference and SIGSEGV, both seen). */
    *fail = 0;
    if (kv_rt.abi == 9)
        return ((kv_rt_batch9_fn)kv_rt.batch)((void **)(uintptr_t)(dst + first), (void **)(uintptr_t)(src + first),
                                              (size_t *)(uintptr_t)(sizes + first), count, &attr, &attr_index, 1,
                                              fail, stream);
    return ((kv_rt_batch8_fn)kv_rt.batch)(dst + first, (const void *const *)(src + first), sizes + first, count,
                                          &attr, &attr_index, 1, stream);
}

KVSWAP_API int kvswap_swap_blocks(void *const *src, void *const *dst, const size_t *sizes, size_t n,
                                  void *stream, kvswap_path *path, kvswap_status *st) {
    kv_set_path(path, KVSWAP_PATH_NONE);
    kv_ok(st);
    int rc = kv_check_args(src, dst, sizes, n, st);
    if (rc) return rc;
    pthread_once(&kv_rt_once, kv_rt_resolve);
    if (kv_rt.code) return kv_fail(st, kv_rt.code, -1, NULL, "%s", kv_rt.message);
    size_t first = 0;
    int use_batch = kv_rt.abi != 0 && !atomic_load(&kv_rt_batch_unsupported);
#if KV_LEGACY_STREAM_GUARD
    /* The batch call rejects the legacy stream (cudaErrorInvalidValue at index 0, vLLM issue 46345). */
    if (kv_is_legacy_stream(stream)) use_batch = 0;
#endif
    if (use_batch) {
        kv_set_path(path, KVSWAP_PATH_BATCH);
        size_t chunk = kv_chunk();
        for (; first < n; first += chunk) {
            size_t count = n - first < chunk ? n - first : chunk, fail;
            kv_rt_error r = kv_rt_batch_call(src, dst, sizes, first, count, stream, &fail);
            if (r == KV_RT_SUCCESS) continue;
            if (r == KV_RT_ERROR_NOT_SUPPORTED || r == KV_RT_ERROR_CALL_REQUIRES_NEWER_DRIVER) {
                /* The runtime has the entry point but this driver cannot run it: copy the rest
                 * block by block, and skip the batch from now on. */
                atomic_store(&kv_rt_batch_unsupported, 1);
                break;
            }
            long index = (kv_rt.abi == 9 && fail < count) ? (long)(first + fail) : -1; /* 13.x reports no index */
            return kv_fail(st, r, index, kv_rt_error_name(r), "cudaMemcpyBatchAsync (%d-parameter ABI) failed (block %ld): %s",
                           kv_rt.abi, index, kv_rt_error_name(r));
        }
        if (first >= n) return 0;
    }
    kv_set_path(path, KVSWAP_PATH_FALLBACK);
    return kv_rt_loop(src, dst, sizes, first, n, stream, st);
}

KVSWAP_API const char *kvswap_variant_name(void) { return KV_VARIANT_NAME; }
KVSWAP_API const char *kvswap_family(void) { return "runtime"; }

#endif /* KV_RUNTIME_FAMILY_H */
