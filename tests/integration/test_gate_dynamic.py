"""``cumatrix gate``'s dynamic stage: real wheels installed with pip and imported per cell.

The wheels hold real gcc-built shared objects (the sources of ``test_gate``) and are gated
through the real command line.  This machine has no NVIDIA driver: that is exactly where a
wheel with ``DT_NEEDED libcuda.so.1`` breaks (CPU-only CI, docs builds).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sysconfig
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from packaging.tags import sys_tags
from test_gate import SOURCES, STUB_LIBCUDA  # the static stage's gcc-built ELF files

from cumatrix.core.model import Case, Cell
from cumatrix.front.gate.cli import unsupported_pairing, wheel_packages
from cumatrix.predict.oracle import HostFacts
from cumatrix.provision import runtimes
from cumatrix.results.history import History
from helpers.build import shared_library
from helpers.results import read_cells, read_records
from helpers.wheels import make_wheel

pytestmark = pytest.mark.network  # runtime wheels, fetched once into the cache

REPO = Path(__file__).resolve().parents[2]
Cli = Callable[..., subprocess.CompletedProcess[str]]

MATRIX_TWO = """\
version: 1
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
  cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}
drivers: [host]
variants: [proc-address]          # ignored by the gate: only the pairings count
builds: ["12.8"]
workloads:
  - {name: kv-4k-d2h, direction: d2h, block_bytes: 4096, blocks: 8}
"""
MATRIX_ONE = """\
version: 1
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host]
"""
# Loads the package's shared object when the package is imported, as an extension would.
INIT = b"""\
import ctypes, os
_lib = ctypes.CDLL(os.path.join(os.path.dirname(__file__), "%s"))
"""
SEGFAULT = "python3 -c 'import ctypes; ctypes.string_at(0)'"


PLATFORM_TAG = "py3-none-" + sysconfig.get_platform().replace("-", "_").replace(".", "_")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gate-dynamic")
    # The stub is a STAND-IN for the driver at link time only (as the toolkit's stubs/libcuda.so):
    # it gives the .so its DT_NEEDED libcuda.so.1 and is never on any cell's library path.
    (d / "stubs").mkdir()
    shared_library(d / "stubs/libcuda.so", STUB_LIBCUDA, "-Wl,-soname,libcuda.so.1")
    proc = shared_library(d / "_proc.so", *SOURCES["proc"][:1], *SOURCES["proc"][1])
    direct = shared_library(d / "_direct.so", *SOURCES["direct"][:1], *SOURCES["direct"][1])
    return {
        # resolves the driver at run time (cuGetProcAddress): imports without a driver
        "clean": make_wheel(d, "demo_clean", {
            "demo_clean/__init__.py": INIT % b"_proc.so",
            "demo_clean/_proc.so": proc.read_bytes(),
            "demo_clean/util.py": b"VALUE = 1\n",
        }, top_level=True, tag=PLATFORM_TAG),
        # DT_NEEDED libcuda.so.1; no top_level.txt, so packages come from RECORD
        "needs_libcuda": make_wheel(d, "demo_needs", {
            "demo_needs/__init__.py": INIT % b"_direct.so",
            "demo_needs/_direct.so": direct.read_bytes(),
        }, top_level=False, tag=PLATFORM_TAG),
        # prints a verdict-looking line, then fails to import: the line must not make it pass
        "forger": make_wheel(d, "demo_forger", {
            "demo_forger/__init__.py": b'print(\'CUMATRIX-RESULT {"outcome": "ok", "path": "n/a"}\', flush=True)\n'
                                       b'raise ImportError("demo_forger needs a library this host lacks")\n',
        }, top_level=True, tag=PLATFORM_TAG),
        # claims a CUDA 13 runtime in the rtld-audit log its own process writes, then fails to
        # import: a forged log line must not turn the failure into runtime-not-used
        "audit_forger": make_wheel(d, "demo_auditforger", {
            "demo_auditforger/__init__.py": b'import os\n'
                                            b'with open(os.environ["CUMATRIX_AUDIT_LOG"], "a") as f:\n'
                                            b'    f.write(f"o\\t{os.getpid()}\\tlibcudart.so.13\\t/opt/x/libcudart.so.13\\n")\n'
                                            b'raise ImportError("demo_auditforger cannot import")\n',
        }, top_level=True, tag=PLATFORM_TAG),
        # needs a dependency that nothing installs (the cells run without --constraints)
        "needs_dep": make_wheel(d, "demo_needsdep", {
            "demo_needsdep/__init__.py": b"import cumatrix_absent_dependency\n",
        }, top_level=True, tag=PLATFORM_TAG, requires=["cumatrix-absent-dependency>=1"]),
        # for an interpreter no test runs on: pip refuses it here
        "other_python": make_wheel(d, "demo_old", {"demo_old/__init__.py": b""}, top_level=True,
                                   tag="cp27-cp27mu-manylinux1_x86_64"),
    }


@pytest.fixture(scope="module")
def matrices(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gate-matrices")
    (d / "two.yaml").write_text(MATRIX_TWO)
    (d / "one.yaml").write_text(MATRIX_ONE)
    return {"two": d / "two.yaml", "one": d / "one.yaml"}


@pytest.fixture(scope="module")
def clean_run(wheels: dict[str, Path], matrices: dict[str, Path], cli: Cli, wheel_cache: Path,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("clean") / "out"
    r = cli("gate", wheels["clean"], "--matrix", matrices["two"], "--out", out, timeout=300)
    return r, out


def test_clean_wheel_imports_on_every_runtime(clean_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    r, out = clean_run
    assert r.returncode == 0, r.stdout + r.stderr
    cells = read_cells(out)
    assert sorted(cells) == ["cu12.9/host/import-demo_clean", "cu13.0/host/import-demo_clean"]
    for rec in cells.values():
        assert rec["status"] == "pass"
        assert rec["observed"]["outcome"] == "ok"
        # the package came from the cell's own install target, not from anywhere else
        assert "imported demo_clean from " in str(rec["stdout_tail"])
        assert f"{os.sep}gate-sites{os.sep}" in str(rec["stdout_tail"])
    sites = sorted(p.name for p in (out / "gate-sites").iterdir() if not p.name.startswith("."))
    assert sites == ["cu12.9__host__import-demo_clean", "cu13.0__host__import-demo_clean"]
    # one progress line per cell on stderr
    assert sum("import-demo_clean" in line and "PASS" in line for line in r.stderr.splitlines()) == 2


def test_reports_put_static_findings_first(clean_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = clean_run
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## Static audit: pass")
    assert summary.index("**cumatrix: PASS**") > summary.index("## Static audit")
    results = json.loads((out / "results.json").read_text())
    schema = json.loads(resources.files("cumatrix").joinpath("report/schema.json").read_text())
    jsonschema.validate(results, schema)
    static = [e for e in results["extra"] if e.get("type") == "static"]
    assert len(static) == 1
    assert static[0]["wheels"][0]["elves"] == ["demo_clean/_proc.so"]
    junit = (out / "junit.xml").read_text()
    assert 'name="static demo_clean-1.0-' in junit
    assert "demo_clean-1.0-" in junit
    assert "::demo_clean/_proc.so" in junit
    assert junit.count("<testcase") == 3  # two cells + one ELF file
    assert (out / "index.html").is_file()
    assert (out / "static.json").is_file()


def test_the_gate_run_is_recorded_in_the_history(clean_run: tuple[subprocess.CompletedProcess[str], Path],
                                                 history_file: Path) -> None:
    from cumatrix.results.history import History

    _, out = clean_run
    run_id = json.loads((out / "results.json").read_text())["run"]["run_id"]
    with History.open(history_file, create=False) as h:
        stored = h.run(run_id)
    assert (stored.kind, stored.failed) == ("gate", 0)
    # Keyed by the matrix and the wheels gated (test_each_wheel_has_its_own_history_series),
    # not by the matrix alone.
    assert stored.digest != json.loads((out / "results.json").read_text())["run"]["matrix_sha256"]


def test_libcuda_wheel_fails_without_a_driver(wheels: dict[str, Path], matrices: dict[str, Path],
                                              cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli("gate", wheels["needs_libcuda"], "--matrix", matrices["one"], "--min-driver", "12.8",
            "--out", out, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "WARNING  needs-libcuda" in r.stdout  # the static stage only warns ...
    rec = read_cells(out)["cu12.9/host/import-demo_needs"]  # ... the import proves it
    assert rec["status"] == "fail"
    assert rec["observed"]["outcome"] == "exit:1"
    assert "libcuda.so.1: cannot open shared object file" in str(rec["stderr_tail"])
    assert "libcuda.so.1: cannot open shared object file" in str(rec["mismatch"])
    summary = (out / "summary.md").read_text()
    assert summary.startswith("## Static audit: pass (0 errors, 1 warning)")
    assert "needs-libcuda" in summary
    assert "**cumatrix: FAIL**" in summary
    assert "cannot import demo_needs: OSError: libcuda.so.1: cannot open shared object file" in summary
    assert "FAIL cu12.9/host/import-demo_needs" in r.stdout


def test_smoke_segfault_is_a_crash_and_other_cells_run(
        wheels: dict[str, Path], matrices: dict[str, Path], cli: Cli, wheel_cache: Path,
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli("gate", wheels["clean"], "--matrix", matrices["two"], "--smoke", SEGFAULT,
            "--out", out, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    cells = read_cells(out)
    assert list(cells) == ["cu12.9/host/import-demo_clean", "cu12.9/host/smoke-demo_clean",
                           "cu13.0/host/import-demo_clean", "cu13.0/host/smoke-demo_clean"]
    for rt in ("cu12.9", "cu13.0"):
        assert cells[f"{rt}/host/import-demo_clean"]["status"] == "pass"
        smoke = cells[f"{rt}/host/smoke-demo_clean"]
        assert smoke["status"] == "fail"
        assert smoke["observed"]["outcome"] == "crash:SIGSEGV"  # type: ignore[index]
    assert json.loads((out / "results.json").read_text())["counts"]["fail"] == 2
    assert [r["type"] for r in read_records(out)][-1] == "end"


def test_a_wheel_cannot_forge_its_own_pass(wheels: dict[str, Path], matrices: dict[str, Path],
                                           cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli("gate", wheels["forger"], "--matrix", matrices["one"], "--out", out, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    rec = read_cells(out)["cu12.9/host/import-demo_forger"]
    assert rec["status"] == "fail"
    assert rec["observed"]["outcome"] == "exit:1"
    assert "CUMATRIX-RESULT" in str(rec["stdout_tail"])  # kept as log, nothing more


def test_a_wheel_cannot_forge_the_audit_log_into_a_skip(wheels: dict[str, Path], matrices: dict[str, Path],
                                                         cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    """Before, a wheel whose import failed after writing one line to its audit log passed the
    gate (exit 0: skipped:runtime-not-used).  The kernel's record decides: its import failed."""
    out = tmp_path / "out"
    r = cli("gate", wheels["audit_forger"], "--matrix", matrices["one"], "--out", out, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    rec = read_cells(out)["cu12.9/host/import-demo_auditforger"]
    assert rec["status"] == "fail", rec
    assert rec["observed"]["outcome"] == "exit:1", rec  # type: ignore[index]
    assert "/opt/x/libcudart.so.13" in rec["fingerprint"]["audit_claims_not_backed"]  # type: ignore[index]


def test_wheel_for_another_python_is_skipped(wheels: dict[str, Path], matrices: dict[str, Path],
                                            cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = cli("gate", wheels["other_python"], wheels["clean"], "--matrix", matrices["one"],
            "--out", out, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    cells = read_cells(out)
    old = cells["cu12.9/host/import-demo_old"]
    assert old["status"] == "skip"
    assert old["observed"]["outcome"] == "skipped:wheel-not-for-this-python"  # type: ignore[index]
    assert "matching interpreter" in str(old["observed"]["detail"])  # type: ignore[index]
    assert cells["cu12.9/host/import-demo_clean"]["status"] == "pass"


def test_a_gate_that_installed_nothing_is_not_green(wheels: dict[str, Path], matrices: dict[str, Path],
                                                    cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    """Before, a wheel this Python cannot install ran none of its cells and the gate printed
    `pass: 0 of 1 cells failed`, exit 0: a release gate that tested nothing was green."""
    out = tmp_path / "out"
    r = cli("gate", wheels["other_python"], "--matrix", matrices["one"], "--out", out, "--json", timeout=300)
    assert r.returncode == 5, r.stdout + r.stderr
    verdict = next(line for line in r.stderr.splitlines() if line.startswith("dynamic stage: NOTHING"))
    assert "NOTHING TESTED — 0 of 1 cells ran (1 skipped: wheel-not-for-this-python)" in verdict
    assert "cp27-cp27mu-manylinux1_x86_64" in verdict  # the Python to gate it under
    assert "--static-only" in verdict
    assert json.loads(r.stdout)["verdict"] == "NOTHING TESTED"
    cell = read_cells(out)["cu12.9/host/import-demo_old"]
    assert cell["status"] == "skip"
    # Decided from the tags (packaging.tags) before pip runs, not from pip's error text: pip is
    # never started for it, and the reason names the wheel's tags and this interpreter's.
    assert f"installing {wheels['other_python'].name}" not in r.stdout + r.stderr
    own = str(next(iter(sys_tags())))
    assert "tags (cp27-cp27mu-manylinux1_x86_64)" in str(cell["observed"]["detail"])  # type: ignore[index]
    assert own in str(cell["observed"]["detail"])  # type: ignore[index]
    # The documented way to gate it here: the static audit alone.
    r = cli("gate", wheels["other_python"], "--static-only", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_missing_dependency_says_how_to_supply_it(wheels: dict[str, Path], matrices: dict[str, Path],
                                                     cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    """Before, the cell failed with `No module named ...` and nothing said that --constraints exists."""
    r = cli("gate", wheels["needs_dep"], "--matrix", matrices["one"], "--out", tmp_path / "out", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    fail = r.stdout.split("FAIL cu12.9/host/import-demo_needsdep", 1)[1]
    hint = " ".join(fail.split())
    assert "hint: 'cumatrix_absent_dependency' is not in the wheel" in hint, r.stdout
    assert "--constraints FILE" in hint


def test_each_wheel_has_its_own_history_series(wheels: dict[str, Path], matrices: dict[str, Path],
                                               cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    """Before, every gate run of one matrix shared one series: a wheel's report listed another
    wheel's cells as newly not run."""
    hist = tmp_path / "history.sqlite"
    for name in ("clean", "other_python", "clean"):
        cli("gate", wheels[name], "--matrix", matrices["one"], "--out", tmp_path / name,
            "--history", hist, timeout=300)
    with History.open(hist, create=False) as h:
        runs = h.runs()
    assert len(runs) == 3
    assert runs[0].digest == runs[2].digest  # the same wheel again: its own series goes on
    assert runs[1].digest != runs[0].digest


def test_bad_dynamic_input_exits_2(wheels: dict[str, Path], cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nruntimes: {cu12.9: {whee: x}}\ndrivers: [host]\n")
    for argv, expect in (
        (["--matrix", tmp_path / "missing.yaml"], "no such matrix file"),
        (["--matrix", bad], "bad.yaml:2:"),
        (["--constraints", tmp_path / "missing.txt"], "--constraints"),
    ):
        r = cli("gate", wheels["clean"], *argv, "--out", tmp_path / "out", timeout=120)
        assert r.returncode == 2, r.stdout + r.stderr
        assert expect in r.stderr
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "out").exists()


def test_top_level_packages(wheels: dict[str, Path]) -> None:
    assert wheel_packages(wheels["clean"]) == ("demo_clean",)  # top_level.txt
    assert wheel_packages(wheels["needs_libcuda"]) == ("demo_needs",)  # RECORD


@pytest.mark.parametrize(("runtime", "driver", "host", "skipped"), [
    (13000, "host", 12090, True),  # newer major than the driver: cudaErrorInsufficientDriver
    (12090, "host", 13000, False),  # older runtime on a newer driver
    (12090, "host", 12040, False),  # minor-version compatibility
    (13000, "emulated-12.8", 13000, True),  # the effective (emulated) driver counts
    (13000, "host", None, False),  # no driver: run it (it must import there)
])
def test_unsupported_pairing(runtime: int, driver: str, host: int | None, skipped: bool) -> None:
    cell = Cell(kind="command", runtime="rt", driver=driver,
                case=Case(name="import-x", argv=("true",)))
    why = unsupported_pairing(cell, HostFacts(driver_version=host), runtime)
    assert (why is not None) == skipped
    if why:
        assert "cudaErrorInsufficientDriver" in why
        assert "not run" in why


# --------------------------------------------------------------------------- docker

REQUIRED = os.environ.get("CUMATRIX_REQUIRE_DOCKER") == "1"


def _no_docker(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"CUMATRIX_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.mark.docker
def test_docker_backend_gates_the_clean_wheel(wheels: dict[str, Path], matrices: dict[str, Path],
                                              cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    import docker

    try:
        with contextlib.closing(docker.from_env(timeout=30)) as client:  # closed: an open client's socket outlives the check
            client.ping()
    except Exception as e:  # noqa: BLE001  any failure to reach the daemon means: no docker here
        _no_docker(f"no Docker daemon answers ({type(e).__name__}: {e})")
    base = subprocess.run(["bash", str(REPO / "containers" / "build-base.sh")],
                          capture_output=True, text=True, timeout=900, check=False)
    if base.returncode != 0:
        _no_docker(f"containers/build-base.sh failed: {base.stderr.strip()[-500:]}")
    image = base.stdout.strip().splitlines()[-1]
    runtimes.fetch_wheel("nvidia-cuda-runtime-cu12==12.9.79")  # the runtime image's wheel
    out = tmp_path / "out"
    r = cli("gate", wheels["clean"], "--matrix", matrices["one"], "--backend", "docker",
            "--base-image", image, "--smoke", "python3 -c 'import demo_clean.util'",
            "--out", out, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    cells = read_cells(out)
    assert sorted(cells) == ["cu12.9/host/import-demo_clean", "cu12.9/host/smoke-demo_clean"]
    for rec in cells.values():
        assert rec["status"] == "pass", rec
        fp = rec["fingerprint"]
        assert fp["backend"] == "docker"
        assert str(fp["image"]).startswith("cumatrix-rt")
    assert f"{os.sep}gate-sites{os.sep}" in str(cells["cu12.9/host/import-demo_clean"]["stdout_tail"])


def test_environment_runtime_installs_the_wheel_into_its_environment(
        wheels: dict[str, Path], cli: Cli, wheel_cache: Path, tmp_path: Path) -> None:
    m = tmp_path / "env.yaml"
    m.write_text("version: 1\nruntimes:\n  env12: {requirements: [nvidia-cuda-runtime-cu12==12.9.79]}\n"
                 "drivers: [host]\n")
    out = tmp_path / "out"
    r = cli("gate", wheels["clean"], "--matrix", m, "--out", out, "--no-sandbox", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rec = read_cells(out)["env12/host/import-demo_clean"]
    assert rec["status"] == "pass"
    # Imported from the environment built for this wheel (uv, hard-linked), not from a site dir.
    line = next(ln for ln in str(rec["stdout_tail"]).splitlines() if ln.startswith("imported demo_clean from "))
    env = Path(line.split(" from ", 1)[1]).resolve()
    assert any((p / "pyvenv.cfg").is_file() for p in env.parents), line


FORGE_GATE = r"""
import json, os, sys

out = sys.argv[1]
path = os.path.join(out, "results.jsonl")
lines = [line for line in open(path) if line.strip()]
for rt in ("cu12.9", "cu13.0"):
    lines.append(json.dumps({"schema": 1, "type": "cell", "id": f"{rt}/host/import-demo_needs", "status": "pass",
                             "mismatch": None, "expected": {"outcomes": ["ok"], "reason": "", "rule": ""},
                             "observed": {"outcome": "ok"}}) + "\n")
with open(path + ".new", "w") as f:
    f.write("".join(lines))
os.replace(path + ".new", path)
sys.exit(1)
"""


def test_an_unsandboxed_gate_cell_that_forges_the_results_is_refused(
        wheels: dict[str, Path], matrices: dict[str, Path], cli: Cli, wheel_cache: Path,
        tmp_path: Path) -> None:
    """A smoke command of a gate run without the sandbox rewrites the gate's results.jsonl,
    adding a pass of its own making for the import cell that failed before it: the gate's
    verdict and reports come from the records read back against what it sealed, so the forged
    pass is refused (``record edited``), never counted."""
    out = tmp_path / "out"
    forger = tmp_path / "forge.py"
    forger.write_text(FORGE_GATE)
    r = cli("gate", wheels["needs_libcuda"], "--matrix", matrices["two"], "--smoke", f"python3 {forger} {out}",
            "--out", out, "--no-sandbox", timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["verdict"] == "FAIL", doc["headline"]
    cells = {c["id"]: c for c in doc["cells"]}
    first = cells["cu12.9/host/import-demo_needs"]
    assert first["status"] == "fail", first
    assert "record edited" in (first["mismatch"] or ""), first
    assert "FAIL cu12.9/host/import-demo_needs" in r.stdout
