"""Host facts, found in one place: the real ``libcuda.so.1`` (ordered search steps that
record where they looked), the driver's version and GPUs, the C compiler's identity, the
``CUDA_VERSION`` of a header directory, the Docker daemon, and the fingerprint every run
records from them.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cumatrix.core.cache import cache_root

# --------------------------------------------------------------------------- the real driver


@dataclass(frozen=True, kw_only=True, slots=True)
class FoundLibcuda:
    """A real ``libcuda.so.1`` and the search step that found it."""

    path: Path  # absolute, symlinks resolved
    found_by: str


@dataclass
class SearchLog:
    """What a search tried, in order, so that "not found" can list every place."""

    tried: list[str] = field(default_factory=list)

    def note(self, where: str) -> None:
        self.tried.append(where)

    def not_found(self, what: str) -> str:
        return f"{what} not found; looked in: " + "; ".join(self.tried) if self.tried else f"{what} not found"


Step = Callable[[SearchLog], FoundLibcuda | None]
_LDCONFIG_RE = re.compile(r"^\s*libcuda\.so\.1\s+\((?P<tags>[^)]*)\)\s+=>\s+(?P<path>\S+)\s*$")


def _find_in_ldconfig(log: SearchLog) -> FoundLibcuda | None:
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if Path("/sbin/ldconfig").exists() else None)
    if ldconfig is None:
        log.note("ldconfig -p (no ldconfig)")
        return None
    log.note(f"{ldconfig} -p")
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    want = "x86-64" if platform.machine() == "x86_64" else ""
    for line in out.splitlines():
        m = _LDCONFIG_RE.match(line)
        if m and want in m["tags"] and Path(m["path"]).is_file():
            return FoundLibcuda(path=Path(m["path"]).resolve(), found_by=f"ldconfig -p ({m['path']})")
    return None


def _find_in_dirs(dirs: tuple[str, ...], label: str) -> Step:
    def step(log: SearchLog) -> FoundLibcuda | None:
        for d in dirs:
            p = Path(d) / "libcuda.so.1"
            log.note(str(p))
            if p.is_file():
                return FoundLibcuda(path=p.resolve(), found_by=f"{label} ({p})")
        return None
    step.__name__ = f"_find_in_{label.replace(' ', '_')}"
    return step


#: Ordered search for the host's real driver; the first hit wins.
LIBCUDA_STEPS: tuple[Step, ...] = (
    _find_in_ldconfig,
    _find_in_dirs(("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib/x86_64-linux-gnu",
                   "/lib64"), "standard dirs"),
    _find_in_dirs(("/usr/local/nvidia/lib64",), "nvidia container toolkit dir"),
    _find_in_dirs(("/usr/lib/wsl/lib",), "WSL dir"),
)


def search_real_libcuda(log: SearchLog | None = None) -> FoundLibcuda | None:
    """Run :data:`LIBCUDA_STEPS` in order; the hit records which step found it, ``log`` what was tried."""
    log = log if log is not None else SearchLog()
    for step in LIBCUDA_STEPS:
        hit = step(log)
        if hit is not None:
            return hit
    return None


def find_real_libcuda() -> Path | None:
    """The host's real ``libcuda.so.1`` (absolute, resolved), or ``None`` where there is none."""
    hit = search_real_libcuda()
    return hit.path if hit else None


# --------------------------------------------------------------------------- compiler and headers


def compiler_identity(cc: str = "gcc") -> str | None:
    """The first line of ``cc --version`` (``gcc (Debian 12.2.0-14) 12.2.0``), or ``None``."""
    path = shutil.which(cc)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out else None


_CUDA_VERSION_RE = re.compile(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)", re.MULTILINE)


def headers_cuda_version(include_dir: Path) -> int | None:
    """``CUDA_VERSION`` of ``include_dir/cuda.h`` (13050 for CUDA 13.5), or ``None``."""
    try:
        m = _CUDA_VERSION_RE.search((include_dir / "cuda.h").read_text(errors="replace"))
    except OSError:
        return None
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- driver and GPUs


def _driver_via_cuda_python() -> dict[str, Any] | None:
    """Driver version, GPUs and compute capability through cuda-python's driver bindings."""
    try:
        from cuda.bindings import driver as cu  # deferred: optional (extra `cuda`); absent is a finding
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
    nvml = _nvml_driver_version()
    if nvml:
        return f"NVIDIA driver {nvml} (NVML)"
    p = Path("/proc/driver/nvidia/version")
    if p.is_file():
        return p.read_text(errors="replace").splitlines()[0].strip()
    return None


def _nvml_driver_version() -> str | None:
    """The driver version through NVML (nvidia-ml-py), or ``None`` where NVML is absent or unusable."""
    try:
        import pynvml  # deferred: optional (nvidia-ml-py, not a dependency); absent is a finding
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError):
        return None
    try:
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def docker_status() -> dict[str, Any]:
    try:
        # deferred: the docker SDK costs ~170 ms to import; only with_docker=True (doctor, the docker
        # backend) asks, and a missing SDK is reported, not raised
        import docker
        import requests.exceptions
    except ImportError:
        return {"answers": False, "why": "docker SDK not installed"}
    try:
        client = docker.from_env(timeout=3)
        try:
            v = client.version()
            info = client.info()
        finally:
            client.close()
        return {"answers": True, "version": v.get("Version"), "runtimes": sorted(info.get("Runtimes", {}))}
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as e:  # no daemon
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
    root = cache_root() / "runtimes"
    out = []
    for meta in sorted(root.glob("*/.cumatrix-runtime.json")) if root.is_dir() else []:
        info = json.loads(meta.read_text())
        out.append({"wheel": meta.parent.name, "version": info.get("version"), "batch": info.get("batch")})
    return out


def gpu_absent_reason() -> str | None:
    """Why no GPU can be used here (no driver, ``cuInit`` fails), or ``None``: what a command
    that needs a GPU (``calibrate``, the swap benchmark) and the GPU tests' skip say."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no NVIDIA driver: libcuda.so.1 cannot be loaded ({e})"
    rc = lib.cuInit(0)
    return None if rc == 0 else f"cuInit failed with CUresult {rc} (no usable GPU)"
