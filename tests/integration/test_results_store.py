"""The results store with real processes: one run per --out, nothing finished lost, honest resume."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cumatrix.core.errors import EnvironmentProblem, OutDirBusy
from cumatrix.load import matrix as M
from cumatrix.report import load_records
from cumatrix.results.store import (
    JSONL,
    PREVIOUS,
    REPORTS,
    Store,
    cell_digest,
    cell_digests,
    reusable_ids,
)

# A writer that takes the --out lock, says so, then holds it (or appends records slowly).
HOLDER = textwrap.dedent("""
    import sys, time
    from cumatrix.core.errors import CumatrixError
    from cumatrix.results.store import Store
    try:
        store = Store.open(sys.argv[1], fresh=True)
    except CumatrixError as e:
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
    print("locked", flush=True)
    for i in range(int(sys.argv[3])):
        store.append({"schema": 1, "type": "cell", "id": f"c{i}", "pad": "x" * 200})
        print(f"appended c{i}", flush=True)
    time.sleep(float(sys.argv[2]))
    store.close()
""")


def child_env() -> dict[str, str]:
    """This environment, with the package under test importable by a child Python."""
    import cumatrix

    env = dict(os.environ)
    parent = str(Path(cumatrix.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (parent, env.get("PYTHONPATH")) if p)
    return env


def _holder(out: Path, hold: float, records: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(out), str(hold), str(records)], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_runs_race_for_one_out_and_exactly_one_wins(tmp_path: Path) -> None:
    out = tmp_path / "out"
    procs = [_holder(out, 3.0), _holder(out, 3.0)]
    results = [(p, *p.communicate(timeout=60)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [(p.returncode, e) for p, _, e in results]
    winner = next(p for p, _, _ in results if p.returncode == 0)
    loser_err = next(e for p, _, e in results if p.returncode == 2)
    assert f"pid {winner.pid}:" in loser_err, loser_err
    assert "-c" in loser_err, loser_err
    assert "another cumatrix run is writing here" in loser_err
    assert "Traceback" not in loser_err
    # The lock went with the winner: the next run takes the directory.
    after = _holder(out, 0.0)
    assert after.communicate(timeout=60)[0].startswith("locked")
    assert after.returncode == 0


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _holder(out, 60.0)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "locked"
    with pytest.raises(OutDirBusy, match=f"pid {p.pid}:"):
        Store.open(out, fresh=False)
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)
    Store.open(out, fresh=False).close()


def test_one_process_opening_twice_shares_its_writer(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = Store.open(out, fresh=True)  # the CLI, before any cell
    second = Store.open(out, fresh=True)  # the plugin it runs in the same process
    assert second is first
    second.append({"schema": 1, "type": "cell", "id": "c0"})
    second.close()
    p = _holder(out, 0.0)  # still held: the first user has not closed
    assert p.communicate(timeout=60)[1]
    assert p.returncode == 2
    first.close()
    p = _holder(out, 0.0)
    assert p.communicate(timeout=60)[0].startswith("locked")
    assert p.returncode == 0


def test_sigkill_mid_run_loses_no_finished_record(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = _holder(out, 60.0, records=1000)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "locked"
    acknowledged = []
    for line in p.stdout:
        acknowledged.append(line.split()[1])
        if len(acknowledged) == 150:  # past two grouped syncs, mid-batch
            break
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)
    stored = [json.loads(ln)["id"] for ln in (out / JSONL).read_text().splitlines() if ln.strip()]
    assert stored[:len(acknowledged)] == acknowledged  # every record whose append returned is there


def test_appends_are_grouped_not_synced_one_by_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with Store.open(out, fresh=True) as store:
        syncs = []
        real = os.fdatasync
        os.fdatasync = lambda fd: (syncs.append(fd), real(fd))[1]  # type: ignore[assignment]
        try:
            for i in range(200):
                store.append({"schema": 1, "type": "cell", "id": f"c{i}"})
            store.close()
        finally:
            os.fdatasync = real
    assert 3 <= len(syncs) <= 4  # 200 records: three full groups of 64 and the close


def test_unsynced_records_are_synced_within_the_interval(tmp_path: Path) -> None:
    with Store.open(tmp_path / "out", fresh=True) as store:
        store.append({"schema": 1, "type": "cell", "id": "c0"})
        assert store._unsynced == 1
        deadline = time.monotonic() + 10
        while store._unsynced and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store._unsynced == 0


# --------------------------------------------------------------------------- environment problems


def test_out_that_is_a_file_is_an_environment_problem(tmp_path: Path) -> None:
    f = tmp_path / "out"
    f.write_text("not a directory")
    for out in (f, f / "sub"):
        with pytest.raises(EnvironmentProblem) as e:
            Store.open(out, fresh=True)
        assert e.value.exit_code == 3
        assert str(out) in str(e.value)


def _in_private_mount(tmp_path: Path, script: str, size: str, *, ro: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (Python) with a small tmpfs at tmp_path/mnt, in a private mount namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    opts = f"size={size}" + (",ro" if ro else "")
    cmd = ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o {opts} tmpfs "$1" && shift && exec "$@"', "sh", str(mnt),
           sys.executable, "-c", script, str(mnt)]
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"no unprivileged mount namespace here: {probe.stderr.decode().strip()}")
    return subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=120, check=False)


OPEN_AND_FILL = textwrap.dedent("""
    import sys
    from pathlib import Path
    from cumatrix.core.errors import CumatrixError
    from cumatrix.results.store import Store
    mnt = Path(sys.argv[1])
    try:
        with Store.open(mnt / "out", fresh=True) as store:
            for i in range(100000):
                store.append({"schema": 1, "type": "cell", "id": f"c{i}", "pad": "x" * 500})
    except CumatrixError as e:
        print(e, file=sys.stderr)
        sys.exit(e.exit_code)
""")


def test_full_filesystem_before_the_run_is_one_clear_error(tmp_path: Path) -> None:
    proc = _in_private_mount(tmp_path, OPEN_AND_FILL, "512k")
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "the filesystem is full (" in proc.stderr
    assert "KiB free" in proc.stderr


def test_filesystem_filling_mid_run_is_one_clear_error(tmp_path: Path) -> None:
    proc = _in_private_mount(tmp_path, OPEN_AND_FILL, "2m")
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write results: the filesystem is full" in proc.stderr


def test_read_only_out_is_one_clear_error(tmp_path: Path) -> None:
    proc = _in_private_mount(tmp_path, OPEN_AND_FILL, "1m", ro=True)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "read-only filesystem" in proc.stderr


# --------------------------------------------------------------------------- resume

MATRIX = """\
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host]
probe: false
cases:
  - {name: a, argv: [true]}
  - {name: b, argv: [true]}
  - {name: c, argv: [true]}
"""


def _run(store: Store, m_text: str, ids_done: list[str], version: str = "1.0") -> dict[str, str]:
    m = M.loads(m_text, "m.yaml")
    digests = cell_digests(m, M.cells(m), version)
    store.append({"schema": 1, "type": "run", "run_id": "r1", "matrix": "m.yaml", "started": "t",
                  "cells": list(digests), "cells_total": len(digests)})
    for cid in ids_done:
        store.append({"schema": 1, "type": "cell", "id": cid, "status": "pass",
                      "expected": {"outcomes": ["ok"], "reason": "r"}, "observed": {"outcome": "ok"}},
                     digest=digests[cid])
    return digests


def test_resume_reuses_only_unchanged_cells_and_drops_foreign_lines(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with Store.open(out, fresh=True) as store:
        _run(store, MATRIX, ["cu12.9/host/a", "cu12.9/host/b", "cu12.9/host/c"])
    with (out / JSONL).open("a") as f:  # garbage mid-file, another matrix's cell, then a later run's line
        f.write("{not json\n")
        f.write(json.dumps({"schema": 1, "type": "cell", "id": "cu13.0/host/zz", "digest": "0"}) + "\n")
        f.write(json.dumps({"schema": 1, "type": "end", "finished": "t", "interrupted": True}) + "\n")
    changed = MATRIX.replace("{name: b, argv: [true]}", "{name: b, argv: [false]}")
    m = M.loads(changed, "m.yaml")
    digests = cell_digests(m, M.cells(m), "1.0")
    before = reusable_ids(out, digests)  # what an xdist worker reads, before the writer compacts
    with Store.open(out, fresh=False) as store:
        plan = store.resume(digests)
    assert before == plan.reuse == reusable_ids(out, digests)
    assert plan.reuse == {"cu12.9/host/a", "cu12.9/host/c"}
    assert plan.rerun == ("cu12.9/host/b",)
    assert plan.changed == ("cu12.9/host/b",)
    assert plan.ignored_lines == (5, 6)
    assert plan.reports_stale
    assert any("lines 5, 6:" in w for w in plan.warnings), plan.warnings
    assert any("running them again: cu12.9/host/b" in w for w in plan.warnings), plan.warnings
    assert (out / PREVIOUS).read_text().count("\n") == 7  # the old file, kept aside
    run = load_records(out / JSONL)  # what the reports read: clean, only the reusable cells
    assert [c.id for c in run.cells] == ["cu12.9/host/a", "cu12.9/host/c"]
    assert not run.warnings
    assert run.runs[0].cells == ("cu12.9/host/a", "cu12.9/host/c")


def test_resume_after_a_harness_upgrade_reruns_everything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with Store.open(out, fresh=True) as store:
        _run(store, MATRIX, ["cu12.9/host/a"], version="1.0")
    m = M.loads(MATRIX, "m.yaml")
    with Store.open(out, fresh=False) as store:
        plan = store.resume(cell_digests(m, M.cells(m), "1.1"))
    assert not plan.reuse
    assert len(plan.rerun) == 3


def test_resume_of_an_unchanged_finished_run_keeps_everything(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with Store.open(out, fresh=True) as store:
        digests = _run(store, MATRIX, ["cu12.9/host/a", "cu12.9/host/b", "cu12.9/host/c"])
        store.append({"schema": 1, "type": "end", "finished": "t", "interrupted": False})
    before = (out / JSONL).read_bytes()
    for name in REPORTS:
        (out / name).write_text("report")
    with Store.open(out, fresh=False) as store:
        plan = store.resume(digests)
    assert plan.reuse == set(digests)
    assert plan.rerun == ()
    assert not plan.warnings
    assert not plan.reports_stale
    assert (out / JSONL).read_bytes() == before
    # A record missing its report: stale.
    (out / "summary.md").unlink()
    with Store.open(out, fresh=False) as store:
        assert store.resume(digests).reports_stale


def test_a_cut_last_line_is_not_a_foreign_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with Store.open(out, fresh=True) as store:
        digests = _run(store, MATRIX, ["cu12.9/host/a"])
    with (out / JSONL).open("a") as f:
        f.write('{"schema": 1, "type": "cell", "id": "cu12.9/host/b", "stat')  # killed mid-write
    with Store.open(out, fresh=False) as store:
        plan = store.resume(digests)
    assert plan.ignored_lines == ()
    assert plan.reuse == {"cu12.9/host/a"}


def test_fresh_run_removes_the_previous_runs_reports(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in (JSONL, *REPORTS):
        (out / name).write_text("old")
    Store.open(out, fresh=True).close()
    assert not any((out / n).exists() for n in REPORTS)
    assert (out / JSONL).read_text() == ""


def test_digest_follows_every_input_of_a_cell_and_ignores_layout() -> None:
    base = MATRIX + "expect:\n  - {case: a, outcome: ok}\n"
    m = M.loads(base, "m.yaml")
    cell = M.cells(m)[0]
    d = cell_digest(m, cell, "1.0")
    moved = M.loads("# a comment line\n" + base.replace("probe: false\n", "probe: false\n\n"), "m.yaml")
    assert cell_digest(moved, M.cells(moved)[0], "1.0") == d
    for text in (base.replace("{name: a, argv: [true]}", "{name: a, argv: [true], timeout: 5}"),
                 base.replace("12.9.79", "12.9.37"),
                 base.replace("{case: a, outcome: ok}", "{case: a, outcome: [ok, 'exit:1']}")):
        other = M.loads(text, "m.yaml")
        assert cell_digest(other, M.cells(other)[0], "1.0") != d, text
    assert cell_digest(m, cell, "1.1") != d
