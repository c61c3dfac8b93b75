"""The ``cumatrix`` command.

Exit codes: 0 every cell met its expectation; 1 some cell did not; 2 bad usage or bad
input (a message naming file:line:col where there is one, never a traceback); 3 the run cannot
happen here; 5 nothing ran (no cell selected, every cell skipped; ``--allow-empty``: 0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cumatrix import __version__
from cumatrix.core import sinks
from cumatrix.core.errors import (
    ConfigError,
    CumatrixError,
    EnvironmentProblem,
    HarnessError,
    UsageError,
)
from cumatrix.core.options import DEFAULT_MATRIX, DEFAULT_OUT, RunOptions
from cumatrix.front.flags import add_cover_options
from cumatrix.front.history_cli import add_history_options, add_history_parsers
from cumatrix.front.init import add_init_parser
from cumatrix.front.merge_cmd import cmd_merge, cmd_report
from cumatrix.front.run_cmd import add_run, wheel_dir_arg
from cumatrix.front.run_cmd import matrix_arg as _matrix_arg
from cumatrix.load import gcpause
from cumatrix.load import matrix as _matrix

if TYPE_CHECKING:
    from cumatrix.core.model import Cell, Matrix
    from cumatrix.front.slurm import SlurmPlan

EPILOG_CALIBRATE = """\
examples:
  cumatrix calibrate                                   # the default sizes and counts, table in the cache
  cumatrix calibrate --sizes 4k 16k 2MiB --counts 1024 --out calib.txt
"""
EPILOGS = {
    "validate": """\
examples:
  cumatrix validate matrix.yaml          # every problem as file:line:col, exit 2
  cumatrix validate matrix.yaml --list   # and every cell id, for -k
  cumatrix validate matrix.yaml --check-wheels   # and every runtime wheel exists on the index
  cumatrix validate matrix.yaml --json   # one JSON document: ok, cells, problems
""",
    "plan": """\
examples:
  cumatrix plan examples/hosts.yaml                 # GitHub Actions strategy.matrix
  cumatrix plan examples/hosts.yaml --format json   # which cells each host runs
  cumatrix plan examples/hosts.yaml --format slurm --out /shared/nightly   # sbatch scripts
""",
    "submit": """\
examples:
  cumatrix submit --slurm examples/hosts.yaml --out /shared/nightly   # a task per host, then the merge
  cumatrix submit --slurm matrix.yaml --sbatch-arg=--time=04:00:00 --run-arg=--require-gpu
""",
    "report": """\
examples:
  cumatrix report              # rebuild ./out's reports from out/results.jsonl
  cumatrix report nightly-out  # a killed run's --out directory
""",
    "merge": """\
examples:
  cumatrix merge out-h200 out-a100 --out merged   # one report from the runs of two hosts
  cumatrix merge out/* --out merged --matrix matrix.yaml   # every cell of matrix.yaml is expected

exit status: 0 every planned cell ran and every tested one met its expectation; 1 a cell did
not, or a host of the plan left cells unrun (named); 2 bad input; 5 no cell was tested (every
one skipped), 0 with --allow-empty.
""",
    "doctor": """\
examples:
  cumatrix doctor                        # what is here, what is missing, how to fix it
  cumatrix doctor --require gpu,docker   # exit 1 unless a GPU and dockerd are here (CI)
  cumatrix doctor --json                 # machine-readable, every check included
""",
    "build": """\
examples:
  cumatrix build proc-address --headers 13.0   # prints the library path
  cumatrix build loop --family driver --headers 12.8
""",
    "clean": """\
examples:
  cumatrix clean                     # the cache and dead runs' temporary directories
  cumatrix clean --images            # cumatrix's images no container uses (asks first)
  cumatrix clean --images --yes      # the same without asking (CI)
  cumatrix clean --dry-run           # say what would go
""",
}


#: Each command's description in its --help, above its options.
DESCRIPTIONS = {
    "plan": "Print which cells each host of `hosts:` runs, as a GitHub Actions strategy matrix or JSON.",
    "submit": "Write the Slurm scripts (as `plan --format slurm`), submit them with sbatch, follow the jobs "
        "(squeue, scontrol), then merge the hosts' results into OUT/merged. Exit status: the merge's "
        "(0 pass; 1 a cell failed or a host left planned cells unrun, named; 2 bad input; 3 Slurm refused).",
    "doctor": "Check Python, gcc, the matrix's runtimes (cached or fetchable), a GPU, nvcc, the Docker daemon "
        "and base image, debootstrap, Chromium, bubblewrap, the compiled evidence helpers, gdb and "
        "Slurm's client. Exit 0 when every required check passes (what `cumatrix run` needs, plus "
        "--require), else 1.",
    "clean": "Remove what cumatrix made: the cache directory and the temporary directories of runs that are "
        "gone (default); with --images, runtime and base images and their untagged build stages (found by "
        "their labels), never one a container uses, listed first and removed after a yes (--yes, or an "
        "answer on a terminal; without either, exit 2). --images --cache: both.",
    "build": "Compile a reference variant; prints the library path as the last line (exit 0) or the "
        "compiler's message (exit 1: build-error).",
}


def _plugin_args() -> list[str]:
    """Load the plugin explicitly unless its pytest11 entry point is installed (pytest as
    the user runs it, plugins autoloaded)."""
    from importlib import metadata  # 60 ms to import: only here, not in every command

    try:
        eps = metadata.entry_points(group="pytest11")
        installed = any(ep.value == "cumatrix.front.pytest_plugin.hooks" for ep in eps)
    except (OSError, ValueError, KeyError, AttributeError):  # broken metadata of an unrelated distribution
        installed = False
    return [] if installed else ["-p", "cumatrix.front.pytest_plugin.hooks"]



# --------------------------------------------------------------------------- validate, plan


def cmd_validate(args: argparse.Namespace) -> int:
    path = _matrix_arg(args.matrix)
    wheel_dir = wheel_dir_arg(args.wheel_dir)
    try:
        m = _load_checked(path, check_wheels=args.check_wheels, wheel_dir=wheel_dir)
    except ConfigError as e:
        if not args.json:
            raise
        _print_json({"schema": "cumatrix-validate/1", "file": str(path), "ok": False, "problems": _problems(path, e)})
        return 2
    cells = _matrix.cells(m)
    kinds: dict[str, int] = {}
    for c in cells:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    if args.json:
        _print_json(_validated_doc(args, m, cells, kinds))
        return 0
    parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    checked = "; every wheel requirement resolves" if args.check_wheels else ""
    print(f"{m.path}: ok: {len(cells)} cells ({parts}) from {len(m.runtimes)} runtimes x {len(m.drivers)} drivers"
          f"{checked}")
    if args.list:
        for c in cells:
            print(c.id)
    return 0


def _load_checked(path: Path, *, check_wheels: bool, wheel_dir: Path | None) -> Matrix:
    """The matrix at ``path``; with ``check_wheels``, once every wheel requirement resolves
    (a :class:`ConfigError` naming each that does not)."""
    m = _matrix.load(path)
    if check_wheels:
        # deferred: only `validate --check-wheels` asks the index (~50 ms of imports)
        from cumatrix.front.checkwheels import check_wheels as check

        problems = check(m, wheel_dir=wheel_dir)
        if problems:
            raise ConfigError(problems)
    return m


def _problems(path: Path, e: ConfigError) -> list[dict[str, object]]:
    """``validate --json``'s problems: each with its place, or the error alone."""
    found: list[dict[str, object]] = [{"file": p.file, "line": p.line, "col": p.col, "message": p.message}
                                      for p in e.problems]
    if not found:  # an error without a place (a whole-file problem)
        found = [{"file": str(path), "line": None, "col": None, "message": str(e)}]
    return found


def _validated_doc(args: argparse.Namespace, m: Matrix, cells: list[Cell], kinds: dict[str, int]) -> dict[str, object]:
    """``validate --json``'s document of a good matrix."""
    doc: dict[str, object] = {"schema": "cumatrix-validate/1", "file": m.path, "ok": True, "problems": [],
                              "cells": len(cells), "kinds": kinds, "runtimes": [r.name for r in m.runtimes],
                              "drivers": [d.name for d in m.drivers], "wheels_checked": bool(args.check_wheels)}
    if args.list:
        doc["cell_ids"] = [c.id for c in cells]
    return doc


def _print_json(doc: dict[str, object]) -> None:
    # deferred: cumatrix.report costs ~70-110 ms and ~85 modules (jinja2); only the commands that write reports
    from cumatrix.report.jsonout import dumps

    sys.stdout.write(dumps(doc))
    sys.stdout.flush()


def cmd_plan(args: argparse.Namespace) -> int:
    # deferred: plan and slurm cost ~45-80 ms; only these commands
    from cumatrix.front import plan

    if args.format == "slurm":
        mpath = _matrix_arg(args.matrix)
        sp = _slurm_scripts(args, mpath, Path(args.out or DEFAULT_OUT))
        for p in (sp.array_script, sp.merge_script, sp.submit_script):
            print(p)
        print(f"cumatrix: {len(sp.tasks)} array tasks ({_hosts(sp)}); submit with "
              f"`bash {sp.submit_script}` or `cumatrix submit --slurm {mpath} --out {args.out or DEFAULT_OUT}`",
              file=sys.stderr)
        return 0
    if args.format == "k8s":
        # deferred: the manifests' writer (PyYAML's emitter), only for --format k8s
        from cumatrix.front import k8s

        kp = k8s.write_manifests(_matrix_arg(args.matrix), Path(args.out or DEFAULT_OUT), image=args.image,
                                 claim=args.claim, run_args=[*args.run_arg, *_cover_words(args)])
        print(kp.nightly)
        print(kp.merge)
        print(f"cumatrix: submission {kp.submission}: {len(kp.jobs)} Jobs ({', '.join(kp.jobs)}); "
              f"`kubectl apply -f {kp.nightly}`, wait for them, then `kubectl apply -f {kp.merge}` "
              "(docs/nightly-k8s.md)", file=sys.stderr)
        return 0
    data = plan.plan(_matrix_arg(args.matrix), RunOptions.from_cli(args).selection)
    print(json.dumps(data if args.format == "json" else plan.github_matrix(data), indent=None if args.format == "github" else 2))
    return 0


def _cover_words(args: argparse.Namespace) -> list[str]:
    """``--cover``, ``--seed``, ``--rotate``, ``--night`` (checked) for each host's run."""
    # deferred: plan costs ~45 ms and ~35 modules; only plan and submit
    from cumatrix.front.plan import selection_args

    return selection_args(RunOptions.from_cli(args).selection)


def cmd_submit(args: argparse.Namespace) -> int:
    # deferred: slurm (~80 ms of imports), only for submit
    from cumatrix.front import slurm

    if not args.slurm:
        raise UsageError("submit: name the scheduler: `cumatrix submit --slurm MATRIX`")
    mpath = _matrix_arg(args.matrix)
    sp = _slurm_scripts(args, mpath, Path(args.out))
    submission = slurm.new_submission()
    array, merge = slurm.submit(sp, submission)
    print(f"cumatrix: slurm: submission {submission}: array job {array} ({len(sp.tasks)} hosts: {_hosts(sp)}), "
          f"merge job {merge}; scripts in {sp.array_script.parent}", file=sys.stderr, flush=True)
    try:
        final = slurm.wait(sp, array, merge, poll=args.poll)
    except KeyboardInterrupt:
        print(f"cumatrix: stopped waiting; the jobs go on (scancel {array} {merge} to stop them)", file=sys.stderr)
        return 130
    bad = _unfinished_tasks(final)
    dirs = [sp.host_dir(t.host) for t in sp.tasks if (sp.host_dir(t.host) / "results.jsonl").is_file()]
    if not dirs:
        print(f"cumatrix: merge: no host wrote results ({_hosts(sp)}); see the job logs in "
              f"{sp.array_script.parent}", file=sys.stderr)
        return 1
    # Only this submission's results: a task that failed before it wrote any leaves the last
    # submission's in its directory, and those are not tonight's (the host is not-run, named).
    return cmd_merge(argparse.Namespace(dirs=[str(d) for d in dirs], out=str(sp.merged_dir), matrix=str(mpath),
                                        submission=submission,
                                        notes={h: f"its task ended {s}" for h, s in bad.items()}))


def _slurm_scripts(args: argparse.Namespace, mpath: Path, out: Path) -> SlurmPlan:
    """The Slurm scripts of the matrix at ``mpath`` under ``out``, with the options' words
    (``--run-arg``, ``--sbatch-arg``, the covering plan's) checked."""
    # deferred: slurm (~80 ms of imports), only for plan --format slurm and submit
    from cumatrix.front import slurm

    return slurm.write_scripts(mpath, out, run_args=[*slurm.check_args(args.run_arg, "--run-arg"), *_cover_words(args)],
                               sbatch_args=slurm.check_args(args.sbatch_arg, "--sbatch-arg"))


def _hosts(sp: SlurmPlan) -> str:
    """The hosts of the scripts' tasks, as the messages list them."""
    return ", ".join(t.host for t in sp.tasks)


def _unfinished_tasks(final: dict[str, str]) -> dict[str, str]:
    """The host tasks that ended in another state than COMPLETED (said), by host."""
    bad = {h: s for h, s in final.items() if h != "merge" and s.split()[0] != "COMPLETED"}
    if bad:
        print(f"cumatrix: slurm: host tasks that did not complete: {', '.join(f'{h} {s}' for h, s in bad.items())}",
              file=sys.stderr)
    return bad


# --------------------------------------------------------------------------- doctor, build


def cmd_doctor(args: argparse.Namespace) -> int:
    # deferred: doctor costs ~120 ms and ~50 modules; only this command
    from cumatrix.front.doctor import doctor

    matrix = Path(args.matrix) if args.matrix else (Path(DEFAULT_MATRIX) if Path(DEFAULT_MATRIX).is_file() else None)
    if matrix is not None and not matrix.is_file():
        raise UsageError(f"{matrix}: no such matrix file")
    return doctor(as_json=args.json, matrix=matrix, wheel_dir=RunOptions.from_cli(args).wheel_dir,
                  require=args.require, version=__version__)


def cmd_clean(args: argparse.Namespace) -> int:
    # deferred: clean costs ~270 ms and ~300 modules (docker SDK); only this command
    from cumatrix.front.clean import cmd_clean as clean

    return clean(images=args.images, cache=args.cache, dry_run=args.dry_run, yes=args.yes)


def cmd_build(args: argparse.Namespace) -> int:
    # deferred: the build module costs ~25 ms and ~30 modules; only this command
    from cumatrix.provision import build

    return build.cli_build(args.variant, args.headers, wheel_dir_arg(args.wheel_dir), family=args.family)


#: The matrix a command takes when none is named: the one `run` takes.
MATRIX_DEFAULT_HELP = f"matrix file (default: ./{DEFAULT_MATRIX}, else the default matrix bundled with cumatrix, as run)"


def _command(sub: Any, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand's parser: its one-line help, its description (``DESCRIPTIONS``) and its
    examples (``EPILOGS``)."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=summary, description=DESCRIPTIONS.get(name),
                                                epilog=EPILOGS[name],
                                                formatter_class=argparse.RawDescriptionHelpFormatter)
    return p


def add_misc(sub: Any) -> None:
    p = _command(sub, "validate", "check a matrix file; list its cells")
    p.add_argument("matrix", nargs="?", help=MATRIX_DEFAULT_HELP)
    p.add_argument("--list", action="store_true", help="print every cell id")
    p.add_argument("--check-wheels", action="store_true",
                   help="resolve every wheel requirement against the package index (or --wheel-dir): a version "
                        "that does not exist is a problem at its place in the file")
    p.add_argument("--wheel-dir", metavar="DIR", help="--check-wheels: look in DIR only (offline)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout (docs/json-output.md)")
    p.set_defaults(func=cmd_validate)

    p = _command(sub, "plan", "spread a matrix over the hosts it names (CI strategy matrix)")
    p.add_argument("matrix", nargs="?", help=f"matrix file with a hosts: section ({MATRIX_DEFAULT_HELP[:-1]})")
    p.add_argument("--format", choices=("github", "json", "slurm", "k8s"), default="github",
                   help="github: strategy.matrix JSON; json: each host's share; slurm: write a job-array "
                        "script (a task per host), the merge job after it and submit.sh under OUT/slurm/; k8s: an "
                        "Indexed Job per host and the merge Job under OUT/k8s/ (docs/nightly-k8s.md)")
    p.add_argument("--out", metavar="DIR", help=f"slurm, k8s: where scripts go (default: {DEFAULT_OUT})")
    _slurm_options(p)
    p.add_argument("--image", default=f"cumatrix:{__version__}", metavar="IMAGE",
                   help="k8s: the container image the Jobs run (cumatrix and the code under test in it)")
    p.add_argument("--claim", default="cumatrix-results", metavar="NAME",
                   help="k8s: the PersistentVolumeClaim every Job mounts at /results (ReadWriteMany)")
    add_cover_options(p)
    p.set_defaults(func=cmd_plan)

    p = _command(sub, "submit", "run a matrix's hosts as a Slurm job array, wait, merge")
    p.add_argument("matrix", help="matrix file with a hosts: section (partition:, constraint: per host)")
    p.add_argument("--slurm", action="store_true", help="submit to Slurm (sbatch on PATH)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"results: DIR/HOST per host, DIR/merged (default: {DEFAULT_OUT}); on a shared filesystem")
    p.add_argument("--poll", type=float, default=5.0, metavar="S", help="seconds between squeue polls (default 5)")
    _slurm_options(p)
    add_cover_options(p)
    p.set_defaults(func=cmd_submit)

    p = _command(sub, "report", "rebuild the reports of a run from its results.jsonl")
    p.add_argument("dir", nargs="?", default=DEFAULT_OUT, help=f"a run's --out directory (default: {DEFAULT_OUT})")
    add_history_options(p)  # read only: the "since the last run" section of a stored run
    p.set_defaults(func=cmd_report)

    p = _command(sub, "merge", "combine runs of several hosts into one report")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="--out directories of runs of the same matrix")
    p.add_argument("--out", required=True, metavar="DIR", help="write the merged reports here")
    p.add_argument("--matrix", metavar="FILE",
                   help="the matrix the runs ran: every cell it (or its hosts: plan) means to run is expected; "
                        "for runs that did not record their plan")
    p.add_argument("--allow-empty", action="store_true",
                   help="exit 0, not 5, when no cell of the runs was tested (every one skipped)")
    p.add_argument("--submission", metavar="ID",
                   help="take only the runs of this submission (`cumatrix run --submission ID`, which the Slurm "
                        "scripts pass): a directory holding another submission's results leaves its host not-run")
    add_history_options(p)
    p.set_defaults(func=cmd_merge, notes=None)
    add_history_parsers(sub)

    p = _command(sub, "doctor", "check every tool and service a feature needs; say how to fix each")
    p.add_argument("matrix", nargs="?", help="check this matrix's runtimes (default: ./matrix.yaml if present)")
    p.add_argument("--json", action="store_true", help="machine-readable")
    p.add_argument("--require", metavar="FEATURE,...",
                   help="also require these: swap, gpu, docker, base-image, browser, nvcc, debootstrap, debugger, "
                        "sandbox, slurm")
    p.add_argument("--wheel-dir", metavar="DIR", help="runtime wheels are taken from DIR (default $CUMATRIX_WHEEL_DIR)")
    p.set_defaults(func=cmd_doctor)

    p = _command(sub, "clean", "remove cumatrix's cache (and, with --images, its images)")
    p.add_argument("--images", action="store_true", help="images labelled cumatrix that no container uses")
    p.add_argument("--cache", action="store_true", help="the cache (wheels, unpacked runtimes, builds); the default")
    p.add_argument("-y", "--yes", action="store_true", help="remove the listed images without asking")
    p.add_argument("--dry-run", action="store_true", help="list what would go; remove nothing")
    p.set_defaults(func=cmd_clean)

    p = _command(sub, "build", "compile a reference variant against a runtime wheel's headers")
    p.add_argument("variant", help="proc-address, direct-link, runtime-dispatch, driver-dispatch, header-dispatch, loop")
    p.add_argument("--headers", default="13.0", metavar="X.Y", help="headers of the runtime wheel of CUDA X.Y (default 13.0)")
    p.add_argument("--family", choices=("driver", "runtime"), help="for loop: which API family (default runtime)")
    p.add_argument("--wheel-dir", metavar="DIR", help="take the runtime wheel from DIR")
    p.set_defaults(func=cmd_build)

    add_init_parser(sub)


def _slurm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-arg", action="append", default=[], metavar="ARG",
                   help="slurm: one more word for each host's `cumatrix run` (repeat: --run-arg=-n --run-arg=2)")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                   help="slurm: one more #SBATCH line for both jobs (e.g. --sbatch-arg=--time=04:00:00)")


def add_tools(sub: Any) -> None:
    # deferred: _TOOLS below
    from cumatrix.front import calibrate, gate, repro

    gate.add_parser(sub)
    repro.add_parser(sub)
    p = calibrate.add_calibrate_parser(sub)
    if not p.epilog:
        p.epilog = EPILOG_CALIBRATE
        p.formatter_class = argparse.RawDescriptionHelpFormatter
    # deferred: fetch's parser module costs ~45 ms; like _TOOLS, only for these commands and --help
    from cumatrix.front.fetch import add_fetch_parser

    add_fetch_parser(sub)


#: Commands of ``add_tools``: their modules are big to import, so a parser for another command
#: (``run`` above all: every xdist worker parses too) is built without them.
_TOOLS = ("gate", "repro", "calibrate", "fetch")


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser; given the command about to run, only what that command needs."""
    p = argparse.ArgumentParser(
        prog="cumatrix",
        description="Run native CUDA code across CUDA runtimes x host drivers x build headers, one isolated "
                    "process or container per cell; predict what each cell should do; report what it did.",
        epilog="Start with `cumatrix doctor`, then `cumatrix run`. Each command has --help.",
    )
    p.add_argument("--version", action="version", version=f"cumatrix {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    add_run(sub)
    add_misc(sub)
    if command is None or command in _TOOLS or command not in sub.choices:
        add_tools(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        gcpause.hold()  # released as the run loop starts (plugin), or when pytest returns
    p = parser(argv[0] if argv else None)
    args = p.parse_args(argv)
    if not getattr(args, "func", None):
        p.print_help()
        return 2
    try:
        # --json output is for programs: JSON escapes every C0 control (ESC included) itself,
        # and a \xNN of the terminal sink would make it invalid JSON.
        if args.command in STORED_DATA_COMMANDS and not getattr(args, "json", False):
            with sinks.guarded():
                return _run(args)
        return _run(args)
    except KeyboardInterrupt:
        print("cumatrix: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`cumatrix repro --list | head`): nothing more to say to it, and
        # Python's own flush at exit must not print a traceback either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


#: Commands that print what records, host directories and the history hold: their output
#: passes through the terminal sink (escape sequences removed, controls shown as \xNN).
STORED_DATA_COMMANDS = frozenset({"diff", "history", "merge", "report", "repro", "submit", "untested"})


#: Exit status when standard output's reader went away, as a shell reports a death by SIGPIPE.
EXIT_BROKEN_PIPE = 141

#: Set to 1 to see the traceback of an error cumatrix did not foresee (for a bug report).
TRACEBACK_ENV = "CUMATRIX_TRACEBACK"


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except ConfigError as e:
        print(str(e), file=sys.stderr)
        return 2
    except CumatrixError as e:
        print(f"cumatrix: {e}", file=sys.stderr)
        return e.exit_code
    except (KeyboardInterrupt, BrokenPipeError):
        raise
    except OSError as e:
        # A path this host gives that cannot be read or written (a file where a directory
        # belongs, no permission, a full disk) is the environment's problem: exit 3, one line.
        # Never 1, which says the code under test failed.
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"cumatrix: {args.command}: {where}{e.strerror or e}", file=sys.stderr)
        return EnvironmentProblem.exit_code
    except Exception as e:  # the last edge: a failure of cumatrix, never the code under test's
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        print(f"cumatrix: {args.command}: internal error, not a finding about the code under test: "
              f"{type(e).__name__}: {e} (exit {HarnessError.exit_code}; {TRACEBACK_ENV}=1 shows where)",
              file=sys.stderr)
        return HarnessError.exit_code
