"""What the gate's static audit knows about CUDA runtimes beyond ``DT_NEEDED``.

* **Export dates.**  ``data/cudart_exports.json`` (written by ``scripts/runtime-exports.py``)
  lists, for every ``cuda*`` symbol, the first and the last of NVIDIA's libcudart builds on
  PyPI (CUDA 11.7 to 13.5, the newest release of each minor) whose ``.dynsym`` exports it.
  Statically linked and dynamically linked runtimes are dated by it: "first exported by
  libcudart 12.5" is what a loader sees, where a header date is only what a compiler saw.
* **Runtimes loaded at run time.**  A file that neither links libcudart nor carries a copy
  may still ``dlopen`` one: it names a soname (``libcudart.so.12``) in its read-only data, or
  carries a ``cudart_stub``-style table of the runtime's entry-point names that it resolves
  with ``dlsym`` (XLA's trampolines build the soname at run time).  Which major it loads comes
  from the soname, else from its ``RPATH``/``RUNPATH`` into an ``nvidia/cuNN/lib`` tree and the
  wheel's ``Requires-Dist`` on ``nvidia-cuda-runtime*``.
* **Architecture floors.**  ``data/nvidia.json`` ``arch_min_cuda``: the first CUDA release
  (and so driver branch) that supports each GPU generation; a GPU of that compute capability
  runs no older driver, so a PTX check for it never needs to assume one.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from elftools.elf.elffile import ELFFile
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from cumatrix.binary.elf import data_chunks
from cumatrix.core.model import CudaVersion
from cumatrix.predict.rules import rules

EXPORTS_FILE = "data/cudart_exports.json"
_EXPORTS_SCHEMA = 1

# A soname as a C string: libcudart.so, libcudart.so.12, libcudart.so.11.0, libcuda.so.1, and
# the CUDA libraries of data/cuda_libraries.json (libcublas.so.13, libnvrtc.so.12, ...).
_SONAME_RE = re.compile(rb"lib(cudart|cuda|cublas(?:Lt)?|cufftw?|curand|cusolver(?:Mg)?|cusparse"
                        rb"|npp[a-z]{1,4}|nvjpeg|cupti|cudnn(?:_[a-z_]{1,20})?|nvrtc(?:-builtins)?"
                        rb"|nvJitLink)\.so(?:\.[0-9]{1,3}){0,3}\x00")
_LIBCUDART_SONAME_RE = re.compile(r"^libcudart\.so(?:\.(\d+))?")
# $ORIGIN/../nvidia/cu13/lib (CUDA 13 wheels), .../nvidia/cuda_runtime/lib (11.x and 12.x).
_TREE_RE = re.compile(r"nvidia/(?:cu(\d+)|(cuda_runtime))/lib")
#: NVIDIA's runtime wheels by normalised name: ``nvidia-cuda-runtime-cuNN`` up to CUDA 12, the
#: name without a suffix from CUDA 13 on.
_RUNTIME_DIST = "nvidia-cuda-runtime"
#: Specifier operators whose version is a floor (or the version itself) of what is installed.
_FLOOR_OPS = (">=", "==", "===", "~=", ">")


# ------------------------------------------------------------------------- export dates


@dataclass(frozen=True, kw_only=True, slots=True)
class ExportTable:
    """When each ``cuda*`` symbol was exported by libcudart (CUDA's integer encoding, 12050)."""

    first: Mapping[str, int]  #: symbol -> oldest libcudart read that exports it
    last: Mapping[str, int]  #: symbol -> newest libcudart read that exports it
    versions: tuple[int, ...]  #: the libcudart versions read, oldest first

    @property
    def oldest(self) -> int:
        return self.versions[0]

    def label(self) -> str:
        """``libcudart 11.7-13.5`` (what was read)."""
        return f"libcudart {version_text(self.versions[0])}-{version_text(self.versions[-1])}"


def version_text(v: int) -> str:
    """12050 -> ``12.5``."""
    return str(CudaVersion.from_int(v))


@cache
def export_table() -> ExportTable:
    """The packaged export dates (read once)."""
    data = json.loads(resources.files("cumatrix").joinpath(EXPORTS_FILE).read_text())
    return parse_export_table(data)


def parse_export_table(data: object) -> ExportTable:
    """Check and type the content of ``cudart_exports.json``; ``ValueError`` when malformed."""
    if not isinstance(data, Mapping) or data.get("schema") != _EXPORTS_SCHEMA:
        raise ValueError(f"cumatrix/{EXPORTS_FILE}: unsupported schema")
    versions = sorted(int(CudaVersion.parse(v)) for v in data["versions"])
    newest = versions[-1]
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for name, span in data["symbols"].items():
        first[name] = int(CudaVersion.parse(span[0]))
        last[name] = int(CudaVersion.parse(span[1])) if len(span) > 1 else newest
    return ExportTable(first=first, last=last, versions=tuple(versions))


# ----------------------------------------------------------------- architecture floors


@cache
def _arch_floors() -> dict[int, CudaVersion]:
    data = json.loads(resources.files("cumatrix").joinpath("data/nvidia.json").read_text())
    out: dict[int, CudaVersion] = {}
    for cc, cuda in data.get("arch_min_cuda", {}).items():
        major, minor = cc.split(".")
        out[int(major) * 10 + int(minor)] = CudaVersion.parse(cuda)
    return out


def arch_min_cuda(arch: int) -> CudaVersion | None:
    """The oldest CUDA (driver) that supports a GPU of SM number ``arch`` (90 -> 11.8);
    ``None`` for an architecture the table does not list."""
    return _arch_floors().get(arch)


@cache
def compat_floor(major: int) -> str | None:
    """The oldest driver that runs every CUDA ``major``.x runtime under minor-version
    compatibility (``data/nvidia.json`` ``minor_version_compat_floor``)."""
    data = json.loads(resources.files("cumatrix").joinpath("data/nvidia.json").read_text())
    floor = data.get("minor_version_compat_floor", {}).get(str(major))
    return str(floor) if floor else None


def min_driver_text(cuda: CudaVersion) -> str:
    """``CUDA 12.8 (driver >= 570.26)``, as far as the rules table knows the driver."""
    drv = rules().min_driver_for(cuda)
    return f"CUDA {cuda} (driver >= {drv})" if drv and cuda.major >= 12 else f"CUDA {cuda}"


# ------------------------------------------------------------ runtimes loaded at run time


def elf_sonames(elf: ELFFile) -> frozenset[str]:
    """CUDA sonames (``libcudart.so.N``, ``libcuda.so.1``, ``libcublas.so.N``...) named as C strings in the loaded,
    non-executable data of ``elf`` (``.rodata`` and the like: what ``dlopen`` is passed)."""
    found: set[str] = set()
    for buf in data_chunks(elf, keep=40):
        for m in _SONAME_RE.finditer(buf, 1):
            prev = buf[m.start() - 1]
            # "libcudart.so.12" alone or at the end of a path ("/usr/lib/libcudart.so.12").
            if prev == 0 or prev == ord("/"):
                found.add(m.group()[:-1].decode("ascii"))
    return frozenset(found)


def wheel_requires(wheel: Path) -> tuple[str, ...]:
    """The ``Requires-Dist`` lines of ``wheel``'s ``*.dist-info/METADATA``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            meta = [n for n in zf.namelist()
                    if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if not meta:
                return ()
            text = zf.read(meta[0]).decode("utf-8", errors="replace")
    except (zipfile.BadZipFile, OSError, KeyError):
        return ()
    head = text.split("\n\n", 1)[0]
    return tuple(line.split(":", 1)[1].strip() for line in head.splitlines()
                 if line.lower().startswith("requires-dist:"))


def runtime_requirement(requires: Iterable[str]) -> tuple[int, str] | None:
    """(major, the requirement) of a ``Requires-Dist`` on NVIDIA's runtime wheel:
    ``nvidia-cuda-runtime-cu12`` is 12; ``nvidia-cuda-runtime>=13.0.48`` is 13 (the name
    without a suffix starts at CUDA 13)."""
    for req in requires:
        try:
            parsed = Requirement(req)
        except InvalidRequirement:
            continue  # a line pip would refuse too: no evidence either way
        name = canonicalize_name(parsed.name)
        suffix = name.removeprefix(_RUNTIME_DIST)
        if suffix.startswith("-cu") and suffix[3:].isdigit():
            return int(suffix[3:]), req
        if suffix:
            continue  # another project (nvidia-cuda-runtime-something)
        floors = [s.version for s in parsed.specifier if s.operator in _FLOOR_OPS]
        return (max(map(_major, floors)) if floors else 13), req
    return None


def _major(version: str) -> int:
    """The major of a specifier's version (``13.0.*``, ``13``, ``13.0.48``); 13 where none reads."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 13


def tree_major(paths: Sequence[str]) -> tuple[int | None, str] | None:
    """(major, entry) of the first search path into an ``nvidia/cuNN/lib`` tree; the major is
    ``None`` for ``nvidia/cuda_runtime/lib``, which the CUDA 11 and 12 wheels share."""
    for p in paths:
        m = _TREE_RE.search(p)
        if m:
            return (int(m.group(1)) if m.group(1) else None), p
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class RuntimeLoad:
    """A CUDA runtime a file loads at run time, and how sure the audit is of its major."""

    major: int
    subject: str  #: ``dlopen libcudart.so.12``
    how: str  #: the evidence, for the message
    agreed: bool  #: search path and wheel dependency name the same major (an error, not a warning)


def runtime_loads(*, sonames: Iterable[str], stub_names: int, search_paths: Sequence[str],
                  requires: Sequence[str]) -> list[RuntimeLoad]:
    """The runtimes a file with no ``DT_NEEDED`` libcudart and no static copy loads itself.

    ``sonames``: :func:`elf_sonames`; ``stub_names``: how many runtime entry-point names the
    file holds as strings when it is a ``cudart_stub``-style loader (0 otherwise).
    """
    named = sorted({s for s in sonames if s.startswith("libcudart.so")})
    if not named and not stub_names:
        return []
    tree_m, dep_m, evidence = _declared_majors(search_paths, requires)
    agreed = tree_m is not None and tree_m == dep_m
    out = _named_loads(named, tree_m, evidence, agreed=agreed)
    if not out and stub_names:
        stub = _stub_load(stub_names, tree_m, dep_m, evidence, agreed=agreed)
        if stub is not None:
            out.append(stub)
    return out


def _named_loads(named: list[str], tree_m: int | None, evidence: list[str], *,
                 agreed: bool) -> list[RuntimeLoad]:
    """The runtimes of the libcudart sonames ``named`` in a file's data: each its own major,
    or the one its search path and wheel dependency agree on where the name has none."""
    out: list[RuntimeLoad] = []
    for soname in named:
        m = _LIBCUDART_SONAME_RE.match(soname)
        assert m is not None
        major = int(m.group(1)) if m.group(1) else (tree_m if agreed else None)
        if major is None:
            continue
        how = f"loads {soname} at run time (the name is in its read-only data"
        how += "; " + "; ".join(evidence) + ")" if evidence else ")"
        out.append(RuntimeLoad(major=major, subject=f"dlopen {soname}", how=how,
                               agreed=agreed and major == tree_m))
    return out


def _stub_load(stub_names: int, tree_m: int | None, dep_m: int | None, evidence: list[str], *,
               agreed: bool) -> RuntimeLoad | None:
    """The runtime a ``cudart_stub``-style loader (``stub_names`` entry-point names) loads:
    the major its search path names, else its wheel's dependency's; ``None`` where neither
    does."""
    major = tree_m if agreed else (tree_m if tree_m is not None else dep_m)
    if major is None:
        return None
    how = (f"loads a CUDA {major} runtime at run time (a cudart_stub-style table of "
           f"{stub_names} runtime entry-point names resolved with dlsym, no DT_NEEDED "
           "libcudart; " + "; ".join(evidence) + ")")
    return RuntimeLoad(major=major, subject=f"dlopen libcudart (CUDA {major})",
                       how=how, agreed=agreed)


def _declared_majors(search_paths: Sequence[str], requires: Sequence[str]
                     ) -> tuple[int | None, int | None, list[str]]:
    """The runtime major the file's search path names, the one its wheel's dependencies name
    (None: none), and that evidence in words."""
    tree = tree_major(search_paths)
    dep = runtime_requirement(requires)
    evidence: list[str] = []
    if tree:
        evidence.append(f"{'RUNPATH/RPATH'} {tree[1]}")
    if dep:
        evidence.append(f"Requires-Dist {dep[1]}")
    tree_m = tree[0] if tree else None
    dep_m = dep[0] if dep else None
    if tree and tree_m is None and dep_m in (11, 12):
        tree_m = dep_m  # nvidia/cuda_runtime/lib is the 11.x and 12.x wheels' layout
    return tree_m, dep_m, evidence
