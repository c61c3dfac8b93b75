"""Typed ctypes wrappers of the CUDA driver and runtime APIs, and of a kvswap library.

What the swap cell, ``cumatrix calibrate``, the swap benchmark and the GPU tests share: a context
and memory through one API family (:class:`Driver` talks to ``libcuda.so.1`` alone, so it runs
under an emulated driver; :class:`Runtime` uses a given ``libcudart``), events, streams, and
:class:`KvSwapLibrary`, one loaded reference variant with its policy knobs.  Stdlib and ctypes
only: it is imported inside isolated children.  Every CUDA failure raises :class:`CudaFailure`
carrying the outcome a cell reports (``cuda-error:N``, ``skipped:no-cuda-driver``, ...).
"""

from __future__ import annotations

import ctypes
import statistics
from typing import Any

PATHS = {0: "n/a", 1: "batch", 2: "fallback", 3: "kernel"}
STREAM_LEGACY = None  # NULL: the legacy default stream
STREAM_PER_THREAD = 0x2  # CU_STREAM_PER_THREAD / cudaStreamPerThread
CUDA_ERROR_NO_DEVICE = 100  # CUDA_ERROR_NO_DEVICE / cudaErrorNoDevice
KVSWAP_E_NO_LIBRARY = -2  # reference/kvswap.h

#: kvswap_policy values of reference/kvswap.h.
POLICIES = {"fastest": 0, "copy-engine-only": 1, "kernel": 2, "batch": 3, "loop": 4, "beside-compute": 5}
#: kvswap_direction values of reference/kvswap.h.
DIRECTIONS = {"d2h": 1, "h2d": 2, "d2d": 3}


class KvStatus(ctypes.Structure):
    """``kvswap_status`` from reference/kvswap.h."""

    _fields_ = [("code", ctypes.c_int), ("failed_index", ctypes.c_long), ("error_name", ctypes.c_char_p),
                ("message", ctypes.c_char * 256)]


class CudaFailure(Exception):
    """Ends the cell with a verdict (raised from deep inside setup or the copy)."""

    def __init__(self, outcome: str, detail: str, error_name: str | None = None, path: str = "n/a") -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail
        self.error_name = error_name
        self.path = path


# --------------------------------------------------------------------------- the two APIs


class CudaApi:
    """What the cell needs from CUDA, in one family's words."""

    family = ""
    versions: dict[str, int]

    def alloc_device(self, size: int) -> int: raise NotImplementedError
    def alloc_host(self, size: int) -> int: raise NotImplementedError
    def upload(self, dst: int, data: bytes) -> None: raise NotImplementedError
    def download(self, src: int, size: int) -> memoryview: raise NotImplementedError
    def _zero_device(self, ptr: int, size: int) -> None: raise NotImplementedError
    def _new_stream(self) -> int | None: raise NotImplementedError

    def zero(self, ptr: int, size: int, host: bool) -> None:
        if host:
            ctypes.memset(ptr, 0, size)
        else:
            self._zero_device(ptr, size)

    def stream(self, kind: str) -> int | None:
        """``legacy`` (the NULL stream), ``per-thread``, or a new dedicated stream."""
        if kind == "legacy":
            return STREAM_LEGACY
        if kind == "per-thread":
            return STREAM_PER_THREAD
        return self._new_stream()
    def copy_async(self, dst: int, src: int, size: int, stream: int | None) -> None: raise NotImplementedError
    #: This API's names for: create an event, record it, wait for it, time between two, sync.
    EVENT_API: tuple[str, str, str, str, str] = ("", "", "", "", "")
    lib: ctypes.CDLL

    def check(self, rc: int, what: str) -> None: raise NotImplementedError

    def _event_create(self, out: ctypes.c_void_p) -> int:
        return int(getattr(self.lib, self.EVENT_API[0])(ctypes.byref(out)))

    def event(self) -> int:
        e = ctypes.c_void_p()
        self.check(self._event_create(e), self.EVENT_API[0])
        if e.value is None:
            raise CudaFailure("harness-error", f"{self.EVENT_API[0]} gave no event")
        return e.value

    def record(self, ev: int, stream: int | None) -> None:
        self.check(getattr(self.lib, self.EVENT_API[1])(ev, stream), self.EVENT_API[1])

    def elapsed_ms(self, start: int, end: int) -> float:
        self.check(getattr(self.lib, self.EVENT_API[2])(end), self.EVENT_API[2])
        ms = ctypes.c_float()
        self.check(getattr(self.lib, self.EVENT_API[3])(ctypes.byref(ms), start, end), self.EVENT_API[3])
        return ms.value

    def sync(self) -> None:
        self.check(getattr(self.lib, self.EVENT_API[4])(), self.EVENT_API[4])
    def device_name(self) -> str: raise NotImplementedError
    def close(self) -> None: raise NotImplementedError


class Driver(CudaApi):
    family = "driver"

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaFailure("skipped:no-cuda-driver", f"libcuda.so.1 cannot be loaded: {e}") from e
        rc = self.lib.cuInit(0)
        if rc == CUDA_ERROR_NO_DEVICE:
            raise CudaFailure("skipped:no-cuda-driver", "cuInit: CUDA_ERROR_NO_DEVICE (no GPU visible)",
                              "CUDA_ERROR_NO_DEVICE")
        self.check(rc, "cuInit")
        v = ctypes.c_int(0)
        self.check(self.lib.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
        self.versions = {"driver": v.value}
        self.dev = ctypes.c_int(0)
        self.check(self.lib.cuDeviceGet(ctypes.byref(self.dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
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

    def check(self, rc: int, what: str) -> None:
        """Raise :class:`CudaFailure` (outcome ``cuda-error:N``) unless ``rc`` is success."""
        if rc != 0:
            name = self.error_name(rc)
            raise CudaFailure(f"cuda-error:{rc}", f"{what} failed: {name}", name)

    def alloc_device(self, size: int) -> int:
        p = ctypes.c_uint64(0)
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(p), size), f"cuMemAlloc({size})")
        self._dev_allocs.append(p.value)
        return p.value

    def alloc_host(self, size: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cuMemHostAlloc(ctypes.byref(p), size, 0), f"cuMemHostAlloc({size})")
        assert p.value is not None
        self._host_allocs.append(p.value)
        return p.value

    def upload(self, dst: int, data: bytes) -> None:
        self.check(self.lib.cuMemcpyHtoD_v2(dst, data, len(data)), "cuMemcpyHtoD")

    def download(self, src: int, size: int) -> memoryview:
        buf = ctypes.create_string_buffer(size)
        self.check(self.lib.cuMemcpyDtoH_v2(buf, src, size), "cuMemcpyDtoH")
        return memoryview(buf).cast("B")

    def _zero_device(self, ptr: int, size: int) -> None:
        self.check(self.lib.cuMemsetD8_v2(ptr, 0, size), "cuMemsetD8")

    def _new_stream(self) -> int | None:
        s = ctypes.c_void_p()
        self.check(self.lib.cuStreamCreate(ctypes.byref(s), 0), "cuStreamCreate")
        return s.value

    def copy_async(self, dst: int, src: int, size: int, stream: int | None) -> None:
        """One ``cuMemcpyAsync`` (unified addressing: any direction)."""
        self.lib.cuMemcpyAsync.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p]
        self.check(self.lib.cuMemcpyAsync(dst, src, size, stream), "cuMemcpyAsync")

    EVENT_API = ("cuEventCreate", "cuEventRecord", "cuEventSynchronize", "cuEventElapsedTime", "cuCtxSynchronize")

    def _event_create(self, out: ctypes.c_void_p) -> int:
        return int(self.lib.cuEventCreate(ctypes.byref(out), 0))  # flags: default

    def device_name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.lib.cuDeviceGetName(buf, 256, self.dev)
        return buf.value.decode(errors="replace")

    def attribute(self, attr: int) -> int:
        """``cuDeviceGetAttribute`` (e.g. 16: multiprocessor count, 75/76: compute capability)."""
        v = ctypes.c_int(0)
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(v), attr, self.dev), f"cuDeviceGetAttribute({attr})")
        return v.value

    def wait(self, stream: int | None, ev: int) -> None:
        """``cuStreamWaitEvent``: ``stream`` waits for ``ev``'s last recorded work."""
        self.lib.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
        self.check(self.lib.cuStreamWaitEvent(stream, ev, 0), "cuStreamWaitEvent")

    def between_ms(self, start: int, end: int) -> float:
        """Milliseconds between two completed events (no synchronisation)."""
        ms = ctypes.c_float()
        self.check(self.lib.cuEventElapsedTime(ctypes.byref(ms), start, end), "cuEventElapsedTime")
        return ms.value

    def load_function(self, image: bytes, name: str) -> int:
        """``cuModuleLoadData`` + ``cuModuleGetFunction``: a CUfunction from a CUBIN or PTX image."""
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
        self.lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), "cuModuleGetFunction")
        assert fn.value is not None
        return fn.value

    def launch(self, fn: int, grid: int, block: int, stream: int | None, args: list[Any]) -> None:
        """``cuLaunchKernel`` of a 1-D grid; ``args`` are ctypes values, passed by address."""
        ptrs = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
        self.lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p,
                                                                                     ctypes.c_void_p, ctypes.c_void_p]
        self.check(self.lib.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, stream, ptrs, None), "cuLaunchKernel")

    def close(self) -> None:
        for d in self._dev_allocs:
            self.lib.cuMemFree_v2(d)
        for h in self._host_allocs:
            self.lib.cuMemFreeHost(h)


class Runtime(CudaApi):
    family = "runtime"

    def __init__(self, libcudart: str) -> None:
        # The driver's absence is a skip, not a runtime error: check it without initialising it.
        try:
            ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaFailure("skipped:no-cuda-driver", f"libcuda.so.1 cannot be loaded: {e}") from e
        try:
            # Loaded first, globally, so the variant's dlopen(RTLD_NOLOAD) finds this runtime.
            self.lib = ctypes.CDLL(libcudart, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise CudaFailure("harness-error", f"cannot load the runtime {libcudart}: {e}") from e
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
        if rc == CUDA_ERROR_NO_DEVICE:
            raise CudaFailure("skipped:no-cuda-driver", "cudaSetDevice: cudaErrorNoDevice (no GPU visible)",
                              "cudaErrorNoDevice")
        self.check(rc, "cudaSetDevice(0)")

    def error_name(self, rc: int) -> str:
        name = self.lib.cudaGetErrorName(rc)
        return name.decode() if name else f"cudaError_t {rc}"

    def check(self, rc: int, what: str) -> None:
        """Raise :class:`CudaFailure` (outcome ``cuda-error:N``) unless ``rc`` is success."""
        if rc != 0:
            name = self.error_name(rc)
            raise CudaFailure(f"cuda-error:{rc}", f"{what} failed: {name}", name)

    def alloc_device(self, size: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)), f"cudaMalloc({size})")
        assert p.value is not None
        self._dev_allocs.append(p.value)
        return p.value

    def alloc_host(self, size: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(size), 0), f"cudaHostAlloc({size})")
        assert p.value is not None
        self._host_allocs.append(p.value)
        return p.value

    def upload(self, dst: int, data: bytes) -> None:
        self.check(self.lib.cudaMemcpy(dst, data, len(data), 1), "cudaMemcpy(HostToDevice)")

    def download(self, src: int, size: int) -> memoryview:
        buf = ctypes.create_string_buffer(size)
        self.check(self.lib.cudaMemcpy(buf, src, size, 2), "cudaMemcpy(DeviceToHost)")
        return memoryview(buf).cast("B")

    def _zero_device(self, ptr: int, size: int) -> None:
        self.check(self.lib.cudaMemset(ptr, 0, size), "cudaMemset")

    def _new_stream(self) -> int | None:
        s = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        return s.value

    def copy_async(self, dst: int, src: int, size: int, stream: int | None) -> None:
        """One ``cudaMemcpyAsync`` with ``cudaMemcpyDefault`` (unified addressing: any direction)."""
        self.lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                             ctypes.c_void_p]
        self.check(self.lib.cudaMemcpyAsync(dst, src, size, 4, stream), "cudaMemcpyAsync")

    EVENT_API = ("cudaEventCreate", "cudaEventRecord", "cudaEventSynchronize", "cudaEventElapsedTime",
                 "cudaDeviceSynchronize")

    def device_name(self) -> str:
        return ""  # cudaGetDeviceProperties' struct layout changes between versions; the probe reports it

    def close(self) -> None:
        for d in self._dev_allocs:
            self.lib.cudaFree(d)
        for h in self._host_allocs:
            self.lib.cudaFreeHost(h)


# --------------------------------------------------------------------------- the variant


def undefined_symbol(message: str) -> str | None:
    marker = "undefined symbol: "
    if marker not in message:
        return None
    sym = message.split(marker, 1)[1].split(maxsplit=1)[0].strip(",;:'\"")
    return sym.split("@", 1)[0] or None


class KvSwapLibrary:
    """One loaded variant library and its ``kvswap_swap_blocks``."""

    def __init__(self, path: str) -> None:
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            sym = undefined_symbol(str(e))
            if sym:
                raise CudaFailure(f"undefined-symbol:{sym}", str(e)) from e
            raise CudaFailure("harness-error", f"cannot load {path}: {e}") from e
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
            raise CudaFailure("harness-error", f"spec: policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if not hasattr(self.lib, "kvswap_set_policy"):
            raise CudaFailure("harness-error", f"{self.name}: has no path policy (kvswap_set_policy)")
        if self.lib.kvswap_set_policy(POLICIES[policy]) != 0:
            raise CudaFailure("harness-error", f"{self.name}: kvswap_set_policy({policy}) refused")

    def policy(self) -> str | None:
        """The policy in force (``kvswap_get_policy``), or ``None`` for libraries without one."""
        if not hasattr(self.lib, "kvswap_get_policy"):
            return None
        value = int(self.lib.kvswap_get_policy())
        return next((name for name, v in POLICIES.items() if v == value), str(value))

    def set_copy_streams(self, streams: int) -> None:
        """``kvswap_set_copy_streams``: split copy-engine batches over ``streams`` (0: calibrated)."""
        if not hasattr(self.lib, "kvswap_set_copy_streams") or self.lib.kvswap_set_copy_streams(streams) != 0:
            raise CudaFailure("harness-error", f"{self.name}: kvswap_set_copy_streams({streams}) refused")

    def set_sm_budget(self, ctas: int) -> None:
        """``kvswap_set_sm_budget``: at most ``ctas`` CTAs for the beside-compute kernel."""
        if not hasattr(self.lib, "kvswap_set_sm_budget") or self.lib.kvswap_set_sm_budget(ctas) != 0:
            raise CudaFailure("harness-error", f"{self.name}: kvswap_set_sm_budget({ctas}) refused")

    def set_beside_compute_host_path(self, path: str) -> None:
        """``kvswap_set_beside_compute_host_path``: ``batch`` or ``kernel`` for d2h/h2d beside compute."""
        value = {"batch": 1, "kernel": 3}[path]
        fn = getattr(self.lib, "kvswap_set_beside_compute_host_path", None)
        if fn is None or fn(value) != 0:
            raise CudaFailure("harness-error", f"{self.name}: kvswap_set_beside_compute_host_path({path}) refused")

    def set_chunk_limit(self, descriptors: int) -> None:
        """``kvswap_set_chunk_limit``: at most this many descriptors per batch call (0: default)."""
        self.lib.kvswap_set_chunk_limit(ctypes.c_size_t(descriptors))

    def settings(self) -> dict[str, Any]:
        """What the library says about its policy knobs (only those it exports)."""
        out: dict[str, Any] = {}
        if hasattr(self.lib, "kvswap_get_policy"):
            out["policy"] = self.policy()
        if hasattr(self.lib, "kvswap_get_sm_budget"):
            out["sm_budget"] = int(self.lib.kvswap_get_sm_budget())
        if hasattr(self.lib, "kvswap_get_beside_compute_host_path"):
            out["beside_compute_host_path"] = PATHS.get(int(self.lib.kvswap_get_beside_compute_host_path()), "n/a")
        if hasattr(self.lib, "kvswap_calibration_source"):
            self.lib.kvswap_calibration_source.restype = ctypes.c_char_p
            out["calibration"] = (self.lib.kvswap_calibration_source() or b"").decode(errors="replace")
        if hasattr(self.lib, "kvswap_calibration_sm_budget"):
            out["calibration_sm_budget"] = int(self.lib.kvswap_calibration_sm_budget())
        return out

    def copy_streams(self, direction: str, block_bytes: int, blocks: int) -> int | None:
        """Copy-engine streams a batch of this shape is split over, or ``None`` without the API."""
        if not hasattr(self.lib, "kvswap_calibrated_streams"):
            return None
        fn = self.lib.kvswap_calibrated_streams
        fn.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t]
        return int(fn(DIRECTIONS[direction], block_bytes, blocks))

    def kernel_info(self) -> str | None:
        """How the copy kernel was built, or why not (``None`` for libraries without one)."""
        if not hasattr(self.lib, "kvswap_kernel_info"):
            return None
        self.lib.kvswap_kernel_info.restype = ctypes.c_char_p
        return (self.lib.kvswap_kernel_info() or b"").decode(errors="replace")

    def __call__(self, args: tuple[Any, Any, Any, int], stream: int | None) -> int:
        src, dst, sizes, n = args
        return int(self.fn(src, dst, sizes, n, stream, ctypes.byref(self.path), ctypes.byref(self.status)))

    def failure(self) -> CudaFailure:
        st = self.status
        name = st.error_name.decode() if st.error_name else None
        msg = st.message.decode(errors="replace")
        where = f" at block {st.failed_index}" if st.failed_index >= 0 and "block" not in msg else ""
        outcome = f"cuda-error:{st.code}" if st.code > 0 else "harness-error"
        if st.code == KVSWAP_E_NO_LIBRARY and "nvrtc" in msg.lower():
            outcome = "skipped:no-nvrtc"  # the kernel path needs NVRTC; this host has none
        return CudaFailure(outcome, f"{self.name}: {msg}{where}", name, PATHS.get(self.path.value, "n/a"))


def spread(values: list[float]) -> dict[str, float]:
    """min, p10, median, p90 and max of ``values`` (nearest-rank percentiles)."""
    s = sorted(values)

    def pct(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]

    return {"min": s[0], "p10": pct(0.10), "median": statistics.median(s), "p90": pct(0.90), "max": s[-1]}


def nvrtc_compile(source: str, name: str, arch: tuple[int, int], library: str | None = None) -> bytes:
    """Compile CUDA C++ ``source`` to a CUBIN for ``sm_XY`` with NVRTC (``libnvrtc.so.13``/``.12``).

    Raises :class:`CudaFailure` (``skipped:no-nvrtc`` when no NVRTC can be loaded, ``harness-error``
    with NVRTC's log when the source does not compile).
    """
    lib = None
    for candidate in ([library] if library else []) + ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]:
        try:
            lib = ctypes.CDLL(candidate)
            break
        except OSError:
            continue
    if lib is None:
        raise CudaFailure("skipped:no-nvrtc", "no NVRTC library (libnvrtc.so.13/.12) can be loaded")
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None) != 0:
        raise CudaFailure("harness-error", "nvrtcCreateProgram failed")
    opts = (ctypes.c_char_p * 2)(f"--gpu-architecture=sm_{arch[0]}{arch[1]}".encode(), b"-default-device")
    rc = lib.nvrtcCompileProgram(prog, 2, opts)
    if rc != 0:
        size = ctypes.c_size_t(0)
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value + 1)
        lib.nvrtcGetProgramLog(prog, log)
        raise CudaFailure("harness-error", f"NVRTC cannot compile {name}: {log.value.decode(errors='replace')}")
    size = ctypes.c_size_t(0)
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return cubin.raw
