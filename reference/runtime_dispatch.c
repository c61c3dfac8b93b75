/*
 * runtime-dispatch: the correct runtime-API swap (the pattern of SGLang PR 23183).
 * cudaMemcpyBatchAsync comes from the runtime loaded in the process, and its ABI follows
 * that runtime's version: 12.8/12.9 take (..., size_t *failIdx, stream), 13.x drop failIdx.
 * Absent symbol, cudaErrorNotSupported, cudaErrorCallRequiresNewerDriver, or the legacy
 * stream: one cudaMemcpyAsync per block.
 */
#define KV_VARIANT_NAME "runtime-dispatch"
#define KV_LEGACY_STREAM_GUARD 1
#include "runtime_family.inc"

static int kv_rt_batch_abi(void) {
    int version = 0;
    if (kv_rt.runtime_version(&version) != KV_RT_SUCCESS) return 0;
    return version >= 13000 ? 8 : version >= 12080 ? 9 : 0;
}
