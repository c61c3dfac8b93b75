"""Headlines and exit codes that count what was tested, and one source of truth for them.

A run is PASS only when a cell ran the code under test and met its expectation: a run whose
every cell was skipped says NOTHING TESTED in the first line of every report and exits 5.
The headline, the exit status and every report come from the run's records read once, each
checked against the harness's signature: a cell of an unsandboxed run that rewrites its own
run's ``results.jsonl`` cannot turn it green.

Every command is the real ``cumatrix`` (or ``pytest``) in a subprocess over a real runtime
wheel; the forging cell is a real program the run starts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from cumatrix.host.fingerprint import host_fingerprint

RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"
HAS_GPU = host_fingerprint().get("driver_version") is not None
REPO = Path(__file__).resolve().parents[2]
Cli = Callable[..., subprocess.CompletedProcess[str]]

no_gpu = pytest.mark.skipif(HAS_GPU, reason="with a driver here the probe tests its runtime instead of skipping")


def _headline(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.startswith("cumatrix: ") and " — " in ln]
    assert lines, text
    return lines[-1]


def _first_lines(out: Path) -> tuple[str, str, dict[str, str], dict[str, object]]:
    """The first line of summary.md, the JUnit suite's name, its properties, and results.json."""
    summary = (out / "summary.md").read_text().splitlines()[0]
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    props = {str(p.get("name")): str(p.get("value")) for p in suite.iter("property")}
    doc = json.loads((out / "results.json").read_text())
    return summary, str(suite.get("name")), props, doc


# --------------------------------------------------------------------------- nothing tested


@pytest.mark.network
@no_gpu
def test_a_matrix_whose_only_cell_was_skipped_is_nothing_tested_everywhere_and_exits_5(
        cli: Cli, write_matrix: Callable[..., Path], wheel_cache: Path, tmp_path: Path) -> None:
    # The probe runs (it loads its runtime) and finds no CUDA driver: it tested nothing.
    m = write_matrix(f"runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}\ndrivers: [host]\n")
    out = tmp_path / "o"
    r = cli("run", m, "--out", out, cwd=tmp_path)
    assert r.returncode == 5, r.stdout + r.stderr
    line = _headline(r.stdout)
    assert line.startswith("cumatrix: NOTHING TESTED — 0 of 1 cell tested; 1 skipped (1 skipped:no-cuda-driver: "
                           "no CUDA driver, the GPU cells were not tested); 0 not run"), line
    assert "PASS" not in r.stdout
    assert "--allow-empty" in r.stderr
    summary, _, props, doc = _first_lines(out)
    assert summary == f"**cumatrix: NOTHING TESTED** — {line.split(' — ', 1)[1]}"
    assert props["verdict"] == "NOTHING TESTED"
    assert props["headline"] == line
    assert doc["verdict"] == "NOTHING TESTED"
    assert doc["headline"] == line
    assert doc["counts"]["tested"] == 0
    page = (out / "index.html").read_text()
    assert "NOTHING TESTED" in page.split("</header>", 1)[0]

    js = cli("run", m, "--out", tmp_path / "j", "--json", cwd=tmp_path)
    assert js.returncode == 5
    assert json.loads(js.stdout)["headline"].startswith("cumatrix: NOTHING TESTED — ")
    allowed = cli("run", m, "--out", tmp_path / "a", "--allow-empty", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "NOTHING TESTED" in _headline(allowed.stdout)

    # merge, and the pytest plugin, say the same with the same function.
    merged = cli("merge", out, "--out", tmp_path / "merged", cwd=tmp_path)
    assert merged.returncode == 5, merged.stdout + merged.stderr
    assert _headline(merged.stderr) == line
    assert cli("merge", out, "--out", tmp_path / "merged", "--allow-empty", cwd=tmp_path).returncode == 0
    plugin = subprocess.run([sys.executable, "-m", "pytest", str(m), "--cumatrix-out", str(tmp_path / "p"), "-p",
                             "no:cacheprovider", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            check=False)
    assert _headline(plugin.stdout) == line, plugin.stdout + plugin.stderr


@pytest.mark.network
@no_gpu
def test_the_readme_first_command_says_in_its_first_line_that_the_gpu_cells_were_not_tested(
        cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli("run", "--out", out, "-q", cwd=REPO, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]  # some cells test code here: not empty
    line = _headline(r.stdout)
    assert re.fullmatch(r"cumatrix: PASS — [1-9]\d* of \d+ cells tested: all met expectations; \d+ skipped "
                        r"\(\d+ skipped:no-cuda-driver: no CUDA driver, the GPU cells were not tested(; .*)?\); "
                        r"0 not run", line), line
    summary, _, props, doc = _first_lines(out)
    assert "the GPU cells were not tested" in summary
    assert props["headline"] == doc["headline"] == line
    # The terminal's first line, before any cell runs, says so too (the headline is at the end).
    first = r.stderr.splitlines()[0]
    assert re.fullmatch(r"cumatrix: no CUDA driver on this host: [1-9]\d* of \d+ cells need a GPU and will be "
                        r"skipped, NOT tested; run on a GPU host to test them", first), r.stderr[:2000]


# --------------------------------------------------------------------------- one source of truth

FORGE = r"""
import json, os, sys

out, cell, ctl = sys.argv[1], sys.argv[2], sys.argv[3]
mode = open(ctl).read().split() if os.path.exists(ctl) else ["forge"]
if mode[0] == "pass":  # an honest pass, touching nothing
    sys.exit(0)
path = os.path.join(out, "results.jsonl")
lines = [line for line in open(path) if line.strip()]  # the harness's lines, kept byte for byte
if mode[0] == "replay":  # put back the sealed pass record an earlier run wrote of this cell
    lines += [line for line in open(mode[1]) if json.loads(line).get("id") == cell]
else:  # a pass of one's own making
    lines.append(json.dumps({"schema": 1, "type": "cell", "id": cell, "status": "pass", "mismatch": None,
                             "expected": {"outcomes": ["ok"], "reason": "", "rule": ""},
                             "observed": {"outcome": "ok"}}) + "\n")
lines.append(json.dumps({"schema": 1, "type": "end", "finished": "2026-01-01T00:00:00Z", "interrupted": False}) + "\n")
# A new file renamed over the old: the harness's own appends go to the file it opened.
with open(path + ".new", "w") as f:
    f.write("".join(lines))
os.replace(path + ".new", path)
sys.exit(1)
"""


def _forging_matrix(tmp_path: Path, out: Path, ctl: Path) -> Path:
    script = tmp_path / "forge.py"
    script.write_text(textwrap.dedent(FORGE))
    m = tmp_path / "forge.yaml"
    m.write_text(f"runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}\ndrivers: [host]\n"
                 f"cases:\n  - {{name: first, argv: [true]}}\n"
                 f"  - {{name: forge, argv: [{sys.executable}, {script}, {out}, cu12.9/host/forge, {ctl}]}}\n"
                 f"  - {{name: last, argv: [true]}}\n")
    return m


@pytest.mark.network
def test_a_cell_that_rewrites_its_runs_results_cannot_turn_them_green(
        cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    m = _forging_matrix(tmp_path, out, tmp_path / "no-such-ctl")
    r = cli("run", m, "--out", out, "--no-sandbox", "--no-history", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    line = _headline(r.stdout)
    assert line.startswith("cumatrix: FAIL — "), line
    summary, _, props, doc = _first_lines(out)
    assert summary.startswith("**cumatrix: FAIL**")
    assert props["verdict"] == doc["verdict"] == "FAIL"
    assert props["headline"] == doc["headline"] == line
    cells = {c["id"]: c for c in doc["cells"]}
    forged = cells["cu12.9/host/forge"]
    assert forged["status"] == "fail"
    assert forged["observed"]["outcome"] == "harness-error"
    assert "record edited" in forged["mismatch"]
    assert "no seal" in forged["mismatch"], forged["mismatch"]
    # The cell after the forger: its record went to the file the harness opened, which the
    # forger replaced; it is refused as taken out, never counted as a pass nor lost silently.
    last = cells["cu12.9/host/last"]
    assert last["observed"]["outcome"] == "harness-error"
    assert "taken out" in last["mismatch"]
    # The cell before it passed; where the harness started the forger ahead of its turn (while
    # the first cell's record was still to be written), that record went to the replaced file too
    # and is refused the same way: never lost, never a pass the harness did not seal.
    first = cells["cu12.9/host/first"]
    assert first["status"] == "pass" or "taken out" in (first["mismatch"] or ""), first


@pytest.mark.network
def test_a_sealed_record_of_an_earlier_run_put_back_is_refused(
        cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    ctl = tmp_path / "ctl"
    m = _forging_matrix(tmp_path, out, ctl)
    # An earlier run in which the cell passed honestly: the harness sealed its record of the pass.
    ctl.write_text("pass")
    first = cli("run", m, "--out", tmp_path / "earlier", "--no-sandbox", "--no-history", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    replay = tmp_path / "earlier" / "results.jsonl"
    sealed = [json.loads(ln) for ln in replay.read_text().splitlines() if '"cu12.9/host/forge"' in ln]
    assert sealed
    assert sealed[-1]["status"] == "pass"
    assert "mac" in sealed[-1]
    # Now the cell fails, and puts back the earlier run's sealed pass.
    ctl.write_text(f"replay {replay}")
    r = cli("run", m, "--out", out, "--no-sandbox", "--no-history", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads((out / "results.json").read_text())
    forged = next(c for c in doc["cells"] if c["id"] == "cu12.9/host/forge")
    assert forged["observed"]["outcome"] == "harness-error", forged
    assert "not the record this run wrote" in forged["mismatch"]
    assert doc["verdict"] == "FAIL"
    assert _headline(r.stdout).startswith("cumatrix: FAIL — ")
