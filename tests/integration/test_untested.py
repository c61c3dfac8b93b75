"""``cumatrix untested`` through the real commands: one matrix run by two hosts over several
nights (each night's runs merged by ``cumatrix merge``, which appends to the history and writes
the reports), where one host never runs its emulated driver and one cell always skips; then
the rotation (``--rotate``) and ``cumatrix diff``'s newly untested cells."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from subprocess import CompletedProcess
from xml.etree import ElementTree as ET

import jsonschema

from cumatrix.core.model import Expected, Observed, Timings
from cumatrix.core.planned import Selection
from cumatrix.core.record import CellRecord, axes_from_id
from cumatrix.front.cover import choose
from cumatrix.load import matrix as M
from cumatrix.report import load_records
from cumatrix.report.jsonout import schema
from cumatrix.results.history import History
from cumatrix.results.untested import find

MATRIX = """\
version: 1
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
  cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}
drivers: [host, emulated-12.8]
builds: ["12.8"]
variants: [proc-address, runtime-dispatch]
workloads:
  - {name: kv-4k, direction: d2h, block_bytes: 4096, blocks: 64}
cases:
  - {name: smoke, argv: [true]}
exclude:
  - {driver: emulated-12.8, family: runtime}
hosts:
  h200: {driver: "580.159", label: gpu-h200}
  a100: {driver: "550.163", label: gpu-a100}
"""
ALWAYS_SKIPS = "cu13.0/host/probe"
#: A matrix of 80 cells whose pairs plan is far smaller: a rotation of 3 needs its 3 nights.
ROTATED = """\
version: 1
runtimes:
  cu12.4: {wheel: nvidia-cuda-runtime-cu12==12.4.127}
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
  cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}
drivers: [host]
builds: ["12.8", "13.0"]
variants: [runtime-dispatch, driver-dispatch, header-dispatch, loop]
workloads:
  - {name: kv-a, direction: d2h, block_bytes: 4096, blocks: 64}
  - {name: kv-b, direction: h2d, block_bytes: 4096, blocks: 64}
  - {name: kv-c, direction: d2d, block_bytes: 4096, blocks: 64}
"""

Cli = Callable[..., CompletedProcess[str]]


def _record(cell_id: str, status: str, outcome: str, host: str, started: str) -> CellRecord:
    return CellRecord(id=cell_id, axes=axes_from_id(cell_id), host=host,
                      expected=Expected(outcomes=frozenset({"ok"}), reason="a night", rule="test"),
                      observed=Observed(outcome=outcome, path="n/a" if outcome == "ok" else None,
                                        detail="" if status == "pass" else f"{outcome} tonight",
                                        exit_status=0 if status == "pass" else None),
                      status=status,  # type: ignore[arg-type]
                      timings=Timings(wall_s=0.1), started=started, duration_s=0.1)


def write_host_night(d: Path, m: M.Matrix, host: str, night: int, outcomes: Mapping[str, tuple[str, str]],
                     selection: Selection | None = None) -> Path:
    """``d/results.jsonl`` of ``host``'s run of one night: each cell of ``outcomes`` (status,
    outcome word) with its record, the header and end record a run writes."""
    d.mkdir(parents=True, exist_ok=True)
    started = f"2026-11-{night + 1:02d}T02:00:00Z"
    header = {"schema": 1, "type": "run", "run_id": f"{host}-{night:02d}abcd", "matrix": m.path,
              "matrix_sha256": m.sha256, "started": started, "harness_version": "0.1.0", "argv": [],
              "backend": "local", "host": host, "host_fingerprint": {"hostname": host}, "cells": list(outcomes),
              "cells_total": len(outcomes),
              **({"selection": selection.to_json()} if selection is not None else {})}
    lines = [json.dumps(header)]
    lines += [json.dumps(_record(cid, s, o, host, started).to_store()) for cid, (s, o) in outcomes.items()]
    lines.append(json.dumps({"schema": 1, "type": "end", "finished": started, "interrupted": False}))
    (d / "results.jsonl").write_text("\n".join(lines) + "\n")
    return d


def two_hosts(m: M.Matrix) -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]]:
    """What each host does every night: both run the host driver's cells and skip
    ``ALWAYS_SKIPS``; h200, which the plan gives the emulated driver, never gets it to run
    (cannot-emulate)."""
    cells = M.cells(m)
    h200 = {c.id: (("skip", "skipped:no-cuda-driver") if c.id == ALWAYS_SKIPS else ("pass", "ok"))
            for c in cells if c.driver == "host"}
    a100 = dict(h200)
    h200.update({c.id: ("skip", "cannot-emulate") for c in cells if c.driver == "emulated-12.8"})
    return h200, a100


def test_untested_names_exactly_the_cells_no_host_tested_and_the_reports_show_them(tmp_path: Path, cli: Cli) -> None:
    mfile = tmp_path / "m.yaml"
    mfile.write_text(MATRIX)
    m = M.load(mfile)
    emulated = sorted(c.id for c in M.cells(m) if c.driver == "emulated-12.8")
    assert emulated
    history = tmp_path / "history.sqlite"
    h200, a100 = two_hosts(m)
    for night in range(4):
        dirs = [write_host_night(tmp_path / f"n{night}" / h, m, h, night, outcomes)
                for h, outcomes in (("h200", h200), ("a100", a100))]
        p = cli("merge", *dirs, "--out", tmp_path / f"merged{night}", "--matrix", mfile, "--history", history,
                cwd=tmp_path)
        assert p.returncode == 0, p.stderr

    p = cli("untested", mfile, "--history", history, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["runs"] == 4
    assert sorted(c["cell"] for c in doc["cells"]) == sorted([*emulated, ALWAYS_SKIPS])
    assert [(v["axis"], v["value"], v["cells"], v["tested"]) for v in doc["never_tested_values"]] == \
        [("driver", "emulated-12.8", len(emulated), 0)]
    skip = next(c for c in doc["cells"] if c["cell"] == ALWAYS_SKIPS)
    assert skip["last_tested"] is None
    # what it did since: 2 hosts x 4 nights
    assert skip["since"] == [{"outcome": "skipped:no-cuda-driver", "times": 8}]
    assert next(c for c in doc["cells"] if c["cell"] == emulated[0])["since"] == [{"outcome": "cannot-emulate",
                                                                                  "times": 4}]
    text = cli("untested", mfile, "--history", history, cwd=tmp_path).stdout
    assert f"driver emulated-12.8: 0 of its {len(emulated)} cells tested in the last 4 runs" in text
    assert cli("untested", mfile, "--history", history, "--fail", cwd=tmp_path).returncode == 1

    out = tmp_path / "merged3"
    summary = (out / "summary.md").read_text()
    assert "### Never tested in the last 4 runs" in summary
    assert f"`{ALWAYS_SKIPS}`" in summary
    assert f"**driver emulated-12.8**: 0 of its {len(emulated)} cells tested" in summary
    page = (out / "index.html").read_text()
    assert "<section id=untested><h2>Never tested in the last 4 runs</h2>" in page
    assert ALWAYS_SKIPS in page
    props = {p.get("name"): p.get("value") for p in ET.parse(out / "junit.xml").getroot().iter("property")}
    assert props["never_tested.cells"] == str(len(emulated) + 1)
    assert props["never_tested.value.driver"] == f"emulated-12.8: 0 of {len(emulated)} cells"
    results = json.loads((out / "results.json").read_text())
    assert len(results["never_tested"]["cells"]) == len(emulated) + 1
    jsonschema.Draft202012Validator(schema()).validate(results)

    # The skipping probe is tested one night on one host: it is no longer untested, and the
    # section says when.
    h200[ALWAYS_SKIPS] = ("pass", "ok")
    dirs = [write_host_night(tmp_path / "n4" / h, m, h, 4, o) for h, o in (("h200", h200), ("a100", a100))]
    assert cli("merge", *dirs, "--out", tmp_path / "merged4", "--matrix", mfile, "--history", history,
               cwd=tmp_path).returncode == 0
    doc = json.loads(cli("untested", mfile, "--history", history, "--json", cwd=tmp_path).stdout)
    assert sorted(c["cell"] for c in doc["cells"]) == emulated
    doc = json.loads(cli("untested", mfile, "--history", history, "--json", "--runs", "1", cwd=tmp_path).stdout)
    assert sorted(c["cell"] for c in doc["cells"]) == emulated
    # --days: the runs that started within 1.5 days of the newest (nights 4 and 5)
    doc = json.loads(cli("untested", mfile, "--history", history, "--json", "--days", "1.5", cwd=tmp_path).stdout)
    assert (doc["runs"], doc["first"], doc["last"]) == (2, "2026-11-04T02:00:00Z", "2026-11-05T02:00:00Z")
    assert cli("untested", mfile, "--history", history, "--days", "0", cwd=tmp_path).returncode == 2


def test_cells_no_run_took_are_untested_and_a_bad_window_is_exit_2(tmp_path: Path, cli: Cli) -> None:
    """A covering plan's runs leave cells out: with the matrix named they are untested ("in no
    run of the window"); without it, only the cells the runs hold are looked at."""
    mfile = tmp_path / "m.yaml"
    mfile.write_text(MATRIX.replace("hosts:\n  h200: {driver: \"580.159\", label: gpu-h200}\n"
                                    "  a100: {driver: \"550.163\", label: gpu-a100}\n", ""))
    m = M.load(mfile)
    sel = Selection(strength=2)
    chosen = [c.id for c in choose(m, None, sel)]
    every = [c.id for c in M.cells(m)]
    assert len(chosen) < len(every)
    history = tmp_path / "h.sqlite"
    for night in range(2):
        run = load_records(write_host_night(tmp_path / f"n{night}", m, "ci", night,
                                            dict.fromkeys(chosen, ("pass", "ok")), sel) / "results.jsonl")
        with History.open(history) as hist:
            hist.append(run, kind="run", commit=None)
    doc = json.loads(cli("untested", mfile, "--history", history, "--json", cwd=tmp_path).stdout)
    assert sorted(c["cell"] for c in doc["cells"]) == sorted(set(every) - set(chosen))
    assert all(c["since"] == [] and c["last_tested"] is None for c in doc["cells"])
    doc = json.loads(cli("untested", "--history", history, "--json", cwd=tmp_path).stdout)
    assert doc["cells"] == []
    # the run's record of its selection, and each cell's plan, survive the round trip
    run = load_records(tmp_path / "n1" / "results.jsonl")
    assert run.header.selection == sel
    assert {c.chosen_by for c in run.cells} == {None}  # written by this test without it
    rec = replace(run.cells[0], chosen_by=sel.label())
    assert CellRecord.from_json(rec.to_store()) == rec
    assert CellRecord.from_json(rec.to_store()).chosen_by == "cover 2, seed 0"
    assert cli("untested", "--history", history, "--runs", "0", cwd=tmp_path).returncode == 2
    assert cli("untested", "--history", tmp_path / "none.sqlite", cwd=tmp_path).returncode == 2
    p = cli("untested", tmp_path / "nope.yaml", "--history", history, cwd=tmp_path)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr


def test_a_rotation_is_not_untested_before_its_nights_and_is_after(tmp_path: Path) -> None:
    """Nights of a rotation of 3: after 2 nights the cells the third takes are pending, not
    untested; after the third, every cell was tested; a cell a night took and skipped is untested."""
    mfile = tmp_path / "m.yaml"
    mfile.write_text(ROTATED)
    m = M.load(mfile)
    every = [c.id for c in M.cells(m)]
    history = tmp_path / "h.sqlite"
    nights = [Selection(strength=2, rotate=3, night=n) for n in range(3)]
    plans = [[c.id for c in choose(m, None, s)] for s in nights]
    assert set().union(*plans) == set(every)
    skipped = plans[0][0]
    for n, sel in enumerate(nights):
        outcomes = {c: (("skip", "skipped:no-cuda-driver") if c == skipped else ("pass", "ok")) for c in plans[n]}
        run = load_records(write_host_night(tmp_path / f"n{n}", m, "ci", n, outcomes, sel) / "results.jsonl")
        with History.open(history) as hist:
            hist.append(run, kind="run", commit=None)
            u = find(hist, digest=m.sha256, universe=every)
        if n == 1:
            not_yet = set(every) - set(plans[0]) - set(plans[1])
            assert not_yet
            assert set(u.pending) == not_yet
            assert [c.cell for c in u.cells] == [skipped]  # its night came, and it skipped
            assert all(v.axis != "driver" for v in u.never)
    assert u.pending == ()
    assert u.nights_seen == 3
    assert [c.cell for c in u.cells] == [skipped]


def test_diff_says_when_a_cell_becomes_untested(tmp_path: Path, cli: Cli) -> None:
    mfile = tmp_path / "m.yaml"
    mfile.write_text(MATRIX)
    m = M.load(mfile)
    _, h200 = two_hosts(m)
    history = tmp_path / "h.sqlite"
    target = "cu12.9/host/probe"
    for n in range(3):
        outcomes = dict(h200)
        if n:  # tested on night 0 only
            outcomes[target] = ("skip", "skipped:no-cuda-driver")
        run = load_records(write_host_night(tmp_path / f"n{n}", m, "h200", n, outcomes) / "results.jsonl")
        with History.open(history) as hist:
            hist.append(run, kind="run", commit=None)
    p = cli("diff", "--history", history, "--json", "--window", "2", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["newly_untested"] == [target]
    p = cli("diff", "--history", history, "--json", "--window", "3", cwd=tmp_path)
    assert json.loads(p.stdout)["newly_untested"] == []  # night 0 is still in a window of 3
    text = cli("diff", "--history", history, "--window", "2", cwd=tmp_path).stdout
    assert f"newly untested (1; tested in no run of the last 2 up to #3, on any host):\n  {target}" in text
