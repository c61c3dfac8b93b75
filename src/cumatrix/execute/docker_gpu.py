"""How containers reach the host's GPU: the NVIDIA runtime, or device nodes and driver libraries."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where the host's driver libraries are mounted in a container (device-nodes mode).
DRIVER_LIB_DIR = "/usr/local/cumatrix-driver/lib"
_DRIVER_LIB_PATTERNS = ("libcuda.so*", "libnvidia-ptxjitcompiler.so*", "libnvidia-*.so*")


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuAccess:
    """How containers see the host's GPU: ``nvidia-runtime``, ``device-nodes`` or ``none``."""

    mode: str
    devices: tuple[str, ...] = ()  # "host:container:rwm", device-nodes mode only
    libraries: tuple[tuple[str, str], ...] = ()  # (host file, path inside), device-nodes mode only
    detail: str = ""




def _ldconfig_libcuda() -> Path | None:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if line.strip().startswith("libcuda.so.1 ") and "=>" in line:
            return Path(line.split("=>", 1)[1].strip())
    return None


def _find_libcuda(search_dirs: tuple[Path, ...]) -> Path | None:
    for d in search_dirs:
        p = d / "libcuda.so.1"
        if p.exists():
            return p
    return _ldconfig_libcuda() if not search_dirs else None


def driver_libraries(libcuda: Path) -> tuple[tuple[str, str], ...]:
    """The driver's user-mode libraries next to ``libcuda``, of the same driver version.

    Returns (host file, path inside the container) pairs: every name in the directory that
    resolves to one of those files (``libcuda.so.1`` -> ``libcuda.so.580.159.04``) is
    mounted under :data:`DRIVER_LIB_DIR`, so the SONAME links exist inside as well.
    """
    real = libcuda.resolve()
    m = re.search(r"\.so\.(\d+(?:\.\d+)+)$", real.name)
    version = m.group(1) if m else None
    out: dict[str, str] = {}
    for pattern in _DRIVER_LIB_PATTERNS:
        for entry in sorted(libcuda.parent.glob(pattern)):
            target = entry.resolve()
            if not target.is_file():
                continue
            # Libraries of another driver version left behind by an upgrade do not load with this one.
            if version and not target.name.endswith(f".so.{version}"):
                continue
            out.setdefault(entry.name, str(target))
    return tuple((host, f"{DRIVER_LIB_DIR}/{name}") for name, host in sorted(out.items()))


def device_nodes(dev_dir: Path = Path("/dev")) -> tuple[str, ...]:
    """The GPU's device nodes as docker's ``devices`` take them (``host:inside:rwm``):
    ``/dev/nvidia*`` and ``/dev/nvidia-caps/*``."""
    nodes = sorted(p for p in dev_dir.glob("nvidia*") if not p.is_dir())
    nodes += sorted(p for p in (dev_dir / "nvidia-caps").glob("*") if not p.is_dir())
    return tuple(f"{p}:{p}:rwm" for p in nodes)


def detect_gpu(info: dict[str, Any], *, dev_dir: Path = Path("/dev"),
               lib_dirs: tuple[Path, ...] = ()) -> GpuAccess:
    """Choose how containers reach the GPU, from ``docker info`` and the host's files."""
    if "nvidia" in (info.get("Runtimes") or {}):
        return GpuAccess(mode="nvidia-runtime", detail="daemon has the nvidia runtime: --gpus all")
    # `--gpus` needs only the toolkit's prestart hook, registered runtime or not.
    hook = shutil.which("nvidia-container-runtime-hook")
    if hook and (dev_dir / "nvidiactl").exists():
        return GpuAccess(mode="nvidia-runtime", detail=f"NVIDIA container toolkit hook at {hook}: --gpus all")
    nodes = device_nodes(dev_dir)
    libcuda = _find_libcuda(lib_dirs)
    if nodes and libcuda is not None:
        libs = driver_libraries(libcuda)
        return GpuAccess(mode="device-nodes", devices=nodes, libraries=libs,
                         detail=f"{len(nodes)} device node(s), {len(libs)} driver librar(ies) from {libcuda.parent}")
    why = "no /dev/nvidia* device" if not nodes else "no libcuda.so.1 on the host"
    return GpuAccess(mode="none", detail=f"no GPU in containers: {why}")
