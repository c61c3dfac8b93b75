"""Without the sandbox: what a cell of the harness's own user could take from the harness.

A real run as a second, unprivileged local user (``useradd``; these tests need root to make
it), whose cell walks its ancestors' ``/proc/PID/environ`` for the secrets the harness was
started with; and a command cell's ``python3`` with the harness's venv activated.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from cumatrix.core.jobs import Job
from cumatrix.execute.local import run_local
from cumatrix.execute.sandbox import Policy
from helpers.users import local_user

OTHER = "cmxother"
WHEELS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cumatrix" / "wheels"
SRC = Path(__file__).resolve().parents[2] / "src"

WALK = r"""
import os, sys
own = open("/proc/self/environ", "rb").read()
assert b"PATH=" in own, "cannot read even its own environment"
pid, seen, found = os.getppid(), 0, []
while pid > 1:
    try:
        env = open(f"/proc/{pid}/environ", "rb").read()
        for secret in (b"sekrit-aws", b"sekrit-gh"):
            if secret in env:
                found.append((pid, secret))
    except OSError:
        pass
    seen += 1
    pid = int([l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("PPid:")][0])
assert seen >= 2, seen
print("ancestors", seen, "found", found)
sys.exit(1 if found else 0)
"""


@pytest.fixture(scope="module")
def other_user() -> pwd.struct_passwd:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    return local_user(OTHER)


def test_a_cell_reads_no_secret_from_its_ancestors(other_user: pwd.struct_passwd,
                                                   request: pytest.FixtureRequest) -> None:
    wheel = next(iter(sorted(WHEELS.glob("nvidia_cuda_runtime_cu12-12.9.79-*.whl"))), None)
    if wheel is None:
        pytest.skip(f"no nvidia-cuda-runtime-cu12 12.9.79 wheel in {WHEELS}")
    system_python = "/usr/bin/python3"
    site = sysconfig.get_paths()["purelib"]
    version = "import sys; print(sys.version_info[0], sys.version_info[1])"
    if not Path(system_python).exists() or sys.version_info[:2] != tuple(
            int(x) for x in subprocess.run([system_python, "-c", version], capture_output=True, text=True,
                                           check=True).stdout.split()):
        pytest.skip("the system python3 is not this venv's version (its packages are borrowed)")
    home = Path(tempfile.mkdtemp(prefix="cumatrix-leak-test-"))
    request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
    (home / "wheels").mkdir()
    shutil.copy(wheel, home / "wheels")
    (home / "m.yaml").write_text(
        "runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}\ndrivers: [host]\nprobe: false\n"
        f"cases:\n  - {{name: walk, argv: [{system_python}, {home / 'walk.py'}]}}\n")
    (home / "walk.py").write_text(WALK)
    subprocess.run(["chown", "-R", f"{other_user.pw_uid}:{other_user.pw_gid}", str(home)], check=True)
    home.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": f"{SRC}:{site}",
           "CUMATRIX_CACHE": str(home / "cache"), "AWS_SECRET_ACCESS_KEY": "sekrit-aws",
           "GITHUB_TOKEN": "sekrit-gh", "LANG": "C.UTF-8"}
    proc = subprocess.run(["setpriv", f"--reuid={other_user.pw_uid}", f"--regid={other_user.pw_gid}",
                           "--clear-groups", system_python, "-m", "cumatrix", "run", str(home / "m.yaml"),
                           "--out", str(home / "o"), "--wheel-dir", str(home / "wheels"), "--no-sandbox"],
                          cwd=home, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_a_command_cells_python_is_not_the_harness_venvs() -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a virtual environment")
    venv_bin = str(Path(sys.prefix) / "bin")
    base = {"PATH": os.pathsep.join([venv_bin, "/usr/local/bin", "/usr/bin", "/bin"]), "HOME": str(Path.home())}
    code = "import sys; print(sys.prefix)"
    res = run_local(Job(cell_id="t", kind="command", argv=("python3", "-c", code), timeout=60), base_env=base,
                    policy=Policy(sandbox="off"))
    assert res.returncode == 0, res.stderr_tail
    assert res.stdout_tail.strip() != sys.prefix  # not the harness's interpreter
    # A case that asks for the harness's interpreter (`python: harness`) gets it first on PATH.
    own = run_local(Job(cell_id="t", kind="command", argv=("python3", "-c", code), timeout=60,
                        harness_python=True), base_env=base, policy=Policy(sandbox="off"))
    assert own.stdout_tail.strip() == sys.prefix


def test_python_harness_is_a_case_option() -> None:
    from cumatrix.core.errors import ConfigError
    from cumatrix.load import matrix as M

    head = "runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}\ndrivers: [host]\ncases:\n"
    m = M.loads(head + "  - {name: a, argv: [python3, -V], python: harness}\n  - {name: b, argv: [python3, -V]}\n",
                "m.yaml")
    assert [c.harness_python for c in m.cases] == [True, False]
    with pytest.raises(ConfigError, match=r"m.yaml:4:.*python"):
        M.loads(head + "  - {name: a, argv: [python3, -V], python: venv}\n", "m.yaml")
