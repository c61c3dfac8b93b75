/*
 * header-dispatch: KNOWN BAD (SGLang issue 36302).  The batch ABI is chosen from the
 * compile-time CUDA_VERSION of the headers it was built against, not from the runtime it
 * runs with: built with 12.8 headers it crashes a 13.x runtime (SIGSEGV); built with 13.0
 * headers it gets cudaErrorInvalidResourceHandle (400) from a 12.8/12.9 runtime.  Headers
 * older than 12.8 compile the batch out.  No legacy-stream guard.
 */
#include <cuda.h>

#define KV_VARIANT_NAME "header-dispatch"
#define KV_LEGACY_STREAM_GUARD 0
#include "runtime_family.h"

static int kv_rt_batch_abi(void) {
#if CUDA_VERSION >= 13000
    return 8;
#elif CUDA_VERSION >= 12080
    return 9;
#else
    return 0;
#endif
}
