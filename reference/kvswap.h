/*
 * kvswap.h - copy a batch of KV-cache blocks between device and host memory.
 *
 * One function, kvswap_swap_blocks(), copies n blocks (src[i] -> dst[i], sizes[i] bytes)
 * in stream order on `stream`.  Each shared library built from this directory implements
 * it one way (a "variant"); kvswap_variant_name() says which.  The correct variants are
 * proc-address (driver API) and runtime-dispatch (runtime API); see README.md.
 *
 * Pointers: any address the CUDA copy APIs accept under unified addressing (device
 * memory, pinned host memory).  Driver-family variants pass them on as CUdeviceptr.
 *
 * Streams: a CUstream (driver family) or cudaStream_t (runtime family), or one of the
 * special handles: NULL and 0x1 (the legacy default stream), 0x2 (per-thread default).
 *
 * Thread safety: every CUDA entry point is resolved once (pthread_once); concurrent calls
 * are safe as long as CUDA's own rules for the stream are kept.  The chunk limit is a
 * process-wide setting meant to be set before copying.
 */
#ifndef KVSWAP_H
#define KVSWAP_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVSWAP_API __attribute__((visibility("default")))
#else
#define KVSWAP_API
#endif

/* Which mechanism copied the blocks (or was attempted when an error is returned). */
typedef enum {
    KVSWAP_PATH_NONE = 0,     /* nothing was attempted (bad arguments, resolution failed) */
    KVSWAP_PATH_BATCH = 1,    /* cuMemcpyBatchAsync / cudaMemcpyBatchAsync */
    KVSWAP_PATH_FALLBACK = 2, /* one cuMemcpyAsync / cudaMemcpyAsync per block (also the loop variants) */
    KVSWAP_PATH_KERNEL = 3    /* one launch of a runtime-compiled copy kernel (proc-address only) */
} kvswap_path;

/* Direction of a call, for kvswap_swap_blocks_dir(); every block of one call shares it. */
typedef enum {
    KVSWAP_DIR_UNKNOWN = 0, /* infer it from block 0's pointer attributes */
    KVSWAP_DIR_D2H = 1,
    KVSWAP_DIR_H2D = 2,
    KVSWAP_DIR_D2D = 3
} kvswap_direction;

/* Which path a call may take (kvswap_set_policy; initial value from env KVSWAP_POLICY:
 * fastest, copy-engine-only, kernel, batch, loop, beside-compute). */
typedef enum {
    KVSWAP_POLICY_FASTEST = 0,          /* per call, the calibrated best of kernel/batch/loop, measured alone */
    KVSWAP_POLICY_COPY_ENGINE_ONLY = 1, /* never the kernel: keeps the SMs free for compute */
    KVSWAP_POLICY_KERNEL = 2,           /* the kernel whenever it applies; its failures are returned */
    KVSWAP_POLICY_BATCH = 3,            /* the batch copy (per-block where it cannot be used) */
    KVSWAP_POLICY_LOOP = 4,             /* one copy per block */
    KVSWAP_POLICY_BESIDE_COMPUTE = 5    /* for swaps that run while a computation fills the SMs: copy
                                         * engines fanned out over streams for host transfers, the
                                         * kernel on at most kvswap_set_sm_budget() CTAs on a
                                         * highest-priority stream for device-to-device ones */
} kvswap_policy;

/* The policy a process starts with when KVSWAP_POLICY is unset (see README.md for the figures). */
#define KVSWAP_POLICY_DEFAULT KVSWAP_POLICY_BESIDE_COMPUTE

/* Negative codes are kvswap's own; positive ones are CUDA's (see kvswap_status.code). */
#define KVSWAP_OK 0
#define KVSWAP_E_INVALID_ARGUMENT (-1) /* n == 0, a NULL array or pointer, a zero size */
#define KVSWAP_E_NO_LIBRARY (-2)       /* libcuda.so.1 / a loaded libcudart not found */
#define KVSWAP_E_MISSING_SYMBOL (-3)   /* a required entry point (e.g. cuMemcpyAsync) is absent */
#define KVSWAP_E_OUT_OF_MEMORY (-4)    /* host memory for kvswap's own bookkeeping ran out */

#define KVSWAP_DEFAULT_CHUNK 4096 /* descriptors per batch call unless changed */

typedef struct {
    /* 0 on success; else the CUDA error number (CUresult for the driver family,
     * cudaError_t for the runtime family), or a negative KVSWAP_E_* code. */
    int code;
    /* Index (into the caller's arrays) of the block that failed, or -1 when the error
     * is not specific to one block. */
    long failed_index;
    /* CUDA's name of the error ("CUDA_ERROR_INVALID_VALUE", "cudaErrorInvalidValue"),
     * or kvswap's ("KVSWAP_E_INVALID_ARGUMENT"); NULL on success.  Static storage. */
    const char *error_name;
    /* A sentence for humans; empty on success. */
    char message[256];
} kvswap_status;

/*
 * Copy sizes[i] bytes from src[i] to dst[i] for i in [0, n), enqueued on `stream`.
 * Returns status->code (0 on success).  `path` and `status` may be NULL.
 * The copies are asynchronous: synchronise the stream before reading dst.
 */
KVSWAP_API int kvswap_swap_blocks(void *const *src, void *const *dst, const size_t *sizes, size_t n,
                                  void *stream, kvswap_path *path, kvswap_status *status);

/*
 * As kvswap_swap_blocks, with the direction given.  With KVSWAP_DIR_UNKNOWN (and always in
 * kvswap_swap_blocks) the kernel path asks the driver for block 0's memory types; an explicit
 * direction skips that, and promises that every host pointer is pinned (cuMemHostAlloc /
 * cuMemHostRegister) and so mapped at the same address on the device (unified addressing).
 * Only proc-address defines it.
 */
KVSWAP_API int kvswap_swap_blocks_dir(void *const *src, void *const *dst, const size_t *sizes, size_t n,
                                      void *stream, int direction, kvswap_path *path, kvswap_status *status);

/* Set the process-wide path policy (a kvswap_policy); returns 0 or KVSWAP_E_INVALID_ARGUMENT.
 * Calibration for KVSWAP_POLICY_FASTEST: env KVSWAP_CALIBRATION names a text file of lines
 * `direction block_bytes blocks path` (`cumatrix calibrate` writes it), read once; without it,
 * built-in choices measured on an H200.  Only proc-address defines these. */
KVSWAP_API int kvswap_set_policy(int policy);
KVSWAP_API int kvswap_get_policy(void);
/* The path KVSWAP_POLICY_FASTEST would choose for a call (a kvswap_path; the kernel only where it
 * also applies), or KVSWAP_E_INVALID_ARGUMENT. */
KVSWAP_API int kvswap_calibrated_path(int direction, size_t block_bytes, size_t blocks);
/* Where the calibration came from: the file's name, or "built-in". */
KVSWAP_API const char *kvswap_calibration_source(void);
/* The SM budget (CTAs) the calibration's kernel rows were measured with: 0 the whole GPU, -1 unsaid. */
KVSWAP_API int kvswap_calibration_sm_budget(void);
/* Copy-engine streams a batch of this shape is split over (the calibrated, or the set, count). */
KVSWAP_API int kvswap_calibrated_streams(int direction, size_t block_bytes, size_t blocks);
/* Split every copy-engine batch over this many internal streams (1..8; 0: per direction, from the
 * calibration).  Initial value from env KVSWAP_CE_STREAMS.  Returns 0 or KVSWAP_E_INVALID_ARGUMENT. */
KVSWAP_API int kvswap_set_copy_streams(int streams);
/* At most this many CTAs for the beside-compute policy's kernel (env KVSWAP_SM_BUDGET, default 32). */
KVSWAP_API int kvswap_set_sm_budget(int ctas);
KVSWAP_API int kvswap_get_sm_budget(void);
/* The beside-compute policy's path for host transfers: KVSWAP_PATH_BATCH (copy engines, the
 * default) or KVSWAP_PATH_KERNEL (the budgeted kernel).  Env KVSWAP_BESIDE_HOST=batch|kernel. */
KVSWAP_API int kvswap_set_beside_compute_host_path(int path);
KVSWAP_API int kvswap_get_beside_compute_host_path(void);
/* How the kernel was built ("cubin sm_90 via libnvrtc.so.13 (NVRTC 13.0)") or why it is unavailable. */
KVSWAP_API const char *kvswap_kernel_info(void);

/* "proc-address", "runtime-dispatch", "direct-link", "driver-dispatch",
 * "header-dispatch", "driver-loop" or "runtime-loop". */
KVSWAP_API const char *kvswap_variant_name(void);

/* "driver" or "runtime": which CUDA API the variant calls (and which error numbers it returns). */
KVSWAP_API const char *kvswap_family(void);

/* At most this many descriptors per batch call (0 restores KVSWAP_DEFAULT_CHUNK).
 * Larger batches are split; failed_index always refers to the caller's arrays. */
KVSWAP_API void kvswap_set_chunk_limit(size_t max_descriptors_per_call);

#ifdef __cplusplus
}
#endif
#endif /* KVSWAP_H */
