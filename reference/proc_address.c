/*
 * proc-address: the correct driver-API swap (the pattern of vLLM PR 38919).
 * No DT_NEEDED on libcuda: the driver is dlopen()ed, cuMemcpyBatchAsync is requested
 * from cuGetProcAddress at version 12080 (pinning the 9-parameter ABI), and a driver
 * without it, or the legacy stream, gets one cuMemcpyAsync per block.
 * Where the calibrated policy says so, one launch of a runtime-compiled copy kernel moves
 * all blocks instead (kernel_path.h); kvswap_set_policy(KVSWAP_POLICY_COPY_ENGINE_ONLY)
 * keeps it to the copy engines.
 */
#define KV_VARIANT_NAME "proc-address"
#define KV_USE_BATCH 1
#define KV_USE_KERNEL 1
#include "driver_family.inc"
