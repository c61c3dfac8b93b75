"""The findings of ``cumatrix gate``'s static audit as data: what each check reports
(:class:`Finding`), per wheel (:class:`WheelAudit`) and for the stage (:class:`StaticAudit`),
the options (:class:`AuditSettings`) and the facts from CUDA headers (:class:`AuditData`).
Each has ``to_json``/``from_json``; :mod:`cumatrix.audit.static` produces them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cumatrix.binary.fatbin import DeviceCode, Variant, parse_arch
from cumatrix.core.model import CudaVersion

Severity = Literal["error", "warning", "note"]

#: The JSON record's schema version (``findings_record``); new keys are additive.
RECORD_SCHEMA = 1

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
class Linkage:
    """What the wheel-level checks need of one ELF file (:mod:`cumatrix.audit.linkage`): the
    libraries it asks the loader for and where the loader looks, what it defines, and which
    CUDA runtime it is or carries, read from its content."""

    needed: tuple[str, ...] = ()
    search_paths: tuple[str, ...] = ()  #: DT_RPATH and DT_RUNPATH entries
    soname: str | None = None
    runtime_major: int | None = None  #: the CUDA runtime this file is or carries (content, not name)
    runtime_is_shared: bool = False  #: the file is a libcudart itself (it exports the runtime API)
    judged: frozenset[int] = frozenset()  #: runtime majors the file's own checks already judged
    driver_undefined: tuple[str, ...] = ()  #: undefined driver entry points (known cu* names)
    exported: frozenset[str] = frozenset()  #: defined cu*/cuda* symbols


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
        for entry in data.get("wheels", []):
            w = entry
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
