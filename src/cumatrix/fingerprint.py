"""The host fingerprint: which driver, which GPUs, which runtimes, which daemon."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any

from .cache import cache_root


def _driver_via_cuda_python() -> dict[str, Any] | None:
    """Driver version, GPUs and compute capability through cuda-python's driver bindings."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return None
    out: dict[str, Any] = {"via": "cuda.bindings.driver"}
    try:
        err, version = cu.cuDriverGetVersion()
    except (RuntimeError, OSError) as e:  # no libcuda.so.1: the bindings cannot load it
        out["error"] = str(e).splitlines()[0][:200]
        return out
    if err != cu.CUresult.CUDA_SUCCESS:
        out["error"] = f"cuDriverGetVersion -> {err}"
        return out
    out["driver_version"] = int(version)
    (err,) = cu.cuInit(0)
    if err != cu.CUresult.CUDA_SUCCESS:
        out["cuInit"] = int(err)
        return out
    err, count = cu.cuDeviceGetCount()
    gpus = []
    for i in range(count if err == cu.CUresult.CUDA_SUCCESS else 0):
        _, dev = cu.cuDeviceGet(i)
        _, name = cu.cuDeviceGetName(256, dev)
        _, major = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, minor = cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        gpus.append({"name": name.split(b"\0", 1)[0].decode(errors="replace"), "compute_capability": f"{major}.{minor}"})
    out["gpus"] = gpus
    return out


def _driver_via_ctypes() -> dict[str, Any] | None:
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return {"via": "ctypes"}
    return {"via": "ctypes", "driver_version": v.value}


def driver_string() -> str | None:
    """The kernel module's version line (NVML where present, else /proc)."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return f"NVIDIA driver {v.decode() if isinstance(v, bytes) else v} (NVML)"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML absent or unusable: fall through to /proc (pynvml raises its own NVMLError family)
        pass
    p = Path("/proc/driver/nvidia/version")
    if p.is_file():
        return p.read_text(errors="replace").splitlines()[0].strip()
    return None


def docker_status() -> dict[str, Any]:
    try:
        import docker
    except ImportError:
        return {"answers": False, "why": "docker SDK not installed"}
    try:
        client = docker.from_env(timeout=3)
        v = client.version()
        info = client.info()
        return {"answers": True, "version": v.get("Version"), "runtimes": sorted(info.get("Runtimes", {}))}
    except Exception as e:  # docker.errors.DockerException and requests' errors: the daemon does not answer
        return {"answers": False, "why": str(e).splitlines()[0][:200]}


def forward_compat_in_use() -> bool:
    """Whether a cuda-compat libcuda is what the loader would pick first."""
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if d and "compat" in d and any(Path(d).glob("libcuda.so*")):
            return True
    return False


def host_fingerprint(*, with_docker: bool = False) -> dict[str, Any]:
    fp: dict[str, Any] = {"hostname": socket.gethostname(), "platform": platform.platform(),
                          "python": platform.python_version()}
    drv = _driver_via_cuda_python() or _driver_via_ctypes()
    fp["driver_version"] = drv.get("driver_version") if drv else None
    fp["driver_via"] = drv.get("via") if drv else None
    if drv and drv.get("error"):
        fp["driver_error"] = drv["error"]
    fp["gpus"] = drv.get("gpus", []) if drv else []
    fp["driver_string"] = driver_string()
    fp["forward_compat"] = forward_compat_in_use()
    if with_docker:
        fp["docker"] = docker_status()
    return fp


def cached_runtimes() -> list[dict[str, Any]]:
    import json

    root = cache_root() / "runtimes"
    out = []
    for meta in sorted(root.glob("*/.cumatrix-runtime.json")) if root.is_dir() else []:
        info = json.loads(meta.read_text())
        out.append({"wheel": meta.parent.name, "version": info.get("version"), "batch": info.get("batch")})
    return out
