"""The collector is paused for a run's start-up only: every process of a run runs its cells (an
xdist worker) or takes their reports (the controller) with cyclic garbage collection on."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cumatrix.load import gcpause

pytestmark = pytest.mark.network  # the matrix's runtime comes from a real wheel (cached)

RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"

# `cumatrix run` in a process that notes, as each cell runs, whether the collector of the
# process running it is on and how much start-up froze (pytest's -p loads the note-taker in
# the controller and in every xdist worker).
NOTER = textwrap.dedent("""
    import gc, json, os
    from cumatrix.orchestrate import Orchestrator
    _run = Orchestrator.run
    def run(self, cell, **kw):
        with open(os.environ["GC_NOTES"], "a") as f:
            f.write(json.dumps([os.environ.get("PYTEST_XDIST_WORKER"), gc.isenabled(), gc.get_freeze_count()]) + "\\n")
        return _run(self, cell, **kw)
    Orchestrator.run = run
    def pytest_runtest_logreport(report):  # where the reports arrive (the controller, under -n)
        if report.when == "call" and not os.environ.get("PYTEST_XDIST_WORKER"):
            with open(os.environ["GC_NOTES"], "a") as f:
                f.write(json.dumps(["report", gc.isenabled(), gc.get_freeze_count()]) + "\\n")
""")


@pytest.mark.parametrize("workers", [None, "2"])
def test_cells_run_with_the_collector_on(tmp_path: Path, wheel_cache: Path, cli_env: Any,
                                         workers: str | None) -> None:
    (tmp_path / "gcnoter.py").write_text(NOTER)
    m = tmp_path / "m.yaml"
    m.write_text(f"runtimes:\n  cu12.9: {{wheel: {RUNTIME}}}\ndrivers: [host]\nprobe: false\ncases:\n"
                 + "".join(f"  - {{name: c{i}, argv: [true]}}\n" for i in range(6)))
    notes = tmp_path / "notes.jsonl"
    env = cli_env({"GC_NOTES": str(notes), "PYTHONPATH": f"{tmp_path}:{cli_env()['PYTHONPATH']}",
                   "PYTEST_ADDOPTS": "-p gcnoter"})
    argv = [sys.executable, "-m", "cumatrix", "run", str(m), "-q", "--out", str(tmp_path / "out"),
            *(["-n", workers] if workers else [])]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    notes_ = [json.loads(line) for line in notes.read_text().splitlines()]
    seen = [n for n in notes_ if n[0] != "report"]
    reported = [n for n in notes_ if n[0] == "report"]
    assert len(seen) == 6
    assert len(reported) == 6
    assert all(enabled for _, enabled, _ in notes_), notes_  # cells run, and reports arrive, with it on
    assert all(frozen > 0 for _, _, frozen in seen), seen  # start-up's objects, never walked again
    assert all(bool(worker) == bool(workers) for worker, _, _ in seen), seen  # where the cells ran


def test_paused_restores_what_it_found() -> None:
    was = gc.isenabled()
    try:
        gc.enable()
        with gcpause.paused():
            assert not gc.isenabled()
        assert gc.isenabled()
        gc.disable()
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a collector the caller turned off stays off
        gcpause.release()  # nothing held: nothing to undo
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
