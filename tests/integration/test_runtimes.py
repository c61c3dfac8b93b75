"""Runtime provisioning from real wheels: version from the library, cache, offline, site."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path
from typing import Any

import pytest

import cumatrix
from cumatrix.core.errors import RuntimeNotFound, UsageError
from cumatrix.core.model import Runtime
from cumatrix.provision import runtimes as R

PACKAGE_PARENT = str(Path(cumatrix.__file__).resolve().parent.parent)

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
    assert rt.libcudart.name.startswith("libcudart.so.")
    assert rt.libcudart.is_file()
    assert rt.include_dir is not None
    assert (rt.include_dir / "cuda_runtime_api.h").is_file()
    # the wheel's METADATA, agreeing with the library's own SONAME and the constant in its code
    assert rt.version_source == (f"METADATA {req.split('==')[1]}; DT_SONAME libcudart.so.{version // 1000}; "
                                 f"code constant {version}")
    assert R.library_version(rt.libcudart) == (version, True)
    assert str(rt.lib_dir).startswith(str(wheel_cache))


@pytest.mark.parametrize("cuda", list(R.KNOWN_WHEELS))
def test_every_known_runtime_reads_its_version_as_data(wheel_cache: Path, cuda: str) -> None:
    from cumatrix.core.model import CudaVersion
    from cumatrix.predict.oracle import batch_introduced

    rt = R.from_wheel(f"cu{cuda}", R.KNOWN_WHEELS[cuda])
    assert rt.version == int(CudaVersion.parse(cuda))
    assert "code constant" in rt.version_source
    assert rt.batch_exported == (rt.version >= batch_introduced())  # docs/facts.md section 1


def test_resolving_a_runtime_loads_no_libcudart_on_the_host(wheel_cache: Path, cli_env: Any) -> None:
    code = (f"from cumatrix.provision import runtimes as R; R.from_wheel('x', {CU129!r}); "
            "maps = open('/proc/self/maps').read(); print('libcudart' in maps)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


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
    assert (rt.libcudart.parents[3] / ".cumatrix-runtime.json").is_file()  # what `doctor` lists
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
    assert "nvidia-cuda-runtime-cu12==12.99.1" in proc.stderr
    assert "Traceback" not in proc.stderr
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
    assert proc.returncode == 2
    assert CU129 in proc.stderr
    proc = cli("run", m, "--out", tmp_path / "o2", "-q", "--wheel-dir", wheels, cwd=tmp_path, env=offline)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(ln) for ln in (tmp_path / "o2" / "results.jsonl").read_text().splitlines()]
    probe = next(r for r in recs if r.get("id") == "cu12.9/host/probe")
    assert probe["observed"]["data"]["runtime_version"] == 12090
    assert str(tmp_path / "empty-cache") in probe["fingerprint"]["runtime_file"]
    proc = cli("run", m, "--out", tmp_path / "o3", "--wheel-dir", tmp_path / "nowhere", cwd=tmp_path, env=offline)
    assert proc.returncode == 2
    assert "nowhere" in proc.stderr


def test_site_runtime_in_this_environment(wheel_cache: Path) -> None:
    hits = list(R.find_in_distributions(sys.path))
    if not hits:
        if os.environ.get("CUMATRIX_REQUIRE_SITE_RUNTIME") == "1":
            raise AssertionError("CUMATRIX_REQUIRE_SITE_RUNTIME=1 but no runtime is installed here")
        pytest.skip("no nvidia-cuda-runtime installed in this environment")
    rt = R.from_site("site")
    assert rt.found_by.startswith("site-packages")
    assert rt.version >= 12000


def _fresh_venv(env_dir: Path) -> Path:
    """A venv that sees nothing of the base interpreter: what it imports comes from this test's own
    environment (a ``.pth`` naming its site-packages and the cumatrix package), never from what
    happens to be installed in the machine's Python."""
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_paths()
    lines = dict.fromkeys([PACKAGE_PARENT, ours["purelib"], ours["platlib"]])
    (Path(site) / "zz-test-environment.pth").write_text("".join(f"{p}\n" for p in lines))
    return Path(site)


def test_site_runtime_in_a_fresh_venv(tmp_path: Path, wheel_cache: Path, write_matrix: Any) -> None:
    # A real environment with the runtime wheel installed: what each tox runtime env holds.
    env_dir = tmp_path / "venv"
    site = _fresh_venv(env_dir)
    py = env_dir / "bin" / "python"
    wheel = R.fetch_wheel(CU130)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--target", str(site), str(wheel)], check=True)
    m = write_matrix("""
        runtimes: {site: {site: true}}
        drivers: [host]
        cases: [{name: a, argv: [true]}]
    """)
    # The base interpreter's own site-packages must not be on the venv's path (a fresh CI
    # machine has none of the project's packages there).
    code = ("import sys, sysconfig; "
            "print(sysconfig.get_paths(vars={'base': sys.base_prefix, 'platbase': sys.base_prefix})['purelib'])")
    base = subprocess.run([sys.executable, "-c", code],
                          capture_output=True, text=True, check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    path = subprocess.run([str(py), "-c", "import sys; print('\\n'.join(sys.path))"], env=env,
                          capture_output=True, text=True, check=True).stdout.split()
    assert base not in path
    # the site runtime is found and its version read without loading it into the harness
    code = ("from cumatrix.provision import runtimes as R; r = R.from_site('s'); "
            "print(r.version, r.found_by.split()[0], 'libcudart' in open('/proc/self/maps').read())")
    found = subprocess.run([str(py), "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert found == ["13000", "site-packages", "False"]
    proc = subprocess.run([str(py), "-m", "cumatrix", "run", str(m), "--out", str(tmp_path / "out"), "-q"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(ln) for ln in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    probe = next(r for r in recs if r.get("id") == "site/host/probe")
    assert probe["observed"]["data"]["runtime_version"] == 13000
    assert probe["fingerprint"]["runtime_file"].startswith(str(site))


def test_cumatrix_wheel_dir_stands_for_wheel_dir(tmp_path: Path, wheel_cache: Path, write_matrix: Any, cli: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = _wheel_dir(tmp_path, CU129)
    monkeypatch.setenv("CUMATRIX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CUMATRIX_WHEEL_DIR", str(wheels))
    assert R.fetch_wheel(CU129).parent == wheels
    with pytest.raises(RuntimeNotFound, match=r"no matching wheel in .*wheels"):  # no network with a wheel dir
        R.fetch_wheel(CU130)
    monkeypatch.setenv("CUMATRIX_WHEEL_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(UsageError, match=r"CUMATRIX_WHEEL_DIR=.*nowhere: no such directory"):
        R.resolve(Runtime(name="cu12.9", requirement=CU129))
    m = write_matrix(f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        cases: [{{name: a, argv: [true]}}]
    """)
    offline = {**DEAD_INDEX, "CUMATRIX_CACHE": str(tmp_path / "empty-cache"), "CUMATRIX_WHEEL_DIR": str(wheels)}
    proc = cli("run", m, "--out", tmp_path / "o", "-q", cwd=tmp_path, env=offline)
    assert proc.returncode == 0, proc.stdout + proc.stderr
