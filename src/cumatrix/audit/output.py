"""The static audit's findings rendered for a terminal, Markdown, JSON and JUnit."""

from __future__ import annotations

import re
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from cumatrix.audit.findings import AuditSettings, FileDevice, Finding, StaticAudit, WheelAudit


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


_DEVICE_CODES = ("no-device-code", "ptx-too-new")
_SM_RE = re.compile(r"^sm_(\d+)(\d)$")


def _gpu(subject: str) -> str:
    m = _SM_RE.match(subject)
    return f"{m.group(1)}.{m.group(2)}" if m else subject


def fold_gpus(found: Sequence[Finding]) -> list[list[Finding]]:
    """``found`` (one file's findings) in groups: the device-code findings that differ only in
    their GPU are one group, one cause on one line; every other finding is its own."""
    groups: list[list[Finding]] = []
    keyed: dict[tuple[str, str, str, str], list[Finding]] = {}
    for f in found:
        if f.code not in _DEVICE_CODES or not _SM_RE.match(f.subject):
            groups.append([f])
            continue
        gpu = _gpu(f.subject)
        key = (f.severity, f.code, f.message.replace(gpu, "{gpu}").replace(f.subject, "{sm}"),
               f.fix.replace(f.subject, "{sm}").replace(f.subject.removeprefix("sm_"), "{arch}"))
        if key in keyed:
            keyed[key].append(f)
        else:
            keyed[key] = [f]
            groups.append(keyed[key])
    return groups


def format_findings(audits: Sequence[WheelAudit], *, width: int = 100,
                    verbose: bool = False) -> str:
    """A findings table per ELF file of each wheel, for a terminal.

    Notes of one code that occur more than once in a wheel are folded into one line with a
    count at the end of that wheel (:func:`folded_notes`), and a file's device-code findings
    that differ only in their GPU into one (:func:`fold_gpus`); ``verbose`` lists each.
    """
    lines: list[str] = []
    wrap = textwrap.TextWrapper(width=width, initial_indent=" " * 13,
                                subsequent_indent=" " * 13, break_on_hyphens=False,
                                break_long_words=False)
    fixwrap = textwrap.TextWrapper(width=width, initial_indent=" " * 13 + "fix: ",
                                   subsequent_indent=" " * 18, break_on_hyphens=False,
                                   break_long_words=False)
    for a in audits:
        lines += _wheel_findings(a, wrap, fixwrap, verbose=verbose)
    errors = sum(a.errors for a in audits)
    warnings = sum(a.warnings for a in audits)
    verdict = "FAIL" if errors else "pass"
    lines.append(f"static audit: {verdict}: {_counts(errors, warnings)} in "
                 f"{len(audits)} wheel{'s' if len(audits) != 1 else ''}")
    return "\n".join(lines) + "\n"


def _wheel_findings(a: WheelAudit, wrap: textwrap.TextWrapper, fixwrap: textwrap.TextWrapper, *,
                    verbose: bool) -> list[str]:
    """One wheel's lines of :func:`format_findings`: each file's findings, then the folded notes."""
    n = len(a.elves)
    lines = [(f"{a.wheel.name}: {n} ELF file{'s' if n != 1 else ''} audited in "
              f"{a.seconds:.2f} s: {_counts(a.errors, a.warnings)}")]
    if not a.elves:
        lines.append("  no ELF files (a pure-Python wheel): nothing to audit")
    device = {d.file: d for d in a.device}
    folded = {} if verbose else folded_notes(a)
    hidden = {id(f) for fs in folded.values() for f in fs}
    for file, found in _by_file(a).items():
        shown = [f for f in found if id(f) not in hidden]
        lines += _file_lines(file, _code_text(device.get(file)), found, shown, wrap, fixwrap,
                             verbose=verbose)
    lines += _folded_lines(folded, wrap)
    lines.append("")
    return lines


def _folded_lines(folded: dict[str, list[Finding]], wrap: textwrap.TextWrapper) -> list[str]:
    """One line per code of notes folded (:func:`folded_notes`), and what they share."""
    lines: list[str] = []
    for fcode, found in folded.items():
        lines.append(f"  NOTE     {fcode} x{len(found)} (-v lists each)")
        lines.extend(_wrap(wrap, _fold_line(fcode, found)))
    return lines


def _code_text(d: FileDevice | None) -> str:
    """A file's device code after its name (``[SASS ...; PTX ...]``), or nothing without any."""
    if not d:
        return ""
    return f"  [SASS {' '.join(d.sass) or '-'}; PTX {' '.join(d.ptx) or '-'}]"


def _file_lines(file: str, code: str, found: Sequence[Finding], shown: Sequence[Finding],
                wrap: textwrap.TextWrapper, fixwrap: textwrap.TextWrapper, *,
                verbose: bool) -> list[str]:
    """One file's lines of :func:`_wheel_findings`: ``ok`` where all its ``found`` are folded,
    else the findings ``shown`` (one GPU's each, unless folded over GPUs)."""
    if not shown:
        n = len(found)
        tail = f" ({n} note{'s' if n != 1 else ''} folded below)" if n else ""
        return [f"  {file}: ok{tail}{code}"]
    lines = [f"  {file}{code}"]
    for group in (fold_gpus(shown) if not verbose else [[f] for f in shown]):
        lines += _finding_lines(group, wrap, fixwrap)
    return lines


def _finding_lines(group: Sequence[Finding], wrap: textwrap.TextWrapper,
                   fixwrap: textwrap.TextWrapper) -> list[str]:
    """A finding (and those folded into it, for other GPUs): its line, message and fix."""
    f = group[0]
    lines = [f"    {f.severity.upper():<8} {f.code:<22} {', '.join(g.subject for g in group)}"
             + ("  [optional file]" if f.optional else "")]
    more = ", ".join(_gpu(g.subject) for g in group[1:])
    lines.extend(_wrap(wrap, f.message + (f"; the same for compute capability {more}" if more else "")))
    lines.extend(_wrap(fixwrap, f.fix.replace(f.subject, ", ".join(g.subject for g in group))))
    return lines


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
        if a.findings:
            out += _findings_table(a, verbose=verbose)
    device = device_markdown(audits)
    if device:
        out.append(device)
    return "\n".join(out) + "\n"


def _findings_table(a: WheelAudit, *, verbose: bool) -> list[str]:
    """One wheel's findings as a Markdown table (notes folded unless ``verbose``), then a
    blank line."""
    folded = {} if verbose else folded_notes(a)
    hidden = {id(f) for fs in folded.values() for f in fs}
    out = ["| file | severity | code | subject | message | fix |", "|---|---|---|---|---|---|"]
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
    return out


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
            _junit_case(suite, a, file, found)
        suites.append(suite)
    return suites


def _junit_case(suite: ET.Element, a: WheelAudit, file: str, found: Sequence[Finding]) -> None:
    """The testcase of one file: failed on an error finding, its other findings as output."""
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


def findings_junit(audits: Sequence[WheelAudit]) -> str:
    """JUnit XML of the static stage alone (``gate --static-only``)."""
    root = ET.Element("testsuites", name="cumatrix gate")
    root.extend(junit_suites(audits))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
