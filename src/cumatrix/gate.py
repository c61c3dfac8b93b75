"""``cumatrix gate``: fail a wheel release that would break on a supported driver/runtime pairing.

Stage one, the static audit, reads every ELF file of each wheel straight from the zip
(:mod:`cumatrix.elf`) and checks it against facts read from real CUDA headers
(:mod:`cumatrix.headers`): which driver entry points the file links, which CUDA runtime major
it needs, and which runtime entry points with a major-dependent ABI it names as strings.
Stage two, the dynamic stage, installs the wheel into each runtime cell of a matrix and
imports it there; it lives behind :func:`run_dynamic_stage`.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import hashlib
import importlib.util
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from . import headers, oracle, runtimes
from . import matrix as _matrix
from .elf import (
    elf_defined_symbols,
    elf_needed,
    elf_strings,
    elf_undefined_symbols,
    iter_wheel_elves,
)
from .errors import CumatrixError, UsageError
from .isolate import ChildResult, Job
from .model import Case, Cell, CudaVersion, Driver, Expected, Matrix, Observed, Runtime
from .report import load_records, progress_line, write_all
from .report.jsonout import dumps
from .results import JSONL, Store
from .session import DEFAULT_TIMEOUT, Runner, run_header, utcnow

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


# --------------------------------------------------------------------------- dynamic stage

#: The matrix the dynamic stage reads when ``--matrix`` is not given (if it exists).
DEFAULT_MATRIX = "matrix.yaml"
#: Where the dynamic stage writes when ``--out`` is not given.
DEFAULT_OUT = Path("gate-out")
#: Sub-directory of ``--out`` holding one install target per cell.
SITES_DIR = "gate-sites"
#: ``matrix`` of the run header when no matrix file is used.
BUILTIN_MATRIX = "<built-in: runtimes.KNOWN_WHEELS x host>"

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PACKAGE_INIT_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)/__init__\.py$")
_MODULE_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.py$")
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")

# Run in each import cell as `python -c SCRIPT SITE PKG...`.  The traceback goes to stdout and
# one line saying why to stderr, so the cell's recorded reason is the loader's own message
# (`libcuda.so.1: cannot open shared object file`), not a line from the middle of a traceback.
_IMPORT_SCRIPT = """\
import importlib, os, sys, traceback
site = os.path.realpath(sys.argv[1])
for name in sys.argv[2:]:
    try:
        mod = importlib.import_module(name)
    except Exception as e:
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        sys.exit(f"cannot import {name}: {type(e).__name__}: {e}")
    where = getattr(mod, "__file__", None)
    paths = [where] if where else list(getattr(mod, "__path__", []))
    if not any(os.path.realpath(p).startswith(site + os.sep) for p in paths):
        sys.exit(f"{name} was imported from {paths}, not from the installed wheel in {site}: "
                 "another copy shadows it")
    print(f"imported {name} from {paths[0]}")
if len(sys.argv) == 2:
    print("the wheel declares no top-level package: nothing to import")
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class GateWheel:
    """A wheel as the dynamic stage runs it."""

    path: Path
    name: str  #: the name in case names: ``import-<name>``, ``smoke-<name>``
    packages: tuple[str, ...]  #: top-level import names


@dataclass(frozen=True, kw_only=True, slots=True)
class _CellSite:
    wheel: str  #: GateWheel.name
    site: Path  #: the cell's own install target (PYTHONPATH)
    smoke: bool


def wheel_packages(wheel: Path) -> tuple[str, ...]:
    """Top-level import names of ``wheel``.

    From ``*.dist-info/top_level.txt`` when the wheel has one; otherwise the top-level
    directories with an ``__init__.py`` and the top-level ``*.py`` modules its ``RECORD`` lists.
    """
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/top_level\.txt", n)]
        if top:
            text = zf.read(top[0]).decode("utf-8", errors="replace")
            found = [line.strip().replace("/", ".") for line in text.splitlines()]
        else:
            record = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
            listed = names
            if record:
                rows = csv.reader(io.StringIO(zf.read(record[0]).decode("utf-8", errors="replace")))
                listed = [row[0] for row in rows if row]
            found = []
            for path in listed:
                m = _PACKAGE_INIT_RE.match(path) or _MODULE_RE.match(path)
                if m:
                    found.append(m.group(1))
    return tuple(dict.fromkeys(n for n in found if _IDENT_RE.match(n)))


def _gate_wheels(wheels: Sequence[Path]) -> list[GateWheel]:
    out: list[GateWheel] = []
    stems = [w.name.split("-") for w in wheels]
    dists = [parts[0].lower() for parts in stems]
    for w, parts, dist in zip(wheels, stems, dists):
        # Two versions of one distribution gated together need different case names.
        name = dist if dists.count(dist) == 1 else f"{dist}-{parts[1] if len(parts) > 1 else ''}"
        name = _UNSAFE_RE.sub("_", name).strip("-.") or "wheel"
        if any(g.name == name for g in out):
            raise UsageError(f"{w}: gated twice (or two wheels of the same name and version)")
        out.append(GateWheel(path=w, name=name, packages=wheel_packages(w)))
    return out


def builtin_matrix() -> Matrix:
    """The runtimes of :data:`cumatrix.runtimes.KNOWN_WHEELS` on the host driver."""
    rts = tuple(Runtime(name=f"cu{v}", requirement=req) for v, req in runtimes.KNOWN_WHEELS.items())
    digest = hashlib.sha256(dumps({"runtimes": dict(runtimes.KNOWN_WHEELS),
                                   "drivers": ["host"]}).encode()).hexdigest()
    return Matrix(path=BUILTIN_MATRIX, sha256=digest, version=1, runtimes=rts,
                  drivers=(Driver(name="host"),), probe=False)


def gate_matrix(path: Path | None) -> Matrix:
    """The runtime x driver pairings the dynamic stage runs.

    ``path`` (else ``./matrix.yaml``, else :func:`builtin_matrix`) is loaded and stripped of
    variants, workloads, cases and ``expect:`` overrides: every supported pairing must be
    ``ok``.  ``exclude:`` entries that name only runtimes and drivers still apply.
    """
    if path is None:
        default = Path(DEFAULT_MATRIX)
        if not default.is_file():
            return builtin_matrix()
        path = default
    if not path.is_file():
        raise UsageError(f"--matrix {path}: no such matrix file")
    m = _matrix.load(path)
    pairs = tuple(s for s in m.exclude if {k for k, _ in s.values} <= {"runtime", "driver"})
    return replace(m, builds=(), variants=(), workloads=(), cases=(), expect=(), exclude=pairs,
                   probe=False)


def unsupported_pairing(cell: Cell, host: oracle.HostFacts, runtime_version: int | None) -> str | None:
    """Why NVIDIA does not support ``cell``'s runtime on its driver, or ``None``.

    A runtime of a newer CUDA major than the (effective) driver fails with
    ``cudaErrorInsufficientDriver``; minor-version compatibility covers the rest.  With no
    driver, or an unknown runtime version, the pairing is run (a wheel must import there).
    """
    d = oracle.effective_driver(cell, host)
    if d is None or runtime_version is None:
        return None
    if runtime_version // 1000 <= d // 1000:
        return None
    rv, dv = CudaVersion.from_int(runtime_version), CudaVersion.from_int(d)
    return (f"runtime {rv} needs a CUDA {rv.major} driver; driver {cell.driver} is CUDA {dv}, and "
            "NVIDIA supports no runtime of a newer major than the driver "
            "(cudaErrorInsufficientDriver): not run")


def _sanitise(cell_id: str) -> str:
    return _UNSAFE_RE.sub("_", cell_id.replace("/", "__")).strip(".") or "cell"


def gate_cells(matrix: Matrix, wheels: Sequence[GateWheel], *, smoke: str | None, sites: Path,
               backend: str, timeout: float | None) -> tuple[list[Cell], dict[str, _CellSite]]:
    """Command cells for every wheel on every pairing of ``matrix``, with their install targets."""
    python = "python3" if backend == "docker" else sys.executable
    pairings = [c for c in _matrix.expand(replace(matrix, probe=True)) if c.kind == "probe"]
    cells: list[Cell] = []
    plan: dict[str, _CellSite] = {}
    for pair in pairings:
        for w in wheels:
            kinds = [("import", False)] + ([("smoke", True)] if smoke else [])
            for prefix, is_smoke in kinds:
                name = f"{prefix}-{w.name}"
                cell_id = f"{pair.runtime}/{pair.driver}/{name}"
                site = sites / _sanitise(cell_id)
                env: list[tuple[str, str]] = [("PYTHONPATH", str(site))]
                if is_smoke:
                    assert smoke is not None
                    argv: tuple[str, ...] = ("sh", "-c", smoke)
                    if backend == "local":
                        # `python3` in the smoke command is the interpreter that imported the wheel.
                        path = os.environ.get("PATH", "")
                        env.append(("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                             *([path] if path else [])])))
                else:
                    argv = (python, "-c", _IMPORT_SCRIPT, str(site), *w.packages)
                case = Case(name=name, argv=argv, timeout=timeout, env=tuple(env))
                cell = Cell(kind="command", runtime=pair.runtime, driver=pair.driver, case=case)
                cells.append(cell)
                plan[cell.id] = _CellSite(wheel=w.name, site=site, smoke=is_smoke)
    return cells, plan


def _pip_install(wheel: Path, target: Path, constraints: Path | None) -> tuple[int, str]:
    argv = [sys.executable, "-m", "pip", "install", "--target", str(target), "--no-compile",
            "--disable-pip-version-check", "--no-input", "--no-warn-script-location", "-q"]
    if constraints is None:
        argv += ["--no-deps", "--no-index"]  # the wheel alone: nothing fetched
    else:
        argv += ["--constraint", str(constraints)]
    argv.append(str(wheel))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return 124, "pip install did not finish in 30 minutes"
    return proc.returncode, (proc.stderr or proc.stdout).strip()


def _link_tree(src: Path, dst: Path) -> None:
    # Hard links: a 300 MB wheel in twelve cells costs 300 MB, not 3.6 GB.  Python writes
    # bytecode to new files, never through a link; the docker backend mounts the copy read-only.
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, symlinks=True, copy_function=link)


def _shell_signal(observed: Observed) -> Observed:
    """A shell reports a child killed by signal N as exit 128+N (dash does not exec ``-c``)."""
    code = observed.exit_status
    if not observed.outcome.startswith("exit:") or code is None or not 128 < code < 128 + 65:
        return observed
    try:
        name = signal.Signals(code - 128).name
    except ValueError:
        return observed
    detail = f"the shell running --smoke exited {code}: its command was killed by {name}"
    if observed.detail:
        detail += f"; {observed.detail}"
    return replace(observed, outcome=f"crash:{name}", detail=detail)


@dataclass
class GateRunner(Runner):
    """A :class:`Runner` that installs the wheel into each cell and skips unsupported pairings."""

    sites: dict[str, _CellSite] = field(default_factory=dict)
    staged: dict[str, Path] = field(default_factory=dict)  #: wheel name -> pip's install
    install_failed: dict[str, Observed] = field(default_factory=dict)  #: wheel name -> outcome

    def unsupported(self, cell: Cell) -> str | None:
        try:
            rv = self.runtime_version(cell)
        except CumatrixError:
            return None  # run_cell records the provisioning error itself
        return unsupported_pairing(cell, self.host(), rv)

    def expected(self, cell: Cell) -> Expected:
        why = self.unsupported(cell)
        if why is not None:
            return Expected(outcomes=frozenset({"skipped:unsupported-pairing"}), reason=why,
                            rule="unsupported-pairing")
        plan = self.sites.get(cell.id)
        what = ("the --smoke command must exit 0" if plan is not None and plan.smoke
                else "the wheel's top-level packages must import")
        d = oracle.effective_driver(cell, self.host())
        where = (f"on every pairing NVIDIA supports (driver {cell.driver}: CUDA "
                 f"{CudaVersion.from_int(d)})" if d is not None else
                 "with no NVIDIA driver on the host too (CPU-only CI, docs builds)")
        return Expected(outcomes=frozenset({"ok"}), reason=f"{what} {where}", rule="gate")

    def _observe(self, cell: Cell, expected: Expected) -> tuple[Observed, ChildResult | None,
                                                                 dict[str, Any]]:
        if expected.rule == "unsupported-pairing":
            return Observed(outcome="skipped:unsupported-pairing", detail=expected.reason), None, {}
        plan = self.sites.get(cell.id)
        if plan is not None:
            failed = self.install_failed.get(plan.wheel)
            if failed is not None:
                return failed, None, {}
            if not plan.site.exists():
                _link_tree(self.staged[plan.wheel], plan.site)
        observed, child, fp = super()._observe(cell, expected)
        if plan is not None and plan.smoke:
            observed = _shell_signal(observed)
        return observed, child, fp

    def _job(self, cell: Cell) -> tuple[Job | None, Observed | None]:
        job, pre = super()._job(cell)
        plan = self.sites.get(cell.id)
        if job is not None and plan is not None:
            job = replace(job, mounts=(*job.mounts, str(plan.site)))  # docker: read-only, same path
        return job, pre


def _gate_argv(args: argparse.Namespace) -> list[str]:
    out = ["cumatrix", "gate", *(str(w) for w in args.wheels)]
    for flag, attr in (("--min-driver", "min_driver"), ("--runtimes", "runtimes"),
                       ("--matrix", "matrix"), ("--smoke", "smoke"),
                       ("--constraints", "constraints"), ("--out", "out"),
                       ("--backend", "backend"), ("--base-image", "base_image"),
                       ("--timeout", "timeout"), ("--wheel-dir", "wheel_dir")):
        value = getattr(args, attr, None)
        if value is None or (attr == "backend" and value == "local"):
            continue
        out += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    out += [f"--optional={g}" for g in getattr(args, "optional", [])]
    out += ["--strict"] if getattr(args, "strict", False) else []
    return out


def _merge_junit(path: Path, audits: Sequence[WheelAudit]) -> None:
    """Fold the static findings into ``junit.xml`` as ``static <wheel>`` test suites."""
    root = ET.parse(path).getroot()
    static = ET.fromstring(findings_junit(audits))
    for suite in static.findall("testsuite"):
        root.append(suite)
        for key in ("tests", "failures"):
            root.set(key, str(int(root.get(key, "0")) + int(suite.get(key, "0"))))
    ET.indent(root)
    tmp = path.with_name(f".{path.name}.tmp")
    ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=True)
    tmp.replace(path)


def _write_reports(out: Path, audits: Sequence[WheelAudit]) -> None:
    run = load_records(out / JSONL)
    write_all(run, out)
    summary = out / "summary.md"
    matrix_part = summary.read_text(encoding="utf-8")
    summary.write_text(findings_markdown(audits) + "\n" + matrix_part, encoding="utf-8")
    _merge_junit(out / "junit.xml", audits)
    (out / "static.json").write_text(dumps(findings_record(audits)), encoding="utf-8")


def _check_dynamic_inputs(args: argparse.Namespace) -> None:
    gate_matrix(Path(args.matrix) if args.matrix is not None else None)  # ConfigError: exit 2
    if args.constraints is not None and not Path(args.constraints).is_file():
        raise UsageError(f"--constraints {args.constraints}: no such file")
    if args.wheel_dir is not None and not Path(args.wheel_dir).is_dir():
        raise UsageError(f"--wheel-dir {args.wheel_dir}: no such directory")
    if importlib.util.find_spec("pip") is None:
        raise UsageError(f"the dynamic stage installs wheels with pip, which {sys.executable} "
                         "lacks: `python -m ensurepip`, or gate with --static-only")


def run_dynamic_stage(args: argparse.Namespace, wheels: Sequence[Path],
                      audits: Sequence[WheelAudit]) -> int:
    """Stage two: install each wheel into every runtime cell of ``args.matrix`` and import it.

    One ``import-<wheel>`` cell (and ``smoke-<wheel>`` with ``--smoke``) per wheel and
    runtime x driver pairing, each with its own install target, run crash-isolated through
    :class:`cumatrix.session.Runner`.  Pairings NVIDIA does not support are recorded as
    ``skipped:unsupported-pairing``.  Writes ``results.jsonl`` (with the static findings
    record), ``results.json``, ``junit.xml`` (static suites folded in), ``summary.md``
    (static findings first) and ``index.html`` into ``--out``.  Returns 0 when every cell
    met its expectation, 1 otherwise.
    """
    out = Path(args.out if args.out is not None else DEFAULT_OUT)
    backend: str = args.backend
    wheel_dir = Path(args.wheel_dir) if args.wheel_dir else None
    matrix = gate_matrix(Path(args.matrix) if args.matrix is not None else None)
    gws = _gate_wheels(wheels)
    sites = (out / SITES_DIR).resolve()
    cells, plan = gate_cells(matrix, gws, smoke=args.smoke, sites=sites, backend=backend,
                             timeout=args.timeout)
    if not cells:
        raise UsageError(f"{matrix.path}: no runtime x driver pairing to run the wheels on")
    runner = GateRunner(matrix=matrix, backend=backend, wheel_dir=wheel_dir,
                        timeout=args.timeout or DEFAULT_TIMEOUT, base_image=args.base_image,
                        sites=plan)
    try:
        # The daemon must answer before any cell runs (its facts join the host fingerprint).
        fingerprint = runner.host_fingerprint()
        npairs = len(cells) // (len(gws) * (2 if args.smoke else 1))
        print(f"dynamic stage: {len(gws)} wheel{'s' if len(gws) != 1 else ''} x {npairs} "
              f"pairing{'s' if npairs != 1 else ''} of {matrix.path} ({backend} backend), "
              f"{len(cells)} cells; reports in {out}/", flush=True)
        if sites.exists():
            shutil.rmtree(sites)
        for w in gws:
            staged = sites / ".staged" / w.path.name[: -len(".whl")]
            how = f"with constraints {args.constraints}" if args.constraints else "without dependencies"
            print(f"installing {w.path.name} {how}", flush=True)
            rc, log = _pip_install(w.path, staged, args.constraints)
            if rc != 0 and "is not a supported wheel on this platform" in log:
                # dist/*.whl often holds one wheel per Python version; each is run by a
                # matching interpreter, and the static audit above still covered this one.
                why = (f"{w.path.name} is not installable by this Python ({sys.executable}, "
                       f"{sys.implementation.cache_tag}): gate it with a matching interpreter")
                print(f"  {why}; its cells are skipped", flush=True)
                runner.install_failed[w.name] = Observed(outcome="skipped:wheel-not-for-this-python",
                                                         detail=why)
            elif rc != 0:
                print(f"  pip install failed (exit {rc}); every cell of {w.name} fails:\n"
                      + textwrap.indent(log[-2000:], "    "), flush=True)
                runner.install_failed[w.name] = Observed(
                    outcome=f"exit:{rc}", exit_status=rc,
                    detail=f"pip install of {w.path.name} failed: {log[-1500:]}")
            runner.staged[w.name] = staged
        store = Store(out)
        if store.path.exists():
            store.path.unlink()
        store.append(run_header(matrix, [c.id for c in cells], backend=backend,
                                argv=_gate_argv(args), host=None, fingerprint=fingerprint,
                                run_id=uuid.uuid4().hex[:12]))
        store.append(findings_record(audits))
        try:
            failed = _run_cells(runner, cells, store)
        except KeyboardInterrupt:
            _write_reports(out, audits)
            raise
    finally:
        if runner._docker is not None:
            runner._docker.close()
    _write_reports(out, audits)
    for rec in failed:
        print(f"FAIL {rec['id']}: {rec['mismatch']}")
    print(f"dynamic stage: {'FAIL' if failed else 'pass'}: {len(failed)} of {len(cells)} cells "
          f"failed; reports in {out}/ (summary.md, junit.xml, results.json, index.html)")
    return 1 if failed else 0


def _run_cells(runner: GateRunner, cells: Sequence[Cell], store: Store) -> list[dict[str, Any]]:
    failed: list[dict[str, Any]] = []
    t0 = time.monotonic()
    interrupted = True
    try:
        for n, cell in enumerate(cells, 1):
            rec = runner.run_cell(cell)
            store.append(rec)
            if rec["status"] == "fail":
                failed.append(rec)
            obs = rec["observed"]
            outcome = obs["outcome"] + (f" [{obs['path']}]" if obs.get("path") not in (None, "n/a")
                                        else "")
            print(progress_line(n, len(cells), time.monotonic() - t0, cell.id, rec["status"],
                                outcome), file=sys.stderr, flush=True)
        interrupted = False
    finally:
        # A killed gate still leaves a report of what it finished.
        store.append({"schema": 1, "type": "end", "finished": utcnow(), "interrupted": interrupted})
    return failed


# --------------------------------------------------------------------------- command line


def _min_driver_arg(text: str) -> CudaVersion:
    try:
        return CudaVersion.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}; for example --min-driver 12.4") from e


def _runtimes_arg(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"not a list of CUDA runtime majors: {text!r} (want e.g. 12 or 12,13)")
    return tuple(sorted({int(p) for p in parts}))


_EPILOG = """\
examples:
  cumatrix gate dist/*.whl --static-only --min-driver 12.4
      fail if any extension links a driver entry point newer than CUDA 12.4
      (the `undefined symbol: cuMemcpyBatchAsync` of vLLM PR 38460)
  cumatrix gate dist/mypkg-*.whl --static-only --runtimes 12,13 --strict
      also fail on DT_NEEDED libcuda.so.1 and on a libcudart of another major
  cumatrix gate dist/*.whl --static-only --optional 'mypkg/_flash*.so'
      report files loaded only inside a guarded import as warnings
  cumatrix gate dist/*.whl --matrix matrix.yaml --smoke 'python3 -m mypkg.selftest'
      static audit, then install the wheel into every runtime x driver pairing of
      matrix.yaml, import its top-level packages there and run the smoke command
  cumatrix gate dist/*.whl --backend docker --constraints constraints.txt
      the same in containers without network, dependencies installed on the host

the dynamic stage (unless --static-only): one cell per wheel and pairing,
<runtime>/<driver>/import-<wheel> (and smoke-<wheel>), each with its own install target
(<out>/gate-sites/); every pairing NVIDIA supports must be ok; a runtime of a newer
major than the driver is skipped:unsupported-pairing. Reports in --out (default
gate-out/): summary.md (static findings first), junit.xml (static suites included),
results.json, index.html. With the local backend, dependencies not installed with
--constraints come from the Python environment cumatrix runs in.

what the static audit reports (per ELF file, read from the zip without extracting):
  needs-libcuda          DT_NEEDED on libcuda.so*: warning (error with --strict)
  driver-symbol-too-new  undefined cu* symbol introduced after --min-driver: error
  runtime-major          DT_NEEDED libcudart.so.N, N outside --runtimes: error
  abi-lookup             string naming a runtime function whose ABI changed between
                         CUDA majors (e.g. cudaMemcpyBatchAsync): warning
  unreadable-elf         a file with the ELF magic that does not parse: error
Introduction versions and ABI changes are read from the headers of the CUDA runtime
wheels (fetched once into the cache; --wheel-dir uses already-downloaded wheels).

exit status: 0 no error finding and every cell met its expectation, 1 an error
finding or a failed cell, 2 bad input (missing or non-wheel file, malformed option,
bad matrix).
"""


def add_gate_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
                    ) -> argparse.ArgumentParser:
    """Register ``gate`` on ``subparsers`` with ``func=gate_main`` (the CLI calls ``args.func``)."""
    p = subparsers.add_parser(
        "gate",
        help="pre-release gate for wheels: static ELF audit, then the matrix",
        description=("Fail a wheel release that would break on a supported driver/runtime "
                     "pairing, and say exactly why."),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("wheels", nargs="+", type=Path, metavar="WHEEL", help="wheel files to gate")
    p.add_argument("--min-driver", type=_min_driver_arg, default=None, metavar="X.Y",
                   help=("oldest driver (as the CUDA version it reports) the wheel supports; "
                         "default: X.0 of the lowest --runtimes major, else 12.0"))
    p.add_argument("--runtimes", type=_runtimes_arg, default=None, metavar="N[,N]",
                   help="CUDA runtime majors the wheel supports, e.g. 12 or 12,13")
    p.add_argument("--strict", action="store_true",
                   help="make DT_NEEDED on libcuda.so* an error")
    p.add_argument("--optional", action="append", default=[], metavar="GLOB",
                   help=("member path glob (fnmatch) of ELF files loaded only inside a guarded "
                         "import; their findings become warnings (repeatable)"))
    p.add_argument("--static-only", action="store_true", help="stop after the static audit")
    p.add_argument("--matrix", type=Path, default=None, metavar="M",
                   help=("matrix file whose runtime x driver pairings the dynamic stage runs "
                         "(its variants, workloads and cases are ignored); default: "
                         f"./{DEFAULT_MATRIX} if present, else every known runtime on the "
                         "host driver"))
    p.add_argument("--smoke", default=None, metavar="CMD",
                   help=("shell command run in each pairing after the import cell, as its own "
                         "cell (smoke-<wheel>), with the installed wheel on PYTHONPATH"))
    p.add_argument("--constraints", type=Path, default=None, metavar="FILE",
                   help=("install the wheel with its dependencies under these pip constraints, "
                         "instead of alone (--no-deps)"))
    p.add_argument("--backend", choices=("local", "docker"), default="local",
                   help=("local: a child process per cell (default); docker: a container per "
                         "cell, no network, the install mounted read-only"))
    p.add_argument("--base-image", default=None, metavar="IMAGE",
                   help="docker: base image the runtime images are built on")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help=f"kill a cell after S seconds (default {DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help=(f"reports go here (default {DEFAULT_OUT}/; with --static-only only when "
                         "given): summary.md, junit.xml, static.json, and after the dynamic "
                         "stage results.jsonl, results.json and index.html"))
    p.add_argument("--wheel-dir", type=Path, default=None, metavar="DIR",
                   help="directory of already-downloaded CUDA runtime wheels")
    from . import sandbox

    sandbox.add_cli_options(p, default="auto")
    p.set_defaults(func=gate_main)
    return p


def _check_wheel(path: Path) -> None:
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if not path.is_file():
        raise UsageError(f"{path}: not a file")
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{path}: not a wheel (not a zip archive)")
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except zipfile.BadZipFile as e:
        raise UsageError(f"{path}: not a wheel ({e})") from e
    if not any(re.fullmatch(r"[^/]+\.dist-info/WHEEL", n) for n in names):
        raise UsageError(f"{path}: not a wheel (a zip without a *.dist-info/WHEEL file)")


def _default_min_driver(runtime_majors: tuple[int, ...] | None) -> CudaVersion:
    if runtime_majors:
        return CudaVersion(min(runtime_majors), 0)
    return min(CudaVersion.parse(v) for v in runtimes.KNOWN_WHEELS)


def _write_outputs(out: Path, audits: Sequence[WheelAudit]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(findings_markdown(audits), encoding="utf-8")
    (out / "static.json").write_text(dumps(findings_record(audits)), encoding="utf-8")
    (out / "junit.xml").write_text(findings_junit(audits), encoding="utf-8")


def gate_main(args: argparse.Namespace) -> int:
    """Run ``cumatrix gate``; returns the exit status (0 pass, 1 error finding, 2 bad input)."""
    try:
        return _gate(args)
    except CumatrixError as e:
        print(f"cumatrix gate: error: {e}", file=sys.stderr)
        return e.exit_code


def _gate(args: argparse.Namespace) -> int:
    from . import sandbox

    sandbox.set_default(sandbox.policy(getattr(args, "sandbox", None), getattr(args, "pass_env", None)))
    wheels: list[Path] = [Path(w) for w in args.wheels]
    for w in wheels:
        _check_wheel(w)
    if not args.static_only:
        _check_dynamic_inputs(args)  # bad input is exit 2 before any work
    runtime_majors: tuple[int, ...] | None = args.runtimes
    min_driver: CudaVersion = args.min_driver or _default_min_driver(runtime_majors)
    data = load_audit_data(wheel_dir=args.wheel_dir)
    audits: list[WheelAudit] = []
    for w in wheels:
        try:
            audits.append(audit_wheel(
                w, min_driver=min_driver, runtimes=runtime_majors, strict=args.strict,
                optional=tuple(args.optional), introductions=data.introductions,
                abi_changed=data.abi_changes,
            ))
        except (zipfile.BadZipFile, OSError) as e:
            raise UsageError(f"{w}: cannot read the wheel: {e}") from e
    print(f"static audit: --min-driver {min_driver}, runtimes "
          f"{','.join(map(str, runtime_majors)) if runtime_majors else 'any'}, "
          f"facts from CUDA {' and '.join(data.sources)} headers")
    print(format_findings(audits), end="")
    status = 1 if any(a.errors for a in audits) else 0
    if args.static_only:
        if args.out is not None:
            _write_outputs(args.out, audits)
        return status
    dynamic = run_dynamic_stage(args, wheels, audits)
    return max(status, dynamic)
