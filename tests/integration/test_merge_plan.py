"""A merge completes the picture: every planned cell that its host did not run is reported as
not-run with that host, and a merge missing a host (or part of one) is not a pass.

Real runs of a matrix of command cases (one runtime wheel; no GPU needed), merged by the real
command line.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cumatrix.report.jsonout import schema

pytestmark = pytest.mark.network

PLANNED = """
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host, emulated-12.4]
probe: false
cases: [{name: first, argv: [true]}, {name: second, argv: [true]}, {name: third, argv: [true]}]
hosts:
  drv580: {driver: "580.159"}
  drv550: {driver: "550.163"}
"""

HOST_CELLS = ["cu12.9/host/first", "cu12.9/host/second", "cu12.9/host/third"]
EMULATED_CELLS = ["cu12.9/emulated-12.4/first", "cu12.9/emulated-12.4/second", "cu12.9/emulated-12.4/third"]


@pytest.fixture
def planned(tmp_path: Path) -> Path:
    m = tmp_path / "nightly.yaml"
    m.write_text(PLANNED)
    return m


def _doc(d: Path) -> dict[str, Any]:
    """results.json of a run or a merge, valid against the shipped schema."""
    doc: dict[str, Any] = json.loads((d / "results.json").read_text())
    jsonschema.Draft202012Validator(schema()).validate(doc)
    return doc


def test_run_as_a_host_takes_the_plans_share_and_records_the_plan(planned: Path, tmp_path: Path, wheel_cache: Path,
                                                                   cli: Callable[..., Any]) -> None:
    for host, share in (("drv580", HOST_CELLS), ("drv550", HOST_CELLS + EMULATED_CELLS)):
        proc = cli("run", planned, "--host", host, "--out", tmp_path / host, "-q", cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        header = json.loads((tmp_path / host / "results.jsonl").read_text().splitlines()[0])
        assert header["host"] == host
        assert sorted(header["cells"]) == sorted(share)
        plan = {e["host"]: e["cells"] for e in header["plan"]["hosts"]}
        assert header["plan"]["matrix_sha256"] == header["matrix_sha256"]
        assert plan == {"drv580": HOST_CELLS, "drv550": HOST_CELLS + EMULATED_CELLS}
        assert {c["id"] for c in _doc(tmp_path / host)["cells"]} == set(share)
    proc = cli("merge", tmp_path / "drv580", tmp_path / "drv550", "--out", tmp_path / "merged", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = _doc(tmp_path / "merged")
    assert doc["not_run"] == []
    assert doc["missing_hosts"] == []
    assert doc["verdict"] == "PASS"  # the host cells (commands) are tested on both hosts
    assert len(doc["cells"]) == 9  # host cells on both hosts, emulated cells on drv550


def test_run_as_a_host_the_plan_does_not_name_is_exit_2(planned: Path, tmp_path: Path, cli: Callable[..., Any]) -> None:
    proc = cli("run", planned, "--host", "drv999", "--out", tmp_path / "o", cwd=tmp_path)
    assert proc.returncode == 2
    assert "drv550, drv580" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_merge_with_a_host_missing_and_a_host_incomplete_fails_naming_both(
        planned: Path, tmp_path: Path, wheel_cache: Path, cli: Callable[..., Any]) -> None:
    # drv580 ran only part of its share (-k narrows --host); drv550 never ran.  (-k also matches
    # the matrix's file name: the case names share no word with it.)  This is the case
    # that read as a PASS of the cells that happened to run.
    proc = cli("run", planned, "--host", "drv580", "-k", "first", "--out", tmp_path / "drv580", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = cli("merge", tmp_path / "drv580", "--out", tmp_path / "merged", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "host drv550 never ran its 6 planned cells" in proc.stderr
    assert "host drv580 did not run 2 of its 3 planned cells" in proc.stderr
    doc = _doc(tmp_path / "merged")
    assert doc["verdict"] == "INCOMPLETE"
    assert doc["missing_hosts"] == ["drv550"]
    expected = ({("cu12.9/host/second", "drv580"), ("cu12.9/host/third", "drv580")}
                | {(cid, "drv550") for cid in HOST_CELLS + EMULATED_CELLS})
    assert {(e["id"], e["host"]) for e in doc["not_run"]} == expected
    assert {e["outcome"] for e in doc["not_run"]} == {"not-run"}
    assert doc["counts"]["not_run"] == len(expected) == 8
    # Every report shows them, with the host that should have run each.
    skipped = [tc for tc in ET.parse(tmp_path / "merged" / "junit.xml").getroot().iter("testcase")
               if (s := tc.find("skipped")) is not None and "did not run it" in (s.get("message") or "")]
    assert {(tc.get("name"), tc.get("classname", "").split(".")[1]) for tc in skipped} == expected
    md = (tmp_path / "merged" / "summary.md").read_text()
    assert "**cumatrix: INCOMPLETE**" in md
    assert "no run from drv550" in md
    assert md.count("should have run it") == 8
    html = (tmp_path / "merged" / "index.html").read_text()
    assert "no run from" in html
    assert "drv550" in html
    assert "cu12.9/emulated-12.4/third" in html


def test_merge_matrix_completes_runs_that_recorded_no_plan(planned: Path, tmp_path: Path, wheel_cache: Path,
                                                           cli: Callable[..., Any]) -> None:
    # Runs written before runs recorded their plan: -k shares of the hosts, no "plan" in the header.
    for host, k in (("drv580", "host and first"), ("drv550", "emulated")):
        proc = cli("run", planned, "--host", host, "-k", k, "--out", tmp_path / host, "-q", cwd=tmp_path)
        # Without a GPU every emulated-driver cell is skipped: a run where no cell ran exits 5.
        assert proc.returncode == (5 if host == "drv550" else 0), proc.stderr
        jsonl = tmp_path / host / "results.jsonl"
        lines = jsonl.read_text().splitlines()
        header = json.loads(lines[0])
        del header["plan"]
        jsonl.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    dirs = [tmp_path / "drv580", tmp_path / "drv550"]
    # Without the matrix, only what the runs' headers list is expected (the old reading).
    assert cli("merge", *dirs, "--out", tmp_path / "m1", cwd=tmp_path).returncode == 0
    assert _doc(tmp_path / "m1")["not_run"] == []
    proc = cli("merge", *dirs, "--out", tmp_path / "m2", "--matrix", planned, cwd=tmp_path)
    assert proc.returncode == 1
    doc = _doc(tmp_path / "m2")
    assert {(e["id"], e["host"]) for e in doc["not_run"]} == {
        ("cu12.9/host/second", "drv580"), ("cu12.9/host/third", "drv580"), *((cid, "drv550") for cid in HOST_CELLS)}
    assert "host drv550 did not run 3 of its 6 planned cells" in proc.stderr


def test_merge_matrix_without_hosts_expects_every_cell_from_any_host(tmp_path: Path, wheel_cache: Path,
                                                                     cli: Callable[..., Any]) -> None:
    m = tmp_path / "plain.yaml"
    m.write_text(PLANNED.split("hosts:", maxsplit=1)[0])
    for host, k in (("one", "host and first"), ("two", "host and second")):
        proc = cli("run", m, "--host", host, "-k", k, "--out", tmp_path / host, "-q", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    proc = cli("merge", tmp_path / "one", tmp_path / "two", "--out", tmp_path / "merged", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr  # the recorded plan: every cell, by any host
    doc = _doc(tmp_path / "merged")
    assert {(e["id"], e["host"]) for e in doc["not_run"]} == {("cu12.9/host/third", None),
                                                              *((cid, None) for cid in EMULATED_CELLS)}
    assert "no host ran them" in proc.stderr


def test_merge_matrix_of_another_matrix_is_exit_2(planned: Path, tmp_path: Path, wheel_cache: Path,
                                                  cli: Callable[..., Any]) -> None:
    proc = cli("run", planned, "--host", "drv580", "--out", tmp_path / "drv580", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    other = tmp_path / "other.yaml"
    other.write_text(PLANNED.replace("name: third", "name: fourth"))
    proc = cli("merge", tmp_path / "drv580", "--out", tmp_path / "merged", "--matrix", other, cwd=tmp_path)
    assert proc.returncode == 2
    assert "name the matrix file these runs ran" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_host_partition_and_constraint_are_checked(tmp_path: Path, cli: Callable[..., Any]) -> None:
    m = tmp_path / "bad.yaml"
    m.write_text(PLANNED.replace('drv550: {driver: "550.163"}', 'drv550: {driver: "550.163", partition: "gpu a"}'))
    proc = cli("validate", m)
    assert proc.returncode == 2
    assert f"{m}:9:" in proc.stderr
    assert "partition" in proc.stderr
    good = tmp_path / "good.yaml"
    good.write_text(PLANNED.replace('drv550: {driver: "550.163"}',
                                    'drv550: {driver: "550.163", partition: gpu-old, constraint: "a100&nvlink"}'))
    proc = cli("plan", good, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    by = {e["host"]: e for e in json.loads(proc.stdout)["hosts"]}
    assert by["drv550"]["partition"] == "gpu-old"
    assert by["drv550"]["constraint"] == "a100&nvlink"
    assert "partition" not in by["drv580"]


def test_report_of_a_host_run_cut_short_lists_its_unrun_cells_with_the_host(
        planned: Path, tmp_path: Path, wheel_cache: Path, cli: Callable[..., Any]) -> None:
    out = tmp_path / "drv580"
    assert cli("run", planned, "--host", "drv580", "--out", out, "-q", cwd=tmp_path).returncode == 0
    jsonl = out / "results.jsonl"
    lines = jsonl.read_text().splitlines()
    jsonl.write_text("\n".join(lines[:2]) + "\n")  # killed after its first cell: no end record
    proc = cli("report", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = _doc(out)
    ran = {c["id"] for c in doc["cells"]}
    assert len(ran) == 1
    assert {(e["id"], e["host"], e["outcome"]) for e in doc["not_run"]} == {
        (cid, "drv580", "not-run") for cid in HOST_CELLS if cid not in ran}


def test_a_host_stopped_before_its_run_began_counts_as_not_run(planned: Path, tmp_path: Path, wheel_cache: Path,
                                                               cli: Callable[..., Any]) -> None:
    # A scheduler's task cancelled as it started leaves --out with an empty results.jsonl.
    assert cli("run", planned, "--host", "drv580", "--out", tmp_path / "drv580", "-q", cwd=tmp_path).returncode == 0
    (tmp_path / "drv550").mkdir()
    (tmp_path / "drv550" / "results.jsonl").write_text("")
    proc = cli("merge", tmp_path / "drv580", tmp_path / "drv550", "--out", tmp_path / "merged", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "drv550/results.jsonl is empty" in proc.stderr
    assert "host drv550 never ran its 6 planned cells" in proc.stderr
    assert _doc(tmp_path / "merged")["missing_hosts"] == ["drv550"]
    proc = cli("merge", tmp_path / "drv550", "--out", tmp_path / "none", cwd=tmp_path)
    assert proc.returncode == 1
    assert "every results.jsonl given is empty" in proc.stderr
