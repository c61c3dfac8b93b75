"""The tutorial's worked example, as docs/tutorial.md writes it: the C extension built by its gcc
command, its matrix run by the real ``cumatrix run``, and each cell doing what the page says."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from cumatrix.provision.runtimes import cuda_version_of_release
from helpers.sandbox import require_bwrap

pytestmark = pytest.mark.network  # the matrix's runtimes come from real wheels (cached)

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"


def _block(lang: str, needle: str) -> str:
    """The one fenced ``lang`` block of the tutorial that contains ``needle``."""
    text = TUTORIAL.read_text(encoding="utf-8")
    found = [m.group(1) for m in re.finditer(rf"^```{lang}[ \t]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
             if needle in m.group(1)]
    assert len(found) == 1, f"docs/tutorial.md: {len(found)} ```{lang} blocks contain {needle!r}, want one"
    return found[0]


def test_the_tutorial_example_runs_as_written(tmp_path: Path, wheel_cache: Path, cli: Any) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        pytest.skip("no Python.h for this interpreter (python3-dev)")
    (tmp_path / "cudaver.c").write_text(_block("c", "PyInit_cudaver"))
    matrix = _block("yaml", "cudaver")
    (tmp_path / "cudaver.yaml").write_text(matrix)
    # `python` on the page is the activated venv's: this interpreter, for the build only.  The run
    # gets no such help: the case's bare `python3` is the harness's because it says `python: harness`.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    build = subprocess.run(["bash", "-euc", _block("sh", "gcc -shared")], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PATH": path}, check=False)
    assert build.returncode == 0, build.stderr
    # The page's commands, as written: validate, the run, and the run in the sandbox.
    commands = [ln.split("#", 1)[0].split() for ln in _block("sh", "cumatrix run cudaver.yaml").splitlines()
                if ln.startswith("cumatrix ")]
    assert [c[:2] for c in commands] == [["cumatrix", "validate"], ["cumatrix", "run"], ["cumatrix", "run"]]
    outs = []
    for argv in commands:
        if "--sandbox" in argv:
            require_bwrap()
            # A root harness runs a sandboxed cell as an unprivileged user: the project's
            # directory must be readable to it, as a reader's checkout is (pytest's are 0700).
            for d in (tmp_path, tmp_path.parent):
                d.chmod(0o755)
        proc = cli(*argv[1:], cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        if argv[1] == "run":
            outs.append(tmp_path / argv[argv.index("--out") + 1])
    assert len(outs) == 2
    # As the page says: from a subdirectory, the case still starts beside cudaver.yaml and finds build/.
    sub = tmp_path / "sub"
    sub.mkdir()
    proc = cli("run", "../cudaver.yaml", "--out", "out-from-sub", "--no-sandbox", cwd=sub)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outs.append(sub / "out-from-sub")
    for out in outs:
        _check_records(out, matrix)


def _check_records(out: Path, matrix: str) -> None:
    records = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())
               if r.get("type") == "cell"}
    wheels = dict(re.findall(r"^  (cu[\d.]+): \{wheel: ([^}]+)\}$", matrix, re.MULTILINE))
    assert set(wheels) == {"cu12.4", "cu12.9", "cu13.0"}
    for name, requirement in wheels.items():
        rec = records[f"{name}/host/cudaver"]
        assert rec["status"] == "pass", rec
        if name.startswith("cu12"):
            # It printed the version of the runtime its own cell offered, not another one.
            assert rec["observed"]["outcome"] == "ok"
            assert rec["stdout_tail"].strip() == str(cuda_version_of_release(requirement.split("==")[1]))
        else:
            assert rec["observed"]["outcome"] == "exit:1"
            assert "no CUDA 12 runtime" in rec["stderr_tail"]
