"""The static audit of ``cumatrix gate``: what each ELF file of a wheel needs from CUDA.

Reads every ELF file of each wheel straight from the zip (:mod:`cumatrix.binary.elf`) and checks it
against facts read from real CUDA headers (:mod:`cumatrix.provision.headers`): which driver entry points
the file links and whether it links the driver library at all, which CUDA runtime major it
needs (by ``DT_NEEDED`` or a statically linked runtime) and whether the minimum driver can
run it, which runtime entry points it links that are newer than the oldest runtime it
supports, which runtime entry points with a major-dependent ABI it looks up by name and
where it picks the ABI from, and which GPU architectures its device code covers
(:mod:`cumatrix.binary.fatbin`).  The findings are data (:class:`StaticAudit` with ``to_json`` /
``from_json``); the writers below render them for a terminal, Markdown, JSON and JUnit.

Large wheels are audited on every core, one ELF member per task, each worker reading the
archive on its own handle; each member is inflated once with python-isal (see :mod:`cumatrix.binary.elf`).
"""

from __future__ import annotations

import ast
import fnmatch
import itertools
import multiprocessing
import os
import re
import textwrap
import time
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast

from elftools.elf.elffile import ELFFile

from cumatrix.audit import runtime_evidence
from cumatrix.provision import headers
from cumatrix.provision import runtimes
from cumatrix.binary import staticcudart
from cumatrix.binary.elf import (
    ELF_MAGIC,
    check_bounds,
    elf_defined_symbols,
    elf_needed,
    elf_strings,
    elf_undefined_symbols,
    member_magic,
    open_member,
)
from cumatrix.binary.fatbin import DeviceCode, Variant, covering, ptx_isa_cuda, read_fatbin
from cumatrix.binary.fastelf import FastELFFile
from cumatrix.core.model import CudaVersion
from cumatrix.predict.rules import major_newer_than_driver

Severity = Literal["error", "warning", "note"]

#: The JSON record's schema version (``findings_record``); new keys are additive.
RECORD_SCHEMA = 1

_LIBCUDA_RE = re.compile(r"^libcuda\.so(\.\d+)*$")
_LIBCUDART_RE = re.compile(r"^libcudart\.so\.(\d+)(\.\d+)*$")
# cuMemcpyBatchAsync_v2_ptsz -> cuMemcpyBatchAsync: the name cuGetProcAddress takes.
_DRIVER_BASE_RE = re.compile(r"^(cu\w+?)(?:_v\d+)?(?:_pt(?:ds|sz))?$")
_PER_THREAD_RE = re.compile(r"_pt(?:ds|sz)$")
_RUNTIME_BASE_RE = re.compile(r"^(cuda\w+?)(?:_v\d+)?(?:_pt(?:ds|sz))?$")
# Every statically linked libcudart carries its objects' names, `libcudart_static_<sha1>`
# (in .symtab, gone once stripped), its error-name table (`cudaErrorCudartUnloading`, the
# one error only the runtime itself reports) and the names of its ~300 functions (its
# cudaGetDriverEntryPoint/profiler tables): the last two survive stripping.
# The detector is one, shared with what a cell's processes mapped (binary/staticcudart.py).
_STATIC_CUDART_MARK = staticcudart.MARK
_STATIC_CUDART_ERROR = staticcudart.ERROR_NAME
_STATIC_CUDART_NAMES = staticcudart.MIN_NAMES
_MAJOR_EVIDENCE = staticcudart.MAJOR_EVIDENCE
# Version queries a file can make before choosing a major-dependent ABI.
_DRIVER_VERSION_QUERIES = ("cudaDriverGetVersion", "cuDriverGetVersion")
_RUNTIME_VERSION_QUERIES = ("cudaRuntimeGetVersion",)
# Below this much inflated ELF data a wheel is audited in-process (a pool costs more).
_PARALLEL_BYTES = 64 << 20
_SMALL_MEMBER = 1 << 20  # members up to this size are sent to workers in batches


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One problem in one ELF file of a wheel."""

    file: str  #: member path inside the wheel
    severity: Severity
    code: str  #: stable identifier: needs-libcuda, driver-symbol-too-new, runtime-major, ...
    subject: str  #: the symbol or library the finding is about
    message: str
    fix: str
    optional: bool = False  #: the file matched an ``--optional`` glob (finding downgraded)

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "severity": self.severity, "code": self.code,
                "subject": self.subject, "message": self.message, "fix": self.fix,
                "optional": self.optional}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        sev = data["severity"]
        if sev not in ("error", "warning", "note"):
            raise ValueError(f"not a finding severity: {sev!r}")
        return cls(file=str(data["file"]), severity=sev, code=str(data["code"]),
                   subject=str(data["subject"]), message=str(data["message"]),
                   fix=str(data["fix"]), optional=bool(data.get("optional", False)))


@dataclass(frozen=True, kw_only=True, slots=True)
class FileDevice:
    """The device code one ELF file carries (files without ``.nv_fatbin`` have none)."""

    file: str
    codes: tuple[DeviceCode, ...]

    @property
    def sass(self) -> tuple[str, ...]:
        return tuple(sorted({c.name for c in self.codes if c.kind == "sass"}, key=_arch_key))

    @property
    def ptx(self) -> tuple[str, ...]:
        return tuple(sorted({c.label() for c in self.codes if c.kind == "ptx"}, key=_arch_key))

    @property
    def compressed(self) -> bool:
        return any(c.compressed for c in self.codes)

    def to_json(self) -> dict[str, object]:
        return {"file": self.file, "sass": list(self.sass), "ptx": list(self.ptx),
                "codes": [c.to_json() for c in sorted(set(self.codes))]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FileDevice:
        return cls(file=str(data["file"]),
                   codes=tuple(DeviceCode.from_json(c) for c in data.get("codes", [])))


def _arch_key(name: str) -> tuple[int, str]:
    m = re.search(r"_(\d+)(\w?)", name)
    return (int(m.group(1)), name) if m else (0, name)


@dataclass(frozen=True, kw_only=True, slots=True)
class WheelAudit:
    """The static audit of one wheel."""

    wheel: Path
    elves: tuple[str, ...]  #: member paths of the ELF files audited, in archive order
    findings: tuple[Finding, ...]
    seconds: float
    device: tuple[FileDevice, ...] = ()  #: device code per ELF file that has any

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)

    @property
    def notes(self) -> int:
        return sum(f.severity == "note" for f in self.findings)

    def to_json(self) -> dict[str, object]:
        return {"wheel": self.wheel.name, "path": str(self.wheel), "elves": list(self.elves),
                "errors": self.errors, "warnings": self.warnings, "notes": self.notes,
                "seconds": round(self.seconds, 4),
                "findings": [f.to_json() for f in self.findings],
                "device": [d.to_json() for d in self.device]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WheelAudit:
        return cls(wheel=Path(str(data.get("path", data["wheel"]))),
                   elves=tuple(str(e) for e in data.get("elves", [])),
                   findings=tuple(Finding.from_json(f) for f in data.get("findings", [])),
                   seconds=float(data.get("seconds", 0.0)),
                   device=tuple(FileDevice.from_json(d) for d in data.get("device", [])))


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditSettings:
    """What the wheel claims to support: the options of ``cumatrix gate``'s static audit."""

    min_driver: CudaVersion
    runtimes: tuple[int, ...] | None = None  #: runtime majors (``--runtimes``)
    strict: bool = False
    optional: tuple[str, ...] = ()
    forward_compat: bool = False  #: a newer runtime major than the driver runs via cuda-compat
    min_runtime: CudaVersion | None = None  #: oldest runtime supported; None: not checked
    arch_list: tuple[tuple[int, Variant], ...] | None = None  #: GPUs to cover; None: not checked

    def to_json(self) -> dict[str, object]:
        return {"min_driver": str(self.min_driver),
                "runtimes": list(self.runtimes) if self.runtimes else None,
                "strict": self.strict, "optional": list(self.optional),
                "forward_compat": self.forward_compat,
                "min_runtime": str(self.min_runtime) if self.min_runtime else None,
                "arch_list": ([f"{a // 10}.{a % 10}{v}" for a, v in self.arch_list]
                              if self.arch_list is not None else None)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AuditSettings:
        from cumatrix.binary.fatbin import parse_arch
        arch = data.get("arch_list")
        mr = data.get("min_runtime")
        rts = data.get("runtimes")
        return cls(min_driver=CudaVersion.parse(str(data["min_driver"])),
                   runtimes=tuple(int(r) for r in rts) if rts else None,
                   strict=bool(data.get("strict", False)),
                   optional=tuple(str(g) for g in data.get("optional", [])),
                   forward_compat=bool(data.get("forward_compat", False)),
                   min_runtime=CudaVersion.parse(str(mr)) if mr else None,
                   arch_list=tuple(parse_arch(str(a)) for a in arch) if arch is not None
                   else None)


@dataclass(frozen=True, kw_only=True, slots=True)
class StaticAudit:
    """The whole static stage: its settings and one :class:`WheelAudit` per wheel.

    ``to_json`` is the ``{"type": "static"}`` record of ``results.jsonl`` and ``static.json``;
    ``from_json`` reads it back, so a report writer renders the findings from the run's data.
    """

    settings: AuditSettings | None
    wheels: tuple[WheelAudit, ...]
    sources: tuple[str, ...] = ()  #: header versions the facts came from

    @property
    def errors(self) -> int:
        return sum(a.errors for a in self.wheels)

    @property
    def warnings(self) -> int:
        return sum(a.warnings for a in self.wheels)

    def to_json(self) -> dict[str, object]:
        return {
            "schema": RECORD_SCHEMA,
            "type": "static",
            "settings": self.settings.to_json() if self.settings else None,
            "sources": list(self.sources),
            "errors": self.errors,
            "warnings": self.warnings,
            # Flat list kept for readers of the first record format.
            "findings": [{"wheel": a.wheel.name, **f.to_json()}
                         for a in self.wheels for f in a.findings],
            "wheels": [a.to_json() for a in self.wheels],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StaticAudit:
        if data.get("type") != "static":
            raise ValueError("not a static audit record (type != 'static')")
        if data.get("schema") != RECORD_SCHEMA:
            raise ValueError(f"static audit record schema {data.get('schema')!r} is not "
                             f"{RECORD_SCHEMA}")
        settings = data.get("settings")
        wheels: list[WheelAudit] = []
        flat = list(data.get("findings", []))
        for w in data.get("wheels", []):
            if "findings" not in w:  # the first record format: findings only in the flat list
                w = {**w, "findings": [f for f in flat if f.get("wheel") == w["wheel"]]}
            wheels.append(WheelAudit.from_json(w))
        return cls(settings=AuditSettings.from_json(settings) if settings else None,
                   wheels=tuple(wheels), sources=tuple(data.get("sources", [])))


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditData:
    """Facts from CUDA headers the audit checks against."""

    introductions: Mapping[str, int]  #: exported driver symbol -> CUDA version (12080)
    abi_changes: Mapping[str, tuple[str, str]]  #: runtime function -> (old, new) prototype
    sources: tuple[str, ...]  #: which headers, e.g. ("12.9", "13.5")
    #: runtime symbol -> the oldest libcudart, among those read, exporting it (12050)
    runtime_introductions: Mapping[str, int] = field(default_factory=dict)
    runtime_sources: tuple[str, ...] = ()  #: which libcudart versions were read for that
    #: runtime symbol -> the newest libcudart, among those read, exporting it
    runtime_last: Mapping[str, int] = field(default_factory=dict)
    #: the audited wheel's ``Requires-Dist`` lines (set per wheel by :func:`audit_wheel`)
    requires: tuple[str, ...] = ()


# --------------------------------------------------------------------------- the audit


def _driver_base(symbol: str) -> str:
    m = _DRIVER_BASE_RE.match(symbol)
    return m.group(1) if m else symbol


def _param_count(prototype: str) -> int:
    inner = prototype[prototype.find("(") + 1:prototype.rfind(")")].strip()
    if not inner:
        return 0
    depth, count = 0, 1
    for ch in inner:
        depth += ch == "("
        depth -= ch == ")"
        count += ch == "," and depth == 0
    return count


def _abi_text(name: str, abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str]) -> str:
    if isinstance(abi_changed, Mapping):
        old, new = (_param_count(p) for p in abi_changed[name])
        if old != new:
            return f"{old} parameters in the older major, {new} in the newer"
        return "same parameter count, different parameter types"
    return "its prototype differs between CUDA majors"


def _min_driver_for_major(major: int) -> str | None:
    from cumatrix.core.model import CudaVersion
    from cumatrix.predict.rules import rules

    return rules().min_driver_for(CudaVersion(major, 0)) or runtime_evidence.compat_floor(major)


def _runtime_intro(sym: str, intros: Mapping[str, int]) -> int | None:
    if sym in intros:
        return intros[sym]
    m = _RUNTIME_BASE_RE.match(sym)
    return intros.get(m.group(1)) if m else None


def _static_runtime_major(strings: set[str], intros: Mapping[str, int]) -> int | None:
    """The CUDA major of a statically linked runtime (:func:`cumatrix.binary.staticcudart.runtime_major`).
    ``intros`` are the export dates of :mod:`cumatrix.audit.runtime_evidence`, CUDA 11.7 on, so a
    CUDA 11 runtime, which carries no name first exported by 12.0 or later, is dated 11."""
    return staticcudart.runtime_major(strings, intros)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Facts:
    """What one ELF file shows, gathered once for every check."""

    name: str
    needed: tuple[str, ...]
    undefined: frozenset[str]
    exported: frozenset[str]
    cuda_strings: frozenset[str]  #: cuda* identifiers in loaded data
    cu_strings: frozenset[str]  #: cu* identifiers in loaded data (driver lookups)
    static_runtime: bool
    sonames: frozenset[str] = frozenset()  #: libcudart.so.N / libcuda.so.1 named in data
    search_paths: tuple[str, ...] = ()  #: DT_RPATH and DT_RUNPATH entries
    requires: tuple[str, ...] = ()  #: the wheel's Requires-Dist lines


def _needs_libcuda(f: _Facts, s: AuditSettings) -> list[Finding]:
    out: list[Finding] = []
    for lib in f.needed:
        if _LIBCUDA_RE.match(lib):
            out.append(Finding(
                file=f.name, severity="error" if s.strict else "warning", code="needs-libcuda",
                subject=lib,
                message=(f"DT_NEEDED {lib}: the dynamic loader needs the NVIDIA driver library "
                         "just to load this file, so the wheel cannot be imported on a machine "
                         "without a driver, which breaks CPU-only CI and docs builds"),
                fix=("do not link libcuda: dlopen(\"libcuda.so.1\") when CUDA is first used and "
                     "resolve driver entry points with cuGetProcAddress at run time "
                     "(vLLM PR 38919)"),
            ))
    return out


def _runtime_majors(f: _Facts, data: AuditData) -> list[tuple[int, str, str]]:
    """(major, subject, how) for each runtime the file carries or loads."""
    out: list[tuple[int, str, str]] = []
    for lib in f.needed:
        m = _LIBCUDART_RE.match(lib)
        if m:
            out.append((int(m.group(1)), lib, f"DT_NEEDED {lib}"))
    if f.static_runtime:
        major = _static_runtime_major(set(f.cuda_strings), data.runtime_introductions)
        if major is not None:
            out.append((major, f"static libcudart {major}",
                        f"a statically linked CUDA {major} runtime (libcudart_static)"))
    return out


def _runtime_loads(f: _Facts, data: AuditData) -> list[runtime_evidence.RuntimeLoad]:
    """Runtimes ``f`` loads at run time (dlopen): only for a file that neither links one nor
    carries one, where nothing else says which major it needs."""
    if f.static_runtime or any(_LIBCUDART_RE.match(lib) for lib in f.needed):
        return []
    names = sum(t in data.runtime_introductions for t in f.cuda_strings)
    stub = names if names >= _STATIC_CUDART_NAMES else 0
    return runtime_evidence.runtime_loads(sonames=f.sonames, stub_names=stub,
                                          search_paths=f.search_paths, requires=f.requires)


def _runtime_major_checks(f: _Facts, s: AuditSettings, data: AuditData) -> list[Finding]:
    out: list[Finding] = []
    found: list[tuple[int, str, str, Severity]] = [
        (major, subject, how, "error") for major, subject, how in _runtime_majors(f, data)]
    # A runtime loaded at run time is as binding as a linked one when the file's search path
    # and the wheel's dependency agree on it; a soname string alone is a warning.
    found += [(r.major, r.subject, r.how, "error" if r.agreed else "warning")
              for r in _runtime_loads(f, data)]
    for major, subject, how, worst in found:
        if s.runtimes is not None and major not in s.runtimes:
            declared = ",".join(str(r) for r in s.runtimes)
            out.append(Finding(
                file=f.name, severity=worst, code="runtime-major", subject=subject,
                message=(f"{how}: this file loads only next to a CUDA {major} runtime, outside "
                         f"the declared runtime majors ({declared})"),
                fix=(f"build it against a CUDA {declared} runtime, publish one wheel per CUDA "
                     "major, or declare the major with --runtimes"),
            ))
        if not major_newer_than_driver(int(CudaVersion(major, 0)), int(s.min_driver)):
            continue
        drv = _min_driver_for_major(major)
        drv_text = f"a CUDA {major}.0 driver (>= {drv})" if drv else f"a CUDA {major}.0 driver"
        if s.forward_compat:
            out.append(Finding(
                file=f.name, severity="note", code="runtime-needs-newer-driver",
                subject=subject,
                message=(f"{how} needs {drv_text}, newer than --min-driver {s.min_driver}; "
                         "accepted with --forward-compat: only data-centre GPUs with NVIDIA's "
                         f"cuda-compat package for CUDA {major} run it on an older driver"),
                fix=(f"document that drivers below CUDA {major}.0 need the cuda-compat package "
                     "(data-centre GPUs only)"),
            ))
            continue
        out.append(Finding(
            file=f.name, severity=worst, code="runtime-needs-newer-driver", subject=subject,
            message=(f"{how} needs {drv_text}, newer than --min-driver {s.min_driver}: on older "
                     "drivers every CUDA call fails with cudaErrorInsufficientDriver (35)"),
            fix=(f"raise --min-driver to {major}.0, build against a CUDA "
                 f"{s.min_driver.major} runtime, or, for data-centre GPUs with cuda-compat "
                 "only, pass --forward-compat"),
        ))
    return out


def _driver_symbol_checks(f: _Facts, s: AuditSettings, data: AuditData) -> list[Finding]:
    out: list[Finding] = []
    floor = int(s.min_driver)
    for sym in sorted(f.undefined):
        intro = data.introductions.get(sym)
        if intro is None or intro <= floor:
            continue
        v = CudaVersion.from_int(intro)
        out.append(Finding(
            file=f.name, severity="error", code="driver-symbol-too-new", subject=sym,
            message=(f"links driver entry point {sym}, introduced in CUDA {v}, newer than "
                     f"--min-driver {s.min_driver}: on drivers older than {v} importing this "
                     f"file fails with `undefined symbol: {sym}` (vLLM PR 38460)"),
            fix=(f"resolve it at run time with cuGetProcAddress(\"{_driver_base(sym)}\", "
                 f"{intro}, ...) and fall back when it returns NULL (vLLM PR 38919), or raise "
                 f"--min-driver to {v} if drivers older than that are really unsupported"),
        ))
    return out


def _underlinked_checks(f: _Facts, data: AuditData) -> list[Finding]:
    if any(_LIBCUDA_RE.match(lib) for lib in f.needed):
        return []
    syms = sorted(s for s in f.undefined if s in data.introductions)
    if not syms:
        return []
    shown = ", ".join(syms[:5]) + (f" and {len(syms) - 5} more" if len(syms) > 5 else "")
    return [Finding(
        file=f.name, severity="error", code="underlinked-libcuda", subject=syms[0],
        message=(f"needs driver entry points ({shown}) but has no DT_NEEDED libcuda.so.1: "
                 f"importing it fails with `undefined symbol: {syms[0]}` unless something else "
                 "loaded libcuda with RTLD_GLOBAL first (Mooncake issue 724)"),
        fix=("resolve them at run time with cuGetProcAddress (dlopen libcuda.so.1 first), or "
             "link libcuda (-lcuda) so the loader finds them"),
    )]


def _runtime_floor_checks(f: _Facts, s: AuditSettings, data: AuditData) -> list[Finding]:
    if s.min_runtime is None or not data.runtime_introductions:
        return []
    out: list[Finding] = []
    majors = [int(m.group(1)) for lib in f.needed if (m := _LIBCUDART_RE.match(lib))]
    # A file that loads libcudart.so.13 cannot meet a 12.x runtime: runtime-major says so.
    floor = max([int(s.min_runtime)] + [m * 1000 for m in majors])
    older = [int(CudaVersion.parse(x)) for x in data.runtime_sources]
    oldest = min(older, default=0)
    read = (f"libcudart {data.runtime_sources[0]}-{data.runtime_sources[-1]} read"
            if data.runtime_sources else "")
    for sym in sorted(f.undefined):
        if not sym.startswith("cuda"):
            continue
        intro = _runtime_intro(sym, data.runtime_introductions)
        # Exported by the oldest libcudart read: older than that is all the data says.
        if intro is None or intro <= floor or intro <= oldest:
            continue
        v, fv = CudaVersion.from_int(intro), CudaVersion.from_int(floor)
        before = max((x for x in older if x < intro), default=0)
        # Versions between two read ones were not read: there, the date is a range.
        exact = before >= floor
        out.append(Finding(
            file=f.name, severity="error" if exact else "warning",
            code="runtime-symbol-too-new", subject=sym,
            message=(f"links runtime entry point {sym}, first exported by libcudart {v} "
                     f"({read}), newer than the oldest runtime "
                     f"supported ({fv}): next to an older libcudart importing this file fails "
                     f"with `undefined symbol: {sym}`"
                     + ("" if exact else f" (libcudart {fv} was not read: it may be older)")),
            fix=(f"look it up with cudaGetDriverEntryPoint/dlsym and fall back when absent, or "
                 f"raise --min-runtime (and the runtime dependency) to {v}"),
        ))
    return out


def _dispatch_checks(f: _Facts, data: AuditData,
                     abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str]) -> list[Finding]:
    # A statically linked runtime names every runtime function (its own tables): not lookups.
    if not abi_changed or f.static_runtime:
        return []
    out: list[Finding] = []
    asked = f.undefined | f.cuda_strings | f.cu_strings
    driver_q = sorted(q for q in _DRIVER_VERSION_QUERIES if q in asked)
    runtime_q = sorted(q for q in _RUNTIME_VERSION_QUERIES if q in asked)
    for text in sorted(f.cuda_strings):
        base = _PER_THREAD_RE.sub("", text)
        # A file that exports the name is a runtime itself (a vendored libcudart).
        if base not in abi_changed or base in f.exported or text in f.exported:
            continue
        abi = _abi_text(base, abi_changed)
        if runtime_q:
            out.append(Finding(
                file=f.name, severity="note", code="abi-lookup-runtime-version", subject=text,
                message=(f"names \"{text}\" as a string (looked up at run time; its ABI changed "
                         f"between CUDA majors: {abi}) and asks {runtime_q[0]}: the ABI is "
                         "chosen from the runtime actually loaded, as it must be"),
                fix="none needed (SGLang PR 23183)",
            ))
        elif driver_q:
            out.append(Finding(
                file=f.name, severity="error", code="abi-lookup-driver-version", subject=text,
                message=(f"names \"{text}\" as a string (looked up at run time; its ABI changed "
                         f"between CUDA majors: {abi}) and asks {driver_q[0]} but never "
                         "cudaRuntimeGetVersion: it picks the ABI from the driver, so a CUDA 12 "
                         "runtime on a 13.x driver is called with the 13.x ABI and crashes "
                         "(SIGSEGV, SGLang PR 23172)"),
                fix=("choose the ABI from cudaRuntimeGetVersion of the runtime actually loaded "
                     "(SGLang PR 23183)"),
            ))
        else:
            out.append(Finding(
                file=f.name, severity="warning", code="abi-lookup", subject=text,
                message=(f"names \"{text}\" as a string, so it is looked up at run time "
                         f"(dlsym): its ABI changed between CUDA majors ({abi}), and the static "
                         "audit cannot see which ABI the code assumes"),
                fix=("choose the ABI from cudaRuntimeGetVersion of the runtime actually loaded, "
                     "never from cudaDriverGetVersion or compile-time CUDA_VERSION "
                     "(SGLang PR 23183, SGLang issue 36302)"),
            ))
    return out


def _arch_name(arch: int, variant: str) -> str:
    return f"{arch // 10}.{arch % 10}{variant}"


def device_checks(name: str, codes: tuple[DeviceCode, ...], s: AuditSettings) -> list[Finding]:
    """Findings for the GPUs of ``s.arch_list`` that ``codes`` leaves uncovered."""
    if s.arch_list is None or not codes:
        return []
    out: list[Finding] = []
    for arch, _ in s.arch_list:
        sass, ptx = covering(codes, arch)
        gpu = _arch_name(arch, "")
        have = ", ".join(sorted({c.label() for c in codes}, key=_arch_key))
        if sass:
            continue
        if not ptx:
            out.append(Finding(
                file=name, severity="error", code="no-device-code", subject=f"sm_{arch}",
                message=(f"no SASS that runs on compute capability {gpu} and no PTX to compile "
                         f"for it (the file has {have}): a kernel launch there fails with `no "
                         "kernel image is available for execution on the device`"),
                fix=(f"add -gencode arch=compute_{arch},code=sm_{arch} (or PTX of an older arch "
                     "for JIT: code=compute_XY)"),
            ))
            continue
        # A GPU of this generation runs no driver older than the first that supports it, so
        # the PTX must JIT on that driver, not on an older --min-driver.
        gen = runtime_evidence.arch_min_cuda(arch)
        floor = max(s.min_driver, gen) if gen is not None else s.min_driver
        raised = (f"; a compute capability {gpu} GPU needs "
                  f"{runtime_evidence.min_driver_text(floor)} anyway, so that is the floor here"
                  if floor > s.min_driver else "")
        usable = [c for c in ptx if c.isa is not None and (cv := ptx_isa_cuda(c.isa)) is not None
                  and CudaVersion(*cv) <= floor]
        if usable:
            continue
        newest = min(ptx, key=lambda c: c.isa or (99, 99))
        isa = newest.isa
        need = ptx_isa_cuda(isa) if isa else None
        need_text = (f"a CUDA {need[0]}.{need[1]} driver" if need
                     else "a driver newer than any this audit knows")
        out.append(Finding(
            file=name, severity="error", code="ptx-too-new", subject=f"sm_{arch}",
            message=(f"the only code for compute capability {gpu} is {newest.label()}, which "
                     f"needs {need_text} to JIT-compile, newer than --min-driver "
                     f"{s.min_driver}{raised}: the load fails with "
                     "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222) there"),
            fix=(f"add SASS for sm_{arch}, or build the PTX with a toolkit no newer than "
                 f"CUDA {floor}"),
        ))
    return out


def _gather(name: str, elf: ELFFile, data: AuditData) -> _Facts:
    names = elf_strings(elf, ("cu", _STATIC_CUDART_MARK))
    cuda = {t for t in names if t.startswith("cuda")}
    cu = {t for t in names if t.startswith(_DRIVER_VERSION_QUERIES)}
    sonames = runtime_evidence.elf_sonames(elf)
    return _Facts(
        name=name, needed=tuple(elf_needed(elf)),
        undefined=frozenset(elf_undefined_symbols(elf)),
        exported=frozenset(elf_defined_symbols(elf)),
        cuda_strings=frozenset(cuda), cu_strings=frozenset(cu),
        static_runtime=_is_static_runtime(names, cuda, data),
        sonames=sonames, search_paths=runtime_evidence.elf_search_paths(elf),
        requires=data.requires,
    )


def _is_static_runtime(names: set[str], cuda: set[str], data: AuditData) -> bool:
    """Whether the file carries a copy of libcudart (:func:`cumatrix.binary.staticcudart.is_static_runtime`)."""
    return staticcudart.is_static_runtime(names, cuda, data.runtime_introductions)


def elf_device_code(elf: ELFFile) -> tuple[DeviceCode, ...]:
    """The entries of ``elf``'s ``.nv_fatbin`` section (none when it has no such section)."""
    section = elf.get_section_by_name(".nv_fatbin")
    if section is None or section["sh_type"] == "SHT_NOBITS":
        return ()
    return read_fatbin(elf.stream, section["sh_offset"], section["sh_size"])


def audit_elf(
    name: str,
    elf: ELFFile,
    *,
    min_driver: CudaVersion,
    runtimes: tuple[int, ...] | None,
    strict: bool,
    introductions: Mapping[str, int],
    abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str],
    settings: AuditSettings | None = None,
    data: AuditData | None = None,
) -> list[Finding]:
    """The findings for one ELF file (``name`` is its path in the wheel).

    ``settings`` and ``data``, when given, enable the checks beyond the driver symbols,
    ``DT_NEEDED`` and ABI lookups (runtime floor, device code).
    """
    s = settings or AuditSettings(min_driver=min_driver, runtimes=runtimes, strict=strict)
    d = data or AuditData(introductions=introductions, abi_changes={}, sources=())
    findings, _ = _audit_one(name, elf, s, replace(d, introductions=introductions), abi_changed)
    return findings


def _audit_one(name: str, elf: ELFFile, s: AuditSettings, data: AuditData,
               abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str]
               ) -> tuple[list[Finding], tuple[DeviceCode, ...]]:
    f = _gather(name, elf, data)
    out = _needs_libcuda(f, s)
    out += _runtime_major_checks(f, s, data)
    out += _driver_symbol_checks(f, s, data)
    out += _underlinked_checks(f, data)
    out += _runtime_floor_checks(f, s, data)
    out += _dispatch_checks(f, data, abi_changed)
    codes = elf_device_code(elf)
    out += device_checks(name, codes, s)
    return out, codes


def _unreadable(name: str, err: BaseException) -> Finding:
    what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return Finding(
        file=name, severity="error", code="unreadable-elf", subject=name,
        message=f"{name} starts with the ELF magic but could not be read: {what}",
        fix="rebuild the file; the audit cannot vouch for what it cannot read",
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _MemberResult:
    name: str
    is_elf: bool
    findings: tuple[Finding, ...]
    codes: tuple[DeviceCode, ...]


def _audit_member(wheel: Path, member: str, s: AuditSettings, data: AuditData,
                  abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str]
                  ) -> _MemberResult:
    """Audit one member; any failure to read it (a damaged zip entry, an ELF that pyelftools
    or the fat binary reader rejects, however it fails) is an ``unreadable-elf`` finding."""
    try:
        info = _INFOS.get(member)
        if info is None or info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            # Not listed by _candidates, or a method only zipfile reads: the slow way.
            with zipfile.ZipFile(wheel) as zf, open(wheel, "rb") as raw:
                zinfo = zf.getinfo(member)
                return _audit_stream(member, open_member(zf, raw, zinfo), zinfo.file_size, s,
                                     data, abi_changed)
        with open(wheel, "rb") as raw:
            # Stored and deflated members need only the archive handle: no central directory
            # is parsed again per member (2,000 entries took 40 ms a member in CuPy's wheel).
            return _audit_stream(member, open_member(cast(zipfile.ZipFile, None), raw, info),
                                 info.file_size, s, data, abi_changed)
    except Exception as e:  # noqa: BLE001 - a hostile file may break any parser in any way
        return _MemberResult(name=member, is_elf=True, findings=(_unreadable(member, e),),
                             codes=())


def _audit_stream(member: str, stream: Any, size: int, s: AuditSettings, data: AuditData,
                  abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str]
                  ) -> _MemberResult:
    try:
        try:
            if stream.read(len(ELF_MAGIC)) != ELF_MAGIC:
                return _MemberResult(name=member, is_elf=False, findings=(), codes=())
            stream.seek(0)
            elf = ELF_READER(stream)
            check_bounds(elf, size)  # header counts bounded before any is read
            findings, codes = _audit_one(member, elf, s, data, abi_changed)
        finally:
            stream.close()
    except Exception as e:  # noqa: BLE001 - a hostile file may break any parser in any way
        return _MemberResult(name=member, is_elf=True, findings=(_unreadable(member, e),),
                             codes=())
    return _MemberResult(name=member, is_elf=True, findings=tuple(findings), codes=codes)


#: The reader of a member's ELF file: :class:`FastELFFile` parses the section table once
#: (same values as pyelftools' :class:`ELFFile`, which the equivalence test swaps in).
ELF_READER: Callable[[Any], ELFFile] = FastELFFile


#: The zip entries of the wheel being audited, by member name: read once by _candidates in
#: the parent (plain data, no file handle, so forked workers inherit them safely).
_INFOS: dict[str, zipfile.ZipInfo] = {}


# Set in the parent before the pool forks, so workers inherit the (large) header facts.
_WORKER_STATE: tuple[Path, AuditSettings, AuditData,
                     Mapping[str, tuple[str, str]] | AbstractSet[str]] | None = None


def _worker(member: str) -> _MemberResult:
    assert _WORKER_STATE is not None  # set before the fork
    wheel, s, data, abi = _WORKER_STATE
    return _audit_member(wheel, member, s, data, abi)


def _candidates(wheel: Path) -> list[tuple[str, int]]:
    """(member, uncompressed size) of the members that start with the ELF magic."""
    out: list[tuple[str, int]] = []
    _INFOS.clear()
    with zipfile.ZipFile(wheel) as zf, open(wheel, "rb") as raw:
        for info in zf.infolist():
            if info.is_dir() or info.file_size < len(ELF_MAGIC):
                continue
            _INFOS[info.filename] = info
            try:
                head = member_magic(raw, info, len(ELF_MAGIC))
            except Exception:  # noqa: BLE001 - audited (and reported) member by member
                head = ELF_MAGIC
            if head == ELF_MAGIC:
                out.append((info.filename, info.file_size))
    return out


def _workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _run_members(wheel: Path, members: list[tuple[str, int]], s: AuditSettings,
                 data: AuditData, abi: Mapping[str, tuple[str, str]] | AbstractSet[str],
                 jobs: int | None) -> dict[str, _MemberResult]:
    n = min(jobs or _workers(), len(members))
    total = sum(size for _, size in members)
    if n <= 1 or total < _PARALLEL_BYTES or "fork" not in multiprocessing.get_all_start_methods():
        return {m: _audit_member(wheel, m, s, data, abi) for m, _ in members}
    global _WORKER_STATE
    _WORKER_STATE = (wheel, s, data, abi)
    try:
        # Largest first, so the long members start at once and the small ones fill in.
        order = [m for m, _ in sorted(members, key=lambda x: -x[1])]
        big = [m for m, size in sorted(members, key=lambda x: -x[1]) if size > _SMALL_MEMBER]
        small = order[len(big):]
        # Small members go to the workers in batches: one round trip per cubin cost more
        # than auditing it in a wheel of thousands.  Large ones one at a time, for balance.
        batch = max(1, min(64, len(small) // (n * 8)))
        try:
            with ProcessPoolExecutor(max_workers=n,
                                     mp_context=multiprocessing.get_context("fork")) as pool:
                first = pool.map(_worker, big)
                rest = pool.map(_worker, small, chunksize=batch)
                return {r.name: r for r in itertools.chain(first, rest)}
        except BrokenProcessPool:
            # A worker died (out of memory, a crash in a native inflater on a hostile file):
            # audit in this process instead, where each member's failure is its own finding.
            return {m: _audit_member(wheel, m, s, data, abi) for m, _ in members}
    finally:
        _WORKER_STATE = None


def audit_wheel(
    wheel: Path,
    *,
    min_driver: CudaVersion,
    runtimes: tuple[int, ...] | None,
    strict: bool,
    optional: tuple[str, ...],
    introductions: Mapping[str, int],
    abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str],
    settings: AuditSettings | None = None,
    data: AuditData | None = None,
    jobs: int | None = None,
) -> WheelAudit:
    """Audit every ELF file of ``wheel`` without extracting it.

    ``introductions`` maps exported driver symbols to the CUDA version that introduced
    them (:func:`cumatrix.provision.headers.load_introductions`); ``abi_changed`` names the runtime
    functions whose ABI differs between majors (:func:`cumatrix.provision.headers.runtime_abi_changes`;
    a mapping adds the prototypes to the message).  ``settings`` (all of the gate's options)
    and ``data`` (:func:`load_audit_data`) enable the further checks.  Findings of files
    matching an ``optional`` glob are downgraded to warnings and marked optional.  Large
    wheels are read on ``jobs`` processes (default: every core).  Raises
    :class:`zipfile.BadZipFile` when ``wheel`` is not a zip archive.
    """
    start = time.perf_counter()
    s = settings or AuditSettings(min_driver=min_driver, runtimes=runtimes, strict=strict,
                                  optional=optional)
    d = replace(data, introductions=introductions) if data else AuditData(
        introductions=introductions, abi_changes={}, sources=())
    d = replace(d, requires=runtime_evidence.wheel_requires(wheel))
    members = _candidates(wheel)
    try:
        results = _run_members(wheel, members, s, d, abi_changed, jobs)
    finally:
        _INFOS.clear()
    elves: list[str] = []
    findings: list[Finding] = []
    device: list[FileDevice] = []
    for m, _ in members:
        r = results[m]
        if not r.is_elf:
            continue
        elves.append(m)
        findings.extend(r.findings)
        if r.codes:
            device.append(FileDevice(file=m, codes=r.codes))
    globs = s.optional or optional
    if globs:
        findings = [
            replace(f, severity="warning", optional=True)
            if f.severity == "error" and any(fnmatch.fnmatchcase(f.file, g) for g in globs)
            else replace(f, optional=True)
            if any(fnmatch.fnmatchcase(f.file, g) for g in globs) else f
            for f in findings
        ]
    findings.extend(optional_import_notes(wheel, findings))
    return WheelAudit(wheel=wheel, elves=tuple(elves), findings=tuple(findings),
                      seconds=time.perf_counter() - start, device=tuple(device))


# ------------------------------------------------------------ guarded (optional) imports


def _module_of(member: str) -> str | None:
    """``pkg/sub/_C.abi3.so`` -> ``pkg.sub._C``; ``None`` for a file Python does not import."""
    parts = member.split("/")
    if not parts[-1].endswith(".so") and ".so." not in parts[-1]:
        return None
    if any(p.endswith((".libs", ".data")) or p in ("lib", "lib64") for p in parts[:-1]):
        return None
    stem = parts[-1].split(".")[0]
    return ".".join([*parts[:-1], stem]) if stem.isidentifier() else None


def _import_names(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        pkg = package.split(".")
        pkg = pkg[: len(pkg) - node.level + 1]
        base = ".".join([*pkg, base] if base else pkg)
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def _imports(tree: ast.AST, package: str) -> list[tuple[str, int, bool]]:
    """(absolute module, line, guarded) of every import; guarded: inside a ``try:`` body
    whose handlers catch ImportError (or a base of it)."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        catches = set()
        for h in node.handlers:
            types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
            catches |= {t.id for t in types if isinstance(t, ast.Name)}
            if h.type is None:
                catches.add("ImportError")
        if catches & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}:
            guarded |= {id(sub) for stmt in node.body for sub in ast.walk(stmt)}
    return [(name, node.lineno, id(node) in guarded)
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in _import_names(node, package)]


def _python_trees(wheel: Path, wanted: re.Pattern[bytes]) -> Iterator[tuple[str, ast.AST]]:
    """The parsed ``.py`` members of ``wheel`` whose text matches ``wanted``."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if not info.filename.endswith(".py") or info.file_size > 4 << 20:
                continue
            raw = zf.read(info)
            if not wanted.search(raw):
                continue
            try:
                yield info.filename, ast.parse(raw.decode("utf-8", errors="replace"))
            except (SyntaxError, ValueError, RecursionError):
                continue


def optional_import_notes(wheel: Path, findings: Sequence[Finding]) -> list[Finding]:
    """A note for each file with an error finding that the wheel's Python code imports only
    inside ``try/except ImportError``: the project may treat it as optional."""
    failing = {f.file for f in findings if f.severity == "error"}
    modules = {m: f for f in failing if (m := _module_of(f)) is not None}
    if not modules:
        return []
    stems = {m.rsplit(".", 1)[-1] for m in modules}
    # Only files with an import line naming a stem are parsed (parsing all of vLLM's took 10 s).
    wanted = re.compile(rb"^[ \t]*(?:from|import)[ \t][^\n]*\b(?:"
                        + b"|".join(re.escape(s.encode()) for s in sorted(stems)) + rb")\b",
                        re.MULTILINE)
    found: dict[str, tuple[str, int]] = {}
    plain: set[str] = set()  # imported somewhere without a guard: not optional
    try:
        for filename, tree in _python_trees(wheel, wanted):
            parts = filename[:-3].split("/")
            package = ".".join(parts if parts[-1] == "__init__" else parts[:-1]).removesuffix(".__init__")
            for mod, line, guarded in _imports(tree, package):
                if mod not in modules:
                    continue
                if not guarded:
                    plain.add(mod)
                elif mod not in found:
                    found[mod] = (filename, line)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return []
    out: list[Finding] = []
    for mod, (py, line) in sorted(found.items()):
        if mod in plain:
            continue
        file = modules[mod]
        out.append(Finding(
            file=file, severity="note", code="optional-import", subject=mod,
            message=(f"the wheel's Python code imports {mod} only inside try/except "
                     f"ImportError ({py}:{line}): if the package is meant to work without it, "
                     "these errors do not break its users"),
            fix=f"if that is intended, pass --optional '{file}' to report it as a warning",
        ))
    return out


# ------------------------------------------------------------------------ header facts


def runtime_introductions() -> Mapping[str, int]:
    """Runtime function name -> the CUDA version whose libcudart first exported it (packaged
    data): what dates a static runtime, in a wheel's files or in what a cell mapped."""
    return runtime_evidence.export_table().first


def load_audit_data(*, wheel_dir: Path | None = None) -> AuditData:
    """Introduction versions and runtime ABI changes from the runtime wheels' headers.

    Uses the newest known runtime wheel of each CUDA major
    (:data:`cumatrix.provision.runtimes.KNOWN_WHEELS`): introductions from the newest
    ``cudaTypedefs.h``, ABI changes from diffing ``cuda_runtime_api.h`` of consecutive majors.
    Runtime symbols are dated by the libcudart builds that export them
    (:func:`cumatrix.audit.runtime_evidence.export_table`, packaged data).
    """
    newest: dict[int, CudaVersion] = {}
    for text in runtimes.KNOWN_WHEELS:
        v = CudaVersion.parse(text)
        if v > newest.get(v.major, v):
            newest[v.major] = v
        newest.setdefault(v.major, v)
    versions = [newest[m] for m in sorted(newest)]
    includes = [runtimes.headers_for(v, wheel_dir=wheel_dir) for v in versions]
    introductions = headers.load_introductions(headers.newest_typedefs(includes))
    changes: dict[str, tuple[str, str]] = {}
    for old, new in itertools.pairwise(includes):
        changes.update(headers.runtime_abi_changes(old, new))
    exports = runtime_evidence.export_table()
    return AuditData(introductions=introductions, abi_changes=changes,
                     sources=tuple(str(v) for v in versions),
                     runtime_introductions=exports.first,
                     runtime_sources=tuple(runtime_evidence.version_text(v)
                                           for v in exports.versions),
                     runtime_last=exports.last)


# --------------------------------------------------------------------------- output


def _counts(errors: int, warnings: int) -> str:
    e = f"{errors} error{'s' if errors != 1 else ''}"
    w = f"{warnings} warning{'s' if warnings != 1 else ''}"
    return f"{e}, {w}"


def _by_file(audit: WheelAudit) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {name: [] for name in audit.elves}
    for f in audit.findings:
        out.setdefault(f.file, []).append(f)
    return out


def folded_notes(audit: WheelAudit) -> dict[str, list[Finding]]:
    """The notes of ``audit`` that are folded into one line: code -> every note of that code,
    for each code with more than one note in the wheel (one ABI-safe lookup per symbol and
    file made ~130 lines per wheel that buried the findings)."""
    by_code: dict[str, list[Finding]] = {}
    for f in audit.findings:
        if f.severity == "note":
            by_code.setdefault(f.code, []).append(f)
    return {code: found for code, found in by_code.items() if len(found) > 1}


def _fold_line(code: str, found: Sequence[Finding]) -> str:
    files = sorted({f.file for f in found})
    first = found[0]
    where = f"{len(files)} file{'s' if len(files) != 1 else ''}"
    return (f"{len(found)} {code} notes in {where} (e.g. {first.subject} in {first.file}: "
            f"{first.message}; fix: {first.fix})")


def format_findings(audits: Sequence[WheelAudit], *, width: int = 100,
                    verbose: bool = False) -> str:
    """A findings table per ELF file of each wheel, for a terminal.

    Notes of one code that occur more than once in a wheel are folded into one line with a
    count at the end of that wheel (:func:`folded_notes`); ``verbose`` lists each of them.
    """
    lines: list[str] = []
    wrap = textwrap.TextWrapper(width=width, initial_indent=" " * 13,
                                subsequent_indent=" " * 13, break_on_hyphens=False,
                                break_long_words=False)
    fixwrap = textwrap.TextWrapper(width=width, initial_indent=" " * 13 + "fix: ",
                                   subsequent_indent=" " * 18, break_on_hyphens=False,
                                   break_long_words=False)
    for a in audits:
        n = len(a.elves)
        lines.append(f"{a.wheel.name}: {n} ELF file{'s' if n != 1 else ''} audited in "
                     f"{a.seconds:.2f} s: {_counts(a.errors, a.warnings)}")
        if not a.elves:
            lines.append("  no ELF files (a pure-Python wheel): nothing to audit")
        device = {d.file: d for d in a.device}
        folded = {} if verbose else folded_notes(a)
        hidden = {id(f) for fs in folded.values() for f in fs}
        for file, found in _by_file(a).items():
            d = device.get(file)
            code = (f"  [SASS {' '.join(d.sass) or '-'}; PTX {' '.join(d.ptx) or '-'}]"
                    if d else "")
            shown = [f for f in found if id(f) not in hidden]
            if not shown:
                n = len(found)
                tail = f" ({n} note{'s' if n != 1 else ''} folded below)" if n else ""
                lines.append(f"  {file}: ok{tail}{code}")
                continue
            found = shown
            lines.append(f"  {file}{code}")
            for f in found:
                lines.append(f"    {f.severity.upper():<8} {f.code:<22} {f.subject}"
                             + ("  [optional file]" if f.optional else ""))
                lines.extend(_wrap(wrap, f.message))
                lines.extend(_wrap(fixwrap, f.fix))
        for fcode, found in folded.items():
            lines.append(f"  NOTE     {fcode} x{len(found)} (-v lists each)")
            lines.extend(_wrap(wrap, _fold_line(fcode, found)))
        lines.append("")
    errors = sum(a.errors for a in audits)
    warnings = sum(a.warnings for a in audits)
    verdict = "FAIL" if errors else "pass"
    lines.append(f"static audit: {verdict}: {_counts(errors, warnings)} in "
                 f"{len(audits)} wheel{'s' if len(audits) != 1 else ''}")
    return "\n".join(lines) + "\n"


_QUOTED_RE = re.compile(r"`[^`]*`")


def _wrap(wrapper: textwrap.TextWrapper, text: str) -> list[str]:
    # Keep each `quoted` span on one line, so a quoted error message can be grepped for.
    glued = _QUOTED_RE.sub(lambda m: m.group(0).replace(" ", "\xa0"), text)
    return [line.replace("\xa0", " ") for line in wrapper.wrap(glued)]


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def findings_markdown(audits: Sequence[WheelAudit], *, verbose: bool = False) -> str:
    """The static findings as Markdown, for the top of ``summary.md`` (notes folded as in
    :func:`format_findings` unless ``verbose``; ``static.json`` keeps every one)."""
    errors = sum(a.errors for a in audits)
    warnings = sum(a.warnings for a in audits)
    out = [f"## Static audit: {'FAIL' if errors else 'pass'} ({_counts(errors, warnings)})", ""]
    for a in audits:
        n = len(a.elves)
        out.append(f"**{_md(a.wheel.name)}**: {n} ELF file{'s' if n != 1 else ''}, "
                   f"{_counts(a.errors, a.warnings)}")
        out.append("")
        if not a.findings:
            continue
        folded = {} if verbose else folded_notes(a)
        hidden = {id(f) for fs in folded.values() for f in fs}
        out.append("| file | severity | code | subject | message | fix |")
        out.append("|---|---|---|---|---|---|")
        for f in a.findings:
            if id(f) in hidden:
                continue
            sev = f.severity + (" (optional)" if f.optional else "")
            out.append(f"| `{_md(f.file)}` | {sev} | {f.code} | `{_md(f.subject)}` | "
                       f"{_md(f.message)} | {_md(f.fix)} |")
        for fcode, found in folded.items():
            files = len({f.file for f in found})
            out.append(f"| {files} files | note x{len(found)} | {fcode} | "
                       f"`{_md(found[0].subject)}`, ... | {_md(found[0].message)} | "
                       f"{_md(found[0].fix)} |")
        out.append("")
    device = device_markdown(audits)
    if device:
        out.append(device)
    return "\n".join(out) + "\n"


def findings_record(audits: Sequence[WheelAudit], *, settings: AuditSettings | None = None,
                    sources: Sequence[str] = ()) -> dict[str, object]:
    """The static stage as one JSON record: ``{"schema": 1, "type": "static", ...}``
    (:meth:`StaticAudit.to_json`; :meth:`StaticAudit.from_json` reads it back)."""
    return StaticAudit(settings=settings, wheels=tuple(audits), sources=tuple(sources)).to_json()


def device_markdown(audits: Sequence[WheelAudit]) -> str:
    """A per-file table of the GPU code each ELF file carries (empty when none has any)."""
    rows = [(a, d) for a in audits for d in a.device]
    if not rows:
        return ""
    out = ["### Device code per file", "",
           "| wheel | file | SASS | PTX | compressed |", "|---|---|---|---|---|"]
    for a, d in rows:
        out.append(f"| {_md(a.wheel.name)} | `{_md(d.file)}` | {', '.join(d.sass) or '-'} | "
                   f"{', '.join(d.ptx) or '-'} | {'yes' if d.compressed else 'no'} |")
    return "\n".join(out) + "\n"


def junit_suites(audits: Sequence[WheelAudit]) -> list[ET.Element]:
    """One JUnit ``testsuite`` per wheel: a testcase per ELF file, failed on an error finding."""
    suites: list[ET.Element] = []
    for a in audits:
        files = _by_file(a)
        failures = sum(any(f.severity == "error" for f in v) for v in files.values())
        suite = ET.Element("testsuite", name=f"static {a.wheel.name}", tests=str(len(files)),
                           failures=str(failures), time=f"{a.seconds:.3f}")
        for file, found in files.items():
            case = ET.SubElement(suite, "testcase", classname="cumatrix.front.gate.static",
                                 name=f"{a.wheel.name}::{file}")
            errs = [f for f in found if f.severity == "error"]
            body = "\n".join(f"{f.severity} {f.code} {f.subject}: {f.message}\nfix: {f.fix}"
                             for f in found)
            if errs:
                fail = ET.SubElement(case, "failure",
                                     message="; ".join(f"{f.code} {f.subject}" for f in errs))
                fail.text = body
            elif found:
                ET.SubElement(case, "system-out").text = body
        suites.append(suite)
    return suites


def findings_junit(audits: Sequence[WheelAudit]) -> str:
    """JUnit XML of the static stage alone (``gate --static-only``)."""
    root = ET.Element("testsuites", name="cumatrix gate")
    root.extend(junit_suites(audits))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
