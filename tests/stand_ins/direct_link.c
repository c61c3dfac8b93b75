/* Links cuMemcpyBatchAsync directly, as the extension of vLLM PR 38460 did (fixed by PR 38919):
 * on a driver older than 12.8 it cannot even load. */
#include <stdio.h>
#include <stddef.h>

extern int cuMemcpyBatchAsync(unsigned long long *, unsigned long long *, size_t *, size_t, void *,
                              size_t *, size_t, size_t *, void *);

int main(void) {
    char src[8] = "batch", dst[8] = {0};
    unsigned long long d = (unsigned long long)dst, s = (unsigned long long)src;
    size_t size = sizeof src, fail = 0;
    int rc = cuMemcpyBatchAsync(&d, &s, &size, 1, 0, 0, 0, &fail, 0);
    printf("rc=%d copied=%s\n", rc, dst);
    return rc;
}
