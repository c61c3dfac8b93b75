"""Provisioning and the gate give facts; the oracle and the judge alone name outcomes; each of
NVIDIA's rules is written once and every stage that needs it asks the same function."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import get_args

import pytest

from cumatrix.core.model import OUTCOME_RE, Cell, CudaVersion
from cumatrix.judge.classify import harness_error, not_run
from cumatrix.load.matrix import load
from cumatrix.predict import oracle
from cumatrix.predict.rules import emulation_newer_than_host, interposer_detected, major_newer_than_driver
from cumatrix.provision.cell import Provisioner, Settings
from cumatrix.provision.facts import NotRun, NotRunWhy

#: The outcome words each fact has always been recorded as (the outcome names are a contract).
CONTRACT = {
    "needs-docker": "skipped:needs-docker", "no-driver": "skipped:no-cuda-driver", "no-compiler": "skipped:no-compiler",
    "build-failed": "build-error",
    "emulation-impossible": "harness-error", "install-failed": "exit:1",
    "wheel-not-for-this-python": "skipped:wheel-not-for-this-python",
    "unsupported-pairing": "skipped:unsupported-pairing", "harness-failed": "harness-error",
}


def test_every_fact_has_its_outcome_word() -> None:
    assert set(get_args(NotRunWhy)) == set(CONTRACT)
    for why, word in CONTRACT.items():
        got = not_run(NotRun(why=why, detail="d"))
        assert OUTCOME_RE.match(got.outcome)
        assert (got.outcome, got.detail) == (word, "d")


def test_a_failed_install_is_the_installers_exit_status() -> None:
    got = not_run(NotRun(why="install-failed", exit_status=2, detail="pip said no"))
    assert (got.outcome, got.exit_status) == ("exit:2", 2)
    assert harness_error("boom").outcome == "harness-error"


MATRIX = """
version: 1
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
  img: {image: "nvidia/cuda:12.9.1-base-ubuntu24.04"}
drivers: [host, emulated-13.0]
"""


@pytest.fixture
def provisioner(write_matrix: Callable[..., Path]) -> Callable[[int | None], Provisioner]:
    m = load(write_matrix(MATRIX))
    return lambda host: Provisioner(settings=Settings(matrix=m), host_driver=host)


def test_provisioning_gives_facts_not_outcomes(provisioner: Callable[[int | None], Provisioner]) -> None:
    image = provisioner(13000).prepare(Cell(kind="probe", runtime="img", driver="host"))
    assert isinstance(image, NotRun)
    assert image.why == "needs-docker"
    no_driver = provisioner(None).prepare(Cell(kind="probe", runtime="cu12.9", driver="emulated-13.0"))
    assert isinstance(no_driver, NotRun)
    assert no_driver.why == "no-driver"
    # An emulated driver newer than the real one: the fact, and the oracle's reason for it.
    newer = provisioner(12040).prepare(Cell(kind="probe", runtime="cu12.9", driver="emulated-13.0"))
    assert newer == NotRun(why="emulation-impossible", detail=oracle.emulate_newer_reason(13000, 12040))
    cell = Cell(kind="probe", runtime="cu12.9", driver="emulated-13.0")
    predicted = oracle.expect(cell, oracle.HostFacts(driver_version=12040), runtime_version=12090)
    assert (predicted.outcomes, predicted.reason) == ({not_run(newer).outcome}, newer.detail)


VERSIONS = [11080, 12000, 12040, 12090, 13000, 13020]


@pytest.mark.parametrize("runtime", VERSIONS)
@pytest.mark.parametrize("driver", VERSIONS)
def test_the_oracle_and_the_gate_ask_one_driver_major_rule(runtime: int, driver: int) -> None:
    cell = Cell(kind="probe", runtime="rt", driver="host")
    host = oracle.HostFacts(driver_version=driver)
    refused = major_newer_than_driver(runtime, driver)
    assert refused == (runtime // 1000 > driver // 1000)
    assert (oracle.expect(cell, host, runtime_version=runtime).rule == "major-newer-than-driver") == refused
    assert (oracle.unsupported_pairing(cell, host, runtime) is not None) == refused
    gate = oracle.expect_gate_cell(cell, host, runtime_version=runtime, smoke=False)
    assert gate.outcomes == ({"skipped:unsupported-pairing"} if refused else {"ok"})


def test_emulation_rules() -> None:
    assert emulation_newer_than_host(13000, 12090)
    assert not emulation_newer_than_host(12040, 12090)
    v = int(CudaVersion(12, 4))
    assert interposer_detected(12090, v, 13000)  # a CUDA 12 runtime sees the interposer
    assert not interposer_detected(13000, v, 13000)  # a CUDA 13 runtime does not
    assert not interposer_detected(12090, 13000, 13000)  # nothing to see where the versions agree
