"""ThreadSanitizer over the reference swap: several threads call it at once, through STAND-INs.

``kvswap.h`` promises that concurrent calls are safe.  Here proc-address, the stand-in
``libcuda.so.1`` (``standin_libcuda.c``) and the stand-in NVRTC (``standin_nvrtc.c``) are built
with ``-fsanitize=thread``, and a small gcc-built program (below) dlopen()s the variant and calls
the swap from several pthreads at once: the first calls race on every lazy initialisation (the
driver's entry points, the kernel path's compile and its per-context module, streams and staging
buffers), later ones on the per-context locks (the copy-engine fan-out, the budgeted kernel, the
staging buffers), and after the stand-in's context is replaced by a new one at the same address,
on the per-context state being made again.  driver-loop and runtime-dispatch (through the stand-in
runtime, ``tests/stand_ins/libcudart_stand_in.c``, whose batch stops working part-way) are driven
the same way.  ThreadSanitizer must report nothing, and every byte must arrive.  The stand-ins
prove nothing about CUDA; the test is about the reference's own threading.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cumatrix.provision.build import build_variant
from cumatrix.provision.runtimes import headers_for
from helpers.build import run_gcc

HERE = Path(__file__).parent
TSAN = ("-fsanitize=thread", "-g", "-O1")
THREADS = 8
ROUNDS = 3

# The driver program: argv[1] is the variant, argv[2] the stand-in CUDA library it loads.  For
# proc-address, phase 1 forces the kernel (blocks of one size go in the launch's parameters, ragged
# ones through the staging buffers); then the context is replaced and phase 2 runs beside-compute
# with 4 copy-engine streams (host transfers fanned out over the copy engines, device-to-device
# ones on the budgeted kernel).  Other variants (no kvswap_swap_blocks_dir) run one phase of
# kvswap_swap_blocks.  It prints one line of counts.
DRIVER_C = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { int code; long failed_index; const char *error_name; char message[256]; } status_t;
typedef int (*swap_dir_fn)(void *const *, void *const *, const size_t *, size_t, void *, int, int *, status_t *);
typedef int (*swap_fn)(void *const *, void *const *, const size_t *, size_t, void *, int *, status_t *);

static swap_dir_fn swap_dir;
static swap_fn swap;
static pthread_barrier_t barrier;
static int phase;

typedef struct { int id; int bad; int paths[4]; char why[300]; } job_t;

static void *worker(void *arg) {
    job_t *j = arg;
    size_t n = j->id % 2 ? 64 : 48;
    int direction = 1 + j->id % 3; /* d2h, h2d, d2d */
    for (int round = 0; round < ROUNDS; round++) {
        void *src[64], *dst[64];
        size_t sizes[64];
        for (size_t i = 0; i < n; i++) {
            sizes[i] = j->id % 2 ? 4096 : 1000 + 16 * i; /* odd threads: one size; even: ragged */
            src[i] = malloc(sizes[i]);
            dst[i] = calloc(1, sizes[i]);
            memset(src[i], (int)(1 + j->id * 31 + round * 7 + i) & 0xff, sizes[i]);
        }
        int path = -1;
        status_t st;
        pthread_barrier_wait(&barrier); /* every thread calls at once */
        int rc = swap_dir ? swap_dir(src, dst, sizes, n, (void *)0x1000, direction, &path, &st)
                          : swap(src, dst, sizes, n, (void *)0x1000, &path, &st);
        if (rc != 0 && !j->bad) {
            j->bad = 1;
            snprintf(j->why, sizeof j->why, "phase %d thread %d: rc %d: %s", phase, j->id, rc, st.message);
        }
        for (size_t i = 0; i < n; i++) {
            if (rc == 0 && memcmp(src[i], dst[i], sizes[i]) != 0 && !j->bad) {
                j->bad = 1;
                snprintf(j->why, sizeof j->why, "phase %d thread %d: block %zu differs", phase, j->id, i);
            }
            free(src[i]);
            free(dst[i]);
        }
        if (path >= 0 && path < 4) j->paths[path]++;
    }
    return NULL;
}

static int run_phase(int p, int counts[4]) {
    pthread_t t[THREADS];
    job_t jobs[THREADS];
    phase = p;
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < THREADS; i++) {
        jobs[i].id = i;
        if (pthread_create(&t[i], NULL, worker, &jobs[i])) return 1;
    }
    int bad = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        for (int k = 0; k < 4; k++) counts[k] += jobs[i].paths[k];
        if (jobs[i].bad) {
            fprintf(stderr, "%s\n", jobs[i].why);
            bad = 1;
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *cuda = dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib || !cuda) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
    pthread_barrier_init(&barrier, NULL, THREADS);
    swap = (swap_fn)dlsym(lib, "kvswap_swap_blocks");
    swap_dir = (swap_dir_fn)dlsym(lib, "kvswap_swap_blocks_dir");
    unsigned long (*count)(int) = (unsigned long (*)(int))dlsym(cuda, "standin_count");
    if (!swap || !count) return 4;
    if (!swap_dir) { /* a variant without the kernel path: one phase of kvswap_swap_blocks */
        int plain[4] = {0};
        int bad = run_phase(1, plain);
        printf("plain kernel=%d batch=%d fallback=%d memcpy=%lu batches=%lu\n", plain[3], plain[1], plain[2],
               count(0), count(1));
        return bad;
    }
    int (*set_policy)(int) = (int (*)(int))dlsym(lib, "kvswap_set_policy");
    int (*set_streams)(int) = (int (*)(int))dlsym(lib, "kvswap_set_copy_streams");
    void (*new_context)(void) = (void (*)(void))dlsym(cuda, "standin_new_context");
    if (!set_policy || !set_streams || !new_context) return 4;
    int first[4] = {0}, second[4] = {0};
    set_policy(2); /* kernel */
    int bad = run_phase(1, first);
    new_context(); /* the context destroyed, another made at the same address */
    set_policy(5); /* beside-compute */
    set_streams(4);
    bad |= run_phase(2, second);
    printf("phase1 kernel=%d batch=%d fallback=%d phase2 kernel=%d batch=%d fallback=%d launches=%lu streams=%lu\n",
           first[3], first[1], first[2], second[3], second[1], second[2], count(6), count(3));
    return bad;
}
"""


@pytest.fixture(scope="module")
def tsan_build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is required (apt-get install gcc)")
    out = tmp_path_factory.mktemp("tsan")
    probe = out / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    proc = subprocess.run(["gcc", "-fsanitize=thread", "-o", str(out / "probe"), str(probe)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"gcc cannot link ThreadSanitizer (apt-get install libtsan2): {proc.stderr}"
    drivers = out / "driver"
    drivers.mkdir()
    run_gcc(*TSAN, "-fPIC", "-shared", "-Wall", "-Werror", "-fvisibility=hidden", "-Wl,-soname,libcuda.so.1",
         "-o", str(drivers / "libcuda.so.1"), str(HERE / "standin_libcuda.c"), "-lpthread")
    run_gcc(*TSAN, "-fPIC", "-shared", "-Wall", "-Werror", "-fvisibility=hidden", "-Wl,-soname,libcudart.so.13",
         "-o", str(drivers / "libcudart.so.13"), str(HERE.parent / "stand_ins" / "libcudart_stand_in.c"))
    run_gcc(*TSAN, "-fPIC", "-shared", "-Wall", "-Werror", "-fvisibility=hidden",
         "-o", str(out / "libnvrtc-standin.so"), str(HERE / "standin_nvrtc.c"))
    program = out / "swap_threads.c"
    program.write_text(f"#define THREADS {THREADS}\n#define ROUNDS {ROUNDS}\n{DRIVER_C}")
    run_gcc(*TSAN, "-Wall", "-Werror", "-o", str(out / "swap_threads"), str(program), "-ldl", "-lpthread")
    return {"dir": out, "driver": drivers, "program": out / "swap_threads", "nvrtc": out / "libnvrtc-standin.so"}


def _run(tsan_build: dict[str, Path], library: Path, cuda: str, **env: str) -> str:
    """Run the driver program under ThreadSanitizer; assert it reported nothing; its counts line."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("KVSWAP_", "STANDIN_"))}
    full.update(LD_LIBRARY_PATH=str(tsan_build["driver"]), TSAN_OPTIONS="halt_on_error=1:exitcode=66", **env)
    proc = subprocess.run([str(tsan_build["program"]), str(library), cuda], capture_output=True, text=True,
                          env=full, timeout=300, check=False)
    assert "ThreadSanitizer" not in proc.stderr, proc.stderr[-6000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("headers", ["12.0", "13.0"])
def test_concurrent_swaps_are_race_free(tsan_build: dict[str, Path], headers: str,
                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    built = build_variant("proc-address", "driver", headers_for(headers), cache=tmp_path_factory.mktemp("builds"),
                          extra_cflags=TSAN)
    assert built.ok, built.log
    assert built.library is not None, built.log
    # The compile takes 50 ms, so that every thread reaches the kernel path's lazy initialisation
    # while it runs, even on a loaded machine with few cores.
    stdout = _run(tsan_build, built.library, "libcuda.so.1", STANDIN_KERNEL="1", KVSWAP_NVRTC=str(tsan_build["nvrtc"]),
                  STANDIN_NVRTC_DELAY_MS="50")
    counts = dict(kv.split("=") for kv in stdout.split() if "=" in kv)
    # Phase 1 forces the kernel: every call of every thread took it.  Phase 2 (beside-compute):
    # the device-to-device calls (threads 2 and 5, i.e. id % 3 == 2) took the budgeted kernel,
    # the host transfers the copy engines.
    calls = THREADS * ROUNDS
    d2d_calls = sum(1 for i in range(THREADS) if i % 3 == 2) * ROUNDS
    assert stdout.split()[:4] == ["phase1", f"kernel={calls}", "batch=0", "fallback=0"], stdout
    assert stdout.split()[4:8] == ["phase2", f"kernel={d2d_calls}", f"batch={calls - d2d_calls}", "fallback=0"], stdout
    assert int(counts["launches"]) == calls + d2d_calls
    # One set of internal streams (8 copy-engine + 1 priority) per context: made once for the
    # first, once again for its replacement, however many threads raced to make them.
    assert int(counts["streams"]) == 18


@pytest.mark.parametrize(("variant", "family", "cuda", "env", "want"), [
    # The driver family's per-block baseline: every call resolves the entry points at once.
    ("loop", "driver", "libcuda.so.1", {}, {"batch": 0}),
    # The runtime family: the first 4 batch calls succeed, then the runtime says the batch cannot
    # run here (801) and every later call, on any thread, copies block by block.
    ("runtime-dispatch", "runtime", "libcudart.so.13", {"STANDIN_BATCH_OK": "4"}, {"batch": 4, "batches": 4}),
])
def test_concurrent_swaps_other_families(tsan_build: dict[str, Path], tmp_path_factory: pytest.TempPathFactory,
                                         variant: str, family: str, cuda: str, env: dict[str, str],
                                         want: dict[str, int]) -> None:
    built = build_variant(variant, family, headers_for("13.0"), cache=tmp_path_factory.mktemp("builds"),
                          extra_cflags=TSAN)
    assert built.ok, built.log
    assert built.library is not None, built.log
    stdout = _run(tsan_build, built.library, cuda, **env)
    counts = {k: int(v) for k, v in (kv.split("=") for kv in stdout.split() if "=" in kv)}
    calls = THREADS * ROUNDS
    assert counts["kernel"] == 0, stdout
    assert counts["batch"] + counts["fallback"] == calls, stdout
    assert {k: counts[k] for k in want} == want, stdout
