/*
 * driver-loop: the driver-API speed baseline, one cuMemcpyAsync per block
 * (entry point from cuGetProcAddress, as in proc-address).
 */
#define KV_VARIANT_NAME "driver-loop"
#define KV_USE_BATCH 0
#include "driver_family.inc"
