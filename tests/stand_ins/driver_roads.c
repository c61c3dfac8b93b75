/* How programs reach libcuda, for the emulated driver's tests (tests/integration/test_driver_roads.py).
 * Not a stand-in itself: it loads whatever driver it is given and reports cuDriverGetVersion.
 *
 *   driver_roads EXPECTED NAME...   dlopen()s each NAME in turn until one loads, as numba-cuda's
 *                                   loader does ("libcuda.so" before "libcuda.so.1"); a NAME
 *                                   with a '/' is a full path
 *   built with -DLINKED            calls the cuDriverGetVersion it was linked with (DT_NEEDED
 *                                   libcuda.so.1, found through DT_RPATH or DT_RUNPATH)
 *
 * It prints "version=N" on stderr and exits 0 when N is EXPECTED, 1 when it is not, 2 when no
 * driver loads. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef LINKED
int cuDriverGetVersion(int *version);
#endif

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int v = 0;
#ifdef LINKED
    cuDriverGetVersion(&v);
#else
    void *h = NULL;
    for (int i = 2; i < argc && !h; i++) h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "no driver: %s\n", dlerror());
        return 2;
    }
    int (*get)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    if (!get) return 2;
    get(&v);
#endif
    fprintf(stderr, "version=%d\n", v);
    return v == atoi(argv[1]) ? 0 : 1;
}
