"""Provision CUDA runtimes: a pip wheel, an environment built from requirements, or this Python's.

A wheel runtime is downloaded once (``pip download --no-deps``), unpacked safely under
``<cache>/runtimes/<wheel stem>-<sha256>/`` and described by a :class:`ResolvedRuntime`:
the directory holding ``libcudart.so.*``, its ``include/`` and its version.

No code from a wheel runs on the host outside a cell.  The version is data: the release
in the wheel's ``METADATA`` (12.9.79 -> CUDA's encoding 12090), checked against what the
library says about itself without being loaded: its ``DT_SONAME`` (the major), a file
name carrying the full release where there is one (``libcudart.so.12.9.79``), and, on
x86-64, the constant that ``cudaRuntimeGetVersion`` stores (read from the code bytes).
Loading the library to ask it would run its constructors in the harness's process.

An environment runtime (``{requirements: [...]}``) is a virtual environment built by uv
once per content hash, hard-linked from uv's cache; its ``libcudart`` is the cell's runtime.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from cumatrix.core.cache import cache_dir
from cumatrix.core.cache import wheel_dir as default_wheel_dir
from cumatrix.core.errors import ConfigError, RuntimeNotFound, UnsafeArchive
from cumatrix.core.model import CudaVersion, Runtime
from cumatrix.core.wheelname import maybe_wheel_name
from cumatrix.load.requirements import (
    KNOWN_WHEELS,
    WheelPin,
    check_env_requirement,
    matrix_headers_wheel,
    parse_requirement,
    wheel_pin,
)
from cumatrix.provision.environments import (
    build_environment,
    built_environment,
    candidate_wheels,
    env_site_packages,
    environment_hash,
    uv_binary,
)
from cumatrix.provision.wheelfiles import CUDART_MEMBER, WheelReading, check_members, read_wheel, unpack_wheel

# re-exported: the loader, provision.environments and provision.wheelfiles own them
__all__ = ["KNOWN_WHEELS", "build_environment", "candidate_wheels", "check_env_requirement", "check_members",
           "env_site_packages", "environment_hash", "parse_requirement", "unpack_wheel", "uv_binary"]


@dataclass(frozen=True, kw_only=True, slots=True)
class LibraryFacts:
    """What a ``libcudart`` says about itself, read as data (never loaded)."""

    soname: str | None
    soname_major: int | None
    file_release: str | None  # from a file name such as libcudart.so.12.9.79
    code_version: int | None  # the constant cudaRuntimeGetVersion stores (x86-64), when unique
    batch_exported: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedRuntime:
    """One runtime of a matrix, resolved in one step (:func:`from_pin`, :func:`resolve_installed`;
    once per run, by :class:`~cumatrix.provision.runtimeset.RuntimeSet`): everything the oracle
    (its version) and the executor (the library, its directory, an environment's variables) need
    of it, with what it was established from (the wheel file, the library's own facts)."""

    name: str
    lib_dir: Path
    libcudart: Path
    include_dir: Path | None
    version: int  # CUDA's encoding, e.g. 12090 (what cudaRuntimeGetVersion returns)
    wheel_version: str | None
    found_by: str  # which search step found it
    #: How the version was established, e.g. "METADATA 12.9.79; DT_SONAME libcudart.so.12; code 12090".
    version_source: str = ""
    batch_exported: bool = False  # .dynsym defines cudaMemcpyBatchAsync
    env_dir: Path | None = None  # an environment runtime's virtual environment
    installed: tuple[str, ...] = ()  # an environment runtime's ``name==version`` list
    soname: str | None = None  # libcudart's DT_SONAME, where it was read already (None: read it from the file)
    wheel: Path | None = None  # a wheel runtime's wheel file, checked against its requirement
    facts: LibraryFacts | None = None  # what the library says about itself, read as data

    @property
    def cuda(self) -> CudaVersion:
        return CudaVersion.from_int(self.version)

    @property
    def typedefs(self) -> Path | None:
        if self.include_dir is None:
            return None
        p = self.include_dir / "cudaTypedefs.h"
        return p if p.is_file() else None

    @property
    def python(self) -> Path | None:
        """An environment runtime's interpreter."""
        return self.env_dir / "bin" / "python" if self.env_dir else None

    def cell_env(self, path: str | None = None) -> tuple[tuple[str, str], ...]:
        """Variables that put a cell inside an environment runtime (its ``bin/`` first on PATH)."""
        if self.env_dir is None:
            return ()
        rest = os.environ.get("PATH", os.defpath) if path is None else path
        return (("VIRTUAL_ENV", str(self.env_dir)), ("PATH", f"{self.env_dir / 'bin'}{os.pathsep}{rest}"))




def cuda_version_of_release(release: str) -> int:
    """A runtime package's release in CUDA's encoding: ``12.9.79`` -> 12090."""
    m = re.match(r"^(\d+)\.(\d+)(?:\.|$)", release)
    if not m:
        raise ValueError(f"not a CUDA release: {release!r} (want MAJOR.MINOR[.PATCH])")
    return int(CudaVersion(int(m.group(1)), int(m.group(2))))


# --------------------------------------------------------------------------- fetching


def find_wheel(directory: Path, name: str, version: str) -> Path | None:
    want = canonicalize_name(name)
    for p in sorted(directory.glob("*.whl")):
        parsed = maybe_wheel_name(p)
        if parsed is not None and parsed.name == want and parsed.is_version(version):
            return p
    return None


def fetch_wheel(requirement: str, *, wheel_dir: Path | None = None) -> Path:
    """Return a local wheel for ``requirement``: from the wheel directory, the cache, or pip.

    The wheel directory is ``wheel_dir``, else ``$CUMATRIX_WHEEL_DIR``; with one, nothing is
    fetched.  ``pip download --only-binary=:all: --no-deps`` runs no code of the package.
    """
    return _fetch(wheel_pin(requirement), wheel_dir)


def _fetch(pin: WheelPin, wheel_dir: Path | None) -> Path:
    requirement, name, version = pin.requirement, pin.name, pin.version
    wheel_dir = default_wheel_dir(wheel_dir)
    for d in ([wheel_dir] if wheel_dir else []) + [cache_dir("wheels")]:
        found = find_wheel(d, name, version)
        if found:
            return found
    if wheel_dir is not None:
        raise RuntimeNotFound(
            f"{requirement}: no matching wheel in {wheel_dir} (--wheel-dir works offline: put the "
            f"wheel there with `cumatrix fetch MATRIX --dest {wheel_dir}`)"
        )
    dest = cache_dir("wheels")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = find_wheel(dest, name, version)
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeNotFound(
            f"{requirement}: pip could not fetch it ({' / '.join(tail) or 'no wheel'}). Check the "
            "name and version on the package index, or pass --wheel-dir DIR holding the wheel."
        )
    return found


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _unpack_cached(wheel: Path, sha256: str | None = None) -> Path:
    """The wheel unpacked under the cache, keyed by its name and content."""
    target = _unpacked_dir(wheel, sha256 or sha256_file(wheel))
    if (target / ".complete").exists():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        unpack_wheel(wheel, tmp / "t")
        (tmp / "t" / ".complete").write_text(wheel.name)
        with contextlib.suppress(OSError):  # another process won the race; use theirs
            (tmp / "t").rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _unpacked_dir(wheel: Path, sha256: str) -> Path:
    return cache_dir("runtimes") / f"{wheel.name[: -len('.whl')]}-{sha256[:12]}"


# --------------------------------------------------------------------------- versions, from data


# `mov DWORD PTR [rdi], imm32` (c7 07 imm32): how every x86-64 libcudart from 12.0 to 13.5 stores
# its version into cudaRuntimeGetVersion's out-parameter.  Only values shaped like CUDA's
# encoding count, and only when exactly one such value appears in executable code.
_STORE_RDI = re.compile(rb"\xc7\x07(....)", re.DOTALL)


def _code_version(elf: object) -> int | None:
    if elf.header["e_machine"] != "EM_X86_64":  # type: ignore[attr-defined]
        return None
    values: set[int] = set()
    for section in elf.iter_sections():  # type: ignore[attr-defined]
        if section["sh_type"] != "SHT_PROGBITS" or not section["sh_flags"] & 0x4:  # SHF_EXECINSTR
            continue
        for m in _STORE_RDI.finditer(section.data()):
            v = struct.unpack("<I", m.group(1))[0]
            if 9000 <= v < 100000 and v % 10 == 0:
                values.add(v)
    return values.pop() if len(values) == 1 else None


def library_facts(libcudart: Path) -> LibraryFacts:
    """Read ``libcudart``'s SONAME, exported symbols and version constant from the file."""
    # deferred: pyelftools costs ~65 ms; only reading a runtime library's own version needs it
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    from cumatrix.binary.elf import elf_defined_symbols, elf_soname

    m = re.search(r"\.so\.(\d+\.\d+\.\d+)$", libcudart.resolve().name)
    try:
        with libcudart.open("rb") as f:
            elf = ELFFile(f)
            soname = elf_soname(elf)
            batch = "cudaMemcpyBatchAsync" in set(elf_defined_symbols(elf))
            code = _code_version(elf)
    except (ELFError, struct.error, ValueError, OSError, AssertionError) as e:
        raise RuntimeNotFound(f"{libcudart}: not a readable ELF library ({type(e).__name__}: {e})") from e
    sm = re.fullmatch(r"libcudart\.so\.(\d+)", soname or "")
    return LibraryFacts(soname=soname, soname_major=int(sm.group(1)) if sm else None,
                        file_release=m.group(1) if m else None, code_version=code, batch_exported=batch)


def library_version(libcudart: Path) -> tuple[int | None, bool]:
    """(the version constant in ``libcudart``'s code or None, exports ``cudaMemcpyBatchAsync``), as data."""
    facts = library_facts(libcudart)
    version = cuda_version_of_release(facts.file_release) if facts.file_release else facts.code_version
    return version, facts.batch_exported


def checked_version(what: str, release: str, facts: LibraryFacts) -> tuple[int, str]:
    """The runtime's version from its package ``release``, cross-checked with the library's own data.

    Returns (CUDA encoding, how it was established); raises :class:`RuntimeNotFound` on disagreement.
    """
    try:
        version = cuda_version_of_release(release)
    except ValueError as e:
        raise RuntimeNotFound(f"{what}: {e}") from e
    cuda = CudaVersion.from_int(version)
    notes = [f"METADATA {release}"]
    disagree: list[str] = []
    if facts.soname_major is None:
        disagree.append(f"its DT_SONAME is {facts.soname!r}, not libcudart.so.<major>")
    elif facts.soname_major != cuda.major:
        disagree.append(f"its DT_SONAME {facts.soname} is of CUDA {facts.soname_major}")
    else:
        notes.append(f"DT_SONAME {facts.soname}")
    if facts.file_release is not None:
        if cuda_version_of_release(facts.file_release) != version:
            disagree.append(f"its file name says {facts.file_release}")
        else:
            notes.append(f"file name {facts.file_release}")
    if facts.code_version is not None:
        if facts.code_version != version:
            disagree.append(f"the version its cudaRuntimeGetVersion stores is {facts.code_version}")
        else:
            notes.append(f"code constant {facts.code_version}")
    if disagree:
        raise RuntimeNotFound(f"{what}: the package says {release} ({version}) but {'; '.join(disagree)}: "
                              "it is not what its name claims")
    return version, "; ".join(notes)


# --------------------------------------------------------------------------- wheel runtimes


def _not_a_runtime(label: str, requirement: str, wheel: Path, why: str) -> RuntimeNotFound:
    return RuntimeNotFound(f"{label}: {requirement} is not a CUDA runtime wheel: {wheel.name} {why} "
                           "(runtime wheels are nvidia-cuda-runtime-cu12 and nvidia-cuda-runtime)")


def _check_metadata(wheel: Path, pin: WheelPin, label: str, meta_name: str, meta_version: str) -> None:
    if canonicalize_name(meta_name) != canonicalize_name(pin.name) or not _same_version(meta_version, pin.version):
        raise RuntimeNotFound(f"{label}: {wheel.name} is {meta_name}=={meta_version} by its METADATA, "
                              f"not {pin.requirement}")


def _same_version(a: str, b: str) -> bool:
    """PEP 440 equality (``12.9.79`` is ``12.9.79.0``), as ``find_wheel`` picked the file by."""
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def check_runtime_wheel(wheel: Path, requirement: str, *, label: str = "") -> str:
    """Check, without unpacking, that ``wheel`` is the CUDA runtime ``requirement`` names; return its libcudart member."""
    return _checked_reading(wheel, wheel_pin(requirement), label or requirement).cudart or ""


def _checked_reading(wheel: Path, pin: WheelPin, label: str) -> WheelReading:
    """The wheel read once, and checked: the release ``pin`` names, a libcudart, every member safe."""
    reading = read_wheel(wheel)
    _check_metadata(wheel, pin, label, reading.name, reading.version)
    if reading.cudart is None:
        raise _not_a_runtime(label, pin.requirement, wheel, "holds no lib/libcudart.so.<N>")
    if reading.unsafe:
        raise UnsafeArchive(reading.unsafe)
    return reading


_FACTS_NOTE = ".cumatrix-wheel-facts.json"


def _checked_wheel(wheel: Path, pin: WheelPin, label: str) -> tuple[Path, str, str, LibraryFacts]:
    """``wheel`` checked against ``pin`` and unpacked: (its directory, the libcudart
    member, its release, that library's facts).

    What the checks found is noted beside the unpacked files, under the wheel's SHA-256: a
    later process (every run, every xdist worker) reads the note instead of opening the
    archive and parsing the library again (0.1 to 0.2 s), unless the library's size or mtime
    changed.  The requirement is compared with the noted name and version every time.
    """
    sha = sha256_file(wheel)
    note = _unpacked_dir(wheel, sha) / _FACTS_NOTE
    try:
        d = json.loads(note.read_text())
        lib = note.parent / str(d["member"])
        st = lib.stat()
        if d["sha256"] == sha and d["library"] == [st.st_size, st.st_mtime_ns]:
            _check_metadata(wheel, pin, label, str(d["name"]), str(d["version"]))
            return note.parent, str(d["member"]), str(d["version"]), LibraryFacts(**d["facts"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no note (or one this version cannot read): check the wheel itself
    reading = _checked_reading(wheel, pin, label)
    member, meta_name, release = reading.cudart or "", reading.name, reading.version
    root = _unpack_cached(wheel, sha)
    facts = library_facts(root / member)
    st = (root / member).stat()
    with contextlib.suppress(OSError):  # a read-only cache costs the next process the checks, not the run
        tmp = note.with_name(f".{note.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"sha256": sha, "name": meta_name, "version": release, "member": member,
                                   "library": [st.st_size, st.st_mtime_ns], "facts": dataclasses.asdict(facts)}))
        tmp.replace(note)
    return root, member, release, facts


def from_wheel(name: str, requirement: str, *, wheel_dir: Path | None = None, where: str = "") -> ResolvedRuntime:
    """A wheel runtime: fetched, checked, unpacked safely; its version read as data."""
    return from_pin(name, wheel_pin(requirement), wheel_dir=wheel_dir, where=where)


def from_pin(name: str, pin: WheelPin, *, wheel_dir: Path | None = None, where: str = "") -> ResolvedRuntime:
    """The wheel runtime ``pin`` names (its requirement read already): fetched, checked against
    the pin, unpacked safely; its version read as data."""
    label = f"{where}: runtimes.{name}" if where else f"runtimes.{name}"
    wheel = _fetch(pin, wheel_dir)
    root, member, release, facts = _checked_wheel(wheel, pin, label)
    lib = root / member
    version, how = checked_version(f"{label} ({pin.requirement})", release, facts)
    meta = root / ".cumatrix-runtime.json"  # read by `cumatrix doctor`
    if not meta.exists():
        meta.write_text(json.dumps({"version": version, "batch": facts.batch_exported, "source": how}))
    inc = lib.parent.parent / "include"
    return ResolvedRuntime(name=name, lib_dir=lib.parent, libcudart=lib,
                           include_dir=inc if (inc / "cuda_runtime_api.h").is_file() else None,
                           version=version, wheel_version=release, found_by=f"wheel {wheel.name}",
                           version_source=how, batch_exported=facts.batch_exported, soname=facts.soname,
                           wheel=wheel, facts=facts)


# --------------------------------------------------------------------------- installed runtimes (site, env)


@dataclass(frozen=True, kw_only=True, slots=True)
class InstalledCudart:
    """A libcudart that an installed distribution owns (from its RECORD), and that distribution."""

    path: Path
    dist: str
    release: str


def find_in_distributions(paths: Sequence[str]) -> Iterator[InstalledCudart]:
    """libcudart files recorded by the distributions installed on ``paths``, in path order.

    Reads ``*.dist-info`` files only: nothing is imported or loaded.
    """
    # deferred: importlib.metadata costs ~15 ms and only this lookup needs it
    from importlib import metadata as importlib_metadata

    for dist in importlib_metadata.distributions(path=list(paths)):
        for f in dist.files or ():
            if CUDART_MEMBER.search(str(f).replace(os.sep, "/")):
                p = Path(str(dist.locate_file(f)))
                if p.is_file():
                    yield InstalledCudart(path=p, dist=str(dist.metadata["Name"]), release=str(dist.version))


@dataclass
class SearchContext:
    """What each search step tried, so that "not found" lists every place."""

    tried: list[str] = field(default_factory=list)


def _find_in_site_packages(ctx: SearchContext) -> tuple[Path, str, str] | None:
    ctx.tried.append("the distributions installed in this Python environment (sys.path)")
    for hit in find_in_distributions(sys.path):
        return hit.path, hit.release, f"site-packages ({hit.dist} {hit.release})"
    return None


def _find_in_cuda_home(ctx: SearchContext) -> tuple[Path, str, str] | None:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(env)
        if not home:
            ctx.tried.append(f"${env} (unset)")
            continue
        ctx.tried.append(f"${env}/lib64 ({home})")
        for lib in sorted(Path(home, "lib64").glob("libcudart.so.*")):
            m = re.search(r"\.so\.(\d+\.\d+\.\d+)$", lib.resolve().name)
            release = m.group(1) if m else _toolkit_release(Path(home))
            if release:
                return lib, release, f"${env}"
    return None


def _toolkit_release(home: Path) -> str | None:
    """``cuda_cudart``'s version in a toolkit's ``version.json``."""
    try:
        data = json.loads((home / "version.json").read_text())
        return str(data["cuda_cudart"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


SITE_STEPS: tuple[Callable[[SearchContext], tuple[Path, str, str] | None], ...] = (
    _find_in_site_packages, _find_in_cuda_home)


def from_site(name: str, *, where: str = "") -> ResolvedRuntime:
    """The runtime installed in this Python environment (what a tox runtime env holds)."""
    label = f"{where}: runtimes.{name}" if where else f"runtimes.{name}"
    ctx = SearchContext()
    for step in SITE_STEPS:
        hit = step(ctx)
        if hit:
            lib, release, how = hit
            facts = library_facts(lib)
            version, source = checked_version(f"{label} ({lib})", release, facts)
            inc = lib.parent.parent / "include"
            return ResolvedRuntime(name=name, lib_dir=lib.parent, libcudart=lib,
                                   include_dir=inc if inc.is_dir() else None, version=version,
                                   wheel_version=release, found_by=how, version_source=source,
                                   batch_exported=facts.batch_exported, facts=facts)
    raise RuntimeNotFound(
        f"{label} is `site: true` but no libcudart is installed in this environment "
        f"(looked in: {'; '.join(ctx.tried)}); pip install nvidia-cuda-runtime-cu12 or nvidia-cuda-runtime"
    )


# --------------------------------------------------------------------------- environment runtimes


def from_environment(name: str, requirements: Sequence[str], *, wheel_dir: Path | None = None,
                     extra_wheels: Sequence[Path] = (), where: str = "") -> ResolvedRuntime:
    """An environment runtime: the env built from ``requirements``; its libcudart is the cell's runtime."""
    label = f"{where}: runtimes.{name}" if where else f"runtimes.{name}"
    env = built_environment(requirements, wheel_dir=wheel_dir, extra_wheels=extra_wheels, what=label)
    env_dir = env.env_dir
    hits = list(find_in_distributions(env.site_packages))
    if not hits:
        raise RuntimeNotFound(f"{label}: the environment {' '.join(requirements)} holds no libcudart "
                              "(add nvidia-cuda-runtime-cu12==X.Y.Z or nvidia-cuda-runtime==X.Y.Z to its requirements)")
    majors = sorted({h.path.name for h in hits})
    if len(majors) > 1:
        raise RuntimeNotFound(f"{label}: the environment holds several runtimes ({', '.join(majors)}): "
                              "a cell can have only one; pin one runtime package")
    hit = hits[0]
    facts = library_facts(hit.path)
    version, source = checked_version(f"{label} ({hit.dist} {hit.release})", hit.release, facts)
    inc = hit.path.parent.parent / "include"
    return ResolvedRuntime(name=name, lib_dir=hit.path.parent, libcudart=hit.path,
                           include_dir=inc if (inc / "cuda_runtime_api.h").is_file() else None,
                           version=version, wheel_version=hit.release,
                           found_by=f"environment {env_dir.name} ({hit.dist} {hit.release})",
                           version_source=source, batch_exported=facts.batch_exported, env_dir=env_dir,
                           installed=env.installed, facts=facts)


def install_into_environment(rt: Runtime, wheels: Iterable[Path], *, wheel_dir: Path | None = None) -> ResolvedRuntime:
    """The environment of ``rt`` plus ``wheels`` and their dependencies: what the gate's dynamic stage runs in.

    A new environment (its own content hash), so the matrix's shared one stays as built.
    """
    if not rt.requirements:
        raise ConfigError(f"{rt.label}: not an environment runtime (give it `requirements: [...]`)")
    return from_environment(rt.name, rt.requirements, wheel_dir=wheel_dir, extra_wheels=tuple(wheels), where=rt.where)


# --------------------------------------------------------------------------- one entry point


def resolve(rt: Runtime, *, wheel_dir: Path | None = None) -> ResolvedRuntime:
    """Provision one runtime of a matrix (image runtimes are the docker backend's).

    ``wheel_dir`` defaults to ``$CUMATRIX_WHEEL_DIR``.
    """
    if rt.requirement:
        return from_wheel(rt.name, rt.requirement, wheel_dir=wheel_dir, where=rt.where)
    return resolve_installed(rt, wheel_dir=wheel_dir)


def resolve_installed(rt: Runtime, *, wheel_dir: Path | None = None) -> ResolvedRuntime:
    """An environment runtime or this Python's (a ``wheel:`` runtime is :func:`from_pin`'s;
    an image is refused: it is the docker backend's)."""
    if rt.requirements:
        return from_environment(rt.name, rt.requirements, wheel_dir=wheel_dir, where=rt.where)
    if rt.site:
        return from_site(rt.name, where=rt.where)
    raise ConfigError(f"{rt.label}: runtime {rt.name!r} is an image ({rt.image}); it runs only with --backend docker")


def headers_wheel(version: str | CudaVersion, runtimes: Sequence[Runtime] = ()) -> tuple[str, str]:
    """(runtime name, requirement) of the wheel whose ``include/`` serves headers ``version``."""
    v = CudaVersion.parse(str(version))
    found = matrix_headers_wheel(v, runtimes)
    if found is not None:
        return found
    req = KNOWN_WHEELS.get(str(v))
    if req is None:
        raise ConfigError(
            f"no runtime wheel known for headers {v}: add a runtime of that version to the matrix "
            f"(known without one: {', '.join(KNOWN_WHEELS)})"
        )
    return f"cu{v}", req


def headers_for(version: str | CudaVersion, *, wheel_dir: Path | None = None,
                runtimes: Sequence[Runtime] = ()) -> Path:
    """The ``include/`` of a runtime wheel of CUDA ``version`` (the ``builds:`` axis).

    Prefers a runtime of the matrix with that major.minor, else the known wheel.
    """
    name, req = headers_wheel(version, runtimes)
    res = from_wheel(name, req, wheel_dir=wheel_dir)
    if res.include_dir is None:
        raise RuntimeNotFound(f"{req}: the wheel ships no include/ directory")
    return res.include_dir
