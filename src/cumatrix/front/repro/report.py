"""``repro``'s Markdown: one re-run cell's report, a catalog entry's report."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from cumatrix import __version__
from cumatrix.core.model import Cell, CudaVersion, Kind, outcome_kind
from cumatrix.core.record import CellRecord
from cumatrix.front.repro.native import NativeTrace, find_debugger, parse_maps
from cumatrix.judge.reproduce import shown
from cumatrix.load.catalog import Bug
from cumatrix.orchestrate import Orchestrator
from cumatrix.report.text import clean


@dataclass(kw_only=True)
class CellRun:
    """One cell run for a report: its record and what was gathered around it."""

    cell: Cell
    record: CellRecord
    command: str | None
    native: NativeTrace | None = None
    build_log: str = ""  # the compiler's whole message, for a build-error (the record keeps its tail)

    @property
    def outcome(self) -> str:
        return self.record.observed.outcome

    @property
    def path(self) -> str | None:
        return self.record.observed.path

    @property
    def detail(self) -> str:
        return self.build_log or self.record.observed.detail

    def shown(self) -> str:
        return shown(self.record.observed)



def _fence(text: str, lang: str = "") -> list[str]:
    # What a child printed is shown, never obeyed: escapes stripped, controls as \xNN (the
    # Markdown sink's cleaning), in a fence longer than any backtick run in it.
    body = clean(text).rstrip() or "(empty)"
    ticks = "```"
    while ticks in body:
        ticks += "`"
    return [f"{ticks}{lang}", body, ticks]


def _env_table(runner: Orchestrator, runs: list[CellRun]) -> list[str]:
    rows = _host_rows(runner)
    for r in runs:
        rows += _run_rows(r)
    out = ["| | |", "|---|---|"]
    out += [f"| {k} | {clean(str(v)).replace(chr(10), ' ').replace('|', '/')} |" for k, v in rows]
    return out


def _host_rows(runner: Orchestrator) -> list[tuple[str, object]]:
    """The environment table's rows of this host and this run's setup."""
    fp = runner.host_fingerprint()
    raw_gpus = fp.get("gpus")
    gpus = [g for g in raw_gpus if isinstance(g, dict)] if isinstance(raw_gpus, list) else []
    return [
        ("cumatrix", __version__),
        ("host", f"{fp.get('hostname')} ({fp.get('platform')})"),
        ("python", str(fp.get("python"))),
        ("driver", _driver_text(fp)),
        ("GPUs", ", ".join(f"{g.get('name')} (cc {g.get('compute_capability')})" for g in gpus) or "none"),
        ("forward compatibility", "in use" if fp.get("forward_compat") else "not in use"),
        ("backend", runner.backend),
        ("debugger", find_debugger() or "gdb/cuda-gdb not installed"),
    ]


def _driver_text(fp: Mapping[str, object]) -> str:
    """The host's driver as a report names it: its CUDA version and number, and its string."""
    dv = fp.get("driver_version")
    return ((f"CUDA {CudaVersion.from_int(int(str(dv)))} ({dv})" if dv else "none")
            + (f", {fp['driver_string']}" if fp.get("driver_string") else ""))


def _run_rows(r: CellRun) -> list[tuple[str, object]]:
    """The environment table's rows of one re-run cell: the runtime, libcuda and image it used."""
    f = r.record.fingerprint
    rows: list[tuple[str, object]] = []
    if f.get("runtime_file"):
        rows.append((f"runtime of {r.cell.id}", f"{f['runtime_file']} ({f.get('runtime_version')})"))
    if f.get("libcuda_file"):
        rows.append((f"libcuda of {r.cell.id}", str(f["libcuda_file"])))
    if f.get("image"):
        rows.append((f"image of {r.cell.id}", f"{f['image']} ({f.get('image_id')})"))
    return rows


def _python_stack(stderr: str) -> str:
    i = stderr.find("Fatal Python error")
    return stderr[i:] if i >= 0 else stderr[-3000:]


def _cell_section(r: CellRun, title: str, want: str | None = None) -> list[str]:
    """One cell's part of a report: the verdict, why, the crash's stacks, what was loaded."""
    rec = r.record
    lines = [f"## {title}: `{r.cell.id}`", "", *_cell_table(r, want)]
    lines += ["", f"**The oracle's reason** ({rec.expected.rule or 'no rule'}): {rec.expected.reason}", ""]
    if rec.mismatch:
        lines += [f"**Mismatch:** {rec.mismatch}", ""]
    crashed = outcome_kind(r.outcome) is Kind.CRASH
    if r.detail and not crashed:  # a crash's detail is the stderr tail shown below
        lines += ["Detail:", "", *_fence(r.detail), ""]
    if crashed:
        lines += _crash_stacks(r)
    lines += _loaded_libraries(r, crashed)
    if r.command:
        lines += ["### Standalone command", "", *_fence(r.command, "sh"), ""]
    tail = rec.stderr_tail.strip()
    if tail and not crashed:
        lines += ["<details><summary>stderr tail</summary>", "", *_fence(tail[-3000:]), "", "</details>", ""]
    return lines


def _cell_table(r: CellRun, want: str | None) -> list[str]:
    rec = r.record
    lines = ["| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in r.cell.axes().items()]
    if want:
        lines.append(f"| catalog says | {want} |")
    lines += [f"| oracle expects | {' or '.join(sorted(rec.expected.outcomes))} |",
              f"| observed | **{r.shown()}** |", f"| oracle verdict | {rec.status} |"]
    return lines


def _crash_stacks(r: CellRun) -> list[str]:
    lines = ["### Python stack (faulthandler)", "", *_fence(_python_stack(r.record.stderr_tail)), "",
             "### Native backtrace of the crashing thread", ""]
    n = r.native
    if n is not None and n.backtrace:
        how = f"{n.tool or 'gdb'} -batch -ex run -ex bt -ex \"info sharedlibrary\" --args <the command below>"
        lines += [f"From `{how}`{_spawned(n)}:", "", *_fence(n.backtrace), ""]
        if n.note:
            lines += [n.note, ""]
    else:
        lines += [f"Not available: {n.note if n else 'the child could not be re-run'}.", ""]
    return lines


def _loaded_libraries(r: CellRun, crashed: bool) -> list[str]:
    maps = _mapped_libraries(r)
    native_libs = r.native.libraries if r.native is not None else ""
    if not maps and not native_libs:
        if not crashed:
            return []
        return ["### Libraries the child had loaded before the call", "",
                "Not captured (the child printed no CUMATRIX-MAPS block and gdb gave no library list).", ""]
    lines = ["### Libraries the child had loaded before the call", ""]
    if maps:
        lines += ["From the child's `/proc/self/maps` right before the variant ran:", "", *_fence("\n".join(maps)), ""]
    if native_libs:
        lines += ["gdb's `info sharedlibrary` at the crash:", "", *_fence(native_libs), ""]
    return lines


def _mapped_libraries(r: CellRun) -> tuple[str, ...]:
    """The libraries the child had mapped: as its record lists them, else from the maps block in
    its stderr, else from the debugger's run."""
    listed = r.record.observed.data.get("loaded_libraries")
    maps = tuple(str(x) for x in listed) if isinstance(listed, list) else ()
    maps = maps or parse_maps(r.record.stderr_tail)
    if not maps and r.native is not None:
        maps = r.native.maps
    return maps


def cell_report(runner: Orchestrator, r: CellRun, matrix_path: str) -> str:
    """The Markdown report of one re-run cell."""
    lines = [f"# cumatrix repro: `{r.cell.id}`", "",
             (f"Cell of `{matrix_path}`, re-run alone; expected {' or '.join(sorted(r.record.expected.outcomes))}, "
              f"observed **{r.shown()}** (oracle verdict: {r.record.status})."), "",
             "## Environment", "", *_env_table(runner, [r]), "", *_cell_section(r, "Cell")]
    refs = sorted(set(re.findall(r"(?:vLLM|SGLang) (?:PR|issue) \d+", r.record.expected.reason)))
    lines += ["## Upstream reference", "", (", ".join(refs) if refs else "none named by the oracle's rule"), ""]
    return "\n".join(lines)


def bug_report(runner: Orchestrator, bug: Bug, bad: CellRun | None, good: CellRun | None, verdict: str,
               why: str, note: str = "", build_logs: dict[str, str] | None = None) -> str:
    """The Markdown report of one catalog entry."""
    lines = [f"# {bug.id}: {verdict}", "", bug.title + ".", "", f"**Verdict: {verdict}.** {why}", ""]
    if note:
        lines += [note, ""]
    lines += ["## Upstream reference", ""]
    lines += [f"- [{ref}]({ref.url})" for ref in bug.refs]
    lines += ["", f"Needs: {bug.needs_text()}.", "", "## Environment", "",
              *_env_table(runner, [r for r in (bad, good) if r is not None]), ""]
    if bad is not None:
        lines += _cell_section(bad, "Bad cell (must show the bug's signature)",
                               f"{bug.bad.outcome}" + (f" with '{bug.bad.detail_contains}'" if bug.bad.detail_contains else ""))
    if good is not None:
        lines += _cell_section(good, "Good cell (the correct pattern, same pairing)", bug.good.outcome)
    for name, log in (build_logs or {}).items():
        lines += [f"## Build: {name}", "", *_fence(log), ""]
    return "\n".join(lines)


def _spawned(n: NativeTrace) -> str:
    """How the debugger's run was spawned, as its result says (evidence, sandbox)."""
    facts = n.spawn or {}
    said = [str(facts["evidence"])] if "evidence" in facts else []
    if "sandbox" in facts:
        said.append(f"sandbox: {facts['sandbox']}")
    return f" ({'; '.join(said)})" if said else ""
