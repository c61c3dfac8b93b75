"""`pytest -n 2` of a matrix: cells that provision the same things share a worker."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from cumatrix.front.cli import _plugin_args

pytestmark = pytest.mark.network  # the matrix's runtime comes from a real wheel (cached)

#: Eight drivers of one runtime: eight provisioning groups, enough to group for two workers.
DRIVERS = ["host", *(f"emulated-12.{m}" for m in range(7))]


def _matrix(drivers: list[str]) -> str:
    return ("runtimes:\n  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\n"
            f"drivers: [{', '.join(drivers)}]\nprobe: false\ncases:\n"
            + "".join(f"  - {{name: c{i}, argv: [\"true\"]}}\n" for i in range(3)))


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, cli_env: Any, text: str) -> pytest.RunResult:
    monkeypatch.setenv("PYTHONPATH", cli_env()["PYTHONPATH"])
    monkeypatch.delenv("CI", raising=False)
    m = pytester.path / "matrix.yaml"
    m.write_text(text)
    return pytester.runpytest_subprocess(str(m), *_plugin_args(), "-p", "no:cacheprovider", "-n", "2", "-v",
                                         "--cumatrix-out", str(pytester.path / "out"), timeout=180)


def _workers(res: pytest.RunResult) -> dict[str, str]:
    """Cell id -> the xdist worker that ran it, from pytest-xdist's verbose lines."""
    found = {}
    for line in res.stdout.lines:
        m = re.match(r"\[(gw\d+)\].*(?:PASSED|SKIPPED|FAILED) matrix\.yaml::(\S+)", line)
        if m:
            found[m.group(2)] = m.group(1)
    return found


def test_groups_stay_on_one_worker(pytester: pytest.Pytester, wheel_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                   cli_env: Any) -> None:
    res = _run(pytester, monkeypatch, cli_env, _matrix(DRIVERS))
    assert res.ret == 0, res.stdout.str()
    assert "scheduling tests via CellUnitScheduling" in res.stdout.str()
    ran = _workers(res)
    assert len(ran) == len(DRIVERS) * 3
    for d in DRIVERS:
        assert len({w for cid, w in ran.items() if cid.split("/")[1] == d}) == 1, (d, ran)
    assert len(set(ran.values())) == 2  # and both workers had work


def test_few_groups_use_plain_load(pytester: pytest.Pytester, wheel_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                   cli_env: Any) -> None:
    res = _run(pytester, monkeypatch, cli_env, _matrix(["host"]))
    assert res.ret == 0, res.stdout.str()
    assert "scheduling tests via LoadScheduling" in res.stdout.str()
    assert len(_workers(res)) == 3


#: Kills the xdist worker (not the cell's child: the worker itself) as it starts one cell.
CRASH_CONFTEST = '''
import os

def pytest_runtest_call(item):
    if item.name == "cu12.9/emulated-12.3/c1" and hasattr(item.config, "workerinput"):
        os._exit(3)
'''


def test_a_crashed_worker_costs_no_other_cell(pytester: pytest.Pytester, wheel_cache: Path,
                                              monkeypatch: pytest.MonkeyPatch, cli_env: Any) -> None:
    """Units are handed out whole; when a worker dies mid-unit, xdist reports the cell it was
    running as failed, and every other cell (the rest of that unit too) still runs."""
    (pytester.path / "conftest.py").write_text(CRASH_CONFTEST)
    res = _run(pytester, monkeypatch, cli_env, _matrix(DRIVERS))
    text = res.stdout.str()
    assert "scheduling tests via CellUnitScheduling" in text
    assert re.search(r"worker 'gw\d' crashed while running 'matrix.yaml::cu12.9/emulated-12.3/c1'", text), text
    outcomes = res.parseoutcomes()
    assert outcomes.get("failed") == 1, text
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == len(DRIVERS) * 3 - 1, text
    ran = set(_workers(res)) - {"cu12.9/emulated-12.3/c1"}  # the crash has a FAILED line of its own
    assert len(ran) == len(DRIVERS) * 3 - 1
    stored = [json.loads(line) for line in (pytester.path / "out" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in stored if r["type"] == "cell") == sorted(ran)
