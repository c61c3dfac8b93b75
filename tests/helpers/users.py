"""A real second local user for the tests that attack from one: made with ``useradd`` where
these tests run as root, skipped elsewhere."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess

import pytest


def local_user(name: str, *, shell: str = "/bin/sh", system: bool = True) -> pwd.struct_passwd:
    """The user ``name``, made if it does not exist yet (a parallel test may make it meanwhile)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("no second local user can be made here (needs root and useradd)")
    argv = ["useradd", *(["--system"] if system else []), "--no-create-home", "--shell", shell, name]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 9):  # 9: made meanwhile by a parallel test
        pytest.skip(f"useradd failed: {proc.stderr.strip()}")
    return pwd.getpwnam(name)
