"""Every road to libcuda ends at the emulated driver: by every name, through DT_RPATH, by a full
path; sandboxed (the fork server and bubblewrap), in a container, and (as far as a search path
reaches) without a sandbox.

The "real" driver is a STAND-IN (tests/stand_ins/libcuda_stand_in.c, a 13.0 driver's answers)
installed as a real driver is: ``libcuda.so.580.95.05`` with ``libcuda.so.1`` and ``libcuda.so``
links beside it.  The programs (examples/jit/driver_roads.c), the interposer, gcc, the
dynamic loader, bubblewrap and dockerd are real.  A program exits 0 when the driver it reached
answers the version it was told to expect: 12080 is the emulated 12.8, 13000 the real one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from elftools.elf.elffile import ELFFile

from cumatrix.core.jobs import Job
from cumatrix.core.model import CudaVersion
from cumatrix.core.options import SandboxPolicy
from cumatrix.execute import driverview
from cumatrix.execute.docker_gpu import DRIVER_LIB_DIR, GpuAccess, driver_libraries
from cumatrix.provision import drivers as D
from cumatrix.provision import headers as H
from cumatrix.provision.runtimes import headers_for
from helpers.build import run_gcc
from helpers.sandbox import HOLDERS, hold_with, require_bwrap

STAND_INS = Path(__file__).resolve().parents[1] / "stand_ins"
REPO = Path(__file__).resolve().parents[2]
REAL_FILE = "libcuda.so.580.95.05"
EMULATED, REAL = "12080", "13000"

if shutil.which("gcc") is None:
    pytest.skip("gcc is not on PATH (the interposer is compiled with it)", allow_module_level=True)

pytestmark = pytest.mark.network  # introduction versions and the cells' runtime come from real wheels


def _open_dir(d: Path) -> Path:
    d.mkdir(exist_ok=True)
    d.chmod(0o755)  # sandboxed cells run as an unprivileged uid
    return d


@pytest.fixture(scope="module")
def driver_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in, installed under a driver's names."""
    d = _open_dir(tmp_path_factory.mktemp("driver"))
    run_gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", d / REAL_FILE, STAND_INS / "libcuda_stand_in.c")
    (d / "libcuda.so.1").symlink_to(REAL_FILE)
    (d / "libcuda.so").symlink_to(REAL_FILE)
    return d


@pytest.fixture(scope="module")
def programs(driver_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = _open_dir(tmp_path_factory.mktemp("programs"))
    src = REPO / "examples" / "jit" / "driver_roads.c"
    run_gcc("-o", d / "dlopen", src, "-ldl")
    # Old dtags: DT_RPATH, searched before LD_LIBRARY_PATH (docs/facts.md section 13).
    for name, rpath in (("rpath", driver_dir), ("rpath-container", Path(DRIVER_LIB_DIR))):
        run_gcc("-DLINKED", "-o", d / name, src, driver_dir / "libcuda.so.1", "-Wl,--disable-new-dtags",
                f"-Wl,-rpath,{rpath}")
    with (d / "rpath").open("rb") as fh:
        tags = {t.entry.d_tag for t in ELFFile(fh).get_section_by_name(".dynamic").iter_tags()}  # type: ignore[union-attr]
    assert "DT_RPATH" in tags
    assert "DT_RUNPATH" not in tags
    return {p.name: p for p in d.iterdir()}


@pytest.fixture(scope="module")
def interposer(driver_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> D.Interposer:
    inc = headers_for("13.5")
    return D.build_interposer(CudaVersion(12, 8), real_libcuda=driver_dir / "libcuda.so.1",
                              introductions=H.load_introductions(inc), real_driver_version=13000,
                              base_introductions=H.load_base_introductions(inc),
                              cache=_open_dir(tmp_path_factory.mktemp("interposers")))


def test_the_interposer_directory_has_every_name(interposer: D.Interposer) -> None:
    names = sorted(p.name for p in interposer.lib_dir.iterdir() if p.name.startswith("libcuda"))
    assert names == ["libcuda.so", "libcuda.so.1", REAL_FILE]
    for n in names:
        assert (interposer.lib_dir / n).resolve() == interposer.library.resolve()


def test_every_driver_file_the_loader_may_find_is_listed(interposer: D.Interposer, driver_dir: Path) -> None:
    files = driverview.driver_files(str(interposer.real_libcuda), str(interposer.library))
    assert str(driver_dir / REAL_FILE) in files
    assert str(interposer.library.resolve()) not in files


def _roads(programs: dict[str, Path], driver_dir: Path) -> dict[str, tuple[str, ...]]:
    """The cases: each a program and the version it expects, run under emulated-12.8."""
    return {
        "numba-style": (str(programs["dlopen"]), EMULATED, "libcuda.so", "libcuda.so.1"),
        "soname": (str(programs["dlopen"]), EMULATED, "libcuda.so.1"),
        "versioned-name": (str(programs["dlopen"]), EMULATED, REAL_FILE),
        "dt-rpath": (str(programs["rpath"]), EMULATED),
        "full-path": (str(programs["dlopen"]), EMULATED, str(driver_dir / "libcuda.so.1")),
    }


def _run(tmp_path: Path, driver_dir: Path, cases: dict[str, tuple[str, ...]], policy: SandboxPolicy,
         monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Every case as a command cell of a real run (the orchestrator, its provisioner and the
    local backend), the stand-in found as the host's driver; the records by case name."""
    from cumatrix.host.fingerprint import FoundLibcuda  # the search's result type, here only
    from cumatrix.load.matrix import cells as matrix_cells  # the run's own parts, here only
    from cumatrix.load.matrix import load as load_matrix
    from cumatrix.orchestrate import Orchestrator
    from cumatrix.provision import cell as provision_cell

    _open_dir(tmp_path)
    # The driver's directory on the search path after the interposer's, as the host's own
    # library directory is: a name the interposer's directory lacks is found there.
    m = tmp_path / "m.yaml"
    m.write_text(yaml.safe_dump({
        "runtimes": {"cu12.9": {"wheel": "nvidia-cuda-runtime-cu12==12.9.79"}}, "drivers": ["emulated-12.8"],
        "probe": False,
        "cases": [{"name": n, "argv": list(argv), "env": {"LD_LIBRARY_PATH": str(driver_dir)}}
                  for n, argv in cases.items()]}))
    monkeypatch.setattr(provision_cell, "search_real_libcuda",
                        lambda _log: FoundLibcuda(path=driver_dir / "libcuda.so.1", found_by="stand-in"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    orch = Orchestrator(matrix=load_matrix(m), policy=policy)
    orch._host_fp = {"driver_version": 13000}  # the stand-in's, as the fingerprint would report it
    out = {}
    try:
        for cell in matrix_cells(orch.matrix):
            out[cell.id.split("/")[-1]] = orch.run(cell).record
    finally:
        orch.close()
    return out


@pytest.mark.parametrize("holder", HOLDERS)
def test_sandboxed_every_road_ends_at_the_emulated_driver(holder: str, programs: dict[str, Path], driver_dir: Path,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_bwrap()
    want = hold_with(holder, monkeypatch)
    recs = _run(tmp_path, driver_dir, _roads(programs, driver_dir), SandboxPolicy(sandbox="on"), monkeypatch)
    assert {n: r.stderr_tail.strip() for n, r in recs.items()} == dict.fromkeys(  # type: ignore[attr-defined]
        _roads(programs, driver_dir), f"version={EMULATED}")
    for name, rec in recs.items():
        assert rec.observed.outcome == "ok", name  # type: ignore[attr-defined]
        assert rec.fingerprint["sandbox"] == want, name  # type: ignore[attr-defined]
        assert "emulation" not in (rec.fingerprint.get("missing_evidence") or [])  # type: ignore[attr-defined]


#: numba-cuda's own driver lookup (``libcuda.so`` first, then ``libcuda.so.1``, then both in
#: /usr/lib and /usr/lib64), run as numba-cuda runs it, reporting the version it reached.
_NUMBA = ("import ctypes, sys; from numba.cuda.cudadrv.driver import load_driver, locate_driver_and_loader; "
          "dll, path = load_driver(*locate_driver_and_loader()); v = ctypes.c_int(); "
          "dll.cuDriverGetVersion(ctypes.byref(v)); print(f'version={v.value}', file=sys.stderr); "
          "sys.exit(0 if str(v.value) == sys.argv[1] else 1)")


@pytest.fixture(scope="module")
def numba_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with numba-cuda from PyPI (its driver lookup runs without a GPU); the test skips
    where it does not install."""
    venv = _open_dir(tmp_path_factory.mktemp("numba-cuda")) / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    python = venv / "bin" / "python"
    try:
        got = subprocess.run([str(python), "-m", "pip", "install", "-q", "numba-cuda"], capture_output=True,
                             text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip("numba-cuda did not install within 10 minutes")
    if got.returncode != 0:
        pytest.skip(f"numba-cuda does not install here: {got.stderr.strip()[-300:]}")
    return python


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "no-sandbox"])
def test_numba_cudas_own_driver_lookup_reaches_the_emulated_driver(sandboxed: bool, numba_python: Path,
                                                                  driver_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if sandboxed:
        require_bwrap()
    policy = SandboxPolicy(sandbox="on" if sandboxed else "off")
    [rec] = _run(tmp_path, driver_dir, {"numba-cuda": (str(numba_python), "-c", _NUMBA, EMULATED)}, policy,
                 monkeypatch).values()
    # The lookup reached the emulated driver (the program's exit status says so; the cell's
    # outcome may name a CUDA runtime numba-cuda loaded from the host's toolkit besides).
    assert rec.stderr_tail.strip() == f"version={EMULATED}"  # type: ignore[attr-defined]
    assert rec.observed.exit_status == 0  # type: ignore[attr-defined]


def test_without_a_sandbox_the_search_path_reaches_it_and_the_record_says_where_it_stops(
        programs: dict[str, Path], driver_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = _roads(programs, driver_dir)
    # What the loader searches before LD_LIBRARY_PATH, or not at all, reaches the real driver
    # where the cell has no mount namespace: the record must say so.
    cases["dt-rpath"] = (cases["dt-rpath"][0], REAL)
    cases["full-path"] = (*cases["full-path"][:1], REAL, *cases["full-path"][2:])
    recs = _run(tmp_path, driver_dir, cases, SandboxPolicy(sandbox="off"), monkeypatch)
    assert {n: r.stderr_tail.strip() for n, r in recs.items()} == {  # type: ignore[attr-defined]
        n: f"version={argv[1]}" for n, argv in cases.items()}
    for name, rec in recs.items():
        assert rec.observed.outcome == "ok", name  # type: ignore[attr-defined]
        fp = rec.fingerprint  # type: ignore[attr-defined]
        assert "emulation" in fp["missing_evidence"], name
        why = next(w for w in fp["missing_evidence_why"] if w.startswith("emulation:"))
        assert "search path only" in why
        assert "DT_RPATH" in why


def test_the_run_header_says_emulation_follows_the_search_path_only() -> None:
    from cumatrix.core.model import Driver  # the header's input, here only
    from cumatrix.orchestrate import run_header

    class _M:  # the two fields of a matrix the header reads besides its drivers
        path, sha256 = "m.yaml", "0"
        drivers = (Driver(name="host"), Driver(name="emulated-12.8", emulated=CudaVersion(12, 8)))

    def head(sandbox: str | None, backend: str = "local") -> dict[str, object]:
        return run_header(_M(), [], backend=backend, argv=[], host=None, fingerprint={}, run_id="x",  # type: ignore[arg-type]
                          sandbox=sandbox)

    assert str(head("off")["driver_emulation"]).startswith("search-path-only: ")
    assert "driver_emulation" in head("none: bubblewrap is not installed")
    assert "driver_emulation" not in head("namespaces")
    assert "driver_emulation" not in head("bubblewrap")
    assert "driver_emulation" not in head(None, backend="docker")


@pytest.mark.parametrize("mode", ["device-nodes", "nvidia-runtime"])
def test_in_a_container_every_road_ends_at_the_emulated_driver(mode: str, interposer: D.Interposer,
                                                              programs: dict[str, Path], driver_dir: Path) -> None:
    """The docker backend with the GPU reached as on a host without the NVIDIA runtime (device
    nodes, the driver's files bound under DRIVER_LIB_DIR: here the stand-in's), and as on a
    host with it, where an emulated cell is given the same instead of the toolkit's hook (which
    would mount the real libcuda over the interposer's place; no toolkit runs here)."""
    docker = pytest.importorskip("docker")
    from cumatrix.execute.docker import DockerBackend

    try:
        docker.from_env(timeout=30).ping()
    except Exception as e:  # noqa: BLE001  any failure to reach the daemon means: no docker here
        if os.environ.get("CUMATRIX_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_DOCKER=1 but no Docker daemon answers: {e}")
        pytest.skip(f"no Docker daemon answers ({type(e).__name__})")
    repo = Path(__file__).resolve().parents[2]
    built = subprocess.run(["bash", str(repo / "containers" / "build-base.sh")], capture_output=True, text=True,
                           timeout=900, check=False)
    if built.returncode != 0:
        pytest.skip(f"containers/build-base.sh failed: {built.stderr.strip()[-300:]}")
    base = built.stdout.strip().splitlines()[-1]
    libs = driver_libraries(driver_dir / "libcuda.so.1")
    assert {inside.rsplit("/", 1)[1] for _, inside in libs} == {"libcuda.so", "libcuda.so.1", REAL_FILE}
    gpu = GpuAccess(mode="device-nodes", libraries=libs) if mode == "device-nodes" else GpuAccess(mode=mode)
    inside = f"{DRIVER_LIB_DIR}/libcuda.so.1"
    cases = {
        "numba-style": (str(programs["dlopen"]), EMULATED, "libcuda.so", "libcuda.so.1"),
        "soname": (str(programs["dlopen"]), EMULATED, "libcuda.so.1"),
        "dt-rpath": (str(programs["rpath-container"]), EMULATED),
        "full-path": (str(programs["dlopen"]), EMULATED, inside),
        "toolkit-dir": (str(programs["dlopen"]), EMULATED, "/usr/local/nvidia/lib64/libcuda.so.1"),
    }
    interposer.lib_dir.chmod(0o755)  # the container's user reads it
    seen = {}
    with DockerBackend(base, gpu=gpu) as be:
        for name, argv in cases.items():
            job = Job(cell_id=f"none/emulated-12.8/{name}", kind="command", argv=argv, image=base, timeout=120,
                      lib_path=(str(interposer.lib_dir),),
                      mounts=(str(interposer.lib_dir), str(programs["dlopen"].parent)),
                      interposer=str(interposer.library), real_driver=str(interposer.real_libcuda))
            res = be.run_job(job)
            seen[name] = res.stderr_tail.strip()
            if mode == "nvidia-runtime":  # the toolkit's hook, where it is the default runtime, stays out
                assert be._environment(job, be._image_facts(base), True)["NVIDIA_VISIBLE_DEVICES"] == "void"
                assert "device_requests" not in be._gpu_kwargs(True, job)
    assert seen == dict.fromkeys(cases, f"version={EMULATED}")


def test_a_program_that_runs_the_interposer_by_hand_still_reaches_a_driver(interposer: D.Interposer) -> None:
    """Outside any cell (no private path), the interposer reaches the real driver by its own
    path, as before: emulation without a mount namespace keeps working."""
    code = ("import ctypes; v = ctypes.c_int(); ctypes.CDLL('libcuda.so').cuDriverGetVersion(ctypes.byref(v)); "
            "print(v.value)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          env=dict(os.environ, LD_LIBRARY_PATH=str(interposer.lib_dir)))
    assert proc.stdout.strip() == EMULATED, proc.stderr


@pytest.fixture
def system_driver(tmp_path: Path) -> Iterator[Path]:
    """The stand-in installed under a directory the sandbox shows as part of the system (/opt),
    as a real driver is under /usr/lib: the interposer is bound over a file inside a read-only
    system directory, not over a directory of the job's own."""
    d = Path("/opt") / f"cumatrix-test-driver-{uuid.uuid4().hex[:8]}"
    try:
        d.mkdir(mode=0o755)
    except OSError as e:
        pytest.skip(f"cannot make a directory under /opt here: {e}")
    try:
        run_gcc("-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", d / REAL_FILE, STAND_INS / "libcuda_stand_in.c")
        (d / "libcuda.so.1").symlink_to(REAL_FILE)
        (d / "libcuda.so").symlink_to(REAL_FILE)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("holder", HOLDERS)
def test_sandboxed_a_driver_in_a_system_directory_is_covered(holder: str, system_driver: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    require_bwrap()
    hold_with(holder, monkeypatch)
    progs = _open_dir(tmp_path / "programs")
    src = REPO / "examples" / "jit" / "driver_roads.c"
    run_gcc("-o", progs / "dlopen", src, "-ldl")
    run_gcc("-DLINKED", "-o", progs / "rpath", src, system_driver / "libcuda.so.1", "-Wl,--disable-new-dtags",
            f"-Wl,-rpath,{system_driver}")
    cases = {"numba-style": (str(progs / "dlopen"), EMULATED, "libcuda.so", "libcuda.so.1"),
             "dt-rpath": (str(progs / "rpath"), EMULATED),
             "full-path": (str(progs / "dlopen"), EMULATED, str(system_driver / "libcuda.so.1"))}
    recs = _run(tmp_path / "run", system_driver, cases, SandboxPolicy(sandbox="on"), monkeypatch)
    assert {n: r.stderr_tail.strip() for n, r in recs.items()} == dict.fromkeys(cases, f"version={EMULATED}")
