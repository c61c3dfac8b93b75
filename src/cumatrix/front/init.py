"""``cumatrix init``: a starting ``matrix.yaml`` and a nightly GitHub workflow for the project
in the current directory.

The package's name comes from ``--name``, else ``pyproject.toml`` (``[project] name``), else
``setup.cfg`` (``[metadata] name``), else ``setup.py`` (a literal ``name=`` argument); a directory
with none of these (a C or C++ project) gets a matrix whose case loads each runtime, to be replaced
by the project's own command.  A built wheel in ``dist/`` is gated by the workflow.  The workflow
installs cumatrix as the README's "Install" section does: from its repository, at the commit that
wrote it where pip recorded one.  The name, from wherever it comes, passes one check (a PEP 508
name; for a Python project, an import name that is an identifier) before it is written anywhere.
Existing files are never overwritten without ``--force``.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import json
import keyword
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cumatrix import __version__
from cumatrix.core.errors import UsageError
from cumatrix.core.options import DEFAULT_MATRIX
from cumatrix.core.private import write_new
from cumatrix.load.requirements import KNOWN_WHEELS

MATRIX_FILE = DEFAULT_MATRIX
WORKFLOW_FILE = ".github/workflows/cumatrix-nightly.yml"

#: The runtimes a new matrix starts with: the oldest and newest of each major cumatrix knows.
_START_RUNTIMES = ("12.4", "12.9", "13.0")


@dataclass(frozen=True, kw_only=True, slots=True)
class Project:
    """What ``init`` found about the project in a directory."""

    name: str  # the distribution name as declared (or given by --name)
    module: str  # the import name guessed from it
    found_in: str  # pyproject.toml, setup.cfg, setup.py, --name or the directory's name
    python: bool  # a Python project (pip can install it), as opposed to, say, a C library
    wheels: tuple[str, ...]  # dist/*.whl, relative


def _from_pyproject(d: Path) -> str | None:
    p = d / "pyproject.toml"
    if not p.is_file():
        return None
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: not valid TOML ({e})") from e
    name = data.get("project", {}).get("name") or data.get("tool", {}).get("poetry", {}).get("name")
    return str(name) if name else None


def _from_setup_cfg(d: Path) -> str | None:
    p = d / "setup.cfg"
    if not p.is_file():
        return None
    cp = configparser.ConfigParser(interpolation=None)
    try:
        cp.read(p, encoding="utf-8")
    except configparser.Error as e:
        raise UsageError(f"{p}: not a valid setup.cfg ({e})") from e
    return cp.get("metadata", "name", fallback=None) or None


def _from_setup_py(d: Path) -> str | None:
    p = d / "setup.py"
    if not p.is_file():
        return None
    try:
        tree = ast.parse(p.read_text(encoding="utf-8"), str(p))
    except (SyntaxError, UnicodeDecodeError):
        return None
    # Read, never run: only a literal name= argument of a call counts.
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    return kw.value.value
    return None


#: Where cumatrix comes from: its repository (``[project.urls] Repository`` of pyproject.toml;
#: a test holds the two to the same address).  There is no release on the package index yet.
REPOSITORY = "https://github.com/cumatrix/cumatrix"

#: How the README's "Install" section installs cumatrix without a clone; the workflow ``init``
#: writes installs it the same way (a test holds the README and this to the same command, and
#: runs the workflow's step against a copy of the repository).
INSTALL_COMMAND = f"pip install git+{REPOSITORY}"

#: A project name as PEP 508 has it: what ``--name`` and every packaging file must hold.  It
#: goes into YAML (plain scalars and comments), a Python ``import`` and the terminal, and none of
#: these characters means anything in any of them.
_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_NAME_RULE = "a project name is letters, digits, '.', '_' and '-' (starting and ending with a letter or digit)"


def _checked_name(name: str, where: str) -> str:
    """``name`` when it is a project name; else :class:`UsageError` (exit 2) saying where it came
    from.  The name is shown by ``repr``: a newline or a terminal escape in it is written out."""
    if len(name) > 200 or not _NAME_RE.fullmatch(name):
        shown = repr(name if len(name) <= 200 else name[:200] + "...")
        raise UsageError(f"{where}: the name {shown} is not a project name: {_NAME_RULE}; "
                         "give one with --name NAME")
    return name


def _module_of(name: str, where: str) -> str:
    """The import name of a Python project named ``name`` (``my-pkg.x`` -> ``my_pkg_x``): a
    Python identifier, since it is written into ``import ...``; else :class:`UsageError`."""
    module = re.sub(r"[-.]+", "_", name).lower()
    if not module.isidentifier() or keyword.iskeyword(module):
        raise UsageError(f"{where}: the project {name!r} would be imported as {module!r}, which is not a Python "
                         "identifier; give the name it is imported by with --name NAME")
    return module


def _pinned_source() -> str:
    """The pip requirement of the cumatrix that runs: its repository, at the commit it was
    installed from where pip recorded one (PEP 610's ``direct_url.json`` of a ``git+`` install)."""
    from importlib import metadata  # deferred: only init writes a workflow

    try:
        raw = metadata.distribution("cumatrix").read_text("direct_url.json")
        info = json.loads(raw) if raw else {}
    except (metadata.PackageNotFoundError, OSError, ValueError):
        info = {}
    commit = info.get("vcs_info", {}).get("commit_id") if isinstance(info, dict) else None
    if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit):
        return f"git+{REPOSITORY}@{commit}"
    return f"git+{REPOSITORY}"


def find_project(d: Path, *, name: str | None = None) -> Project:
    """The project in ``d``: ``name`` if given, else the one its packaging file names, else
    (no Python project here) the directory's own name."""
    wheels = tuple(sorted(str(p.relative_to(d)) for p in (d / "dist").glob("*.whl"))) \
        if (d / "dist").is_dir() else ()
    declared = _declared_name(d)
    python = declared is not None or any((d / f).is_file() for f in ("pyproject.toml", "setup.cfg", "setup.py"))
    found = _project_name(d, name, declared)
    where = found[1] if found[1] in ("--name", "the directory's name") else str(d / found[1])
    module = _module_of(found[0], where) if python else re.sub(r"[-.]+", "_", found[0]).lower()
    return Project(name=found[0], module=module, found_in=found[1], wheels=wheels, python=python)


def _declared_name(d: Path) -> tuple[str, str] | None:
    """(name, file) of the first packaging file in ``d`` that declares a project name, or None."""
    for where, fn in (("pyproject.toml", _from_pyproject), ("setup.cfg", _from_setup_cfg), ("setup.py", _from_setup_py)):
        declared = fn(d)
        if declared:
            return (declared, where)
    return None


def _project_name(d: Path, name: str | None, found: tuple[str, str] | None) -> tuple[str, str]:
    """(name, where it came from): ``name`` (--name), else ``found`` (a packaging file of ``d``),
    else ``d``'s own name; each checked before it is written into YAML, an import and the terminal."""
    if name is not None:
        if not _NAME_RE.fullmatch(name):
            raise UsageError(f"--name {name!r}: {_NAME_RULE}")
        return (name, "--name")
    if found is not None:
        # Text from the project's files, checked as --name is: it is written into YAML, an import and the terminal.
        _checked_name(found[0], str(d / found[1]))
        return found
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", d.resolve().name).strip("-._")
    if not base:
        raise UsageError(f"{d}: no project name found (no pyproject.toml, setup.cfg or setup.py, and the "
                         "directory's name is not one); name it with --name NAME")
    return (base, "the directory's name")


def _matrix_body(runtimes: str, case: str) -> str:
    """The matrix below its header comment: the runtimes, the host's and an emulated driver, one case."""
    return f"version: 1\nruntimes:\n{runtimes}\ndrivers: [host, emulated-12.4]\ncases:\n{case}"


def matrix_text(project: Project) -> str:
    """The starting matrix: the package imported under a few CUDA runtimes and the host's driver."""
    runtimes = "\n".join(f"  cu{v}: {{wheel: {KNOWN_WHEELS[v]}}}" for v in _START_RUNTIMES)
    if not project.python:
        return f"""\
# cumatrix matrix for {project.name} (written by `cumatrix init`; edit freely).
# Each case runs once per runtime x driver pairing, in its own process, with that CUDA
# runtime as the libcudart it loads ($CUMATRIX_CUDART names it).  Replace the case's argv
# with your program's command (relative paths are from this file's directory).
# `cumatrix validate {MATRIX_FILE}` checks this file; `cumatrix run` runs it.
""" + _matrix_body(runtimes, """\
  - {name: load-runtime, argv: [python3, -c, "import ctypes, os; ctypes.CDLL(os.environ['CUMATRIX_CUDART'])"],
     timeout: 120, python: harness}
""")
    return f"""\
# cumatrix matrix for {project.name} (written by `cumatrix init`; edit freely).
# Each case runs once per runtime x driver pairing, in its own process, with that CUDA
# runtime as the libcudart it loads.  `cumatrix validate {MATRIX_FILE}` checks this file;
# `cumatrix run` runs it.  Install {project.name} into the Python that runs cumatrix first:
# `python: harness` puts that interpreter first on the case's PATH (without it, a case's
# `python3` is whatever the PATH outside the harness's environment finds).
""" + _matrix_body(runtimes, f"""\
  - {{name: import-{project.module.replace('_', '-')}, argv: [python3, -c, "import {project.module}"], timeout: 120,
     python: harness}}
""")


def workflow_text(project: Project) -> str:
    """A nightly workflow: install, doctor, run the matrix on a GPU runner, gate the wheel."""
    # The README's command: cumatrix from its repository (it is not on the package index), at the
    # commit that wrote this file where pip recorded one: a nightly that follows whatever is newest
    # would change its judge under the project's feet.
    source = _pinned_source()
    install = INSTALL_COMMAND.replace(f"git+{REPOSITORY}", f'"{source}"')
    pin = "" if "@" in source else (
        "      # cumatrix from its repository's default branch: append @TAG or @COMMIT to the URL to pin it\n")
    project_step = "" if not project.python else f"""\
      - name: install {project.name}
        run: python -m pip install .
"""
    gate = ""
    if project.wheels:
        gate = """
      - name: gate the wheel
        run: |
          python -m pip install build
          python -m build --wheel --outdir dist .
          cumatrix gate dist/*.whl --out gate-out
"""
    return f"""\
# Nightly CUDA compatibility of {project.name} (written by `cumatrix init` of cumatrix {__version__}).
# The run job needs a self-hosted Linux runner with an NVIDIA GPU: add your GPU runners' own
# label to `runs-on`. Without a GPU every GPU cell is skipped, and `--require-gpu` fails them
# (`cumatrix run` alone would exit 5, nothing tested) instead of passing.
name: cumatrix-nightly

on:
  schedule:
    - cron: "23 3 * * *"
  workflow_dispatch:

permissions:
  contents: read

jobs:
  run:
    runs-on: [self-hosted, linux, x64]
    timeout-minutes: 120
    steps:
      - uses: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683  # v4.2.2
{pin}      - name: install cumatrix
        run: |
          python3 -m venv .venv
          .venv/bin/python -m {install}
          echo "$PWD/.venv/bin" >> "$GITHUB_PATH"
{project_step}      - name: doctor
        run: cumatrix doctor
      - name: validate the matrix
        run: cumatrix validate {MATRIX_FILE} --check-wheels
      - name: run
        run: cumatrix run {MATRIX_FILE} --require-gpu --out out
      - name: summary
        if: always()
        run: if [ -f out/summary.md ]; then cat out/summary.md >> "$GITHUB_STEP_SUMMARY"; fi
{gate}      - name: upload
        if: always()
        uses: actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02  # v4.6.2
        with:
          name: cumatrix-results
          path: out
          if-no-files-found: warn
"""


def cmd_init(args: argparse.Namespace) -> int:
    """Write the two files; exit 2 (writing neither) when one exists and --force is not given."""
    d = Path(args.dir)
    if not d.is_dir():
        raise UsageError(f"--dir {args.dir}: {'not a directory' if d.exists() else 'no such directory'}")
    project = find_project(d, name=args.name)
    targets = {d / MATRIX_FILE: matrix_text(project), d / WORKFLOW_FILE: workflow_text(project)}
    # lexists: a link counts as there even when it leads nowhere (a dangling link was written
    # through, to wherever it pointed).
    existing = [str(p) for p in targets if os.path.lexists(p)]
    if existing and not args.force:
        raise UsageError(f"{', '.join(existing)} exist{'s' if len(existing) == 1 else ''}: not overwriting "
                         "(--force replaces them)")
    for p, text in targets.items():
        _write_target(p, text, force=args.force)
    wheels = f"; wheels in dist/: {', '.join(project.wheels)}" if project.wheels else ""
    print(f"cumatrix: package {project.name} (from {project.found_in}, imported as {project.module}){wheels}")
    print(f"next: cumatrix validate {d / MATRIX_FILE} && cumatrix run {d / MATRIX_FILE}")
    return 0


def _write_target(p: Path, text: str, *, force: bool) -> None:
    """Write ``text`` to ``p`` (never through a link; ``force`` replaces the link itself); a
    failure is a usage error that names the file."""
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_new(p, text, replace=force)
    except FileExistsError:
        raise UsageError(f"{p} appeared while init ran: not overwriting (--force replaces it)") from None
    except OSError as e:
        raise UsageError(f"{p}: cannot write it: {e.strerror or e}") from None
    print(f"cumatrix: wrote {p}")


def add_init_parser(sub: Any) -> None:
    """Register ``cumatrix init``."""
    p = sub.add_parser("init", help="write a starting matrix.yaml and a nightly GitHub workflow for this project",
                       description="Write matrix.yaml (the package imported under a few CUDA runtimes) and "
                                   f"{WORKFLOW_FILE} for the project in the current directory. The name "
                                   "comes from --name, pyproject.toml, setup.cfg or setup.py, else the directory; "
                                   "a wheel in dist/ adds a gate step. Existing files are kept unless --force.",
                       epilog="examples:\n  cumatrix init                  # in the project's root\n"
                              "  cumatrix init --name mylib     # a C/C++ project, or another name\n"
                              "  cumatrix init --force          # replace both files",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=".", metavar="DIR", help="the project's root (default: .)")
    p.add_argument("--name", metavar="NAME", help="the project's name (default: the one pyproject.toml, setup.cfg "
                   "or setup.py declares, else the directory's name)")
    p.add_argument("--force", action="store_true", help="overwrite matrix.yaml and the workflow if they exist")
    p.set_defaults(func=cmd_init)
