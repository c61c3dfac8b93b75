/*
 * driver-dispatch: KNOWN BAD (SGLang PR 23172, fixed by PR 23183).  The batch ABI is chosen
 * from cudaDriverGetVersion, but the ABI belongs to the runtime: a 12.9 runtime on a 13.0
 * driver gets the 8-parameter call and crashes (SIGSEGV).  No legacy-stream guard.
 */
#define KV_VARIANT_NAME "driver-dispatch"
#define KV_LEGACY_STREAM_GUARD 0
#include "runtime_family.inc"

static int kv_rt_batch_abi(void) {
    int version = 0;
    if (kv_rt.driver_version(&version) != KV_RT_SUCCESS) return 0;
    return version >= 13000 ? 8 : 9;
}
