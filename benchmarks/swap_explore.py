"""What limits the swap paths on this GPU: kernel variants, descriptor passing, copy-engine call shapes.

An exploration, not the benchmark (``swap_bench.py`` measures the library's policies): it times
variants of the copy kernel and of the copy-engine calls side by side in one process, so that the
library's choices rest on measurements.  Every figure comes from this run:

- ``d2d``: 16 KiB x 32768 scattered blocks (as ``swap_bench.py``'s d2d row) through kernel
  variants (loads in flight, cache hints, threads per CTA, waves, a CTA or a warp per block),
  against one ``cuMemcpyDtoDAsync`` of the same bytes;
- ``host``: 4 KiB and 16 KiB x 1024 blocks, d2h and h2d, through the kernel with descriptors in
  device memory (uploaded beforehand) or in the kernel's parameters (``__grid_constant__``), and
  the library's ``kernel`` policy as the benchmark calls it;
- ``ce``: the copy engines at 4 KiB and 16 KiB x 1024 through the library: descriptors per call,
  streams, and one to four host threads issuing parts of the batch; each timed twice, as called
  (events around the call) and queued behind a spin kernel (so only the GPU's side is timed), with
  the host time of the call beside it; then again after a burst of compute (clocks raised).

GPU-side times put a spin kernel (``%globaltimer``) ahead of the start event, so the host's work
to issue the call is hidden; "as called" times include it.  Each variant's result is checked on
sampled blocks.  Writes ``--json`` and prints a table.

    python benchmarks/swap_explore.py [--json FILE] [--wheel-dir DIR] [--headers 13.0] [--reps 10]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

KIB = 1024
u64 = ctypes.c_uint64

_SPIN = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
extern "C" __global__ void fill(unsigned *p, unsigned long long words, unsigned seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < words;
         i += (unsigned long long)gridDim.x * blockDim.x)
        p[i] = (unsigned)(i * 2654435761u) ^ seed;
}
"""

# A warp per work item, as the library's kernel (reference/kvswap_kernel.cu.h), with knobs:
# UNROLL loads in flight per lane, LOAD/STORE as plain or cache-hinted, slice bytes per item,
# descriptors from device memory (srcs/dsts) or from the kernel's parameters (PARAMS).
_WARP_KERNEL = r"""
typedef unsigned long long u64;
#define UNROLL @UNROLL@
#define SLICE @SLICE@ull
#define PMAX @PMAX@
struct Params { u64 n; u64 size; u64 addr[2 * PMAX]; };
__device__ __forceinline__ uint4 ld(const uint4 *p) { return @LOAD@; }
__device__ __forceinline__ void st(uint4 *p, uint4 v) { @STORE@; }
__device__ __forceinline__ void copy_item(const char *src, char *dst, u64 lo, u64 hi, unsigned lane) {
    const uint4 *s = (const uint4 *)(src + lo);
    uint4 *d = (uint4 *)(dst + lo);
    const u64 words = (hi - lo) >> 4;
    u64 i = lane;
    for (; i + (UNROLL - 1) * 32u < words; i += UNROLL * 32u) {
        uint4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) v[k] = ld(s + i + k * 32u);
#pragma unroll
        for (int k = 0; k < UNROLL; k++) st(d + i + k * 32u, v[k]);
    }
    for (; i < words; i += 32u) st(d + i, ld(s + i));
}
extern "C" __global__ void __launch_bounds__(1024)
warp_copy(const u64 *__restrict__ srcs, const u64 *__restrict__ dsts, u64 size, u64 n) {
    const unsigned lane = threadIdx.x & 31u;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 nwarps = ((u64)gridDim.x * blockDim.x) >> 5;
    const u64 slices = (size + SLICE - 1) / SLICE;
    const u64 items = n * slices;
    for (u64 it = warp; it < items; it += nwarps) {
        const u64 b = it / slices, sl = it - b * slices;
        const u64 lo = sl * SLICE, hi = lo + SLICE < size ? lo + SLICE : size;
        copy_item((const char *)srcs[b], (char *)dsts[b], lo, hi, lane);
    }
}
extern "C" __global__ void __launch_bounds__(1024)
warp_copy_params(const __grid_constant__ Params p) {
    const unsigned lane = threadIdx.x & 31u;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 nwarps = ((u64)gridDim.x * blockDim.x) >> 5;
    const u64 slices = (p.size + SLICE - 1) / SLICE;
    const u64 items = p.n * slices;
    for (u64 it = warp; it < items; it += nwarps) {
        const u64 b = it / slices, sl = it - b * slices;
        const u64 lo = sl * SLICE, hi = lo + SLICE < p.size ? lo + SLICE : p.size;
        copy_item((const char *)p.addr[b], (char *)p.addr[PMAX + b], lo, hi, lane);
    }
}
/* A CTA per block (grid-stride over blocks): every thread of the CTA moves UNROLL words a round. */
extern "C" __global__ void __launch_bounds__(1024)
cta_copy(const u64 *__restrict__ srcs, const u64 *__restrict__ dsts, u64 size, u64 n) {
    for (u64 b = blockIdx.x; b < n; b += gridDim.x) {
        const uint4 *s = (const uint4 *)srcs[b];
        uint4 *d = (uint4 *)dsts[b];
        const u64 words = size >> 4;
        u64 i = threadIdx.x;
        for (; i + (UNROLL - 1) * (u64)blockDim.x < words; i += UNROLL * (u64)blockDim.x) {
            uint4 v[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; k++) v[k] = ld(s + i + k * blockDim.x);
#pragma unroll
            for (int k = 0; k < UNROLL; k++) st(d + i + k * blockDim.x, v[k]);
        }
        for (; i < words; i += blockDim.x) st(d + i, ld(s + i));
    }
}
"""

LOADS = {"plain": "*p", "cs": "__ldcs(p)", "nc": "__ldg(p)", "lu": "__ldlu(p)"}
STORES = {"plain": "*p = v", "cs": "__stcs(p, v)", "wt": "__stwt(p, v)", "cg": "__stcg(p, v)"}
PMAX = 2040  # 16 + 16 * 2040 = 32656 bytes of parameters (the limit is 32764 on CUDA 12.1+)


class Params(ctypes.Structure):
    _fields_ = [("n", u64), ("size", u64), ("addr", u64 * (2 * PMAX))]


def kernel_source(unroll: int = 8, slice_bytes: int = 32 * KIB, load: str = "plain", store: str = "plain") -> str:
    return (_WARP_KERNEL.replace("@UNROLL@", str(unroll)).replace("@SLICE@", str(slice_bytes))
            .replace("@PMAX@", str(PMAX)).replace("@LOAD@", LOADS[load]).replace("@STORE@", STORES[store]))


class Lab:
    def __init__(self, reps: int) -> None:
        from cumatrix.child import cudaapi

        self.cu = cudaapi
        self.api = cudaapi.Driver()
        self.lib = self.api.lib
        self.lib.cuMemcpyDtoDAsync_v2.argtypes = [u64, u64, ctypes.c_size_t, ctypes.c_void_p]
        self.lib.cuMemsetD8Async.argtypes = [u64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
        self.lib.cuMemcpyHtoD_v2.argtypes = [u64, ctypes.c_void_p, ctypes.c_size_t]
        self.lib.cuMemcpy.argtypes = [u64, u64, ctypes.c_size_t]
        self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [ctypes.POINTER(ctypes.c_int),
                                                                         ctypes.c_void_p, ctypes.c_int,
                                                                         ctypes.c_size_t]
        self.reps = reps
        self.sms = self.api.attribute(16)
        self.arch = (self.api.attribute(75), self.api.attribute(76))
        self.stream = self.api.stream("dedicated")
        self.e0, self.e1 = self.api.event(), self.api.event()
        mod = self.compile(_SPIN)
        self.spin_fn = self.api.load_function(mod, "spin")
        self.fill_fn = self.api.load_function(mod, "fill")
        self._fns: dict[tuple[Any, ...], int] = {}

    def compile(self, source: str) -> bytes:
        return self.cu.nvrtc_compile(source, "explore", self.arch)

    def fn(self, name: str, **knobs: Any) -> int:
        key = (name, *sorted(knobs.items()))
        if key not in self._fns:
            self._fns[key] = self.api.load_function(self.compile(kernel_source(**knobs)), name)
        return self._fns[key]

    def ctas_per_sm(self, fn: int, threads: int) -> int:
        n = ctypes.c_int(0)
        self.api.check(self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), fn, threads, 0),
                       "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return max(1, n.value)

    def spin(self, us: float) -> None:
        self.api.launch(self.spin_fn, 1, 32, self.stream, [u64(int(us * 1000))])

    def fill(self, ptr: int, nbytes: int, seed: int) -> None:
        self.api.launch(self.fill_fn, self.sms * 8, 256, self.stream, [u64(ptr), u64(nbytes // 4), ctypes.c_uint(seed)])

    def timed(self, call: Callable[[], None], spin_us: float = 0.0, reps: int | None = None,
              host: list[float] | None = None) -> float:
        """Median ms between events around ``call`` (behind a spin kernel when spin_us > 0)."""
        out = []
        for i in range((reps or self.reps) + 2):
            if spin_us:
                self.spin(spin_us)
            self.api.record(self.e0, self.stream)
            t0 = time.perf_counter()
            call()
            t1 = time.perf_counter()
            self.api.record(self.e1, self.stream)
            ms = self.api.elapsed_ms(self.e0, self.e1)
            if i >= 2:
                out.append(ms)
                if host is not None:
                    host.append((t1 - t0) * 1e3)
        return statistics.median(out)

    def launch(self, fn: int, grid: int, threads: int, args: list[Any]) -> None:
        self.api.launch(fn, grid, threads, self.stream, args)

    def check_blocks(self, srcs: list[int], dsts: list[int], size: int, samples: int = 6) -> bool:
        self.api.sync()
        rng = random.Random(7)
        for i in rng.sample(range(len(srcs)), min(samples, len(srcs))):
            if bytes(self.download(srcs[i], size)) != bytes(self.download(dsts[i], size)):
                return False
        return True

    def download(self, ptr: int, size: int) -> bytes:
        buf = ctypes.create_string_buffer(size)
        # cuMemcpy infers each side from unified addressing: device or pinned host memory alike.
        self.api.check(self.lib.cuMemcpy(ctypes.addressof(buf), ptr, size), "cuMemcpy")
        return buf.raw

    def clear(self, ptr: int, size: int) -> None:
        self.api.check(self.lib.cuMemsetD8Async(ptr, 0, size, self.stream), "cuMemsetD8Async")

    def layout(self, direction: str, block: int, blocks: int) -> tuple[int, int, list[int], list[int]]:
        total = block * blocks
        src = self.api.alloc_device(total) if direction in ("d2h", "d2d") else self.api.alloc_host(total)
        dst = self.api.alloc_device(total) if direction in ("h2d", "d2d") else self.api.alloc_host(total)
        self.fill(src, total, blocks)
        perm = list(range(blocks))
        random.Random(blocks).shuffle(perm)
        return src, dst, [src + i * block for i in range(blocks)], [dst + perm[i] * block for i in range(blocks)]

    def device_array(self, values: list[int]) -> int:
        arr = (u64 * len(values))(*values)
        ptr = self.api.alloc_device(8 * len(values))
        self.api.check(self.lib.cuMemcpyHtoD_v2(ptr, arr, 8 * len(values)), "cuMemcpyHtoD")
        return ptr

    def free(self) -> None:
        self.api.sync()
        self.api.close()
        self.api._dev_allocs.clear()
        self.api._host_allocs.clear()


def swap_args(srcs: list[int], dsts: list[int], block: int) -> tuple[Any, Any, Any, int]:
    """The (src, dst, sizes, n) arrays of one call of the library."""
    n = len(srcs)
    return (ctypes.c_void_p * n)(*srcs), (ctypes.c_void_p * n)(*dsts), (ctypes.c_size_t * n)(*([block] * n)), n


def swap_call(swap: Any, args: tuple[Any, Any, Any, int], stream: int | None) -> Callable[[], None]:
    """One call of the library on ``stream``; its failure raised."""
    def call() -> None:
        if swap(args, stream) != 0:
            raise swap.failure()
    return call


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / 1e9 / (ms / 1e3)


def smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "n/a"


# --------------------------------------------------------------------------- d2d kernel variants


def part_d2d(lab: Lab, swap: Any, rows: list[dict[str, Any]]) -> None:
    block, blocks = 16 * KIB, 32 * KIB
    total = block * blocks
    src, dst, srcs, dsts = lab.layout("d2d", block, blocks)
    d_src, d_dst = lab.device_array(srcs), lab.device_array(dsts)
    seq = [dst + i * block for i in range(blocks)]
    d_seq = lab.device_array(seq)
    ms = lab.timed(lambda: lab.api.check(lab.lib.cuMemcpyDtoDAsync_v2(dst, src, total, lab.stream), "DtoD"))
    limit = gbps(total, ms)
    rows.append({"part": "d2d", "variant": "cuMemcpyDtoDAsync 512 MiB contiguous", "gbps": limit, "ratio": 1.0})

    def variant(label: str, name: str, threads: int, waves: float, dsts_dev: int = d_dst,
                dst_list: list[int] = dsts, **knobs: Any) -> None:
        try:
            fn = lab.fn(name, **knobs)
            per_sm = lab.ctas_per_sm(fn, threads)
            grid = max(1, int(lab.sms * per_sm * waves))
            lab.clear(dst, total)
            call = lambda: lab.launch(fn, grid, threads, [u64(d_src), u64(dsts_dev), u64(block), u64(blocks)])  # noqa: E731
            ms = lab.timed(call, spin_us=300)
            ok = lab.check_blocks(srcs, dst_list, block)
            rows.append({"part": "d2d", "variant": label, "threads": threads, "grid": grid, "ctas_per_sm": per_sm,
                         "gbps": gbps(total, ms), "ratio": gbps(total, ms) / limit, "correct": ok, **knobs})
        except lab.cu.CudaFailure as e:
            rows.append({"part": "d2d", "variant": label, "error": e.detail})
        print(f"  d2d {label:58s} {rows[-1].get('gbps', 0):8.1f} GB/s {rows[-1].get('ratio', 0):.3f}", flush=True)

    swap.set_policy("kernel")
    lib_call = swap_call(swap, swap_args(srcs, dsts, block), lab.stream)
    lab.clear(dst, total)
    ms = lab.timed(lib_call, spin_us=300)
    rows.append({"part": "d2d", "variant": "the library, kernel policy", "gbps": gbps(total, ms),
                 "ratio": gbps(total, ms) / limit, "correct": lab.check_blocks(srcs, dsts, block)})
    print(f"  d2d {'the library, kernel policy':58s} {rows[-1]['gbps']:8.1f} GB/s {rows[-1]['ratio']:.3f}", flush=True)
    variant("replica: warp/item, unroll 8, 256 thr, 1 wave", "warp_copy", 256, 1)
    variant("same, destination slots in order", "warp_copy", 256, 1, dsts_dev=d_seq, dst_list=seq)
    for unroll in (4, 16):
        variant(f"unroll {unroll}", "warp_copy", 256, 1, unroll=unroll)
    for threads in (128, 512, 1024):
        variant(f"{threads} threads", "warp_copy", threads, 1)
    for waves in (2, 8):
        variant(f"{waves} waves", "warp_copy", 256, waves)
    for load, store in (("cs", "cs"), ("nc", "plain"), ("lu", "cs"), ("plain", "cs"), ("nc", "cg")):
        variant(f"load {load} store {store}", "warp_copy", 256, 1, load=load, store=store)
    for sl in (4 * KIB, 8 * KIB):
        variant(f"slices of {sl // KIB} KiB", "warp_copy", 256, 1, slice_bytes=sl)
    for threads in (256, 512, 1024):
        for unroll in (4, 8):
            variant(f"CTA per block, {threads} thr, unroll {unroll}", "cta_copy", threads, 1, unroll=unroll)
    variant("CTA per block, 256 thr, unroll 4, 4 waves", "cta_copy", 256, 4, unroll=4)
    lab.free()


# --------------------------------------------------------------------------- host transfers through the kernel


def part_host_kernel(lab: Lab, swap: Any, rows: list[dict[str, Any]], limits: dict[str, float]) -> None:
    for direction in ("d2h", "h2d"):
        for block in (4 * KIB, 16 * KIB):
            blocks = 1024
            total = block * blocks
            src, dst, srcs, dsts = lab.layout(direction, block, blocks)
            d_src, d_dst = lab.device_array(srcs), lab.device_array(dsts)
            lim = limits[direction]

            def row(label: str, ms: float, ok: bool, **extra: Any) -> None:
                rows.append({"part": "host-kernel", "direction": direction, "block_bytes": block, "variant": label,
                             "gbps": gbps(total, ms), "ratio": gbps(total, ms) / lim, "ms": ms, "correct": ok,
                             **extra})
                print(f"  {direction} {block // KIB:3d} KiB {label:52s} {gbps(total, ms):6.1f} GB/s "
                      f"{gbps(total, ms) / lim:.3f}", flush=True)

            # The library as the benchmark calls it (events around the call), and behind a spin.
            swap.set_policy("kernel")
            lib_call = swap_call(swap, swap_args(srcs, dsts, block), lab.stream)
            host: list[float] = []
            ms = lab.timed(lib_call, host=host)
            row("library kernel policy, as called", ms, lab.check_blocks(srcs, dsts, block),
                host_ms=statistics.median(host))
            row("library kernel policy, behind a spin", lab.timed(lib_call, spin_us=300), True)
            for slice_bytes in (32 * KIB, 4 * KIB, 1 * KIB):
                for threads, unroll in ((256, 8), (1024, 8), (256, 4)):
                    fn = lab.fn("warp_copy", slice_bytes=slice_bytes, unroll=unroll)
                    grid = lab.sms * lab.ctas_per_sm(fn, threads)
                    lab.clear(dst, total) if direction == "h2d" else None
                    ms = lab.timed(lambda: lab.launch(fn, grid, threads, [u64(d_src), u64(d_dst), u64(block),
                                                                          u64(blocks)]), spin_us=300)
                    row(f"device descriptors, slice {slice_bytes // KIB} KiB, {threads} thr, unroll {unroll}", ms,
                        lab.check_blocks(srcs, dsts, block) if direction == "h2d" else True)
            fn = lab.fn("warp_copy_params")
            grid = lab.sms * lab.ctas_per_sm(fn, 256)
            p = Params()
            p.n, p.size = blocks, block
            for i in range(blocks):
                p.addr[i], p.addr[PMAX + i] = srcs[i], dsts[i]
            if direction == "h2d":
                lab.clear(dst, total)
            try:
                host = []
                ms = lab.timed(lambda: lab.launch(fn, grid, 256, [p]), host=host)
                row("descriptors in parameters, as called", ms, lab.check_blocks(srcs, dsts, block),
                    host_ms=statistics.median(host))
                row("descriptors in parameters, behind a spin",
                    lab.timed(lambda: lab.launch(fn, grid, 256, [p]), spin_us=300), True)
            except lab.cu.CudaFailure as e:
                rows.append({"part": "host-kernel", "direction": direction, "block_bytes": block,
                             "variant": "descriptors in parameters", "error": e.detail})
                print("  params:", e.detail, flush=True)
            lab.free()


# --------------------------------------------------------------------------- copy engines


def part_ce(lab: Lab, swap: Any, rows: list[dict[str, Any]], limits: dict[str, float], state: str) -> None:
    streams_pool = [lab.api.stream("dedicated") for _ in range(4)]
    done = [lab.api.event() for _ in range(4)]
    fork = lab.api.event()
    for direction in ("d2h", "h2d"):
        for block in (4 * KIB, 16 * KIB):
            blocks = 1024
            total = block * blocks
            src, dst, srcs, dsts = lab.layout(direction, block, blocks)
            args = swap_args(srcs, dsts, block)
            src_arr, dst_arr, sizes, _ = args
            lim = limits[direction]

            def row(label: str, called: float, queued: float, host: list[float], **extra: Any) -> None:
                rows.append({"part": "ce", "state": state, "direction": direction, "block_bytes": block,
                             "variant": label, "gbps_called": gbps(total, called), "gbps_queued": gbps(total, queued),
                             "ratio_called": gbps(total, called) / lim, "ratio_queued": gbps(total, queued) / lim,
                             "host_ms": statistics.median(host) if host else None, **extra})
                print(f"  {state:4s} {direction} {block // KIB:3d} KiB {label:44s} called {gbps(total, called):5.1f}"
                      f" ({gbps(total, called) / lim:.2f})  queued {gbps(total, queued):5.1f} "
                      f"({gbps(total, queued) / lim:.2f})  host {statistics.median(host) if host else 0:.3f} ms",
                      flush=True)

            plain = swap_call(swap, args, lab.stream)

            def shape(policy: str, chunk: int, streams: int) -> None:
                swap.set_policy(policy)
                swap.set_chunk_limit(chunk)
                swap.set_copy_streams(streams)

            for chunk in (16, 32, 64, 128, 256, 1024):
                host: list[float] = []
                shape("batch", chunk, 1)
                row(f"batch, calls of {chunk}, 1 stream", lab.timed(plain, host=host), lab.timed(plain, spin_us=4000),
                    host, chunk=chunk, streams=1)
            for chunk in (32, 64, 128):
                for streams in (2, 4):
                    host = []
                    shape("copy-engine-only", chunk, streams)
                    row(f"copy-engine-only, calls of {chunk}, {streams} streams", lab.timed(plain, host=host),
                        lab.timed(plain, spin_us=4000), host, chunk=chunk, streams=streams)
            # Several host threads, each issuing its part (calls of 128) on its own stream.
            for nthreads in (2, 4):
                parts = [(i * blocks // nthreads, (i + 1) * blocks // nthreads) for i in range(nthreads)]

                def threaded() -> None:
                    lab.api.record(fork, lab.stream)
                    errors: list[str] = []

                    def work(j: int) -> None:
                        lab.lib.cuCtxSetCurrent(lab.api.ctx)  # a context is current per thread
                        lo, hi = parts[j]
                        n = hi - lo
                        a = ((ctypes.c_void_p * n).from_address(ctypes.addressof(src_arr) + 8 * lo),
                             (ctypes.c_void_p * n).from_address(ctypes.addressof(dst_arr) + 8 * lo),
                             (ctypes.c_size_t * n).from_address(ctypes.addressof(sizes) + 8 * lo), n)
                        lib_status = swap.lib.kvswap_swap_blocks(a[0], a[1], a[2], ctypes.c_size_t(n),
                                                                 ctypes.c_void_p(streams_pool[j]), None, None)
                        if lib_status != 0:
                            errors.append(f"thread {j}: {lib_status}")

                    for j in range(nthreads):
                        lab.api.wait(streams_pool[j], fork)
                    ts = [threading.Thread(target=work, args=(j,)) for j in range(nthreads)]
                    for t in ts:
                        t.start()
                    for t in ts:
                        t.join()
                    for j in range(nthreads):
                        lab.api.record(done[j], streams_pool[j])
                        lab.api.wait(lab.stream, done[j])
                    if errors:
                        raise RuntimeError("; ".join(errors))

                shape("batch", 128, 1)
                host = []
                try:
                    row(f"{nthreads} host threads, calls of 128, a stream each", lab.timed(threaded, host=host),
                        lab.timed(threaded, spin_us=4000), host, threads=nthreads)
                except RuntimeError as e:
                    rows.append({"part": "ce", "state": state, "direction": direction, "block_bytes": block,
                                 "variant": f"{nthreads} host threads", "error": str(e)})
                    print(f"  {state} {direction} {nthreads} threads: {e}", flush=True)
            swap.set_chunk_limit(0)
            swap.set_copy_streams(0)
            lab.free()


def warm(lab: Lab, seconds: float) -> str:
    """Keep every SM busy for about ``seconds`` (torch GEMMs where importable, else the spin kernel)."""
    t0 = time.perf_counter()
    try:
        import torch

        a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
        while time.perf_counter() - t0 < seconds:
            for _ in range(10):
                a @ a
            torch.cuda.synchronize()
        return "torch bf16 GEMM 8192^3"
    except ImportError:
        while time.perf_counter() - t0 < seconds:
            lab.spin(100000)
            lab.api.sync()
        return "spin kernel"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--wheel-dir", type=Path)
    ap.add_argument("--headers", default="13.0")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--parts", default="d2d,host,ce")
    args = ap.parse_args()
    from cumatrix.provision.build import build_variant
    from cumatrix.provision.runtimes import headers_for

    built = build_variant("proc-address", "driver", headers_for(args.headers, wheel_dir=args.wheel_dir))
    lab = Lab(args.reps)
    from cumatrix.child import cudaapi

    assert built.ok and built.library is not None, built.log
    swap = cudaapi.KvSwapLibrary(str(built.library))
    parts = set(args.parts.split(","))
    out: dict[str, Any] = {"device": lab.api.device_name(), "sms": lab.sms, "driver": lab.api.versions,
                           "rows": [], "clocks": {"start": smi()}}
    # The link: 1024 x 2 MiB through one batch call per direction.
    limits = {}
    for direction in ("d2h", "h2d"):
        block, blocks = 2048 * KIB, 1024
        src, dst, srcs, dsts = lab.layout(direction, block, blocks)
        swap.set_policy("batch")
        limits[direction] = gbps(block * blocks, lab.timed(swap_call(swap, swap_args(srcs, dsts, block), lab.stream),
                                                           reps=5))
        lab.free()
    out["limits_gbps"] = limits
    print("limits", {k: round(v, 1) for k, v in limits.items()}, out["clocks"]["start"], flush=True)
    t0 = time.perf_counter()
    if "ce" in parts:
        part_ce(lab, swap, out["rows"], limits, "cold")
    if "d2d" in parts:
        part_d2d(lab, swap, out["rows"])
    if "host" in parts:
        part_host_kernel(lab, swap, out["rows"], limits)
    if "ce" in parts:
        out["warm_with"] = warm(lab, 3.0)
        out["clocks"]["after_warm"] = smi()
        part_ce(lab, swap, out["rows"], limits, "hot")
    out["clocks"]["end"] = smi()
    out["seconds"] = time.perf_counter() - t0
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print("clocks", out["clocks"], f"{out['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
