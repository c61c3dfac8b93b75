/*
 * kernel_path.h - what driver_family.inc calls in kernel_path.c (proc-address only: a variant that
 * defines KV_USE_KERNEL 1 is linked with kernel_path.c).  kernel_path.c also defines the exported
 * policy, calibration and kernel-info functions declared in kvswap.h.
 */
#ifndef KV_KERNEL_PATH_H
#define KV_KERNEL_PATH_H

#include <stddef.h>

#include "kvswap.h"

/* Per policy (kvswap_set_policy), which path this call takes.  Called after the driver's entry
 * points were resolved (kv_drv.code == 0).  Returns -1 when it was handled here (kernel, the
 * copy-engine fan-out, or a forced kernel that cannot run: *rc holds the result), else 0 with
 * *use_batch set (kept, or cleared for the per-block path) for the caller's-stream batch or loop. */
__attribute__((visibility("hidden")))
int kv_policy_route(void *const *src, void *const *dst, const size_t *sizes, size_t n, void *stream, int direction,
                    kvswap_path *path, kvswap_status *st, int *use_batch, int *rc);

#endif /* KV_KERNEL_PATH_H */
