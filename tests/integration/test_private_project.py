"""A private project still runs: a root harness's cells whose project or ``cwd:`` its cells'
uid may not enter (a 0700 directory: ``/root/project``, pytest's ``tmp_path``, ``mktemp -d``)
run all the same, the project shown to them read-only through an idmapped mount (the
harness's files there shown as the cell's own), and nothing of the host's permissions changes.

Before: every such cell was ``harness-error: ... uid 65534 (nobody) may not enter its working
directory``.  Real cells through the real fork server, a real ``cumatrix run``.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute import forkserver
from cumatrix.execute.local import HARNESS_PROBLEM, run_local
from cumatrix.execute.sandbox import Policy
from helpers.sandbox import require_bwrap

#: The cell reads the project's private file, then tries to write beside it.
READ_AND_WRITE = r"""
import os, sys
print("read", open(sys.argv[1]).read().strip())
try:
    open(os.path.join(os.path.dirname(sys.argv[1]), "written"), "w").write("x")
    print("wrote")
except OSError as e:
    print("write refused", e.errno)
print("cwd", os.getcwd())
"""


@pytest.fixture(autouse=True)
def root_served(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a root harness runs its cells as another uid")
    require_bwrap()
    monkeypatch.delenv(forkserver.ENV_SWITCH, raising=False)
    probe = run_local(Job(cell_id="p", kind="command", timeout=30, argv=("true",)), policy=Policy(sandbox="on"))
    if probe.extra.get("sandbox") != "namespaces" or forkserver.cell_uids() is None:
        if os.environ.get("CUMATRIX_REQUIRE_BWRAP") == "1":
            pytest.fail(f"no fork server with cells' uids here: {probe.extra}, {forkserver.cell_uids_why()}")
        pytest.skip(f"cells are not held by the fork server with uids of their own: {probe.extra.get('sandbox')}")


def _private(tmp_path: Path) -> tuple[Path, Path]:
    project = tmp_path / "project"
    project.mkdir(mode=0o700)
    secret = project / "data.txt"
    secret.write_text("the project's own\n")
    secret.chmod(0o600)
    return project, secret


def test_a_cell_whose_working_directory_is_private_runs_and_reads_it_read_only(tmp_path: Path) -> None:
    project, secret = _private(tmp_path)
    res = run_local(Job(cell_id="c", kind="command", timeout=60,
                        argv=(sys.executable, "-c", READ_AND_WRITE, str(secret))),
                    cwd=str(project), policy=Policy(sandbox="on"))
    assert HARNESS_PROBLEM not in res.extra, res.extra
    assert res.returncode == 0, res.stderr_tail
    assert "read the project's own" in res.stdout_tail
    assert "write refused 30" in res.stdout_tail  # EROFS: shown read-only
    assert f"cwd {project}" in res.stdout_tail
    # The host's permissions are as they were, and nothing was written.
    assert stat.S_IMODE(project.stat().st_mode) == 0o700
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not (project / "written").exists()


@pytest.mark.network  # the cell provisions a real runtime wheel (cached after the first)
def test_a_default_run_of_a_matrix_in_a_private_directory_passes(tmp_path: Path, cli: Any, wheel_cache: Path) -> None:
    """A matrix kept in pytest's own ``tmp_path`` (0700 above it), run as a user would."""
    project, secret = _private(tmp_path)
    (project / "case.py").write_text(READ_AND_WRITE)
    m = project / "m.yaml"
    m.write_text(textwrap.dedent(f"""
        runtimes: {{cu12.9: {{wheel: nvidia-cuda-runtime-cu12==12.9.79}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: reads, argv: [python3, case.py, {secret}]}}
        """).lstrip("\n"))
    proc = cli("run", m, "--out", tmp_path / "out", cwd=project, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = (tmp_path / "out" / "results.jsonl").read_text()
    assert "read the project's own" in records
    assert "write refused 30" in records
    assert stat.S_IMODE(project.stat().st_mode) == 0o700


def test_where_the_file_system_refuses_an_idmapped_mount_the_cell_is_a_harness_error_that_says_so(
        tmp_path: Path) -> None:
    """overlayfs (the root of most containers) takes no idmapped mount of its own on the
    kernels tried: the cell does not start, and its record says why, in one line: never an
    exit status judged as the program's."""
    layers = {n: tmp_path / n for n in ("lower", "upper", "work", "merged")}
    for d in layers.values():
        d.mkdir()
    opts = f"lowerdir={layers['lower']},upperdir={layers['upper']},workdir={layers['work']}"
    mounted = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(layers["merged"])],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"no overlayfs mount here: {mounted.stderr.strip()}")
    try:
        project, secret = _private(layers["merged"])
        res = run_local(Job(cell_id="c", kind="command", timeout=60, argv=("/bin/cat", str(secret))),
                        cwd=str(project), policy=Policy(sandbox="on"))
    finally:
        subprocess.run(["umount", "-l", str(layers["merged"])], check=False)
    if HARNESS_PROBLEM not in res.extra:  # a kernel whose overlayfs takes one: the cell read it
        assert res.returncode == 0, res.stderr_tail
        assert "the project's own" in res.stdout_tail
        return
    problem = str(res.extra[HARNESS_PROBLEM])
    assert "sandbox could not be built" in problem, problem
    assert "refuses an idmapped mount" in problem, problem
    assert "chmod o+rx" in problem, problem
    assert res.returncode is None
