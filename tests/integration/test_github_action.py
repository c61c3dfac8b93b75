"""The composite action's step (scripts/github-action.sh), run as GitHub runs it: real bash, real
cumatrix, GITHUB_OUTPUT and GITHUB_STEP_SUMMARY files, the inputs as environment variables."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.network

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "github-action.sh"

MATRIX = """
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
drivers: [host, emulated-12.4]
probe: false
cases: [{name: a, argv: [true]}, {name: b, argv: [sh, -c, "exit 0"]}]
hosts:
  drv580: {driver: "580.159"}
  drv550: {driver: "550.163"}
"""


def _step(tmp_path: Path, cli_env: Callable[..., dict[str, str]], **inputs: str) -> tuple[int, dict[str, str], str]:
    """Run the action's step with these inputs; (exit status, outputs, job summary)."""
    out_file, summary = tmp_path / "github_output", tmp_path / "step_summary"
    out_file.write_text("")
    summary.write_text("")
    env = cli_env({"GITHUB_OUTPUT": str(out_file), "GITHUB_STEP_SUMMARY": str(summary), "RUNNER_TEMP": str(tmp_path),
                   "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])})
    for k in [k for k in env if k.startswith("CUMATRIX_")]:
        del env[k]  # the CI's own CUMATRIX_REQUIRE_* are not inputs
    env.update({f"CUMATRIX_{k.upper()}": v for k, v in inputs.items()})
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    return proc.returncode, github_outputs(out_file.read_text()), summary.read_text() + proc.stderr


def github_outputs(text: str) -> dict[str, str]:
    """``$GITHUB_OUTPUT`` read as the runner reads it: ``NAME=VALUE`` lines and ``NAME<<DELIM``
    blocks; a name given twice keeps its last value."""
    outputs: dict[str, str] = {}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            end = lines.index(delim, i)
            outputs[name] = "\n".join(lines[i:end])
            i = end + 1
        elif "=" in line:
            name, value = line.split("=", 1)
            outputs[name] = value
    return outputs


def test_run_as_a_host_then_merge_names_the_host_that_never_ran(tmp_path: Path, wheel_cache: Path,
                                                                cli_env: Callable[..., dict[str, str]]) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    code, out, summary = _step(tmp_path, cli_env, host="drv580", out="runs/drv580", require_gpu_input="false",
                               args="--timeout '60'")
    assert code == 0, summary
    assert out["exit-code"] == "0", summary
    assert out["headline"].startswith("cumatrix: PASS — ")
    assert out["reports-dir"] == str(tmp_path / "runs" / "drv580")
    assert out["headline"].removeprefix("cumatrix: ") in summary.replace("**", "")  # summary.md went to the job summary
    header = json.loads((tmp_path / "runs" / "drv580" / "results.jsonl").read_text().splitlines()[0])
    assert header["host"] == "drv580"
    assert header["cells"] == ["cu12.9/host/a", "cu12.9/host/b"]
    argv = header["argv"]
    assert argv[argv.index("--cumatrix-timeout") + 1] == "60.0"
    assert "--cumatrix-require-gpu" not in argv

    # The merge of the hosts that uploaded: drv550 never ran, so the merge is not a pass; with
    # fail=false the step itself succeeds and hands the exit code on.  A history file is set:
    # where this cumatrix has no `diff`, the summary simply has no such section.
    code, out, summary = _step(tmp_path, cli_env, merge_from="runs/*", out="merged", fail="false",
                               history_file=str(tmp_path / "hist" / "h.sqlite"))
    assert code == 0, summary
    assert out["exit-code"] == "1", summary
    assert out["headline"].startswith("cumatrix: INCOMPLETE — ")
    assert "drv550" in out["headline"]
    doc = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert doc["missing_hosts"] == ["drv550"]
    assert {(e["id"], e["host"]) for e in doc["not_run"]} == {
        ("cu12.9/host/a", "drv550"), ("cu12.9/host/b", "drv550"),
        ("cu12.9/emulated-12.4/a", "drv550"), ("cu12.9/emulated-12.4/b", "drv550")}
    assert "host drv550 should have run it" in summary

    # fail=true (the default): the step fails with cumatrix's code.
    code, out, _ = _step(tmp_path, cli_env, merge_from="runs/*", out="merged")
    assert code == 1
    assert out["exit-code"] == "1"


def test_merge_of_nothing_fails_and_says_no_host_ran(tmp_path: Path, cli_env: Callable[..., dict[str, str]]) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    code, out, summary = _step(tmp_path, cli_env, merge_from="runs/*", out="merged")
    assert code == 1
    assert out["exit-code"] == "1"
    assert "no host ran" in out["headline"]
    assert "no host ran" in summary


def test_args_that_do_not_split_are_exit_2(tmp_path: Path, cli_env: Callable[..., dict[str, str]]) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    code, _, text = _step(tmp_path, cli_env, args="--timeout 'unclosed")
    assert code == 2
    assert "cannot split" in text


def test_an_input_with_a_newline_cannot_add_an_output_of_its_own(tmp_path: Path, wheel_cache: Path,
                                                                 cli_env: Callable[..., dict[str, str]]) -> None:
    """An `out` input holding a newline and `exit-code=0` after it: the step's outputs hold one
    exit code, the real one, and the input is refused (exit 2) before anything runs."""
    (tmp_path / "matrix.yaml").write_text(MATRIX.replace("[sh, -c, \"exit 0\"]", "[sh, -c, \"exit 3\"]"))
    _, out, text = _step(tmp_path, cli_env, out="runs\nexit-code=0", require_gpu_input="false", fail="false")
    assert out["exit-code"] == "2", (out, text)
    assert "control character" in out["headline"]
    assert not (tmp_path / "runs\nexit-code=0").exists()
    # Every output is written in the multi-line form, each once: a value cannot add a line.
    _, out, text = _step(tmp_path, cli_env, out="runs", require_gpu_input="false", fail="false")
    assert out["exit-code"] == "1", (out, text)
    assert "\n" not in out["reports-dir"]
    raw = (tmp_path / "github_output").read_text()
    assert raw.count("exit-code<<ghadelimiter_") == 1


def _outside_fences(markdown: str) -> list[str]:
    """The lines of ``markdown`` outside its fenced code blocks (a fence closes only on a run of
    backticks at least as long as the one that opened it, as CommonMark says)."""
    out, fence = [], ""
    for line in markdown.splitlines():
        run = len(line) - len(line.lstrip("`"))
        if not fence and run >= 3:
            fence = "`" * run
        elif fence and run >= len(fence) and not line.strip("`").strip():
            fence = ""
        elif not fence:
            out.append(line)
    return out


def test_a_stored_id_cannot_close_the_diff_sections_code_fence(tmp_path: Path, wheel_cache: Path,
                                                                 cli_env: Callable[..., dict[str, str]]) -> None:
    """A host directory whose cell id carries a line of three backticks and a heading after it:
    in the job summary (its "since the last run" section, whether the report's own or the
    action's fenced diff) the id never opens a line of its own outside a code block."""
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    history = str(tmp_path / "h.sqlite")
    code, _, text = _step(tmp_path, cli_env, host="drv580", out="runs/drv580", require_gpu_input="false",
                          history_file=history)
    assert code == 0, text
    up = tmp_path / "up" / "drv580"
    shutil.copytree(tmp_path / "runs" / "drv580", up)
    hostile = "cu12.9/host/b\n```\n# injected heading"
    lines = []
    for line in (up / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("id") == "cu12.9/host/b":
            rec["id"] = hostile
        lines.append(json.dumps(rec))
    (up / "results.jsonl").write_text("\n".join(lines) + "\n")
    _, outputs, summary = _step(tmp_path, cli_env, merge_from="up/*", out="merged", history_file=history, fail="false")
    # The merge refuses the id (a name in results is one line), naming the record: bad input, exit 2...
    assert outputs["exit-code"] == "2", summary
    assert "holds a newline or a control character" in summary, summary
    # ...and what the summary shows of it never makes a heading of its own, nor follows a fence it closed.
    assert not any(line.lstrip().startswith("# injected heading") for line in _outside_fences(summary)), summary


def test_gate_mode_gates_the_wheels_a_glob_names(tmp_path: Path, cli_env: Callable[..., dict[str, str]]) -> None:
    import zipfile

    (tmp_path / "dist").mkdir()
    with zipfile.ZipFile(tmp_path / "dist" / "demo_pure-1.0-py3-none-any.whl", "w") as zf:
        zf.writestr("demo_pure/__init__.py", "")
        zf.writestr("demo_pure-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo_pure\nVersion: 1.0\n")
        zf.writestr("demo_pure-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("demo_pure-1.0.dist-info/RECORD", "")
    code, out, summary = _step(tmp_path, cli_env, gate="dist/*.whl", args="--static-only", out="gate-out")
    assert code == 0, summary
    assert out["exit-code"] == "0"
    assert out["headline"].startswith("static audit: pass")
    assert "demo_pure-1.0-py3-none-any.whl" in summary  # the gate's summary.md went to the job summary
    assert (tmp_path / "gate-out" / "summary.md").is_file()
    code, out, summary = _step(tmp_path, cli_env, gate="nowhere/*.whl")
    assert code == 2
    assert "no wheel matches" in out["headline"]


def test_the_history_section_is_written_once_into_the_summary(tmp_path: Path, wheel_cache: Path,
                                                              cli_env: Callable[..., dict[str, str]]) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    hist = str(tmp_path / "hist" / "h.sqlite")
    for _ in range(2):
        code, _, summary = _step(tmp_path, cli_env, host="drv580", require_gpu_input="false", history_file=hist)
        assert code == 0, summary
    assert summary.count("### Since the last") == 1, summary
