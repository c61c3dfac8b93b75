/*
 * kvswap_common.c - the state every variant shares, linked into every library: the chunk limit
 * (kvswap_set_chunk_limit).  Its own translation unit, so that a library made of several (the
 * proc-address variant and kernel_path.c) defines it once.
 */
#include "kvswap_internal.h"

KV_HIDDEN _Atomic size_t kv_chunk_limit = KVSWAP_DEFAULT_CHUNK;

KVSWAP_API void kvswap_set_chunk_limit(size_t max_descriptors_per_call) {
    /* Relaxed: a process-wide setting with nothing else published through it. */
    atomic_store_explicit(&kv_chunk_limit, max_descriptors_per_call ? max_descriptors_per_call : KVSWAP_DEFAULT_CHUNK,
                          memory_order_relaxed);
}
