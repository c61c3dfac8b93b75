"""Download wheels with pip for a target platform (runtime images, offline hosts)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from cumatrix.core.errors import RuntimeNotFound


def platform_tags(platform: str) -> list[str]:
    """``manylinux_2_28_x86_64`` -> itself and every older manylinux tag of that architecture.

    pip's ``--platform`` matches a tag exactly (it widens only the legacy aliases), while
    NVIDIA's wheels carry tags from ``manylinux1`` to ``manylinux_2_28``.
    """
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if not m:
        return [platform]
    glibc, arch = int(m.group(1)), m.group(2)
    tags = [f"manylinux_2_{g}_{arch}" for g in range(glibc, 16, -1)]
    legacy = [("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)]
    return tags + [f"{name}_{arch}" for name, g in legacy if g <= glibc]


def pip_download(reqs: Sequence[str], dest: Path, *, deps: bool, python_version: str | None,
                  platforms: Sequence[str], what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", "-d", str(dest)]
    if not deps:
        cmd.append("--no-deps")
    for p in platforms:
        cmd += ["--platform", p]
    if python_version:
        cmd += ["--python-version", python_version, "--implementation", "cp"]
    proc = subprocess.run([*cmd, "--", *reqs], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise RuntimeNotFound(f"{what}: pip could not download {' '.join(reqs)}: {tail}")
