/*
 * STAND-IN for libnvrtc, for tests on machines without CUDA.  It is NOT NVRTC: it compiles
 * nothing, and every "program" yields the same small image, which only standin_libcuda.c's
 * cuModuleLoadData accepts (its launches then copy on the host).  It exists so that the
 * reference's copy-kernel path (compile once per process, load once per context, launch) can
 * run without a GPU; it proves nothing about the kernel's device code.
 * Knob: STANDIN_NVRTC_DELAY_MS=N makes each compile take N ms (a real one takes far longer), so
 * that callers racing on the first use all arrive while it runs.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
static const char image[] = "STANDIN-IMAGE";

EXPORT int nvrtcVersion(int *major, int *minor) { *major = 12; *minor = 8; return 0; }
EXPORT int nvrtcCreateProgram(void **prog, const char *src, const char *name, int n, const char *const *h,
                              const char *const *i) {
    (void)src; (void)name; (void)n; (void)h; (void)i;
    *prog = malloc(1);
    return *prog ? 0 : 1;
}
EXPORT int nvrtcCompileProgram(void *prog, int n, const char *const *opts) {
    (void)prog; (void)n; (void)opts;
    const char *delay = getenv("STANDIN_NVRTC_DELAY_MS");
    long ms = delay ? strtol(delay, NULL, 10) : 0;
    if (ms > 0) {
        struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    return 0;
}
EXPORT int nvrtcGetCUBINSize(void *prog, size_t *n) { (void)prog; *n = sizeof image; return 0; }
EXPORT int nvrtcGetCUBIN(void *prog, char *out) { (void)prog; memcpy(out, image, sizeof image); return 0; }
EXPORT int nvrtcGetPTXSize(void *prog, size_t *n) { (void)prog; *n = sizeof image; return 0; }
EXPORT int nvrtcGetPTX(void *prog, char *out) { (void)prog; memcpy(out, image, sizeof image); return 0; }
EXPORT int nvrtcGetProgramLogSize(void *prog, size_t *n) { (void)prog; *n = 1; return 0; }
EXPORT int nvrtcGetProgramLog(void *prog, char *out) { (void)prog; out[0] = '\0'; return 0; }
EXPORT int nvrtcDestroyProgram(void **prog) { free(*prog); *prog = NULL; return 0; }
