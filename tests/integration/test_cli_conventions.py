"""What a new user meets on the command line: honest exit codes when nothing ran, --json
documents on stdout, --lf/--ff, gate -q, init, validate's suggestions and --check-wheels.

Every command is the real ``cumatrix`` in a subprocess over real runtime wheels.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cumatrix.host.fingerprint import host_fingerprint

RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"
HAS_GPU = host_fingerprint().get("driver_version") is not None
Cli = Callable[..., subprocess.CompletedProcess[str]]

MATRIX = f"""
runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}
drivers: [host, emulated-12.4]
cases:
  - {{name: fine, argv: [true]}}
  - {{name: fails, argv: [sh, -c, "exit 3"]}}
  - {{name: also-fine, argv: [true]}}
"""


@pytest.fixture
def matrix(write_matrix: Callable[..., Path], wheel_cache: Path) -> Path:
    return write_matrix(MATRIX)


def _ids(out: Path) -> list[str]:
    return [json.loads(ln)["id"] for ln in (out / "results.jsonl").read_text().splitlines()
            if ln.strip() and json.loads(ln).get("type") == "cell"]


# --------------------------------------------------------------------------- nothing ran


@pytest.mark.network
def test_no_cell_selected_exits_5_unless_allow_empty(cli: Cli, matrix: Path, tmp_path: Path) -> None:
    r = cli("run", matrix, "--out", tmp_path / "o", "-k", "nosuchcell", "-q", cwd=tmp_path)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "EMPTY" in r.stderr
    assert "nosuchcell" in r.stderr
    assert "--allow-empty" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("run", matrix, "--out", tmp_path / "o", "-k", "nosuchcell", "-q", "--allow-empty", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.network
@pytest.mark.skipif(HAS_GPU, reason="with a driver here the emulated cells run instead of skipping")
def test_every_selected_cell_skipped_exits_5_and_the_headline_says_why(cli: Cli, matrix: Path, tmp_path: Path) -> None:
    r = cli("run", matrix, "--out", tmp_path / "o", "-k", "emulated-12.4 and fine", "-q", cwd=tmp_path)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "NOTHING TESTED — 0 of 2 cells tested; 2 skipped (2 skipped:no-cuda-driver: " in r.stdout
    assert "nothing was tested" in r.stderr
    r = cli("run", matrix, "--out", tmp_path / "o2", "-k", "emulated-12.4 and fine", "-q", "--allow-empty", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(HAS_GPU, reason="this host has a driver: the GPU entries run instead")
def test_repro_bug_on_a_host_that_cannot_run_it_writes_a_skeleton(cli: Cli, tmp_path: Path) -> None:
    r = cli("repro", "--bug", "sglang-driver-dispatch", "--out", "reports", cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    report = tmp_path / "reports" / "sglang-driver-dispatch.md"
    text = report.read_text()
    assert text.startswith("# sglang-driver-dispatch: not run here")
    command = text.split("## Command to run on a host that can", 1)[1].split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert command == "cumatrix repro --bug sglang-driver-dispatch --out reports"
    assert "SGLang PR 23172" in text
    assert "cu12.9/host/driver-dispatch/h12.8/kv-16k-d2h" in text
    # An absolute --out does not travel to another host: the command uses the default.
    r = cli("repro", "--bug", "sglang-driver-dispatch", "--out", tmp_path / "abs", cwd=tmp_path)
    assert r.returncode == 3
    assert "--out repro\n" in r.stdout + "\n"


@pytest.mark.network
@pytest.mark.skipif(HAS_GPU, reason="this host has a driver: the GPU entries run instead")
def test_repro_all_exits_1_when_an_entry_could_not_run_unless_allow_missing(cli: Cli, wheel_cache: Path,
                                                                            tmp_path: Path) -> None:
    r = cli("repro", "--all", "--out", tmp_path / "a", cwd=tmp_path, timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not run here" in r.stdout
    assert "--allow-missing" in r.stderr
    r = cli("repro", "--all", "--allow-missing", "--out", tmp_path / "b", cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "vllm-cuda13-build: reproduced" in r.stdout  # the build-only entry did run


# --------------------------------------------------------------------------- --json, --lf/--ff


@pytest.mark.network
def test_run_json_prints_results_json_alone_on_stdout(cli: Cli, matrix: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    r = cli("run", matrix, "--out", out, "--json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)  # one document, nothing else
    assert doc == json.loads((out / "results.json").read_text())
    assert doc["verdict"] == "FAIL"
    assert doc["counts"]["fail"] == 1
    assert re.search(r"^cumatrix: FAIL — \d+ of 8 cells tested: 1 did not meet expectations; ", r.stderr,
                     re.MULTILINE)  # the headline went to stderr
    empty = cli("run", matrix, "--out", tmp_path / "e", "--json", "-k", "nosuchcell", cwd=tmp_path)
    assert empty.returncode == 5
    assert json.loads(empty.stdout)["verdict"] == "EMPTY"


@pytest.mark.network
def test_last_failed_and_failed_first(cli: Cli, matrix: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    first = cli("run", matrix, "--out", out, "-q", cwd=tmp_path)
    assert first.returncode == 1
    every = _ids(out)
    lf = cli("run", matrix, "--out", out, "--lf", "-q", cwd=tmp_path)
    assert lf.returncode == 1
    assert "1 cell(s) failed in the previous run, running only those" in lf.stderr
    assert _ids(out) == ["cu12.9/host/fails"]
    ff = cli("run", matrix, "--out", out, "--ff", "-q", cwd=tmp_path)
    assert ff.returncode == 1
    ran = _ids(out)
    assert ran[0] == "cu12.9/host/fails"
    assert sorted(ran) == sorted(every)
    both = cli("run", matrix, "--out", out, "--lf", "--ff", cwd=tmp_path)
    assert both.returncode == 2
    assert "exclude each other" in both.stderr


def test_doctor_and_validate_json_are_one_document(cli: Cli, write_matrix: Callable[..., Path]) -> None:
    doc = json.loads(cli("doctor", "--json").stdout)
    assert isinstance(doc, dict)
    good = write_matrix(MATRIX, name="good.yaml")
    r = cli("validate", good, "--json", "--list")
    assert r.returncode == 0
    v = json.loads(r.stdout)
    assert v["ok"] is True
    assert v["cells"] == len(v["cell_ids"]) == 8
    assert v["problems"] == []
    bad = write_matrix(MATRIX.replace("[host, emulated-12.4]", "[host, emulatd-12.4]"), name="bad.yaml")
    r = cli("validate", bad, "--json")
    assert r.returncode == 2
    v = json.loads(r.stdout)
    assert v["ok"] is False
    assert v["problems"][0]["line"] == 2
    assert "emulated-12.4" in v["problems"][0]["message"]


# --------------------------------------------------------------------------- validate


BAD = """\
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host, emulatd-12.8]
builds: ["12.7"]
variants: [proc-address]
workloads:
  - {name: kv, direction: d2h, block_bytes: 16KiB, blocks: 4}
cases:
  - {name: a, argv: [true]}
expect:
  - {case: a, outcome: "exti:1"}
"""


def test_validate_suggests_from_each_axis_and_sorts_by_place(cli: Cli, write_matrix: Callable[..., Path]) -> None:
    m = write_matrix(BAD)
    r = cli("validate", m)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith(f"{m}:3:")
    assert "did you mean 'emulated-12.8'?" in lines[0]
    assert lines[1].startswith(f"{m}:4:")
    assert "did you mean '12.8'?" in lines[1]
    assert lines[2].startswith(f"{m}:11:")
    assert "did you mean 'exit:1'?" in lines[2]
    places = [tuple(int(x) for x in ln.split(":")[1:3]) for ln in lines]
    assert places == sorted(places)


@pytest.mark.network
def test_check_wheels_fails_a_version_that_does_not_exist(cli: Cli, write_matrix: Callable[..., Path],
                                                          wheel_cache: Path, tmp_path: Path) -> None:
    m = write_matrix(f"""
        runtimes:
          cu12.9: {{wheel: {RUNTIME}}}
          cu12.9x: {{wheel: nvidia-cuda-runtime-cu12==12.9.999}}
        drivers: [host]
        cases: [{{name: a, argv: [true]}}]
    """)
    assert cli("validate", m).returncode == 0  # the shape is fine
    r = cli("validate", m, "--check-wheels", timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"{m}:3:")
    assert "12.9.999" in r.stderr
    # Offline: the wheel directory (then the cache, as a run looks) holds no 12.9.999 either.
    empty = tmp_path / "wheels"
    empty.mkdir()
    r = cli("validate", m, "--check-wheels", "--wheel-dir", empty)
    assert r.returncode == 2
    assert r.stderr.startswith(f"{m}:3:")
    assert str(empty) in r.stderr


@pytest.mark.network
def test_check_wheels_looks_up_an_environments_pins_on_the_index(cli: Cli, write_matrix: Callable[..., Path]) -> None:
    m = write_matrix(f"""
        runtimes:
          env: {{requirements: ["{RUNTIME}"]}}
          env-bad: {{requirements: ["nvidia-cuda-runtime-cu12==12.9.998"]}}
        drivers: [host]
        cases: [{{name: a, argv: [true]}}]
    """)
    r = cli("validate", m, "--check-wheels", timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{m}:3:"), lines
    assert "no version 12.9.998 of nvidia-cuda-runtime-cu12 on the package index" in lines[0]
    assert "12.9.79" in lines[0]  # the versions that do exist, newest first


# --------------------------------------------------------------------------- gate -q, init


def test_gate_quiet_and_json(cli: Cli, tmp_path: Path) -> None:
    import zipfile

    w = tmp_path / "demo_pure-1.0-py3-none-any.whl"
    with zipfile.ZipFile(w, "w") as zf:
        zf.writestr("demo_pure/__init__.py", "")
        zf.writestr("demo_pure-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo_pure\nVersion: 1.0\n")
        zf.writestr("demo_pure-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("demo_pure-1.0.dist-info/RECORD", "")
    loud = cli("gate", w, "--static-only")
    quiet = cli("gate", w, "--static-only", "-q")
    assert loud.returncode == quiet.returncode == 0, loud.stderr + quiet.stderr
    assert quiet.stdout.startswith("static audit:")
    assert len(quiet.stdout) < len(loud.stdout)
    j = cli("gate", w, "--static-only", "--json")
    doc = json.loads(j.stdout)
    assert j.returncode == 0
    assert doc["verdict"] == "PASS"
    assert doc["static"]["type"] == "static"
    assert "static audit:" in j.stderr


def test_init_writes_a_matrix_and_a_workflow_and_refuses_to_overwrite(cli: Cli, tmp_path: Path) -> None:
    import yaml

    (tmp_path / "setup.cfg").write_text("[metadata]\nname = My.Package\n")
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "my_package-1.0-py3-none-any.whl").write_bytes(b"")
    r = cli("init", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "package My.Package (from setup.cfg, imported as my_package)" in r.stdout
    matrix = (tmp_path / "matrix.yaml").read_text()
    assert '"import my_package"' in matrix
    assert cli("validate", tmp_path / "matrix.yaml").returncode == 0
    wf = yaml.safe_load((tmp_path / ".github" / "workflows" / "cumatrix-nightly.yml").read_text())
    steps = " ".join(str(s.get("run", "")) for s in wf["jobs"]["run"]["steps"])
    assert "cumatrix run matrix.yaml" in steps
    assert "cumatrix gate dist/*.whl" in steps
    lint = shutil.which("actionlint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if lint is not None:  # the test extras install it
        checked = subprocess.run([lint, ".github/workflows/cumatrix-nightly.yml"], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=120, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    before = (tmp_path / "matrix.yaml").stat().st_mtime_ns
    again = cli("init", cwd=tmp_path)
    assert again.returncode == 2
    assert "--force" in again.stderr
    assert (tmp_path / "matrix.yaml").stat().st_mtime_ns == before
    assert cli("init", "--force", cwd=tmp_path).returncode == 0


@pytest.mark.network
def test_run_with_no_matrix_here_runs_the_bundled_default_and_says_so(cli: Cli, wheel_cache: Path,
                                                                       tmp_path: Path) -> None:
    # A fresh install in an empty directory: the default matrix `run --help` names travels with
    # the package (one of its cells, to keep this short).
    out = tmp_path / "o"
    r = cli("run", "-k", "cu12.9/host/import-ctypes", "--out", out, "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("cumatrix: no matrix.yaml in ")
    assert "default matrix bundled with cumatrix" in first
    assert _ids(out) == ["cu12.9/host/import-ctypes"]
    assert "no such matrix file" not in r.stderr
    # A matrix.yaml in the directory is still the one that runs, and a named file that is missing is exit 2.
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    here = cli("validate", "--list", "matrix.yaml", cwd=tmp_path)
    assert here.returncode == 0
    missing = cli("run", "nosuch.yaml", cwd=tmp_path)
    assert missing.returncode == 2
    assert "nosuch.yaml: no such matrix file" in missing.stderr


def test_init_workflow_installs_cumatrix_as_the_readme_does(cli: Cli, tmp_path: Path) -> None:
    # cumatrix is not on the package index: the README installs it from its repository, and so
    # does the workflow (test_first_hour runs the step against a clone).
    import yaml

    from cumatrix.front.init import INSTALL_COMMAND, REPOSITORY

    assert INSTALL_COMMAND in (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mypkg"\n')
    assert cli("init", cwd=tmp_path).returncode == 0
    wf = yaml.safe_load((tmp_path / ".github" / "workflows" / "cumatrix-nightly.yml").read_text())
    runs = [str(s.get("run", "")) for s in wf["jobs"]["run"]["steps"]]
    install = next(r for r in runs if "install" in r and "cumatrix" in r)
    assert f'.venv/bin/python -m pip install "git+{REPOSITORY}' in install, install
    assert "cumatrix==" not in install
    assert not any("install . cumatrix" in r for r in runs)
    assert any(r.strip() == "python -m pip install ." for r in runs)  # the project, as its own step


def test_init_workflow_parses_and_names_its_steps_in_order(cli: Cli, tmp_path: Path) -> None:
    # cumatrix's venv first (its bin/ goes on PATH for the steps after it), the project into that
    # venv (the matrix's case imports it under the harness's interpreter), then doctor, validate, run.
    import yaml

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "mypkg"\n')
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "mypkg-1.0-py3-none-any.whl").write_bytes(b"")
    assert cli("init", cwd=tmp_path).returncode == 0
    assert '"import mypkg"' in (tmp_path / "matrix.yaml").read_text()
    wf = yaml.safe_load((tmp_path / ".github" / "workflows" / "cumatrix-nightly.yml").read_text())
    steps = wf["jobs"]["run"]["steps"]
    assert str(steps[0]["uses"]).startswith("actions/checkout@")
    assert [s.get("name") for s in steps[1:]] == ["install cumatrix", "install mypkg", "doctor",
                                                  "validate the matrix", "run", "summary", "gate the wheel",
                                                  "upload"]
    assert "$GITHUB_PATH" in steps[1]["run"]  # the project's pip, and every cumatrix after it, is the venv's
    assert steps[2]["run"].strip() == "python -m pip install ."
    assert steps[3]["run"].strip() == "cumatrix doctor"
    assert steps[4]["run"].strip() == "cumatrix validate matrix.yaml --check-wheels"


def test_init_names_a_project_and_works_without_a_python_one(cli: Cli, tmp_path: Path) -> None:
    import yaml

    bare = tmp_path / "my-cuda-lib"
    bare.mkdir()
    r = cli("init", cwd=bare)
    assert r.returncode == 0, r.stderr
    assert "package my-cuda-lib (from the directory's name" in r.stdout
    assert cli("validate", bare / "matrix.yaml").returncode == 0
    wf = yaml.safe_load((bare / ".github" / "workflows" / "cumatrix-nightly.yml").read_text())
    runs = [str(s.get("run", "")) for s in wf["jobs"]["run"]["steps"]]
    assert not any(r.strip() == "python -m pip install ." for r in runs)  # nothing for pip to install
    named = tmp_path / "named"
    named.mkdir()
    (named / "pyproject.toml").write_text('[project]\nname = "declared"\n')
    r = cli("init", "--name", "other.name", cwd=named)
    assert r.returncode == 0, r.stderr
    assert "package other.name (from --name, imported as other_name)" in r.stdout
    assert '"import other_name"' in (named / "matrix.yaml").read_text()
    bad = cli("init", "--name", "no/slash", "--force", cwd=named)
    assert bad.returncode == 2
    assert "--name 'no/slash'" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_init_reads_setup_py_without_running_it(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "setup.py").write_text("raise SystemExit('setup.py was run')\nsetup(name='from-setup-py')\n")
    r = cli("init", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "package from-setup-py (from setup.py" in r.stdout, r.stderr
