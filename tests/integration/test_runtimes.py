"""Runtime provisioning from real wheels: version from the library, cache, offline, site."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest

from cumatrix import runtimes as R
from cumatrix.errors import RuntimeNotFound

pytestmark = pytest.mark.network

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"
CU130 = "nvidia-cuda-runtime==13.0.96"
DEAD_INDEX = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "", "PIP_RETRIES": "0",
              "PIP_TIMEOUT": "2", "PIP_FIND_LINKS": ""}


@pytest.mark.parametrize(("req", "version"), [(CU129, 12090), (CU130, 13000)])
def test_version_read_from_the_library(wheel_cache: Path, req: str, version: int) -> None:
    rt = R.from_wheel("x", req)
    assert rt.version == version
    assert rt.wheel_version == req.split("==")[1]
    assert rt.libcudart.name.startswith("libcudart.so.") and rt.libcudart.is_file()
    assert rt.include_dir is not None and (rt.include_dir / "cuda_runtime_api.h").is_file()
    # read in a child from the file itself, not from the wheel's name
    assert R.library_version(rt.libcudart) == (version, True)
    assert str(rt.lib_dir).startswith(str(wheel_cache))


def _wheel_dir(tmp_path: Path, req: str) -> Path:
    d = tmp_path / "wheels"
    d.mkdir(exist_ok=True)
    shutil.copy(R.fetch_wheel(req), d)
    return d


def test_cache_honours_xdg(tmp_path: Path, wheel_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = _wheel_dir(tmp_path, CU129)
    monkeypatch.delenv("CUMATRIX_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    rt = R.from_wheel("cu12.9", CU129, wheel_dir=wheels)
    assert rt.libcudart.is_relative_to(tmp_path / "xdg" / "cumatrix" / "runtimes")
    assert (rt.libcudart.parents[3] / ".cumatrix-runtime.json").is_file()  # the version is read once
    again = R.from_wheel("cu12.9", CU129, wheel_dir=wheels)
    assert again == rt


def test_a_requirement_that_does_not_exist(tmp_path: Path, wheel_cache: Path, write_matrix: Any, cli: Any) -> None:
    m = write_matrix("""
        runtimes: {cu12.99: {wheel: nvidia-cuda-runtime-cu12==12.99.1}}
        drivers: [host]
        cases: [{name: a, argv: [true]}]
    """)
    proc = cli("run", m, "--out", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 2
    assert "nvidia-cuda-runtime-cu12==12.99.1" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(RuntimeNotFound, match=r"12\.99\.1.*--wheel-dir"):
        R.fetch_wheel("nvidia-cuda-runtime-cu12==12.99.1")


def test_wheel_dir_works_offline(tmp_path: Path, wheel_cache: Path, write_matrix: Any, cli: Any) -> None:
    wheels = _wheel_dir(tmp_path, CU129)
    m = write_matrix(f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        cases: [{{name: a, argv: [true]}}]
    """)
    offline = {**DEAD_INDEX, "XDG_CACHE_HOME": str(tmp_path / "empty-cache")}
    # without the wheel directory the dead index and the empty cache leave nothing: exit 2
    proc = cli("run", m, "--out", tmp_path / "o1", "-q", cwd=tmp_path, env=offline)
    assert proc.returncode == 2 and CU129 in proc.stderr
    proc = cli("run", m, "--out", tmp_path / "o2", "-q", "--wheel-dir", wheels, cwd=tmp_path, env=offline)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(ln) for ln in (tmp_path / "o2" / "results.jsonl").read_text().splitlines()]
    probe = next(r for r in recs if r.get("id") == "cu12.9/host/probe")
    assert probe["observed"]["data"]["runtime_version"] == 12090
    assert str(tmp_path / "empty-cache") in probe["fingerprint"]["runtime_file"]
    proc = cli("run", m, "--out", tmp_path / "o3", "--wheel-dir", tmp_path / "nowhere", cwd=tmp_path, env=offline)
    assert proc.returncode == 2 and "nowhere" in proc.stderr


def test_site_runtime_in_this_environment(wheel_cache: Path) -> None:
    try:
        from cuda import pathfinder

        pathfinder.load_nvidia_dynamic_lib("cudart")
    except Exception as e:
        if os.environ.get("CUMATRIX_REQUIRE_SITE_RUNTIME") == "1":
            raise
        pytest.skip(f"no nvidia-cuda-runtime installed in this environment ({type(e).__name__})")
    rt = R.from_site("site")
    assert rt.found_by.startswith("cuda.pathfinder") and rt.version >= 12000


def test_site_runtime_in_a_fresh_venv(tmp_path: Path, wheel_cache: Path, write_matrix: Any, cli_env: Any) -> None:
    # A real environment with the runtime wheel installed: what each tox runtime env holds.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    wheel = R.fetch_wheel(CU130)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--target", site, str(wheel)], check=True)
    m = write_matrix("""
        runtimes: {site: {site: true}}
        drivers: [host]
        cases: [{name: a, argv: [true]}]
    """)
    proc = subprocess.run([str(py), "-m", "cumatrix", "run", str(m), "--out", str(tmp_path / "out"), "-q"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(ln) for ln in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    probe = next(r for r in recs if r.get("id") == "site/host/probe")
    assert probe["observed"]["data"]["runtime_version"] == 13000
    assert probe["fingerprint"]["runtime_file"].startswith(site)
