"""The gate's static findings as the reports show them, read from the run's own data.

The gate stores its static audit in ``results.jsonl`` as one ``{"type": "static"}`` record
(:meth:`cumatrix.audit.static.StaticAudit.to_json`) beside the cells; every writer renders it from
there (``summary.md`` opens with it, ``junit.xml`` has a ``static <wheel>`` suite per wheel,
``static.json`` is the record).  Nothing edits a report after it was written.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping

from cumatrix.results.records import RunData


def static_record(run: RunData) -> Mapping[str, object] | None:
    """The run's static-audit record, if it has one (the last wins)."""
    found = [r for r in run.extra if r.get("type") == "static"]
    return found[-1] if found else None


def static_markdown(record: Mapping[str, object]) -> str:
    """The findings as Markdown, for the top of ``summary.md``."""
    # deferred: audit.static (pyelftools, multiprocessing) costs ~180 ms to import; only a gate's
    # run carries a static record, and every report writer imports this module
    from cumatrix.audit.static import StaticAudit, findings_markdown

    return findings_markdown(StaticAudit.from_json(record).wheels)


def static_suites(record: Mapping[str, object]) -> list[ET.Element]:
    """One JUnit ``testsuite`` per wheel."""
    # deferred: audit.static (pyelftools, multiprocessing) costs ~180 ms to import; only a gate's
    # run carries a static record, and every report writer imports this module
    from cumatrix.audit.static import StaticAudit, junit_suites

    return junit_suites(StaticAudit.from_json(record).wheels)
