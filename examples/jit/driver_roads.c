/* How programs reach libcuda: it loads whatever driver the loader gives it and reports
 * cuDriverGetVersion.  Used by the emulated driver's tests (tests/integration/test_driver_roads.py,
 * over a stand-in driver) and by the GPU stage (scripts/gpu/driver_roads.sh, over the real one).
 *
 *   driver_roads EXPECTED NAME...   dlopen()s each NAME in turn until one loads, as numba-cuda's
 *                                   loader does ("libcuda.so" before "libcuda.so.1"); a NAME
 *                                   with a '/' is a full path
 *   built with -DLINKED            calls the cuDriverGetVersion it was linked with (DT_NEEDED
 *                                   libcuda.so.1, found through DT_RPATH or DT_RUNPATH)
 *
 * EXPECTED is a version (12080), or "cell": the version the cell's driver stands for, read from
 * the cell id cumatrix gives it ($CUMATRIX_CELL: emulated-12.4 is 12040; host is any).
 * It prints "version=N" on stderr and exits 0 when N is the expected one, 1 when it is not, 2
 * when no driver loads. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LINKED
int cuDriverGetVersion(int *version);
#endif

/* The version EXPECTED names: 0 for any (the host's own driver). */
static int expected(const char *arg) {
    if (strcmp(arg, "cell") != 0) return atoi(arg);
    const char *cell = getenv("CUMATRIX_CELL"), *at = cell ? strstr(cell, "/emulated-") : NULL;
    int major = 0, minor = 0;
    if (!at || sscanf(at, "/emulated-%d.%d", &major, &minor) != 2) return 0;
    return major * 1000 + minor * 10;
}

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
    int want = expected(argv[1]);
    return v > 0 && (want == 0 || v == want) ? 0 : 1;
}
