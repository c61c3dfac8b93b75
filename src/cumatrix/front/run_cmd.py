"""``cumatrix run``: a matrix through pytest (and pytest-xdist for ``-n``), its reports once
pytest has returned, and its exit status."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from cumatrix import __version__
from cumatrix.core.errors import EXIT_NOTHING_RAN, CumatrixError, HarnessError, UsageError
from cumatrix.core.options import (
    BACKENDS,
    DEFAULT_BACKEND,
    DEFAULT_MATRIX,
    DEFAULT_OUT,
    DEFAULT_TIMEOUT,
    RUN_SANDBOX_DEFAULT,
    RunOptions,
)
from cumatrix.front.flags import add_cli_options, add_cover_options, count_arg
from cumatrix.front.history_cli import add_history_options, check_history, record
from cumatrix.front.run_preflight import _check_compiler, preflight
from cumatrix.load import gcpause, workdir
from cumatrix.load import matrix as _matrix
from cumatrix.load.keyword import KeywordExpression

#: Names callers used from here before the run's preflight checks had a module of their own.
__all__ = ["_check_compiler", "add_run", "bundled_matrix", "cmd_run", "matrix_arg", "wheel_dir_arg"]

EPILOG_RUN = """\
examples:
  cumatrix run                              # ./matrix.yaml, else the bundled default; results in ./out
  cumatrix run matrix.yaml -n 2 --out out   # two cells at a time
  cumatrix run -k 'cu12.9 and probe'        # select cells by id, as pytest -k
  cumatrix run --resume --out out           # finish a run that was interrupted
  cumatrix run --wheel-dir wheels/          # offline: runtime wheels from a directory
  cumatrix run --lf                         # only the cells that failed last time in --out
  cumatrix run --json > results.json        # the results document on stdout

exit: 0 every tested cell met its expectation; 1 some did not (or its record was edited); 2 bad
input; 3 cannot run here; 5 nothing tested (no cell selected, or every one skipped or not run);
--allow-empty makes 5 a 0.

outcome words: ok (path batch|fallback|kernel|n/a), cuda-error:N, undefined-symbol:SYM,
build-error, crash:SIGNAME, exit:N, timeout, cannot-emulate, refused, skipped:REASON,
harness-error, runtime-leak:PATH (a runtime from outside both the program and the cell).
A cell passes when what it did is in its expected set.
"""


def bundled_matrix() -> Path:
    """The default matrix that travels with the package: the copy ``setup.py`` puts in package
    data (``cumatrix/data/matrix.yaml``), or ``matrix.yaml`` at the top of the source tree."""
    found = workdir.bundled()
    if found is None:
        data, top = workdir.bundled_candidates()
        raise HarnessError(f"the bundled default matrix is missing (looked for {data} and {top}); reinstall cumatrix")
    return found


def matrix_arg(path: str | None) -> Path:
    """The matrix file a command names, else ./matrix.yaml, else the bundled default (said on
    stderr, so that --json's stdout stays one document); exit 2 when a named file is missing."""
    if path is None:
        here = Path(DEFAULT_MATRIX)
        if here.is_file():
            return here
        bundled = bundled_matrix()
        print(f"cumatrix: no {DEFAULT_MATRIX} in {Path.cwd()}: using the default matrix bundled with cumatrix "
              f"({bundled}), whose cases start in this directory; name a matrix file to run your own", file=sys.stderr)
        return bundled
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: no such matrix file")
    return p


def wheel_dir_arg(value: str | None) -> Path | None:
    """``--wheel-dir DIR`` as a command takes it: a directory (exit 2 when it is none), or
    ``None`` when the option is not given."""
    if not value:
        return None
    if not Path(value).is_dir():
        raise UsageError(f"--wheel-dir {value}: no such directory")
    return Path(value)

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
    args = ["-p", "cumatrix.front.pytest_plugin.hooks", *(["-p", "xdist.plugin"] if xdist else [])]
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
    preflight(opts, m, mpath, quiet=bool(args.quiet))
    code, pending, seal = _run_pytest(args, mpath, out, failed_before)
    gcpause.end()  # the run's items (frozen as its loop started) are garbage now, for _write_reports
    run = None
    if pending is not None and not (code == 5 and not args.resume):  # no cell selected: no reports of nothing
        run = _write_reports(args, pending, seal)
    status = _exit_status(code, args, mpath, out, run)
    if args.json:
        _print_run_json(out, run)
    return status


def _checked(args: argparse.Namespace, mpath: Path) -> Any:
    """The matrix, once every option of the run is good input (exit 2 before anything runs)."""
    _check_options(args)
    m = _matrix.load(mpath)
    if args.host is not None and m.hosts:
        _check_planned_host(args.host, m, mpath)
    wheel_dir_arg(args.wheel_dir)
    return m


def _check_options(args: argparse.Namespace) -> None:
    """The run's options that need no matrix: bad input is exit 2 before anything runs (the
    timeout and ``-n`` are stored back as the run takes them)."""
    if args.timeout is not None:  # --timeout nan, -5 and 0 are bad input, as in the matrix
        args.timeout = _matrix.check_timeout(args.timeout)
    if args.host is not None:
        _matrix.check_name(args.host, "--host")
    if args.submission is not None:
        _matrix.check_name(args.submission, "--submission")
    if args.keyword:
        KeywordExpression.compile(args.keyword)  # a malformed -k is bad input (exit 2) before anything runs
    if args.numprocesses not in (None, "auto", "0"):
        args.numprocesses = _process_count(args.numprocesses)
    RunOptions.from_cli(args)  # --cover, --rotate, --night: bad input (exit 2) before anything runs
    if args.last_failed and args.failed_first:
        raise UsageError("--lf and --ff exclude each other: --lf runs only the cells that failed last time, "
                         "--ff runs them first and then the rest")


def _process_count(value: str) -> str:
    """``-n N`` as xdist takes it: -n 10**20 is bad input, not a crash in xdist."""
    try:
        return str(count_arg(value))
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"-n {e} (or auto)") from None


def _check_planned_host(host: str, m: Any, mpath: Path) -> None:
    """``--host`` of a matrix with ``hosts:``: one of the hosts its plan names."""
    # deferred: plan costs ~45 ms and ~35 modules; only a run of a hosts file
    from cumatrix.front.plan import planned_cells

    names = planned_cells(m).host_names  # a matrix that cannot be planned is bad input (exit 2)
    if host not in names:
        raise UsageError(f"--host {host}: {mpath} plans the hosts {', '.join(names)}; "
                         "name one of them (the run takes the cells the plan gives it)")


def _run_pytest(args: argparse.Namespace, mpath: Path, out: Path,
                failed_before: set[str] | None) -> tuple[int, Path | None, Any]:
    """pytest's exit code, the --out directory whose reports it left to this command, and
    what the results there must show (the records the session wrote: ``records.Seal``)."""
    # deferred: pytest and the plugin's session cost ~100 ms and ~200 modules (the plugin ~400 ms), which --help and validate do without
    import pytest

    from cumatrix.front.pytest_plugin.session import ReportsLeft

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
    return code, left.out, left.seal


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
                                "headline": "cumatrix: EMPTY — the matrix selection has no cells; nothing ran",
                                "counts": {"total": 0, "pass": 0, "fail": 0, "skip": 0, "not_run": 0, "tested": 0},
                                "cells": []}))
    sys.stdout.flush()


def _write_reports(args: argparse.Namespace, out: Path, seal: Any) -> Any:
    """The reports, written once pytest has returned: its items and reports (a few KB a
    cell) are freed first, so a run's memory peaks at the larger of the two, not their sum.
    The records are read once, each checked against what the run wrote (``seal``); the
    headline and the exit status come from the same run.  Returns the run read back
    (``None`` when the reports could not be written)."""
    gc.collect()
    # deferred: cumatrix.report costs ~110 ms and ~85 modules (jinja2), which --help and validate do without
    from cumatrix.report import load_records, write_all
    from cumatrix.report.headline import headline

    try:
        run = load_records(out / "results.jsonl", seal=seal)
        write_all(record(args, run, kind="run"), out)
    except CumatrixError as e:
        print(f"cumatrix: reports not written: {e}", file=sys.stderr)
        return None
    print(headline(run), file=sys.stderr if args.json else sys.stdout, flush=True)
    return run


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
    pargs += _valued_options(args)
    if args.resume:
        pargs.append("--cumatrix-resume")
    if args.require_gpu:
        pargs.append("--cumatrix-require-gpu")
    pargs += ["--cumatrix-sandbox", args.sandbox] if args.sandbox else []
    pargs += [f"--cumatrix-pass-env={n}" for n in args.pass_env]
    if args.sandbox_write_limit is not None:
        pargs.append(f"--cumatrix-sandbox-write-limit={args.sandbox_write_limit}")
    return pargs


def _valued_options(args: argparse.Namespace) -> list[str]:
    """The plugin's (and pytest's, xdist's) options that carry a value, for those given."""
    options = (("--cumatrix-keyword", args.keyword), ("-n", args.numprocesses), ("--cumatrix-wheel-dir", args.wheel_dir),
               ("--cumatrix-timeout", str(args.timeout) if args.timeout is not None else None),
               ("--cumatrix-base-image", args.base_image), ("--cumatrix-host", args.host),
               ("--cumatrix-submission", args.submission), ("--junitxml", args.junitxml),
               ("--cumatrix-cover", args.cover), ("--cumatrix-seed", _given(args.seed)),
               ("--cumatrix-rotate", _given(args.rotate)), ("--cumatrix-night", _given(args.night)))
    words: list[str] = []
    for flag, value in options:
        if value:
            words += [flag, value]
    return words


def _given(value: int | None) -> str | None:
    return str(value) if value is not None else None


#: The last words of a run that tested nothing.
_EMPTY_HINT = "exit 5: nothing was tested; --allow-empty makes it 0"


def _exit_status(code: int, args: argparse.Namespace, mpath: Path, out: Path, run: Any = None) -> int:
    """The exit status of the run: from its records as read back (the same run as the
    reports and the headline), pytest's own code only where there are none."""
    if code == 2:
        print(f"cumatrix: interrupted; finished cells are kept in {out}/results.jsonl (resume with --resume)", file=sys.stderr)
        return 130
    if code == 4:
        return 2
    if code == 5 and run is None:  # no cell selected
        return _nothing_selected(args, mpath)
    if code not in (0, 1, 5):  # pytest's own error (3): not a verdict on the cells
        return code
    if run is None:  # the run's results cannot be read back: nothing it did can be taken as a pass
        print(f"cumatrix: the results in {out}/ could not be read back; exit 3", file=sys.stderr)
        return HarnessError.exit_code
    return _records_status(code, args, out, run)


def _nothing_selected(args: argparse.Namespace, mpath: Path) -> int:
    """The status of a run whose selection held no cell: 5, or 0 with ``--allow-empty``."""
    what = (f"no cell of {mpath} matches -k {args.keyword!r}" if args.keyword else f"{mpath}: no cells to run")
    print(f"cumatrix: EMPTY — {what}; nothing ran" + ("" if args.allow_empty else f"; {_EMPTY_HINT}"),
          file=sys.stderr)
    return 0 if args.allow_empty else EXIT_NOTHING_RAN


def _records_status(code: int, args: argparse.Namespace, out: Path, run: Any) -> int:
    """The status of a run whose records were read back, from them; pytest's ``code`` only
    where it saw a failure the records do not hold."""
    # deferred: cumatrix.report costs ~110 ms and ~85 modules (jinja2), which --help and validate do without
    from cumatrix.report.headline import exit_status

    if code == 5:  # --resume: every selected cell already had a result
        print("cumatrix: every selected cell already has a result; nothing left to run", file=sys.stderr)
    print(f"cumatrix: results in {out}/ (results.json, junit.xml, summary.md, index.html)", file=sys.stderr)
    status = exit_status(run, allow_empty=args.allow_empty)
    if code == 1 and status != 1:
        # A cell pytest saw fail has no failing record: the records do not hold what ran.
        print(f"cumatrix: a cell failed, but {out}/results.jsonl does not record it; exit 1", file=sys.stderr)
        return 1
    if status == EXIT_NOTHING_RAN:
        print(f"cumatrix: {_EMPTY_HINT}", file=sys.stderr)
    return status


def add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="run a matrix (default: ./matrix.yaml, else the bundled default matrix)", epilog=EPILOG_RUN,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Run every cell of a matrix in its own process (or container) and judge it.")
    p.add_argument("matrix", nargs="?", help="matrix file (default: ./matrix.yaml, else the default matrix bundled with cumatrix)")
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
    p.add_argument("--submission", metavar="ID",
                   help="record this submission id in the run header: `cumatrix merge --submission ID` "
                        "takes only runs that carry it (the Slurm scripts pass one per submission)")
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
    add_cover_options(p)
    add_history_options(p)
    add_cli_options(p, default=None)
    p.set_defaults(func=cmd_run)


