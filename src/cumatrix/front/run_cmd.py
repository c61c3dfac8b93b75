"""``cumatrix run``: a matrix through pytest (and pytest-xdist for ``-n``), its reports once
pytest has returned, and its exit status."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from cumatrix import __version__
from cumatrix.core.cache import cache_root
from cumatrix.core.errors import (
    EXIT_NOTHING_RAN,
    ConfigError,
    CumatrixError,
    EnvironmentProblem,
    UsageError,
)
from cumatrix.core.options import (
    BACKENDS,
    DEFAULT_BACKEND,
    DEFAULT_MATRIX,
    DEFAULT_OUT,
    DEFAULT_TIMEOUT,
    RUN_SANDBOX_DEFAULT,
    RunOptions,
    SandboxPolicy,
)
from cumatrix.front.flags import add_cli_options
from cumatrix.front.history_cli import add_history_options, check_history, record
from cumatrix.load import gcpause
from cumatrix.load import matrix as _matrix
from cumatrix.load.keyword import KeywordExpression

EPILOG_RUN = """\
examples:
  cumatrix run                              # the bundled matrix.yaml, results in ./out
  cumatrix run matrix.yaml -n 2 --out out   # two cells at a time
  cumatrix run -k 'cu12.9 and probe'        # select cells by id, as pytest -k
  cumatrix run --resume --out out           # finish a run that was interrupted
  cumatrix run --wheel-dir wheels/          # offline: runtime wheels from a directory
  cumatrix run --lf                         # only the cells that failed last time in --out
  cumatrix run --json > results.json        # the results document on stdout

exit: 0 every cell met its expectation; 1 some did not; 2 bad input; 3 cannot run here;
5 no cell ran (none selected, or all skipped: nothing was tested); --allow-empty makes 5 a 0.

outcome words: ok (path batch|fallback|kernel|n/a), cuda-error:N, undefined-symbol:SYM,
build-error, crash:SIGNAME, exit:N, timeout, cannot-emulate, refused, skipped:REASON,
harness-error, runtime-leak:PATH (a runtime from outside both the program and the cell).
A cell passes when what it did is in its expected set.
"""


def matrix_arg(path: str | None) -> Path:
    """The matrix file a command names (default ./matrix.yaml); exit 2 when there is none."""
    p = Path(path or DEFAULT_MATRIX)
    if not p.is_file():
        hint = " (run from a directory holding matrix.yaml, or name a matrix file)" if path is None else ""
        raise UsageError(f"{p}: no such matrix file{hint}")
    return p

#: pytest's own plugins a run of cells has no use for, each of which costs every cell's three
#: phases something (log capture, gc after each test, output capture: a cell's output is
#: the harness's to capture, through its pipes).
_UNUSED_PLUGINS = ("logging", "unraisableexception", "threadexception", "faulthandler", "doctest", "pastebin",
                   "legacypath", "nose", "stepwise", "python_path", "debugging", "setuponly", "setupplan",
                   "tmpdir", "monkeypatch", "recwarn", "cacheprovider", "warnings", "subtests", "unittest",
                   "skipping", "capture", "assertion")


def _run_plugin_args(*, xdist: bool) -> list[str]:
    """Our plugin (and xdist's, for ``-n``), loaded by name: a run sets
    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``, so what else the environment installed (hypothesis,
    coverage, ...) neither slows the cells nor changes how they run."""
    args = ["-p", "cumatrix.front.plugin", *(["-p", "xdist.plugin"] if xdist else [])]
    for name in _UNUSED_PLUGINS:
        args += ["-p", f"no:{name}"]
    return args


# --------------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    """``cumatrix run``: returns its exit status."""
    # deferred: spawn costs ~12 ms and ~25 modules, which `cumatrix --help` and validate do without
    from cumatrix.execute import spawn

    mpath = matrix_arg(args.matrix)
    m = _checked(args, mpath)
    opts = RunOptions.from_cli(args, sandbox_default=RUN_SANDBOX_DEFAULT)
    spawn.harden(opts.policy.pass_env)  # before any cell: nothing of this process for them to read
    check_history(args)  # a bad --history is exit 2 before anything is written
    out = Path(args.out)
    failed_before = _previously_failed(out, args) if (args.last_failed or args.failed_first) else None
    _preflight(opts, m, mpath, quiet=bool(args.quiet))
    code, pending = _run_pytest(args, mpath, out, failed_before)
    gcpause.end()  # the run's items (frozen as its loop started) are garbage now, for _write_reports
    run = None
    if pending is not None and not (code == 5 and not args.resume):  # no cell selected: no reports of nothing
        run = _write_reports(args, pending)
    status = _exit_status(code, args, mpath, out, run)
    if args.json:
        _print_run_json(out, run)
    return status


def _checked(args: argparse.Namespace, mpath: Path) -> Any:
    """The matrix, once every option of the run is good input (exit 2 before anything runs)."""
    if args.timeout is not None:  # --timeout nan, -5 and 0 are bad input, as in the matrix
        args.timeout = _matrix.check_timeout(args.timeout)
    if args.host is not None:
        _matrix.check_name(args.host, "--host")
    if args.keyword:
        KeywordExpression.compile(args.keyword)  # a malformed -k is bad input (exit 2) before anything runs
    if args.last_failed and args.failed_first:
        raise UsageError("--lf and --ff exclude each other: --lf runs only the cells that failed last time, "
                         "--ff runs them first and then the rest")
    m = _matrix.load(mpath)
    if args.host is not None and m.hosts:
        # deferred: plan costs ~45 ms and ~35 modules; only a run of a hosts file
        from cumatrix.front.plan import planned_cells

        names = planned_cells(m).host_names  # a matrix that cannot be planned is bad input (exit 2)
        if args.host not in names:
            raise UsageError(f"--host {args.host}: {mpath} plans the hosts {', '.join(names)}; "
                             "name one of them (the run takes the cells the plan gives it)")
    if args.wheel_dir and not Path(args.wheel_dir).is_dir():
        raise UsageError(f"--wheel-dir {args.wheel_dir}: no such directory")
    return m


def _run_pytest(args: argparse.Namespace, mpath: Path, out: Path,
                failed_before: set[str] | None) -> tuple[int, Path | None]:
    """pytest's exit code, and the --out directory whose reports it left to this command."""
    # deferred: pytest and the plugin's session cost ~100 ms and ~200 modules (the plugin ~400 ms), which --help and validate do without
    import pytest

    from cumatrix.front.plugin_session import ReportsLeft

    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # xdist's workers inherit it
    left = ReportsLeft()
    with contextlib.ExitStack() as stack:
        extra: list[str] = []
        if failed_before:
            # The ids travel to the plugin (and xdist's workers) in a file removed when the run ends.
            from cumatrix.core.cache import temp_prefix

            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=temp_prefix("lf"))))
            (tmp / "ids").write_text("".join(f"{cid}\n" for cid in sorted(failed_before)), encoding="utf-8")
            extra = ["--cumatrix-only" if args.last_failed else "--cumatrix-first", str(tmp / "ids")]
        if args.json:  # stdout carries the JSON document alone: pytest's lines go to stderr
            stack.enter_context(contextlib.redirect_stdout(sys.stderr))
        code = int(pytest.main([*_pytest_args(args, mpath, out), *extra], plugins=[left]))
    return code, left.out


def _previously_failed(out: Path, args: argparse.Namespace) -> set[str] | None:
    """The cells the previous run in ``out`` failed (``--lf``/``--ff``); ``None`` (run every
    cell, as pytest's ``--lf`` does) when there is no previous run or none failed."""
    # deferred: cumatrix.report costs ~110 ms and ~85 modules (jinja2), which --help and validate do without
    from cumatrix.report import load_records

    flag = "--lf" if args.last_failed else "--ff"
    if not (out / "results.jsonl").is_file():
        print(f"cumatrix: {flag}: no previous run in {out}/; running every selected cell", file=sys.stderr)
        return None
    try:
        prev = load_records(out / "results.jsonl")
    except CumatrixError as e:
        raise UsageError(f"{flag}: the previous results in {out}/ cannot be read ({e}); run without {flag}") from e
    failed = {c.id for c in prev.cells if c.status == "fail"}
    if not failed:
        print(f"cumatrix: {flag}: no cell failed in the previous run in {out}/; running every selected cell",
              file=sys.stderr)
        return None
    print(f"cumatrix: {flag}: {len(failed)} cell(s) failed in the previous run"
          + (", running only those" if args.last_failed else ", running them first"), file=sys.stderr)
    return failed


def _print_run_json(out: Path, run: Any) -> None:
    """``run --json``: results.json as written (the same document), or, when no cell was
    selected and no report written, the document of an empty run (docs/json-output.md)."""
    doc = out / "results.json"
    if run is not None and doc.is_file():
        sys.stdout.write(doc.read_text(encoding="utf-8"))
    else:
        # deferred: cumatrix.report and the record schema cost ~100 ms (jinja2), which --help and validate do without
        from cumatrix.report.jsonout import dumps
        from cumatrix.results.records import SCHEMA_VERSION

        sys.stdout.write(dumps({"schema": SCHEMA_VERSION, "generator": f"cumatrix {__version__}", "verdict": "EMPTY",
                                "counts": {"total": 0, "pass": 0, "fail": 0, "skip": 0, "not_run": 0},
                                "cells": []}))
    sys.stdout.flush()


def _write_reports(args: argparse.Namespace, out: Path) -> Any:
    """The reports, written once pytest has returned: its items and reports (a few KB a
    cell) are freed first, so a run's memory peaks at the larger of the two, not their sum.
    Returns the run read back (``None`` when the reports could not be written)."""
    gc.collect()
    # deferred: cumatrix.report costs ~110 ms and ~85 modules (jinja2), which --help and validate do without
    from cumatrix.report import load_records, write_all
    from cumatrix.report.markdown import headline

    try:
        run = load_records(out / "results.jsonl")
        write_all(record(args, run, kind="run"), out)
    except CumatrixError as e:
        print(f"cumatrix: reports not written: {e}", file=sys.stderr)
        return None
    print(headline(run), file=sys.stderr if args.json else sys.stdout, flush=True)
    return run


def _preflight(opts: RunOptions, m: Any, mpath: Path, *, quiet: bool) -> None:
    """What must hold before any cell runs: --out is free and writable (exit 2 / 3), the daemon
    answers, every runtime resolves (a requirement that does not resolve is bad input, exit 2,
    found once rather than per cell)."""
    # deferred: the results store costs ~40 ms, which --help and validate do without
    from cumatrix.results.store import Store

    cache_root()  # this user's alone, or exit 3 before anything from it runs
    if opts.backend == "local":
        _require_sandbox(opts.for_matrix(m.sandbox))
    with Store.open(opts.out or Path(DEFAULT_OUT), fresh=False):
        pass
    _check_compiler(m)
    if opts.backend == "docker":
        # deferred: the docker SDK costs ~80 ms and ~200 modules; only the docker backend needs it
        from cumatrix.execute.docker import DockerBackend

        with DockerBackend(opts.base_image) as be:  # the daemon must answer before any cell runs
            if be.base_image_problem() is not None:
                raise EnvironmentProblem(str(be.base_image_problem()))
        return
    # deferred: the orchestrator costs ~215 ms and ~190 modules, which --help and validate do without
    from cumatrix.orchestrate import Orchestrator

    policy = opts.for_matrix(m.sandbox)
    with Orchestrator(matrix=m, wheel_dir=opts.wheel_dir, policy=policy) as orch:
        _preflight_local(m, mpath, orch, quiet=quiet)


def _require_sandbox(policy: SandboxPolicy) -> None:
    """``--require-sandbox`` (or ``--sandbox``, ``sandbox: on``): a host that cannot sandbox runs
    nothing (exit 3), rather than every cell failing the same way."""
    if policy.sandbox != "on":
        return
    # deferred: the sandbox module is the execute stage's; only a run that requires it checks here
    from cumatrix.execute import sandbox

    held, _line = sandbox.describe(policy)
    if held != "bubblewrap":
        why = held.removeprefix("none: ")
        raise EnvironmentProblem(f"--require-sandbox: this host cannot sandbox cells: {why}; "
                                 f"fix: {sandbox.fix_for(why)}")


def _preflight_local(m: Any, mpath: Path, orch: Any, *, quiet: bool) -> None:
    # deferred: the prediction rules cost ~20 ms, which --help and validate do without
    from cumatrix.predict.rules import emulation_newer_than_host

    real = orch.host().driver_version
    for d in m.drivers:
        if d.emulated is not None and real is not None and emulation_newer_than_host(int(d.emulated), real):
            raise ConfigError(f"{mpath}: drivers: {d.name} is newer than this host's driver "
                              f"({real // 1000}.{real % 1000 // 10}): an interposer can only hide what the real "
                              "driver has; emulate an older version, or run this on a newer host")
    for rt in m.runtimes:
        if rt.requirement or rt.site or rt.requirements:
            if not quiet:
                print(f"cumatrix: runtime {rt.name}: {rt.source}", file=sys.stderr)
            orch.provisioner.runtime(rt.name)


def _check_compiler(m: Any) -> None:
    """Swap cells (compiled variants) and emulated drivers (a generated libcuda) need gcc."""
    needs = [what for what, used in (("the reference variants", bool(m.variants and m.workloads)),
                                     ("emulated drivers", any(d.emulated for d in m.drivers))) if used]
    if needs and shutil.which("gcc") is None:
        raise EnvironmentProblem(f"{m.path}: {' and '.join(needs)} are compiled with gcc at run time, and there is "
                                 "no gcc on PATH: install it (apt-get install gcc), or run a matrix of "
                                 "probes and cases only")


def _pytest_args(args: argparse.Namespace, mpath: Path, out: Path) -> list[str]:
    # ``-c /dev/null`` alone would put pytest's conftest cut at /dev: every directory above the
    # matrix would be searched for conftest.py files and listed entry by entry to reach the file
    # (a /tmp of 1,000 entries cost half a second).  A run loads no conftest and lists only the
    # matrix's own directory.
    pargs = [str(mpath), *_run_plugin_args(xdist=bool(args.numprocesses)), "-c", os.devnull, "--rootdir",
             str(Path.cwd()), "--noconftest", "--confcutdir", str(mpath.resolve().parent),
             "--cumatrix-out", str(out), "--cumatrix-reports-after",
             "--cumatrix-backend", args.backend,
             "-o", "console_output_style=classic", "-rfE"]
    pargs += ["-v"] if args.verbose else (["-qq"] if args.quiet else ["-q"])
    options = (("--cumatrix-keyword", args.keyword), ("-n", args.numprocesses), ("--cumatrix-wheel-dir", args.wheel_dir),
               ("--cumatrix-timeout", str(args.timeout) if args.timeout is not None else None),
               ("--cumatrix-base-image", args.base_image), ("--cumatrix-host", args.host),
               ("--junitxml", args.junitxml))
    for flag, value in options:
        if value:
            pargs += [flag, value]
    if args.resume:
        pargs.append("--cumatrix-resume")
    if args.require_gpu:
        pargs.append("--cumatrix-require-gpu")
    pargs += ["--cumatrix-sandbox", args.sandbox] if args.sandbox else []
    pargs += [f"--cumatrix-pass-env={n}" for n in args.pass_env]
    if args.sandbox_write_limit is not None:
        pargs.append(f"--cumatrix-sandbox-write-limit={args.sandbox_write_limit}")
    return pargs


def _exit_status(code: int, args: argparse.Namespace, mpath: Path, out: Path, run: Any = None) -> int:
    empty_hint = "exit 5: nothing was tested; --allow-empty makes it 0"
    if code == 5:  # no tests ran
        if args.resume:
            # deferred: cumatrix.report costs ~110 ms and ~85 modules (jinja2), which --help and validate do without
            from cumatrix.report import load_records

            failed = load_records(out / "results.jsonl").counts.failed
            print("cumatrix: every selected cell already has a result; nothing left to run"
                  + (f" ({failed} of them did not meet expectations)" if failed else ""), file=sys.stderr)
            return 1 if failed else 0
        what = (f"no cell of {mpath} matches -k {args.keyword!r}" if args.keyword else f"{mpath}: no cells to run")
        print(f"cumatrix: EMPTY — {what}; nothing ran" + ("" if args.allow_empty else f"; {empty_hint}"),
              file=sys.stderr)
        return 0 if args.allow_empty else EXIT_NOTHING_RAN
    if code in (0, 1):
        print(f"cumatrix: results in {out}/ (results.json, junit.xml, summary.md, index.html)", file=sys.stderr)
        if code == 0 and run is not None and run.verdict == "SKIPPED" and not args.allow_empty:
            # Every cell skipped (a GPU runner whose driver vanished): nothing was tested, which
            # CI must be able to tell from a pass.
            print(f"cumatrix: no cell ran, every one was skipped: {empty_hint}", file=sys.stderr)
            return EXIT_NOTHING_RAN
        return code
    if code == 2:
        print(f"cumatrix: interrupted; finished cells are kept in {out}/results.jsonl (resume with --resume)", file=sys.stderr)
        return 130
    if code == 4:
        return 2
    return code


def add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="run a matrix (default: ./matrix.yaml)", epilog=EPILOG_RUN,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run every cell of a matrix in its own process (or container) and judge it.")
    p.add_argument("matrix", nargs="?", help="matrix file (default: matrix.yaml)")
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                   help="local: a child process per cell (default); docker: a container per cell")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="only cells whose id matches EXPR (pytest -k syntax)")
    p.add_argument("-n", dest="numprocesses", metavar="N", help="run N cells at a time (pytest-xdist; 'auto' = one per core)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"results and reports go here (default: {DEFAULT_OUT})")
    p.add_argument("--resume", action="store_true", help="run only cells without a result in --out")
    p.add_argument("--wheel-dir", metavar="DIR", help="take runtime wheels from DIR; no network")
    p.add_argument("--timeout", type=float, metavar="S", help=f"kill a cell after S seconds (default {DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--base-image", metavar="IMAGE", help="docker: base image for runtime images")
    p.add_argument("--host", metavar="NAME",
                   help="run as this host: tag results with its name (for `cumatrix merge`) and, when the "
                        "matrix has a hosts: section, run only the cells `cumatrix plan` gives it")
    p.add_argument("--junitxml", metavar="FILE", help="also write pytest's own JUnit file")
    p.add_argument("--require-gpu", action="store_true",
                   help="a cell skipped for want of a GPU fails (nightly jobs on GPU runners; also "
                        "CUMATRIX_REQUIRE_GPU=1)")
    p.add_argument("--lf", "--last-failed", dest="last_failed", action="store_true",
                   help="run only the cells that failed in the previous run in --out (all when none did)")
    p.add_argument("--ff", "--failed-first", dest="failed_first", action="store_true",
                   help="run the cells that failed in the previous run in --out first, then the rest")
    p.add_argument("--allow-empty", action="store_true",
                   help="exit 0, not 5, when no cell ran (none selected, or every one skipped)")
    p.add_argument("--json", action="store_true",
                   help="print results.json on stdout (pytest's lines go to stderr); see docs/json-output.md")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per cell from pytest too")
    p.add_argument("-q", "--quiet", action="store_true", help="only failures and the final line")
    add_history_options(p)
    add_cli_options(p, default=None)
    p.set_defaults(func=cmd_run)


