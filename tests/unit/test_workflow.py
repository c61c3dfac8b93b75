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
    assert crons and all(len(c.split()) == 5 for c in crons)
    assert "workflow_dispatch" in on


def test_jobs(wf: dict[Any, Any]) -> None:
    assert {"plan", "run", "merge"} <= wf["jobs"].keys()


def test_plan_job_puts_the_github_matrix_into_an_output(wf: dict[Any, Any]) -> None:
    job = wf["jobs"]["plan"]
    assert plan_argv(wf) == ["plan", "matrix.yaml", "--format", "github"]
    (step,) = steps_running(job, "cumatrix plan")
    ref = re.fullmatch(r"\$\{\{\s*steps\.([\w-]+)\.outputs\.(\w+)\s*\}\}", job["outputs"]["matrix"])
    assert ref and step.get("id") == ref.group(1)
    assert f"{ref.group(2)}=" in step["run"] and "$GITHUB_OUTPUT" in step["run"]


def test_run_job_fans_out_over_the_plan(wf: dict[Any, Any]) -> None:
    job = wf["jobs"]["run"]
    assert needs(job) == ["plan"]
    assert job["strategy"]["fail-fast"] is False
    assert re.fullmatch(r"\$\{\{\s*fromJSON\(needs\.plan\.outputs\.matrix\)\s*\}\}", job["strategy"]["matrix"])
    assert re.fullmatch(r"\$\{\{\s*matrix\.runner\s*\}\}", job["runs-on"])


def test_run_job_runs_its_share_and_always_uploads_it(wf: dict[Any, Any]) -> None:
    job = wf["jobs"]["run"]
    (run,) = steps_running(job, "cumatrix run")
    assert run["run"].strip() == ('cumatrix run matrix.yaml --require-gpu -k "${{ matrix.k }}" --host ${{ matrix.host }} '
                                  "--out out/${{ matrix.host }}")
    uploads = steps_using(job, "actions/upload-artifact")
    assert len(uploads) == 1
    (up,) = uploads
    assert job["steps"].index(up) > job["steps"].index(run)
    assert up.get("if") == "always()"  # a failing cell exits 1: its results still travel
    assert up["with"]["path"] == "out/${{ matrix.host }}"
    assert "${{ matrix.host }}" in up["with"]["name"]


def test_merge_job_always_merges_and_summarises(wf: dict[Any, Any]) -> None:
    job = wf["jobs"]["merge"]
    assert needs(job) == ["run"]
    assert job.get("if") == "always()"
    (down,) = steps_using(job, "actions/download-artifact")
    up_name = steps_using(wf["jobs"]["run"], "actions/upload-artifact")[0]["with"]["name"]
    pattern = down["with"].get("pattern", "*")
    assert re.fullmatch(pattern.replace("*", ".*"), up_name.replace("${{ matrix.host }}", "h200-580"))
    assert down["with"]["path"] == "out"
    (merge,) = steps_running(job, "cumatrix merge")
    assert merge["run"].strip() == "cumatrix merge out/* --out merged"
    (summary,) = steps_running(job, "$GITHUB_STEP_SUMMARY")
    assert "merged/summary.md" in summary["run"] and ">>" in summary["run"]
    order = [job["steps"].index(s) for s in (down, merge, summary)]
    assert order == sorted(order)
    assert any(s["with"]["path"] == "merged" for s in steps_using(job, "actions/upload-artifact"))


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
    assert {"host", "runner", "k"} <= used
    for entry in include:
        assert used <= entry.keys(), (entry, used)
        # The run and merge commands, with this entry filled in, parse with cumatrix's CLI.
        (step,) = steps_running(wf["jobs"]["run"], "cumatrix run")
        line = MATRIX_REF.sub(lambda m, e=entry: str(e[m.group(1)]), step["run"].strip())
        args = cli.parser().parse_args(shlex.split(line)[1:])
        assert (args.matrix, args.keyword, args.host, args.out) == (
            "matrix.yaml", entry["k"], entry["host"], f"out/{entry['host']}")
    margs = cli.parser().parse_args(["merge", "out/results-a", "out/results-b", "--out", "merged"])
    assert margs.dirs == ["out/results-a", "out/results-b"] and margs.out == "merged"
