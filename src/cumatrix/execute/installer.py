"""The gate's installer: ``pip install`` of a wheel into a cell's install target, spawned here.

A child of the harness like any other: where the gate sandboxes its cells and the install needs
no network (the wheel alone, or ``--wheel-dir``), pip runs in the cells' sandbox (no network, the
host read-only but for its target, a root harness's cells' uid); it runs in a process group of
its own that ends with it, and a timeout kills the whole group.  What it did is a fact (its exit
status and its message); the gate's hooks hand a failure on, and the judge names the outcome.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from cumatrix.core.jobs import Job
from cumatrix.core.options import SandboxPolicy
from cumatrix.execute import sandbox

#: Seconds an install may take (a large wheel with its dependencies, from an index).
INSTALL_TIMEOUT = 1800


def run_installer(argv: list[str], *, target: Path, inputs: Sequence[Path], wheel_dir: Path | None,
                  sandboxable: bool, policy: SandboxPolicy | None,
                  timeout: float = INSTALL_TIMEOUT) -> tuple[int, str]:
    """Run the installer ``argv`` (writing ``target``); its exit status and its message.

    ``inputs`` (the wheel, the constraints) are what it reads; ``sandboxable``: the install
    needs no network, so it may run in the cells' sandbox (``policy``'s; none: on the host)."""
    env = None
    if sandboxable and policy is not None:
        boxed = _sandboxed(argv, target, inputs, wheel_dir, policy)
        if boxed is not None:
            argv, env = boxed
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return 124, f"pip install did not finish in {timeout / 60:g} minutes"
    finally:
        _kill_group(proc, quiet=True)  # whatever it left in its group ends with it
    return proc.returncode, (err or out).strip()


def _kill_group(proc: subprocess.Popen[str], *, quiet: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if not quiet:
        proc.communicate()


def _sandboxed(argv: list[str], target: Path, files: Sequence[Path], wheel_dir: Path | None,
               policy: SandboxPolicy) -> tuple[list[str], dict[str, str]] | None:
    """``argv`` (pip) under the cells' sandbox, where the gate sandboxes its cells and bubblewrap
    runs: no network, the host read-only but for ``target``, and as a root harness's cells run
    (an unprivileged uid).  ``files`` (the wheel, the constraints) are copied beside ``target``
    where that uid reads them.  None where there is no sandbox to use, or (as root) a
    ``wheel_dir`` that uid may not read: pip then runs on the host, wheels only, as before."""
    if policy.sandbox == "off":
        return None
    bwrap, _why = sandbox.bubblewrap()
    if bwrap is None:
        return None
    root = os.geteuid() == 0
    if root and wheel_dir is not None and Path(wheel_dir).stat().st_mode & 0o005 != 0o005:
        return None
    target.mkdir(parents=True, exist_ok=True)
    given = target.with_name(target.name + ".in")
    argv = _given(argv, files, given)
    if root:
        os.chown(target, policy.uid, policy.uid)  # the sandbox's uid writes the install
    read = [str(given), *([str(wheel_dir)] if wheel_dir is not None else [])]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "TMPDIR": "/tmp",
           "LANG": os.environ.get("LANG", "C.UTF-8"), "PIP_NO_CACHE_DIR": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    job = Job(cell_id="pip", kind="command", argv=tuple(argv), mounts=tuple(read))
    return sandbox.bwrap_argv(bwrap, job, env, str(target), policy, write_dirs=[str(target)]), env


def _given(argv: list[str], files: Sequence[Path], given: Path) -> list[str]:
    """``argv`` naming copies of ``files`` in ``given`` (made readable to every uid)."""
    given.mkdir(mode=0o755, exist_ok=True)
    given.chmod(0o755)
    argv = list(argv)
    for f in files:
        copy = given / f.name
        shutil.copyfile(f, copy)
        copy.chmod(0o644)
        argv = [str(copy) if a == str(f) else a for a in argv]
    return argv
