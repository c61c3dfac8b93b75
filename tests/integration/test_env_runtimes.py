"""Environment runtimes: real uv environments built from real PyPI requirements.

``{requirements: [cuda-bindings==12.9.*, nvidia-cuda-runtime-cu12==12.9.79]}`` becomes a
virtual environment built once per content hash, hard-linked from uv's cache; offline it
is built from a directory that ``cumatrix fetch`` filled.  Downloads are cached under
XDG_CACHE_HOME (uv's cache sits beside cumatrix's).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core.errors import RuntimeNotFound
from cumatrix.core.model import Runtime
from cumatrix.provision import runtimes as R
from helpers.wheels import make_wheel

pytestmark = pytest.mark.network

REQS = ("cuda-bindings==12.9.*", "nvidia-cuda-runtime-cu12==12.9.79")
DEAD_INDEX = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
              "UV_INDEX_URL": "http://127.0.0.1:9/simple", "UV_DEFAULT_INDEX": "http://127.0.0.1:9/simple"}


def test_an_environment_runtime_is_built_once_and_its_libcudart_is_the_runtime(wheel_cache: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)
    rt = R.from_environment("env12.9", REQS)
    assert rt.version == 12090
    assert rt.wheel_version == "12.9.79"
    assert rt.batch_exported
    assert rt.env_dir is not None
    assert rt.libcudart.is_relative_to(rt.env_dir)
    assert any(i.startswith("cuda-bindings==12.9.") for i in rt.installed)
    assert "nvidia-cuda-runtime-cu12==12.9.79" in rt.installed
    # the environment's own interpreter imports what its requirements brought (and nothing of ours)
    code = "import cuda.bindings, importlib.util as u; print(cuda.bindings.__version__, u.find_spec('cumatrix') is None)"
    proc = subprocess.run([str(rt.python), "-c", code],
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 0, proc.stderr
    version, isolated = proc.stdout.split()
    assert version.startswith("12.9.")
    assert isolated == "True"
    # hard-linked from uv's cache, not copied
    assert rt.libcudart.stat().st_nlink >= 2
    # once per content hash: the same requirements reuse it, another set gets its own
    stamp = (rt.env_dir / ".complete").stat().st_mtime_ns
    again = R.from_environment("other-name", tuple(reversed(REQS)))
    assert again.env_dir == rt.env_dir
    assert (rt.env_dir / ".complete").stat().st_mtime_ns == stamp
    other = R.from_environment("env13", ("nvidia-cuda-runtime==13.0.96",))
    assert other.env_dir != rt.env_dir
    assert other.version == 13000
    assert dict(rt.cell_env(path="/usr/bin"))["PATH"] == f"{rt.env_dir}/bin:/usr/bin"


def test_an_environment_without_a_runtime_is_a_clear_error(wheel_cache: Path) -> None:
    rt = Runtime(name="nocuda", requirements=("cuda-pathfinder==1.9.1",), where="m.yaml:3:14")
    with pytest.raises(RuntimeNotFound, match=r"^m\.yaml:3:14: runtimes\.nocuda: the environment "
                                              r"cuda-pathfinder==1\.9\.1 holds no libcudart"):
        R.resolve(rt)


def _pure_wheel(d: Path, name: str, version: str, requires: list[str]) -> Path:
    """A real (pure-Python) wheel, as a project under test would hand to the gate."""
    return make_wheel(d, name, {f"{name}/__init__.py": b"import cuda.pathfinder\nVERSION = 'ok'\n"},
                      version=version, requires=requires, purelib=True, compression=zipfile.ZIP_STORED)


def test_the_gate_installs_a_wheel_with_its_dependencies_into_an_environment(tmp_path: Path,
                                                                             wheel_cache: Path) -> None:
    wheel = _pure_wheel(tmp_path / "dist", "userpkg", "0.1", ["cuda-pathfinder>=1.3"])
    rt = Runtime(name="env12.9", requirements=REQS)
    base = R.resolve(rt)
    inst = R.install_into_environment(rt, [wheel])
    assert inst.env_dir != base.env_dir
    assert "userpkg==0.1" in inst.installed
    assert "userpkg==0.1" not in base.installed  # the matrix's environment stays as built
    assert inst.version == 12090
    proc = subprocess.run([str(inst.python), "-c", "import userpkg; print(userpkg.VERSION)"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_fetch_then_an_offline_run_builds_the_environment_from_the_wheel_dir(tmp_path: Path, wheel_cache: Path,
                                                                            write_matrix: Any, cli: Any) -> None:
    m = write_matrix("""
        runtimes:
          cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
          env12.9: {requirements: [cuda-bindings==12.9.*, nvidia-cuda-runtime-cu12==12.9.79]}
        drivers: [host]
        builds: ["13.0"]
        cases:
          - {name: load, argv: [python3, -c, "import ctypes, os; ctypes.CDLL(os.environ['CUMATRIX_CUDART'])"]}
          - {name: inside, argv: [python, -c, "import sys; print(sys.prefix)"]}
    """)
    dest = tmp_path / "wheels"
    proc = cli("fetch", m, "--dest", dest, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = sorted(p.name for p in dest.glob("*.whl"))
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert any(n.startswith("nvidia_cuda_runtime_cu12-12.9.79-") for n in names)
    assert any(n.startswith("nvidia_cuda_runtime-13.0.96-") for n in names)  # headers of builds: 13.0
    assert any(n.startswith("cuda_bindings-12.9.") and f"-{tag}-" in n for n in names), names
    assert any(n.startswith("cuda_pathfinder-") for n in names)  # a dependency of cuda-bindings
    # The offline host: empty caches (cumatrix's and uv's), a dead index, only the wheel directory.
    offline = {**DEAD_INDEX, "XDG_CACHE_HOME": str(tmp_path / "fresh-cache"), "CUMATRIX_CACHE": "",
               "UV_CACHE_DIR": "", "CUMATRIX_WHEEL_DIR": str(dest)}
    proc = cli("run", m, "--out", tmp_path / "out", "-q", cwd=tmp_path, env=offline, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(ln) for ln in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    probe = next(r for r in recs if r.get("id") == "env12.9/host/probe")
    assert probe["observed"]["data"]["runtime_version"] == 12090
    assert probe["fingerprint"]["runtime_file"].startswith(str(tmp_path / "fresh-cache" / "cumatrix" / "envs"))
    assert next(r for r in recs if r.get("id") == "env12.9/host/load")["status"] == "pass"
    # a command cell of an environment runtime runs inside the environment (its python first on PATH)
    inside = next(r for r in recs if r.get("id") == "env12.9/host/inside")
    assert inside["status"] == "pass", inside
    env_dir = Path(inside["stdout_tail"].strip())
    assert env_dir.parent == tmp_path / "fresh-cache" / "cumatrix" / "envs"
    outside = next(r for r in recs if r.get("id") == "cu12.9/host/inside")
    assert Path(outside["stdout_tail"].strip()) != env_dir  # a wheel runtime's cell stays where it was


def test_fetch_for_another_python(tmp_path: Path, wheel_cache: Path, write_matrix: Any, cli: Any) -> None:
    other = "3.12" if sys.version_info[:2] != (3, 12) else "3.13"
    m = write_matrix("""
        runtimes: {env: {requirements: [cuda-bindings==12.9.*, nvidia-cuda-runtime-cu12==12.9.79]}}
        drivers: [host]
        cases: [{name: a, argv: [true]}]
    """)
    proc = cli("fetch", m, "--dest", tmp_path / "w", "--python-version", other, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [p.name for p in (tmp_path / "w").glob("cuda_bindings-*.whl")]
    assert names, names
    assert all(f"-cp{other.replace('.', '')}-" in n for n in names), names
    proc = cli("fetch", m, "--dest", tmp_path / "w", "--python-version", "three", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--python-version three" in proc.stderr


def test_nothing_of_a_package_runs_on_the_host_while_building(tmp_path: Path, wheel_cache: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUMATRIX_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    runtime = R.fetch_wheel("nvidia-cuda-runtime-cu12==12.9.79")
    (wheels / runtime.name).write_bytes(runtime.read_bytes())
    marker = tmp_path / "RAN"
    # A wheel with a .pth file: Python runs its import line whenever the environment's interpreter starts.
    evil = _pure_wheel(tmp_path / "dist", "pthpkg", "1.0", [])
    with zipfile.ZipFile(evil, "a") as zf:
        zf.writestr("zz_pthpkg.pth", f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n")
    rt = R.from_environment("env", ("nvidia-cuda-runtime-cu12==12.9.79",), wheel_dir=wheels, extra_wheels=[evil])
    assert "pthpkg==1.0" in rt.installed
    assert rt.version == 12090
    assert not marker.exists(), "the environment's interpreter was started on the host"
    subprocess.run([str(rt.python), "-c", "pass"], check=True, timeout=60)  # the .pth is live: the test can fail
    assert marker.read_text() == "ran"
    # A source distribution would run its build backend on the host: refused (--no-build).
    sdist = wheels / "buildme-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for name, text in {"buildme-1.0/setup.py": f"open({str(tmp_path / 'BUILT')!r}, 'w')\n"
                                                    "from setuptools import setup; setup(name='buildme', version='1.0')\n",
                           "buildme-1.0/PKG-INFO": "Metadata-Version: 2.1\nName: buildme\nVersion: 1.0\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(RuntimeNotFound, match=r"uv failed[\s\S]*buildme") as e:
        R.from_environment("env", ("buildme==1.0", "nvidia-cuda-runtime-cu12==12.9.79"), wheel_dir=wheels)
    assert not (tmp_path / "BUILT").exists(), str(e.value)
