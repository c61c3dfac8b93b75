/*
 * kernel_path.c - proc-address's copy kernel, its copy-engine fan-out, and the per-call path
 * policy.  A translation unit of its own, linked into the variants whose .c file defines
 * KV_USE_KERNEL 1 (proc-address): driver_family.inc calls kv_policy_route (kernel_path.h), and
 * this file uses the driver entry points driver_api.inc resolved (driver_api.h).  Everything else
 * here is static, except the exported policy API (kvswap.h).
 *
 * Why a kernel: every copy-engine copy costs microseconds of setup, so 4-16 KiB blocks move far
 * below the link (reports/bench/swap-h200.json: 16 KiB d2h batched at 0.3 of the link, d2d at ~4 GB/s); vLLM added a
 * Triton path for small CPU->GPU batches for the same reason.  One launch copies every block of a
 * call with 16-byte loads/stores, through the device mapping of pinned host memory.
 *
 * Why not always the kernel: beside a computation that fills every SM, a whole-GPU copy kernel
 * takes SMs the computation needed (a bf16 GEMM ran 50-90% slower beside it), while copy engines
 * cost it 1-3%.  So there are two more ways to copy:
 *  - the copy-engine fan-out: one call's batch split over several internal streams, which the
 *    driver spreads over several copy engines (each engine pays its per-copy cost in parallel);
 *    the caller's stream is joined to them with events, so stream order is kept;
 *  - the budgeted kernel: the same kernel on at most `sm budget` CTAs, launched on an internal
 *    stream of the highest priority (so its few CTAs go ahead of a computation's pending ones).
 *
 * Everything is resolved at run time, as for the copies: NVRTC is dlopen()ed
 * (KVSWAP_NVRTC=<path>, else libnvrtc.so.13, .12, libnvrtc.so), driver entry points come from
 * cuGetProcAddress.  The source (kvswap_kernel.cu.h) is compiled once per process
 * (pthread_once) to machine code (CUBIN) for the device's own sm_XY, so the driver does no
 * JIT: a PTX image newer than the driver would fail to load with
 * CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222).  Only when NVRTC cannot emit a CUBIN for the
 * architecture (or KVSWAP_KERNEL_IMAGE=ptx asks for it) is PTX handed to the driver's JIT.
 * Per-context state (module, pool, internal streams) is made once per context, and made again
 * when a context is destroyed and another created at the same address (keyed by cuCtxGetId).
 *
 * Descriptors of up to KVSWAP_PARAM_BLOCKS blocks of one size travel in the launch itself, as
 * the kernel's parameters (kvswap_copy_params; parameters over 4 KiB need a 12.1+ driver and NVRTC,
 * sm_70+): nothing is uploaded, allocated or freed.  Other calls upload them:
 * descriptors (src/dst per block, sizes unless all equal) are packed on the host, copied with
 * one cuMemcpyHtoDAsync from pageable memory (pageable host data is copied to a staging buffer
 * before the call returns: CUDA driver API, "API synchronization behavior"; so the per-thread
 * packing buffer is reused at once) into a buffer taken from kvswap's own
 * stream-ordered memory pool (cuMemAllocFromPoolAsync) and freed with cuMemFreeAsync after
 * the launch.  Allocation, upload, launch and free are all ordered on one stream, so
 * a following call (on any stream) can never overwrite descriptors a running kernel still
 * reads: the pool only reuses memory whose free has been ordered before the new use.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver_api.h"
#include "kernel_path.h"
#include "kvswap_internal.h"
#include "kvswap_kernel.cu.h"

typedef CUresult (*kv_cu_ctx_get_current_fn)(CUcontext *);
typedef CUresult (*kv_cu_ctx_get_device_fn)(CUdevice *);
typedef CUresult (*kv_cu_ctx_get_id_fn)(CUcontext, unsigned long long *);
typedef CUresult (*kv_cu_dev_attr_fn)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (*kv_cu_module_load_data_fn)(CUmodule *, const void *);
typedef CUresult (*kv_cu_module_get_function_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*kv_cu_launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void **, void **);
typedef CUresult (*kv_cu_htod_async_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*kv_cu_pool_create_fn)(CUmemoryPool *, const CUmemPoolProps *);
typedef CUresult (*kv_cu_pool_set_attr_fn)(CUmemoryPool, CUmemPool_attribute, void *);
typedef CUresult (*kv_cu_alloc_pool_async_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*kv_cu_free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*kv_cu_ptr_attr_fn)(void *, CUpointer_attribute, CUdeviceptr);
typedef CUresult (*kv_cu_stream_create_prio_fn)(CUstream *, unsigned, int);
typedef CUresult (*kv_cu_prio_range_fn)(int *, int *);
typedef CUresult (*kv_cu_event_create_fn)(CUevent *, unsigned);
typedef CUresult (*kv_cu_event_record_fn)(CUevent, CUstream);
typedef CUresult (*kv_cu_event_query_fn)(CUevent);
typedef CUresult (*kv_cu_host_alloc_fn)(void **, size_t, unsigned);
typedef CUresult (*kv_cu_host_free_fn)(void *);
typedef CUresult (*kv_cu_stream_wait_event_fn)(CUstream, CUevent, unsigned);
typedef CUresult (*kv_cu_occupancy_fn)(int *, CUfunction, int, size_t);
typedef CUresult (*kv_cu_driver_version_fn)(int *);

/* Each type is the headers' own for the version kv_kernel_resolve asks for (cuMemHostAlloc: its
 * only ABI, v2020, which a request for 3020 returns). */
KV_SAME_TYPE(kv_cu_ctx_get_current_fn, PFN_cuCtxGetCurrent_v4000);
KV_SAME_TYPE(kv_cu_ctx_get_device_fn, PFN_cuCtxGetDevice_v2000);
KV_SAME_TYPE(kv_cu_ctx_get_id_fn, PFN_cuCtxGetId_v12000);
KV_SAME_TYPE(kv_cu_dev_attr_fn, PFN_cuDeviceGetAttribute_v2000);
KV_SAME_TYPE(kv_cu_module_load_data_fn, PFN_cuModuleLoadData_v2000);
KV_SAME_TYPE(kv_cu_module_get_function_fn, PFN_cuModuleGetFunction_v2000);
KV_SAME_TYPE(kv_cu_launch_fn, PFN_cuLaunchKernel_v4000);
KV_SAME_TYPE(kv_cu_htod_async_fn, PFN_cuMemcpyHtoDAsync_v3020);
KV_SAME_TYPE(kv_cu_pool_create_fn, PFN_cuMemPoolCreate_v11020);
KV_SAME_TYPE(kv_cu_pool_set_attr_fn, PFN_cuMemPoolSetAttribute_v11020);
KV_SAME_TYPE(kv_cu_alloc_pool_async_fn, PFN_cuMemAllocFromPoolAsync_v11020);
KV_SAME_TYPE(kv_cu_free_async_fn, PFN_cuMemFreeAsync_v11020);
KV_SAME_TYPE(kv_cu_ptr_attr_fn, PFN_cuPointerGetAttribute_v4000);
KV_SAME_TYPE(kv_cu_stream_create_prio_fn, PFN_cuStreamCreateWithPriority_v5050);
KV_SAME_TYPE(kv_cu_prio_range_fn, PFN_cuCtxGetStreamPriorityRange_v5050);
KV_SAME_TYPE(kv_cu_event_create_fn, PFN_cuEventCreate_v2000);
KV_SAME_TYPE(kv_cu_event_record_fn, PFN_cuEventRecord_v2000);
KV_SAME_TYPE(kv_cu_event_query_fn, PFN_cuEventQuery_v2000);
KV_SAME_TYPE(kv_cu_host_alloc_fn, PFN_cuMemHostAlloc_v2020);
KV_SAME_TYPE(kv_cu_host_free_fn, PFN_cuMemFreeHost_v2000);
KV_SAME_TYPE(kv_cu_stream_wait_event_fn, PFN_cuStreamWaitEvent_v3020);
KV_SAME_TYPE(kv_cu_occupancy_fn, PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050);
KV_SAME_TYPE(kv_cu_driver_version_fn, PFN_cuDriverGetVersion_v2020);

/* NVRTC, declared here so no nvrtc.h is needed at build time (its ABI is stable since 7.0). */
typedef void *kv_nvrtc_prog;
typedef int (*kv_nvrtc_version_fn)(int *, int *);
typedef int (*kv_nvrtc_create_fn)(kv_nvrtc_prog *, const char *, const char *, int, const char *const *,
                                  const char *const *);
typedef int (*kv_nvrtc_compile_fn)(kv_nvrtc_prog, int, const char *const *);
typedef int (*kv_nvrtc_size_fn)(kv_nvrtc_prog, size_t *);
typedef int (*kv_nvrtc_get_fn)(kv_nvrtc_prog, char *);
typedef int (*kv_nvrtc_destroy_fn)(kv_nvrtc_prog *);

/* The parameter block of kvswap_copy_params (kvswap_kernel.cu.h), laid out as the device sees it. */
typedef struct {
    unsigned long long n, size;
    unsigned slices, pad;
    unsigned long long addr[2 * KVSWAP_PARAM_BLOCKS];
} kvswap_params;
/* The device's struct kvswap_params: three 8-byte words, then the addresses; 32664 bytes in all,
 * under the 32764 bytes of parameters CUDA 12.1+ allows (kvswap_kernel.cu.h). */
_Static_assert(offsetof(kvswap_params, slices) == 16 && offsetof(kvswap_params, addr) == 24,
               "kvswap_params must match the kernel's parameter layout");
_Static_assert(sizeof(kvswap_params) == 24 + 16 * KVSWAP_PARAM_BLOCKS && sizeof(kvswap_params) <= 32764,
               "kvswap_params must fit the launch's parameter space");

#define KV_STR_(x) #x
#define KV_STR(x) KV_STR_(x)
#define KV_KERNEL_MAX_CONTEXTS 16
#define KV_CAL_MAX 1024
#define KV_MAX_STREAMS 8 /* internal copy-engine streams per context */
#define KV_STAGES 4      /* pinned descriptor staging buffers per context */
/* Descriptors per batch call on the copy-engine policies' paths (the forced batch keeps
 * kvswap_set_chunk_limit's; env KVSWAP_CE_CHUNK overrides).  The driver spends host time on every
 * descriptor, more per descriptor in larger calls (h2d on an H200: 1024 x 16 KiB took 3.6 ms of the
 * calling thread as one call, 1.0 ms as calls of 32), while the engines themselves, given the work
 * ahead of time, moved those blocks at 0.60-0.99 of the link (0.74-0.78 in calls of 32).  So the
 * calling thread is the limit, and calls of 32 spend the least of it: benchmarks/NOTES-swap.md,
 * benchmarks/swap_explore.py. */
#define KV_CE_CHUNK 32

typedef struct {
    /* The slot's locks come first and live as long as the process: they are initialised when the
     * slot is first taken and never destroyed, not even when the slot is made again for a new
     * context at the same address (kv_context_slot), because a thread may still hold or be about
     * to take them; everything after `ctx` is what a new context resets. */
    pthread_mutex_t enqueue;  /* one fan-out or budgeted launch at a time: the events are shared */
    pthread_mutex_t stage_mu; /* guards stage[] and next_stage */
    CUcontext ctx;
    unsigned long long id; /* cuCtxGetId (CUDA 12.0+); 0 where the driver has none */
    int code;              /* 0: fn/pool usable; else why not (CUresult or KVSWAP_E_*) */
    CUfunction fn;
    /* kvswap_copy_params, or NULL (not compiled in, not loadable, or refused).  Atomic: any
     * thread whose launch the driver refuses clears it while others read it unlocked. */
    _Atomic(CUfunction) fn_params;
    CUmemoryPool pool;
    int host_mapped; /* unified addressing: pinned host pointers are device pointers */
    int sms;
    int ctas_per_sm; /* resident CTAs of KVSWAP_KERNEL_THREADS per SM (occupancy), for one full wave */
    int ctas_per_sm_params; /* the same for fn_params */
    /* kv_slot_make_kernel ran (code says how it went).  Written with release under kv_k.mu and read
     * with acquire without it (double-checked locking), so a reader that sees 1 also sees what
     * kv_slot_make_kernel wrote (code, fn, fn_params, pool, sms, ...). */
    _Atomic int kernel_made;
    int ce_ready;    /* internal streams and events made */
    CUstream ce[KV_MAX_STREAMS];
    CUevent ce_done[KV_MAX_STREAMS];
    CUstream prio;   /* highest-priority stream for the budgeted kernel */
    CUevent start, prio_done;
    /* Pinned staging for descriptor uploads: packed here, then one asynchronous DMA.  A buffer
     * is reused once the event recorded after its DMA has completed. */
    struct {
        void *host;
        size_t cap;
        CUevent done;
        int busy;     /* being packed and enqueued by a thread */
        int recorded; /* `done` follows its last DMA */
    } stage[KV_STAGES];
    int stages_ready;
    unsigned next_stage;
} kv_ctx_slot;

static struct {
    pthread_once_t resolve_once;
    int resolved;    /* every driver entry point the kernel path needs was found */
    int fan_resolved; /* streams with priority and events: the fan-out and the budgeted kernel */
    kv_cu_ctx_get_current_fn ctx_get_current;
    kv_cu_ctx_get_device_fn ctx_get_device;
    kv_cu_ctx_get_id_fn ctx_get_id; /* may be NULL (driver < 12.0): slots keyed by address alone */
    kv_cu_dev_attr_fn dev_attr;
    kv_cu_module_load_data_fn module_load_data;
    kv_cu_module_get_function_fn module_get_function;
    kv_cu_launch_fn launch;
    kv_cu_htod_async_fn htod_async;
    kv_cu_pool_create_fn pool_create;
    kv_cu_pool_set_attr_fn pool_set_attr;
    kv_cu_alloc_pool_async_fn alloc_async;
    kv_cu_free_async_fn free_async;
    kv_cu_ptr_attr_fn ptr_attr;
    kv_cu_stream_create_prio_fn stream_create_prio;
    kv_cu_prio_range_fn prio_range;
    kv_cu_event_create_fn event_create;
    kv_cu_event_record_fn event_record;
    kv_cu_event_query_fn event_query;     /* these three may be NULL: uploads then go from */
    kv_cu_host_alloc_fn host_alloc;       /* pageable memory, which the driver copies before */
    kv_cu_host_free_fn host_free;         /* cuMemcpyHtoDAsync returns */
    kv_cu_stream_wait_event_fn stream_wait_event;
    kv_cu_occupancy_fn occupancy; /* may be NULL: then 8 CTAs per SM are assumed */
    kv_cu_driver_version_fn driver_version;

    /* The compiled image (once per process, for the first calling context's device). */
    pthread_once_t compile_once;
    int compile_code;   /* 0, a CUresult, or KVSWAP_E_* */
    char *image;        /* CUBIN or NUL-terminated PTX */
    int image_is_cubin;
    int param_blocks;   /* KVSWAP_PARAM_BLOCKS when the image has kvswap_copy_params, else 0 */

    pthread_mutex_t info_mu; /* guards info: written by compile and slot set-up, read by kvswap_kernel_info */
    char info[320];

    pthread_mutex_t mu; /* guards ctx[] and nctx */
    kv_ctx_slot ctx[KV_KERNEL_MAX_CONTEXTS];
    int nctx;
} kv_k = {.resolve_once = PTHREAD_ONCE_INIT, .compile_once = PTHREAD_ONCE_INIT,
          .info_mu = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER};

__attribute__((format(printf, 1, 2)))
static void kv_set_info(const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&kv_k.info_mu);
    va_start(ap, fmt);
    vsnprintf(kv_k.info, sizeof kv_k.info, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&kv_k.info_mu);
}

KVSWAP_API const char *kvswap_kernel_info(void) {
    /* A copy taken under the writer's lock: the caller may read it while another thread
     * (compiling, or setting up a context) writes a new sentence. */
    static __thread char copy[sizeof kv_k.info];
    pthread_mutex_lock(&kv_k.info_mu);
    memcpy(copy, kv_k.info, sizeof copy);
    pthread_mutex_unlock(&kv_k.info_mu);
    if (!copy[0]) return "not yet tried (compiled at the first call that may take the kernel path)";
    return copy;
}

/* ------------------------------------------------------------------ policy, settings, calibration */

static _Atomic int kv_policy = -1;     /* -1: not yet read from KVSWAP_POLICY */
static _Atomic int kv_ce_streams = -1; /* -1: the calibration's per-direction choice (KVSWAP_CE_STREAMS) */
static _Atomic int kv_sm_budget = -1;  /* -1: not yet read from KVSWAP_SM_BUDGET */
static _Atomic int kv_ce_flags = -1;   /* -1: not yet read from KVSWAP_CE_FLAGS */
static _Atomic int kv_beside_host = -1; /* -1: not yet read from KVSWAP_BESIDE_HOST */

typedef struct {
    int direction;
    unsigned long long block_bytes, blocks;
    int path;    /* KVSWAP_PATH_* */
    int streams; /* copy-engine streams for BATCH rows (1: the caller's stream alone) */
} kv_cal_row;

static struct {
    pthread_once_t once;
    kv_cal_row rows[KV_CAL_MAX];
    int n;
    int sm_budget; /* the budget the file says its measurements assumed (0: whole GPU, -1: unsaid) */
    char source[200];
} kv_cal = {.once = PTHREAD_ONCE_INIT};

#define KV_DEFAULT_SM_BUDGET 32 /* CTAs of the budgeted kernel unless set */
/* The beside-compute policy's path for host transfers (d2h, h2d) unless set: see README.md. */
#ifndef KV_BESIDE_HOST_DEFAULT
#define KV_BESIDE_HOST_DEFAULT KVSWAP_PATH_BATCH
#endif

/* Built-in choices when no calibration file is given (whole-GPU kernel; copy-engine rows with the
 * stream count that was fastest per direction), from H200 measurements (reports/bench/swap-h200.json).
 * KV_BUILTIN_* are the per-direction copy-engine fan-outs measured there. */
#ifndef KV_BUILTIN_D2H_STREAMS
#define KV_BUILTIN_D2H_STREAMS 2 /* d2h, calls of 128: 1 to 8 streams alike (21.7-22.2 GB/s at 16 KiB) */
#endif
#ifndef KV_BUILTIN_H2D_STREAMS
#define KV_BUILTIN_H2D_STREAMS 1 /* h2d, calls of 128: more streams is slower (16 KiB: 22.6, 16.6, 11.2,
                                  * 6.6 GB/s with 1, 2, 4, 8 alone; 36.1, 24.5, 17.2 beside a GEMM) */
#endif
static const kv_cal_row kv_cal_builtin[] = {
    /* d2h: kernel 43-52 GB/s vs batch 5-47 GB/s up to 256 KiB; at 2 MiB the copy engine
     * reaches the link (54.6 vs 51.5). */
    {KVSWAP_DIR_D2H, 4096, 1024, KVSWAP_PATH_KERNEL, KV_BUILTIN_D2H_STREAMS},
    {KVSWAP_DIR_D2H, 16384, 1024, KVSWAP_PATH_KERNEL, KV_BUILTIN_D2H_STREAMS},
    {KVSWAP_DIR_D2H, 65536, 1024, KVSWAP_PATH_KERNEL, KV_BUILTIN_D2H_STREAMS},
    {KVSWAP_DIR_D2H, 262144, 1024, KVSWAP_PATH_KERNEL, KV_BUILTIN_D2H_STREAMS},
    {KVSWAP_DIR_D2H, 2097152, 1024, KVSWAP_PATH_BATCH, KV_BUILTIN_D2H_STREAMS},
    /* h2d: the same up to 64 KiB; at 256 KiB the two tie (51.2 vs 50.8): keep the SMs free. */
    {KVSWAP_DIR_H2D, 4096, 1024, KVSWAP_PATH_KERNEL, KV_BUILTIN_H2D_STREAMS},
    {KVSWAP_DIR_H2D, 16384, 1024, KVSWAP_PATH_KERNEL, KV_BUILTIN_H2D_STREAMS},
    {KVSWAP_DIR_H2D, 65536, 1024, KVSWAP_PATH_KERNEL, KV_BUILTIN_H2D_STREAMS},
    {KVSWAP_DIR_H2D, 262144, 1024, KVSWAP_PATH_BATCH, KV_BUILTIN_H2D_STREAMS},
    {KVSWAP_DIR_H2D, 2097152, 1024, KVSWAP_PATH_BATCH, KV_BUILTIN_H2D_STREAMS},
    /* d2d: each copy-engine copy costs ~4 us whatever its size; the kernel wins 3x-200x everywhere. */
    {KVSWAP_DIR_D2D, 4096, 1024, KVSWAP_PATH_KERNEL, 1},   {KVSWAP_DIR_D2D, 16384, 1024, KVSWAP_PATH_KERNEL, 1},
    {KVSWAP_DIR_D2D, 262144, 1024, KVSWAP_PATH_KERNEL, 1}, {KVSWAP_DIR_D2D, 2097152, 1024, KVSWAP_PATH_KERNEL, 1},
};

static int kv_parse_direction(const char *s) {
    if (!strcmp(s, "d2h")) return KVSWAP_DIR_D2H;
    if (!strcmp(s, "h2d")) return KVSWAP_DIR_H2D;
    if (!strcmp(s, "d2d")) return KVSWAP_DIR_D2D;
    return KVSWAP_DIR_UNKNOWN;
}

static int kv_parse_path(const char *s) {
    if (!strcmp(s, "kernel")) return KVSWAP_PATH_KERNEL;
    if (!strcmp(s, "batch")) return KVSWAP_PATH_BATCH;
    if (!strcmp(s, "loop") || !strcmp(s, "fallback")) return KVSWAP_PATH_FALLBACK;
    return KVSWAP_PATH_NONE;
}

/* KVSWAP_CALIBRATION names a text file, one row a line: `direction block_bytes blocks path [streams]`
 * (e.g. `d2h 16384 1024 batch 4`); `sm-budget N` records the CTAs the kernel rows were measured
 * with (0: the whole GPU); `#` starts a comment.  Unreadable lines are skipped. */
static void kv_cal_load(void) {
    const char *file = getenv("KVSWAP_CALIBRATION");
    kv_cal.sm_budget = -1;
    if (file && *file) {
        FILE *f = fopen(file, "r");
        if (f) {
            char line[256];
            while (kv_cal.n < KV_CAL_MAX && fgets(line, sizeof line, f)) {
                char dir[16], path[16];
                unsigned long long bb, nb;
                int streams = 1, budget = 0;
                if (line[0] == '#') continue;
                if (sscanf(line, "sm-budget %d", &budget) == 1) {
                    kv_cal.sm_budget = budget;
                    continue;
                }
                int got = sscanf(line, "%15s %llu %llu %15s %d", dir, &bb, &nb, path, &streams);
                if (got < 4) continue;
                if (got < 5 || streams < 1) streams = 1;
                if (streams > KV_MAX_STREAMS) streams = KV_MAX_STREAMS;
                int d = kv_parse_direction(dir), p = kv_parse_path(path);
                if (d == KVSWAP_DIR_UNKNOWN || p == KVSWAP_PATH_NONE || bb == 0 || nb == 0) continue;
                kv_cal.rows[kv_cal.n++] = (kv_cal_row){d, bb, nb, p, streams};
            }
            fclose(f);
            snprintf(kv_cal.source, sizeof kv_cal.source, "%s", file);
        }
    }
    if (kv_cal.n == 0) {
        for (size_t i = 0; i < sizeof kv_cal_builtin / sizeof kv_cal_builtin[0]; i++)
            kv_cal.rows[kv_cal.n++] = kv_cal_builtin[i];
        kv_cal.sm_budget = 0;
        snprintf(kv_cal.source, sizeof kv_cal.source, "built-in");
    }
}

/* log2 in sixteenths, enough to tell neighbouring sizes apart without libm. */
static long kv_log2_16(unsigned long long x) {
    if (x == 0) return 0;
    int e = 63 - __builtin_clzll(x);
    unsigned long long frac = e >= 4 ? (x >> (e - 4)) & 15 : (x << (4 - e)) & 15;
    return 16L * e + (long)frac;
}

/* The calibrated row for a call: the row of the same direction nearest in log2(block size),
 * then (a quarter as much) in log2(count); NULL when the table has none for the direction. */
static const kv_cal_row *kv_cal_row_for(int direction, unsigned long long block_bytes, unsigned long long blocks) {
    pthread_once(&kv_cal.once, kv_cal_load);
    long best = -1;
    const kv_cal_row *row = NULL;
    for (int i = 0; i < kv_cal.n; i++) {
        const kv_cal_row *r = &kv_cal.rows[i];
        if (r->direction != direction) continue;
        long db = labs(kv_log2_16(r->block_bytes) - kv_log2_16(block_bytes));
        long dn = labs(kv_log2_16(r->blocks) - kv_log2_16(blocks));
        long d = 4 * db + dn;
        if (best < 0 || d < best) {
            best = d;
            row = r;
        }
    }
    return row;
}

static int kv_cal_pick(int direction, unsigned long long block_bytes, unsigned long long blocks) {
    const kv_cal_row *r = kv_cal_row_for(direction, block_bytes, blocks);
    return r ? r->path : KVSWAP_PATH_BATCH;
}

static int kv_env_int(const char *name, int fallback, int lo, int hi) {
    const char *env = getenv(name);
    if (!env || !*env) return fallback;
    char *end = NULL;
    long v = strtol(env, &end, 10);
    return (end && !*end && v >= lo && v <= hi) ? (int)v : fallback;
}

static int kv_setting(_Atomic int *slot, const char *env, int fallback, int lo, int hi) {
    int v = atomic_load(slot);
    if (v != -1) return v;
    int expected = -1;
    atomic_compare_exchange_strong(slot, &expected, kv_env_int(env, fallback, lo, hi));
    return atomic_load(slot);
}

/* Copy-engine streams for a call: the explicit setting, else the calibrated row's. 0 = "calibrated". */
static int kv_streams_for(int direction, unsigned long long block_bytes, unsigned long long blocks) {
    int s = kv_setting(&kv_ce_streams, "KVSWAP_CE_STREAMS", 0, 0, KV_MAX_STREAMS);
    if (s > 0) return s;
    if (direction == KVSWAP_DIR_UNKNOWN) return 1;
    /* Every row records the fan-out the batch was fastest with, whichever path won the row. */
    const kv_cal_row *r = kv_cal_row_for(direction, block_bytes, blocks);
    return r ? r->streams : 1;
}

static int kv_sm_budget_now(void) {
    return kv_setting(&kv_sm_budget, "KVSWAP_SM_BUDGET", KV_DEFAULT_SM_BUDGET, 1, 1 << 16);
}

/* CUmemcpyAttributes.flags for the batch: 1 = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE. */
static unsigned kv_ce_flags_now(void) { return (unsigned)kv_setting(&kv_ce_flags, "KVSWAP_CE_FLAGS", 0, 0, 1); }
static _Atomic int kv_ce_chunk = -1; /* -1: not yet read from KVSWAP_CE_CHUNK */
static size_t kv_ce_chunk_now(void) {
    return (size_t)kv_setting(&kv_ce_chunk, "KVSWAP_CE_CHUNK", KV_CE_CHUNK, 1, 1 << 20);
}

/* The beside-compute policy's path for d2h/h2d: KVSWAP_PATH_BATCH (copy engines, fanned out) or
 * KVSWAP_PATH_KERNEL (the budgeted kernel).  Env KVSWAP_BESIDE_HOST=batch|kernel. */
static int kv_beside_host_now(void) {
    int v = atomic_load(&kv_beside_host);
    if (v != -1) return v;
    const char *env = getenv("KVSWAP_BESIDE_HOST");
    int p = env && !strcmp(env, "kernel") ? KVSWAP_PATH_KERNEL : env && !strcmp(env, "batch") ? KVSWAP_PATH_BATCH
                                                                                         : KV_BESIDE_HOST_DEFAULT;
    int expected = -1;
    atomic_compare_exchange_strong(&kv_beside_host, &expected, p);
    return atomic_load(&kv_beside_host);
}

KVSWAP_API int kvswap_set_beside_compute_host_path(int path) {
    if (path != KVSWAP_PATH_BATCH && path != KVSWAP_PATH_KERNEL) return KVSWAP_E_INVALID_ARGUMENT;
    atomic_store(&kv_beside_host, path);
    return 0;
}

KVSWAP_API int kvswap_get_beside_compute_host_path(void) { return kv_beside_host_now(); }

static int kv_policy_now(void) {
    int p = atomic_load(&kv_policy);
    if (p >= 0) return p;
    const char *env = getenv("KVSWAP_POLICY");
    p = KVSWAP_POLICY_DEFAULT;
    if (env) {
        if (!strcmp(env, "fastest")) p = KVSWAP_POLICY_FASTEST;
        else if (!strcmp(env, "copy-engine-only")) p = KVSWAP_POLICY_COPY_ENGINE_ONLY;
        else if (!strcmp(env, "kernel")) p = KVSWAP_POLICY_KERNEL;
        else if (!strcmp(env, "batch")) p = KVSWAP_POLICY_BATCH;
        else if (!strcmp(env, "loop")) p = KVSWAP_POLICY_LOOP;
        else if (!strcmp(env, "beside-compute")) p = KVSWAP_POLICY_BESIDE_COMPUTE;
    }
    int expected = -1;
    atomic_compare_exchange_strong(&kv_policy, &expected, p);
    return atomic_load(&kv_policy);
}

KVSWAP_API int kvswap_set_policy(int policy) {
    if (policy < KVSWAP_POLICY_FASTEST || policy > KVSWAP_POLICY_BESIDE_COMPUTE) return KVSWAP_E_INVALID_ARGUMENT;
    atomic_store(&kv_policy, policy);
    return 0;
}

KVSWAP_API int kvswap_get_policy(void) { return kv_policy_now(); }

KVSWAP_API int kvswap_set_copy_streams(int streams) {
    if (streams < 0 || streams > KV_MAX_STREAMS) return KVSWAP_E_INVALID_ARGUMENT;
    atomic_store(&kv_ce_streams, streams);
    return 0;
}

KVSWAP_API int kvswap_set_sm_budget(int ctas) {
    if (ctas < 1) return KVSWAP_E_INVALID_ARGUMENT;
    atomic_store(&kv_sm_budget, ctas);
    return 0;
}

KVSWAP_API int kvswap_get_sm_budget(void) { return kv_sm_budget_now(); }

KVSWAP_API int kvswap_calibrated_path(int direction, size_t block_bytes, size_t blocks) {
    if (direction < KVSWAP_DIR_D2H || direction > KVSWAP_DIR_D2D || !block_bytes || !blocks)
        return KVSWAP_E_INVALID_ARGUMENT;
    return kv_cal_pick(direction, block_bytes, blocks);
}

KVSWAP_API int kvswap_calibrated_streams(int direction, size_t block_bytes, size_t blocks) {
    if (direction < KVSWAP_DIR_D2H || direction > KVSWAP_DIR_D2D || !block_bytes || !blocks)
        return KVSWAP_E_INVALID_ARGUMENT;
    return kv_streams_for(direction, block_bytes, blocks);
}

KVSWAP_API const char *kvswap_calibration_source(void) {
    pthread_once(&kv_cal.once, kv_cal_load);
    return kv_cal.source;
}

KVSWAP_API int kvswap_calibration_sm_budget(void) {
    pthread_once(&kv_cal.once, kv_cal_load);
    return kv_cal.sm_budget;
}

/* ------------------------------------------------------------------ resolution and compile */

/* After driver_api.inc's kv_drv_resolve succeeded: the entry points of the kernel and the fan-out. */
static void kv_kernel_resolve(void) {
#define KV_K(field, type, name, version) kv_k.field = (type)kv_drv_lookup(name, version)
    KV_K(ctx_get_current, kv_cu_ctx_get_current_fn, "cuCtxGetCurrent", 4000);
    KV_K(ctx_get_device, kv_cu_ctx_get_device_fn, "cuCtxGetDevice", 2000);
    KV_K(ctx_get_id, kv_cu_ctx_get_id_fn, "cuCtxGetId", 12000);
    KV_K(dev_attr, kv_cu_dev_attr_fn, "cuDeviceGetAttribute", 2000);
    KV_K(module_load_data, kv_cu_module_load_data_fn, "cuModuleLoadData", 2000);
    KV_K(module_get_function, kv_cu_module_get_function_fn, "cuModuleGetFunction", 2000);
    KV_K(launch, kv_cu_launch_fn, "cuLaunchKernel", 4000);
    KV_K(htod_async, kv_cu_htod_async_fn, "cuMemcpyHtoDAsync", 3020);
    KV_K(pool_create, kv_cu_pool_create_fn, "cuMemPoolCreate", 11020);
    KV_K(pool_set_attr, kv_cu_pool_set_attr_fn, "cuMemPoolSetAttribute", 11020);
    KV_K(alloc_async, kv_cu_alloc_pool_async_fn, "cuMemAllocFromPoolAsync", 11020);
    KV_K(free_async, kv_cu_free_async_fn, "cuMemFreeAsync", 11020);
    KV_K(ptr_attr, kv_cu_ptr_attr_fn, "cuPointerGetAttribute", 4000);
    KV_K(stream_create_prio, kv_cu_stream_create_prio_fn, "cuStreamCreateWithPriority", 5050);
    KV_K(prio_range, kv_cu_prio_range_fn, "cuCtxGetStreamPriorityRange", 5050);
    KV_K(event_create, kv_cu_event_create_fn, "cuEventCreate", 2000);
    KV_K(event_record, kv_cu_event_record_fn, "cuEventRecord", 2000);
    KV_K(event_query, kv_cu_event_query_fn, "cuEventQuery", 2000);
    KV_K(host_alloc, kv_cu_host_alloc_fn, "cuMemHostAlloc", 3020);
    KV_K(host_free, kv_cu_host_free_fn, "cuMemFreeHost", 2000);
    KV_K(stream_wait_event, kv_cu_stream_wait_event_fn, "cuStreamWaitEvent", 3020);
    KV_K(occupancy, kv_cu_occupancy_fn, "cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050);
    KV_K(driver_version, kv_cu_driver_version_fn, "cuDriverGetVersion", 2020);
#undef KV_K
    kv_k.fan_resolved = kv_k.ctx_get_current && kv_k.stream_create_prio && kv_k.prio_range && kv_k.event_create &&
                        kv_k.event_record && kv_k.stream_wait_event;
    kv_k.resolved = kv_k.ctx_get_current && kv_k.ctx_get_device && kv_k.dev_attr && kv_k.module_load_data &&
                    kv_k.module_get_function && kv_k.launch && kv_k.htod_async && kv_k.pool_create &&
                    kv_k.pool_set_attr && kv_k.alloc_async && kv_k.free_async && kv_k.ptr_attr;
    if (!kv_k.resolved)
        kv_set_info("unavailable: the driver lacks an entry point the kernel path needs "
                    "(stream-ordered allocator: CUDA 11.2+)");
}

static void *kv_nvrtc_open(char *which, size_t which_len) {
    const char *env = getenv("KVSWAP_NVRTC");
    const char *names[] = {env && *env ? env : NULL, "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!names[i]) continue;
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(which, which_len, "%s", names[i]);
            return h;
        }
    }
    return NULL;
}

/* Compile kvswap_kernel_source for the current context's device: CUBIN for sm_XY, else PTX. */
static void kv_kernel_compile(void) {
    CUdevice dev;
    int major = 0, minor = 0;
    if (kv_k.ctx_get_device(&dev) != CUDA_SUCCESS ||
        kv_k.dev_attr(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != CUDA_SUCCESS ||
        kv_k.dev_attr(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != CUDA_SUCCESS) {
        kv_k.compile_code = KVSWAP_E_NO_LIBRARY;
        kv_set_info("unavailable: no current context to read the architecture from");
        return;
    }
    char lib[160];
    void *h = kv_nvrtc_open(lib, sizeof lib);
    if (!h) {
        kv_k.compile_code = KVSWAP_E_NO_LIBRARY;
        kv_set_info("unavailable: no NVRTC (set KVSWAP_NVRTC or put libnvrtc.so.13/.12 "
                                              "on the library path)");
        return;
    }
    kv_nvrtc_version_fn version = (kv_nvrtc_version_fn)dlsym(h, "nvrtcVersion");
    kv_nvrtc_create_fn create = (kv_nvrtc_create_fn)dlsym(h, "nvrtcCreateProgram");
    kv_nvrtc_compile_fn compile = (kv_nvrtc_compile_fn)dlsym(h, "nvrtcCompileProgram");
    kv_nvrtc_size_fn cubin_size = (kv_nvrtc_size_fn)dlsym(h, "nvrtcGetCUBINSize");
    kv_nvrtc_get_fn get_cubin = (kv_nvrtc_get_fn)dlsym(h, "nvrtcGetCUBIN");
    kv_nvrtc_size_fn ptx_size = (kv_nvrtc_size_fn)dlsym(h, "nvrtcGetPTXSize");
    kv_nvrtc_get_fn get_ptx = (kv_nvrtc_get_fn)dlsym(h, "nvrtcGetPTX");
    kv_nvrtc_size_fn log_size = (kv_nvrtc_size_fn)dlsym(h, "nvrtcGetProgramLogSize");
    kv_nvrtc_get_fn get_log = (kv_nvrtc_get_fn)dlsym(h, "nvrtcGetProgramLog");
    kv_nvrtc_destroy_fn destroy = (kv_nvrtc_destroy_fn)dlsym(h, "nvrtcDestroyProgram");
    if (!version || !create || !compile || !ptx_size || !get_ptx || !log_size || !get_log || !destroy) {
        kv_k.compile_code = KVSWAP_E_MISSING_SYMBOL;
        kv_set_info("unavailable: %s lacks an NVRTC entry point", lib);
        return;
    }
    int vmaj = 0, vmin = 0;
    version(&vmaj, &vmin);
    /* NVRTC dlopen()s libnvrtc-builtins.so.X.Y by name; when it was found by path (a wheel's
     * nvidia/cu13/lib), load that neighbour first so the by-name lookup finds it loaded. */
    const char *slash = strrchr(lib, '/');
    if (slash) {
        char builtins[240];
        snprintf(builtins, sizeof builtins, "%.*s/libnvrtc-builtins.so.%d.%d", (int)(slash - lib), lib, vmaj, vmin);
        dlopen(builtins, RTLD_NOW | RTLD_GLOBAL);
    }
    kv_set_info("unavailable: NVRTC %d.%d (%s) could not build the kernel for sm_%d%d",
             vmaj, vmin, lib, major, minor);
    /* Machine code first (nvrtcGetCUBIN exists from NVRTC 11.1): no JIT, no PTX-version check. */
    /* KVSWAP_KERNEL_IMAGE=ptx skips the CUBIN: the driver JIT-compiles the PTX, which fails with
     * CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222) where the NVRTC is newer than the driver (matrix rows). */
    const char *image = getenv("KVSWAP_KERNEL_IMAGE");
    int want_cubin = !(image && !strcmp(image, "ptx"));
    /* Descriptors in the kernel's parameters need parameters over 4 KiB: a 12.1+ driver and NVRTC
     * and sm_70+.  Each image kind is tried with them first, then without (uploads only). */
    int drv = 0;
    int params = major >= 7 && (vmaj > 12 || (vmaj == 12 && vmin >= 1)) && kv_k.driver_version &&
                 kv_k.driver_version(&drv) == CUDA_SUCCESS && drv >= 12010;
    int attempts[4][2], nattempts = 0; /* (cubin, with parameters) in the order tried */
    for (int cubin = want_cubin && cubin_size && get_cubin ? 1 : 0; cubin >= 0; cubin--) {
        if (params) {
            attempts[nattempts][0] = cubin;
            attempts[nattempts++][1] = 1;
        }
        attempts[nattempts][0] = cubin;
        attempts[nattempts++][1] = 0;
    }
    for (int a = 0; a < nattempts; a++) {
        int cubin = attempts[a][0], with_params = attempts[a][1];
        char arch[48], define[48];
        snprintf(arch, sizeof arch, "--gpu-architecture=%s_%d%d", cubin ? "sm" : "compute", major, minor);
        snprintf(define, sizeof define, "-DKVSWAP_PARAM_BLOCKS=%d", KVSWAP_PARAM_BLOCKS);
        const char *opts[] = {arch, "-default-device", "--std=c++11", define};
        kv_nvrtc_prog prog = NULL;
        if (create(&prog, kvswap_kernel_source, "kvswap_kernel.cu", 0, NULL, NULL) != 0) continue;
        int rc = compile(prog, with_params ? 4 : 3, opts);
        size_t n = 0;
        if (rc == 0 && (cubin ? cubin_size(prog, &n) : ptx_size(prog, &n)) == 0 && n > 0) {
            kv_k.image = malloc(n + 1);
            if (kv_k.image && (cubin ? get_cubin(prog, kv_k.image) : get_ptx(prog, kv_k.image)) == 0) {
                kv_k.image[n] = '\0';
                kv_k.image_is_cubin = cubin;
                kv_k.param_blocks = with_params ? KVSWAP_PARAM_BLOCKS : 0;
                kv_set_info("%s %s_%d%d via %s (NVRTC %d.%d)%s", cubin ? "cubin" : "ptx",
                         cubin ? "sm" : "compute", major, minor, lib, vmaj, vmin,
                         with_params ? "; descriptors of up to " KV_STR(KVSWAP_PARAM_BLOCKS)
                                       " blocks of one size in the kernel's parameters" : "");
                destroy(&prog);
                return;
            }
            free(kv_k.image);
            kv_k.image = NULL;
        } else if (!cubin) {
            char log[200] = "";
            size_t ln = 0;
            if (log_size(prog, &ln) == 0 && ln > 0 && ln < 4096) {
                char *full = malloc(ln);
                if (full && get_log(prog, full) == 0) snprintf(log, sizeof log, "%s", full);
                free(full);
            }
            kv_set_info("unavailable: NVRTC %d.%d (%s) cannot compile for %s: %s", vmaj,
                     vmin, lib, arch, log);
        }
        destroy(&prog);
    }
    kv_k.compile_code = KVSWAP_E_NO_LIBRARY;
}

/* The current context and its id (0 where the driver cannot say). */
static int kv_current_context(CUcontext *ctx, unsigned long long *id) {
    *ctx = NULL;
    *id = 0;
    if (!kv_k.ctx_get_current || kv_k.ctx_get_current(ctx) != CUDA_SUCCESS || !*ctx) return -1;
    if (kv_k.ctx_get_id) kv_k.ctx_get_id(*ctx, id);
    return 0;
}

/* Internal streams and events of a slot (the copy-engine fan-out and the budgeted kernel). */
static void kv_slot_make_streams(kv_ctx_slot *s) {
    if (!kv_k.fan_resolved) return;
    int least = 0, greatest = 0;
    if (kv_k.prio_range(&least, &greatest) != CUDA_SUCCESS) greatest = 0;
    int ok = kv_k.event_create(&s->start, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
             kv_k.event_create(&s->prio_done, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
             kv_k.stream_create_prio(&s->prio, CU_STREAM_NON_BLOCKING, greatest) == CUDA_SUCCESS;
    for (int j = 0; ok && j < KV_MAX_STREAMS; j++)
        ok = kv_k.stream_create_prio(&s->ce[j], CU_STREAM_NON_BLOCKING, least) == CUDA_SUCCESS &&
             kv_k.event_create(&s->ce_done[j], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
    s->ce_ready = ok;
    int staged = kv_k.event_query && kv_k.host_alloc && kv_k.host_free && kv_k.event_create;
    for (int j = 0; staged && j < KV_STAGES; j++)
        staged = kv_k.event_create(&s->stage[j].done, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
    s->stages_ready = staged;
}

/* A pinned staging buffer of at least `bytes` that no DMA still reads, marked busy; -1 if none
 * (all in flight, or pinned memory refused): the caller then uploads from pageable memory. */
static int kv_stage_take(kv_ctx_slot *s, size_t bytes) {
    if (!s->stages_ready) return -1;
    pthread_mutex_lock(&s->stage_mu);
    int got = -1;
    for (unsigned k = 0; k < KV_STAGES && got < 0; k++) {
        unsigned j = (s->next_stage + k) % KV_STAGES;
        if (s->stage[j].busy || (s->stage[j].recorded && kv_k.event_query(s->stage[j].done) != CUDA_SUCCESS))
            continue;
        if (s->stage[j].cap < bytes) {
            size_t cap = 64 * 1024;
            while (cap < bytes) cap *= 2;
            void *p = NULL;
            if (kv_k.host_alloc(&p, cap, 0) != CUDA_SUCCESS) break;
            if (s->stage[j].host) kv_k.host_free(s->stage[j].host);
            s->stage[j].host = p;
            s->stage[j].cap = cap;
        }
        s->stage[j].busy = 1;
        s->next_stage = j + 1;
        got = (int)j;
    }
    pthread_mutex_unlock(&s->stage_mu);
    return got;
}

/* Give a staging buffer back; `recorded`: its `done` event was recorded after the DMA. */
static void kv_stage_give(kv_ctx_slot *s, int j, int recorded) {
    pthread_mutex_lock(&s->stage_mu);
    s->stage[j].busy = 0;
    s->stage[j].recorded = recorded;
    pthread_mutex_unlock(&s->stage_mu);
}

/* Module, pool and attributes of a slot for the current context (kv_k.mu held). */
static void kv_slot_make_kernel(kv_ctx_slot *s) {
    CUdevice dev;
    int pools = 0, uva = 0;
    s->code = kv_k.resolved ? kv_k.compile_code : KVSWAP_E_MISSING_SYMBOL;
    if (!s->code && (kv_k.ctx_get_device(&dev) != CUDA_SUCCESS ||
                     kv_k.dev_attr(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev) != CUDA_SUCCESS ||
                     !pools))
        s->code = (int)CUDA_ERROR_NOT_SUPPORTED;
    if (s->code) return;
    kv_k.dev_attr(&uva, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev);
    kv_k.dev_attr(&s->sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    s->host_mapped = uva;
    /* Loading can fail where compiling did not: e.g. CUDA_ERROR_UNSUPPORTED_PTX_VERSION
     * (222) for PTX newer than the driver, CUDA_ERROR_NO_BINARY_FOR_GPU for a context on
     * a device of another architecture than the one compiled for. */
    CUmodule mod;
    CUresult rc = kv_k.module_load_data(&mod, kv_k.image);
    if (rc == CUDA_SUCCESS) rc = kv_k.module_get_function(&s->fn, mod, KVSWAP_KERNEL_NAME);
    CUfunction fn_params = NULL;
    if (rc == CUDA_SUCCESS && kv_k.param_blocks &&
        kv_k.module_get_function(&fn_params, mod, KVSWAP_PARAMS_KERNEL_NAME) != CUDA_SUCCESS)
        fn_params = NULL;
    /* Published by kernel_made's release store (kv_kernel_ready). */
    atomic_store_explicit(&s->fn_params, fn_params, memory_order_relaxed);
    if (rc == CUDA_SUCCESS) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev;
        rc = kv_k.pool_create(&s->pool, &props);
        /* Keep freed descriptor buffers in the pool rather than trimming at every sync. */
        cuuint64_t keep = UINT64_MAX;
        if (rc == CUDA_SUCCESS) rc = kv_k.pool_set_attr(s->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
        /* A persistent grid is one wave: as many CTAs as fit at once, no second wave's tail. */
        if (rc == CUDA_SUCCESS && (!kv_k.occupancy ||
                                   kv_k.occupancy(&s->ctas_per_sm, s->fn, KVSWAP_KERNEL_THREADS, 0) != CUDA_SUCCESS ||
                                   s->ctas_per_sm < 1))
            s->ctas_per_sm = 8;
        if (rc == CUDA_SUCCESS && s->fn_params &&
            (!kv_k.occupancy ||
             kv_k.occupancy(&s->ctas_per_sm_params, s->fn_params, KVSWAP_KERNEL_THREADS, 0) != CUDA_SUCCESS ||
             s->ctas_per_sm_params < 1))
            s->ctas_per_sm_params = s->ctas_per_sm;
    }
    if (rc != CUDA_SUCCESS) {
        s->code = (int)rc;
        kv_set_info("unavailable: loading the %s failed: %s", kv_k.image_is_cubin ? "cubin" : "ptx",
                    kv_drv_error_name(rc));
    }
}

/* The slot of the current context, made on first use; -1 when no context is current or all slots
 * are taken.  A slot whose context address matches but whose id differs belonged to a destroyed
 * context (the driver reuses addresses): its module, pool and streams died with it, so it is
 * made again.  (Drivers before 12.0 have no cuCtxGetId: there the address alone is the key.) */
static int kv_context_slot(void) {
    CUcontext ctx;
    unsigned long long id;
    if (kv_current_context(&ctx, &id) != 0) return -1;
    pthread_mutex_lock(&kv_k.mu);
    int i = 0;
    while (i < kv_k.nctx && kv_k.ctx[i].ctx != ctx) i++;
    if (i < kv_k.nctx && kv_k.ctx[i].id == id) {
        pthread_mutex_unlock(&kv_k.mu);
        return i;
    }
    if (i == KV_KERNEL_MAX_CONTEXTS) {
        pthread_mutex_unlock(&kv_k.mu);
        return -1;
    }
    kv_ctx_slot *s = &kv_k.ctx[i];
    if (i < kv_k.nctx) {
        /* A stale slot: forget its state (its module, pool, streams and pinned buffers died with its
         * context), but keep its mutexes, which are never destroyed: a thread may hold one or be
         * about to take one.  Resetting under both leaves no fan-out or staging half-way. */
        pthread_mutex_lock(&s->enqueue);
        pthread_mutex_lock(&s->stage_mu);
        memset((char *)s + offsetof(kv_ctx_slot, ctx), 0, sizeof *s - offsetof(kv_ctx_slot, ctx));
        atomic_store_explicit(&s->fn_params, NULL, memory_order_relaxed);
        atomic_store_explicit(&s->kernel_made, 0, memory_order_relaxed);
        pthread_mutex_unlock(&s->stage_mu);
        pthread_mutex_unlock(&s->enqueue);
    } else {
        memset((char *)s + offsetof(kv_ctx_slot, ctx), 0, sizeof *s - offsetof(kv_ctx_slot, ctx));
        pthread_mutex_init(&s->enqueue, NULL);
        pthread_mutex_init(&s->stage_mu, NULL);
    }
    s->ctx = ctx;
    s->id = id;
    kv_slot_make_streams(s);
    if (i == kv_k.nctx) kv_k.nctx++;
    pthread_mutex_unlock(&kv_k.mu);
    return i;
}

/* Direction of block 0 from the pointer attributes; UNKNOWN when either side is not CUDA
 * memory (pageable host memory) or a host pointer is not its own device address. */
static int kv_direction_of(void *const *src, void *const *dst, int host_mapped) {
    unsigned int ts = 0, td = 0;
    if (!kv_k.ptr_attr ||
        kv_k.ptr_attr(&ts, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)src[0]) != CUDA_SUCCESS ||
        kv_k.ptr_attr(&td, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)dst[0]) != CUDA_SUCCESS)
        return KVSWAP_DIR_UNKNOWN;
    void *const *host = ts == CU_MEMORYTYPE_HOST ? src : td == CU_MEMORYTYPE_HOST ? dst : NULL;
    if (host) {
        CUdeviceptr mapped = 0;
        if (!host_mapped || (ts == CU_MEMORYTYPE_HOST && td == CU_MEMORYTYPE_HOST) ||
            kv_k.ptr_attr(&mapped, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, (CUdeviceptr)host[0]) != CUDA_SUCCESS ||
            mapped != (CUdeviceptr)host[0])
            return KVSWAP_DIR_UNKNOWN;
        return ts == CU_MEMORYTYPE_HOST ? KVSWAP_DIR_H2D : KVSWAP_DIR_D2H;
    }
    return ts == CU_MEMORYTYPE_DEVICE && td == CU_MEMORYTYPE_DEVICE ? KVSWAP_DIR_D2D : KVSWAP_DIR_UNKNOWN;
}

/* Launch the copy kernel for all n blocks on `stream`, on at most `max_ctas` CTAs (0: as many as
 * fill the GPU).  Returns 0, or a CUDA error / KVSWAP_E_OUT_OF_MEMORY. */
static int kv_kernel_copy(int slot, void *const *src, void *const *dst, const size_t *sizes, size_t n,
                          int max_ctas, CUstream stream, kvswap_status *st) {
    kv_ctx_slot *s = &kv_k.ctx[slot];
    int uniform = 1;
    size_t largest = sizes[0];
    for (size_t i = 1; i < n; i++) {
        if (sizes[i] != sizes[0]) uniform = 0;
        if (sizes[i] > largest) largest = sizes[i];
    }
    /* Work items of at most 32 KiB, so a few large blocks still spread over every warp. */
    size_t split = (largest + 32767) / 32768;
    unsigned slices = split > 1024 ? 1024 : (unsigned)split;
    unsigned threads = max_ctas > 0 ? KVSWAP_KERNEL_MAX_THREADS : KVSWAP_KERNEL_THREADS;
    unsigned long long items = (unsigned long long)n * slices, warps_per_cta = threads / 32;
    unsigned long long want = (items + warps_per_cta - 1) / warps_per_cta;
    unsigned long long sms = (unsigned long long)(s->sms > 0 ? s->sms : 132);
    CUfunction fn_params = atomic_load_explicit(&s->fn_params, memory_order_relaxed);
    if (uniform && fn_params && n <= (size_t)kv_k.param_blocks) {
        /* The descriptors travel in the launch itself (the driver has copied the parameters when
         * cuLaunchKernel returns): no upload, no allocation, nothing on the GPU before the copy. */
        static __thread kvswap_params *p;
        if (!p && !(p = malloc(sizeof *p)))
            return kv_fail(st, KVSWAP_E_OUT_OF_MEMORY, -1, NULL, "out of host memory for the kernel's parameters");
        p->n = n;
        p->size = sizes[0];
        p->slices = slices;
        p->pad = 0;
        memcpy(p->addr, src, n * sizeof(void *));
        memcpy(p->addr + KVSWAP_PARAM_BLOCKS, dst, n * sizeof(void *));
        unsigned long long cap = max_ctas > 0 ? (unsigned long long)max_ctas : sms * s->ctas_per_sm_params;
        void *args[] = {p};
        CUresult prc = kv_k.launch(fn_params, (unsigned)(want < cap ? want : cap), 1, 1, threads, 1, 1, 0, stream,
                                   args, NULL);
        if (prc == CUDA_SUCCESS) return 0;
        if (prc != CUDA_ERROR_INVALID_VALUE && prc != CUDA_ERROR_NOT_SUPPORTED && prc != CUDA_ERROR_INVALID_HANDLE)
            return kv_fail(st, (int)prc, -1, kv_drv_error_name(prc), "copy kernel launch failed: %s",
                           kv_drv_error_name(prc));
        /* Refused before it was queued (a driver that takes no large parameters after all): the
         * descriptors go through device memory from now on, this call included. */
        atomic_store_explicit(&s->fn_params, NULL, memory_order_relaxed);
    }
    size_t words = uniform ? 2 * n : 3 * n;
    size_t bytes = words * sizeof(unsigned long long);
    /* Packed into a pinned staging buffer, the upload is one asynchronous DMA: the call returns
     * without waiting for it, and the copy starts as soon as the GPU gets to it.  (From pageable
     * memory the driver copies the table through its own staging before returning: for 32768
     * blocks that was half of a 512 MiB device copy's time.) */
    int stage = kv_stage_take(s, bytes);
    unsigned long long *host;
    static __thread unsigned long long *pageable;
    static __thread size_t pageable_cap;
    if (stage >= 0) {
        host = s->stage[stage].host;
    } else {
        /* One packing buffer per thread, grown as needed: a fresh malloc of a large table is an
         * mmap plus a page fault per 4 KiB on every call. */
        if (bytes > pageable_cap) {
            unsigned long long *grown = realloc(pageable, bytes);
            if (!grown)
                return kv_fail(st, KVSWAP_E_OUT_OF_MEMORY, -1, NULL,
                               "out of host memory for %zu descriptors (%zu bytes)", n, bytes);
            pageable = grown;
            pageable_cap = bytes;
        }
        host = pageable;
    }
    memcpy(host, src, n * sizeof(void *));
    memcpy(host + n, dst, n * sizeof(void *));
    if (!uniform) memcpy(host + 2 * n, sizes, n * sizeof(size_t));
    CUdeviceptr desc = 0;
    CUresult rc = kv_k.alloc_async(&desc, bytes, s->pool, stream);
    if (rc == CUDA_SUCCESS) rc = kv_k.htod_async(desc, host, bytes, stream);
    /* Pinned: the DMA reads `host` later, so the buffer is reused only once the event recorded
     * after it on this stream has completed.  Pageable: the driver has captured it before
     * cuMemcpyHtoDAsync returns, so the next call on this thread may overwrite it. */
    if (stage >= 0) {
        if (rc != CUDA_SUCCESS) kv_stage_give(s, stage, 0); /* no DMA was enqueued */
        else if (kv_k.event_record(s->stage[stage].done, stream) == CUDA_SUCCESS) kv_stage_give(s, stage, 1);
        /* else: nothing tells when the DMA is done, so the buffer stays busy and is never reused. */
    }
    if (rc == CUDA_SUCCESS) {
        CUdeviceptr d_src = desc, d_dst = desc + n * 8, d_sizes = uniform ? 0 : desc + 2 * n * 8;
        unsigned long long uniform_size = uniform ? (unsigned long long)sizes[0] : 0, count = n;
        unsigned long long cap = max_ctas > 0 ? (unsigned long long)max_ctas : sms * s->ctas_per_sm;
        unsigned grid = (unsigned)(want < cap ? want : cap);
        void *args[] = {&d_src, &d_dst, &d_sizes, &uniform_size, &count, &slices};
        rc = kv_k.launch(s->fn, grid, 1, 1, threads, 1, 1, 0, stream, args, NULL);
    }
    if (desc) {
        CUresult frc = kv_k.free_async(desc, stream);
        if (rc == CUDA_SUCCESS) rc = frc;
    }
    if (rc != CUDA_SUCCESS)
        return kv_fail(st, (int)rc, -1, kv_drv_error_name(rc), "copy kernel launch failed: %s", kv_drv_error_name(rc));
    return 0;
}

static int kv_enqueue_fail(kvswap_status *st, CUresult rc, const char *what) {
    return kv_fail(st, (int)rc, -1, kv_drv_error_name(rc), "%s failed: %s", what, kv_drv_error_name(rc));
}

/* The budgeted kernel: at most kv_sm_budget_now() CTAs, on the slot's highest-priority stream,
 * joined to the caller's stream before (start) and after (prio_done). */
static int kv_kernel_copy_budgeted(int slot, void *const *src, void *const *dst, const size_t *sizes, size_t n,
                                   CUstream stream, kvswap_status *st) {
    kv_ctx_slot *s = &kv_k.ctx[slot];
    if (!s->ce_ready) return kv_kernel_copy(slot, src, dst, sizes, n, kv_sm_budget_now(), stream, st);
    pthread_mutex_lock(&s->enqueue);
    CUresult rc = kv_k.event_record(s->start, stream);
    if (rc == CUDA_SUCCESS) rc = kv_k.stream_wait_event(s->prio, s->start, 0);
    int r = rc == CUDA_SUCCESS ? kv_kernel_copy(slot, src, dst, sizes, n, kv_sm_budget_now(), s->prio, st)
                               : kv_enqueue_fail(st, rc, "joining the priority stream");
    if (r == 0) {
        rc = kv_k.event_record(s->prio_done, s->prio);
        if (rc == CUDA_SUCCESS) rc = kv_k.stream_wait_event(stream, s->prio_done, 0);
        if (rc != CUDA_SUCCESS) r = kv_enqueue_fail(st, rc, "joining the caller's stream");
    }
    pthread_mutex_unlock(&s->enqueue);
    return r;
}

/* The batch split into `streams` contiguous parts, each on one of the slot's copy-engine
 * streams, all ordered after the caller's earlier work and before its later work. */
static int kv_batch_fanout(int slot, void *const *src, void *const *dst, const size_t *sizes, size_t n, int streams,
                           CUstream stream, kvswap_status *st) {
    kv_ctx_slot *s = &kv_k.ctx[slot];
    unsigned flags = kv_ce_flags_now();
    if ((size_t)streams > n) streams = (int)n;
    pthread_mutex_lock(&s->enqueue);
    CUresult rc = kv_k.event_record(s->start, stream);
    int r = rc == CUDA_SUCCESS ? 0 : kv_enqueue_fail(st, rc, "cuEventRecord on the caller's stream");
    size_t first = 0;
    for (int j = 0; r == 0 && j < streams; j++) {
        size_t count = n / (size_t)streams + ((size_t)j < n % (size_t)streams ? 1 : 0);
        rc = kv_k.stream_wait_event(s->ce[j], s->start, 0);
        r = rc == CUDA_SUCCESS ? kv_drv_batch_chunked(src, dst, sizes, first, count, kv_ce_chunk_now(), flags,
                                                                      s->ce[j], st)
                               : kv_enqueue_fail(st, rc, "cuStreamWaitEvent");
        /* Join every stream that was started, even after a failure, so none runs unordered. */
        CUresult jr = kv_k.event_record(s->ce_done[j], s->ce[j]);
        if (jr == CUDA_SUCCESS) jr = kv_k.stream_wait_event(stream, s->ce_done[j], 0);
        if (r == 0 && jr != CUDA_SUCCESS) r = kv_enqueue_fail(st, jr, "joining the caller's stream");
        first += count;
    }
    pthread_mutex_unlock(&s->enqueue);
    return r;
}

/* The kernel path is usable for this call when: entry points resolved, compiled, loaded in the
 * current context, the direction known (all blocks of a call share it), and at most 2^31-1 blocks.
 * Returns the slot, or -1 with *why set to the reason's code (0: simply not applicable). */
static int kv_kernel_ready(int slot, void *const *src, void *const *dst, size_t n, int *direction, int *why) {
    *why = 0;
    if (slot < 0 || !kv_k.resolved || n > 0x7fffffffu) return -1;
    /* Double-checked: the acquire load pairs with the release store below, so a thread that sees
     * 1 without taking the lock sees the slot's kernel state complete. */
    if (!atomic_load_explicit(&kv_k.ctx[slot].kernel_made, memory_order_acquire)) {
        /* Compiled once per process, loaded once per context: only when a call may take the kernel. */
        pthread_once(&kv_k.compile_once, kv_kernel_compile);
        pthread_mutex_lock(&kv_k.mu);
        if (!atomic_load_explicit(&kv_k.ctx[slot].kernel_made, memory_order_relaxed)) {
            kv_slot_make_kernel(&kv_k.ctx[slot]);
            atomic_store_explicit(&kv_k.ctx[slot].kernel_made, 1, memory_order_release);
        }
        pthread_mutex_unlock(&kv_k.mu);
    }
    if (kv_k.ctx[slot].code) {
        *why = kv_k.ctx[slot].code;
        return -1;
    }
    if (*direction == KVSWAP_DIR_UNKNOWN) *direction = kv_direction_of(src, dst, kv_k.ctx[slot].host_mapped);
    if (*direction == KVSWAP_DIR_UNKNOWN) return -1;
    if (*direction != KVSWAP_DIR_D2D && !kv_k.ctx[slot].host_mapped) return -1;
    return slot;
}

/* ------------------------------------------------------------------ the per-call route (kernel_path.h) */

int kv_policy_route(void *const *src, void *const *dst, const size_t *sizes, size_t n, void *stream, int direction,
                    kvswap_path *path, kvswap_status *st, int *use_batch, int *rc) {
    CUstream s = (CUstream)stream;
    int policy = kv_policy_now();
    if (policy == KVSWAP_POLICY_LOOP) *use_batch = 0;
    if (policy == KVSWAP_POLICY_LOOP || policy == KVSWAP_POLICY_BATCH) return 0;
    pthread_once(&kv_k.resolve_once, kv_kernel_resolve);
    int slot = kv_context_slot();
    /* Every block of a call shares block 0's direction; a pinned host pointer is assumed mapped
     * here (the kernel checks that itself before it takes one). */
    if (slot >= 0 && direction == KVSWAP_DIR_UNKNOWN) direction = kv_direction_of(src, dst, 1);
    int beside_kernel = policy == KVSWAP_POLICY_BESIDE_COMPUTE &&
                        (direction == KVSWAP_DIR_D2D || kv_beside_host_now() == KVSWAP_PATH_KERNEL);
    int wants_kernel = policy == KVSWAP_POLICY_KERNEL || policy == KVSWAP_POLICY_FASTEST || beside_kernel;
    int why = 0;
    int ready = wants_kernel ? kv_kernel_ready(slot, src, dst, n, &direction, &why) : -1;
    unsigned long long total = 0;
    for (size_t i = 0; i < n; i++) total += sizes[i];
    unsigned long long mean = total / n;
    int choice = KVSWAP_PATH_BATCH;
    if (policy == KVSWAP_POLICY_KERNEL) choice = KVSWAP_PATH_KERNEL;
    else if (policy == KVSWAP_POLICY_FASTEST && ready >= 0) choice = kv_cal_pick(direction, mean, n);
    else if (beside_kernel) choice = KVSWAP_PATH_KERNEL;
    if (choice == KVSWAP_PATH_FALLBACK) *use_batch = 0;
    if (ready >= 0 && choice == KVSWAP_PATH_KERNEL) {
        kv_set_path(path, KVSWAP_PATH_KERNEL);
        *rc = policy == KVSWAP_POLICY_BESIDE_COMPUTE ? kv_kernel_copy_budgeted(ready, src, dst, sizes, n, s, st)
                                                     : kv_kernel_copy(ready, src, dst, sizes, n, 0, s, st);
        return -1;
    }
    /* Forced kernel that cannot load (e.g. 222, PTX newer than the driver): say so, do not hide it. */
    if (policy == KVSWAP_POLICY_KERNEL && why) {
        kv_set_path(path, KVSWAP_PATH_KERNEL);
        *rc = kv_fail(st, why, -1, why > 0 ? kv_drv_error_name((CUresult)why) : NULL, "copy kernel unavailable: %s",
                      kvswap_kernel_info());
        return -1;
    }
    /* Copy engines: calls of kv_ce_chunk_now() descriptors, fanned out over the calibrated number of
     * streams where that is more than one (never for the legacy stream, which keeps the
     * per-block path: vLLM issue 46345). */
    if (!*use_batch || !kv_drv.batch || kv_is_legacy_stream(stream)) return 0;
    int streams = kv_streams_for(direction, mean, n);
    kv_set_path(path, KVSWAP_PATH_BATCH);
    if (streams > 1 && slot >= 0 && kv_k.ctx[slot].ce_ready)
        *rc = kv_batch_fanout(slot, src, dst, sizes, n, streams, s, st);
    else
        *rc = kv_drv_batch_chunked(src, dst, sizes, 0, n, kv_ce_chunk_now(), kv_ce_flags_now(), s, st);
    return -1;
}
