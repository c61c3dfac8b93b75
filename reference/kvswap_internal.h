/*
 * kvswap_internal.h - helpers every variant shares: argument checks, status filling,
 * the chunk limit and the legacy-stream test.  Not installed; included by each .c file.
 * It defines no state: the chunk limit lives in kvswap_common.c, linked into every library.
 */
#ifndef KVSWAP_INTERNAL_H
#define KVSWAP_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kvswap.h"

/* Shared between the translation units of one library, never exported: with -fvisibility=hidden
 * this is the default already, and the attribute says so where the symbol is declared. */
#define KV_HIDDEN __attribute__((visibility("hidden")))

/* Descriptors per batch call (kvswap_set_chunk_limit); defined in kvswap_common.c. */
extern KV_HIDDEN _Atomic size_t kv_chunk_limit;

static inline size_t kv_chunk(void) { return atomic_load_explicit(&kv_chunk_limit, memory_order_relaxed); }

static inline const char *kv_own_error_name(int code) {
    switch (code) {
    case KVSWAP_E_INVALID_ARGUMENT: return "KVSWAP_E_INVALID_ARGUMENT";
    case KVSWAP_E_NO_LIBRARY: return "KVSWAP_E_NO_LIBRARY";
    case KVSWAP_E_MISSING_SYMBOL: return "KVSWAP_E_MISSING_SYMBOL";
    case KVSWAP_E_OUT_OF_MEMORY: return "KVSWAP_E_OUT_OF_MEMORY";
    default: return "KVSWAP_E_UNKNOWN";
    }
}

static inline void kv_set_path(kvswap_path *path, kvswap_path value) {
    if (path) *path = value;
}

static inline void kv_ok(kvswap_status *st) {
    if (!st) return;
    st->code = 0;
    st->failed_index = -1;
    st->error_name = NULL;
    st->message[0] = '\0';
}

__attribute__((format(printf, 5, 6)))
static inline int kv_fail(kvswap_status *st, int code, long index, const char *name, const char *fmt, ...) {
    if (st) {
        va_list ap;
        st->code = code;
        st->failed_index = index;
        st->error_name = name ? name : (code < 0 ? kv_own_error_name(code) : "unknown CUDA error");
        va_start(ap, fmt);
        vsnprintf(st->message, sizeof st->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Reject what would make a CUDA call misbehave or crash before any call is made. */
static inline int kv_check_args(void *const *src, void *const *dst, const size_t *sizes, size_t n, kvswap_status *st) {
    if (n == 0)
        return kv_fail(st, KVSWAP_E_INVALID_ARGUMENT, -1, NULL, "n is 0: nothing to copy");
    if (!src || !dst || !sizes)
        return kv_fail(st, KVSWAP_E_INVALID_ARGUMENT, -1, NULL, "%s array is NULL",
                       !src ? "the src" : !dst ? "the dst" : "the sizes");
    for (size_t i = 0; i < n; i++) {
        if (!src[i] || !dst[i])
            return kv_fail(st, KVSWAP_E_INVALID_ARGUMENT, (long)i, NULL, "block %zu: %s pointer is NULL", i,
                           !src[i] ? "source" : "destination");
        if (sizes[i] == 0)
            return kv_fail(st, KVSWAP_E_INVALID_ARGUMENT, (long)i, NULL, "block %zu: size is 0", i);
    }
    return 0;
}

/* The legacy default stream: NULL, or the explicit handle CU_STREAM_LEGACY / cudaStreamLegacy (0x1).
 * The batch APIs reject it with an invalid-value error at index 0 (vLLM issue 46345). */
static inline int kv_is_legacy_stream(void *stream) {
    return stream == NULL || (uintptr_t)stream == 0x1;
}

#endif /* KVSWAP_INTERNAL_H */
