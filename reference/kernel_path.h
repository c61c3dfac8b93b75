/*
 * kernel_path.h - the copy-kernel path of the driver family, and the per-call path policy.
 *
 * Included by driver_family.h when KV_USE_KERNEL is 1 (proc-address).  Why a kernel: every
 * copy-engine copy costs microseconds of setup, so 4-16 KiB blocks move far below the link
 * (FACTS.md section 5: 16 KiB D2H batched at 29% of the link, D2D at ~4 GB/s); vLLM added a
 * Triton path for small CPU->GPU batches for the same reason.  One launch copies every block
 * of a call with 16-byte loads/stores, through the device mapping of pinned host memory.
 *
 * Everything is resolved at run time, as for the copies: NVRTC is dlopen()ed
 * (KVSWAP_NVRTC=<path>, else libnvrtc.so.13, .12, libnvrtc.so), driver entry points come from
 * cuGetProcAddress.  The source (kvswap_kernel.cu.h) is compiled once per process
 * (pthread_once) to machine code (CUBIN) for the device's own sm_XY, so the driver does no
 * JIT: a PTX image newer than the driver would fail to load with
 * CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222).  Only when NVRTC cannot emit a CUBIN for the
 * architecture (or KVSWAP_KERNEL_IMAGE=ptx asks for it) is PTX handed to the driver's JIT.
 * The module is loaded once per context.
 *
 * Descriptors (src/dst per block, sizes unless all equal) are packed on the host, copied with
 * one cuMemcpyHtoDAsync from pageable memory (pageable host data is copied to a staging buffer
 * before the call returns: CUDA driver API, "API synchronization behavior"; so the per-thread
 * packing buffer is reused at once) into a buffer taken from kvswap's own
 * stream-ordered memory pool (cuMemAllocFromPoolAsync) and freed with cuMemFreeAsync after
 * the launch.  Allocation, upload, launch and free are all ordered on the caller's stream, so
 * a following call (on any stream) can never overwrite descriptors a running kernel still
 * reads: the pool only reuses memory whose free has been ordered before the new use.
 */
#ifndef KV_KERNEL_PATH_H
#define KV_KERNEL_PATH_H

#include <stdlib.h>

#include "kvswap_kernel.cu.h"

typedef CUresult (*kv_cu_ctx_get_current_fn)(CUcontext *);
typedef CUresult (*kv_cu_ctx_get_device_fn)(CUdevice *);
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

/* NVRTC, declared here so no nvrtc.h is needed at build time (its ABI is stable since 7.0). */
typedef void *kv_nvrtc_prog;
typedef int (*kv_nvrtc_version_fn)(int *, int *);
typedef int (*kv_nvrtc_create_fn)(kv_nvrtc_prog *, const char *, const char *, int, const char *const *,
                                  const char *const *);
typedef int (*kv_nvrtc_compile_fn)(kv_nvrtc_prog, int, const char *const *);
typedef int (*kv_nvrtc_size_fn)(kv_nvrtc_prog, size_t *);
typedef int (*kv_nvrtc_get_fn)(kv_nvrtc_prog, char *);
typedef int (*kv_nvrtc_destroy_fn)(kv_nvrtc_prog *);

#define KV_KERNEL_MAX_CONTEXTS 16
#define KV_CAL_MAX 1024

static struct {
    int resolved; /* every driver entry point the kernel path needs was found */
    kv_cu_ctx_get_current_fn ctx_get_current;
    kv_cu_ctx_get_device_fn ctx_get_device;
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

    /* The compiled image (once per process, for the first calling context's device). */
    pthread_once_t compile_once;
    int compile_code;   /* 0, a CUresult, or KVSWAP_E_* */
    char *image;        /* CUBIN or NUL-terminated PTX */
    int image_is_cubin;
    char info[320];     /* kvswap_kernel_info() */

    pthread_mutex_t mu; /* guards ctx[] */
    struct {
        CUcontext ctx;
        int code; /* 0: fn/pool usable; else why not (CUresult or KVSWAP_E_*) */
        CUfunction fn;
        CUmemoryPool pool;
        int host_mapped; /* unified addressing: pinned host pointers are device pointers */
        int sms;
    } ctx[KV_KERNEL_MAX_CONTEXTS];
    int nctx;
} kv_k = {.compile_once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

/* ------------------------------------------------------------------ policy and calibration */

static _Atomic int kv_policy = -1; /* -1: not yet read from KVSWAP_POLICY */

typedef struct {
    int direction;
    unsigned long long block_bytes, blocks;
    int path; /* KVSWAP_PATH_* */
} kv_cal_row;

static struct {
    pthread_once_t once;
    kv_cal_row rows[KV_CAL_MAX];
    int n;
    char source[200];
} kv_cal = {.once = PTHREAD_ONCE_INIT};

/* Built-in choices when no calibration file is given, from H200 measurements (reports/bench/
 * swap-h200.json): the kernel where it beat the copy engines clearly, the batch copy elsewhere. */
static const kv_cal_row kv_cal_builtin[] = {
    /* d2h: kernel 43-52 GB/s vs batch 5-47 GB/s up to 256 KiB; at 2 MiB the copy engine
     * reaches the link (54.6 vs 51.5). */
    {KVSWAP_DIR_D2H, 4096, 1024, KVSWAP_PATH_KERNEL},   {KVSWAP_DIR_D2H, 16384, 1024, KVSWAP_PATH_KERNEL},
    {KVSWAP_DIR_D2H, 65536, 1024, KVSWAP_PATH_KERNEL},  {KVSWAP_DIR_D2H, 262144, 1024, KVSWAP_PATH_KERNEL},
    {KVSWAP_DIR_D2H, 2097152, 1024, KVSWAP_PATH_BATCH},
    /* h2d: the same up to 64 KiB; at 256 KiB the two tie (51.2 vs 50.8): keep the SMs free. */
    {KVSWAP_DIR_H2D, 4096, 1024, KVSWAP_PATH_KERNEL},   {KVSWAP_DIR_H2D, 16384, 1024, KVSWAP_PATH_KERNEL},
    {KVSWAP_DIR_H2D, 65536, 1024, KVSWAP_PATH_KERNEL},  {KVSWAP_DIR_H2D, 262144, 1024, KVSWAP_PATH_BATCH},
    {KVSWAP_DIR_H2D, 2097152, 1024, KVSWAP_PATH_BATCH},
    /* d2d: each copy-engine copy costs ~4 us whatever its size; the kernel wins 3x-200x everywhere. */
    {KVSWAP_DIR_D2D, 4096, 1024, KVSWAP_PATH_KERNEL},   {KVSWAP_DIR_D2D, 16384, 1024, KVSWAP_PATH_KERNEL},
    {KVSWAP_DIR_D2D, 262144, 1024, KVSWAP_PATH_KERNEL}, {KVSWAP_DIR_D2D, 2097152, 1024, KVSWAP_PATH_KERNEL},
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

/* KVSWAP_CALIBRATION names a text file, one row a line: `direction block_bytes blocks path`
 * (e.g. `d2h 16384 1024 kernel`); `#` starts a comment.  Unreadable lines are skipped. */
static void kv_cal_load(void) {
    const char *file = getenv("KVSWAP_CALIBRATION");
    if (file && *file) {
        FILE *f = fopen(file, "r");
        if (f) {
            char line[256];
            while (kv_cal.n < KV_CAL_MAX && fgets(line, sizeof line, f)) {
                char dir[16], path[16];
                unsigned long long bb, nb;
                if (line[0] == '#') continue;
                if (sscanf(line, "%15s %llu %llu %15s", dir, &bb, &nb, path) != 4) continue;
                int d = kv_parse_direction(dir), p = kv_parse_path(path);
                if (d == KVSWAP_DIR_UNKNOWN || p == KVSWAP_PATH_NONE || bb == 0 || nb == 0) continue;
                kv_cal.rows[kv_cal.n++] = (kv_cal_row){d, bb, nb, p};
            }
            fclose(f);
            snprintf(kv_cal.source, sizeof kv_cal.source, "%s", file);
        }
    }
    if (kv_cal.n == 0) {
        for (size_t i = 0; i < sizeof kv_cal_builtin / sizeof kv_cal_builtin[0]; i++)
            kv_cal.rows[kv_cal.n++] = kv_cal_builtin[i];
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

/* The calibrated choice for a call: the row of the same direction nearest in log2(block size),
 * then (a quarter as much) in log2(count). */
static int kv_cal_pick(int direction, unsigned long long block_bytes, unsigned long long blocks) {
    pthread_once(&kv_cal.once, kv_cal_load);
    long best = -1;
    int path = KVSWAP_PATH_BATCH;
    for (int i = 0; i < kv_cal.n; i++) {
        const kv_cal_row *r = &kv_cal.rows[i];
        if (r->direction != direction) continue;
        long db = labs(kv_log2_16(r->block_bytes) - kv_log2_16(block_bytes));
        long dn = labs(kv_log2_16(r->blocks) - kv_log2_16(blocks));
        long d = 4 * db + dn;
        if (best < 0 || d < best) {
            best = d;
            path = r->path;
        }
    }
    return path;
}

static int kv_policy_now(void) {
    int p = atomic_load(&kv_policy);
    if (p >= 0) return p;
    const char *env = getenv("KVSWAP_POLICY");
    p = KVSWAP_POLICY_FASTEST;
    if (env) {
        if (!strcmp(env, "copy-engine-only")) p = KVSWAP_POLICY_COPY_ENGINE_ONLY;
        else if (!strcmp(env, "kernel")) p = KVSWAP_POLICY_KERNEL;
        else if (!strcmp(env, "batch")) p = KVSWAP_POLICY_BATCH;
        else if (!strcmp(env, "loop")) p = KVSWAP_POLICY_LOOP;
    }
    int expected = -1;
    atomic_compare_exchange_strong(&kv_policy, &expected, p);
    return atomic_load(&kv_policy);
}

KVSWAP_API int kvswap_set_policy(int policy) {
    if (policy < KVSWAP_POLICY_FASTEST || policy > KVSWAP_POLICY_LOOP) return KVSWAP_E_INVALID_ARGUMENT;
    atomic_store(&kv_policy, policy);
    return 0;
}

KVSWAP_API int kvswap_get_policy(void) { return kv_policy_now(); }

KVSWAP_API int kvswap_calibrated_path(int direction, size_t block_bytes, size_t blocks) {
    if (direction < KVSWAP_DIR_D2H || direction > KVSWAP_DIR_D2D || !block_bytes || !blocks)
        return KVSWAP_E_INVALID_ARGUMENT;
    return kv_cal_pick(direction, block_bytes, blocks);
}

KVSWAP_API const char *kvswap_calibration_source(void) {
    pthread_once(&kv_cal.once, kv_cal_load);
    return kv_cal.source;
}

/* ------------------------------------------------------------------ resolution and compile */

static void kv_kernel_resolve(kv_cu_gpa_v2_fn gpa2, kv_cu_gpa_v1_fn gpa1) {
#define KV_K(field, type, name, version) kv_k.field = (type)kv_drv_lookup(gpa2, gpa1, name, version)
    KV_K(ctx_get_current, kv_cu_ctx_get_current_fn, "cuCtxGetCurrent", 4000);
    KV_K(ctx_get_device, kv_cu_ctx_get_device_fn, "cuCtxGetDevice", 2000);
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
#undef KV_K
    kv_k.resolved = kv_k.ctx_get_current && kv_k.ctx_get_device && kv_k.dev_attr && kv_k.module_load_data &&
                    kv_k.module_get_function && kv_k.launch && kv_k.htod_async && kv_k.pool_create &&
                    kv_k.pool_set_attr && kv_k.alloc_async && kv_k.free_async && kv_k.ptr_attr;
    if (!kv_k.resolved)
        snprintf(kv_k.info, sizeof kv_k.info, "unavailable: the driver lacks an entry point the kernel path needs "
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
        snprintf(kv_k.info, sizeof kv_k.info, "unavailable: no current context to read the architecture from");
        return;
    }
    char lib[160];
    void *h = kv_nvrtc_open(lib, sizeof lib);
    if (!h) {
        kv_k.compile_code = KVSWAP_E_NO_LIBRARY;
        snprintf(kv_k.info, sizeof kv_k.info, "unavailable: no NVRTC (set KVSWAP_NVRTC or put libnvrtc.so.13/.12 "
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
        snprintf(kv_k.info, sizeof kv_k.info, "unavailable: %s lacks an NVRTC entry point", lib);
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
    snprintf(kv_k.info, sizeof kv_k.info, "unavailable: NVRTC %d.%d (%s) could not build the kernel for sm_%d%d",
             vmaj, vmin, lib, major, minor);
    /* Machine code first (nvrtcGetCUBIN exists from NVRTC 11.1): no JIT, no PTX-version check. */
    /* KVSWAP_KERNEL_IMAGE=ptx skips the CUBIN: the driver JIT-compiles the PTX, which fails with
     * CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222) where the NVRTC is newer than the driver (matrix rows). */
    const char *image = getenv("KVSWAP_KERNEL_IMAGE");
    int want_cubin = !(image && !strcmp(image, "ptx"));
    for (int cubin = want_cubin && cubin_size && get_cubin ? 1 : 0; cubin >= 0; cubin--) {
        char arch[48];
        snprintf(arch, sizeof arch, "--gpu-architecture=%s_%d%d", cubin ? "sm" : "compute", major, minor);
        const char *opts[] = {arch, "-default-device", "--std=c++11"};
        kv_nvrtc_prog prog = NULL;
        if (create(&prog, kvswap_kernel_source, "kvswap_kernel.cu", 0, NULL, NULL) != 0) continue;
        int rc = compile(prog, 3, opts);
        size_t n = 0;
        if (rc == 0 && (cubin ? cubin_size(prog, &n) : ptx_size(prog, &n)) == 0 && n > 0) {
            kv_k.image = malloc(n + 1);
            if (kv_k.image && (cubin ? get_cubin(prog, kv_k.image) : get_ptx(prog, kv_k.image)) == 0) {
                kv_k.image[n] = '\0';
                kv_k.image_is_cubin = cubin;
                snprintf(kv_k.info, sizeof kv_k.info, "%s %s_%d%d via %s (NVRTC %d.%d)", cubin ? "cubin" : "ptx",
                         cubin ? "sm" : "compute", major, minor, lib, vmaj, vmin);
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
            snprintf(kv_k.info, sizeof kv_k.info, "unavailable: NVRTC %d.%d (%s) cannot compile for %s: %s", vmaj,
                     vmin, lib, arch, log);
        }
        destroy(&prog);
    }
    kv_k.compile_code = KVSWAP_E_NO_LIBRARY;
}

/* The slot of the current context: the module loaded, a pool made; NULL when none is current. */
static int kv_kernel_slot(CUcontext *out_ctx) {
    CUcontext ctx = NULL;
    if (kv_k.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx) return -1;
    *out_ctx = ctx;
    pthread_mutex_lock(&kv_k.mu);
    for (int i = 0; i < kv_k.nctx; i++)
        if (kv_k.ctx[i].ctx == ctx) {
            pthread_mutex_unlock(&kv_k.mu);
            return i;
        }
    if (kv_k.nctx == KV_KERNEL_MAX_CONTEXTS) {
        pthread_mutex_unlock(&kv_k.mu);
        return -1;
    }
    int i = kv_k.nctx;
    kv_k.ctx[i].ctx = ctx;
    kv_k.ctx[i].code = kv_k.compile_code;
    CUdevice dev;
    int pools = 0, uva = 0;
    if (!kv_k.ctx[i].code && (kv_k.ctx_get_device(&dev) != CUDA_SUCCESS ||
                              kv_k.dev_attr(&pools, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev) != CUDA_SUCCESS ||
                              !pools))
        kv_k.ctx[i].code = (int)CUDA_ERROR_NOT_SUPPORTED;
    if (!kv_k.ctx[i].code) {
        kv_k.dev_attr(&uva, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev);
        kv_k.dev_attr(&kv_k.ctx[i].sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
        kv_k.ctx[i].host_mapped = uva;
        /* Loading can fail where compiling did not: e.g. CUDA_ERROR_UNSUPPORTED_PTX_VERSION
         * (222) for PTX newer than the driver, CUDA_ERROR_NO_BINARY_FOR_GPU for a context on
         * a device of another architecture than the one compiled for. */
        CUmodule mod;
        CUresult rc = kv_k.module_load_data(&mod, kv_k.image);
        if (rc == CUDA_SUCCESS) rc = kv_k.module_get_function(&kv_k.ctx[i].fn, mod, KVSWAP_KERNEL_NAME);
        if (rc == CUDA_SUCCESS) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = dev;
            rc = kv_k.pool_create(&kv_k.ctx[i].pool, &props);
            /* Keep freed descriptor buffers in the pool rather than trimming at every sync. */
            cuuint64_t keep = UINT64_MAX;
            if (rc == CUDA_SUCCESS)
                rc = kv_k.pool_set_attr(kv_k.ctx[i].pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
        }
        if (rc != CUDA_SUCCESS) {
            kv_k.ctx[i].code = (int)rc;
            snprintf(kv_k.info, sizeof kv_k.info, "unavailable: loading the %s failed: %s",
                     kv_k.image_is_cubin ? "cubin" : "ptx", kv_drv_error_name(rc));
        }
    }
    kv_k.nctx++;
    pthread_mutex_unlock(&kv_k.mu);
    return i;
}

KVSWAP_API const char *kvswap_kernel_info(void) {
    if (!kv_k.info[0]) return "not yet tried (compiled at the first call that may take the kernel path)";
    return kv_k.info;
}

/* Direction of block 0 from the pointer attributes; UNKNOWN when either side is not CUDA
 * memory (pageable host memory) or a host pointer is not its own device address. */
static int kv_direction_of(void *const *src, void *const *dst, int host_mapped) {
    unsigned int ts = 0, td = 0;
    if (kv_k.ptr_attr(&ts, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)src[0]) != CUDA_SUCCESS ||
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

/* Launch the copy kernel for all n blocks on `stream`.  Returns 0, or a CUDA error. */
static int kv_kernel_copy(int slot, void *const *src, void *const *dst, const size_t *sizes, size_t n,
                          CUstream stream, kvswap_status *st) {
    int uniform = 1;
    size_t largest = sizes[0];
    for (size_t i = 1; i < n; i++) {
        if (sizes[i] != sizes[0]) uniform = 0;
        if (sizes[i] > largest) largest = sizes[i];
    }
    size_t words = uniform ? 2 * n : 3 * n;
    size_t bytes = words * sizeof(unsigned long long);
    /* One packing buffer per thread, grown as needed: a fresh malloc of a large table is an
     * mmap plus a page fault per 4 KiB on every call. */
    static __thread unsigned long long *host;
    static __thread size_t host_cap;
    if (bytes > host_cap) {
        unsigned long long *grown = realloc(host, bytes);
        if (!grown)
            return kv_fail(st, KVSWAP_E_INVALID_ARGUMENT, -1, NULL, "out of host memory for %zu descriptors", n);
        host = grown;
        host_cap = bytes;
    }
    memcpy(host, src, n * sizeof(void *));
    memcpy(host + n, dst, n * sizeof(void *));
    if (!uniform) memcpy(host + 2 * n, sizes, n * sizeof(size_t));
    CUdeviceptr desc = 0;
    CUresult rc = kv_k.alloc_async(&desc, bytes, kv_k.ctx[slot].pool, stream);
    if (rc == CUDA_SUCCESS) rc = kv_k.htod_async(desc, host, bytes, stream);
    /* `host` is pageable: the driver has captured it before cuMemcpyHtoDAsync returns, so the
     * next call on this thread may overwrite it. */
    if (rc == CUDA_SUCCESS) {
        CUdeviceptr d_src = desc, d_dst = desc + n * 8, d_sizes = uniform ? 0 : desc + 2 * n * 8;
        unsigned long long uniform_size = uniform ? (unsigned long long)sizes[0] : 0;
        /* Split blocks of more than 64 KiB over several CTAs, so a few large blocks still fill the SMs. */
        size_t split = (largest + 65535) / 65536;
        unsigned gy = split > 64 ? 64 : (unsigned)split;
        void *args[] = {&d_src, &d_dst, &d_sizes, &uniform_size};
        rc = kv_k.launch(kv_k.ctx[slot].fn, (unsigned)n, gy, 1, KVSWAP_KERNEL_THREADS, 1, 1, 0, stream, args, NULL);
    }
    if (desc) {
        CUresult frc = kv_k.free_async(desc, stream);
        if (rc == CUDA_SUCCESS) rc = frc;
    }
    if (rc != CUDA_SUCCESS)
        return kv_fail(st, (int)rc, -1, kv_drv_error_name(rc), "copy kernel launch failed: %s", kv_drv_error_name(rc));
    return 0;
}

/* The kernel path is usable for this call when: entry points resolved, compiled, loaded in the
 * current context, the direction known (all blocks of a call share it), and at most 2^31-1 blocks.
 * Returns the slot, or -1 with *why set to the reason's code (0: simply not applicable). */
static int kv_kernel_ready(void *const *src, void *const *dst, size_t n, int *direction, int *why) {
    *why = 0;
    if (!kv_k.resolved || n > 0x7fffffffu) return -1;
    pthread_once(&kv_k.compile_once, kv_kernel_compile);
    CUcontext ctx;
    int slot = kv_kernel_slot(&ctx);
    if (slot < 0) return -1;
    if (kv_k.ctx[slot].code) {
        *why = kv_k.ctx[slot].code;
        return -1;
    }
    if (*direction == KVSWAP_DIR_UNKNOWN) *direction = kv_direction_of(src, dst, kv_k.ctx[slot].host_mapped);
    if (*direction == KVSWAP_DIR_UNKNOWN) return -1;
    if (*direction != KVSWAP_DIR_D2D && !kv_k.ctx[slot].host_mapped) return -1;
    return slot;
}

#endif /* KV_KERNEL_PATH_H */
