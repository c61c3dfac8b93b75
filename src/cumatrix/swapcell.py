"""The swap cell, child side: run one reference variant on the GPU, check it, time it.

Runs inside the isolated child (stdlib + ctypes only; imports nothing heavy).  The
variant's own API family sets up the memory: a driver-family cell talks to
``libcuda.so.1`` alone (it loads no CUDA runtime, which is what lets it run under an
emulated driver); a runtime-family cell loads the given ``libcudart`` first and uses it.

``run(spec)`` returns the verdict the child prints as ``CUMATRIX-RESULT {json}``.

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

import ctypes
import os
import random
import statistics
import sys
import time
from typing import Any

_PATHS = {0: "n/a", 1: "batch", 2: "fallback", 3: "kernel"}
_STREAM_LEGACY = None  # NULL: the legacy default stream
_STREAM_PER_THREAD = 0x2  # CU_STREAM_PER_THREAD / cudaStreamPerThread
_CUDA_ERROR_NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE / cudaErrorNoDevice
_MIN_REPETITIONS = 20
KVSWAP_E_NO_LIBRARY = -2  # reference/kvswap.h

#: kvswap_policy values of reference/kvswap.h.
POLICIES = {"fastest": 0, "copy-engine-only": 1, "kernel": 2, "batch": 3, "loop": 4}


class KvStatus(ctypes.Structure):
    """``kvswap_status`` from reference/kvswap.h."""

    _fields_ = [("code", ctypes.c_int), ("failed_index", ctypes.c_long), ("error_name", ctypes.c_char_p),
                ("message", ctypes.c_char * 256)]


class CellFailure(Exception):
    """Ends the cell with a verdict (raised from deep inside setup or the copy)."""

    def __init__(self, outcome: str, detail: str, error_name: str | None = None, path: str = "n/a") -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail
        self.error_name = error_name
        self.path = path


def _verdict(outcome: str, *, path: str = "n/a", error_name: str | None = None, detail: str = "",
             timings: dict[str, Any] | None = None, data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"outcome": outcome, "path": path, "error_name": error_name, "detail": detail,
            "timings": timings or {}, "data": data or {}}


# --------------------------------------------------------------------------- the two APIs


class _Api:
    """What the cell needs from CUDA, in one family's words."""

    family = ""
    versions: dict[str, int]

    def alloc_device(self, size: int) -> int: raise NotImplementedError
    def alloc_host(self, size: int) -> int: raise NotImplementedError
    def upload(self, dst: int, data: bytes) -> None: raise NotImplementedError
    def download(self, src: int, size: int) -> memoryview: raise NotImplementedError
    def zero(self, ptr: int, size: int, host: bool) -> None: raise NotImplementedError
    def stream(self, kind: str) -> int | None: raise NotImplementedError
    def event(self) -> int: raise NotImplementedError
    def record(self, ev: int, stream: int | None) -> None: raise NotImplementedError
    def elapsed_ms(self, start: int, end: int) -> float: raise NotImplementedError
    def sync(self) -> None: raise NotImplementedError
    def device_name(self) -> str: raise NotImplementedError
    def close(self) -> None: raise NotImplementedError


class _Driver(_Api):
    family = "driver"

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CellFailure("skipped:no-cuda-driver", f"libcuda.so.1 cannot be loaded: {e}") from e
        rc = self.lib.cuInit(0)
        if rc == _CUDA_ERROR_NO_DEVICE:
            raise CellFailure("skipped:no-cuda-driver", "cuInit: CUDA_ERROR_NO_DEVICE (no GPU visible)",
                              "CUDA_ERROR_NO_DEVICE")
        self._check(rc, "cuInit")
        v = ctypes.c_int(0)
        self._check(self.lib.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
        self.versions = {"driver": v.value}
        self.dev = ctypes.c_int(0)
        self._check(self.lib.cuDeviceGet(ctypes.byref(self.dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev), "cuDevicePrimaryCtxRetain")
        self._check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        self.lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self.lib.cuMemsetD8_v2.argtypes = [ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t]
        self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.lib.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
        self.lib.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.lib.cuEventSynchronize.argtypes = [ctypes.c_void_p]
        self.lib.cuEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p]
        self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.lib.cuMemFreeHost.argtypes = [ctypes.c_void_p]
        self._dev_allocs: list[int] = []
        self._host_allocs: list[int] = []

    def error_name(self, rc: int) -> str:
        name = ctypes.c_char_p()
        if self.lib.cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
        return f"CUresult {rc}"

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = self.error_name(rc)
            raise CellFailure(f"cuda-error:{rc}", f"{what} failed: {name}", name)

    def alloc_device(self, size: int) -> int:
        p = ctypes.c_uint64(0)
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(p), size), f"cuMemAlloc({size})")
        self._dev_allocs.append(p.value)
        return p.value

    def alloc_host(self, size: int) -> int:
        p = ctypes.c_void_p()
        self._check(self.lib.cuMemHostAlloc(ctypes.byref(p), size, 0), f"cuMemHostAlloc({size})")
        assert p.value is not None
        self._host_allocs.append(p.value)
        return p.value

    def upload(self, dst: int, data: bytes) -> None:
        self._check(self.lib.cuMemcpyHtoD_v2(dst, data, len(data)), "cuMemcpyHtoD")

    def download(self, src: int, size: int) -> memoryview:
        buf = ctypes.create_string_buffer(size)
        self._check(self.lib.cuMemcpyDtoH_v2(buf, src, size), "cuMemcpyDtoH")
        return memoryview(buf).cast("B")

    def zero(self, ptr: int, size: int, host: bool) -> None:
        if host:
            ctypes.memset(ptr, 0, size)
        else:
            self._check(self.lib.cuMemsetD8_v2(ptr, 0, size), "cuMemsetD8")

    def stream(self, kind: str) -> int | None:
        if kind == "legacy":
            return _STREAM_LEGACY
        if kind == "per-thread":
            return _STREAM_PER_THREAD
        s = ctypes.c_void_p()
        self._check(self.lib.cuStreamCreate(ctypes.byref(s), 0), "cuStreamCreate")
        return s.value

    def event(self) -> int:
        e = ctypes.c_void_p()
        self._check(self.lib.cuEventCreate(ctypes.byref(e), 0), "cuEventCreate")
        assert e.value is not None
        return e.value

    def record(self, ev: int, stream: int | None) -> None:
        self._check(self.lib.cuEventRecord(ev, stream), "cuEventRecord")

    def elapsed_ms(self, start: int, end: int) -> float:
        self._check(self.lib.cuEventSynchronize(end), "cuEventSynchronize")
        ms = ctypes.c_float()
        self._check(self.lib.cuEventElapsedTime(ctypes.byref(ms), start, end), "cuEventElapsedTime")
        return ms.value

    def sync(self) -> None:
        self._check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def device_name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.lib.cuDeviceGetName(buf, 256, self.dev)
        return buf.value.decode(errors="replace")

    def close(self) -> None:
        for d in self._dev_allocs:
            self.lib.cuMemFree_v2(d)
        for h in self._host_allocs:
            self.lib.cuMemFreeHost(h)


class _Runtime(_Api):
    family = "runtime"

    def __init__(self, libcudart: str) -> None:
        # The driver's absence is a skip, not a runtime error: check it without initialising it.
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CellFailure("skipped:no-cuda-driver", f"libcuda.so.1 cannot be loaded: {e}") from e
        try:
            # Loaded first, globally, so the variant's dlopen(RTLD_NOLOAD) finds this runtime.
            self.lib = ctypes.CDLL(libcudart, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise CellFailure("harness-error", f"cannot load the runtime {libcudart}: {e}") from e
        self.lib.cudaGetErrorName.restype = ctypes.c_char_p
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.lib.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        self.lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.lib.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
        self.lib.cudaEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p]
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaFreeHost.argtypes = [ctypes.c_void_p]
        rv, dv = ctypes.c_int(0), ctypes.c_int(0)
        self.lib.cudaRuntimeGetVersion(ctypes.byref(rv))
        self.lib.cudaDriverGetVersion(ctypes.byref(dv))
        self.versions = {"runtime": rv.value, "driver": dv.value}
        self._dev_allocs: list[int] = []
        self._host_allocs: list[int] = []
        # The first real call: where a runtime refuses the driver (35, 103, ...).
        rc = self.lib.cudaSetDevice(0)
        if rc == _CUDA_ERROR_NO_DEVICE:
            raise CellFailure("skipped:no-cuda-driver", "cudaSetDevice: cudaErrorNoDevice (no GPU visible)",
                              "cudaErrorNoDevice")
        self._check(rc, "cudaSetDevice(0)")

    def error_name(self, rc: int) -> str:
        name = self.lib.cudaGetErrorName(rc)
        return name.decode() if name else f"cudaError_t {rc}"

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = self.error_name(rc)
            raise CellFailure(f"cuda-error:{rc}", f"{what} failed: {name}", name)

    def alloc_device(self, size: int) -> int:
        p = ctypes.c_void_p()
        self._check(self.lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)), f"cudaMalloc({size})")
        assert p.value is not None
        self._dev_allocs.append(p.value)
        return p.value

    def alloc_host(self, size: int) -> int:
        p = ctypes.c_void_p()
        self._check(self.lib.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), 0), f"cudaHostAlloc({size})")
        assert p.value is not None
        self._host_allocs.append(p.value)
        return p.value

    def upload(self, dst: int, data: bytes) -> None:
        self._check(self.lib.cudaMemcpy(dst, data, len(data), 1), "cudaMemcpy(HostToDevice)")

    def download(self, src: int, size: int) -> memoryview:
        buf = ctypes.create_string_buffer(size)
        self._check(self.lib.cudaMemcpy(buf, src, size, 2), "cudaMemcpy(DeviceToHost)")
        return memoryview(buf).cast("B")

    def zero(self, ptr: int, size: int, host: bool) -> None:
        if host:
            ctypes.memset(ptr, 0, size)
        else:
            self._check(self.lib.cudaMemset(ptr, 0, size), "cudaMemset")

    def stream(self, kind: str) -> int | None:
        if kind == "legacy":
            return _STREAM_LEGACY
        if kind == "per-thread":
            return _STREAM_PER_THREAD
        s = ctypes.c_void_p()
        self._check(self.lib.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        return s.value

    def event(self) -> int:
        e = ctypes.c_void_p()
        self._check(self.lib.cudaEventCreate(ctypes.byref(e)), "cudaEventCreate")
        assert e.value is not None
        return e.value

    def record(self, ev: int, stream: int | None) -> None:
        self._check(self.lib.cudaEventRecord(ev, stream), "cudaEventRecord")

    def elapsed_ms(self, start: int, end: int) -> float:
        self._check(self.lib.cudaEventSynchronize(end), "cudaEventSynchronize")
        ms = ctypes.c_float()
        self._check(self.lib.cudaEventElapsedTime(ctypes.byref(ms), start, end), "cudaEventElapsedTime")
        return ms.value

    def sync(self) -> None:
        self._check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def device_name(self) -> str:
        return ""  # cudaGetDeviceProperties' struct layout changes between versions; the probe reports it

    def close(self) -> None:
        for d in self._dev_allocs:
            self.lib.cudaFree(d)
        for h in self._host_allocs:
            self.lib.cudaFreeHost(h)


# --------------------------------------------------------------------------- the variant


def _undefined_symbol(message: str) -> str | None:
    marker = "undefined symbol: "
    if marker not in message:
        return None
    sym = message.split(marker, 1)[1].split()[0].strip(",;:'\"")
    return sym.split("@", 1)[0] or None


class _Swap:
    """One loaded variant library and its ``kvswap_swap_blocks``."""

    def __init__(self, path: str) -> None:
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            sym = _undefined_symbol(str(e))
            if sym:
                raise CellFailure(f"undefined-symbol:{sym}", str(e)) from e
            raise CellFailure("harness-error", f"cannot load {path}: {e}") from e
        self.fn = self.lib.kvswap_swap_blocks
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.POINTER(ctypes.c_int), ctypes.POINTER(KvStatus)]
        self.lib.kvswap_variant_name.restype = ctypes.c_char_p
        self.lib.kvswap_family.restype = ctypes.c_char_p
        self.name = (self.lib.kvswap_variant_name() or b"").decode()
        self.family = (self.lib.kvswap_family() or b"").decode()
        self.path = ctypes.c_int(0)
        self.status = KvStatus()

    def set_policy(self, policy: str) -> None:
        """``kvswap_set_policy`` by name; a library without the policy API cannot honour one."""
        if policy not in POLICIES:
            raise CellFailure("harness-error", f"spec: policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if not hasattr(self.lib, "kvswap_set_policy"):
            raise CellFailure("harness-error", f"{self.name}: has no path policy (kvswap_set_policy)")
        if self.lib.kvswap_set_policy(POLICIES[policy]) != 0:
            raise CellFailure("harness-error", f"{self.name}: kvswap_set_policy({policy}) refused")

    def kernel_info(self) -> str | None:
        """How the copy kernel was built, or why not (``None`` for libraries without one)."""
        if not hasattr(self.lib, "kvswap_kernel_info"):
            return None
        self.lib.kvswap_kernel_info.restype = ctypes.c_char_p
        return (self.lib.kvswap_kernel_info() or b"").decode(errors="replace")

    def __call__(self, args: tuple[Any, Any, Any, int], stream: int | None) -> int:
        src, dst, sizes, n = args
        return int(self.fn(src, dst, sizes, n, stream, ctypes.byref(self.path), ctypes.byref(self.status)))

    def failure(self) -> CellFailure:
        st = self.status
        name = st.error_name.decode() if st.error_name else None
        msg = st.message.decode(errors="replace")
        where = f" at block {st.failed_index}" if st.failed_index >= 0 and "block" not in msg else ""
        outcome = f"cuda-error:{st.code}" if st.code > 0 else "harness-error"
        if st.code == KVSWAP_E_NO_LIBRARY and "nvrtc" in msg.lower():
            outcome = "skipped:no-nvrtc"  # the kernel path needs NVRTC; this host has none
        return CellFailure(outcome, f"{self.name}: {msg}{where}", name, _PATHS.get(self.path.value, "n/a"))


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


def _spread(values: list[float]) -> dict[str, float]:
    s = sorted(values)

    def pct(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"min": s[0], "p10": pct(0.10), "median": statistics.median(s), "p90": pct(0.90), "max": s[-1]}


def _time(api: _Api, swap: _Swap, args: tuple[Any, Any, Any, int], stream: int | None, warmup: int,
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
    api: _Api | None = None
    try:
        block, blocks, layers, direction, stream_kind, reps, warmup, seed = _layout(spec)
        if spec["family"] == "driver":
            api = _Driver()
        else:
            # In a runtime image the runtime's path is the image's own (CUMATRIX_CUDART).
            spec = {**spec, "libcudart": spec.get("libcudart") or os.environ.get("CUMATRIX_CUDART")}
            if not spec.get("libcudart"):
                raise CellFailure("harness-error", "spec: a runtime-family cell needs libcudart "
                                                   "(the spec's, or $CUMATRIX_CUDART)")
            api = _Runtime(str(spec["libcudart"]))
        return _run(api, spec, block, blocks, layers, direction, stream_kind, reps, warmup, seed)
    except CellFailure as f:
        data = {"versions": api.versions} if api is not None else {}
        return _verdict(f.outcome, path=f.path, error_name=f.error_name, detail=f.detail, data=data)
    except (KeyError, ValueError, TypeError) as e:
        return _verdict("harness-error", detail=f"bad spec: {type(e).__name__}: {e}")
    finally:
        if api is not None:
            try:
                api.close()
            except Exception:  # noqa: BLE001 - freeing after a CUDA error may fail; the verdict stands
                pass


def _run(api: _Api, spec: dict[str, Any], block: int, blocks: int, layers: int, direction: str,
         stream_kind: str, reps: int, warmup: int, seed: int | None) -> dict[str, Any]:
    variant = _Swap(str(spec["library"]))
    if variant.family and variant.family != api.family:
        raise CellFailure("harness-error", f"{spec['library']} is a {variant.family}-family library, "
                                           f"the spec says {api.family}")
    if spec.get("policy") is not None:
        variant.set_policy(str(spec["policy"]))
    total = block * blocks * layers
    n = blocks * layers
    src_dev = direction in ("d2h", "d2d")
    dst_dev = direction in ("h2d", "d2d")
    src = api.alloc_device(total) if src_dev else api.alloc_host(total)
    dst = api.alloc_device(total) if dst_dev else api.alloc_host(total)

    rng = random.Random(seed)
    payload = rng.randbytes(total) if seed is not None else os.urandom(total)
    if src_dev:
        api.upload(src, payload)
    else:
        ctypes.memmove(src, payload, total)
    api.zero(dst, total, host=not dst_dev)

    # Block s of layer l goes to block perm[s] of layer l: scattered, as a KV-cache swap is.
    perm = list(range(blocks))
    rng.shuffle(perm)
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
    args = (src_ptrs, dst_ptrs, sizes, n)
    stream = api.stream(stream_kind)
    api.sync()

    loaded = print_loaded_libraries() if os.environ.get(MAPS_ENV) == "1" else None
    if variant(args, stream) != 0:
        raise variant.failure()
    api.sync()
    path = _PATHS.get(variant.path.value, "n/a")
    got = api.download(dst, total) if dst_dev else memoryview((ctypes.c_ubyte * total).from_address(dst)).cast("B")
    bad = _mismatches(payload, got, perm, block, blocks, layers)
    data: dict[str, Any] = {"variant": variant.name, "family": api.family, "direction": direction,
                            "stream": stream_kind, "block_bytes": block, "blocks": blocks, "layers": layers,
                            "descriptors": n, "verified_bytes": total, "versions": api.versions,
                            "device": api.device_name(), "seed": seed}
    if spec.get("policy") is not None:
        data |= {"policy": spec["policy"], "kernel_info": variant.kernel_info()}
    if loaded is not None:
        data["loaded_libraries"] = loaded
    if bad:
        first = bad[0]
        return _verdict("harness-error", path=path,
                        detail=f"wrong result: {len(bad)} of {n} blocks differ, first at index {first} "
                               f"(layer {first // blocks}, block {first % blocks}) - the copy reported success",
                        data=data | {"wrong_blocks": len(bad), "first_wrong_index": first})

    t0 = time.perf_counter()
    times = _time(api, variant, args, stream, warmup, reps)
    base_swap = variant if os.path.realpath(spec["baseline"]) == os.path.realpath(spec["library"]) \
        else _Swap(str(spec["baseline"]))
    loop_times = _time(api, base_swap, args, stream, warmup, reps)
    gb = total / 1e9
    median, loop_median = statistics.median(times), statistics.median(loop_times)
    gbps = gb / (median / 1e3) if median > 0 else 0.0
    loop_gbps = gb / (loop_median / 1e3) if loop_median > 0 else 0.0
    timings = {"gbps": gbps, "loop_gbps": loop_gbps, "speedup": gbps / loop_gbps if loop_gbps else 0.0,
               "repetitions": reps, "warmup": warmup, "bytes": total,
               "spread": {"variant_ms": _spread(times), "loop_ms": _spread(loop_times)},
               "timing_wall_s": time.perf_counter() - t0}
    return _verdict("ok", path=path, detail=f"{n} blocks of {block} bytes ({direction}, {stream_kind} stream) "
                                            f"copied and checked byte for byte", timings=timings, data=data)


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

