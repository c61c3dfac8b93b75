"""Compile the reference swap's variants with gcc against a runtime wheel's headers.

Each variant is one shared library (``libkvswap-<name>.so``) built from ``reference/``: the
variant's own source, linked with the translation units it shares (:data:`SOURCES`).
Builds are cached under ``<cache>/builds/`` by a content hash of the sources, the
headers, the compiler and the flags, so unchanged inputs never rebuild.  A failed
compile is cached too: it is an outcome (``build-error``), not an accident.  Builds run
in a private temporary directory that is renamed into place, so concurrent builds of
the same key are safe (the loser uses the winner's result).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cumatrix.core.cache import cache_dir
from cumatrix.core.errors import EnvironmentProblem, HarnessError, UsageError, did_you_mean
from cumatrix.core.model import VARIANT_FAMILIES, CudaVersion
from cumatrix.provision.runtimes import headers_for

#: What every library links besides its own source: the state all variants share (the chunk limit).
COMMON_SOURCES: tuple[str, ...] = ("kvswap_common.c",)
#: Library name -> the C translation units in the reference directory it is built from: the
#: variant's own source first, then the shared ones (proc-address's copy-kernel path is
#: ``kernel_path.c``).
SOURCES: dict[str, tuple[str, ...]] = {
    "proc-address": ("proc_address.c", "kernel_path.c", *COMMON_SOURCES),
    "direct-link": ("direct_link.c", *COMMON_SOURCES),
    "driver-loop": ("driver_loop.c", *COMMON_SOURCES),
    "runtime-dispatch": ("runtime_dispatch.c", *COMMON_SOURCES),
    "driver-dispatch": ("driver_dispatch.c", *COMMON_SOURCES),
    "header-dispatch": ("header_dispatch.c", *COMMON_SOURCES),
    "runtime-loop": ("runtime_loop.c", *COMMON_SOURCES),
}

#: Flags every variant is compiled with.
CFLAGS: tuple[str, ...] = ("-std=gnu11", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
                           "-fvisibility=hidden")
#: Correct variants must resolve everything outside libc at run time: -z defs proves at link
#: time that no CUDA symbol is left for the dynamic linker.
LINK_CLEAN: tuple[str, ...] = ("-Wl,-z,defs", "-ldl", "-lpthread")
#: direct-link binds cuMemcpyBatchAsync at load (as vLLM PR 38460 did), against a link stub.
LINK_DIRECT: tuple[str, ...] = ("-Wl,-z,now", "-Lstubs", "-lcuda", "-ldl", "-lpthread")

_CUDA_VERSION_RE = re.compile(r"^\s*#\s*define\s+CUDA_VERSION\s+(\d+)\s*$", re.MULTILINE)

# A build-time link stub standing in for the CUDA toolkit's stubs/libcuda.so: it only gives
# the linker the names and the SONAME libcuda.so.1; it is never loaded at run time (the real
# driver is), and it lives outside any library search path of the built variant.
_LINK_STUB_C = """\
/* Build-time link stub for libcuda.so.1 (the role of the toolkit's stubs/libcuda.so). */
int cuMemcpyBatchAsync(void) { return 999; }
int cuMemcpyBatchAsync_v2(void) { return 999; }
int cuGetErrorName(void) { return 999; }
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class BuildResult:
    """What one compile produced: the library, or the compiler's message."""

    ok: bool
    library: Path | None
    log: str
    command: tuple[str, ...]
    cache_hit: bool


def reference_dir() -> Path:
    """Where the reference C sources are: the source checkout, else the package's ``native/``."""
    package = Path(__file__).resolve().parents[1]  # cumatrix/, this file being cumatrix/provision/build.py
    checkout = package.parents[1] / "reference"
    for candidate in (checkout, package / "native"):
        if (candidate / "kvswap.h").is_file():
            return candidate
    raise HarnessError(
        f"the reference C sources are missing (looked for kvswap.h in {checkout} "
        f"and {package / 'native'}); reinstall cumatrix"
    )


def headers_version(include: Path) -> int:
    """``CUDA_VERSION`` from ``include/cuda.h`` (e.g. 12080)."""
    cuda_h = Path(include) / "cuda.h"
    try:
        text = cuda_h.read_text(errors="replace")
    except OSError as e:
        raise HarnessError(f"{cuda_h}: cannot read the CUDA headers ({e.strerror})") from e
    m = _CUDA_VERSION_RE.search(text)
    if not m:
        raise HarnessError(f"{cuda_h}: no `#define CUDA_VERSION` line; not a CUDA cuda.h")
    return int(m.group(1))


def library_name(variant: str, family: str) -> str:
    """The library a (variant, family) builds: ``loop`` becomes ``driver-loop``/``runtime-loop``."""
    if variant == "loop":
        return f"{family}-loop"
    return variant


def library_family(name: str) -> str:
    """``driver`` or ``runtime`` for a library name such as ``proc-address`` or ``runtime-loop``."""
    if name.endswith("-loop"):
        return name[: -len("-loop")]
    return VARIANT_FAMILIES[name][0]


def _check_variant(variant: str, family: str) -> str:
    families = VARIANT_FAMILIES.get(variant)
    if families is None:
        raise UsageError(f"unknown variant {variant!r}{did_you_mean(variant, VARIANT_FAMILIES)}; "
                         f"known: {', '.join(VARIANT_FAMILIES)}")
    if family not in families:
        raise UsageError(f"variant {variant!r} belongs to the {'/'.join(families)} family, not {family!r}")
    return library_name(variant, family)


@functools.lru_cache(maxsize=8)
def _compiler_identity(cc: str) -> str:
    try:
        proc = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except OSError as e:
        raise EnvironmentProblem(f"cannot run the C compiler {cc!r}: {e.strerror}; the reference variants are "
                                 "compiled on this host: install gcc (apt-get install gcc, dnf install gcc)") from e
    first = (proc.stdout or proc.stderr).splitlines()[:1]
    return first[0] if first else cc


#: What the reference sources are made of: translation units (variant sources, ``kernel_path.c``,
#: ``kvswap_common.c``), headers, and the ``.inc`` fragments a variant's source includes (family
#: bodies that define its exported functions).  Every such file is in the build's cache key.
SOURCE_SUFFIXES: tuple[str, ...] = (".c", ".h", ".inc")


def _sources_digest(ref: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(f for f in ref.iterdir() if f.suffix in SOURCE_SUFFIXES):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _headers_digest(include: Path) -> str:
    h = hashlib.sha256()
    for name in ("cuda.h", "cudaTypedefs.h"):
        p = include / name
        h.update(name.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"-") + b"\0")
    return h.hexdigest()


def _command(cc: str, include: Path, ref: Path, sources: tuple[str, ...], out: Path, name: str,
             extra_cflags: tuple[str, ...] = ()) -> tuple[str, ...]:
    link = LINK_DIRECT if name == "direct-link" else LINK_CLEAN
    return (cc, *CFLAGS, *extra_cflags, f"-I{include}", f"-I{ref}", "-o", str(out),
            *(str(ref / source) for source in sources), *link)


def _run(cmd: tuple[str, ...], cwd: Path) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    except OSError as e:
        raise HarnessError(f"cannot run the C compiler {cmd[0]!r}: {e.strerror}") from e
    return proc.returncode, (proc.stderr + proc.stdout).strip()


def build_variant(variant: str, family: str, headers: Path, *, cache: Path | None = None,
                  cc: str = "gcc", extra_cflags: tuple[str, ...] = ()) -> BuildResult:
    """Build ``variant`` of ``family`` against the CUDA ``headers`` (an ``include/`` dir).

    ``variant`` is a name of :data:`cumatrix.core.model.VARIANT_FAMILIES` (``loop`` picks the
    family's loop).  ``extra_cflags`` follow :data:`CFLAGS` (a sanitizer build, for example:
    ``("-fsanitize=thread", "-g", "-O1")``) and are part of the cache key.  A compile failure is
    returned (``ok=False``, the compiler's message in ``log``), not raised; a missing compiler or
    unreadable headers raise :class:`HarnessError`.
    """
    name = _check_variant(variant, family)
    include = Path(headers).resolve()
    version = headers_version(include)
    ref = reference_dir()
    ident = _compiler_identity(cc)
    key_src = json.dumps({"name": name, "sources": _sources_digest(ref), "headers": _headers_digest(include),
                          "cuda": version, "cc": [cc, ident], "cflags": (*CFLAGS, *extra_cflags),
                          "link": LINK_DIRECT if name == "direct-link" else LINK_CLEAN, "stub": _LINK_STUB_C},
                         sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:20]
    root = cache if cache is not None else cache_dir("builds")
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{name}-h{CudaVersion.from_int(version)}-{key}"
    lib_name = f"libkvswap-{name}.so"
    hit = _load(final, lib_name, cache_hit=True)
    if hit is not None:
        return hit

    tmp = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=root))
    try:
        log_parts: list[str] = []
        ok = True
        if name == "direct-link":
            (tmp / "stubs").mkdir()
            (tmp / "stubs" / "libcuda_stub.c").write_text(_LINK_STUB_C)
            stub_cmd = (cc, "-O2", "-fPIC", "-shared", "-Wl,-soname,libcuda.so.1", "-o", "stubs/libcuda.so",
                        "stubs/libcuda_stub.c")
            rc, out = _run(stub_cmd, tmp)
            if rc != 0:
                raise HarnessError(f"cannot build the libcuda link stub: {out[-500:]}")
        cmd = _command(cc, include, ref, SOURCES[name], tmp / lib_name, name, tuple(extra_cflags))
        rc, out = _run(cmd, tmp)
        ok = rc == 0
        log_parts.append(out)
        recorded = tuple(a.replace(str(tmp), str(final)) for a in cmd)
        (tmp / "build.json").write_text(json.dumps({"ok": ok, "log": "\n".join(log_parts), "command": recorded,
                                                    "cuda": version}, indent=1))
        with contextlib.suppress(OSError):  # another process finished the same build first: use theirs
            tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    result = _load(final, lib_name, cache_hit=False)
    if result is None:
        raise HarnessError(f"{final}: the build left no result (disk full or removed while building?)")
    return result


def _load(final: Path, lib_name: str, *, cache_hit: bool) -> BuildResult | None:
    meta = final / "build.json"
    if not meta.is_file():
        return None
    info = json.loads(meta.read_text())
    library = final / lib_name
    ok = bool(info["ok"]) and library.is_file()
    return BuildResult(ok=ok, library=library if ok else None, log=str(info["log"]),
                       command=tuple(info["command"]), cache_hit=cache_hit)


def _chosen_variant(variant: str, family: str | None) -> tuple[str, str | None]:
    """The library ``variant`` names (``loop`` with a family is that family's), and why it is
    refused (None: it is not)."""
    if variant == "loop" and family in ("driver", "runtime"):
        variant = f"{family}-loop"
    if variant == "loop":
        return variant, "`loop` exists in both families; say driver-loop or runtime-loop"
    if variant not in SOURCES:
        return variant, f"unknown variant {variant!r}{did_you_mean(variant, SOURCES)}; known: {', '.join(SOURCES)}"
    if family is not None and family != library_family(variant):
        return variant, f"{variant} is a {library_family(variant)}-family variant, not {family}"
    return variant, None


def cli_build(variant: str, headers_version: str, wheel_dir: Path | None, *, family: str | None = None) -> int:
    """``cumatrix build VARIANT [--headers X.Y]``: print the library path last, or the compiler's message.

    ``variant`` is a library name (``proc-address``, ``driver-loop``, ``runtime-loop``, ...), or
    ``loop`` together with ``family``.
    Returns 0 (built), 1 (``build-error``: the compiler refused the source) or 2 (bad input).
    """
    variant, problem = _chosen_variant(variant, family)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    family = library_family(variant)
    base = "loop" if variant.endswith("-loop") else variant
    try:
        include = headers_for(headers_version, wheel_dir=wheel_dir)
        result = build_variant(base, family, include)
    except ValueError as e:
        print(f"error: --headers {headers_version!r}: {e}", file=sys.stderr)
        return 2
    print(" ".join(result.command))
    if not result.ok:
        print(result.log)
        print(f"build-error: {variant} does not compile against CUDA {headers_version} headers")
        return 1
    if result.log:
        print(result.log)
    print(result.library)
    return 0
