"""`cumatrix plan`: one matrix spread over the hosts it names, as a CI strategy matrix."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest

from cumatrix.core.errors import ConfigError
from cumatrix.core.model import CudaVersion
from cumatrix.front import cli
from cumatrix.front.plan import github_matrix, plan
from cumatrix.load import matrix as _matrix
from cumatrix.load.keyword import KeywordExpression
from cumatrix.predict.oracle import cuda_for_driver

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hosts.yaml"
HOSTS = {"h200-580": ("580.159", "gpu-h200"), "a100-550": ("550.163", "gpu-a100"), "l4-570": ("570.86", "gpu-l4")}


def selected(k: str, ids: Iterable[str], parents: tuple[str, ...]) -> set[str]:
    """The ids ``-k k`` selects, matched as ``cumatrix run -k`` matches them (the plugin's
    KeywordExpression, held to pytest's own -k semantics by tests/unit/test_keyword.py):
    each name in the item's chain (the item, its file, the directories above it) is compared
    case-insensitively by substring; a cell item is named by its cell id."""
    expr = KeywordExpression.compile(k)
    return {i for i in ids if expr.matches(i, *parents)}


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "m.yaml"
    p.write_text(text)
    return p


def test_example_is_the_documented_three_host_matrix() -> None:
    m = _matrix.load(EXAMPLE)
    assert {h.name: (h.driver, h.label) for h in m.hosts} == HOSTS
    assert [d.name for d in m.drivers] == ["host", "emulated-12.4", "emulated-12.8"]


def test_github_format_has_one_entry_per_host_with_runner_and_k() -> None:
    include = github_matrix(plan(EXAMPLE))["include"]
    assert sorted(e["host"] for e in include) == sorted(HOSTS)
    for e in include:
        assert {"host", "runner", "k"} <= e.keys()
        assert e["runner"] == HOSTS[e["host"]][1]
        assert isinstance(e["k"], str)
        assert e["k"]
        KeywordExpression.compile(e["k"])  # a valid -k expression


def test_each_emulated_driver_runs_once_on_a_host_able_to_emulate_it() -> None:
    data = plan(EXAMPLE)
    where: dict[str, list[str]] = {}
    for e in data["hosts"]:
        assert "host" in e["drivers"], e  # every real driver is a data point of its own
        for d in e["drivers"]:
            where.setdefault(d, []).append(e["host"])
    for d in ("emulated-12.4", "emulated-12.8"):
        assert len(where[d]) == 1, (d, where[d])
        # An interposer can only hide entry points the real driver has.
        assert cuda_for_driver(HOSTS[where[d][0]][0]) >= CudaVersion.parse(d.removeprefix("emulated-"))


def test_union_of_host_selections_covers_every_cell() -> None:
    ids = [c.id for c in _matrix.cells(_matrix.load(EXAMPLE))]
    include = github_matrix(plan(EXAMPLE))["include"]
    chosen = {e["host"]: selected(e["k"], ids, (EXAMPLE.name, EXAMPLE.parent.name)) for e in include}
    assert set().union(*chosen.values()) == set(ids)
    for i in ids:
        runs_on = [h for h, s in chosen.items() if i in s]
        if "/host/" in i:
            assert sorted(runs_on) == sorted(HOSTS), i
        else:
            assert len(runs_on) == 1, (i, runs_on)
    data = plan(EXAMPLE)
    assert data["cells_total"] == len(ids)
    assert {e["host"]: e["cells"] for e in data["hosts"]} == {h: len(s) for h, s in chosen.items()}


def test_k_does_not_match_the_matrix_file_name() -> None:
    # pytest matches -k against the file's name too: "hosts.yaml" must not select every cell.
    ids = [c.id for c in _matrix.cells(_matrix.load(EXAMPLE))]
    for e in github_matrix(plan(EXAMPLE))["include"]:
        assert selected(e["k"], ids, ("hosts.yaml", "host", "examples")) == selected(e["k"], ids, ())


BASE = """\
version: 1
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
"""


def test_a_host_that_runs_no_cell_is_an_error_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, BASE + """\
drivers: [emulated-12.8]
hosts:
  h200-580: {driver: "580.159", label: gpu-h200}
  l4-570: {driver: "570.86", label: gpu-l4}
""")
    with pytest.raises(ConfigError, match="h200-580") as info:
        plan(path)
    assert "l4-570" not in str(info.value)
    assert cli.main(["plan", str(path)]) == 2
    assert "h200-580" in capsys.readouterr().err


def test_no_hosts_section_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, BASE + "drivers: [host]\n")
    with pytest.raises(ConfigError, match="hosts"):
        plan(path)
    assert cli.main(["plan", str(path), "--format", "github"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:1:1:" in err
    assert "Traceback" not in err


def test_no_host_able_to_emulate_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, BASE + """\
drivers: [host, emulated-13.0]
hosts:
  a100-550: {driver: "550.163", label: gpu-a100}
""")
    with pytest.raises(ConfigError, match=r"emulated-13\.0"):
        plan(path)


def test_cli_github_format_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", str(EXAMPLE), "--format", "github"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one line, fit for `echo "matrix=..." >> $GITHUB_OUTPUT`
    assert json.loads(out) == github_matrix(plan(EXAMPLE))


def test_planned_cells_round_trip_through_a_run_header() -> None:
    from cumatrix.core.planned import PlannedCells, planned_from_json

    p = PlannedCells(matrix_sha256="ab" * 32, hosts=(("drv550", ("x/host/a", "x/emulated-12.4/a")), ("drv580", ("x/host/a",))))
    back = planned_from_json(json.loads(json.dumps(p.to_json())))
    assert back == p
    assert back.host_names == ("drv550", "drv580")
    assert back.for_host("drv580") == ("x/host/a",)
    assert back.for_host("nope") is None
    anyhost = PlannedCells(matrix_sha256="cd" * 32, hosts=((None, ("x/host/a",)),))
    assert planned_from_json(anyhost.to_json()) == anyhost
    assert anyhost.host_names == ()
    # A header from another writer whose plan is not of this shape is read as having none.
    for bad in (None, [], {"hosts": []}, {"matrix_sha256": "x", "hosts": [{"host": 3, "cells": []}]},
                {"matrix_sha256": "x", "hosts": [{"host": "a", "cells": [1]}]}):
        assert planned_from_json(bad) is None
