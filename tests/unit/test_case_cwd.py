"""Where a command cell starts in a container: its case's ``cwd:`` whatever its mode (a directory
the containers' user cannot read is then refused by the mount, naming it), else the directory
the run started in, left out where that user could not read it (the image's own then)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute.docker_results import workdir


def _job(cwd: str = "", kind: str = "command") -> Job:
    return Job(cell_id="cu12.9/host/a", kind=kind, argv=("true",), cwd=cwd)


def test_a_cases_cwd_is_the_containers_working_directory_even_where_it_would_be_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    named, started = tmp_path / "named", tmp_path / "started"
    named.mkdir(mode=0o700)
    started.mkdir(mode=0o700)
    monkeypatch.chdir(started)
    assert workdir(_job(str(named)), others_read=True) == (str(named),)
    assert workdir(_job(), others_read=True) == ()  # where the run started: the image's own instead
    assert workdir(_job(), others_read=False) == (str(started),)
    assert workdir(_job(str(named), kind="probe"), others_read=True) == ()  # the harness's own children
