"""Stored data reaching a terminal or a Markdown page: a cell id with OSC 52 (a clipboard write),
clear-screen and a code fence of its own, merged from an uploaded host directory into the real
history (SQLite), then printed by ``merge``, ``report``, ``history`` and ``diff``.

The terminal sink (``cumatrix.core.sinks.terminal``) removes every escape sequence and shows the
other control characters as ``\\xNN``: no ESC, BEL or CSI byte reaches the terminal.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from cumatrix.core.sinks import terminal
from cumatrix.results.records import MAX_LINE_BYTES

MATRIX = """
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host]
probe: false
cases:
  - {name: a, argv: [true]}
  - {name: b, argv: [sh, -c, "exit 3"]}
"""
#: OSC 52 (write "pwned" to the clipboard), clear screen, cursor home, a bell, a C1 CSI, and a
#: line that would close a three-backtick fence.
HOSTILE = "cu12.9/host/b\x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[H\x07\x9b31m\r\n```\nevil"

RAW = ("\x1b", "\x07", "\x9b", "\r")


def _raw(text: str) -> list[str]:
    return [ch for ch in RAW if ch in text]


@pytest.mark.network  # the cells provision a runtime wheel (cached after the first)
def test_a_hostile_cell_id_reaches_no_terminal_raw(tmp_path: Path, wheel_cache: Path,
                                                   cli: Callable[..., CompletedProcess[str]]) -> None:
    (tmp_path / "m.yaml").write_text(MATRIX)
    history = tmp_path / "h.sqlite"
    p = cli("run", "m.yaml", "--host", "h1", "--out", "a", "-q", "--history", history, cwd=tmp_path)
    assert p.returncode == 1, p.stderr  # b exits 3, unexpected
    # An uploaded host directory: h1's run, re-labelled h2, with b's id replaced.
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    lines = []
    for line in (tmp_path / "b" / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("host") == "h1":
            rec["host"] = "h2"
        if rec.get("id") == "cu12.9/host/b":
            rec["id"] = HOSTILE
        if isinstance(rec.get("cells"), list):
            rec["cells"] = [HOSTILE if c == "cu12.9/host/b" else c for c in rec["cells"]]
        lines.append(json.dumps(rec))
    (tmp_path / "b" / "results.jsonl").write_text("\n".join(lines) + "\n")

    # The merge refuses the uploaded directory, naming the file and the record, the id escaped.
    merge = cli("merge", "a", "b", "--out", "merged", "--history", history, cwd=tmp_path)
    assert merge.returncode == 2, merge.stderr
    assert "b/results.jsonl" in merge.stderr, merge.stderr
    assert "control character" in merge.stderr, merge.stderr
    assert _raw(merge.stdout + merge.stderr) == [], merge.stdout + merge.stderr
    assert not (tmp_path / "merged" / "summary.md").exists()
    outputs = {}
    outputs["report"] = cli("report", "b", "--no-history", cwd=tmp_path)
    outputs["history"] = cli("history", "--history", history, cwd=tmp_path)
    for name, proc in outputs.items():
        assert proc.returncode in (0, 1), (name, proc.stderr)
        assert _raw(proc.stdout + proc.stderr) == [], (name, proc.stdout + proc.stderr)
    # The Markdown the report wrote: no raw control byte, and the id cannot open or close a fence.
    summary = (tmp_path / "b" / "summary.md").read_text()
    assert _raw(summary) == []
    assert "\n```\nevil" not in summary


def test_the_terminal_sink_removes_every_escape_and_shows_other_controls() -> None:
    assert terminal("a\x1b]52;c;cHduZWQ=\x07b") == "ab"  # OSC 52, BEL-terminated
    assert terminal("a\x1b]0;title\x1b\\b") == "ab"  # OSC, ST-terminated
    assert terminal("a\x1b[2J\x1b[1;31mb\x1b[0m") == "ab"  # CSI
    assert terminal("a\x1bP1;2|x\x1b\\b") == "ab"  # DCS
    assert terminal("a\x1b]52;c;unterminated") == "a"
    assert terminal("a\x9b2Jb") == "ab"  # 8-bit CSI
    assert terminal("a\rb\x00c\x7f\x85") == "a\\x0db\\x00c\\x7f\\x85"
    assert terminal("tab\tand\nnewline, é, ✓") == "tab\tand\nnewline, é, ✓"


def _limited(gib: int) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))
    return limit


@pytest.mark.network  # the cells provision a runtime wheel (cached after the first)
def test_a_huge_results_file_in_a_host_directory_is_exit_2_naming_it_and_the_last_merge_stays(
        tmp_path: Path, wheel_cache: Path, cli: Callable[..., CompletedProcess[str]],
        cli_env: Callable[..., dict[str, str]]) -> None:
    """A 6 GiB sparse results.jsonl (one line of NUL bytes) uploaded as a host's directory: the
    merge, in a process allowed 2 GiB of address space, refuses it naming the file (exit 2, no
    traceback, no MemoryError), and the merged reports already there are left as they were.
    A line over the line bound in an ordinary-sized file is refused the same way, at its line."""
    (tmp_path / "m.yaml").write_text(MATRIX)
    p = cli("run", "m.yaml", "--host", "h1", "--out", "a", "-q", "--no-history", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    merged = cli("merge", "a", "--out", "merged", "--no-history", cwd=tmp_path)
    assert merged.returncode == 1, merged.stderr
    before = (tmp_path / "merged" / "results.json").read_bytes()
    (tmp_path / "b").mkdir()
    with (tmp_path / "b" / "results.jsonl").open("wb") as f:
        f.truncate(6 << 30)
    proc = subprocess.run([sys.executable, "-m", "cumatrix", "merge", "a", "b", "--out", "merged", "--no-history"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300, check=False,
                          preexec_fn=_limited(2))
    assert proc.returncode == 2, proc.stderr
    assert f"{Path('b') / 'results.jsonl'}: {6 << 30} bytes, more than a results file may hold" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "MemoryError" not in proc.stderr
    assert (tmp_path / "merged" / "results.json").read_bytes() == before
    # One line past the line bound, in a file well under the file bound.
    header = (tmp_path / "a" / "results.jsonl").read_text().splitlines()[0].replace('"h1"', '"h2"')
    with (tmp_path / "b" / "results.jsonl").open("w") as f:
        f.write(header + "\n")
        f.write('{"schema": 1, "type": "cell", "id": "' + "x" * (MAX_LINE_BYTES + 10) + '"}\n')
    proc = subprocess.run([sys.executable, "-m", "cumatrix", "merge", "a", "b", "--out", "merged", "--no-history"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300, check=False,
                          preexec_fn=_limited(2))
    assert proc.returncode == 2, proc.stderr
    assert f"{Path('b') / 'results.jsonl'}:2:1: a line of more than {MAX_LINE_BYTES} bytes" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "merged" / "results.json").read_bytes() == before
