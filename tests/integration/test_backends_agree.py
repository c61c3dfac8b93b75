"""One matrix, two backends, the same outcomes cell by cell (real dockerd, the base image from
containers/build-base.sh).  The run starts in another directory than the matrix file's, and a
case reads the project's directory (the file's) on both: a module imported from beside the
matrix, a data file by a relative path; and cannot write there on either.  A
case that names another directory (``cwd:``, read from the matrix file's directory) starts
there on both, reads from it, and cannot write to it either.  The
interpreter is named by path: a bare ``python3`` is what each side's PATH finds (docs/tutorial.md).  Skipped where no daemon answers,
unless ``CUMATRIX_REQUIRE_DOCKER=1``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.network]

MATRIX = """\
version: 1
runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}
drivers: [host]
cases:
  - {name: imports-the-project, argv: [/usr/bin/python3, -c, "import projmod; print(projmod.ANSWER)"],
     env: {PYTHONPATH: .}}
  - {name: reads-a-relative-path, argv: [cat, data/input.txt]}
  - {name: exits-3, argv: [sh, -c, "exit 3"]}
  - {name: writes-beside-the-matrix, argv: [sh, -c, "echo x > written-by-the-cell && cat written-by-the-cell"]}
  - {name: imports-from-its-cwd, cwd: ../other, env: {PYTHONPATH: .},
     argv: [/usr/bin/python3, -c, "import othermod, os; print(othermod.WHERE, os.getcwd())"]}
  - {name: reads-from-its-cwd, cwd: ../other, argv: [cat, notes/input.txt]}
  - {name: writes-in-its-cwd, cwd: ../other, argv: [sh, -c, "echo x > written-by-the-cell"]}
expect:
  - {case: exits-3, outcome: "exit:3"}
  - {case: writes-beside-the-matrix, outcome: "exit:2", reason: "the project is read-only to a cell"}
  - {case: writes-in-its-cwd, outcome: "exit:2", reason: "a case's own directory is read-only too"}
"""


@pytest.fixture(scope="module")
def base_image() -> str:
    try:
        import docker

        with contextlib.closing(docker.from_env(timeout=30)) as client:
            client.ping()
    except Exception as e:  # noqa: BLE001 - any failure to reach the daemon means: no docker here
        if os.environ.get("CUMATRIX_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_DOCKER=1 but no Docker daemon answers: {e}")
        pytest.skip(f"no Docker daemon answers ({type(e).__name__}); start one with `bash .ci/dockerd`")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(["bash", str(repo / "containers" / "build-base.sh")], capture_output=True, text=True,
                          timeout=900, check=False)
    if proc.returncode != 0:
        pytest.skip(f"containers/build-base.sh failed: {proc.stderr.strip()[-300:]}")
    return proc.stdout.strip().splitlines()[-1]


def _records(out: Path) -> dict[str, dict[str, Any]]:
    recs = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines() if ln.strip()]
    return {r["id"]: r for r in recs if r.get("type") == "cell"}


def _outcomes(out: Path) -> dict[str, tuple[str, str]]:
    return {i: (r["status"], r["observed"]["outcome"]) for i, r in _records(out).items()}


def test_one_matrix_gives_the_same_outcomes_on_the_local_and_docker_backends(
        tmp_path: Path, wheel_cache: Path, base_image: str, cli: Any) -> None:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "projmod.py").write_text("ANSWER = 42\n")
    (project / "data" / "input.txt").write_text("from the project\n")
    (project / "matrix.yaml").write_text(textwrap.dedent(MATRIX))
    other = tmp_path / "other"  # beside the project: named by a case, not where the run starts
    (other / "notes").mkdir(parents=True)
    (other / "othermod.py").write_text("WHERE = 'other'\n")
    (other / "notes" / "input.txt").write_text("from its own directory\n")
    # Where the run starts: neither the project nor its cases' directories, and none of their files.
    started = tmp_path / "started-here"
    started.mkdir()
    for d in (tmp_path, project, project / "data", other, other / "notes", started):  # the containers' user is not this one
        d.chmod(0o755)
    runs, stdout = {}, {}
    for backend, extra in (("local", ["--sandbox"]), ("docker", ["--base-image", base_image])):
        out = tmp_path / f"out-{backend}"
        proc = cli("run", "../project/matrix.yaml", "--backend", backend, *extra, "--out", out, "-q", cwd=started,
                   timeout=900)
        assert (out / "results.jsonl").is_file(), proc.stdout + proc.stderr
        runs[backend] = _outcomes(out)
        stdout[backend] = {i: r["stdout_tail"] for i, r in _records(out).items()
                           if r["axes"]["kind"] == "command" and r["observed"]["outcome"] == "ok"}
    local, in_docker = runs["local"], runs["docker"]
    assert local["cu12.9/host/imports-the-project"] == ("pass", "ok")
    assert local["cu12.9/host/reads-a-relative-path"] == ("pass", "ok")
    assert local["cu12.9/host/exits-3"] == ("pass", "exit:3")
    # Read-only on both: the sandbox's root and the container's mount refuse the write alike.
    assert local["cu12.9/host/writes-beside-the-matrix"] == ("pass", "exit:2")
    assert not (project / "written-by-the-cell").exists()
    # Read from the matrix file's directory, not from where the run started.
    assert stdout["local"]["cu12.9/host/imports-the-project"] == "42\n"
    assert stdout["local"]["cu12.9/host/reads-a-relative-path"] == "from the project\n"
    assert not any(started.iterdir())
    # A case's own cwd: started in, imported from, read from, read-only; on both backends alike.
    for case in ("imports-from-its-cwd", "reads-from-its-cwd"):
        assert local[f"cu12.9/host/{case}"] == ("pass", "ok")
    assert local["cu12.9/host/writes-in-its-cwd"] == ("pass", "exit:2")
    assert not (other / "written-by-the-cell").exists()
    assert stdout["local"]["cu12.9/host/imports-from-its-cwd"] == f"other {other}\n"
    assert stdout["local"]["cu12.9/host/reads-from-its-cwd"] == "from its own directory\n"
    assert stdout["docker"] == stdout["local"]
    # Cell by cell, the same (the harness's own probe included).
    assert in_docker == local
