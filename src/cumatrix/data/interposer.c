/* An emulated CUDA driver: a libcuda.so.1 that forwards to the real driver but looks older.
 *
 * cumatrix compiles this file once per emulated version and real driver, with
 * -DCUMATRIX_TABLES='"tables.h"' naming a generated header that defines:
 *
 *   EMULATED_VERSION          the version cuDriverGetVersion answers (12040 for 12.4)
 *   REAL_PATH                 the real libcuda.so.1, as a string literal
 *   HAS_GET_PROC_ADDRESS      1 when the real driver exports cuGetProcAddress
 *   HAS_GET_PROC_ADDRESS_V2   1 when it exports cuGetProcAddress_v2
 *   N_FORWARDED               the number of forwarded exports
 *   FORWARDED(X)              X(name, index) for each export forwarded unchanged
 *   HIDDEN(X)                 X("base") for each cuGetProcAddress name introduced after
 *                             EMULATED_VERSION
 *
 * Exports introduced after EMULATED_VERSION are simply not defined here, so a binary that
 * links one directly fails to load exactly as on an older driver (docs/facts.md section 4).
 * Without CUMATRIX_TABLES the file compiles as it stands (an emulated 12.0 forwarding
 * nothing), so it can be read and checked as C.  x86-64 only (the trampolines).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CUMATRIX_TABLES
#include CUMATRIX_TABLES
#else
#define EMULATED_VERSION 12000
#define REAL_PATH "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
#define HAS_GET_PROC_ADDRESS 1
#define HAS_GET_PROC_ADDRESS_V2 1
#define N_FORWARDED 0
#define FORWARDED(X)
#define HIDDEN(X)
#endif

#define NAME_STRING(name, index) #name,
#define BASE_STRING(base) base,

/* Filled by the constructor; the trampolines jump through it. */
__attribute__((visibility("hidden"))) void *cumatrix_real[N_FORWARDED + 1];
static const char *const forwarded_names[N_FORWARDED + 1] = {FORWARDED(NAME_STRING) 0};
/* Base names (as given to cuGetProcAddress) introduced after EMULATED_VERSION. */
static const char *const hidden_bases[] = {HIDDEN(BASE_STRING) 0};

static void *real_handle;
static int (*real_gpa)(const char *, void **, int, unsigned long long);
static int (*real_gpa_v2)(const char *, void **, int, unsigned long long, int *);

__attribute__((visibility("hidden"))) void cumatrix_unresolved(void) {
    fprintf(stderr, "cumatrix emulated driver: an entry point of %s did not resolve\n", REAL_PATH);
    abort();
}

__attribute__((constructor)) static void cumatrix_load(void) {
    if (real_handle) return;
    /* By absolute path, RTLD_LOCAL: the interposer must never find itself. */
    real_handle = dlopen(REAL_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!real_handle) {
        fprintf(stderr, "cumatrix emulated driver: cannot load the real driver: %s\n", dlerror());
    }
    for (int i = 0; i < N_FORWARDED; i++) {
        void *p = real_handle ? dlsym(real_handle, forwarded_names[i]) : 0;
        cumatrix_real[i] = p ? p : (void *)cumatrix_unresolved;
    }
    if (real_handle) {
        real_gpa = (int (*)(const char *, void **, int, unsigned long long))dlsym(real_handle, "cuGetProcAddress");
        real_gpa_v2 = (int (*)(const char *, void **, int, unsigned long long, int *))dlsym(real_handle,
                                                                                              "cuGetProcAddress_v2");
    }
}

static int is_hidden(const char *symbol) {
    for (int i = 0; hidden_bases[i]; i++)
        if (strcmp(symbol, hidden_bases[i]) == 0) return 1;
    return 0;
}

int cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return 1; /* CUDA_ERROR_INVALID_VALUE */
    *driverVersion = EMULATED_VERSION;
    return 0;
}

#if HAS_GET_PROC_ADDRESS_V2
int cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
                        int *symbolStatus);
#endif
#if HAS_GET_PROC_ADDRESS
int cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags);
#endif

/* Entry points handed out through cuGetProcAddress must be this interposer's own where it
 * answers differently from the real driver, or a caller of the returned pointer (libcudart
 * resolves everything that way) would see the real version. */
static int own_entry(const char *symbol, int version, void **pfn) {
    if (strcmp(symbol, "cuDriverGetVersion") == 0) {
        *pfn = (void *)cuDriverGetVersion;
        return 1;
    }
    if (strcmp(symbol, "cuGetProcAddress") == 0) {
#if HAS_GET_PROC_ADDRESS_V2
        if (version >= 12000) {
            *pfn = (void *)cuGetProcAddress_v2;
            return 1;
        }
#endif
#if HAS_GET_PROC_ADDRESS
        *pfn = (void *)cuGetProcAddress;
        return 1;
#endif
    }
    (void)version;
    return 0;
}

#if HAS_GET_PROC_ADDRESS_V2
int cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags,
                        int *symbolStatus) {
    if (!real_handle) cumatrix_load();
    if (cudaVersion > EMULATED_VERSION) cudaVersion = EMULATED_VERSION;
    if (!symbol || !pfn) return real_gpa_v2 ? real_gpa_v2(symbol, pfn, cudaVersion, flags, symbolStatus) : 1;
    /* As the real driver answers below a symbol's introduction (docs/facts.md section 3):
     * CUDA_SUCCESS, NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT. */
    if (is_hidden(symbol)) {
        *pfn = 0;
        if (symbolStatus) *symbolStatus = 2;
        return 0;
    }
    if (own_entry(symbol, cudaVersion, pfn)) {
        if (symbolStatus) *symbolStatus = 0;
        return 0;
    }
    if (!real_gpa_v2) cumatrix_unresolved();
    return real_gpa_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
}
#endif

#if HAS_GET_PROC_ADDRESS
int cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags) {
    if (!real_handle) cumatrix_load();
    if (cudaVersion > EMULATED_VERSION) cudaVersion = EMULATED_VERSION;
    if (!symbol || !pfn) return real_gpa ? real_gpa(symbol, pfn, cudaVersion, flags) : 1;
    /* No status to report here: the real driver, asked at the capped version, answers for
     * hidden symbols as it does below their introduction. */
    if (own_entry(symbol, cudaVersion, pfn)) return 0;
    if (!real_gpa) cumatrix_unresolved();
    return real_gpa(symbol, pfn, cudaVersion, flags);
}
#endif

/* One trampoline per forwarded export: jump through the table, arguments untouched. */
#define TRAMPOLINE(name, index)                                                                  \
    ".globl " #name "\n.type " #name ", @function\n.p2align 4\n" #name ":\n"                       \
    "    jmp *cumatrix_real+8*" #index "(%rip)\n.size " #name ", .-" #name "\n"
__asm__(".text\n" FORWARDED(TRAMPOLINE));
