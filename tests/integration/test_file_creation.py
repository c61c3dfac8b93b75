"""Files a command creates are created without following links and only where nothing is,
unless --force, which replaces the link itself: a second local user (a real `useradd` user)
who may write the project directory plants `.github/workflows/cumatrix-nightly.yml` as a link
to a file of the user who runs `cumatrix init`, or the Slurm scripts as links."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.users import local_user
from helpers.wheels import make_wheel

PEER = "cumatrixpeer"


def _peer() -> str:
    return local_user(PEER, shell="/usr/sbin/nologin", system=False).pw_name


def _as_peer(*argv: str | Path) -> None:
    subprocess.run(["runuser", "-u", _peer(), "--", *map(str, argv)], check=True, timeout=30)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the peer can reach (pytest's own temporary root is its user's alone)."""
    d = Path(tempfile.mkdtemp(prefix="cumatrix-shared-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _shared_project(tmp_path: Path) -> Path:
    """A project directory the peer may write (a shared checkout), with a package name."""
    project = tmp_path / "project"
    (project / ".github" / "workflows").mkdir(parents=True)
    for d in (project, project / ".github", project / ".github" / "workflows"):
        d.chmod(0o777)  # shared, not sticky: the kernel's protected_symlinks guards only sticky directories
    (project / "setup.cfg").write_text("[metadata]\nname = shared-pkg\n")
    return project


def test_init_does_not_write_through_a_link_another_user_planted(shared: Path, cli: Callable[..., Any]) -> None:
    tmp_path = shared
    project = _shared_project(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    dangling = victim / "not-yet"  # a file of the user running init, that does not exist yet
    existing = victim / "notes.txt"
    existing.write_text("mine\n")
    wf = project / ".github" / "workflows" / "cumatrix-nightly.yml"
    _as_peer("ln", "-s", dangling, wf)
    r = cli("init", cwd=project)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cumatrix-nightly.yml exists: not overwriting" in r.stderr
    assert not dangling.exists()
    assert not (project / "matrix.yaml").exists()  # neither file is written
    # --force replaces the links themselves; what they pointed at is untouched.
    _as_peer("ln", "-s", existing, project / "matrix.yaml")
    r = cli("init", "--force", cwd=project)
    assert r.returncode == 0, r.stderr
    assert not dangling.exists()
    assert existing.read_text() == "mine\n"
    for p in (wf, project / "matrix.yaml"):
        assert not p.is_symlink()
        assert p.stat().st_uid == os.geteuid()
    assert "import shared_pkg" in (project / "matrix.yaml").read_text()
    assert [p.name for p in wf.parent.iterdir()] == ["cumatrix-nightly.yml"]  # no temporary file left


MATRIX = """
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host]
probe: false
cases: [{name: a, argv: [true]}]
hosts:
  h1: {driver: "580.159"}
"""


def test_plan_slurm_replaces_a_planted_script_link_without_writing_its_target(shared: Path,
                                                                             cli: Callable[..., Any]) -> None:
    tmp_path = shared
    project = _shared_project(tmp_path)
    (project / "m.yaml").write_text(MATRIX)
    slurm_dir = project / "out" / "slurm"
    slurm_dir.mkdir(parents=True)
    for d in (project / "out", slurm_dir):
        d.chmod(0o777)  # shared, not sticky: the kernel's protected_symlinks guards only sticky directories
    victim = tmp_path / "victim.sh"
    victim.write_text("echo mine\n")
    _as_peer("ln", "-s", victim, slurm_dir / "submit.sh")
    r = cli("plan", "m.yaml", "--format", "slurm", "--out", "out", cwd=project)
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "echo mine\n"
    assert not (slurm_dir / "submit.sh").is_symlink()
    assert "sbatch --parsable" in (slurm_dir / "submit.sh").read_text()


def test_gate_reports_replace_planted_links_without_writing_their_targets(shared: Path,
                                                                          cli: Callable[..., Any]) -> None:
    """`gate --out` into a directory another user may write: its three report files, planted as
    links to a file of the user who runs the gate, are replaced; the file is untouched."""
    wheel = make_wheel(shared / "dist", "plain", {"plain/__init__.py": b""})
    out = shared / "gate-out"
    out.mkdir()
    out.chmod(0o777)  # shared, not sticky
    victim = shared / "victim.txt"
    victim.write_text("mine\n")
    for name in ("summary.md", "static.json", "junit.xml"):
        _as_peer("ln", "-s", victim, out / name)
    r = cli("gate", wheel, "--static-only", "--out", out, cwd=shared)
    assert r.returncode == 0, r.stdout + r.stderr
    assert victim.read_text() == "mine\n"
    for name in ("summary.md", "static.json", "junit.xml"):
        assert not (out / name).is_symlink()
    assert (out / "summary.md").read_text().startswith("## Static audit")
