"""`cumatrix run` end to end: bad cells, interrupted runs, resume, the bundled matrix, doctor, plan."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.build import undefined_symbol_program
from helpers.procs import gone

REPO = Path(__file__).resolve().parents[2]
RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"

pytestmark = pytest.mark.network  # every run provisions a real runtime wheel (cached after the first)


def cells(out: Path) -> list[dict[str, Any]]:
    recs = []
    for line in (out / "results.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a SIGKILL
        if rec.get("type") == "cell":
            recs.append(rec)
    return recs


@pytest.fixture(scope="module")
def bad_run(tmp_path_factory: pytest.TempPathFactory, wheel_cache: Path, cli: Any) -> dict[str, Any]:
    if shutil.which("gcc") is None:
        if os.environ.get("CUMATRIX_REQUIRE_GCC") == "1":
            raise RuntimeError("CUMATRIX_REQUIRE_GCC=1 but gcc is not on PATH")
        pytest.skip("gcc is not on PATH (the undefined-symbol cell is built with it)")
    d = tmp_path_factory.mktemp("bad")
    prog, old = undefined_symbol_program(d)
    py = sys.executable
    m = d / "m.yaml"
    m.write_text(f"""
runtimes:
  cu12.9: {{wheel: {RUNTIME}}}
drivers: [host]
cases:
  - {{name: segv, argv: [{py}, -c, "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]}}
  - {{name: abort, argv: [{py}, -c, "import os; os.abort()"]}}
  - {{name: hang, argv: [sh, -c, "sleep 300 & echo $! > {d}/grandchild; wait"], timeout: 1.5}}
  - {{name: exit3, argv: [sh, -c, "echo failing >&2; exit 3"]}}
  - {{name: flood, argv: [{py}, -c, "import sys; [sys.stdout.buffer.write(b'y' * (1 << 20)) for _ in range(20)]"]}}
  - {{name: undef, argv: [{prog}], env: {{LD_LIBRARY_PATH: {old}}}}}
  - {{name: fine, argv: [true]}}
expect:
  - {{case: segv, outcome: "crash:SIGSEGV"}}
  - {{case: abort, outcome: "crash:SIGABRT"}}
  - {{case: hang, outcome: timeout}}
  - {{case: undef, outcome: "undefined-symbol:shim_new"}}
""")
    out = d / "out"
    t0 = time.monotonic()
    # Unsandboxed (as runs were by default when this was written): the test reads the host pid
    # of hang's grandchild from a file the cell writes into its directory; a sandboxed cell has
    # neither (its own pid namespace, a read-only view).  The sandbox's own tests cover it.
    proc = cli("run", m, "--out", out, "-q", "--no-sandbox", cwd=d, timeout=120)
    return {"proc": proc, "out": out, "dir": d, "wall": time.monotonic() - t0,
            "cells": {r["id"]: r for r in cells(out)}}


def test_every_bad_cell_has_its_outcome(bad_run: dict[str, Any]) -> None:
    got = {i.split("/")[-1]: r["observed"]["outcome"] for i, r in bad_run["cells"].items()}
    assert got == {"probe": "skipped:no-cuda-driver", "segv": "crash:SIGSEGV", "abort": "crash:SIGABRT",
                   "hang": "timeout", "exit3": "exit:3", "flood": "ok", "undef": "undefined-symbol:shim_new",
                   "fine": "ok"}, bad_run["proc"].stderr
    # exit3 alone has no expect override: it is the one failure, so the run exits 1
    assert bad_run["proc"].returncode == 1
    assert [i for i, r in bad_run["cells"].items() if r["status"] == "fail"] == ["cu12.9/host/exit3"]
    assert "Traceback" not in bad_run["proc"].stderr


def test_bad_cells_details(bad_run: dict[str, Any]) -> None:
    c = {i.split("/")[-1]: r for i, r in bad_run["cells"].items()}
    assert "failing" in c["exit3"]["stderr_tail"]
    assert "undefined symbol: shim_new" in c["undef"]["observed"]["detail"]
    assert c["flood"]["timings"]["wall_s"] < 10
    assert len(c["flood"]["stdout_tail"]) <= 4096
    assert bad_run["wall"] < 60
    assert gone(int((bad_run["dir"] / "grandchild").read_text())), "hang's grandchild sleep survived the timeout"
    final = json.loads((bad_run["out"] / "results.json").read_text())
    assert sorted(r["id"] for r in final["cells"]) == sorted(bad_run["cells"])


INTERRUPTIBLE = """
runtimes:
  cu12.9: {{wheel: {rt}}}
drivers: [host]
probe: false
cases:
  - {{name: a, argv: [true]}}
  - {{name: b, argv: [true]}}
  - {{name: slow, argv: [sh, -c, "echo $$ > {d}/slow.pid; test -e {d}/go || exec sleep 120"]}}
  - {{name: d, argv: [true]}}
  - {{name: e, argv: [true]}}
"""


def _start_and_stop(tmp_path: Path, cli_env: Any, sig: signal.Signals) -> tuple[int, Path, Path, int]:
    m = tmp_path / "m.yaml"
    m.write_text(INTERRUPTIBLE.format(rt=RUNTIME, d=tmp_path))
    out = tmp_path / "out"
    # Unsandboxed, as bad_run is: the cell's host pid comes back through a file it writes.
    proc = subprocess.Popen([sys.executable, "-m", "cumatrix", "run", str(m), "--out", str(out), "-q", "--no-sandbox"],
                            cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pidfile = tmp_path / "slow.pid"
        end = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < end:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.2)  # the shell has exec'd sleep
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err
    return proc.returncode, m, out, int(pidfile.read_text())


def _resume_completes(tmp_path: Path, m: Path, out: Path, cli: Any) -> None:
    (tmp_path / "go").touch()
    proc = cli("run", m, "--out", out, "--resume", "-q", "--no-sandbox", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran_now = [r["id"] for r in cells(out)][2:]
    assert sorted(ran_now) == ["cu12.9/host/d", "cu12.9/host/e", "cu12.9/host/slow"]
    final = json.loads((out / "results.json").read_text())
    ids = [r["id"] for r in final["cells"]]
    assert sorted(ids) == sorted(f"cu12.9/host/{n}" for n in ["a", "b", "slow", "d", "e"])


def test_sigint_keeps_finished_cells_then_resume(tmp_path: Path, wheel_cache: Path, cli: Any, cli_env: Any) -> None:
    rc, m, out, slow = _start_and_stop(tmp_path, cli_env, signal.SIGINT)
    assert rc == 130
    assert [r["id"] for r in cells(out)] == ["cu12.9/host/a", "cu12.9/host/b"]
    assert gone(slow), "the interrupted cell's child is still running"
    _resume_completes(tmp_path, m, out, cli)


def test_sigterm_finishes_like_sigint(tmp_path: Path, wheel_cache: Path, cli: Any, cli_env: Any) -> None:
    rc, m, out, slow = _start_and_stop(tmp_path, cli_env, signal.SIGTERM)
    assert rc == 130
    assert [r["id"] for r in cells(out)] == ["cu12.9/host/a", "cu12.9/host/b"]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line]
    assert records[-1]["type"] == "end"
    assert records[-1]["interrupted"] is True
    assert (out / "results.json").is_file()
    assert (out / "summary.md").is_file()
    assert gone(slow), "the terminated run's cell child is still running"
    _resume_completes(tmp_path, m, out, cli)


def test_sigkill_keeps_finished_cells_then_resume(tmp_path: Path, wheel_cache: Path, cli: Any, cli_env: Any) -> None:
    rc, m, out, slow = _start_and_stop(tmp_path, cli_env, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    assert [r["id"] for r in cells(out)] == ["cu12.9/host/a", "cu12.9/host/b"]
    assert gone(slow), "the cell's child outlived the SIGKILLed harness"
    _resume_completes(tmp_path, m, out, cli)


def test_resume_with_nothing_left(tmp_path: Path, wheel_cache: Path, write_matrix: Any, cli: Any) -> None:
    m = write_matrix(f"""
        runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}
        drivers: [host]
        cases: [{{name: a, argv: [true]}}]
    """)
    assert cli("run", m, "--out", tmp_path / "o", "-q", cwd=tmp_path).returncode == 0
    proc = cli("run", m, "--out", tmp_path / "o", "--resume", "-q", cwd=tmp_path)
    assert proc.returncode == 0
    assert "nothing left to run" in proc.stderr


def test_no_cell_matches_k_exits_5(tmp_path: Path, wheel_cache: Path, write_matrix: Any, cli: Any) -> None:
    m = write_matrix(f"""
        runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}
        drivers: [host]
        cases: [{{name: a, argv: [true]}}]
    """)
    proc = cli("run", m, "--out", tmp_path / "o", "-k", "nosuchcell", "-q", cwd=tmp_path)
    assert proc.returncode == 5
    assert "nosuchcell" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_require_gpu_fails_cells_skipped_for_want_of_a_gpu(tmp_path: Path, wheel_cache: Path, write_matrix: Any,
                                                           cli: Any) -> None:
    if json.loads(cli("doctor", "--json").stdout).get("driver_version"):
        pytest.skip("this host has an NVIDIA driver: nothing is skipped for want of one")
    m = write_matrix(f"""
        runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}
        drivers: [host]
        cases: [{{name: a, argv: [true]}}]
    """)
    plain = cli("run", m, "--out", tmp_path / "plain", "-q", cwd=tmp_path)
    assert plain.returncode == 0, plain.stdout + plain.stderr  # the probe is a neutral skip
    strict = cli("run", m, "--out", tmp_path / "strict", "--require-gpu", "-q", cwd=tmp_path)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    probe = next(r for r in cells(tmp_path / "strict") if r["axes"]["kind"] == "probe")
    assert probe["status"] == "fail"
    assert "--require-gpu" in probe["mismatch"]
    assert next(r for r in cells(tmp_path / "strict") if r["axes"]["kind"] == "command")["status"] == "pass"
    env = cli("run", m, "--out", tmp_path / "env", "-q", cwd=tmp_path, env={"CUMATRIX_REQUIRE_GPU": "1"})
    assert env.returncode == 1


def test_bundled_matrix_runs_without_a_gpu(tmp_path: Path, wheel_cache: Path, cli: Any) -> None:
    bundled = REPO / "matrix.yaml"
    if not bundled.is_file():
        pytest.skip("no bundled matrix.yaml at the repository root")
    proc = cli("doctor", "--json")
    if json.loads(proc.stdout).get("driver_version"):
        pytest.skip("this host has an NVIDIA driver: GPU cells run for real (tests/gpu covers that)")
    proc = cli("run", bundled, "--out", tmp_path / "out", "-n", "2", "-q", cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recs = cells(tmp_path / "out")
    assert recs
    assert all(r["status"] != "fail" for r in recs)
    probes = [r for r in recs if r["axes"]["kind"] == "probe"]
    assert probes
    assert all(r["observed"]["outcome"] == "skipped:no-cuda-driver" for r in probes)
    # on the host driver the probe still loaded each runtime and read its version from the library
    for r in probes:
        name = r["axes"]["runtime"]
        if r["axes"]["driver"] == "host" and name.startswith("cu"):
            major, minor = name[2:].split(".")
            assert r["observed"]["data"]["runtime_version"] == int(major) * 1000 + int(minor) * 10, r["id"]
    for r in recs:
        if r["axes"]["kind"] == "swap":
            # Building needs no GPU: direct-link against CUDA 13 headers fails to compile anywhere.
            want = "build-error" if r["expected"]["rule"] == "direct-link-cuda13-build" else "skipped:no-cuda-driver"
            assert r["observed"]["outcome"] == want, r["id"]
        if r["axes"]["kind"] == "command":
            assert not r["observed"]["outcome"].startswith(("crash", "timeout", "harness-error")), r["id"]


def test_doctor_human_and_json(cli: Any) -> None:
    proc = cli("doctor")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("cumatrix ")
    fp = json.loads(cli("doctor", "--json").stdout)
    assert {"driver_version", "gpus", "docker", "cached_runtimes", "platform", "python"} <= set(fp)
    if not fp["driver_version"]:
        assert "driver      none found" in proc.stdout
        assert "GPU cells will be skipped:no-cuda-driver" in proc.stdout


PLAN = """
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host, emulated-12.4]
cases: [{name: a, argv: [true]}]
hosts:
  h200-580: {driver: "580.159", label: gpu-h200}
  a100-550: {driver: "550.163", label: gpu-a100}
"""


def test_plan_github_and_json(tmp_path: Path, cli: Any) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(PLAN)
    proc = cli("plan", f)
    assert proc.returncode == 0, proc.stderr
    inc = json.loads(proc.stdout)["include"]
    by = {e["host"]: e for e in inc}
    assert by["a100-550"]["runner"] == "gpu-a100"
    assert by["a100-550"]["k"] == "/host/ or /emulated-12.4/"
    assert by["h200-580"]["runner"] == "gpu-h200"
    assert by["h200-580"]["k"] == "/host/"
    data = json.loads(cli("plan", f, "--format", "json").stdout)
    assert data["cells_total"] == 4
    assert sum(h["cells"] for h in data["hosts"]) == 4 + 2


def test_plan_idle_host_exits_2(tmp_path: Path, cli: Any) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(PLAN.replace("drivers: [host, emulated-12.4]", "drivers: [emulated-12.4]"))
    proc = cli("plan", f)
    assert proc.returncode == 2
    assert "host 'h200-580' runs no cell" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0"])
def test_bad_timeout_option_is_exit_2(tmp_path: Path, write_matrix: Any, cli: Any, value: str) -> None:
    m = write_matrix("runtimes: {}\ndrivers: [host]\nprobe: false\ncases: [{name: a, argv: [true]}]\n")
    proc = cli("run", m, "--out", tmp_path / "o", f"--timeout={value}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--timeout: expected seconds > 0" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


def test_environment_problems_are_exit_3_before_any_cell(tmp_path: Path, write_matrix: Any, cli: Any) -> None:
    m = write_matrix(f"""
        runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}
        drivers: [host]
        builds: ["12.9"]
        variants: [proc-address]
        workloads: [{{name: w, direction: d2h, block_bytes: 4096, blocks: 4}}]
    """)
    (tmp_path / "afile").write_text("")
    proc = cli("run", m, "--out", tmp_path / "afile", cwd=tmp_path)
    assert proc.returncode == 3
    assert "is a file" in proc.stderr
    assert "Traceback" not in proc.stderr
    # No C compiler: the variants cannot be built.  The run says so before any cell (its first
    # lines), and their cells are skipped, never a pass: nothing was tested, exit 5.
    bare = tmp_path / "bin"
    bare.mkdir()
    proc = cli("run", m, "--out", tmp_path / "o", cwd=tmp_path, env={"PATH": str(bare)})
    assert proc.returncode == 5, proc.stderr
    first = proc.stderr.split("cumatrix: runtime ", 1)[0]  # what is said before any runtime or cell
    assert "no gcc on PATH" in first, proc.stderr
    doc = json.loads((tmp_path / "o" / "results.json").read_text())
    assert doc["verdict"] == "NOTHING TESTED", doc["headline"]
    assert all(c["status"] == "skip" for c in doc["cells"]), [c["observed"] for c in doc["cells"]]


def test_resume_with_nothing_left_keeps_a_failure(tmp_path: Path, wheel_cache: Path, write_matrix: Any,
                                                  cli: Any) -> None:
    m = write_matrix(f"""
        runtimes: {{cu12.9: {{wheel: {RUNTIME}}}}}
        drivers: [host]
        probe: false
        cases: [{{name: a, argv: [false]}}]
    """)
    assert cli("run", m, "--out", tmp_path / "o", "-q", cwd=tmp_path).returncode == 1
    proc = cli("run", m, "--out", tmp_path / "o", "--resume", "-q", cwd=tmp_path)
    assert proc.returncode == 1
    assert "nothing left to run" in proc.stderr
