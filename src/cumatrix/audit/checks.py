"""The checks of ``cumatrix gate``'s static audit on one ELF file.

What the file shows is gathered once (:class:`_Facts`: ``DT_NEEDED``, dynamic symbols, the names
in its loaded data, its device code), then each check turns it into findings against facts read
from real CUDA headers (:class:`cumatrix.audit.findings.AuditData`).
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from functools import lru_cache

from elftools.elf.elffile import ELFFile

from cumatrix.audit import runtime_evidence
from cumatrix.audit.coverage import embedded_modules, file_device_checks, kernel_file_checks, module_checks
from cumatrix.audit.findings import (
    AuditData,
    AuditSettings,
    Finding,
    Linkage,
    Severity,
)
from cumatrix.audit.libraries import library_checks, library_uses
from cumatrix.binary import staticcudart
from cumatrix.binary.elf import (
    NameScan,
    elf_defined_symbols,
    elf_needed,
    elf_search_paths,
    elf_soname,
    elf_undefined_symbols,
    name_scan,
    scan_names,
)
from cumatrix.binary.fatbin import DeviceCode, FatbinModule, find_fatbin, read_fatbin, read_fatbin_modules
from cumatrix.core.model import CudaVersion
from cumatrix.predict.rules import major_newer_than_driver, rules

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
# Exported by every libcudart.so (and by no program that merely links one).
_RUNTIME_API = "cudaRuntimeGetVersion"


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
    soname: str | None = None

    @property
    def is_libcudart(self) -> bool:
        """The file is a CUDA runtime library itself (a vendored, perhaps renamed, libcudart):
        it carries the runtime and exports its API."""
        return self.static_runtime and _RUNTIME_API in self.exported


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
            how = (f"a CUDA {major} runtime (this file is a libcudart, by its content and exports, "
                   "whatever its name)" if f.is_libcudart
                   else f"a statically linked CUDA {major} runtime (libcudart_static)")
            out.append((major, f"static libcudart {major}", how))
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


def _runtime_major_checks(f: _Facts, s: AuditSettings, data: AuditData
                          ) -> tuple[list[Finding], list[tuple[int, str, str, Severity]]]:
    """The findings on every runtime ``f`` needs, and those runtimes (major, subject, how, worst)."""
    out: list[Finding] = []
    found: list[tuple[int, str, str, Severity]] = [
        (major, subject, how, "error") for major, subject, how in _runtime_majors(f, data)]
    # A runtime loaded at run time is as binding as a linked one when the file's search path
    # and the wheel's dependency agree on it; a soname string alone is a warning.
    found += [(r.major, r.subject, r.how, "error" if r.agreed else "warning")
              for r in _runtime_loads(f, data)]
    for major, subject, how, worst in found:
        out += runtime_major_findings(f.name, major, subject, how, worst, s)
    return out, found


def runtime_major_findings(name: str, major: int, subject: str, how: str, worst: Severity,
                           s: AuditSettings) -> list[Finding]:
    """``runtime-major`` and ``runtime-needs-newer-driver`` for file ``name`` needing a CUDA
    ``major`` runtime (``how`` says why), at most ``worst`` severe."""
    out: list[Finding] = []
    if s.runtimes is not None and major not in s.runtimes:
        declared = ",".join(str(r) for r in s.runtimes)
        out.append(Finding(
            file=name, severity=worst, code="runtime-major", subject=subject,
            message=(f"{how}: this file loads only next to a CUDA {major} runtime, outside "
                     f"the declared runtime majors ({declared})"),
            fix=(f"build it against a CUDA {declared} runtime, publish one wheel per CUDA "
                 "major, or declare the major with --runtimes"),
        ))
    if not major_newer_than_driver(int(CudaVersion(major, 0)), int(s.min_driver)):
        return out
    drv = _min_driver_for_major(major)
    drv_text = f"a CUDA {major}.0 driver (>= {drv})" if drv else f"a CUDA {major}.0 driver"
    if s.forward_compat:
        out.append(Finding(
            file=name, severity="note", code="runtime-needs-newer-driver",
            subject=subject,
            message=(f"{how} needs {drv_text}, newer than --min-driver {s.min_driver}; "
                     "accepted with --forward-compat: only data-centre GPUs with NVIDIA's "
                     f"cuda-compat package for CUDA {major} run it on an older driver"),
            fix=(f"document that drivers below CUDA {major}.0 need the cuda-compat package "
                 "(data-centre GPUs only)"),
        ))
        return out
    out.append(Finding(
        file=name, severity=worst, code="runtime-needs-newer-driver", subject=subject,
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
    return [underlinked_finding(f.name, syms)] if syms else []


def underlinked_finding(name: str, syms: list[str]) -> Finding:
    """``underlinked-libcuda`` for file ``name`` with undefined driver entry points ``syms``
    (sorted) that nothing it links defines."""
    shown = ", ".join(syms[:5]) + (f" and {len(syms) - 5} more" if len(syms) > 5 else "")
    return Finding(
        file=name, severity="error", code="underlinked-libcuda", subject=syms[0],
        message=(f"needs driver entry points ({shown}) but has no DT_NEEDED libcuda.so.1: "
                 f"importing it fails with `undefined symbol: {syms[0]}` unless something else "
                 "loaded libcuda with RTLD_GLOBAL first (Mooncake issue 724)"),
        fix=("resolve them at run time with cuGetProcAddress (dlopen libcuda.so.1 first), or "
             "link libcuda (-lcuda) so the loader finds them"),
    )


@lru_cache(maxsize=8)
def _versions(texts: tuple[str, ...]) -> list[int]:
    # Parsed once per audit, not once per file (17 versions took a tenth of a cubin's checks).
    return [int(CudaVersion.parse(x)) for x in texts]


def _runtime_floor(f: _Facts, min_runtime: CudaVersion) -> int:
    """The oldest runtime file ``f`` can meet: ``--min-runtime``, or the major of a libcudart
    it loads where that is newer."""
    majors = [int(m.group(1)) for lib in f.needed if (m := _LIBCUDART_RE.match(lib))]
    # A file that loads libcudart.so.13 cannot meet a 12.x runtime: runtime-major says so.
    return max([int(min_runtime)] + [m * 1000 for m in majors])


def _runtime_floor_checks(f: _Facts, s: AuditSettings, data: AuditData) -> list[Finding]:
    if s.min_runtime is None or not data.runtime_introductions:
        return []
    out: list[Finding] = []
    floor = _runtime_floor(f, s.min_runtime)
    older = _versions(data.runtime_sources)
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
        out.append(_symbol_too_new(f.name, sym, intro, floor, older, read))
    return out


def _symbol_too_new(name: str, sym: str, intro: int, floor: int, older: list[int],
                    read: str) -> Finding:
    """The finding for runtime entry point ``sym``, first exported by libcudart ``intro``,
    newer than the oldest runtime supported (``floor``); ``older``: the versions read."""
    v, fv = CudaVersion.from_int(intro), CudaVersion.from_int(floor)
    before = max((x for x in older if x < intro), default=0)
    # Versions between two read ones were not read: there, the date is a range.
    exact = before >= floor
    return Finding(
        file=name, severity="error" if exact else "warning",
        code="runtime-symbol-too-new", subject=sym,
        message=(f"links runtime entry point {sym}, first exported by libcudart {v} "
                 f"({read}), newer than the oldest runtime "
                 f"supported ({fv}): next to an older libcudart importing this file fails "
                 f"with `undefined symbol: {sym}`"
                 + ("" if exact else f" (libcudart {fv} was not read: it may be older)")),
        fix=(f"look it up with cudaGetDriverEntryPoint/dlsym and fall back when absent, or "
             f"raise --min-runtime (and the runtime dependency) to {v}"),
    )


def _dispatch_checks(f: _Facts,
                     abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str]) -> list[Finding]:
    # A statically linked runtime names every runtime function (its own tables): not lookups.
    if not abi_changed or f.static_runtime:
        return []
    asked = f.undefined | f.cuda_strings | f.cu_strings
    driver_q = sorted(q for q in _DRIVER_VERSION_QUERIES if q in asked)
    runtime_q = sorted(q for q in _RUNTIME_VERSION_QUERIES if q in asked)
    return [_abi_lookup(f.name, text, _abi_text(base, abi_changed), runtime_q, driver_q)
            for text, base in _abi_changed_strings(f, abi_changed)]


def _abi_changed_strings(f: _Facts, abi_changed: Container[str]) -> Iterator[tuple[str, str]]:
    """``(string, function)`` of each ``cuda`` string of ``f`` naming a runtime function whose
    ABI changed (its ``_ptsz``/``_ptds`` form too), in order."""
    for text in sorted(f.cuda_strings):
        base = _PER_THREAD_RE.sub("", text)
        # A file that exports the name is a runtime itself (a vendored libcudart).
        if base in abi_changed and base not in f.exported and text not in f.exported:
            yield text, base


def _abi_lookup(name: str, text: str, abi: str, runtime_q: list[str], driver_q: list[str]) -> Finding:
    """The finding for a looked-up runtime function of a changed ABI: a note where the file asks
    the runtime's version, an error where it asks only the driver's, else a warning."""
    if runtime_q:
        return Finding(
            file=name, severity="note", code="abi-lookup-runtime-version", subject=text,
            message=(f"names \"{text}\" as a string (looked up at run time; its ABI changed "
                     f"between CUDA majors: {abi}) and asks {runtime_q[0]}: the ABI is "
                     "chosen from the runtime actually loaded, as it must be"),
            fix="none needed (SGLang PR 23183)",
        )
    if driver_q:
        return Finding(
            file=name, severity="error", code="abi-lookup-driver-version", subject=text,
            message=(f"names \"{text}\" as a string (looked up at run time; its ABI changed "
                     f"between CUDA majors: {abi}) and asks {driver_q[0]} but never "
                     "cudaRuntimeGetVersion: it picks the ABI from the driver, so a CUDA 12 "
                     "runtime on a 13.x driver is called with the 13.x ABI and crashes "
                     "(SIGSEGV, SGLang PR 23172)"),
            fix=("choose the ABI from cudaRuntimeGetVersion of the runtime actually loaded "
                 "(SGLang PR 23183)"),
        )
    return Finding(
        file=name, severity="warning", code="abi-lookup", subject=text,
        message=(f"names \"{text}\" as a string, so it is looked up at run time "
                 f"(dlsym): its ABI changed between CUDA majors ({abi}), and the static "
                 "audit cannot see which ABI the code assumes"),
        fix=("choose the ABI from cudaRuntimeGetVersion of the runtime actually loaded, "
             "never from cudaDriverGetVersion or compile-time CUDA_VERSION "
             "(SGLang PR 23183, SGLang issue 36302)"),
    )


#: The two scans of a file's loaded data, made in one reading: names starting with ``cu`` or
#: the static runtime's object-name mark (:func:`cumatrix.binary.elf.elf_strings`), and CUDA
#: sonames alone or at the end of a path (:func:`cumatrix.audit.runtime_evidence.elf_sonames`).
DATA_SCANS = (
    name_scan(("cu", _STATIC_CUDART_MARK)),
    NameScan(patterns=(runtime_evidence._SONAME_RE,),
             before=tuple(b in (0, ord("/")) for b in range(256)), longest=48),
)


def _gather(name: str, elf: ELFFile, data: AuditData,
            scanned: list[set[str]] | None = None) -> _Facts:
    names, sonames = scanned if scanned is not None else scan_names(elf, DATA_SCANS)
    cuda = {t for t in names if t.startswith("cuda")}
    cu = {t for t in names if t.startswith(_DRIVER_VERSION_QUERIES)}
    return _Facts(
        name=name, needed=tuple(elf_needed(elf)),
        undefined=frozenset(elf_undefined_symbols(elf)),
        exported=frozenset(elf_defined_symbols(elf)),
        cuda_strings=frozenset(cuda), cu_strings=frozenset(cu),
        static_runtime=_is_static_runtime(names, cuda, data),
        sonames=frozenset(sonames), search_paths=elf_search_paths(elf),
        requires=data.requires, soname=elf_soname(elf),
    )


def _linkage(f: _Facts, found: list[tuple[int, str, str, Severity]], data: AuditData) -> Linkage:
    own = [major for major, subject, _, _ in found if subject.startswith("static libcudart")]
    return Linkage(
        needed=f.needed, search_paths=f.search_paths, soname=f.soname,
        runtime_major=own[0] if own else None, runtime_is_shared=f.is_libcudart,
        judged=frozenset(major for major, *_ in found),
        driver_undefined=tuple(sorted(x for x in f.undefined if x in data.introductions)),
        exported=frozenset(x for x in f.exported if x.startswith("cu")),
    )


def _is_static_runtime(names: set[str], cuda: set[str], data: AuditData) -> bool:
    """Whether the file carries a copy of libcudart (:func:`cumatrix.binary.staticcudart.is_static_runtime`)."""
    return staticcudart.is_static_runtime(names, cuda, data.runtime_introductions)


def elf_device_code(elf: ELFFile) -> tuple[DeviceCode, ...]:
    """The entries of ``elf``'s fat binary (none when it has none): its ``.nv_fatbin``
    section, or without section headers the containers found by their magic
    (:func:`cumatrix.binary.fatbin.find_fatbin`)."""
    where = find_fatbin(elf)
    if where is None:
        return ()
    start, size, by_name = where
    if by_name:
        return read_fatbin(elf.stream, start, size)
    return tuple(c for m in read_fatbin_modules(elf.stream, start, size, strict=False)
                 for c in m.codes)


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
    findings, _, _ = audit_one(name, elf, s, replace(d, introductions=introductions), abi_changed)
    return findings


def audit_one(name: str, elf: ELFFile, s: AuditSettings, data: AuditData,
              abi_changed: Mapping[str, tuple[str, str]] | AbstractSet[str],
              scanned: list[set[str]] | None = None
              ) -> tuple[list[Finding], tuple[DeviceCode, ...], Linkage]:
    """Every check on one ELF file: its findings, its device code and what the wheel-level
    checks need of it (:mod:`cumatrix.audit.linkage`).  ``scanned``: what :data:`DATA_SCANS`
    found in its data, when the reader already scanned it."""
    f = _gather(name, elf, data, scanned)
    out = _needs_libcuda(f, s)
    majors, found = _runtime_major_checks(f, s, data)
    out += majors
    own = f.soname or name.rsplit("/", 1)[-1]
    out += library_checks(name, library_uses(f.needed, f.sonames, own), (m for m, *_ in found), s)
    out += _driver_symbol_checks(f, s, data)
    out += _underlinked_checks(f, data)
    out += _runtime_floor_checks(f, s, data)
    out += _dispatch_checks(f, abi_changed)
    codes = elf_device_code(elf)
    device = file_device_checks(name, codes, s)
    extra: tuple[FatbinModule, ...] = ()
    if any(f.severity == "error" for f in device):
        # A library that loads its own kernels keeps them in its data, not in .nv_fatbin.
        extra = embedded_modules(elf)
        if extra:
            codes = (*codes, *(c for m in extra for c in m.codes))
            device = file_device_checks(name, codes, s)
        device = kernel_file_checks(name, elf, s, device, extra)
    out += device
    out += module_checks(name, elf, s, out, extra)
    return out, codes, _linkage(f, found, data)
