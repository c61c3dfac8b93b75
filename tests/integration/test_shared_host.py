"""A host that is not shared: what another local user plants in a cache, a link planted in
--out, and ``clean --cache`` under a running run.

A real second user (created with ``useradd`` when these tests run as root; skipped otherwise),
the real ``cumatrix`` command in subprocesses, real files and links.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from cumatrix.execute import sandbox
from cumatrix.execute.spawn import spawn_source_bytes
from helpers.users import local_user

OTHER = "cmxother"
RUNTIME = "runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}\ndrivers: [host]\nprobe: false\n"
MATRIX = RUNTIME + "cases: [{name: a, argv: [true]}]\n"
#: The runtime wheel, offline: the user's own cache (fetched there by earlier runs).
WHEELS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cumatrix" / "wheels"


@pytest.fixture(autouse=True)
def _wheel() -> None:
    if not list(WHEELS.glob("nvidia_cuda_runtime_cu12-12.9.79-*.whl")):
        pytest.skip(f"no nvidia-cuda-runtime-cu12 12.9.79 wheel in {WHEELS} (`cumatrix fetch` one)")


@pytest.fixture(scope="module")
def other_user() -> pwd.struct_passwd:
    return local_user(OTHER)


def as_user(user: pwd.struct_passwd, script: str) -> None:
    subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                    "sh", "-c", script], check=True)


def shim_name() -> str:
    """The file name under which a run looks for its spawn helper in the cache."""
    source = spawn_source_bytes()
    tag = hashlib.sha256(source + os.uname().machine.encode() + b" static").hexdigest()[:16]
    return f"cumatrix-spawn-{tag}"


def test_a_cache_another_user_made_first_is_refused_and_nothing_in_it_runs(
        tmp_path: Path, other_user: pwd.struct_passwd, write_matrix: Any, cli: Any,
        request: pytest.FixtureRequest) -> None:
    top = Path(tempfile.mkdtemp(prefix="cumatrix-shared-test-", dir="/tmp"))  # a world-writable /tmp, as on the host
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    top.chmod(0o1777)
    shared, marker = top / "cache", top / "pwned"
    # The other user makes the shared cache first and plants a spawn helper of theirs in it.
    as_user(other_user, f"mkdir -m 755 {shared} {shared}/bin && printf '#!/bin/sh\\ntouch {marker}\\nexec \"$@\"\\n' "
                        f"> {shared}/bin/{shim_name()} && chmod 755 {shared}/bin/{shim_name()}")
    m = write_matrix(MATRIX)
    proc = cli("run", m, "--out", tmp_path / "o", "-q", "--wheel-dir", WHEELS, cwd=tmp_path, env={"CUMATRIX_CACHE": str(shared)})
    assert proc.returncode == 3, proc.stderr
    assert f"belongs to uid {other_user.pw_uid}" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


def test_a_cache_others_may_write_is_refused(tmp_path: Path, write_matrix: Any, cli: Any) -> None:
    shared = tmp_path / "cache"
    shared.mkdir()
    shared.chmod(0o777)
    proc = cli("run", write_matrix(MATRIX), "--out", tmp_path / "o", "-q", "--wheel-dir", WHEELS, cwd=tmp_path,
               env={"CUMATRIX_CACHE": str(shared)})
    assert proc.returncode == 3, proc.stderr
    assert "writable by others (mode 0777)" in proc.stderr, proc.stderr


def test_a_new_cache_is_private(tmp_path: Path, write_matrix: Any, cli: Any) -> None:
    cache = tmp_path / "xdg" / "cumatrix"
    proc = cli("validate", write_matrix(MATRIX), cwd=tmp_path)  # touches no cache
    assert proc.returncode == 0, proc.stderr
    from cumatrix.core.private import private_dir

    assert private_dir(cache) == cache
    assert (cache.stat().st_mode & 0o777) == 0o700


def test_a_planted_lock_link_in_out_truncates_nothing(tmp_path: Path, write_matrix: Any, cli: Any) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "o"
    out.mkdir()
    (out / ".cumatrix.lock").symlink_to(victim)
    proc = cli("run", write_matrix(MATRIX), "--out", out, "-q", "--wheel-dir", WHEELS, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "symbolic link" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert victim.read_text() == "precious\n"


def test_planted_report_temporaries_are_replaced_not_followed(tmp_path: Path, write_matrix: Any, cli: Any) -> None:
    from cumatrix.report import REPORT_FILES, write_all
    from cumatrix.results.records import load_records

    out = tmp_path / "o"
    proc = cli("run", write_matrix(MATRIX), "--out", out, "-q", "--wheel-dir", WHEELS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in REPORT_FILES:
        (out / f".{name}.tmp").symlink_to(victim)
    write_all(load_records(out / "results.jsonl"), out)
    assert victim.read_text() == "precious\n"
    assert all((out / name).is_file() and not (out / name).is_symlink() for name in REPORT_FILES)


SLOW = RUNTIME + "cases: [{name: a, argv: [sleep, '4']}, {name: b, argv: [sleep, '1']}]\n"


def test_clean_refuses_while_a_run_holds_the_cache(tmp_path: Path, write_matrix: Any, cli_env: Any, cli: Any) -> None:
    cache = tmp_path / "cache"
    env = cli_env({"CUMATRIX_CACHE": str(cache)})
    run = subprocess.Popen([sys.executable, "-m", "cumatrix", "run", str(write_matrix(SLOW)), "--out",
                            str(tmp_path / "o"), "-q", "--wheel-dir", str(WHEELS)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (cache / ".cumatrix-cache.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        clean = cli("clean", "--cache", env={"CUMATRIX_CACHE": str(cache)})
        _out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert clean.returncode == 3, clean.stderr
    assert "a cumatrix run is using this cache" in clean.stderr, clean.stderr
    assert run.returncode == 0, err  # its cells were not broken under it
    assert cache.is_dir()
    after = cli("clean", "--cache", env={"CUMATRIX_CACHE": str(cache)})
    assert after.returncode == 0, after.stderr
    assert not cache.exists(), after.stderr


def test_a_launcher_gone_under_a_run_is_a_harness_error_not_the_cells(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from cumatrix.core.jobs import Job
    from cumatrix.execute.local import run_local
    from cumatrix.judge.classify import classify

    real = sandbox.spawn_shim()
    if real is None:
        pytest.skip("no C compiler built the spawn helper here")
    copy = tmp_path / real.name
    shutil.copy2(real, copy)
    monkeypatch.setitem(sandbox._SHIM, "shim", copy)  # the helper a run found in its cache
    job = Job(cell_id="t", kind="command", argv=("sleep", "0"), timeout=30)
    assert run_local(job).returncode == 0
    copy.unlink()  # the cache is removed under the run
    obs = classify(run_local(job), kind="command")
    assert obs.outcome == "harness-error"
    assert "launcher" in obs.detail
    assert "sleep" not in obs.detail
    assert run_local(job).returncode == 0  # the next cell finds (or builds) a helper again
