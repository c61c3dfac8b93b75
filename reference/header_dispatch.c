/*
 * header-dispatch: KNOWN BAD (SGLang issue 36302).  The batch ABI is chosen from the
 * compile-time CUDA_VERSION of the headers it was built against, not from the runtime it
 * runs with: built with 13.0 headers it makes the 8-parameter call into a 12.8/12.9
 * runtime's 9-parameter function (SIGSEGV); built with 12.8 headers it makes the
 * 9-parameter call into a 13.x runtime, whose stream argument is then the failIdx pointer
 * (cudaErrorInvalidResourceHandle, 400).  Headers older than 12.8 compile the batch out.
 * No legacy-stream guard.
 */
#include <cuda.h>

#define KV_VARIANT_NAME "header-dispatch"
#define KV_LEGACY_STREAM_GUARD 0
#include "runtime_family.inc"

static int kv_rt_batch_abi(void) {
#if CUDA_VERSION >= 13000
    return 8;
#elif CUDA_VERSION >= 12080
    return 9;
#else
    return 0;
#endif
}
