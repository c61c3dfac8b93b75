"""The static audit of ``cumatrix gate``: what each ELF file of a wheel needs from CUDA.

Reads every ELF file of each wheel straight from the zip (:mod:`cumatrix.binary.elf`) and checks it
against facts read from real CUDA headers (:mod:`cumatrix.provision.headers`): which driver entry points
the file links and whether it links the driver library at all, which CUDA runtime major it
needs (by ``DT_NEEDED`` or a statically linked runtime) and whether the minimum driver can
run it, which runtime entry points it links that are newer than the oldest runtime it
supports, which runtime entry points with a major-dependent ABI it looks up by name and
where it picks the ABI from, and which GPU architectures its device code covers
(:mod:`cumatrix.binary.fatbin`).  The findings are data (:mod:`cumatrix.audit.findings`);
:mod:`cumatrix.audit.output` renders them for a terminal, Markdown, JSON and JUnit; the checks
are in :mod:`cumatrix.audit.checks`, the reading of the members in :mod:`cumatrix.audit.members`.
This module keeps the names the rest of cumatrix imports from it.
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import hashlib
import itertools
import json
import os
import re
import time
import zipfile
from collections.abc import Container, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from pathlib import Path

from cumatrix.audit import linkage, runtime_evidence
from cumatrix.audit.checks import audit_elf, elf_device_code
from cumatrix.audit.coverage import device_checks
from cumatrix.audit.findings import (
    RECORD_SCHEMA,
    AuditData,
    AuditSettings,
    FileDevice,
    Finding,
    Linkage,
    Severity,
    StaticAudit,
    WheelAudit,
)
from cumatrix.audit.members import ELF_READER, _MemberResult, audit_members, workers
from cumatrix.audit.output import (
    device_markdown,
    findings_junit,
    findings_markdown,
    findings_record,
    folded_notes,
    format_findings,
    junit_suites,
)
from cumatrix.core.cache import cache_root
from cumatrix.core.errors import CumatrixError
from cumatrix.core.model import CudaVersion
from cumatrix.provision import headers, runtimes

__all__ = [
    "ELF_READER",
    "RECORD_SCHEMA",
    "AuditData",
    "AuditSettings",
    "FileDevice",
    "Finding",
    "Severity",
    "StaticAudit",
    "WheelAudit",
    "audit_elf",
    "audit_wheel",
    "device_checks",
    "device_markdown",
    "elf_device_code",
    "findings_junit",
    "findings_markdown",
    "findings_record",
    "folded_notes",
    "format_findings",
    "junit_suites",
    "load_audit_data",
    "optional_import_notes",
    "runtime_introductions",
]

#: The number of processes a large wheel is audited on (every usable core).
_workers = workers


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
    members, results = audit_members(wheel, s, d, abi_changed, jobs)
    elves, findings, device, links = _gathered(members, results)
    findings = _marked_optional(linkage.wheel_checks(links, findings, s), s.optional or optional)
    findings.extend(optional_import_notes(wheel, findings))
    return WheelAudit(wheel=wheel, elves=tuple(elves), findings=tuple(findings),
                      seconds=time.perf_counter() - start, device=tuple(device))


def _gathered(members: list[tuple[str, int]], results: Mapping[str, _MemberResult]
              ) -> tuple[list[str], list[Finding], list[FileDevice], dict[str, Linkage]]:
    """The ELF members, in archive order, their findings, their device code and linkage."""
    elves: list[str] = []
    findings: list[Finding] = []
    device: list[FileDevice] = []
    links: dict[str, Linkage] = {}
    for m, _ in members:
        r = results[m]
        if not r.is_elf:
            continue
        elves.append(m)
        findings.extend(r.findings)
        if r.link is not None:
            links[m] = r.link
        if r.codes:
            device.append(FileDevice(file=m, codes=r.codes))
    return elves, findings, device, links


def _marked_optional(findings: list[Finding], globs: tuple[str, ...]) -> list[Finding]:
    """``findings`` with those of files matching a glob of ``globs`` marked optional, an error
    among them downgraded to a warning."""
    out: list[Finding] = []
    for f in findings:
        if not any(fnmatch.fnmatchcase(f.file, g) for g in globs):
            out.append(f)
        elif f.severity == "error":
            out.append(replace(f, severity="warning", optional=True))
        else:
            out.append(replace(f, optional=True))
    return out


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


_GUARDING = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _catches_import_error(node: ast.Try) -> bool:
    catches: set[str] = set()
    for h in node.handlers:
        types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        catches |= {t.id for t in types if isinstance(t, ast.Name)}
        if h.type is None:
            catches.add("ImportError")
    return bool(catches & _GUARDING)


def _children(node: ast.AST, guarded: bool) -> list[tuple[ast.AST, bool]]:
    """The statements (and the handlers and match cases that hold statements) directly
    inside ``node``, in field order, each with whether it is guarded."""
    guards = isinstance(node, ast.Try) and _catches_import_error(node)
    out: list[tuple[ast.AST, bool]] = []
    for name, value in ast.iter_fields(node):
        if not isinstance(value, list):
            continue
        inner = guarded or (guards and name == "body")
        out += [(v, inner) for v in value
                if isinstance(v, (ast.stmt, ast.ExceptHandler, ast.match_case))]
    return out


def _imports(tree: ast.Module, package: str) -> list[tuple[str, int, bool]]:
    """(absolute module, line, guarded) of every import; guarded: inside a ``try:`` body
    whose handlers catch ImportError (or a base of it).

    Imports are statements, so only statements (and the handlers and cases that hold them)
    are visited, breadth first in the order of :func:`ast.walk`: expressions, most of a
    module's nodes, are never walked (walking them all was most of the optional-import
    analysis of a framework wheel)."""
    out: list[tuple[str, int, bool]] = []
    level: list[tuple[ast.AST, bool]] = _children(tree, False)
    while level:
        deeper: list[tuple[ast.AST, bool]] = []
        for node, guarded in level:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out += [(name, node.lineno, guarded) for name in _import_names(node, package)]
            else:
                deeper += _children(node, guarded)
        level = deeper
    return out


def _python_trees(wheel: Path, wanted: re.Pattern[bytes]) -> Iterator[tuple[str, ast.Module]]:
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


def _cached_imports(wheel: Path, modules: list[str]
                    ) -> tuple[Path | None, tuple[dict[str, tuple[str, int]], set[str]] | None]:
    """The cache file of this analysis, keyed by content (every ``.py`` member's name, CRC-32
    and size, read from the zip's directory, and the modules asked about), and what it holds.
    A gate run again on the same wheel (a release re-run, a fixed finding) parses nothing."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            pys = sorted((i.filename, i.CRC, i.file_size) for i in zf.infolist() if i.filename.endswith(".py"))
        path = cache_root() / "gate-imports" / (
            hashlib.sha256(json.dumps([pys, modules]).encode()).hexdigest()[:32] + ".json")
    except (OSError, zipfile.BadZipFile, CumatrixError):
        return None, None  # no cache here (the analysis reports the unreadable zip itself)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return path, ({k: (str(v[0]), int(v[1])) for k, v in doc["found"].items()}, set(doc["plain"]))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return path, None  # not stored yet, or unreadable: analysed again and stored


def _store_imports(path: Path | None, found: Mapping[str, tuple[str, int]], plain: set[str]) -> None:
    if path is None:
        return
    # A cache that cannot be written costs the next run the parse again, nothing more.
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"found": found, "plain": sorted(plain)}), encoding="utf-8")
        tmp.replace(path)


def _guarded_imports(wheel: Path, wanted: re.Pattern[bytes], modules: Container[str]
                     ) -> tuple[dict[str, tuple[str, int]], set[str]]:
    """Of ``modules``, where the wheel's Python code (the files ``wanted`` matches) first
    imports each inside ``try/except ImportError``, and those it imports somewhere without
    such a guard."""
    found: dict[str, tuple[str, int]] = {}
    plain: set[str] = set()  # imported somewhere without a guard: not optional
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
    return found, plain


def _failing_extensions(findings: Sequence[Finding]) -> dict[str, str]:
    """Module name -> file, for each file with an error finding that Python imports."""
    failing = {f.file for f in findings if f.severity == "error"}
    return {m: f for f in failing if (m := _module_of(f)) is not None}


def optional_import_notes(wheel: Path, findings: Sequence[Finding]) -> list[Finding]:
    """A note for each file with an error finding that the wheel's Python code imports only
    inside ``try/except ImportError``: the project may treat it as optional."""
    modules = _failing_extensions(findings)
    if not modules:
        return []
    stems = {m.rsplit(".", 1)[-1] for m in modules}
    # Only files with an import line naming a stem are parsed (parsing all of vLLM's took 10 s).
    wanted = re.compile(rb"^[ \t]*(?:from|import)[ \t][^\n]*\b(?:"
                        + b"|".join(re.escape(s.encode()) for s in sorted(stems)) + rb")\b",
                        re.MULTILINE)
    key, cached = _cached_imports(wheel, sorted(modules))
    if cached is not None:
        found, plain = cached
    else:
        try:
            found, plain = _guarded_imports(wheel, wanted, modules)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return []
        _store_imports(key, found, plain)
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

