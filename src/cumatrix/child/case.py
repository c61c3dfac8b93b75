"""The child side of a cell: ``python3 -m cumatrix.child.case '<spec json>'``.

Runs inside the cell's environment (a process with the runtime first on the library
path, or a container), imports only the standard library and ctypes, and hands exactly
one verdict to the harness over the private channel of :mod:`cumatrix.execute.protocol`.
Everything it prints is log.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import sys
import traceback
from typing import Any

from cumatrix.child import channel as protocol

CUDA_SUCCESS = 0


# --------------------------------------------------------------------- loading libraries


def load_cudart(path: str | None) -> tuple[ctypes.CDLL, str]:
    """Load the cell's runtime: the spec's path, ``$CUMATRIX_CUDART``, else by SONAME."""
    candidates = [p for p in (path, os.environ.get("CUMATRIX_CUDART")) if p]
    candidates += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    errors = []
    for cand in candidates:
        try:
            return ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL), cand
        except OSError as e:
            errors.append(str(e))
            if path and cand == path:
                raise
    raise OSError("no CUDA runtime found: " + "; ".join(errors))


def loaded_file(fragment: str) -> str | None:
    """The file of a library this process has mapped (from /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and fragment in os.path.basename(parts[-1]):
                    return parts[-1]
    except OSError:
        return None
    return None


def driver_facts() -> dict[str, Any]:
    """What the driver this child loaded says about itself (driver API through ctypes)."""
    facts: dict[str, Any] = {}
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        facts["driver_error"] = str(e)
        return facts
    v = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(v)) == CUDA_SUCCESS:
        facts["driver_version"] = v.value
    rc = cuda.cuInit(0)
    facts["cuInit"] = rc
    if rc == CUDA_SUCCESS:
        n = ctypes.c_int(0)
        if cuda.cuDeviceGetCount(ctypes.byref(n)) == CUDA_SUCCESS and n.value > 0:
            dev = ctypes.c_int(0)
            cuda.cuDeviceGet(ctypes.byref(dev), 0)
            name = ctypes.create_string_buffer(256)
            cuda.cuDeviceGetName(name, 256, dev)
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76
            cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)
            cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
            facts.update(gpu_name=name.value.decode(errors="replace"),
                         compute_capability=f"{major.value}.{minor.value}", device_count=n.value)
    facts["libcuda_file"] = loaded_file("libcuda.so")
    return facts


def fingerprint(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    fp = driver_facts()
    fp["runtime_file"] = loaded_file("libcudart.so")
    lc = fp.get("libcuda_file") or ""
    # cuda-compat ships its own libcuda under .../compat/: that is forward compatibility.
    fp["forward_compat"] = "/compat/" in lc
    if extra:
        fp.update(extra)
    return fp


# --------------------------------------------------------------------- the probe cell


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Load the runtime; report its version, the driver's, the batch symbol, and devices."""
    try:
        rt, how = load_cudart(spec.get("libcudart"))
    except OSError as e:
        msg = str(e)
        if "undefined symbol:" in msg:
            sym = msg.rsplit("undefined symbol:", 1)[1].strip().split()[0]
            return {"outcome": f"undefined-symbol:{sym}", "detail": msg}
        return {"outcome": "harness-error", "detail": f"cannot load the runtime: {msg}"}
    rv, dv = ctypes.c_int(0), ctypes.c_int(0)
    rc_rv = rt.cudaRuntimeGetVersion(ctypes.byref(rv))
    rc_dv = rt.cudaDriverGetVersion(ctypes.byref(dv))
    data: dict[str, Any] = {
        "runtime_version": rv.value if rc_rv == 0 else None,
        "driver_version_runtime": dv.value if rc_dv == 0 else None,
        "batch_exported": hasattr(rt, "cudaMemcpyBatchAsync"),
        "loaded_as": how,
    }
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        data["gpu"] = "skipped:no-cuda-driver"
        return {"outcome": "skipped:no-cuda-driver", "path": "n/a", "data": data,
                "detail": _probe_line(data) + "; no CUDA driver here, GPU part skipped"}
    count = ctypes.c_int(0)
    rc = rt.cudaGetDeviceCount(ctypes.byref(count))
    data["fingerprint"] = fingerprint()
    if rc != 0:
        rt.cudaGetErrorName.restype = ctypes.c_char_p
        name = (rt.cudaGetErrorName(rc) or b"?").decode()
        data["device_count"] = None
        return {"outcome": f"cuda-error:{rc}", "error_name": name, "data": data,
                "detail": f"{_probe_line(data)}; cudaGetDeviceCount -> {name} ({rc})"}
    data["device_count"] = count.value
    return {"outcome": "ok", "path": "n/a", "data": data,
            "detail": f"{_probe_line(data)}; {count.value} device(s)"}


def _probe_line(d: dict[str, Any]) -> str:
    return (f"cudaRuntimeGetVersion={d['runtime_version']} cudaDriverGetVersion={d['driver_version_runtime']} "
            f"cudaMemcpyBatchAsync={'exported' if d['batch_exported'] else 'absent'}")


# --------------------------------------------------------------------- entry point


_PR_SET_DUMPABLE = 4


def make_private() -> None:
    """Make this process non-dumpable: other processes of the same user (a command cell of
    another worker) can then neither open its ``/proc/PID/fd`` (the verdict pipe) nor read its
    ``/proc/PID/environ`` or memory, nor attach to it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def main(argv: list[str]) -> int:
    make_private()  # before anything else: the verdict pipe is open from the start
    faulthandler.enable()
    channel = protocol.take_channel()
    if len(argv) != 1:
        sys.stderr.write("usage: python3 -m cumatrix.child.case '<spec json>'\n")
        return 2
    spec = json.loads(argv[0])
    kind = spec.get("kind")
    try:
        if kind == "probe":
            verdict = probe(spec)
        elif kind == "swap":
            # deferred: swapcell (with statistics, random) costs ~25 ms in every probe cell's child otherwise
            from cumatrix.child import swapcell

            verdict = swapcell.run(spec)
            if verdict.get("outcome") not in ("harness-error",) and not str(verdict.get("outcome", "")).startswith("skipped"):
                verdict.setdefault("data", {})["fingerprint"] = fingerprint()
        else:
            verdict = {"outcome": "harness-error", "detail": f"unknown cell kind {kind!r}"}
    except Exception as e:  # noqa: BLE001 - the harness's own child code failed: say so, with the traceback
        traceback.print_exc()
        verdict = {"outcome": "harness-error", "detail": f"{type(e).__name__}: {e}"}
    if not protocol.emit(verdict, environ=channel):
        sys.stdout.write(protocol.encode(verdict).decode())  # run by hand: show it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
