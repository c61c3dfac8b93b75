"""No temporary directory of cumatrix's outlives a command.

Every subcommand runs for real (cheap invocations, not --help; ``submit`` alone is left out: it
needs a Slurm controller) with ``TMPDIR`` set to a fresh, empty directory, which must be empty
again when the command returns: a run's audit logs, a
container's verdict directory, a gate's build context, the ids of --lf are all removed by the
command that made them.  ``cumatrix clean`` removes what a killed run left (its process gone).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cumatrix.host.fingerprint import host_fingerprint
from helpers.build import shared_library
from helpers.wheels import make_wheel

pytestmark = pytest.mark.network  # runtime wheels (cached after the first fetch)

ROOT = Path(__file__).resolve().parents[2]
HAS_GPU = host_fingerprint().get("driver_version") is not None
RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"


def _wheel(d: Path) -> Path:
    """A real wheel holding a gcc-built extension that imports without a GPU."""
    ext = shared_library(d / "_ext.so", "int answer(void) { return 42; }\n")
    dist = "demo_tmp"
    return make_wheel(d, dist, {
        f"{dist}/__init__.py": b"import ctypes, os\n_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), '_ext.so'))\n",
        f"{dist}/_ext.so": ext.read_bytes(),
    }, tag="py3-none-linux_x86_64", top_level=True, compression=zipfile.ZIP_STORED)


def test_every_subcommand_leaves_tmpdir_empty(tmp_path: Path, wheel_cache: Path,
                                               cli_env: Callable[..., dict[str, str]]) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not on PATH (the gate's wheel and the run's audit library are built with it)")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    py = sys.executable
    m = work / "m.yaml"
    m.write_text(f"""
runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}
drivers: [host, emulated-12.4]
cases:
  - {{name: fine, argv: [true]}}
  - {{name: fails, argv: [sh, -c, "exit 3"]}}
  - {{name: segv, argv: [{py}, -c, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"], timeout: 60}}
expect:
  - {{case: segv, outcome: "crash:SIGSEGV"}}
""")
    project = work / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "demo-project"\nversion = "1"\n')
    wheel = _wheel(work)
    scratch_cache = tmp_path / "scratch-cache"  # `clean` removes this one, not the shared wheel cache
    scratch_cache.mkdir()
    env = cli_env({"TMPDIR": str(tmp), "CUMATRIX_HISTORY": str(work / "history.sqlite")})

    def cumatrix(*args: str | Path, want: set[int], cwd: Path = work, extra: dict[str, str] | None = None) -> str:
        proc = subprocess.run([py, "-m", "cumatrix", *map(str, args)], cwd=cwd, env={**env, **(extra or {})},
                              capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, check=False)
        assert proc.returncode in want, (args, proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
        left = sorted(p.name for p in tmp.iterdir())
        assert left == [], f"cumatrix {' '.join(map(str, args))} left {left} in TMPDIR"
        return proc.stdout + proc.stderr

    cumatrix("validate", m, "--check-wheels", want={0})
    cumatrix("plan", ROOT / "examples" / "hosts.yaml", "--format", "json", want={0})
    cumatrix("run", m, "--out", "out", "--host", "h1", "-q", want={1})
    cumatrix("run", m, "--out", "out", "--host", "h1", "--lf", "-q", want={1})
    cumatrix("run", m, "--out", "outb", "--host", "h2", "-k", "fine", "-q", want={0, 5})
    cumatrix("run", m, "--out", "out2", "-k", "nothing-matches", "-q", want={5})
    cumatrix("history", "--json", want={0})
    cumatrix("diff", "1", "2", want={0, 1})
    cumatrix("fetch", m, "--dest", "fetched", want={0})
    cumatrix("calibrate", "--out", "calibration.txt", want={0} if HAS_GPU else {2, 3})
    cumatrix("report", "out", want={0})
    cumatrix("merge", "out", "outb", "--out", "merged", want={0, 1})
    cumatrix("repro", "cu12.9/host/segv", "--matrix", m, "--out", "repro-cell", want={0})
    cumatrix("repro", "--list", want={0})
    out = cumatrix("repro", "--bug", "sglang-driver-dispatch", "--out", "repro-bug", want={0, 1} if HAS_GPU else {3})
    assert str(tmp) not in out  # the command to run elsewhere names no temporary path
    cumatrix("gate", wheel, "--matrix", m, "--out", "gate-out", "-q", want={0, 1})
    cumatrix("doctor", "--json", want={0, 1})
    cumatrix("build", "proc-address", "--headers", "12.9", want={0})
    cumatrix("init", want={0}, cwd=project)
    cumatrix("clean", want={0}, extra={"CUMATRIX_CACHE": str(scratch_cache)})
    assert not scratch_cache.exists()
    # The standalone command in the cell's report names no temporary directory either.
    report = (work / "repro-cell" / "cu12.9--host--segv.md").read_text()
    assert str(tmp) not in report
    assert "cumatrix-audit-" not in report


def test_clean_removes_a_dead_runs_temporary_directory_and_keeps_a_live_ones(tmp_path: Path, cli: Callable[..., Any],
                                                                               cli_env: Any) -> None:
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    # A process that has exited: its pid names a directory nobody will remove.
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = tmp / f"cumatrix-audit-{dead.pid}-abc123"
    gone.mkdir()
    (gone / "x.log").write_text("left by a killed run\n")
    live = tmp / f"cumatrix-audit-{os.getpid()}-def456"  # this test's own process: alive
    live.mkdir()
    other = tmp / "someone-elses-dir"
    other.mkdir()
    proc = subprocess.run([sys.executable, "-m", "cumatrix", "clean"], capture_output=True, text=True, timeout=120,
                          env=cli_env({"TMPDIR": str(tmp), "CUMATRIX_CACHE": str(tmp_path / "no-cache")}), check=False)
    assert proc.returncode == 0, proc.stderr
    assert not gone.exists()
    assert live.is_dir()
    assert other.is_dir()
    assert f"removed the temporary directory {gone}" in proc.stdout

