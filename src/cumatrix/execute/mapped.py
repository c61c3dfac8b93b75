"""The objects a cell's processes mapped: the rtld-audit log read, and each object described.

Nothing of an observed library is run: its SONAME is read from its dynamic section, its
version from its file name or its wheel's metadata.  :mod:`cumatrix.execute.observe` decides
from these descriptions which runtime a cell used.
"""

from __future__ import annotations

import io
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cumatrix.binary.fatbin import DeviceCode, file_device_code
from cumatrix.core.witness import ClaimIndex, KernelTrace, TracedObject, claim_key, open_cell_file, read_cell_file


def _basename(path: str) -> str:
    """The last component of a path (``os.path.basename``, without building a ``Path``: called per object)."""
    return path.rpartition("/")[2]


@dataclass(frozen=True, kw_only=True, slots=True)
class MappedLibrary:
    """One object some process of the cell mapped."""

    path: str  # as the loader opened it (inside the container, for the docker backend)
    soname: str | None
    version: str | None  # e.g. "12.9.79"; None where neither source says
    version_from: str | None  # "file name" or "wheel <name>"
    pids: tuple[int, ...] = ()
    #: Whether its content is a CUDA runtime (exports ``cudaRuntimeGetVersion``): None where
    #: nobody looked (not named like one) or it cannot be read here (inside an image).
    runtime_exports: bool | None = None

    @property
    def name(self) -> str:
        return self.soname or _basename(self.path)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"path": self.path, "soname": self.soname, "version": self.version,
                                  "version_from": self.version_from}
        if self.runtime_exports is False:
            out["not_a_runtime"] = f"named like a CUDA runtime, but exports no {RUNTIME_EXPORT}"
        return out


#: The function every libcudart exports (NVIDIA's runtime API since CUDA 2.2): what makes a
#: file a CUDA runtime, whatever it is called.
RUNTIME_EXPORT = "cudaRuntimeGetVersion"


def exports_runtime(path: Path) -> bool | None:
    """Whether the file at ``path`` is a CUDA runtime by content (its dynamic symbol table
    defines :data:`RUNTIME_EXPORT`); ``None`` when it cannot be read here.  A text file or
    another library under a runtime's name is ``False``.  Read once per file version."""
    try:
        st = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        # A FIFO or a device under a runtime's name (put there after the load: what was mapped
        # cannot be read now) is never opened, and says nothing either way: unknown, not "no".
        return None
    return _exports_runtime(os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=4096)
def _exports_runtime(path: str, dev: int, ino: int, size: int, mtime_ns: int) -> bool | None:  # noqa: ARG001
    # deferred: pyelftools is loaded only when a mapped file is named like a runtime
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    from cumatrix.binary.elf import elf_defined_symbols

    try:
        # Read as any file a cell could have replaced: no link followed, no FIFO waited on.
        data = read_cell_file(Path(path))
        return RUNTIME_EXPORT in set(elf_defined_symbols(ELFFile(io.BytesIO(data))))
    except ELFError:
        return False  # not an ELF file at all
    except OSError:  # UnsafeFile included: no longer a regular file, or not read in time
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditLog:
    opened: tuple[tuple[int, str, str], ...]  # (pid, soname from memory, path)
    redirected: tuple[tuple[int, str, str], ...]  # (pid, requested, given)
    problem: str | None = None  # why it could not be read (a FIFO, a link)


def read_log(path: Path) -> AuditLog:
    """Parse an audit log; a torn last line (the process died mid-write) is dropped."""
    opened: list[tuple[int, str, str]] = []
    redirected: list[tuple[int, str, str]] = []
    try:
        # The cell's processes can write (or replace) their log: never block on a FIFO, never
        # follow a link, read a regular file only.
        text = read_cell_file(path).decode(errors="replace")
    except FileNotFoundError:
        return AuditLog(opened=(), redirected=())
    except OSError as e:
        return AuditLog(opened=(), redirected=(), problem=f"audit log not read: {e}")
    for line in text.split("\n")[:-1]:  # every line ends in \n; what follows the last is torn
        parts = line.split("\t", 3)
        if len(parts) != 4 or not parts[1].isdigit():
            continue
        row = (int(parts[1]), parts[2], parts[3])
        if parts[0] == "o":
            opened.append(row)
        elif parts[0] == "r":
            redirected.append(row)
    return AuditLog(opened=tuple(opened), redirected=tuple(redirected))


_SUFFIX_RE = re.compile(r"\.so\.(\d+(?:\.\d+)+)$")
_CUDA_RE = re.compile(
    r"^lib(?:cudart|cuda|nvrtc(?:-builtins)?|cublas(?:Lt)?|nccl|cudnn\w*|nvJitLink|cufft\w*|curand"
    r"|cusparse\w*|cusolver\w*|cupti|nvToolsExt|nvjpeg|npp\w+|cufile\w*|nvshmem\w*|nvidia-ml"
    r"|nvidia-ptxjitcompiler|nvvm)\.so(?:\.|$)")


def is_cuda_library(name: str) -> bool:
    """Whether a SONAME or file name is one of NVIDIA's CUDA libraries (runtime, driver, math, NCCL, cuDNN...)."""
    return bool(_CUDA_RE.match(_basename(name)))


def version_from_name(path: str) -> str | None:
    """``libcudart.so.12.9.79`` -> ``12.9.79``; a bare major (``.so.12``) is no version."""
    m = _SUFFIX_RE.search(_basename(path))
    return m.group(1) if m else None


@lru_cache(maxsize=4096)
def _record_index(directory: str) -> dict[str, str]:
    """Files listed in the RECORD of each ``*.dist-info`` in ``directory``: relative path -> 'name version'."""
    out: dict[str, str] = {}
    try:
        infos = [e for e in os.scandir(directory) if e.name.endswith(".dist-info") and e.is_dir()]
    except OSError:
        return out
    for info in infos:
        _index_record(Path(info.path), out)
    return out


def _index_record(info: Path, out: dict[str, str]) -> None:
    """Add the files the RECORD of dist-info directory ``info`` lists to ``out``."""
    dist = _metadata_name_version(info / "METADATA")
    if dist is None:
        return
    try:
        # Under a cell's directories: read as a cell's file (no FIFO waited on).
        record = read_cell_file(info / "RECORD", links=True).decode(errors="replace")
    except OSError:
        return
    for line in record.splitlines():
        rel = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line
        if rel:
            out.setdefault(rel.strip('"'), dist)


def _metadata_name_version(path: Path) -> str | None:
    name = version = None
    try:
        with open_cell_file(path, links=True) as raw, io.TextIOWrapper(raw, errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the headers end at the first blank line
                if line.startswith("Name:"):
                    name = line[5:].strip()
                elif line.startswith("Version:"):
                    version = line[8:].strip()
    except OSError:
        return None
    return f"{name} {version}" if name and version else None


def owning_wheel(path: Path) -> tuple[str, str] | None:
    """(distribution name, version) of the installed wheel whose RECORD lists ``path``.

    Walks up from the file; at each ancestor, the ``*.dist-info`` directories there are the
    candidates, and the file must be listed (relative to that ancestor) in one's RECORD.
    """
    for candidate in dict.fromkeys([Path(os.path.normpath(path)), path.resolve()]):
        parent = candidate.parent
        while parent != parent.parent:
            rel = candidate.relative_to(parent).as_posix()
            hit = _record_index(str(parent)).get(rel)
            if hit:
                name, version = hit.rsplit(" ", 1)
                return name, version
            parent = parent.parent
    return None


def host_path(path: str, roots: Mapping[str, Path]) -> Path:
    return Path(_host_str(path, roots))


def _host_str(path: str, roots: Mapping[str, Path]) -> str:
    """Where a file a cell names is on this host (a container's path through ``roots``)."""
    for prefix, host in roots.items():
        if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
            return str(host / os.path.relpath(path, prefix))
    return path


@lru_cache(maxsize=16384)
def _holds_cuda_name(path: str, dev: int, ino: int, size: int, mtime_ns: int) -> bool:  # noqa: ARG001
    # (dev, ino, size, mtime_ns) are the cache key only: a file version is looked into once.
    from cumatrix.binary.staticcudart import has_bytes

    return has_bytes(path, (b"libcud",))


def _kernel_named_soname(path: str, roots: Mapping[str, Path]) -> str:
    """The SONAME of a file the kernel names (it names files, not SONAMEs), so that a runtime
    renamed on disk is still known by it: read from the file where it may carry a CUDA
    library's (once per file version, one ``stat`` a cell); for a file inside a container's
    image, not readable here, the SONAME its name gives (libcudart.so.12.9.79 ->
    libcudart.so.12), never the one the cell's log claims."""
    host = _host_str(path, roots)
    try:
        st = Path(host).stat()
    except OSError:
        m = _SONAME_BY_NAME_RE.match(_basename(path))
        return m.group(1) if m and is_cuda_library(m.group(1)) else ""
    return _soname_of_version(host, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) or ""


@lru_cache(maxsize=16384)
def _soname_of_version(host: str, dev: int, ino: int, size: int, mtime_ns: int) -> str | None:
    if not (is_cuda_library(_basename(host)) or _holds_cuda_name(host, dev, ino, size, mtime_ns)):
        return None
    return _read_soname(Path(host))


def soname_from_file(path: Path) -> str | None:
    """The file's DT_SONAME; read once per file version (every cell of a runtime asks)."""
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _SONAMES:
        _SONAMES[key] = _read_soname(path)
    return _SONAMES[key]


_SONAMES: dict[tuple[str, int, int, int, int], str | None] = {}


def _read_soname(path: Path) -> str | None:
    # deferred: pyelftools is loaded only when a mapped file may carry a CUDA library's SONAME
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    from cumatrix.binary.elf import elf_soname

    try:
        # A path the kernel said was mapped: the cell may have put a FIFO or a device there since.
        with open_cell_file(path, links=True) as fh:
            return elf_soname(ELFFile(fh))
    except (OSError, ELFError):
        return None


def describe(path: str, logged_soname: str, *, roots: Mapping[str, Path] = {}, pids: Sequence[int] = (),
             wheel_versions: bool = True) -> MappedLibrary:
    """One mapped object: SONAME (as logged from its dynamic section) and version (file name suffix of the file or of what it links to, else its wheel)."""
    # The log's SONAME is the object's own DT_SONAME, read from its dynamic section once mapped;
    # empty there means it has none (a Python extension module), so the file is not opened again.
    soname = logged_soname or None
    version, source = version_from_name(path), "file name"
    if version is not None or not wheel_versions:
        return MappedLibrary(path=path, soname=soname, version=version,
                             version_from=source if version else None, pids=tuple(pids))
    host = host_path(path, roots)
    if host.exists():  # libcudart.so.12 -> libcudart.so.12.9.79
        version = version_from_name(str(host.resolve()))
    if version is None and host.exists():
        wheel = owning_wheel(host)
        if wheel is not None:
            version, source = wheel[1], f"wheel {wheel[0]}"
    return MappedLibrary(path=path, soname=soname, version=version, version_from=source if version else None,
                         pids=tuple(pids))


def read_mapped(log: Path, *, roots: Mapping[str, Path] = {}, cuda_only: bool = False) -> tuple[MappedLibrary, ...]:
    """Every distinct object the cell's processes mapped, in first-mapped order, as the audit
    log says (written inside those processes: see :func:`conclude` for the kernel's record).

    ``roots`` maps path prefixes inside a container to where the same files are on this
    host (an image's unpacked runtime wheel), for the version and the SONAME of files that
    are not mounted.  Versions from wheel metadata are looked up for CUDA libraries only
    (walking a large site-packages for every extension module would cost more than the cell);
    for the others, the version is the file name's numeric suffix as mapped, if any.
    """
    return described(((pid, soname, path) for pid, soname, path in read_log(log).opened), roots=roots,
                      cuda_only=cuda_only)


_SONAME_BY_NAME_RE = re.compile(r"^(lib[\w+.-]*?\.so\.\d+)(?:\.\d+)*$")


def described(rows: Iterable[tuple[int, str, str]], *, roots: Mapping[str, Path], cuda_only: bool,
               soname_from_file: bool = False) -> tuple[MappedLibrary, ...]:
    """Each object of ``rows`` (pid, SONAME or "", path) described once, with every pid that
    mapped it; ``cuda_only``: NVIDIA's CUDA libraries alone; ``soname_from_file``: a SONAME
    the rows do not give is read from the file."""
    pids, sonames = _by_path(rows)
    out = []
    for path, who in pids.items():
        so = sonames.get(path, "")
        if not so and soname_from_file:
            so = _kernel_named_soname(path, roots)
        if cuda_only and not (is_cuda_library(so) or is_cuda_library(path)):
            continue
        out.append(describe(path, so, roots=roots, pids=who,
                            wheel_versions=is_cuda_library(so) or is_cuda_library(path)))
    return tuple(out)


def _by_path(rows: Iterable[tuple[int, str, str]]) -> tuple[dict[str, list[int]], dict[str, str]]:
    """The pids that mapped each path (the vDSO aside), and the first SONAME given for each."""
    pids: dict[str, list[int]] = {}
    sonames: dict[str, str] = {}
    for pid, soname, path in rows:
        if "/" not in path:  # the vDSO
            continue
        seen = pids.setdefault(path, [])
        if pid not in seen:
            seen.append(pid)
        if soname:
            sonames.setdefault(path, soname)
    return pids, sonames


def special_files(paths: Iterable[str]) -> tuple[str, ...]:
    """A fact for each of ``paths`` (files the kernel said were mapped) that now names no regular
    file (a FIFO or a device renamed over it): read as nothing, never waited on."""
    out = []
    for path in dict.fromkeys(paths):
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue  # gone, or unreachable: nothing to read either way
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            out.append(f"{path}: not a regular file ({stat.filemode(mode)}), not read")
    return tuple(out)


def cuda_libraries(mapped: Iterable[MappedLibrary]) -> tuple[MappedLibrary, ...]:
    """The CUDA libraries among ``mapped`` (libcudart, libcuda, libnvrtc, libcublas*, libnccl, ...)."""
    return tuple(m for m in mapped if is_cuda_library(m.name) or is_cuda_library(m.path))


def device_code_of(path: Path) -> tuple[DeviceCode, ...]:
    """The entries of the fat binaries of the mapped file at ``path`` (none where it has none or
    cannot be read), read once per file version."""
    try:
        st = path.stat()
    except OSError:
        return ()
    return _device_code_by_identity(str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=8192)
def _device_code_by_identity(path: str, dev: int, ino: int, size: int,  # noqa: ARG001
                             mtime_ns: int) -> tuple[DeviceCode, ...]:  # noqa: ARG001
    # (dev, ino, size, mtime_ns) are the cache key only: a file version is read once per
    # process (a matrix maps the same libraries in every cell).  The file is the cell's: opened
    # as any file a cell could replace (no FIFO waited on, no link followed, bounded).
    try:
        with open_cell_file(path, links=True) as fh:
            return file_device_code(fh)
    except OSError:
        return ()


def kernel_mapped(log: AuditLog, trace: KernelTrace, roots: Mapping[str, Path]
                  ) -> tuple[tuple[MappedLibrary, ...], tuple[str, ...], str | None, str]:
    """Every object the kernel saw mapped, the log's paths it never saw, why the record is incomplete, notes."""
    logged, unbacked = _logged(log, trace)
    rows: list[tuple[int, str, str]] = []
    for o in trace.objects:
        rows += _object_rows(o, logged)
    every = described(rows, roots=roots, cuda_only=False, soname_from_file=True)
    extra = "; ".join(trace.notes + special_files(o.path.removesuffix(" (deleted)") for o in trace.objects))
    incomplete = None
    if not trace.complete:
        incomplete = "the tracer's record is incomplete (it was killed, or its record was cut)"
        extra = "; ".join(x for x in (incomplete, extra) if x)
    return every, tuple(unbacked), incomplete, extra


def _logged(log: AuditLog, trace: KernelTrace) -> tuple[dict[tuple[str, int], str], list[str]]:
    """The path the loader opened for each file the kernel saw mapped (by device and inode),
    and the log's paths the kernel never saw."""
    # The audit log adds detail to what the kernel saw: the path as the loader opened it
    # (through $ORIGIN, not normalised: where it came from is read from it), taken only
    # where it is the same file under its own name (or a versioned link's: libcudart.so.12
    # for libcudart.so.12.9.79), so that no link a process made can rename what it mapped.
    # SONAMEs are read from the files, not from the log.
    logged: dict[tuple[str, int], str] = {}
    index, unbacked = ClaimIndex.of(trace), []
    for path in dict.fromkeys(path for _, _, path in log.opened if "/" in path):
        key = claim_key(path, trace, index)
        if key is None:
            unbacked.append(path)
        else:
            logged.setdefault(key, path)
    return logged, unbacked


def _object_rows(o: TracedObject, logged: Mapping[tuple[str, int], str]) -> list[tuple[int, str, str]]:
    """(pid, SONAME, path) of each process that mapped ``o``: the path the loader opened where
    it names the same file, else the kernel's."""
    real = o.path.removesuffix(" (deleted)")
    path = logged.get((o.device, o.inode), real)
    if not real.rpartition("/")[2].startswith(path.rpartition("/")[2]):
        path = real
    # A nameless file's SONAME (a memfd's) comes from the tracer, read from its bytes.
    return [(pid, o.soname or "", path) for pid in o.pids]
