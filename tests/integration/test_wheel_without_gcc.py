"""A host without a C compiler (most GPU runners' images): the platform wheel's compiled spawn
helper and rtld-audit library give every cell the evidence a checkout has; without them the run
says what is missing before any cell and every record names it.

The compiler is hidden for real: the command runs in a mount namespace of its own
(``unshare -m``) in which every C compiler on PATH has an empty, non-executable file bind-mounted
over it, so ``shutil.which("gcc")`` finds nothing, and with a cache of its own, so that nothing
compiled before is found there either.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from cumatrix.binary.loader import loader_view
from cumatrix.execute.prebuilt import AUDIT, SPAWN
from cumatrix.provision.headers import load_introductions
from cumatrix.provision.prebuilt_driver import PREBUILT_NAME
from cumatrix.provision.runtimes import headers_for

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"
MATRIX = f"""\
version: 1
runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}
drivers: [host]
cases:
  - {{name: load-runtime, argv: [python3, -c, "import ctypes, os; ctypes.CDLL(os.environ['CUMATRIX_CUDART'])"],
     timeout: 60}}
"""
_COMPILER = re.compile(r"(cc|c89|c99|gcc|clang|tcc|x86_64-linux-gnu-gcc)(-[0-9.]+)?")


def _compilers() -> list[str]:
    found = set()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        try:
            entries = list(Path(d).iterdir())
        except OSError:
            continue
        for p in entries:
            if _COMPILER.fullmatch(p.name) and os.access(p, os.X_OK):
                found.add(str(p.resolve()))
    return sorted(found)


def without_compiler(argv: Sequence[str | Path], *, tmp: Path, env: dict[str, str],
                     cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``argv`` with every C compiler of this host hidden (see the module's docstring)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    empty = tmp / "no-compiler"
    empty.write_bytes(b"")
    empty.chmod(0o644)
    mounts = " && ".join(f"mount --bind {shlex.quote(str(empty))} {shlex.quote(c)}" for c in _compilers()) or "true"
    script = f'{mounts} && if command -v gcc || command -v cc; then exit 99; fi && exec "$@"'
    r = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", *map(str, argv)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0 and ("unshare failed" in r.stderr or "Operation not permitted" in r.stderr):
        pytest.skip(f"no mount namespace here: {r.stderr.strip()[:200]}")
    assert r.returncode != 99, "a compiler is still on PATH inside the namespace"
    return r


def _records(out: Path) -> dict[str, dict[str, object]]:
    docs = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines() if ln.strip()]
    return {d["id"]: d for d in docs if d.get("type") == "cell"}


def _env(tmp: Path, wheel_cache: Path) -> dict[str, str]:
    wheels = tmp / "wheels"
    wheels.mkdir()
    for w in (wheel_cache / "wheels").glob("nvidia_cuda_runtime*.whl"):  # the default matrix's too
        shutil.copy2(w, wheels / w.name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["XDG_CACHE_HOME"] = str(tmp / "fresh-cache")  # nothing compiled before is found
    if any(wheels.iterdir()):
        env["CUMATRIX_WHEEL_DIR"] = str(wheels)
    return env


@pytest.mark.network  # the wheel's isolated build and the fresh venv install from the index
def test_the_platform_wheel_observes_in_full_without_a_compiler(tmp_path: Path, wheel_cache: Path) -> None:
    given = os.environ.get("CUMATRIX_TEST_WHEEL")  # the release workflow's built (and repaired) wheel
    if given:
        wheel = Path(given)
    else:
        dist = tmp_path / "dist"
        built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
                               capture_output=True, text=True, timeout=600, check=False)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        (wheel,) = dist.glob("*.whl")
    assert re.search(r"-py3-none-(many)?linux_[a-z0-9_]+\.whl$", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        members = set(zf.namelist())
    assert {f"cumatrix/libexec/{n}" for n in (SPAWN, AUDIT, PREBUILT_NAME)} <= members
    if platform.machine() in ("x86_64", "aarch64"):
        # Built as a checkout builds it: no library of its own (a second libc in every process).
        with zipfile.ZipFile(wheel) as zf, zf.open(f"cumatrix/libexec/{AUDIT}") as lib:
            view = loader_view(ELFFile(io.BytesIO(lib.read())))
        assert view is not None
        assert view.needed == (), view
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True,
                         timeout=600, check=False)
    assert pip.returncode == 0, pip.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    (work / "m.yaml").write_text(MATRIX)
    env = _env(tmp_path, wheel_cache)
    r = without_compiler([venv / "bin" / "cumatrix", "run", "m.yaml", "--out", "o"], tmp=tmp_path, env=env, cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "evidence missing" not in r.stderr
    recs = _records(work / "o")
    assert set(recs) == {"cu12.9/host/probe", "cu12.9/host/load-runtime"}
    for rec in recs.values():
        fp = rec["fingerprint"]
        assert isinstance(fp, dict)
        assert fp.get("mappings_from") == "kernel", rec["id"]
        assert fp.get("trace"), rec["id"]
        assert "missing_evidence" not in fp
    case = recs["cu12.9/host/load-runtime"]["fingerprint"]
    assert isinstance(case, dict)
    assert case["runtime_version"] == 12090  # the cell's runtime, seen mapped by the kernel
    # Nothing was compiled on this host: the cache holds no spawn helper or audit library.
    assert not (tmp_path / "fresh-cache" / "cumatrix" / "bin").exists()
    assert not (tmp_path / "fresh-cache" / "cumatrix" / "audit").exists()

    # The default matrix bundled with the package, in an empty directory (one runtime's cells,
    # for time): the command cell observed in full; the reference variants, compiled here, are
    # skipped:no-compiler, and the run says so first.
    empty = tmp_path / "empty"
    empty.mkdir()
    d = without_compiler([venv / "bin" / "cumatrix", "run", "-k", "cu12.9 and not emulated", "--out", "o"],
                         tmp=tmp_path, env=env, cwd=empty)
    assert d.returncode == 0, d.stdout[-3000:] + d.stderr[-3000:]
    assert "default matrix bundled with cumatrix" in d.stderr.splitlines()[0]
    assert "skipped:no-compiler" in d.stderr
    recs = _records(empty / "o")
    case = recs["cu12.9/host/import-ctypes"]
    assert case["status"] == "pass"
    fp = case["fingerprint"]
    assert isinstance(fp, dict)
    assert fp.get("mappings_from") == "kernel"
    assert fp.get("trace")
    swaps = [r for cid, r in recs.items() if len(cid.split("/")) >= 4]  # runtime/driver/variant/headers/...
    assert swaps
    assert {r["observed"]["outcome"] for r in swaps} == {"skipped:no-compiler"}

    # An emulated driver, from the wheel's prebuilt interposer, with no compiler: in front of
    # the STAND-IN driver (this host has no GPU), built with gcc before the compiler is hidden.
    drv = tmp_path / "driver"
    drv.mkdir()
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(drv / "libcuda.so.1"),
                    str(ROOT / "tests" / "stand_ins" / "libcuda_stand_in.c")], check=True, timeout=120)
    (tmp_path / "intro.json").write_text(json.dumps(load_introductions(headers_for("13.5"))))
    e = without_compiler([venv / "bin" / "python", "-c", _EMULATE, drv / "libcuda.so.1", tmp_path / "intro.json",
                          tmp_path / "drivers"], tmp=tmp_path, env=env, cwd=empty)
    assert e.returncode == 0, e.stderr[-3000:]
    got = json.loads(e.stdout)
    assert got["from"].startswith(str(venv))
    assert got["prebuilt"] is True
    assert got["missing"] == ["cuStandInLoads", "cuStandInUntyped"]  # in no PFN_ typedef: not carried
    assert got["hidden"] == ["cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2"]
    assert got["probe"] == ["12040", "False", "True"]  # the version, the batch entry hidden, cuInit kept


# Inside the namespace without a compiler: an emulated 12.4 over the stand-in, then probed.
_EMULATE = r"""
import json, os, subprocess, sys
from pathlib import Path
from cumatrix.core.model import CudaVersion
from cumatrix.provision import drivers as D
intro = json.loads(Path(sys.argv[2]).read_text())
ip = D.build_interposer(CudaVersion(12, 4), real_libcuda=Path(sys.argv[1]), introductions=intro,
                        real_driver_version=13000, cache=Path(sys.argv[3]))
probe = ("import ctypes; c = ctypes.CDLL('libcuda.so.1'); v = ctypes.c_int(); c.cuDriverGetVersion(ctypes.byref(v)); "
         "print(v.value, hasattr(c, 'cuMemcpyBatchAsync'), hasattr(c, 'cuInit'))")
out = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, LD_LIBRARY_PATH=str(ip.lib_dir)),
                     capture_output=True, text=True, check=True).stdout.split()
print(json.dumps({"from": D.__file__, "prebuilt": ip.prebuilt, "missing": list(ip.missing),
                  "hidden": list(ip.hidden), "probe": out}))
"""


def test_without_the_compiled_parts_the_run_says_what_is_missing(tmp_path: Path, wheel_cache: Path) -> None:
    # This checkout's package has no libexec/ (an editable install, or a pure wheel): on a host
    # without a compiler the cells run unobserved, and the run says so, first and in every record.
    work = tmp_path / "work"
    work.mkdir()
    (work / "m.yaml").write_text(MATRIX)
    env = _env(tmp_path, wheel_cache)
    env["PYTHONPATH"] = str(ROOT / "src")
    r = without_compiler([sys.executable, "-m", "cumatrix", "run", "m.yaml", "--out", "o"], tmp=tmp_path,
                         env=env, cwd=work)
    lines = r.stderr.splitlines()
    assert lines[0].startswith("cumatrix: WARNING: evidence missing on this host: trace: "), r.stderr
    assert lines[1].startswith("cumatrix: WARNING: evidence missing on this host: audit: "), r.stderr
    for rec in _records(work / "o").values():
        fp = rec["fingerprint"]
        assert isinstance(fp, dict)
        assert fp["missing_evidence"] == ["trace", "audit"], rec["id"]
        assert not fp.get("trace")
