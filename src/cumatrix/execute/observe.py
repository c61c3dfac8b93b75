"""What a cell's process tree really mapped, and whether the cell's runtime was the one used.

A cell offers its runtime (first on ``LD_LIBRARY_PATH``), but programs that carry their own
(torch, CuPy, JAX and most CUDA wheels, through ``DT_RPATH``/``RUNPATH`` or a ``dlopen`` by
absolute path) load that one instead.  This module observes, through glibc's rtld-audit
interface, every object each process of the cell opens (``csrc/audit.c``, loaded with
``LD_AUDIT``, which every child inherits), and by default enforces the cell's runtime over a
bundled copy with the same SONAME.  Nothing of an observed library is run: its SONAME is
read from its dynamic section, its version from its file name or its wheel's metadata.

The audit log is written inside the processes it observes, so they can write it too.  Where
the spawn helper traced the tree (:mod:`cumatrix.core.witness`: the kernel's ``/proc/PID/maps`` of
every process, read from outside), that record is the evidence and the log only adds detail
to objects the kernel saw (:func:`conclude`); a statically linked or set-uid program, or a
child started without ``LD_AUDIT``, is seen all the same.  Where it did not (docker cells,
ptrace refused), the log is all there is, and the record says so.

The pieces a backend needs:

- :func:`build_audit_library`: the audit library, compiled once with gcc into the user
  cache, keyed by its source (and the compiler);
- :func:`audit_plan`: the environment of a job, and what a container must mount (the
  library read-only, the log writable);
- :func:`read_mapped` after the run, :func:`cuda_libraries` to keep the CUDA ones,
  :func:`observed_runtime` for the fingerprint and the oracle, and
  :func:`runtime_not_used` for the ``skipped:runtime-not-used`` outcome.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from cumatrix.binary.fatbin import DeviceCode
from cumatrix.binary.staticcudart import StaticRuntime, static_runtime_in
from cumatrix.core.cache import cache_dir
from cumatrix.core.errors import CumatrixError
from cumatrix.core.model import CudaVersion
from cumatrix.core.witness import KernelTrace
from cumatrix.execute import provenance as _provenance
from cumatrix.execute.mapped import (
    AuditLog,
    MappedLibrary,
    cuda_libraries,
    describe,
    described,
    device_code_of,
    exports_runtime,
    host_path,
    is_cuda_library,
    kernel_mapped,
    owning_wheel,
    read_log,
    read_mapped,
    soname_from_file,
    version_from_name,
)
from cumatrix.execute.prebuilt import AUDIT, prebuilt

# Re-exported: the log and the objects it names are read by cumatrix.execute.mapped.
__all__ = ["AuditLog", "MappedLibrary", "cuda_libraries", "describe", "is_cuda_library", "owning_wheel", "read_log",
           "read_mapped", "version_from_name"]

#: The environment variables the audit library reads (csrc/audit.c).
LOG_ENV = "CUMATRIX_AUDIT_LOG"
ENFORCE_ENV = "CUMATRIX_AUDIT_ENFORCE"
LIBRARY_NAME = AUDIT

#: How a cell treats its runtime: ``enforced`` (the default: the cell's file answers every
#: request for its SONAME) or ``offered`` (observe only: test what the program brings).
RuntimeMode = Literal["enforced", "offered"]

OUTCOME_NOT_USED = "skipped:runtime-not-used"


class AuditError(CumatrixError):
    """The audit library cannot be built on this host (no compiler, or the build failed)."""


# --------------------------------------------------------------------------- the library


def audit_source() -> str:
    return resources.files("cumatrix").joinpath("csrc/audit.c").read_text()


def _compiler_identity(cc_path: str) -> str:
    """The compiler's resolved path and first ``--version`` line, asked once per file version."""
    real = Path(cc_path).resolve()
    try:
        st = real.stat()
        key = (str(real), st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        key = (str(real), 0, 0, 0)
    got = _COMPILER_IDS.get(key)
    if got is None:
        got = _COMPILER_IDS[key] = _noted_compiler(cc_path, key)
    return got


def _noted_compiler(cc_path: str, key: tuple[str, int, int, int]) -> str:
    """``_ask_compiler``, noted in the cache under the compiler file's identity: asking costs a
    process (50 ms) that every run would otherwise spend before its first cell."""
    note = cache_dir("audit") / f"cc-{hashlib.sha256(repr(key).encode()).hexdigest()[:20]}.txt"
    try:
        return note.read_text()
    except OSError:
        pass
    got = _ask_compiler(cc_path)
    try:
        tmp = note.with_name(f".{note.name}.{os.getpid()}")
        tmp.write_text(got)
        tmp.replace(note)
    except OSError:
        pass  # a read-only cache: asked again next time
    return got


_COMPILER_IDS: dict[tuple[str, int, int, int], str] = {}


def _ask_compiler(cc_path: str) -> str:
    try:
        out = subprocess.run([cc_path, "--version"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise AuditError(f"{cc_path} --version failed ({e}): install gcc (apt-get install gcc)") from e
    return f"{Path(cc_path).resolve()} {out.splitlines()[0] if out else ''}"


#: Where audit.c makes its own system calls (x86-64, AArch64) it is built without the C library:
#: an audit library's every dependency is loaded again in its own namespace (a second libc in
#: each process of each cell).  ``-z defs`` turns a call the compiler adds into a build error.
NOLIBC_CFLAGS = ("-nostdlib", "-fno-builtin", "-fno-tree-loop-distribute-patterns", "-fno-stack-protector",
                 "-Wl,-z,defs")
AUDIT_CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror")
_CFLAGS = (*AUDIT_CFLAGS, *(NOLIBC_CFLAGS if platform.machine() in ("x86_64", "aarch64") else ()))


#: The library each ``(cache, cc, PATH)`` gave in this process: every cell asks, and the
#: answer (a PATH search, the source read and hashed) only changes with those.
_BUILT: dict[tuple[Path | None, str, str | None], Path] = {}


def build_audit_library(*, cache: Path | None = None, cc: str = "gcc") -> Path:
    """The library a platform wheel carries, else ``csrc/audit.c`` compiled (once per source and
    compiler); its path."""
    shipped = prebuilt(AUDIT) if cache is None and cc == "gcc" else None
    if shipped is not None:
        return shipped
    key = (cache, cc, os.environ.get("PATH"))
    known = _BUILT.get(key)
    if known is not None and known.is_file():  # removed meanwhile (cumatrix clean): built again
        return known
    _BUILT[key] = built = _build_audit_library(cache=cache, cc=cc)
    return built


def _build_audit_library(*, cache: Path | None, cc: str) -> Path:
    cc_path = shutil.which(cc)
    if cc_path is None:
        raise AuditError(f"no C compiler {cc!r} on PATH: the rtld-audit library that observes what each "
                         "cell maps is compiled on the host: install gcc (e.g. apt-get install gcc)")
    source = audit_source()
    key = "\n".join([source, " ".join(_CFLAGS), _compiler_identity(cc_path)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    root = cache if cache is not None else cache_dir("audit")
    target = root / digest / LIBRARY_NAME
    if target.is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        (tmp / "audit.c").write_text(source)
        cmd = [cc_path, *_CFLAGS, "-o", str(tmp / LIBRARY_NAME), str(tmp / "audit.c")]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise AuditError(f"compiling the rtld-audit library failed ({' '.join(cmd)}):\n"
                             + proc.stderr.strip()[-2000:])
        tmp.chmod(0o755)  # a root harness's sandboxed cell (an unprivileged uid) loads it
        try:
            tmp.rename(target.parent)
        except OSError:  # another worker built the same one first; theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


# --------------------------------------------------------------------------- a job's part


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditPlan:
    """What one job needs to be observed: its environment and what a container mounts."""

    library: Path
    log: Path
    enforce: tuple[tuple[str, str], ...] = ()  # (SONAME, path the process gets for it)

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        pairs = [("LD_AUDIT", str(self.library)), (LOG_ENV, str(self.log))]
        if self.enforce:
            pairs.append((ENFORCE_ENV, ":".join(f"{s}={p}" for s, p in self.enforce)))
        return tuple(pairs)

    @property
    def mounts(self) -> tuple[str, ...]:
        """Host paths a container reads (the library)."""
        return (str(self.library),)

    @property
    def writable(self) -> tuple[str, ...]:
        """Host paths a container writes (the log, created here so the host owns it)."""
        return (str(self.log),)


def audit_plan(log: Path, *, library: Path | None = None,
               enforce: Iterable[tuple[str, str]] = ()) -> AuditPlan:
    """The audit of one job writing to ``log`` (created new and empty, writable by a
    container's or the sandbox's user).

    ``enforce`` pairs a SONAME with the absolute path that answers every request for it
    (``("libcudart.so.12", "/…/libcudart.so.12")``); empty: observe only (``runtime: offered``).
    In a container the path is the file's path inside it.
    """
    rules = tuple(enforce)
    for soname, path in rules:
        if "/" in soname or ":" in soname or "=" in soname or not soname:
            raise ValueError(f"not a SONAME: {soname!r}")
        if not path.startswith("/") or ":" in path:
            raise ValueError(f"the enforced {soname} must be an absolute path without ':', not {path!r}")
    # The cell's user may not be the harness's (a container's, or the sandbox's unprivileged
    # uid under a root harness): the file is 0666; its directory is the cell's own (mkdtemp).
    mode = 0o666
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # never through a planted link
    try:
        fd = os.open(log, flags, mode)
    except FileNotFoundError:
        log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(log, flags, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask
    finally:
        os.close(fd)
    return AuditPlan(library=library or build_audit_library(), log=log, enforce=rules)


# --------------------------------------------------------------------------- the runtime


def cuda_int(version: str | None) -> int | None:
    """``"12.9.79"`` -> 12090 (``cudaRuntimeGetVersion``'s encoding); ``None`` when not MAJOR.MINOR[...]."""
    if not version:
        return None
    parts = version.split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(CudaVersion(int(parts[0]), int(parts[1])))


_SONAME_MAJOR_RE = re.compile(r"\.so\.(\d+)")


def is_runtime(lib: MappedLibrary) -> bool:
    """A CUDA runtime by content: named libcudart and, where its file can be read here,
    exporting ``cudaRuntimeGetVersion``.  NVRTC, nvJitLink, cuBLAS and the other toolkit
    libraries carry a CUDA major in their SONAME but are no runtime and need no driver of
    theirs (NVRTC compiles without one; FACTS.md section 12): they never stand for one."""
    return lib.name.startswith("libcudart.so") and lib.runtime_exports is not False


@dataclass(frozen=True, kw_only=True, slots=True)
class ObservedRuntime:
    """The CUDA runtime a process tree used, as far as its mappings tell."""

    file: str | None  # the libcudart mapped; None: none was (static runtime, or driver API only)
    soname: str | None
    version: int | None  # CUDA encoding (13000); major-only evidence gives MAJOR*1000
    evidence: str  # one line: what says so

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "soname": self.soname, "version": self.version, "evidence": self.evidence}


def _soname_major(name: str) -> int | None:
    m = _SONAME_MAJOR_RE.search(name)
    return int(m.group(1)) if m else None


def observed_runtime(mapped: Sequence[MappedLibrary], statics: Sequence[StaticRuntime] = ()) -> ObservedRuntime:
    """The runtime the mappings show: the (first) libcudart, else a statically linked runtime
    found in a mapped object (its version from its own contents), else nothing: a toolkit
    library of some CUDA major (``libnvrtc.so.13``) says nothing of a runtime."""
    runtimes = [m for m in mapped if is_runtime(m)]
    if runtimes:
        return _mapped_observed(runtimes)
    for st in statics:
        if st.major is not None:
            return _static_observed(st, st.major)
    toolkit = [f"{m.name} (CUDA {_soname_major(m.name)})" for m in mapped
               if not m.name.startswith(("libcuda.so", "libcudart.so")) and _soname_major(m.name) is not None]
    also = f"; toolkit libraries, no runtime: {', '.join(toolkit[:4])}" if toolkit else ""
    return ObservedRuntime(file=None, soname=None, version=None,
                           evidence="no libcudart mapped: the driver API only, a statically linked runtime, or no CUDA"
                                    + also)


def _mapped_observed(runtimes: Sequence[MappedLibrary]) -> ObservedRuntime:
    """The first of the mapped runtimes, its version from its file (else its SONAME's major)."""
    rt = runtimes[0]
    version = cuda_int(rt.version)
    major = _soname_major(rt.name)
    if version is None and major is not None:
        version = major * 1000
    more = f" (and {len(runtimes) - 1} more)" if len(runtimes) > 1 else ""
    return ObservedRuntime(file=rt.path, soname=rt.soname, version=version,
                           evidence=f"mapped {rt.name} {rt.version or ''} from {rt.path}{more}".replace("  ", " "))


def _static_observed(st: StaticRuntime, major: int) -> ObservedRuntime:
    """A statically linked runtime of CUDA ``major``, dated by its own contents where they tell."""
    version = st.version if st.version is not None else major * 1000
    return ObservedRuntime(file=st.file, soname=None, version=version,
                           evidence=f"no libcudart mapped; {st.file} holds {st.evidence}: CUDA {major}"
                                    + (f" (names as new as {CudaVersion.from_int(st.version)})" if st.version else ""))


@dataclass(frozen=True, kw_only=True, slots=True)
class CellRuntime:
    """The runtime a cell offers: its library's SONAME, version and file."""

    soname: str
    version: int  # cudaRuntimeGetVersion, e.g. 12090
    path: str | None = None  # where the process would find it (inside the container for docker)


def cell_runtime(libcudart: Path, version: int, *, path_inside: str | None = None,
                 soname: str | None = None) -> CellRuntime:
    """A cell's runtime from its provisioned file (the SONAME read from the ELF, unless known)."""
    soname = soname or soname_from_file(libcudart) or libcudart.name
    return CellRuntime(soname=soname, version=version, path=path_inside or str(libcudart))


def enforce_rules(cell: CellRuntime, mode: RuntimeMode = "enforced") -> tuple[tuple[str, str], ...]:
    """The ``audit_plan(enforce=...)`` of a cell: its SONAME answered by its file, unless offered."""
    if mode == "offered" or cell.path is None:
        return ()
    return ((cell.soname, cell.path),)


def runtime_not_used(cell: CellRuntime, mapped: Sequence[MappedLibrary], *,
                     mode: RuntimeMode = "enforced", statics: Sequence[StaticRuntime] = ()) -> str | None:
    """Why the cell's runtime was not what the process used (the reason of
    ``skipped:runtime-not-used``), or ``None`` when nothing says so.

    - A libcudart of another SONAME than the cell's (torch's ``libcudart.so.13`` in a cu12.9
      cell): not used.  Enforcement cannot help there: the program was built for another major.
    - Under enforcement, a libcudart of the cell's SONAME that is not the cell's file (only a
      ``dlmopen`` into another namespace gets past ``la_objsearch``): not used.
    - No libcudart but a statically linked runtime of another major in a mapped object (read
      by the gate's detector: CuPy, cuda-bindings' runtime module): not used.  A toolkit
      library of another major alone (``libnvrtc.so.13``) is no runtime: ``None``.
    - No CUDA library at all, or only the driver (``libcuda``): ``None``.  Nothing contradicts
      the cell's runtime, though nothing exercised it; the fingerprint says ``runtime_file: null``.
    - ``offered``: ``None``; the cell tests what the program brings, and its record names
      the runtime that was used.
    """
    if mode == "offered":
        return None
    runtimes = [m for m in mapped if is_runtime(m)]
    if not runtimes:
        seen = observed_runtime(mapped, statics)
        if seen.version is not None and seen.version // 1000 != cell.version // 1000:
            return f"{seen.evidence}, not the cell's {cell.soname} ({CudaVersion.from_int(cell.version)})"
        return None
    for rt in runtimes:
        why = _not_the_cells(cell, rt)
        if why is not None:
            return why
    return None


def _not_the_cells(cell: CellRuntime, rt: MappedLibrary) -> str | None:
    """Why the mapped runtime ``rt`` is not the cell's (None: it is)."""
    if rt.name != cell.soname:
        return (f"the process used {rt.name} ({rt.version or 'version unknown'}) from {rt.path}, "
                f"not the cell's {cell.soname} ({CudaVersion.from_int(cell.version)})")
    if cell.path is not None and not _provenance.same_file(rt.path, cell.path):
        return (f"the process mapped {rt.name} ({rt.version or 'version unknown'}) from {rt.path} "
                f"past the enforced {cell.path}")
    return None


# --------------------------------------------------------------------------- after a run


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """What one cell's processes were seen to map, ready for its record."""

    libraries: tuple[MappedLibrary, ...]  # the CUDA libraries mapped
    runtime: ObservedRuntime
    not_used: str | None  # the reason of skipped:runtime-not-used, or None
    #: Where each of ``libraries`` came from (same order), when the cell's setting is known.
    provenance: tuple[_provenance.Provenance, ...] = ()
    #: A runtime from outside both the program and the cell: the cell fails with runtime-leak:PATH.
    leak: _provenance.Provenance | None = None
    leak_detail: str | None = None
    #: Where the mappings come from: ``kernel`` (the tracer read /proc/PID/maps) or
    #: ``rtld-audit`` (the log written inside the cell's processes: they could have written it).
    source: str = "rtld-audit"
    source_note: str | None = None  # why not the kernel, or what the tracer could not do
    #: Whether any process mapped the driver (libcuda.so*, or the interposer standing for it);
    #: None where nothing observed the cell.
    driver_mapped: bool | None = None
    #: Paths the audit log claims were mapped that the kernel never saw (ignored).
    unbacked: tuple[str, ...] = ()
    static_runtimes: tuple[StaticRuntime, ...] = ()
    #: The device code of each mapped object outside NVIDIA's libraries that carries any
    #: (path, its fat binaries' entries), read with the gate's reader.
    device_code: tuple[tuple[str, tuple[DeviceCode, ...]], ...] = ()
    #: Why the kernel's record does not cover the whole tree to its end (None: it does, or
    #: nothing traced it): a pass is then not taken on what was seen.
    incomplete: str | None = None
    #: An attempt to make a process no tracer hears of, stopped by killing its process: the
    #: cell is a harness error naming it.
    escaped: str | None = None
    #: Each file mapped executable that had no name on disk (a memfd, a removed file): its
    #: path and the SHA-256 of its bytes (and how many), read by the tracer when it was mapped.
    nameless: tuple[tuple[str, str, int], ...] = ()

    def fingerprint(self) -> dict[str, object]:
        """The record's ``libraries`` (each with where it came from and how the loader found it),
        ``runtime_file``, ``runtime_version`` (observed, not offered), ``runtime_origin``, and
        where the mappings come from (``mappings_from``: the kernel, or the audit log alone)."""
        where = {p.path: p for p in self.provenance}
        libs = [{**m.to_json(), **({k: v for k, v in where[m.path].to_json().items() if k != "path"}
                                   if m.path in where else {})} for m in self.libraries]
        origin = where.get(self.runtime.file) if self.runtime.file else None
        out: dict[str, object] = {
            "libraries": libs, "runtime_file": self.runtime.file,
            "runtime_version": self.runtime.version, "runtime_evidence": self.runtime.evidence,
            "runtime_origin": origin.to_json() if origin is not None else None,
            "mappings_from": self.source, "driver_mapped": self.driver_mapped}
        return out | self._noted()

    def _noted(self) -> dict[str, object]:
        """The fingerprint's fields that stand only where there is something to say."""
        # not_used is a fact whatever the outcome: it makes a skip only of a program that succeeded
        noted: dict[str, object] = {
            "runtime_not_used": self.not_used,
            "mappings_note": self.source_note,
            "audit_claims_not_backed": list(self.unbacked[:20]),
            "static_runtimes": [r.to_json() for r in self.static_runtimes],
            "nameless_files": [{"path": p, "sha256": h, "bytes": n} for p, h, n in self.nameless],
            "device_code": {path: sorted({c.label() for c in codes}) for path, codes in self.device_code}}
        return {k: v for k, v in noted.items() if v}


#: What the rtld-audit log is, where it is all there is.
AUDIT_ONLY = "the rtld-audit log, written inside the cell's processes (not backed by the kernel)"


def conclude(plan: AuditPlan, cell: CellRuntime | None, *, mode: RuntimeMode = "enforced",
             roots: Mapping[str, Path] = {}, setting: _provenance.Setting | None = None,
             trace: KernelTrace | None = None,
             intros: Callable[[], Mapping[str, int]] | None = None) -> Observation:
    """What a finished cell's processes mapped, and the runtime they used.

    With a ``trace`` of the tree (the kernel's ``/proc/PID/maps``, read by the tracer), that
    is the evidence: the audit log only adds detail to objects the kernel saw, and paths it
    claims that the kernel never saw are ignored and named (``unbacked``).  Without one (ptrace
    refused, no static helper for a container), the audit log is read, and the record says where it came from.
    The cell's own file, when it is the runtime mapped, carries the version measured at
    provisioning (``cudaRuntimeGetVersion``).  With the cell's ``setting``, each library's
    provenance is traced, and a runtime from outside both the program and the cell is the
    observation's ``leak``.  ``intros`` (the runtime functions' first-export versions, asked
    only when a mapped file carries a static runtime's marks) dates a static runtime.
    """
    source, every, unbacked, incomplete, note = _everything_mapped(read_log(plan.log), trace, roots)
    mapped = tuple(_by_content(m, roots) for m in cuda_libraries(every))
    statics = (_static_runtimes(every, roots, intros)
               if intros is not None and not any(is_runtime(m) for m in mapped) else ())
    driver = any(m.name.startswith("libcuda.so") for m in mapped)
    mapped, seen = _cell_version(cell, mapped, statics)
    provs, leak, detail = _provenances(plan, cell, mapped, setting)
    return Observation(libraries=mapped, runtime=seen,
                       not_used=runtime_not_used(cell, mapped, mode=mode, statics=statics) if cell is not None else None,
                       provenance=provs, leak=leak, leak_detail=detail,
                       source=source, source_note=note, driver_mapped=driver, unbacked=unbacked,
                       static_runtimes=statics, device_code=_device_code(every, roots), incomplete=incomplete,
                       escaped="; ".join(trace.escapes) if trace is not None and trace.escapes else None,
                       nameless=_nameless(trace))


def _everything_mapped(log: AuditLog, trace: KernelTrace | None, roots: Mapping[str, Path]
                       ) -> tuple[str, tuple[MappedLibrary, ...], tuple[str, ...], str | None, str | None]:
    """(source, every object mapped, the log's paths the kernel never saw, why the record is
    incomplete, a note): from the kernel's record where the tree was traced, else the audit log."""
    if trace is not None and trace.traced:
        every, unbacked, incomplete, extra = kernel_mapped(log, trace, roots)
        return "kernel", every, unbacked, incomplete, "; ".join(x for x in (log.problem, extra) if x) or None
    why = (trace.note if trace is not None else None) or "no tracer for this backend"
    note = "; ".join(x for x in (f"{AUDIT_ONLY}: {why}", log.problem) if x)
    return "rtld-audit", described(log.opened, roots=roots, cuda_only=False), (), None, note


def _nameless(trace: KernelTrace | None) -> tuple[tuple[str, str, int], ...]:
    """The files with no name on disk (a memfd) the tracer read, each with its bytes' digest."""
    return tuple((o.path, *o.digest) for o in trace.objects if o.digest) if trace is not None else ()


def _cell_version(cell: CellRuntime | None, mapped: tuple[MappedLibrary, ...], statics: tuple[StaticRuntime, ...]
                  ) -> tuple[tuple[MappedLibrary, ...], ObservedRuntime]:
    """The libraries and the runtime used, the cell's own file with the version measured at provisioning."""
    if cell is not None and cell.path:
        # The cell's file inside an image is not readable here; its version is known anyway.
        own = str(CudaVersion.from_int(cell.version))
        mapped = tuple(dataclasses.replace(m, version=own, version_from="the cell's runtime (cudaRuntimeGetVersion)")
                       if m.version is None and _provenance.same_file(m.path, cell.path) else m for m in mapped)
    seen = observed_runtime(mapped, statics)
    if cell is not None and cell.path and seen.file and _provenance.same_file(seen.file, cell.path):
        seen = ObservedRuntime(file=seen.file, soname=seen.soname, version=cell.version, evidence=seen.evidence)
    return mapped, seen


def _provenances(plan: AuditPlan, cell: CellRuntime | None, mapped: tuple[MappedLibrary, ...],
                 setting: _provenance.Setting | None
                 ) -> tuple[tuple[_provenance.Provenance, ...], _provenance.Provenance | None, str | None]:
    """Each library's provenance (none without ``setting``), a runtime from outside program and cell, why."""
    if setting is None:
        return (), None, None
    provs = _provenance.trace(mapped, _provenance.read_searches(plan.log), setting)
    # Only a cell that offers a runtime of its own can say a runtime came from elsewhere.
    # A file named like a runtime that is none (a text file, another library) leaks nothing.
    runtimes = [p for p, m in zip(provs, mapped, strict=True) if is_runtime(m)]
    leak = _provenance.leaked(runtimes) if cell is not None else None
    if leak is None:
        return provs, None, None
    return provs, leak, _provenance.leak_detail(leak, next((m.version for m in mapped if m.path == leak.path), None))


def _device_code(mapped: Sequence[MappedLibrary],
                 roots: Mapping[str, Path]) -> tuple[tuple[str, tuple[DeviceCode, ...]], ...]:
    """The fat binaries of the mapped objects that are not NVIDIA's own libraries (those cover
    every GPU their release supports; the program's own code is what may not)."""
    out = []
    for path in dict.fromkeys(m.path for m in mapped if not is_cuda_library(m.name) and "/" in m.path):
        codes = device_code_of(host_path(path, roots))
        if codes:
            out.append((path, codes))
    return tuple(out)


def _by_content(lib: MappedLibrary, roots: Mapping[str, Path]) -> MappedLibrary:
    """``lib``, with whether a file named like a runtime is one by its content."""
    if not lib.name.startswith("libcudart.so"):
        return lib
    return dataclasses.replace(lib, runtime_exports=exports_runtime(host_path(lib.path, roots)))


def _static_runtimes(mapped: Sequence[MappedLibrary], roots: Mapping[str, Path],
                     intros: Callable[[], Mapping[str, int]]) -> tuple[StaticRuntime, ...]:
    """The statically linked runtimes among the mapped objects (the executable included), read
    with the gate's detector; each file decided once per content."""
    out = []
    for m in mapped:
        host = host_path(m.path, roots)
        found = static_runtime_in(str(host), intros)
        if found is not None:
            out.append(dataclasses.replace(found, file=m.path))
    return tuple(out)
