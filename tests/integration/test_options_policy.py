"""The sandbox policy travels in a run's options to every process that runs cells, and
nowhere else: no setting outlives the session that was given it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute.local import run_local
from cumatrix.execute.sandbox import SANDBOXED
from helpers.sandbox import require_bwrap

pytestmark = pytest.mark.network  # the matrix's runtime comes from a real wheel (cached)

MATRIX = ("runtimes:\n  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\ndrivers: [host]\nprobe: false\ncases:\n"
          + "".join(f"  - {{name: c{i}, argv: [\"true\"]}}\n" for i in range(4)))


def _sandboxes(out: Path) -> dict[str, object]:
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return {r["id"]: r["fingerprint"].get("sandbox") for r in recs if r["type"] == "cell"}


def test_sandbox_reaches_every_xdist_worker(tmp_path: Path, cli: Any, wheel_cache: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    require_bwrap()
    monkeypatch.delenv("CUMATRIX_SANDBOX", raising=False)
    (tmp_path / "m.yaml").write_text(MATRIX)
    # The default (sandboxed) and --no-sandbox, each in every worker.
    proc = cli("run", tmp_path / "m.yaml", "--out", tmp_path / "on", "-n", "2", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert set(_sandboxes(tmp_path / "on").values()) <= set(SANDBOXED)
    proc = cli("run", tmp_path / "m.yaml", "--out", tmp_path / "off", "-n", "2", "--no-sandbox", cwd=tmp_path,
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert set(_sandboxes(tmp_path / "off").values()) == {None}


def test_a_session_leaves_no_policy_behind(pytester: pytest.Pytester, wheel_cache: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandboxed pytest session run inside this process; a job run after it, with no policy
    of its own, is not sandboxed (the policy was the session's, not the process's)."""
    require_bwrap()
    monkeypatch.delenv("CUMATRIX_SANDBOX", raising=False)
    (pytester.path / "matrix.yaml").write_text(MATRIX)
    out = pytester.path / "out"
    res = pytester.runpytest_inprocess(str(pytester.path / "matrix.yaml"), "-p", "no:cacheprovider",
                                       "--cumatrix-out", str(out), "--cumatrix-sandbox", "on")
    res.assert_outcomes(passed=4)
    assert set(_sandboxes(out).values()) <= set(SANDBOXED)
    after = run_local(Job(cell_id="after", kind="command", argv=("true",), timeout=30))
    assert after.returncode == 0, after.stderr_tail
    assert "sandbox" not in after.extra, after.extra


def test_a_session_leaves_the_environment_as_it_found_it(pytester: pytest.Pytester, wheel_cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``--cumatrix-wheel-dir`` is the session's: the plugin does not export it into this
    process's environment, where whatever runs next would take its wheels from there."""
    monkeypatch.delenv("CUMATRIX_WHEEL_DIR", raising=False)
    (pytester.path / "matrix.yaml").write_text(MATRIX)
    first = pytester.runpytest_inprocess(str(pytester.path / "matrix.yaml"), "-p", "no:cacheprovider",
                                         "--cumatrix-out", str(pytester.path / "fetch"))
    first.assert_outcomes(passed=4)  # the runtime wheel is in the cache now: offline from here
    before = dict(os.environ)
    res = pytester.runpytest_inprocess(str(pytester.path / "matrix.yaml"), "-p", "no:cacheprovider",
                                       "--cumatrix-out", str(pytester.path / "out"),
                                       "--cumatrix-wheel-dir", str(wheel_cache / "wheels"))
    res.assert_outcomes(passed=4)
    assert "CUMATRIX_WHEEL_DIR" not in os.environ
    assert {k: v for k, v in os.environ.items() if k.startswith("CUMATRIX_")} == \
        {k: v for k, v in before.items() if k.startswith("CUMATRIX_")}
