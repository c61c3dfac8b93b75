"""The gate's static findings as the reports show them, read from the run's own data.

The gate stores its static audit in ``results.jsonl`` as one ``{"type": "static"}`` record
beside the cells; every writer renders it from there (``summary.md`` opens with it,
``junit.xml`` has a ``static <wheel>`` suite per wheel, ``static.json`` is the record).
Nothing edits a report after it was written.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .records import RunData


@dataclass(frozen=True, kw_only=True, slots=True)
class StaticFinding:
    wheel: str
    file: str
    severity: str
    code: str
    subject: str
    message: str
    fix: str
    optional: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class StaticWheel:
    wheel: str
    elves: tuple[str, ...]
    errors: int
    warnings: int
    seconds: float
    findings: tuple[StaticFinding, ...]


def _s(value: object) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def _i(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def static_record(run: RunData) -> Mapping[str, object] | None:
    """The run's static-findings record, if it has one (the last wins)."""
    found = [r for r in run.extra if r.get("type") == "static"]
    return found[-1] if found else None


def static_wheels(record: Mapping[str, object]) -> tuple[StaticWheel, ...]:
    """The record's wheels with their findings, typed."""
    raw_findings = record.get("findings")
    findings = [StaticFinding(wheel=_s(f.get("wheel")), file=_s(f.get("file")), severity=_s(f.get("severity")),
                              code=_s(f.get("code")), subject=_s(f.get("subject")), message=_s(f.get("message")),
                              fix=_s(f.get("fix")), optional=bool(f.get("optional")))
                for f in (raw_findings if isinstance(raw_findings, list) else []) if isinstance(f, Mapping)]
    raw_wheels = record.get("wheels")
    out: list[StaticWheel] = []
    for w in raw_wheels if isinstance(raw_wheels, list) else []:
        if not isinstance(w, Mapping):
            continue
        name = _s(w.get("wheel"))
        elves = w.get("elves")
        seconds = w.get("seconds")
        out.append(StaticWheel(wheel=name, elves=tuple(_s(e) for e in elves) if isinstance(elves, list) else (),
                               errors=_i(w.get("errors")), warnings=_i(w.get("warnings")),
                               seconds=float(seconds) if isinstance(seconds, int | float) else 0.0,
                               findings=tuple(f for f in findings if f.wheel == name)))
    return tuple(out)


def _counts(errors: int, warnings: int) -> str:
    return f"{errors} error{'s' if errors != 1 else ''}, {warnings} warning{'s' if warnings != 1 else ''}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def static_markdown(wheels: Sequence[StaticWheel]) -> str:
    """The static findings as Markdown, for the top of ``summary.md``."""
    errors = sum(w.errors for w in wheels)
    warnings = sum(w.warnings for w in wheels)
    out = [f"## Static audit: {'FAIL' if errors else 'pass'} ({_counts(errors, warnings)})", ""]
    for w in wheels:
        n = len(w.elves)
        out += [f"**{_md(w.wheel)}**: {n} ELF file{'s' if n != 1 else ''}, {_counts(w.errors, w.warnings)}", ""]
        if not w.findings:
            continue
        out += ["| file | severity | code | subject | message | fix |", "|---|---|---|---|---|---|"]
        for f in w.findings:
            sev = f.severity + (" (optional)" if f.optional else "")
            out.append(f"| `{_md(f.file)}` | {sev} | {f.code} | `{_md(f.subject)}` | {_md(f.message)} | {_md(f.fix)} |")
        out.append("")
    return "\n".join(out) + "\n"


def static_suites(wheels: Sequence[StaticWheel]) -> list[ET.Element]:
    """One JUnit ``testsuite`` per wheel: a testcase per ELF file, failed on an error finding."""
    suites: list[ET.Element] = []
    for w in wheels:
        files: dict[str, list[StaticFinding]] = {e: [] for e in w.elves}
        for f in w.findings:
            files.setdefault(f.file, []).append(f)
        failures = sum(any(f.severity == "error" for f in v) for v in files.values())
        suite = ET.Element("testsuite", name=f"static {w.wheel}", tests=str(len(files)), failures=str(failures),
                           time=f"{w.seconds:.3f}")
        for file, found in files.items():
            case = ET.SubElement(suite, "testcase", classname="cumatrix.gate.static", name=f"{w.wheel}::{file}")
            errs = [f for f in found if f.severity == "error"]
            body = "\n".join(f"{f.severity} {f.code} {f.subject}: {f.message}\nfix: {f.fix}" for f in found)
            if errs:
                fail = ET.SubElement(case, "failure", message="; ".join(f"{f.code} {f.subject}" for f in errs))
                fail.text = body
            elif found:
                ET.SubElement(case, "system-out").text = body
        suites.append(suite)
    return suites
