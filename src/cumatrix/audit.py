"""The static audit of ``cumatrix gate``: what each ELF file of a wheel needs from CUDA.

Reads every ELF file of each wheel straight from the zip (:mod:`cumatrix.elf`) and checks it
against facts read from real CUDA headers (:mod:`cumatrix.headers`): which driver entry points
the file links, which CUDA runtime major it needs, and which runtime entry points with a
major-dependent ABI it names as strings.  The findings are data (:class:`Finding`,
:class:`WheelAudit`); the writers below render them for a terminal, Markdown, JSON and JUnit.
"""

from __future__ import annotations

import fnmatch
import re
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from . import headers, runtimes
from .elf import (
    elf_defined_symbols,
    elf_needed,
    elf_strings,
    elf_undefined_symbols,
    iter_wheel_elves,
)
from .model import CudaVersion

Severity = Literal["error", "warning"]

#: The JSON record's schema version (``findings_record``).
RECORD_SCHEMA = 1

_LIBCUDA_RE = re.compile(r"^libcuda\.so(\.\d+)*$")
_LIBCUDART_RE = re.compile(r"^libcudart\.so\.(\d+)(\.\d+)*$")
# cuMemcpyBatchAsync_v2_ptsz -> cuMemcpyBatchAsync: the name cuGetProcAddress takes.
_DRIVER_BASE_RE = re.compile(r"^(cu\w+?)(?:_v\d+)?(?:_pt(?:ds|sz))?$")
_PER_THREAD_RE = re.compile(r"_pt(?:ds|sz)$")


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


@dataclass(frozen=True, kw_only=True, slots=True)
class WheelAudit:
    """The static audit of one wheel."""

    wheel: Path
    elves: tuple[str, ...]  #: member paths of the ELF files audited, in archive order
    findings: tuple[Finding, ...]
    seconds: float

    @property
    def errors(self) -> int:
        return sum(f.severity == "error" for f in self.findings)

    @property
    def warnings(self) -> int:
        return sum(f.severity == "warning" for f in self.findings)


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditData:
    """Facts from CUDA headers the audit checks against."""

    introductions: Mapping[str, int]  #: exported driver symbol -> CUDA version (12080)
    abi_changes: Mapping[str, tuple[str, str]]  #: runtime function -> (old, new) prototype
    sources: tuple[str, ...]  #: which headers, e.g. ("12.9", "13.5")


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


def _abi_text(name: str, abi_changed: Mapping[str, tuple[str, str]] | Set[str]) -> str:
    if isinstance(abi_changed, Mapping):
        old, new = (_param_count(p) for p in abi_changed[name])
        if old != new:
            return f"{old} parameters in the older major, {new} in the newer"
        return "same parameter count, different parameter types"
    return "its prototype differs between CUDA majors"


def audit_elf(
    name: str,
    elf: ELFFile,
    *,
    min_driver: CudaVersion,
    runtimes: tuple[int, ...] | None,
    strict: bool,
    introductions: Mapping[str, int],
    abi_changed: Mapping[str, tuple[str, str]] | Set[str],
) -> list[Finding]:
    """The findings for one ELF file (``name`` is its path in the wheel)."""
    out: list[Finding] = []
    needed = list(elf_needed(elf))
    for lib in needed:
        if _LIBCUDA_RE.match(lib):
            out.append(Finding(
                file=name, severity="error" if strict else "warning", code="needs-libcuda",
                subject=lib,
                message=(f"DT_NEEDED {lib}: the dynamic loader needs the NVIDIA driver library "
                         "just to load this file, so the wheel cannot be imported on a machine "
                         "without a driver, which breaks CPU-only CI and docs builds"),
                fix=("do not link libcuda: dlopen(\"libcuda.so.1\") when CUDA is first used and "
                     "resolve driver entry points with cuGetProcAddress at run time "
                     "(vLLM PR 38919)"),
            ))
        m = _LIBCUDART_RE.match(lib)
        if m and runtimes is not None and int(m.group(1)) not in runtimes:
            declared = ",".join(str(r) for r in runtimes)
            out.append(Finding(
                file=name, severity="error", code="runtime-major", subject=lib,
                message=(f"DT_NEEDED {lib}: this file loads only next to a CUDA {m.group(1)} "
                         f"runtime, outside the declared runtime majors ({declared})"),
                fix=(f"build it against a CUDA {declared} runtime, publish one wheel per CUDA "
                     "major, or declare the major with --runtimes"),
            ))
    floor = int(min_driver)
    for sym in sorted(set(elf_undefined_symbols(elf))):
        intro = introductions.get(sym)
        if intro is None or intro <= floor:
            continue
        v = CudaVersion.from_int(intro)
        out.append(Finding(
            file=name, severity="error", code="driver-symbol-too-new", subject=sym,
            message=(f"links driver entry point {sym}, introduced in CUDA {v}, newer than "
                     f"--min-driver {min_driver}: on drivers older than {v} importing this "
                     f"file fails with `undefined symbol: {sym}` (vLLM PR 38460)"),
            fix=(f"resolve it at run time with cuGetProcAddress(\"{_driver_base(sym)}\", "
                 f"{intro}, ...) and fall back when it returns NULL (vLLM PR 38919), or raise "
                 f"--min-driver to {v} if drivers older than that are really unsupported"),
        ))
    if abi_changed:
        exported = set(elf_defined_symbols(elf))
        for text in sorted(elf_strings(elf, "cuda")):
            base = _PER_THREAD_RE.sub("", text)
            # A file that exports the name is a runtime itself (a vendored libcudart).
            if base not in abi_changed or base in exported or text in exported:
                continue
            out.append(Finding(
                file=name, severity="warning", code="abi-lookup", subject=text,
                message=(f"names \"{text}\" as a string, so it is looked up at run time "
                         f"(dlsym): its ABI changed between CUDA majors "
                         f"({_abi_text(base, abi_changed)}), and the static audit cannot see "
                         "which ABI the code assumes"),
                fix=("choose the ABI from cudaRuntimeGetVersion of the runtime actually loaded, "
                     "never from cudaDriverGetVersion or compile-time CUDA_VERSION "
                     "(SGLang PR 23183, SGLang issue 36302)"),
            ))
    return out


def _unreadable(name: str, err: Exception) -> Finding:
    return Finding(
        file=name, severity="error", code="unreadable-elf", subject=name,
        message=f"starts with the ELF magic but could not be read: {err}",
        fix="rebuild the file; the audit cannot vouch for what it cannot read",
    )


def audit_wheel(
    wheel: Path,
    *,
    min_driver: CudaVersion,
    runtimes: tuple[int, ...] | None,
    strict: bool,
    optional: tuple[str, ...],
    introductions: Mapping[str, int],
    abi_changed: Mapping[str, tuple[str, str]] | Set[str],
) -> WheelAudit:
    """Audit every ELF file of ``wheel`` without extracting it.

    ``introductions`` maps exported driver symbols to the CUDA version that introduced
    them (:func:`cumatrix.headers.load_introductions`); ``abi_changed`` names the runtime
    functions whose ABI differs between majors (:func:`cumatrix.headers.runtime_abi_changes`;
    a mapping adds the prototypes to the message).  Findings of files matching an
    ``optional`` glob are downgraded to warnings and marked optional.  Raises
    :class:`zipfile.BadZipFile` when ``wheel`` is not a zip archive.
    """
    start = time.perf_counter()
    findings: list[Finding] = []
    elves: list[str] = []

    def on_error(name: str, err: Exception) -> None:
        elves.append(name)
        findings.append(_unreadable(name, err))

    for name, elf in iter_wheel_elves(wheel, on_error=on_error):
        elves.append(name)
        try:
            findings.extend(audit_elf(
                name, elf, min_driver=min_driver, runtimes=runtimes, strict=strict,
                introductions=introductions, abi_changed=abi_changed,
            ))
        except (ELFError, ValueError, KeyError) as e:  # pyelftools on a damaged file
            findings.append(_unreadable(name, e))
    if optional:
        findings = [
            replace(f, severity="warning", optional=True)
            if any(fnmatch.fnmatchcase(f.file, g) for g in optional) else f
            for f in findings
        ]
    return WheelAudit(wheel=wheel, elves=tuple(elves), findings=tuple(findings),
                      seconds=time.perf_counter() - start)


def load_audit_data(*, wheel_dir: Path | None = None) -> AuditData:
    """Introduction versions and runtime ABI changes from the runtime wheels' headers.

    Uses the newest known runtime wheel of each CUDA major
    (:data:`cumatrix.runtimes.KNOWN_WHEELS`): introductions from the newest
    ``cudaTypedefs.h``, ABI changes from diffing ``cuda_runtime_api.h`` of consecutive majors.
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
    for old, new in zip(includes, includes[1:]):
        changes.update(headers.runtime_abi_changes(old, new))
    return AuditData(introductions=introductions, abi_changes=changes,
                     sources=tuple(str(v) for v in versions))


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


def format_findings(audits: Sequence[WheelAudit], *, width: int = 100) -> str:
    """A findings table per ELF file of each wheel, for a terminal."""
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
        for file, found in _by_file(a).items():
            if not found:
                lines.append(f"  {file}: ok")
                continue
            lines.append(f"  {file}")
            for f in found:
                lines.append(f"    {f.severity.upper():<8} {f.code:<22} {f.subject}"
                             + ("  [optional file]" if f.optional else ""))
                lines.extend(_wrap(wrap, f.message))
                lines.extend(_wrap(fixwrap, f.fix))
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


def findings_markdown(audits: Sequence[WheelAudit]) -> str:
    """The static findings as Markdown, for the top of ``summary.md``."""
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
        out.append("| file | severity | code | subject | message | fix |")
        out.append("|---|---|---|---|---|---|")
        for f in a.findings:
            sev = f.severity + (" (optional)" if f.optional else "")
            out.append(f"| `{_md(f.file)}` | {sev} | {f.code} | `{_md(f.subject)}` | "
                       f"{_md(f.message)} | {_md(f.fix)} |")
        out.append("")
    return "\n".join(out) + "\n"


def findings_record(audits: Sequence[WheelAudit]) -> dict[str, object]:
    """The static stage as one JSON record: ``{"schema": 1, "type": "static", ...}``."""
    return {
        "schema": RECORD_SCHEMA,
        "type": "static",
        "findings": [
            {"wheel": a.wheel.name, "file": f.file, "severity": f.severity, "code": f.code,
             "subject": f.subject, "message": f.message, "fix": f.fix, "optional": f.optional}
            for a in audits for f in a.findings
        ],
        "wheels": [
            {"wheel": a.wheel.name, "elves": list(a.elves), "errors": a.errors,
             "warnings": a.warnings, "seconds": round(a.seconds, 4)}
            for a in audits
        ],
    }


def findings_junit(audits: Sequence[WheelAudit]) -> str:
    """JUnit XML: one testcase per ELF file, failed when it has an error finding."""
    suites = ET.Element("testsuites", name="cumatrix gate")
    for a in audits:
        files = _by_file(a)
        suite = ET.SubElement(suites, "testsuite", name=f"static {a.wheel.name}",
                              tests=str(len(files)), failures=str(
                                  sum(any(f.severity == "error" for f in v) for v in files.values())),
                              time=f"{a.seconds:.3f}")
        for file, found in files.items():
            case = ET.SubElement(suite, "testcase", classname="cumatrix.gate.static",
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
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
