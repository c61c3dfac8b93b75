"""The Slurm scripts `plan --format slurm` writes, attacked with hostile names and run for real.

Hypothesis makes directory names, matrix file names and ``--run-arg`` words out of shell
syntax (``$(...)``, backquotes, quotes, globs, ``;``, ``|``, ``%``...) whose command, if the
shell ever evaluated it, leaves a file named ``pwned``.  The scripts are run by real bash
(``array.sbatch`` per task, ``merge.sbatch``) and, where a Slurm controller answers, submitted
by ``submit.sh`` to the real Slurm.  The program the scripts start is a stand-in for cumatrix
(``cumatrix_command``): a recorder that writes down the argv it was given, so the test sees
exactly which command ran and with which words.  Nothing but that command may run: no
``pwned`` anywhere, and the recorded argv equal, word for word, to the intended one.

A value the shell cannot carry on one line (a control character) is refused with exit 2.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cumatrix.core.errors import UsageError
from cumatrix.front import slurm

#: Shell syntax that would run ``touch pwned...`` (or otherwise misbehave) if evaluated.
PIECES = ["$(touch pwned)", "`touch pwned2`", "$(touch${IFS}pwned3)", "${IFS}", "$((1+1))", "$HOME", "'", '"',
          "\\", ";touch pwned4;", "|", "&", " ", "*", "?", "~", "!", "#", "{a,b}", ">x", "<", "%", "%x", "é",
          "-", "--out", "=", ",", "\\$(touch pwned5)"]
NAME = st.lists(st.one_of(st.sampled_from(PIECES), st.text(alphabet=st.characters(
    min_codepoint=0x20, max_codepoint=0x24F, blacklist_characters="/\x7f"), max_size=3)),
    min_size=1, max_size=5).map("".join).filter(lambda s: s not in ("", ".", "..") and len(s.encode()) < 120)
WORD = st.lists(st.sampled_from(PIECES), min_size=1, max_size=4).map("".join)

MATRIX = """
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host, emulated-12.4]
probe: false
cases: [{name: a, argv: [true]}]
hosts:
  drv580: {driver: "580.159", partition: drv580, constraint: drv580}
  drv550: {driver: "550.163", partition: drv550}
"""
HOSTS = ["drv550", "drv580"]  # the array's order: oldest driver first


@contextmanager
def _workspace(recorder_dir: Path, out_name: str, matrix_name: str) -> Iterator[tuple[Path, Path, Path, Path]]:
    """(root, matrix, out, recorder): a fresh directory with a matrix under a hostile name in a
    hostile directory, an --out of a hostile name, and the recorder that stands in for
    cumatrix."""
    root = Path(tempfile.mkdtemp(prefix="quoting-"))
    try:
        d = root / out_name
        d.mkdir()
        matrix = d / f"{matrix_name}.yaml"
        matrix.write_text(MATRIX)
        recorder = root / "recorder"
        recorder.write_text("#!/bin/sh\nexec python3 -c 'import json, sys, uuid; "
                            "open(sys.argv[1] + \"/\" + uuid.uuid4().hex + \".json\", \"w\").write(json.dumps(sys.argv[2:]))' "
                            f"'{recorder_dir}' \"$@\"\n")
        recorder.chmod(0o755)
        yield root, matrix, d / out_name, recorder
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _recorded(d: Path) -> list[list[str]]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]


def _pwned(*dirs: Path) -> list[Path]:
    return [p for d in dirs for p in d.rglob("*") if p.name.startswith("pwned")]


def _write(monkeypatch: pytest.MonkeyPatch, recorder: Path, matrix: Path, out: Path,
           run_args: list[str]) -> slurm.SlurmPlan | None:
    """The scripts, or ``None`` where ``out`` holds a backslash, which Slurm's --output cannot
    carry: then the refusal is checked (exit 2's error, naming it) and nothing is written."""
    monkeypatch.setattr(slurm, "cumatrix_command", lambda: [str(recorder)])
    if "\\" in str(out):
        with pytest.raises(UsageError, match="backslash"):
            slurm.write_scripts(matrix, out, run_args=run_args)
        assert not (out / "slurm").exists()
        return None
    return slurm.write_scripts(matrix, out, run_args=run_args)


def _intended(matrix: Path, out: Path, run_args: list[str], submission: str) -> list[list[str]]:
    return [["run", str(matrix), "--host", h, "--submission", submission, "--out", f"{out}/{h}", *run_args]
            for h in HOSTS]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(out_name=NAME, matrix_name=NAME, run_args=st.lists(WORD, max_size=3))
@example(out_name="$(touch pwned) `touch pwned2` \"x\" 'y' %x", matrix_name="m;touch pwned4;", run_args=["$(touch pwned)"])
def test_bash_runs_only_the_intended_command_whatever_the_names(out_name: str, matrix_name: str, run_args: list[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory() as rec, _workspace(Path(rec), out_name, matrix_name) as (root, matrix, out,
                                                                                                 recorder):
        recorded = Path(rec)
        sp = _write(monkeypatch, recorder, matrix, out, run_args)
        if sp is None:
            return
        env = {"PATH": os.environ["PATH"], "CUMATRIX_SUBMISSION": "s1", "HOME": str(root)}
        for i in range(len(HOSTS)):
            proc = subprocess.run(["bash", str(sp.array_script)], cwd=root, env={**env, "SLURM_ARRAY_TASK_ID": str(i)},
                                  capture_output=True, text=True, timeout=60, check=False)
            assert proc.returncode == 0, proc.stderr
        assert sorted(_recorded(recorded)) == sorted(_intended(sp.matrix, sp.out, run_args, "s1"))
        for p in recorded.glob("*.json"):
            p.unlink()
        # The merge with no results: its message, with the hostile directory in it, is printed, not run.
        proc = subprocess.run(["bash", str(sp.merge_script)], cwd=root, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 1
        assert str(sp.out / "slurm") in proc.stderr
        assert _recorded(recorded) == []
        for h in HOSTS:
            (sp.out / h).mkdir(parents=True, exist_ok=True)
            (sp.out / h / "results.jsonl").write_text("{}\n")
        proc = subprocess.run(["bash", str(sp.merge_script)], cwd=root, env=env, capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        assert _recorded(recorded) == [["merge", *(f"{sp.out}/{h}" for h in HOSTS), "--matrix", str(sp.matrix),
                                        "--submission", "s1", "--out", str(sp.out / "merged")]]
        for script in (sp.array_script, sp.merge_script, sp.submit_script):
            assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
        assert _pwned(root, recorded) == []


CONTROL = st.sampled_from(["\n", "\r", "\x1b]52;c;cHduZWQ=\x07", "\x1b[2J", "\x00", "\x7f", "\t"])


@settings(max_examples=25, deadline=None)
@given(before=NAME, bad=CONTROL, after=NAME, where=st.sampled_from(["out", "run-arg", "sbatch-arg"]))
def test_a_control_character_in_any_value_is_refused_and_nothing_is_written(before: str, bad: str, after: str,
                                                                            where: str) -> None:
    value = before + bad + after
    root = Path(tempfile.mkdtemp(prefix="quoting-"))
    try:
        matrix = root / "m.yaml"
        matrix.write_text(MATRIX)
        # No path holds a NUL (the kernel refuses it); a directory name gets the other characters.
        out = root / ("o" + value.replace("\x00", "\x1b") if where == "out" else "o")
        with pytest.raises(UsageError, match="control character"):
            _write_with(where, value, matrix, out)
        assert not out.exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _write_with(where: str, value: str, matrix: Path, out: Path) -> None:
    if where == "out":
        slurm.write_scripts(matrix, out)
    elif where == "run-arg":
        slurm.write_scripts(matrix, out, run_args=slurm.check_args([value], "--run-arg"))
    else:
        slurm.write_scripts(matrix, out, sbatch_args=slurm.check_args([value], "--sbatch-arg"))


def test_the_cli_refuses_a_newline_in_out_with_exit_2(tmp_path: Path, cli: Callable[..., Any]) -> None:
    (tmp_path / "m.yaml").write_text(MATRIX)
    proc = cli("plan", "m.yaml", "--format", "slurm", "--out", "o\n#SBATCH --wrap=touch pwned", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "control character" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.yaml"]


# --------------------------------------------------------------------------- through the real Slurm


def _slurm_up() -> str | None:
    if shutil.which("sbatch") is None:
        return "no Slurm client on PATH"
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20, check=False)
    return None if "is UP" in ping.stdout else f"no slurmctld answers: {ping.stdout.strip()}"


@pytest.mark.slurm
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(out_name=NAME, matrix_name=NAME, run_args=st.lists(WORD, max_size=2))
@example(out_name="$(touch pwned) `touch pwned2` 'q' \"d\" %A%%", matrix_name="m;touch pwned4;", run_args=["`touch pwned2`"])
@example(out_name="\\", matrix_name="?$(touch pwned)", run_args=[])
def test_submit_sh_through_the_real_slurm_runs_only_the_intended_commands(
        out_name: str, matrix_name: str, run_args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    problem = _slurm_up()
    if problem is not None:
        if os.environ.get("CUMATRIX_REQUIRE_SLURM") == "1":
            pytest.fail(f"CUMATRIX_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)
    # The recorder's directory is outside the hostile tree, where the job (another process of
    # slurmd) writes it.
    rec = Path(tempfile.mkdtemp(prefix="quoting-rec-"))
    try:
        with _workspace(rec, out_name, matrix_name) as (root, matrix, out, recorder):
            sp = _write(monkeypatch, recorder, matrix, out, run_args)
            if sp is None:
                return
            for h in HOSTS:  # results for the merge job to find (the recorder writes none)
                (sp.out / h).mkdir(parents=True, exist_ok=True)
                (sp.out / h / "results.jsonl").write_text("{}\n")
            proc = subprocess.run(["bash", str(sp.submit_script)], cwd=root, capture_output=True, text=True, timeout=120,
                                  check=False)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            submission = proc.stdout.split()[1].rstrip(":")
            deadline = time.monotonic() + 120
            while len(_recorded(rec)) < 3 and time.monotonic() < deadline:
                time.sleep(0.5)
            got = _recorded(rec)
            merge = ["merge", *(f"{sp.out}/{h}" for h in HOSTS), "--matrix", str(sp.matrix), "--submission", submission,
                     "--out", str(sp.out / "merged")]
            assert sorted(got) == sorted([*_intended(sp.matrix, sp.out, run_args, submission), merge]), proc.stdout
            logs = list((sp.out / "slurm").glob("cumatrix-*.out"))
            assert len(logs) == 3, logs  # the logs went where --output named, '%' of the name kept
            time.sleep(1)  # a job that ran anything more would have finished by now
            assert _pwned(root, rec) == []
    finally:
        shutil.rmtree(rec, ignore_errors=True)
    assert not any(Path.cwd().glob("pwned*"))


def test_a_runner_label_with_a_newline_is_refused_at_its_line_and_column(tmp_path: Path,
                                                                         cli: Callable[..., Any]) -> None:
    """A label goes into the workflow's `runs-on` through `plan --format github`; a newline in it
    is bad input at its place in the file."""
    (tmp_path / "m.yaml").write_text(MATRIX.replace('partition: drv550}', 'partition: drv550, label: "gpu\\nx"}'))
    proc = cli("plan", "m.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert "m.yaml:9:" in proc.stderr
    assert "control character" in proc.stderr
    assert proc.stdout == ""
