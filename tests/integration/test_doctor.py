"""``cumatrix doctor`` and ``cumatrix clean`` on this host: real tools, a real dockerd.

doctor's exit status follows its required checks; a tool taken off PATH is reported with its
fix; the docker backend finds the base image build-base.sh made by its label; clean removes
the cache and the untagged build stages it is pointed at.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import cumatrix
from cumatrix.execute.prebuilt import AUDIT, SPAWN
from cumatrix.provision import prebuilt_driver
from helpers.build import run_gcc

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ["python", "gcc", "runtimes", "gpu", "nvcc", "docker daemon", "base image", "debootstrap", "chromium",
          "sandbox", "evidence", "gdb", "slurm client"]


def test_doctor_json_lists_every_check_and_its_exit_status_follows_them(
        cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    r = cli("doctor", "--json", cwd=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert [c["name"] for c in doc["checks"]] == CHECKS
    required_missing = [c["name"] for c in doc["checks"] if c["required"] and c["status"] != "ok"]
    assert doc["ok"] is (not required_missing)
    assert r.returncode == (1 if required_missing else 0)
    assert all(c["fix"] for c in doc["checks"] if c["status"] != "ok")  # every miss says how to fix it
    # The host facts of the old --json stay.
    assert {"hostname", "driver_version", "gpus", "docker", "cached_runtimes"} <= set(doc)
    # --require makes an optional feature count: without a GPU, `--require gpu` fails.
    gpu = next(c for c in doc["checks"] if c["name"] == "gpu")
    r2 = cli("doctor", "--require", "gpu", cwd=tmp_path)
    assert r2.returncode == (0 if gpu["status"] == "ok" and not required_missing else 1)


def test_doctor_names_a_missing_compiler_with_its_fix(cli: Callable[..., subprocess.CompletedProcess[str]],
                                                      tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    r = cli("doctor", cwd=tmp_path, env={"PATH": str(empty)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[MISS] gcc" in r.stdout
    assert "apt-get install gcc" in r.stdout
    assert "[MISS] chromium" in r.stdout
    assert "apt-get install chromium" in r.stdout
    assert "[MISS] gdb" in r.stdout  # every optional tool a feature needs: repro's backtraces
    assert "apt-get install gdb" in r.stdout
    # submit --slurm and the scripts of plan --format slurm: optional, with the package to install.
    assert "[MISS] slurm client   sbatch, squeue, scontrol not on PATH" in r.stdout
    assert "fix (optional: slurm): apt-get install slurm-client" in r.stdout
    # No prebuilt driver interposer in this checkout: the emulated drivers need gcc, required.
    assert "fix (required: emulate, swap): apt-get install gcc (emulated drivers" in r.stdout
    # No compiler, and this checkout carries no compiled audit library: the cells would run observed in part.
    assert "[MISS] evidence       audit missing" in r.stdout
    assert "install a platform wheel of cumatrix" in r.stdout
    assert "required check(s) failed: gcc" in r.stdout
    assert "Traceback" not in r.stderr


def test_doctor_finds_slurms_client_where_it_is(cli: Callable[..., subprocess.CompletedProcess[str]],
                                                tmp_path: Path) -> None:
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        pytest.skip("no Slurm client here (apt-get install slurm-client)")
    doc = json.loads(cli("doctor", "--json", cwd=tmp_path).stdout)
    check = next(c for c in doc["checks"] if c["name"] == "slurm client")
    assert check["status"] == "ok"
    assert check["found"].startswith(f"{shutil.which('sbatch')}: slurm")  # sbatch --version
    assert shutil.which("squeue") in check["found"]
    assert check["features"] == ["slurm"]
    assert check["required"] is False
    hidden = cli("doctor", "--require", "slurm", cwd=tmp_path, env={"PATH": str(tmp_path)})
    assert hidden.returncode == 1
    assert "fix (required: slurm): apt-get install slurm-client" in hidden.stdout


def _package_with_libexec(tmp: Path) -> Path:
    """A copy of this cumatrix with the compiled parts a platform wheel's build (setup.py) puts
    in ``cumatrix/libexec/``, compiled as it does; the directory to put on PYTHONPATH."""
    site = tmp / "site"
    pkg = site / "cumatrix"
    shutil.copytree(Path(cumatrix.__file__).resolve().parent, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    libexec = pkg / "libexec"
    libexec.mkdir()
    run_gcc("-O2", "-o", libexec / SPAWN, *sorted((pkg / "csrc").glob("spawn*.c")))
    run_gcc("-shared", "-fPIC", "-O2", "-o", libexec / AUDIT, pkg / "csrc" / "audit.c")
    run_gcc(*prebuilt_driver.COMPILE_FLAGS, "-o", libexec / prebuilt_driver.PREBUILT_NAME,
            pkg / "data" / "interposer.c", "-ldl")
    return site


def test_beside_the_prebuilt_interposer_gcc_is_optional_and_says_what_it_still_builds(tmp_path: Path) -> None:
    """A platform wheel emulates drivers without a compiler: with no gcc on PATH, doctor says gcc
    is optional and what it would still build, and exits 0 (nothing required is missing)."""
    site = _package_with_libexec(tmp_path)
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env.update(PATH=str(empty), PYTHONPATH=str(site), XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "cumatrix", "doctor"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    interposer = site / "cumatrix" / "libexec" / prebuilt_driver.PREBUILT_NAME
    assert "[MISS] gcc" in r.stdout, r.stdout + r.stderr
    fix = next(ln for ln in r.stdout.splitlines() if "fix (" in ln and "apt-get install gcc" in ln)
    assert "fix (optional: swap): optional: emulated drivers use the prebuilt interposer" in fix
    assert str(interposer) in fix  # the copy's, not this checkout's: the copy is what ran
    assert "the reference's swap variants" in fix
    assert "the examples" in fix
    assert f"[ok  ] evidence       spawn helper and audit library in {interposer.parent}" in r.stdout
    assert r.returncode == 0, r.stdout + r.stderr
    assert "doctor: everything the required features need is here" in r.stdout
    # Where gcc is, it is found whatever the install carries.
    env["PATH"] = os.environ["PATH"]
    r = subprocess.run([sys.executable, "-m", "cumatrix", "doctor", "--json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    gcc = next(c for c in json.loads(r.stdout)["checks"] if c["name"] == "gcc")
    assert (gcc["status"], gcc["required"], gcc["features"]) == ("ok", False, ["swap"])


def test_doctor_checks_that_cells_can_be_sandboxed(cli: Callable[..., subprocess.CompletedProcess[str]],
                                                   tmp_path: Path) -> None:
    """``run`` sandboxes by default: doctor says whether it can here, with the fix where it
    cannot; ``--require sandbox`` makes that a failure (CI)."""
    ok = json.loads(cli("doctor", "--json", cwd=tmp_path).stdout)
    check = next(c for c in ok["checks"] if c["name"] == "sandbox")
    if check["status"] != "ok":
        pytest.skip(f"bubblewrap cannot run here: {check['found']}")
    assert "bubblewrap" in check["found"]
    r = cli("doctor", "--require", "sandbox", cwd=tmp_path, env={"CUMATRIX_BWRAP": str(tmp_path / "none")})
    assert r.returncode == 1, r.stdout
    line = next(ln for ln in r.stdout.splitlines() if "sandbox" in ln and "unsandboxed" in ln)
    assert str(tmp_path / "none") in line
    assert "fix (required: sandbox): install bubblewrap" in r.stdout


def test_doctor_refuses_an_unknown_feature(cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    r = cli("doctor", "--require", "gpu,warp-drive")
    assert r.returncode == 2
    assert "unknown feature warp-drive" in r.stderr
    assert "Traceback" not in r.stderr


def test_clean_cache_removes_the_cache_and_dry_run_keeps_it(
        cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / "x.whl").write_bytes(b"0" * 4096)
    r = cli("clean", "--cache", "--dry-run", env={"CUMATRIX_CACHE": str(cache)})
    assert r.returncode == 0
    assert f"would remove the cache {cache}" in r.stdout
    assert cache.is_dir()
    r = cli("clean", "--cache", env={"CUMATRIX_CACHE": str(cache)})
    assert r.returncode == 0
    assert f"removed the cache {cache}" in r.stdout
    assert not cache.exists()


def test_every_subcommand_help_has_an_example(cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    for sub in ("run", "validate", "plan", "report", "merge", "doctor", "build", "clean", "gate", "repro", "calibrate"):
        r = cli(sub, "--help")
        assert r.returncode == 0, sub
        assert "examples:" in r.stdout, sub
        assert f"cumatrix {sub}" in r.stdout.split("examples:")[1], sub


def test_report_defaults_to_out(cli: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path) -> None:
    r = cli("report", cwd=tmp_path)
    assert r.returncode == 2
    assert "out: no results.jsonl here" in r.stderr


# --------------------------------------------------------------------------- docker


@pytest.fixture
def client() -> Iterator[object]:
    import docker

    try:
        c = docker.from_env(timeout=60)
        c.ping()
    except Exception as e:  # noqa: BLE001  any failure to reach the daemon means: no docker here
        if os.environ.get("CUMATRIX_REQUIRE_DOCKER") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_DOCKER=1 but no Docker daemon answers ({e})")
        pytest.skip(f"no Docker daemon answers ({type(e).__name__}: {e})")
    yield c
    c.close()


@pytest.mark.docker
def test_the_docker_backend_finds_the_base_image_by_its_label(client: object) -> None:
    from cumatrix.execute.docker import DockerBackend, find_base_image

    proc = subprocess.run(["bash", str(ROOT / "containers" / "build-base.sh")], capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-500:]
    built = proc.stdout.strip().splitlines()[-1]
    import docker.errors

    # Other tests on the same daemon (xdist workers: test_clean_images) make and remove images
    # carrying the base label; one removed between the lookup and the inspection is looked up again.
    for _ in range(10):
        found = find_base_image(client)
        assert found is not None
        try:
            image = client.images.get(found)  # type: ignore[attr-defined]
            newest_or_built = found == built or image.attrs["Created"] >= client.images.get(built).attrs["Created"]  # type: ignore[attr-defined]
            with DockerBackend() as be:
                chosen = be.base_image
        except docker.errors.ImageNotFound:
            continue
        if chosen == found:
            break
    assert "cumatrix.base" in image.labels
    assert "cumatrix" not in image.labels
    assert newest_or_built
    assert chosen == found


@pytest.mark.docker
def test_clean_removes_untagged_build_stages(client: object, tmp_path: Path) -> None:
    from cumatrix.front.clean import remove_build_stages

    label = f"cumatrix.test.{uuid.uuid4().hex[:8]}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = b"stage test\n"
        ti = tarfile.TarInfo("etc/motd")
        ti.size = len(data)
        tf.addfile(ti, io.BytesIO(data))
    tag = f"cumatrix-test-stage:{label.rsplit('.', 1)[1]}"
    client.api.import_image_from_data(buf.getvalue(), repository=tag.split(":", maxsplit=1)[0], tag=tag.split(":")[1],  # type: ignore[attr-defined]
                                      changes=[f"LABEL {label}=1"])
    (tmp_path / "Dockerfile").write_text(f"FROM {tag} AS stage\nCOPY Dockerfile /x\nFROM {tag}\nCOPY --from=stage /x /y\n")
    final, _ = client.images.build(path=str(tmp_path), tag=f"{tag}-final", rm=True, pull=False)  # type: ignore[attr-defined]
    try:
        stages = client.images.list(filters={"dangling": True, "label": label})  # type: ignore[attr-defined]
        assert stages, "the multi-stage build left no untagged stage to clean"
        assert remove_build_stages(client, label=label, dry_run=True)
        assert client.images.list(filters={"dangling": True, "label": label})  # type: ignore[attr-defined]
        removed = remove_build_stages(client, label=label)
        assert removed
        assert client.images.list(filters={"dangling": True, "label": label}) == []
    finally:
        client.images.remove(final.id, force=True)  # type: ignore[attr-defined]
        client.images.remove(tag, force=True)  # type: ignore[attr-defined]
        remove_build_stages(client, label=label)
