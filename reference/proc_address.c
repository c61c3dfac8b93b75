/*
 * proc-address: the correct driver-API swap (the pattern of vLLM PR 38919).
 * No DT_NEEDED on libcuda: the driver is dlopen()ed, cuMemcpyBatchAsync is requested
 * from cuGetProcAddress at version 12080 (pinning the 9-parameter ABI), and a driver
 * without it, or the legacy stream, gets one cuMemcpyAsync per block.
 */
#define KV_VARIANT_NAME "proc-address"
#define KV_USE_BATCH 1
#include "driver_family.h"
