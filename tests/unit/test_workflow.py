"""The nightly GitHub workflow: its shape, and that its commands fit together.

`plan` writes the strategy matrix that `run` consumes: every ``matrix.X`` the run job
uses must be a key that ``cumatrix plan --format github`` gives, and the commands it runs
must parse with cumatrix's own command line.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from cumatrix.front import cli

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
MATRIX_REF = re.compile(r"\$\{\{\s*matrix\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}")


@pytest.fixture(scope="module")
def wf() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def steps_running(job: dict[str, Any], needle: str) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if needle in s.get("run", "")]


def steps_using(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s for s in job["steps"] if s.get("uses", "").split("@")[0] == action]


def needs(job: dict[str, Any]) -> list[str]:
    n = job.get("needs", [])
    return [n] if isinstance(n, str) else list(n)


def plan_argv(wf: dict[Any, Any]) -> list[str]:
    """The argv (after ``cumatrix``) of the plan command the workflow runs."""
    (step,) = steps_running(wf["jobs"]["plan"], "cumatrix plan")
    m = re.search(r"cumatrix (plan [^)\n]*)", step["run"])
    assert m, step["run"]
    return shlex.split(m.group(1))


def test_triggers_nightly_and_by_hand(wf: dict[Any, Any]) -> None:
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert isinstance(on, dict)
    crons = [s["cron"] for s in on["schedule"]]
    assert crons
    assert all(len(c.split()) == 5 for c in crons)
    assert "workflow_dispatch" in on


def test_jobs(wf: dict[Any, Any]) -> None:
    assert {"plan", "run", "merge"} <= wf["jobs"].keys()


def test_plan_job_puts_the_github_matrix_into_an_output(wf: dict[Any, Any]) -> None:
    job = wf["jobs"]["plan"]
    assert plan_argv(wf) == ["plan", "matrix.yaml", "--format", "github"]
    (step,) = steps_running(job, "cumatrix plan")
    ref = re.fullmatch(r"\$\{\{\s*steps\.([\w-]+)\.outputs\.(\w+)\s*\}\}", job["outputs"]["matrix"])
    assert ref
    assert step.get("id") == ref.group(1)
    assert f"{ref.group(2)}=" in step["run"]
    assert "$GITHUB_OUTPUT" in step["run"]


def test_run_job_fans_out_over_the_plan(wf: dict[Any, Any]) -> None:
    job = wf["jobs"]["run"]
    assert needs(job) == ["plan"]
    assert job["strategy"]["fail-fast"] is False
    assert re.fullmatch(r"\$\{\{\s*fromJSON\(needs\.plan\.outputs\.matrix\)\s*\}\}", job["strategy"]["matrix"])
    assert re.fullmatch(r"\$\{\{\s*matrix\.runner\s*\}\}", job["runs-on"])


def action_step(job: dict[str, Any], step_id: str) -> dict[str, Any]:
    (step,) = [s for s in job["steps"] if s.get("id") == step_id]
    assert step["uses"] == "./", step  # the repository's own composite action (action.yml)
    return step


def action_argv(inputs: dict[str, str]) -> list[str]:
    """The command line the action's script builds for these inputs (as scripts/github-action.sh)."""
    argv = ["run", inputs.get("matrix", "matrix.yaml"), "--out", inputs.get("out", "out")]
    if inputs.get("require-gpu", "true") == "true":
        argv.append("--require-gpu")
    if inputs.get("host"):
        argv += ["--host", inputs["host"]]
    return argv + shlex.split(inputs.get("args", ""))


def test_run_job_runs_its_share_through_the_action_and_always_uploads_it(wf: dict[Any, Any]) -> None:
    job = wf["jobs"]["run"]
    run = action_step(job, "run")
    assert run["with"]["host"] == "${{ matrix.host }}"
    assert run["with"]["require-gpu"] == "true"
    assert run["with"]["out"] == "out/${{ matrix.host }}"
    uploads = steps_using(job, "actions/upload-artifact")
    assert len(uploads) == 1
    (up,) = uploads
    assert job["steps"].index(up) > job["steps"].index(run)
    assert up.get("if") == "always()"  # a failing cell exits 1: its results still travel
    assert up["with"]["path"] == run["with"]["out"]
    assert "${{ matrix.host }}" in up["with"]["name"]


def test_merge_job_always_merges_keeps_history_and_fails_on_a_missing_host(wf: dict[Any, Any]) -> None:
    job = wf["jobs"]["merge"]
    assert needs(job) == ["run"]
    assert job.get("if") == "always()"
    (down,) = steps_using(job, "actions/download-artifact")
    up_name = steps_using(wf["jobs"]["run"], "actions/upload-artifact")[0]["with"]["name"]
    pattern = down["with"].get("pattern", "*")
    assert re.fullmatch(pattern.replace("*", ".*"), up_name.replace("${{ matrix.host }}", "h200-580"))
    merge = action_step(job, "merge")
    assert merge["with"]["merge-from"] == down["with"]["path"] + "/*"
    assert merge["with"]["fail"] == "false"  # the upload runs; the verdict step fails the job
    # The history is carried from night to night: restored from the newest earlier cache entry
    # (restore-keys prefix), saved under a key of its own.
    (cache,) = steps_using(job, "actions/cache")
    assert cache["with"]["path"] == merge["with"]["history-file"]
    prefix = cache["with"]["restore-keys"].strip()
    assert cache["with"]["key"].startswith(prefix)
    assert "github.run_id" in cache["with"]["key"]
    order = [job["steps"].index(s) for s in (down, cache, merge)]
    assert order == sorted(order)
    (up,) = [s for s in steps_using(job, "actions/upload-artifact") if s["with"]["path"] == merge["with"]["out"]]
    assert up.get("if") == "always()"
    (verdict,) = steps_running(job, "exit")
    assert verdict["env"]["CODE"] == "${{ steps.merge.outputs.exit-code }}"
    assert 'exit "$CODE"' in verdict["run"]
    assert job["steps"].index(verdict) == len(job["steps"]) - 1


ACTION = ROOT / "action.yml"
SCRIPT = ROOT / "scripts" / "github-action.sh"


def test_action_passes_every_input_to_its_script_and_every_output_from_it() -> None:
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    inputs = set(action["inputs"])
    assert {"matrix", "require-gpu", "history-file", "out", "args"} <= inputs
    assert set(action["outputs"]) == {"headline", "exit-code", "reports-dir"}
    (step,) = [s for s in action["runs"]["steps"] if s.get("id") == "cumatrix"]
    used = {m.group(1) for v in step["env"].values() for m in [re.fullmatch(r"\$\{\{ inputs\.([\w-]+) \}\}", v)] if m}
    assert used | {"install"} == inputs
    script = SCRIPT.read_text()
    assert all(name in script for name in step["env"])
    for name, out in action["outputs"].items():
        assert out["value"] == f"${{{{ steps.cumatrix.outputs.{name} }}}}"
        assert f"emit {name} " in script
    assert 'GITHUB_ACTION_PATH/scripts/github-action.sh' in step["run"]


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    import os
    import shutil
    import subprocess
    import sys

    exe = shutil.which("actionlint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("actionlint is not installed (the test extras install it)")
        pytest.skip("actionlint is not installed (pip install -e '.[test]')")
    # actionlint also checks each `uses: ./` step's inputs against action.yml.
    proc = subprocess.run([exe, "-no-color", "-oneline"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("matrix_file", ["matrix.yaml", "examples/hosts.yaml"])
def test_plan_output_has_every_key_the_run_job_uses(wf: dict[Any, Any], matrix_file: str,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    if not (ROOT / matrix_file).is_file():
        pytest.skip(f"{matrix_file} is not in this checkout")
    monkeypatch.chdir(ROOT)
    argv = plan_argv(wf)
    argv[argv.index("matrix.yaml")] = matrix_file
    assert cli.main(argv) == 0
    include = json.loads(capsys.readouterr().out)["include"]
    assert include
    used = set(MATRIX_REF.findall(yaml.safe_dump(wf["jobs"]["run"])))
    assert {"host", "runner"} <= used
    for entry in include:
        assert used <= entry.keys(), (entry, used)
        # The run command the action builds, with this entry filled in, parses with cumatrix's CLI.
        run = action_step(wf["jobs"]["run"], "run")
        inputs = {k: MATRIX_REF.sub(lambda m, e=entry: str(e[m.group(1)]), str(v)) for k, v in run["with"].items()}
        args = cli.parser().parse_args(action_argv(inputs))
        assert (args.matrix, args.host, args.out, args.require_gpu) == (
            "matrix.yaml", entry["host"], f"out/{entry['host']}", True)
    margs = cli.parser().parse_args(["merge", "out/results-a", "out/results-b", "--out", "merged", "--matrix",
                                     "matrix.yaml"])
    assert margs.dirs == ["out/results-a", "out/results-b"]
    assert margs.out == "merged"
    assert margs.matrix == "matrix.yaml"
