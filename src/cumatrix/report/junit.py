"""``junit.xml``: one testcase per cell, in the JUnit dialect CI systems read.

Failures carry the mismatch as message and the child's stderr tail as body; skipped and
not-run cells are ``<skipped>``.  Child output is stripped of ANSI escapes and of characters
XML 1.0 cannot hold, so the file always parses.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from cumatrix.report.grid import readable
from cumatrix.report.headline import headline
from cumatrix.report.meta import chosen_by
from cumatrix.report.since import junit_properties
from cumatrix.report.since import text as since_text
from cumatrix.report.static import static_record, static_suites
from cumatrix.report.text import clean
from cumatrix.report.untested import junit_properties as untested_properties
from cumatrix.report.untested import text as untested_text
from cumatrix.results.records import CellResult, RunData, axes_from_id


def _classname(runtime: str, driver: str, host: str | None) -> str:
    # Dots separate packages in CI viewers (Jenkins, GitLab); keep versions in one segment.
    parts = [host] if host else []
    parts += [runtime.replace(".", "_"), driver.replace(".", "_")]
    return "cumatrix." + ".".join(parts)


def _props(parent: ET.Element, items: list[tuple[str, object]]) -> None:
    props = ET.SubElement(parent, "properties")
    for name, value in items:
        if value is None or value == "":
            continue
        ET.SubElement(props, "property", name=name, value=clean(str(value)))


def _case(cell: CellResult) -> ET.Element:
    axes = cell.axes
    tc = ET.Element(
        "testcase",
        classname=_classname(axes.get("runtime", "?"), axes.get("driver", "?"), cell.host),
        name=clean(cell.id),
        time=f"{cell.duration_s or 0.0:.3f}",
    )
    t = cell.timings
    _props(
        tc,
        [
            ("outcome", cell.observed.outcome),
            ("path", cell.observed.path),
            ("expected", " | ".join(sorted(cell.expected.outcomes))),
            ("reason", cell.expected.reason),
            ("speedup", t.speedup),
            ("gbps", t.gbps),
            ("loop_gbps", t.loop_gbps),
            ("repetitions", t.repetitions),
            ("host", cell.host),
            ("driver_string", cell.fingerprint.get("driver_string")),
            ("runtime_version", cell.fingerprint.get("runtime_version")),
            ("runtime_not_used", cell.fingerprint.get("runtime_not_used")),
        ],
    )
    if cell.status == "fail":
        f = ET.SubElement(
            tc,
            "failure",
            message=clean(cell.mismatch or f"observed {readable(cell.outcome_label)}"),
            type=clean(cell.observed.outcome),
        )
        body = [f"expected: {' | '.join(sorted(cell.expected.outcomes))} ({cell.expected.reason})"]
        body.append(f"observed: {readable(cell.outcome_label)}" + (f" ({cell.observed.detail})" if cell.observed.detail else ""))
        if cell.stderr_tail:
            body += ["", "--- stderr (tail) ---", cell.stderr_tail]
        f.text = clean("\n".join(body))
    elif cell.status == "skip":
        ET.SubElement(tc, "skipped", message=clean(cell.observed.detail or cell.observed.outcome))
    if cell.stdout_tail:
        ET.SubElement(tc, "system-out").text = clean(cell.stdout_tail)
    if cell.stderr_tail:
        ET.SubElement(tc, "system-err").text = clean(cell.stderr_tail)
    return tc


def _not_run_case(cell_id: str, host: str | None) -> ET.Element:
    axes = axes_from_id(cell_id)
    tc = ET.Element(
        "testcase",
        classname=_classname(axes.get("runtime", "?"), axes.get("driver", "?"), host),
        name=clean(cell_id),
        time="0.000",
    )
    ET.SubElement(tc, "skipped", message=f"not run: host {host} did not run it" if host else "not run")
    return tc


def to_xml(run: RunData) -> ET.ElementTree:
    """The JUnit document of a run."""
    c = run.counts
    total_time = sum(cell.duration_s or 0.0 for cell in run.cells)
    attrs = {
        "tests": str(c.total),
        "failures": str(c.failed),
        "errors": "0",
        "skipped": str(c.skipped + c.not_run),
        "time": f"{total_time:.3f}",
    }
    root = ET.Element("testsuites", {"name": "cumatrix", **attrs})
    suite = ET.SubElement(root, "testsuite", {"name": clean(f"cumatrix {run.header.matrix}"), **attrs})
    if run.started:
        suite.set("timestamp", run.started)
    _props(suite, _suite_properties(run))
    for cell in run.cells:
        suite.append(_case(cell))
    for cid, host in run.not_run_where():
        suite.append(_not_run_case(cid, host))
    out = _system_out(run)
    if out:
        ET.SubElement(suite, "system-out").text = clean("\n".join(out))
    _static_suites(root, run)
    ET.indent(root)
    return ET.ElementTree(root)


def _suite_properties(run: RunData) -> list[tuple[str, object]]:
    """The suite's ``<properties>``: the run's verdict, header and what the history said of it."""
    head = run.header
    return [
        ("verdict", run.verdict),
        ("headline", headline(run)),
        ("matrix", head.matrix),
        ("matrix_sha256", head.matrix_sha256),
        ("run_id", head.run_id),
        ("harness_version", head.harness_version),
        ("backend", head.backend),
        ("sandbox", head.sandbox),
        ("hosts", ", ".join(run.hosts) or head.host),
        ("driver_string", head.host_fingerprint.get("driver_string")),
        ("started", run.started),
        ("finished", run.finished),
        *_selection_properties(run),
        *_since_properties(run),
        *(untested_properties(run.untested) if run.untested is not None else ()),
    ]


def _selection_properties(run: RunData) -> list[tuple[str, object]]:
    chosen = chosen_by(run)
    return [] if chosen is None else [("selection", chosen)]


def _system_out(run: RunData) -> list[str]:
    """The texts the suite's ``<system-out>`` joins (where CI shows a suite's output)."""
    out = [since_text(run.since)] if run.since is not None else []
    if run.untested is not None and run.untested.cells:
        out.append(untested_text(run.untested))
    return out


def _since_properties(run: RunData) -> list[tuple[str, object]]:
    if run.since is None:
        return []
    return junit_properties(run.since)


def _static_suites(root: ET.Element, run: RunData) -> None:
    """A gate's static findings: a ``static <wheel>`` suite per wheel, counted in the totals."""
    static = static_record(run)
    if static is None:
        return
    for s in static_suites(static):
        root.append(s)
        for key in ("tests", "failures"):
            root.set(key, str(int(root.get(key, "0")) + int(s.get(key, "0"))))


def write_junit(run: RunData, path: Path) -> Path:
    """Write ``junit.xml`` and return its path."""
    to_xml(run).write(path, encoding="utf-8", xml_declaration=True)
    return path
