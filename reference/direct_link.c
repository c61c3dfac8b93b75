/*
 * direct-link: KNOWN BAD.  What vLLM PR 38460 shipped: cuMemcpyBatchAsync called by name
 * with the 9-argument (12.8) signature and resolved by the dynamic linker.
 *  - DT_NEEDED libcuda.so.1 plus an undefined cuMemcpyBatchAsync: on a driver older than
 *    12.8 the library fails to load ("undefined symbol: cuMemcpyBatchAsync"); fixed by
 *    vLLM PR 38919 (see proc_address.c).
 *  - CUDA 13 headers #define cuMemcpyBatchAsync to the 8-parameter cuMemcpyBatchAsync_v2,
 *    so this file does not compile against them ("too many arguments to function").
 *  - No legacy-stream guard (vLLM issue 46345) and no fallback.
 */
#include <stdint.h>

#include <cuda.h>

#include "kvswap_internal.h"

KVSWAP_API int kvswap_swap_blocks(void *const *src, void *const *dst, const size_t *sizes, size_t n,
                                  void *stream, kvswap_path *path, kvswap_status *st) {
    kv_set_path(path, KVSWAP_PATH_NONE);
    kv_ok(st);
    int rc = kv_check_args(src, dst, sizes, n, st);
    if (rc) return rc;
    kv_set_path(path, KVSWAP_PATH_BATCH);
    size_t chunk = kv_chunk();
    for (size_t first = 0; first < n; first += chunk) {
        size_t count = n - first < chunk ? n - first : chunk;
        CUmemcpyAttributes attr = {0};
        attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        size_t attr_index = 0, fail = SIZE_MAX;
        CUresult r = cuMemcpyBatchAsync((CUdeviceptr *)(uintptr_t)(dst + first), (CUdeviceptr *)(uintptr_t)(src + first),
                                        (size_t *)(uintptr_t)(sizes + first), count, &attr, &attr_index, 1, &fail,
                                        (CUstream)stream);
        if (r != CUDA_SUCCESS) {
            const char *name = NULL;
            if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "unknown CUresult";
            long index = fail < count ? (long)(first + fail) : -1;
            return kv_fail(st, (int)r, index, name, "cuMemcpyBatchAsync failed (block %ld): %s", index, name);
        }
    }
    return 0;
}

KVSWAP_API const char *kvswap_variant_name(void) { return "direct-link"; }
KVSWAP_API const char *kvswap_family(void) { return "driver"; }
