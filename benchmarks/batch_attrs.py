#!/usr/bin/env python3
"""How the batch copy's attributes change its speed (driver API, one run).

For d2h and h2d at 16 KiB x 1024 scattered blocks: the per-block loop, then
cuMemcpyBatchAsync (9-parameter entry, asked at 12080) with the source access order
STREAM or ANY, with and without location hints, and with the prefer-overlap flag.
Prints GB/s (median of N after warm-ups, CUDA events) and writes JSON.

    python3 benchmarks/batch_attrs.py [--reps 30] [--json FILE]
"""

from __future__ import annotations

import argparse
import ctypes as C
import json
import random
import statistics
import sys

BLOCK, BLOCKS = 16384, 1024


class Loc(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class Attrs(C.Structure):  # CUmemcpyAttributes (CUDA 12.8+): 24 bytes
    _fields_ = [("srcAccessOrder", C.c_int), ("srcLocHint", Loc), ("dstLocHint", Loc), ("flags", C.c_uint)]


ORDER = {"stream": 1, "any": 3}
LOC_DEVICE, LOC_HOST = 1, 2


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise SystemExit(f"{what} failed: CUresult {rc}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--order", default="d2h,h2d", help="directions, in the order measured (default d2h,h2d)")
    ap.add_argument("--blocks-per-call", type=int, default=BLOCKS, help="descriptors per batch call")
    args = ap.parse_args()
    cu = C.CDLL("libcuda.so.1")
    check(cu.cuInit(0), "cuInit")
    dev, ctx = C.c_int(), C.c_void_p()
    check(cu.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    total = BLOCK * BLOCKS
    d = C.c_uint64()
    check(cu.cuMemAlloc_v2(C.byref(d), C.c_size_t(total)), "cuMemAlloc")
    h = C.c_void_p()
    check(cu.cuMemHostAlloc(C.byref(h), C.c_size_t(total), 0), "cuMemHostAlloc")
    stream = C.c_void_p()
    check(cu.cuStreamCreate(C.byref(stream), 1), "cuStreamCreate")  # non-blocking
    fn, status = C.c_void_p(), C.c_int()
    cu.cuGetProcAddress_v2.argtypes = [C.c_char_p, C.POINTER(C.c_void_p), C.c_int, C.c_uint64, C.POINTER(C.c_int)]
    check(cu.cuGetProcAddress_v2(b"cuMemcpyBatchAsync", C.byref(fn), 12080, 0, C.byref(status)), "cuGetProcAddress")
    if not fn.value:
        raise SystemExit("this driver has no cuMemcpyBatchAsync")
    batch = C.CFUNCTYPE(C.c_int, C.POINTER(C.c_uint64), C.POINTER(C.c_uint64), C.POINTER(C.c_size_t), C.c_size_t,
                        C.POINTER(Attrs), C.POINTER(C.c_size_t), C.c_size_t, C.POINTER(C.c_size_t), C.c_void_p)(fn.value)
    perm = list(range(BLOCKS))
    random.Random(7).shuffle(perm)
    hbase = h.value or 0
    e0, e1 = C.c_void_p(), C.c_void_p()
    cu.cuEventCreate(C.byref(e0), 0)
    cu.cuEventCreate(C.byref(e1), 0)
    cu.cuMemcpyHtoDAsync_v2.argtypes = [C.c_uint64, C.c_void_p, C.c_size_t, C.c_void_p]
    cu.cuMemcpyDtoHAsync_v2.argtypes = [C.c_void_p, C.c_uint64, C.c_size_t, C.c_void_p]
    rows = []
    for direction in args.order.split(","):
        devp = [d.value + i * BLOCK for i in range(BLOCKS)]
        hostp = [hbase + perm[i] * BLOCK for i in range(BLOCKS)]
        src, dst = (devp, hostp) if direction == "d2h" else (hostp, devp)
        S, D = (C.c_uint64 * BLOCKS)(*src), (C.c_uint64 * BLOCKS)(*dst)
        sizes = (C.c_size_t * BLOCKS)(*([BLOCK] * BLOCKS))
        src_type, dst_type = (LOC_DEVICE, LOC_HOST) if direction == "d2h" else (LOC_HOST, LOC_DEVICE)

        def loop() -> None:
            for i in range(BLOCKS):
                if direction == "d2h":
                    check(cu.cuMemcpyDtoHAsync_v2(C.c_void_p(dst[i]), src[i], BLOCK, stream), "cuMemcpyDtoHAsync")
                else:
                    check(cu.cuMemcpyHtoDAsync_v2(dst[i], C.c_void_p(src[i]), BLOCK, stream), "cuMemcpyHtoDAsync")

        def batched(order: str, hints: bool, flags: int):
            a = Attrs(ORDER[order], Loc(src_type if hints else 0, 0), Loc(dst_type if hints else 0, 0), flags)
            idx, fail = (C.c_size_t * 1)(0), C.c_size_t(0)

            per = args.blocks_per_call

            def run() -> None:
                for first in range(0, BLOCKS, per):
                    n = min(per, BLOCKS - first)
                    check(batch(C.cast(C.byref(S, first * 8), C.POINTER(C.c_uint64)),
                                C.cast(C.byref(D, first * 8), C.POINTER(C.c_uint64)),
                                C.cast(C.byref(sizes, first * C.sizeof(C.c_size_t)), C.POINTER(C.c_size_t)),
                                n, C.byref(a), idx, 1, C.byref(fail), stream), "cuMemcpyBatchAsync")
            return run

        configs = [("loop", loop)] + [
            (f"batch order={o} hints={'yes' if hi else 'no'} flags={fl}", batched(o, hi, fl))
            for o in ("stream", "any") for hi in (False, True) for fl in (0, 1)]
        for name, fn_ in configs:
            times = []
            for rep in range(args.reps + 3):
                cu.cuEventRecord(e0, stream)
                fn_()
                cu.cuEventRecord(e1, stream)
                check(cu.cuEventSynchronize(e1), "cuEventSynchronize")
                ms = C.c_float()
                cu.cuEventElapsedTime(C.byref(ms), e0, e1)
                if rep >= 3:
                    times.append(ms.value)
            med = statistics.median(times)
            gbps = total / (med / 1e3) / 1e9
            rows.append({"direction": direction, "config": name, "gbps": round(gbps, 2), "median_ms": round(med, 4),
                         "min_ms": round(min(times), 4), "max_ms": round(max(times), 4), "repetitions": len(times)})
            print(f"{direction}  {name:42s} {gbps:7.2f} GB/s", flush=True)
    v = C.c_int()
    cu.cuDriverGetVersion(C.byref(v))
    out = {"driver_version": v.value, "block_bytes": BLOCK, "blocks": BLOCKS, "order": args.order,
           "blocks_per_call": args.blocks_per_call, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
