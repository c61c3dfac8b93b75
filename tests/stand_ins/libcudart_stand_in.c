/* A STAND-IN for a CUDA 13 runtime (libcudart.so.13), for hosts without a GPU.  It is NOT CUDA:
 * every copy is a synchronous host memcpy.  It exists to drive the runtime-family variants' own
 * logic (ABI choice, chunking, the fall-back to per-block copies when the batch reports
 * cudaErrorNotSupported part-way); it proves nothing about CUDA's behaviour.
 *   gcc -shared -fPIC -Wl,-soname,libcudart.so.13 -o libcudart.so.13 libcudart_stand_in.c
 * Knob: STANDIN_BATCH_OK=N lets the first N batch calls succeed; later ones return 801
 * (cudaErrorNotSupported), as a runtime does when the driver cannot run the batch.
 * Thread-safe (atomic counters): the ThreadSanitizer test calls it from several threads at once. */
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
static _Atomic unsigned long n_memcpy, n_batch, n_tried;

EXPORT unsigned long standin_count(int which) { return which == 0 ? n_memcpy : n_batch; }
EXPORT int cudaRuntimeGetVersion(int *v) { *v = 13000; return 0; }
EXPORT int cudaDriverGetVersion(int *v) { *v = 13000; return 0; }
EXPORT const char *cudaGetErrorName(int rc) { return rc == 0 ? "cudaSuccess" : rc == 801 ? "cudaErrorNotSupported" : "cudaErrorUnknown"; }
EXPORT int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream) {
    (void)kind; (void)stream;
    n_memcpy++;
    memcpy(dst, src, n);
    return 0;
}
/* CUDA 13.x: 8 parameters, no failIdx. */
EXPORT int cudaMemcpyBatchAsync(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t count,
                                void *attrs, size_t *attrIdxs, size_t numAttrs, void *stream) {
    (void)attrs; (void)attrIdxs; (void)numAttrs; (void)stream;
    const char *ok = getenv("STANDIN_BATCH_OK");
    /* One atomic count of the calls, so that exactly N succeed however many threads call at once. */
    if (ok && n_tried++ >= strtoul(ok, NULL, 10)) return 801;
    n_batch++;
    for (size_t i = 0; i < count; i++) memcpy(dsts[i], srcs[i], sizes[i]);
    return 0;
}
