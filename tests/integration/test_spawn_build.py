"""The spawn helper's units (``csrc/spawn.c`` and ``csrc/spawn_*.c``, each with a header saying
what it gives the others) build with every warning an error, stay below 600 lines each, and
run clean under AddressSanitizer and UndefinedBehaviorSanitizer: a spawn, a traced tree (forks,
an exec, a child outliving its parent) with its record, and the watcher.  Real gcc, real
processes; skipped where gcc or its sanitizer runtimes are missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cumatrix.execute.spawn import SPAWN_CFLAGS, spawn_sources
from helpers.build import gcc

CSRC = spawn_sources()[0].parent


def test_every_unit_is_below_600_lines_and_has_a_header_saying_what_it_promises() -> None:
    units = spawn_sources()
    assert len(units) >= 6
    for unit in units:
        assert unit.read_text().count("\n") < 600, unit.name
        header = unit.with_suffix(".h")
        assert header.is_file(), f"{unit.name} has no header"
        assert header.read_text().startswith("/* " + header.name + ":"), header.name


def test_the_helper_builds_with_every_warning_an_error(tmp_path: Path) -> None:
    proc = subprocess.run([gcc(), *SPAWN_CFLAGS, "-o", str(tmp_path / "spawn"), *map(str, spawn_sources())],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("asan") / "spawn"
    proc = subprocess.run([gcc(), "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                           "-fno-sanitize-recover=all", "-Wall", "-Wextra", "-Werror", "-o", str(out),
                           *map(str, spawn_sources())], capture_output=True, text=True, check=False)
    if proc.returncode != 0 and ("asan" in proc.stderr or "ubsan" in proc.stderr):
        pytest.skip(f"no sanitizer runtime here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "ASAN_OPTIONS": "abort_on_error=0:exitcode=99:detect_leaks=1",
            "UBSAN_OPTIONS": "halt_on_error=1:exitcode=99:print_stacktrace=1"}


def test_a_spawn_under_the_sanitizers(sanitized: Path) -> None:
    proc = subprocess.run([str(sanitized), "0", "-", "nofile=1024:1024", "--", "sh", "-c", "echo ran; exit 3"],
                          capture_output=True, text=True, env=_env(), timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "ran\n"
    assert "Sanitizer" not in proc.stderr, proc.stderr
    assert "runtime error" not in proc.stderr, proc.stderr


def test_a_traced_tree_under_the_sanitizers(sanitized: Path) -> None:
    r, w = os.pipe()
    script = "sh -c 'sleep 0.2; true' & ls / >/dev/null; cat /dev/null; exit 0"
    proc = subprocess.run([str(sanitized), "--trace", str(w), "0", "-", "-", "--", "sh", "-c", script],
                          capture_output=True, text=True, env=_env(), timeout=60, pass_fds=(w,), check=False)
    os.close(w)
    with os.fdopen(r) as f:
        record = f.read()
    assert proc.returncode == 0, proc.stderr
    assert "Sanitizer" not in proc.stderr, proc.stderr
    assert "runtime error" not in proc.stderr, proc.stderr
    lines = record.splitlines()
    assert lines[0].startswith(("t\t", "n\t")), record[:300]
    assert lines[-1].startswith("z\t"), record[-300:]
    if lines[0].startswith("t\t"):  # traced: the exec'd images and the processes' exits are on it
        assert any(line.startswith("x\t") for line in lines), record[:500]
        assert any("/ls" in line for line in lines if line.startswith(("e\t", "x\t"))), record[:800]


def test_the_watcher_under_the_sanitizers(sanitized: Path) -> None:
    proc = subprocess.run([str(sanitized), "--watch", "cat"], input="told\n", capture_output=True, text=True,
                          env=_env(), timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "told\n"
