"""The emulated driver as a cell's only libcuda, by every name the loader may search.

A cell under ``emulated-X.Y`` gets the interposer first on ``LD_LIBRARY_PATH``
(:mod:`cumatrix.provision.drivers`), with every name of libcuda in its directory.  That is all
a process without a mount namespace of its own can be given, and it is walked around by what
the loader searches before ``LD_LIBRARY_PATH`` (a binary's ``DT_RPATH``) or instead of it (a
full path).  A cell with its own mount namespace (the sandbox: bubblewrap or the fork server;
a container) gets more: the interposer bound over every ``libcuda.so*`` file of every directory
the loader or a driver lookup may search (the ld cache's, glibc's default ones, the NVIDIA
container toolkit's, WSL's, the CUDA forward-compatibility packages', the real driver's own),
and the real driver bound at :data:`~cumatrix.provision.drivers.PRIVATE_DRIVER_PATH`, where
only the interposer looks.  ``DT_RPATH``, ``DT_RUNPATH``, the ld cache, ``LD_LIBRARY_PATH`` and
full paths then all lead to the emulated driver (docs/emulation.md says what still does not).
"""

# Paths stay strings here, as in the sandbox module whose operations this adds to.
# ruff: noqa: PTH113, PTH118, PTH119, PTH120, PTH207, PTH208

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cumatrix.execute.docker_gpu import GpuAccess, device_nodes, driver_libraries
from cumatrix.provision.drivers import PRIVATE_DRIVER_PATH, libcuda_names

if TYPE_CHECKING:
    from cumatrix.core.jobs import Job

#: Directories searched for libcuda beyond the ld cache: glibc's defaults (Debian and Red Hat
#: layouts), the NVIDIA container toolkit's, WSL's and the CUDA forward-compatibility package's.
SEARCHED_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib", "/lib",
                 "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib", "/usr/local/cuda/compat")
#: The directories inside a container where the interposer stands under every name of libcuda
#: (the image's own library directories and the NVIDIA container toolkit's).
CONTAINER_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64")
_NAME_RE = re.compile(r"^libcuda\.so(?:\.\d+)*$")


@functools.lru_cache(maxsize=1)
def ld_cache_dirs() -> tuple[str, ...]:
    """The directories the ld cache (``ldconfig -p``, read from ``/etc/ld.so.cache``) names a
    libcuda in (looked up once per harness process)."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    dirs = []
    for line in out.splitlines():
        name, arrow, path = line.partition("=>")
        words = name.split()
        if arrow and words and _NAME_RE.match(words[0]):
            dirs.append(os.path.dirname(path.strip()))
    return tuple(dict.fromkeys(dirs))


@functools.lru_cache(maxsize=8)
def driver_files(real_driver: str, interposer: str = "") -> tuple[str, ...]:
    """Every file a process may load as libcuda on this host: each ``libcuda.so*`` entry of the
    searched directories (the ld cache's, :data:`SEARCHED_DIRS`, ``/usr/local/cuda*/compat``,
    the real driver's own), resolved to the regular file it names; never ``interposer``."""
    dirs = [*ld_cache_dirs(), *SEARCHED_DIRS, *sorted(glob.glob("/usr/local/cuda*/compat")),
            os.path.dirname(real_driver), os.path.dirname(os.path.realpath(real_driver))]
    own = os.path.realpath(interposer) if interposer else ""
    found: set[str] = set()
    for d in dict.fromkeys(dirs):
        try:
            names = [e for e in os.listdir(d) if _NAME_RE.match(e)]
        except OSError:
            continue
        for e in names:
            target = os.path.realpath(os.path.join(d, e))
            if target != own and os.path.isfile(target):
                found.add(target)
    return tuple(sorted(found))


def sandbox_ops(interposer: str, real_driver: str, visible: Callable[[str], bool]) -> list[str]:
    """bubblewrap's operations (and the fork server's) that make the interposer the cell's only
    libcuda: the real driver bound at the private path, the interposer over every driver file
    the cell can see (``visible``: inside what the sandbox shows).  Bound over the files the
    names resolve to, never over a symbolic link (bubblewrap follows one in the new root)."""
    if not interposer or not real_driver or not os.path.isfile(real_driver):
        return []
    out = ["--perms", "0755", "--dir", os.path.dirname(PRIVATE_DRIVER_PATH),
           "--ro-bind", os.path.realpath(real_driver), PRIVATE_DRIVER_PATH]
    for f in driver_files(real_driver, interposer):
        if visible(f):
            out += ["--ro-bind", interposer, f]
    return out


def container_mounts(interposer: str, real_driver: str, libraries: tuple[tuple[str, str], ...]
                     ) -> list[tuple[str, str]]:
    """(host file, path inside) to bind into a container for an emulated driver: the real driver
    at the private path, the interposer under every name of libcuda in :data:`CONTAINER_DIRS`
    and in place of each libcuda among ``libraries`` (the driver's files a GPU without the
    NVIDIA runtime gets mounted, :func:`cumatrix.execute.docker_gpu.driver_libraries`)."""
    if not interposer or not real_driver or not os.path.isfile(real_driver):
        return []
    out = [(os.path.realpath(real_driver), PRIVATE_DRIVER_PATH)]
    names = libcuda_names(Path(real_driver))
    out += [(interposer, f"{d}/{n}") for d in CONTAINER_DIRS for n in names]
    out += [(interposer, inside) for _, inside in libraries if _NAME_RE.match(os.path.basename(inside))]
    return list(dict.fromkeys(out))


def container_gpu(gpu: GpuAccess, job: Job) -> GpuAccess:
    """How ``job``'s container reaches the GPU (``gpu``: the backend's way).  An emulated
    driver's cell under the NVIDIA runtime gets the device nodes and the driver's libraries from
    cumatrix instead, as a host without the runtime does: the toolkit's hook mounts the real
    libcuda after the container's own mounts, over the interposer's place."""
    if job.interposer and gpu.mode == "nvidia-runtime" and os.path.isfile(job.real_driver):
        return GpuAccess(mode="device-nodes", devices=device_nodes(), libraries=driver_libraries(Path(job.real_driver)),
                         detail="emulated driver: device nodes and driver libraries bound by cumatrix")
    return gpu


def container_files(gpu: GpuAccess, job: Job, with_gpu: bool) -> list[tuple[str, str]]:
    """(host file, path inside) of the driver bound into ``job``'s container: the device-nodes
    mode's libraries; under an emulated driver the interposer in place of every libcuda and the
    real one where only the interposer looks (:func:`container_mounts`)."""
    libs = list(gpu.libraries) if with_gpu and gpu.mode == "device-nodes" else []
    if not job.interposer:
        return libs
    swap = container_mounts(job.interposer, job.real_driver, tuple(libs))
    covered = {inside for _, inside in swap}
    return [*(lib for lib in libs if lib[1] not in covered), *swap]


def job_ops(job: Job | None, visible: Callable[[str], bool]) -> list[str]:
    """:func:`sandbox_ops` for ``job`` (none for no job, or one on the host's driver)."""
    return sandbox_ops(job.interposer, job.real_driver, visible) if job is not None else []


#: How a cell is held where it has a mount namespace of its own (``extra["sandbox"]`` of a
#: local cell; a container always has one).
_NAMESPACED = ("bubblewrap", "namespaces")
#: What a run's header and each emulated cell's record say where cells have no mount namespace.
SEARCH_PATH_ONLY = ("emulation: no mount namespace of the cell's own (--no-sandbox, or no sandbox on this "
                    "host), so the emulated driver follows the search path only: LD_LIBRARY_PATH holds the "
                    "interposer under every name of libcuda, but a binary whose DT_RPATH names the real driver's "
                    "directory, or a program that loads the real driver by its full path, reaches the real driver; "
                    "run sandboxed (the default where bubblewrap runs) or with --backend docker")


def emulation_evidence(driver: str, extra: dict[str, object] | None) -> tuple[str, ...]:
    """:data:`SEARCH_PATH_ONLY` for a local cell under an emulated driver held without a mount
    namespace (``extra``: its child's), else nothing."""
    if not driver.startswith("emulated-") or extra is None or extra.get("backend") == "docker":
        return ()
    if "sandbox" in extra and extra["sandbox"] in _NAMESPACED:
        return ()
    return (SEARCH_PATH_ONLY,)


def emulation_header(backend: str, sandbox: str | None, emulates: bool) -> dict[str, str]:
    """The run header's ``driver_emulation`` where a matrix that emulates a driver runs local
    cells without a mount namespace (``sandbox``: how they are held)."""
    if not emulates or backend != "local" or sandbox is None or sandbox in _NAMESPACED:
        return {}
    return {"driver_emulation": "search-path-only: " + SEARCH_PATH_ONLY.split(": ", 1)[1]}
