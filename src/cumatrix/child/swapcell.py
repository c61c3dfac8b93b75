"""The swap cell, child side: run one reference variant on the GPU, check it, time it.

Runs inside the isolated child (stdlib + ctypes only; imports nothing heavy).  The
variant's own API family sets up the memory: a driver-family cell talks to
``libcuda.so.1`` alone (it loads no CUDA runtime, which is what lets it run under an
emulated driver); a runtime-family cell loads the given ``libcudart`` first and uses it.

``run(spec)`` returns the verdict the child hands over the private channel of :mod:`cumatrix.execute.protocol`.

spec keys: ``family`` ("driver" | "runtime"), ``variant``, ``library`` (the variant's
``.so``), ``baseline`` (the same family's loop ``.so``), ``libcudart`` (runtime family:
absolute path), ``direction`` ("d2h" | "h2d" | "d2d"), ``block_bytes``, ``blocks``,
``layers``, ``stream`` ("dedicated" | "legacy" | "per-thread"), ``repetitions`` (>= 20),
``warmup``, ``seed`` (optional: reproducible data instead of fresh random bytes), ``policy``
(optional: "fastest" | "copy-engine-only" | "kernel" | "batch" | "loop", set with
``kvswap_set_policy`` before the first copy; only libraries that export it accept one).

Verdict: ``{"outcome", "path", "error_name", "detail", "timings", "data"}``; a wrong
byte is ``harness-error`` with a detail naming how many blocks differ and the first one.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import statistics
import sys
import time
from typing import Any

from cumatrix.child.cudaapi import (
    KVSWAP_E_NO_LIBRARY,
    PATHS,
    POLICIES,
    CudaApi,
    CudaFailure,
    Driver,
    KvStatus,
    KvSwapLibrary,
    Runtime,
    spread,
)

_MIN_REPETITIONS = 20
#: The failure that ends a cell with a verdict (the CUDA wrappers' own exception).
CellFailure = CudaFailure
# Older private names, for code written against them.
_PATHS, _Api, _Driver, _Runtime, _Swap, _spread = PATHS, CudaApi, Driver, Runtime, KvSwapLibrary, spread
__all__ = ["KVSWAP_E_NO_LIBRARY", "POLICIES", "CellFailure", "KvStatus", "run"]


def _verdict(outcome: str, *, path: str = "n/a", error_name: str | None = None, detail: str = "",
             timings: dict[str, Any] | None = None, data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"outcome": outcome, "path": path, "error_name": error_name, "detail": detail,
            "timings": timings or {}, "data": data or {}}


# --------------------------------------------------------------------------- the cell

#: Set by ``cumatrix repro``: print the CUDA libraries really mapped right before the call.
MAPS_ENV = "CUMATRIX_PRINT_MAPS"
MAPS_BEGIN = "CUMATRIX-MAPS-BEGIN"
MAPS_END = "CUMATRIX-MAPS-END"
_MAPS_NAMES = ("libcudart", "libcuda.", "libkvswap")


def print_loaded_libraries() -> list[str]:
    """The libcudart/libcuda/libkvswap files this process has mapped, also printed to stderr.

    Printed in a labelled block before the variant runs, because a child that crashes in
    the call never prints its verdict.
    """
    seen: dict[str, str] = {}
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and any(n in os.path.basename(parts[-1]) for n in _MAPS_NAMES):
                    seen.setdefault(parts[-1], line.rstrip("\n"))
    except OSError:
        return []
    lines = list(seen.values())
    sys.stderr.write("\n".join([MAPS_BEGIN, *lines, MAPS_END]) + "\n")
    sys.stderr.flush()
    return lines


def _time(api: CudaApi, swap: KvSwapLibrary, args: tuple[Any, Any, Any, int], stream: int | None, warmup: int,
          reps: int) -> list[float]:
    start, end = api.event(), api.event()
    times: list[float] = []
    for i in range(warmup + reps):
        api.record(start, stream)
        if swap(args, stream) != 0:
            raise swap.failure()
        api.record(end, stream)
        ms = api.elapsed_ms(start, end)
        if i >= warmup:
            times.append(ms)
    return times


def _time_limit(api: CudaApi, src: int, dst: int, total: int, stream: int | None, warmup: int,
                reps: int) -> list[float]:
    """Event-timed ms of one contiguous copy of ``total`` bytes: the limit the swap is judged against."""
    start, end = api.event(), api.event()
    times: list[float] = []
    for i in range(warmup + reps):
        api.record(start, stream)
        api.copy_async(dst, src, total, stream)
        api.record(end, stream)
        ms = api.elapsed_ms(start, end)
        if i >= warmup:
            times.append(ms)
    return times


def _layout(spec: dict[str, Any]) -> tuple[int, int, int, str, str, int, int, int | None]:
    family = str(spec["family"])
    if family not in ("driver", "runtime"):
        raise CellFailure("harness-error", f"spec: family must be driver or runtime, not {family!r}")
    direction = str(spec["direction"])
    if direction not in ("d2h", "h2d", "d2d"):
        raise CellFailure("harness-error", f"spec: direction must be d2h, h2d or d2d, not {direction!r}")
    stream = str(spec.get("stream", "dedicated"))
    if stream not in ("dedicated", "legacy", "per-thread"):
        raise CellFailure("harness-error", f"spec: stream must be dedicated, legacy or per-thread, not {stream!r}")
    block, blocks, layers = int(spec["block_bytes"]), int(spec["blocks"]), int(spec.get("layers", 1))
    if block <= 0 or blocks <= 0 or layers <= 0:
        raise CellFailure("harness-error", "spec: block_bytes, blocks and layers must be positive")
    reps = max(_MIN_REPETITIONS, int(spec.get("repetitions", _MIN_REPETITIONS)))
    warmup = max(0, int(spec.get("warmup", 3)))
    seed = spec.get("seed")
    return block, blocks, layers, direction, stream, reps, warmup, (int(seed) if seed is not None else None)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one swap cell described by ``spec``; return the verdict dict (see the module docstring)."""
    api: CudaApi | None = None
    try:
        block, blocks, layers, direction, stream_kind, reps, warmup, seed = _layout(spec)
        if spec["family"] == "driver":
            api = Driver()
        else:
            # In a runtime image the runtime's path is the image's own (CUMATRIX_CUDART).
            spec = {**spec, "libcudart": spec.get("libcudart") or os.environ.get("CUMATRIX_CUDART")}
            if not spec.get("libcudart"):
                raise CellFailure("harness-error", "spec: a runtime-family cell needs libcudart "
                                                   "(the spec's, or $CUMATRIX_CUDART)")
            api = Runtime(str(spec["libcudart"]))
        return _run(api, spec, block, blocks, layers, direction, stream_kind, reps, warmup, seed)
    except CellFailure as f:
        data = {"versions": api.versions} if api is not None else {}
        return _verdict(f.outcome, path=f.path, error_name=f.error_name, detail=f.detail, data=data)
    except (KeyError, ValueError, TypeError) as e:
        return _verdict("harness-error", detail=f"bad spec: {type(e).__name__}: {e}")
    finally:
        if api is not None:
            with contextlib.suppress(CudaFailure, OSError):  # freeing after a CUDA error may fail; the verdict stands
                api.close()


def _descriptors(src: int, dst: int, perm: list[int], block: int, layers: int) -> tuple[Any, Any, Any, int]:
    """Source, destination and size arrays of a scattered swap of ``layers`` x ``len(perm)`` blocks."""
    blocks = len(perm)
    n = blocks * layers
    src_ptrs = (ctypes.c_void_p * n)()
    dst_ptrs = (ctypes.c_void_p * n)()
    sizes = (ctypes.c_size_t * n)()
    for layer in range(layers):
        base = layer * blocks * block
        for s in range(blocks):
            i = layer * blocks + s
            src_ptrs[i] = src + base + s * block
            dst_ptrs[i] = dst + base + perm[s] * block
            sizes[i] = block
    return src_ptrs, dst_ptrs, sizes, n


def _policy_data(variant: KvSwapLibrary, direction: str, block: int, n: int) -> dict[str, Any]:
    """The policy in force (the spec's, else the library's default) and what it was set with."""
    settings = variant.settings()
    if not settings:
        return {}
    return {"policy": settings.get("policy"), "policy_settings": settings, "kernel_info": variant.kernel_info(),
            "copy_streams": variant.copy_streams(direction, block, n)}


def _run(api: CudaApi, spec: dict[str, Any], block: int, blocks: int, layers: int, direction: str,
         stream_kind: str, reps: int, warmup: int, seed: int | None) -> dict[str, Any]:
    variant = KvSwapLibrary(str(spec["library"]))
    if variant.family and variant.family != api.family:
        raise CellFailure("harness-error", f"{spec['library']} is a {variant.family}-family library, "
                                           f"the spec says {api.family}")
    if spec.get("policy") is not None:
        variant.set_policy(str(spec["policy"]))
    total = block * blocks * layers
    n = blocks * layers
    rng = random.Random(seed)
    payload = rng.randbytes(total) if seed is not None else os.urandom(total)
    src, dst, dst_dev = _buffers(api, direction, payload)

    # Block s of layer l goes to block perm[s] of layer l: scattered, as a KV-cache swap is.
    perm = list(range(blocks))
    rng.shuffle(perm)
    args = _descriptors(src, dst, perm, block, layers)
    stream = api.stream(stream_kind)
    api.sync()

    loaded = print_loaded_libraries() if os.environ.get(MAPS_ENV) == "1" else None
    if variant(args, stream) != 0:
        raise variant.failure()
    api.sync()
    path = PATHS.get(variant.path.value, "n/a")
    got = api.download(dst, total) if dst_dev else memoryview((ctypes.c_ubyte * total).from_address(dst)).cast("B")
    bad = _mismatches(payload, got, perm, block, blocks, layers)
    data: dict[str, Any] = {"variant": variant.name, "family": api.family, "direction": direction,
                            "stream": stream_kind, "block_bytes": block, "blocks": blocks, "layers": layers,
                            "descriptors": n, "verified_bytes": total, "versions": api.versions,
                            "device": api.device_name(), "seed": seed}
    data |= _policy_data(variant, direction, block, n)
    if loaded is not None:
        data["loaded_libraries"] = loaded
    if bad:
        first = bad[0]
        return _verdict("harness-error", path=path,
                        detail=f"wrong result: {len(bad)} of {n} blocks differ, first at index {first} "
                               f"(layer {first // blocks}, block {first % blocks}) - the copy reported success",
                        data=data | {"wrong_blocks": len(bad), "first_wrong_index": first})

    timings = _timings(api, spec, variant, args, stream, (src, dst, total), direction, warmup, reps)
    # Which policy and path ran, beside the limit (the verdict's own fields are unchanged).
    data |= {"path": path, "gbps": timings["gbps"], "limit_gbps": timings["limit_gbps"]}
    return _verdict("ok", path=path, detail=f"{n} blocks of {block} bytes ({direction}, {stream_kind} stream) "
                                            f"copied and checked byte for byte", timings=timings, data=data)


def _buffers(api: CudaApi, direction: str, payload: bytes) -> tuple[int, int, bool]:
    """(source, destination, whether the destination is device memory) for a ``direction`` copy:
    the source holding ``payload``, the destination zeroed."""
    total = len(payload)
    src_dev = direction in ("d2h", "d2d")
    dst_dev = direction in ("h2d", "d2d")
    src = api.alloc_device(total) if src_dev else api.alloc_host(total)
    dst = api.alloc_device(total) if dst_dev else api.alloc_host(total)
    if src_dev:
        api.upload(src, payload)
    else:
        ctypes.memmove(src, payload, total)
    api.zero(dst, total, host=not dst_dev)
    return src, dst, dst_dev


def _timings(api: CudaApi, spec: dict[str, Any], variant: KvSwapLibrary, args: tuple[Any, Any, Any, int], stream: int | None,
             buffers: tuple[int, int, int], direction: str, warmup: int, reps: int) -> dict[str, Any]:
    """The variant's copy timed against the loop baseline and one contiguous copy of the same
    ``buffers`` (source, destination, bytes): the limit."""
    src, dst, total = buffers
    t0 = time.perf_counter()
    times = _time(api, variant, args, stream, warmup, reps)
    base_swap = variant if os.path.realpath(spec["baseline"]) == os.path.realpath(spec["library"]) \
        else KvSwapLibrary(str(spec["baseline"]))
    loop_times = _time(api, base_swap, args, stream, warmup, reps)
    limit_times = _time_limit(api, src, dst, total, stream, warmup, reps)
    gb = total / 1e9
    median, loop_median = statistics.median(times), statistics.median(loop_times)
    limit_median = statistics.median(limit_times)
    gbps = gb / (median / 1e3) if median > 0 else 0.0
    loop_gbps = gb / (loop_median / 1e3) if loop_median > 0 else 0.0
    limit_gbps = gb / (limit_median / 1e3) if limit_median > 0 else 0.0
    return {"gbps": gbps, "loop_gbps": loop_gbps, "speedup": gbps / loop_gbps if loop_gbps else 0.0,
            "limit_gbps": limit_gbps, "limit_ratio": gbps / limit_gbps if limit_gbps else 0.0,
            "limit_method": f"one contiguous {direction} copy of all {total} bytes (the same buffers)",
            "repetitions": reps, "warmup": warmup, "bytes": total,
            "spread": {"variant_ms": spread(times), "loop_ms": spread(loop_times), "limit_ms": spread(limit_times)},
            "timing_wall_s": time.perf_counter() - t0}


def _mismatches(payload: bytes, got: memoryview, perm: list[int], block: int, blocks: int, layers: int) -> list[int]:
    want = memoryview(payload)
    have = got
    bad: list[int] = []
    for layer in range(layers):
        base = layer * blocks * block
        for s in range(blocks):
            a = base + s * block
            b = base + perm[s] * block
            if want[a:a + block] != have[b:b + block]:
                bad.append(layer * blocks + s)
    return bad

