"""The nightly through a real Slurm: plan, submit, wait, merge.

Needs a Slurm controller that answers (``.ci/slurm`` starts one on localhost: one node, the
partitions ``drv580`` and ``drv550``, node features of the same names).  Skipped with the
reason where none answers, unless ``CUMATRIX_REQUIRE_SLURM=1`` (CI), where that fails.

The matrix is of command cases only (no GPU here): two hosts, one runtime wheel, the ``host``
driver (run by both hosts) and an emulated driver (run by the older host only).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.network]

RUNTIME = "nvidia-cuda-runtime-cu12==12.9.79"
REQUIRE = os.environ.get("CUMATRIX_REQUIRE_SLURM") == "1"


def _slurm_problem() -> str | None:
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return "no Slurm client (sbatch, scontrol) on PATH"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20, check=False)
        parts = subprocess.run(["sinfo", "-h", "-o", "%P %t"], capture_output=True, text=True, timeout=20,
                               check=False)
    except subprocess.TimeoutExpired:
        return "scontrol ping did not answer in 20 s"
    if "is UP" not in ping.stdout:
        return f"no slurmctld answers: {(ping.stdout + ping.stderr).strip()}"
    names = {line.split()[0].rstrip("*") for line in parts.stdout.splitlines() if line.split()}
    if not {"drv580", "drv550"} <= names:
        return f"Slurm has no partitions drv580 and drv550 (has: {', '.join(sorted(names)) or 'none'}); run .ci/slurm"
    return None


@pytest.fixture(scope="module")
def slurm() -> None:
    problem = _slurm_problem()
    if problem is not None:
        if REQUIRE:
            pytest.fail(f"CUMATRIX_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)


def _matrix(d: Path, *, gate: Path | None = None) -> Path:
    # With a gate, case `b` waits until the file exists (at most 60 s): the test holds a task
    # running while it cancels it.
    b = (f'["sh", "-c", "i=0; while [ ! -e {gate} ] && [ $i -lt 300 ]; do sleep 0.2; i=$((i+1)); done"]'
         if gate else '["sh", "-c", "echo b; exit 0"]')
    m = d / "nightly.yaml"
    m.write_text(f"""
runtimes:
  cu12.9: {{wheel: {RUNTIME}}}
drivers: [host, emulated-12.4]
probe: false
cases:
  - {{name: a, argv: [true]}}
  - {{name: b, argv: {b}}}
  - {{name: c, argv: [sh, -c, "exit 3"]}}
expect:
  - {{case: c, outcome: "exit:3"}}
hosts:
  drv580: {{driver: "580.159", partition: drv580, constraint: drv580}}
  drv550: {{driver: "550.163", partition: drv550}}
""")
    return m


def _records(results_json: Path) -> dict[tuple[str, str | None], tuple[str, str]]:
    doc = json.loads(results_json.read_text())
    return {(c["id"], c.get("host")): (c["observed"]["outcome"], c["status"]) for c in doc["cells"]}


def _by_id(recs: dict[tuple[str, str | None], tuple[str, str]]) -> dict[str, set[tuple[str, str]]]:
    out: dict[str, set[tuple[str, str]]] = {}
    for (cid, _), v in recs.items():
        out.setdefault(cid, set()).add(v)
    return out


def test_plan_slurm_writes_an_array_and_a_dependent_merge(tmp_path: Path, cli: Callable[..., Any]) -> None:
    m = _matrix(tmp_path)
    proc = cli("plan", m, "--format", "slurm", "--out", tmp_path / "out", "--sbatch-arg=--time=30",
               "--run-arg=--timeout", "--run-arg=60", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    d = tmp_path / "out" / "slurm"
    array = (d / "array.sbatch").read_text()
    assert "#SBATCH --array=0-1" in array
    assert "#SBATCH --time=30" in array
    assert "hosts=(drv550 drv580)" in array  # oldest driver first, as `plan --format json` orders them
    assert f"run {m} --host \"$host\" --submission \"$submission\" --out {tmp_path / 'out'}/\"$host\" --timeout 60" \
        in array
    submit = (d / "submit.sh").read_text()
    assert "sbatch --parsable --hold" in submit
    assert "--dependency=afterany:$array" in submit
    assert 'JobId="${array}_1" Partition=drv580 Features=drv580' in submit
    assert 'JobId="${array}_0" Partition=drv550' in submit
    merge = (d / "merge.sbatch").read_text()
    assert f"--matrix {m}" in merge
    assert str(tmp_path / "out" / "merged") in merge
    for script in (d / "array.sbatch", d / "merge.sbatch", d / "submit.sh"):
        assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0, script


def test_submit_merges_the_same_records_as_one_local_run(slurm: None, tmp_path: Path, wheel_cache: Path,
                                                         cli: Callable[..., Any]) -> None:
    m = _matrix(tmp_path)
    local = cli("run", m, "--out", tmp_path / "local", "-q", cwd=tmp_path, timeout=300)
    assert local.returncode == 0, local.stdout + local.stderr
    t0 = time.monotonic()
    proc = cli("submit", "--slurm", m, "--out", tmp_path / "nightly", "--poll", "0.5", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 of 2 hosts done" in proc.stderr
    assert "COMPLETED" in proc.stderr
    merged = _records(tmp_path / "nightly" / "merged" / "results.json")
    single = _records(tmp_path / "local" / "results.json")
    # Every cell the local run recorded, with the same outcome and status, once per host the
    # plan gives it: `host` cells on both hosts, emulated cells on drv550 only.
    assert _by_id(merged) == {cid: {v} for (cid, _), v in single.items()}
    hosts_of = {cid: {h for (c, h) in merged if c == cid} for cid, _ in single}
    assert all(hosts_of[cid] == ({"drv550", "drv580"} if "/host/" in cid else {"drv550"}) for cid in hosts_of)
    doc = json.loads((tmp_path / "nightly" / "merged" / "results.json").read_text())
    assert doc["not_run"] == []
    assert doc["missing_hosts"] == []
    assert doc["verdict"] == "PASS"
    # Each host's run ran where the plan put it, and recorded the plan and the host it ran as.
    logs = [p.read_text() for p in (tmp_path / "nightly" / "slurm").glob("cumatrix-*_*.out")]
    for host in ("drv580", "drv550"):
        header = json.loads((tmp_path / "nightly" / host / "results.jsonl").read_text().splitlines()[0])
        assert header["host"] == host
        assert header["matrix_sha256"] == doc["run"]["matrix_sha256"]
        assert {e["host"] for e in header["plan"]["hosts"]} == {"drv550", "drv580"}
        assert sum(f"runs as host {host}" in text for text in logs) == 1
    assert time.monotonic() - t0 < 300


def _task_state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-r", "-j", job.split("_", maxsplit=1)[0], "-o", "%i %T"], capture_output=True,
                         text=True, timeout=20, check=False).stdout
    return dict(line.split() for line in out.splitlines() if len(line.split()) == 2).get(job, "")


def test_a_cancelled_host_task_leaves_its_cells_not_run_and_the_merge_fails_naming_it(
        slurm: None, tmp_path: Path, wheel_cache: Path, cli_env: Callable[..., dict[str, str]]) -> None:
    gate = tmp_path / "go"
    m = _matrix(tmp_path, gate=gate)
    out = tmp_path / "nightly"
    proc = subprocess.Popen([sys.executable, "-m", "cumatrix", "submit", "--slurm", str(m), "--out", str(out),
                             "--poll", "0.5"], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        job = None
        while time.monotonic() < deadline and job is None:
            log = out / "slurm"
            started = [p for p in log.glob("cumatrix-*_0.out") if "runs as host drv550" in p.read_text()] \
                if log.is_dir() else []
            if started:
                job = started[0].name.removeprefix("cumatrix-").removesuffix(".out")
            time.sleep(0.3)
        assert job is not None, "drv550's task never started"
        while time.monotonic() < deadline and _task_state(job) != "RUNNING":
            time.sleep(0.3)
        subprocess.run(["scancel", job], check=True, timeout=30)
        gate.write_text("")  # drv580 finishes its cells; drv550's task is gone
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        gate.write_text("")
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, stdout + stderr
    assert "drv550" in stderr
    assert "merge incomplete" in stderr
    assert "drv550 CANCELLED" in stderr
    doc = json.loads((out / "merged" / "results.json").read_text())
    assert doc["verdict"] == "INCOMPLETE"
    ran550 = {c["id"] for c in doc["cells"] if c["host"] == "drv550"}
    planned550 = {"cu12.9/host/a", "cu12.9/host/b", "cu12.9/host/c",
                  "cu12.9/emulated-12.4/a", "cu12.9/emulated-12.4/b", "cu12.9/emulated-12.4/c"}
    not_run = {(e["id"], e["host"]) for e in doc["not_run"]}
    assert not_run == {(cid, "drv550") for cid in planned550 - ran550}
    assert not_run
    assert all(e["outcome"] == "not-run" for e in doc["not_run"])
    assert {c["id"] for c in doc["cells"] if c["host"] == "drv580"} == {"cu12.9/host/a", "cu12.9/host/b",
                                                                       "cu12.9/host/c"}
    summary = (out / "merged" / "summary.md").read_text()
    assert "host drv550 should have run it" in summary


def test_submit_without_a_slurm_client_is_exit_3_and_a_matrix_without_hosts_exit_2(
        tmp_path: Path, cli: Callable[..., Any]) -> None:
    m = _matrix(tmp_path)
    proc = cli("submit", "--slurm", m, "--out", tmp_path / "o", cwd=tmp_path, env={"PATH": str(tmp_path / "empty")})
    assert proc.returncode == 3
    assert "sbatch is not on PATH" in proc.stderr
    assert "Traceback" not in proc.stderr
    plain = tmp_path / "plain.yaml"
    plain.write_text(m.read_text().split("hosts:")[0])
    for argv in (("submit", "--slurm", plain), ("plan", plain, "--format", "slurm")):
        proc = cli(*argv, "--out", tmp_path / "o2", cwd=tmp_path)
        assert proc.returncode == 2
        assert "needs a `hosts:` section" in proc.stderr
        assert "Traceback" not in proc.stderr
    proc = cli("submit", m, "--out", tmp_path / "o3", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--slurm" in proc.stderr


def test_a_host_whose_task_failed_tonight_is_not_run_not_last_nights_results(
        slurm: None, tmp_path: Path, wheel_cache: Path, cli: Callable[..., Any]) -> None:
    """Last night both hosts ran and passed.  Tonight drv550's task fails before it writes
    anything (another run holds its directory's lock): its directory still holds last night's
    results, and the merge must not take them as tonight's."""
    m = _matrix(tmp_path)
    out = tmp_path / "nightly"
    first = cli("submit", "--slurm", m, "--out", out, "--poll", "0.5", cwd=tmp_path, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    last_night = json.loads((out / "drv550" / "results.jsonl").read_text().splitlines()[0])
    lock = os.open(out / "drv550" / ".cumatrix.lock", os.O_RDWR)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a run still writing there: tonight's run refuses
        proc = cli("submit", "--slurm", m, "--out", out, "--poll", "0.5", cwd=tmp_path, timeout=600)
    finally:
        os.close(lock)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "drv550 FAILED" in proc.stderr
    assert "PASS" not in proc.stderr
    reason = next(line for line in proc.stderr.splitlines() if "host drv550 not-run" in line)
    assert "its task ended FAILED" in reason
    doc = json.loads((out / "merged" / "results.json").read_text())
    assert doc["verdict"] == "INCOMPLETE"
    assert doc["missing_hosts"] == ["drv550"]
    assert {c["host"] for c in doc["cells"]} == {"drv580"}
    assert {e["host"] for e in doc["not_run"]} == {"drv550"}
    assert len(doc["not_run"]) == 6  # every cell the plan gives drv550
    assert any("host drv550 not-run" in w for w in doc["warnings"])
    # The merge job Slurm ran (merge.sbatch) decided the same from the same headers.
    tonight = json.loads((out / "drv580" / "results.jsonl").read_text().splitlines()[0])["submission"]
    assert tonight != last_night["submission"]
    assert last_night["plan"]["plan_id"]
    assert f"holds the results of submission {last_night['submission']}" in reason
    merge_logs = [p.read_text() for p in (out / "slurm").glob("cumatrix-merge-*.out")]
    assert any(f"not of submission {tonight}" in text for text in merge_logs), merge_logs


def test_plan_slurm_refuses_a_host_that_names_no_partition(tmp_path: Path, cli: Callable[..., Any]) -> None:
    # Without partition: or constraint:, drv550's task would run on any node, drv580's among them.
    m = _matrix(tmp_path)
    loose = tmp_path / "loose.yaml"
    loose.write_text(m.read_text().replace('  drv550: {driver: "550.163", partition: drv550}',
                                           '  drv550: {driver: "550.163"}'))
    proc = cli("plan", loose, "--format", "slurm", "--out", tmp_path / "o", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "hosts: drv550 names no `partition:` or `constraint:`" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o" / "slurm" / "array.sbatch").exists()
    # One host alone: the partition's default is where it runs, and the plan says so.
    alone = tmp_path / "alone.yaml"
    alone.write_text(loose.read_text().replace('  drv580: {driver: "580.159", partition: drv580, constraint: drv580}\n',
                                               ""))
    proc = cli("plan", alone, "--format", "slurm", "--out", tmp_path / "o2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "warning: " in proc.stderr
    assert "drv550 names no `partition:`" in proc.stderr
