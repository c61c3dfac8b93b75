/* runtime-loop: the runtime-API speed baseline, one cudaMemcpyAsync per block. */
#define KV_VARIANT_NAME "runtime-loop"
#define KV_LEGACY_STREAM_GUARD 1
#include "runtime_family.inc"

static int kv_rt_batch_abi(void) { return 0; }
