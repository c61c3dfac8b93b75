"""A cell's runtime, provisioned once per run and handed to every stage (real wheels, real cells)."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cumatrix.core.errors import RuntimeNotFound
from cumatrix.core.jobs import Job
from cumatrix.core.model import Cell, Expected, Runtime
from cumatrix.load import matrix as _matrix
from cumatrix.orchestrate import Orchestrator
from cumatrix.provision import runtimes as R
from cumatrix.provision.cell import Provisioner, Settings
from cumatrix.provision.facts import NotRun

if TYPE_CHECKING:
    from cumatrix.load.requirements import WheelPin

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"
LOAD = "import ctypes, os; ctypes.CDLL(os.environ['CUMATRIX_CUDART'])"  # the cell's runtime, mapped


def _orchestrator(tmp_path: Path, requirement: str = CU129, **kw: object) -> tuple[Orchestrator, list[Cell]]:
    m = tmp_path / "m.yaml"
    m.write_text(textwrap.dedent(f"""
        runtimes: {{cu12.9: {{wheel: {requirement}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: one, argv: [{sys.executable}, -c, "{LOAD}"]}}
          - {{name: two, argv: [{sys.executable}, -c, "{LOAD}"]}}
        """).lstrip())
    mx = _matrix.load(m)
    return Orchestrator(matrix=mx, **kw), list(_matrix.cells(mx))  # type: ignore[arg-type]


class _Hooks:
    """A front end's hooks that change nothing (the gate's dynamic stage plugs in its own)."""

    def expected(self, cell: Cell, default: Expected) -> Expected:
        return default

    def before_run(self, cell: Cell, expected: Expected) -> NotRun | None:
        return None

    def job(self, cell: Cell, job: Job) -> Job:
        return job

    def shell_wrapped(self, cell: Cell) -> bool:
        return False


@pytest.mark.network
def test_two_cells_of_one_runtime_provision_it_once_and_every_stage_uses_it(
        tmp_path: Path, wheel_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    provisioned: list[str] = []
    real = R.from_pin

    def counted(name: str, pin: WheelPin, **kw: object) -> R.ResolvedRuntime:
        provisioned.append(name)
        return real(name, pin, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(R, "from_pin", counted)
    orch, cells = _orchestrator(tmp_path)
    try:
        runs = [orch.run(c) for c in cells]
        rt = orch.runtimes.provisioned("cu12.9")
    finally:
        orch.close()
    assert provisioned == ["cu12.9"]  # the second cell found it done
    lib = str(rt.need().libcudart)
    for run in runs:
        assert run.job is not None
        assert ("CUMATRIX_CUDART", lib) in run.job.env  # the job's runtime
        assert run.record.fingerprint["runtime_file"] == lib, run.record.fingerprint
        assert run.record.fingerprint["runtime_version"] == rt.version == 12090


@pytest.mark.network
def test_an_orchestrator_and_its_copy_with_hooks_share_the_runs_runtimes(tmp_path: Path, wheel_cache: Path) -> None:
    first, _ = _orchestrator(tmp_path)
    try:
        resolved = first.provisioner.runtime("cu12.9")  # what the gate's hooks ask before its cells run
        hooked = first.with_hooks(_Hooks())
        try:
            assert hooked.runtimes is first.runtimes
            assert hooked.provisioner.runtime("cu12.9") is resolved  # not resolved a second time
        finally:
            hooked.close()
    finally:
        first.close()


def test_a_runtime_that_cannot_be_provisioned_is_one_kept_failure_and_nothing_is_fetched_before_a_cell_asks(
        tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    orch, cells = _orchestrator(tmp_path, "nvidia-cuda-runtime-cu12==12.9.1", wheel_dir=wheels)
    try:
        orch.provisioner.stopped_before_child(cells[0])  # the run's first line asks this of every cell
        assert orch.runtimes.resolved("cu12.9") is None  # nothing provisioned yet
        got = orch.runtimes.for_cell(cells[0])
        assert got is not None
        assert got is orch.runtimes.for_cell(cells[1])
        assert got.version is None  # the oracle predicts without a version
        with pytest.raises(RuntimeNotFound, match=r"nvidia-cuda-runtime-cu12==12\.9\.1: no matching wheel in "):
            got.need()
        record = orch.run(cells[0]).record
    finally:
        orch.close()
    assert record.observed.outcome == "harness-error", record.observed
    assert "nvidia-cuda-runtime-cu12==12.9.1: no matching wheel in" in record.observed.detail, record.observed


def test_a_pin_made_in_code_that_names_no_wheel_says_so_where_its_runtime_is_needed(tmp_path: Path) -> None:
    orch, cells = _orchestrator(tmp_path)
    bad = dataclasses.replace(orch.matrix, runtimes=(Runtime(name="cu12.9", requirement="nvidia-cuda-runtime-cu12>=12"),))
    prov = Provisioner(settings=Settings(matrix=bad))  # the loader refuses this pin; code may still make it
    for _ in range(2):
        with pytest.raises(ValueError, match=r"not a pinned requirement: 'nvidia-cuda-runtime-cu12>=12'"):
            prov.runtime_version(cells[0])
