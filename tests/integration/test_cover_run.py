"""``cumatrix run --cover 2`` on the default matrix runs the covering cells only (each record
naming the plan that chose it); ``pytest matrix.yaml --cumatrix-cover 2`` the same; the runs of
two hosts of a covering plan merge complete; every plan format carries the selection."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import jsonschema
import pytest

from cumatrix.core.planned import Selection
from cumatrix.front.cover import buildable, cell_row, choose, missing
from cumatrix.load import matrix as M
from cumatrix.report.jsonout import schema

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "matrix.yaml"

Cli = Callable[..., CompletedProcess[str]]


def _lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def _no_gpu(cli: Cli) -> None:
    if json.loads(cli("doctor", "--json").stdout).get("driver_version"):
        pytest.skip("this host has an NVIDIA driver: the GPU cells run for real (tests/gpu covers that)")


@pytest.mark.network  # the cells provision the default matrix's runtime wheels (cached after the first)
def test_run_cover_2_runs_the_covering_cells_only(tmp_path: Path, wheel_cache: Path, cli: Cli) -> None:
    _no_gpu(cli)
    m = M.load(DEFAULT)
    plan = choose(m, None, Selection(strength=2))
    p = cli("run", DEFAULT, "--cover", "2", "--out", tmp_path / "out", "-n", "2", "-q", "--no-history",
            cwd=REPO, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    lines = _lines(tmp_path / "out")
    header = next(r for r in lines if r["type"] == "run")
    cells = [r for r in lines if r["type"] == "cell"]
    assert sorted(r["id"] for r in cells) == sorted(c.id for c in plan)
    assert len(cells) < len(M.cells(m)) // 5
    assert {r["chosen_by"] for r in cells} == {"cover 2, seed 0"}
    assert header["selection"]["cover"] == 2
    assert header["cells"] == [c.id for c in plan]
    # the cells that ran hold every pair of axis values of the matrix's cells that can be built
    ran = {r["id"] for r in cells}
    pool = [c for c in M.cells(m) if buildable(c)]
    assert not missing([cell_row(c) for c in pool], [i for i, c in enumerate(pool) if c.id in ran], 2)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["runs"][0]["selection"]["label"] == "cover 2, seed 0"
    assert all(c["chosen_by"] == "cover 2, seed 0" for c in results["cells"])
    jsonschema.Draft202012Validator(schema()).validate(results)
    assert "cells chosen by cover 2, seed 0" in (tmp_path / "out" / "summary.md").read_text()
    assert '<property name="selection" value="cover 2, seed 0"' in (tmp_path / "out" / "junit.xml").read_text()


@pytest.mark.network
def test_the_plugin_takes_the_same_cells(tmp_path: Path, wheel_cache: Path, cli_env: Any) -> None:
    m = M.load(DEFAULT)
    plan = choose(m, None, Selection(strength=2, seed=3))
    p = subprocess.run([sys.executable, "-m", "pytest", str(DEFAULT), "-p", "no:cacheprovider", "-q",
                        "--cumatrix-out", str(tmp_path / "out"), "--cumatrix-cover", "2", "--cumatrix-seed", "3",
                        "--collect-only"], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300,
                       check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    collected = [line.split("::", 1)[1] for line in p.stdout.splitlines() if "::" in line]
    assert sorted(collected) == sorted(c.id for c in plan)
    bad = subprocess.run([sys.executable, "-m", "pytest", str(DEFAULT), "-p", "no:cacheprovider", "-q",
                          "--cumatrix-rotate", "3"], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                         timeout=300, check=False)
    assert bad.returncode == 4
    assert "--rotate 3 needs --night" in bad.stderr


@pytest.mark.network
def test_two_hosts_of_a_covering_plan_merge_complete(tmp_path: Path, wheel_cache: Path, cli: Cli) -> None:
    """Each host runs its share of the plan (``--host``); the merge (held against the matrix)
    expects the plan's cells, not every cell of the matrix."""
    _no_gpu(cli)
    m = M.load(DEFAULT)
    plan = {c.id for c in choose(m, None, Selection(strength=2))}
    dirs = []
    for host in ("h200-580", "a100-550"):
        out = tmp_path / host
        p = cli("run", DEFAULT, "--cover", "2", "--host", host, "-k", "probe or import", "--out", out, "-q",
                "--no-history", cwd=REPO, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        dirs.append(out)
    # -k took a part of each share: the merge names the rest as not run, and only cells of the plan
    p = cli("merge", *dirs, "--out", tmp_path / "merged", "--matrix", DEFAULT, "--no-history", cwd=REPO)
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert {n["id"] for n in merged["not_run"]} <= plan
    assert {n["id"] for n in merged["not_run"]}  # the swap cells of the plan -k left out
    assert p.returncode == 1


def test_every_plan_format_carries_the_selection(tmp_path: Path, cli: Cli) -> None:
    hosts = REPO / "examples" / "hosts.yaml"
    if not hosts.is_file():
        pytest.skip("no examples/hosts.yaml")
    m = M.load(hosts)
    n = len(choose(m, None, Selection(strength=2, seed=5, rotate=4, night=9)))
    gh = json.loads(cli("plan", hosts, "--cover", "2", "--seed", "5", "--rotate", "4", "--night", "9").stdout)
    assert {e["args"] for e in gh["include"]} == {"--cover 2 --seed 5 --rotate 4 --night 9"}
    js = json.loads(cli("plan", hosts, "--format", "json", "--cover", "2", "--seed", "5", "--rotate", "4",
                        "--night", "9").stdout)
    assert js["cells_total"] == n < js["cells_in_matrix"]
    assert js["selection"]["slot"] == 1
    p = cli("plan", hosts, "--format", "slurm", "--out", tmp_path / "s", "--cover", "3")
    if p.returncode == 0:
        script = (tmp_path / "s" / "slurm").glob("*.sh")
        assert any("--cover 3 --seed 0" in f.read_text() for f in script)
    p = cli("plan", hosts, "--format", "k8s", "--out", tmp_path / "k", "--cover", "2")
    assert p.returncode == 0, p.stderr
    assert "--cover" in Path(p.stdout.splitlines()[0]).read_text()
    assert cli("plan", hosts, "--cover", "two").returncode == 2
    assert cli("plan", hosts, "--night", "2").returncode == 2
