"""``cumatrix gate``: fail a wheel release that would break on a supported driver/runtime pairing.

Stage one, the static audit, reads every ELF file of each wheel straight from the zip
(:mod:`cumatrix.binary.elf`) and checks it against facts read from real CUDA headers
(:mod:`cumatrix.provision.headers`): which driver entry points the file links, which CUDA runtime major
it needs, and which runtime entry points with a major-dependent ABI it names as strings.
Stage two, the dynamic stage, installs the wheel into each runtime cell of a matrix and
imports it there; it lives in :mod:`cumatrix.front.gate_dynamic`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

from cumatrix.audit.static import (
    AuditSettings,
    WheelAudit,
    audit_wheel,
    findings_junit,
    findings_markdown,
    findings_record,
    format_findings,
    load_audit_data,
)
from cumatrix.core.errors import CumatrixError, UsageError
from cumatrix.core.model import CudaVersion
from cumatrix.core.options import BACKENDS, DEFAULT_BACKEND, DEFAULT_TIMEOUT, RunOptions
from cumatrix.front.gate_dynamic import (
    DEFAULT_MATRIX,
    DEFAULT_OUT,
    SITES_DIR,
    direct_references,
    gate_matrix,
    run_dynamic_stage,
    unsupported_pairing,
    wheel_packages,
)
from cumatrix.load import matrix as _matrix
from cumatrix.provision import runtimes
from cumatrix.report.jsonout import dumps

#: What the gate's callers and tests use of the dynamic stage, named here as before.
__all__ = ["SITES_DIR", "add_gate_parser", "direct_references", "gate_main", "run_dynamic_stage",
           "unsupported_pairing", "wheel_packages"]


def _check_dynamic_inputs(args: argparse.Namespace) -> None:
    if args.timeout is not None:
        args.timeout = _matrix.check_timeout(args.timeout)
    gate_matrix(Path(args.matrix) if args.matrix is not None else None)  # ConfigError: exit 2
    if args.constraints is not None and not Path(args.constraints).is_file():
        raise UsageError(f"--constraints {args.constraints}: no such file")
    if args.wheel_dir is not None and not Path(args.wheel_dir).is_dir():
        raise UsageError(f"--wheel-dir {args.wheel_dir}: no such directory")
    from cumatrix.front.history_cli import check_history

    check_history(args)
    if importlib.util.find_spec("pip") is None:
        raise UsageError(f"the dynamic stage installs wheels with pip, which {sys.executable} "
                         "lacks: `python -m ensurepip`, or gate with --static-only")



# --------------------------------------------------------------------------- command line


def _min_driver_arg(text: str) -> CudaVersion:
    try:
        return CudaVersion.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}; for example --min-driver 12.4") from e


def _runtimes_arg(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"not a list of CUDA runtime majors: {text!r} (want e.g. 12 or 12,13)")
    return tuple(sorted({int(p) for p in parts}))


def _arch_list_arg(text: str) -> tuple[tuple[int, str], ...]:
    from cumatrix.binary.fatbin import parse_arch
    parts = [p for p in re.split(r"[\s;,]+", text.strip()) if p]
    if not parts:
        raise argparse.ArgumentTypeError("empty --arch-list (want e.g. \"8.0 9.0 10.0 12.0\")")
    try:
        return tuple(dict.fromkeys(parse_arch(p) for p in parts))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


_EPILOG = """\
examples:
  cumatrix gate dist/*.whl --static-only --min-driver 12.4
      fail if any extension links a driver entry point newer than CUDA 12.4
      (the `undefined symbol: cuMemcpyBatchAsync` of vLLM PR 38460)
  cumatrix gate dist/mypkg-*.whl --static-only --runtimes 12,13 --strict
      also fail on DT_NEEDED libcuda.so.1 and on a libcudart of another major
  cumatrix gate dist/*.whl --static-only --min-driver 12.8 --arch-list "8.0 9.0 10.0 12.0"
      also fail when a GPU of the list has no kernel image, or only PTX a 12.8
      driver cannot compile
  cumatrix gate dist/*.whl --static-only --optional 'mypkg/_flash*.so'
      report files loaded only inside a guarded import as warnings
  cumatrix gate dist/*.whl --matrix matrix.yaml --smoke 'python3 -m mypkg.selftest'
      static audit, then install the wheel into every runtime x driver pairing of
      matrix.yaml, import its top-level packages there and run the smoke command
  cumatrix gate dist/*.whl --backend docker --constraints constraints.txt
      the same in containers without network, dependencies installed on the host

the dynamic stage (unless --static-only): one cell per wheel and pairing,
<runtime>/<driver>/import-<wheel> (and smoke-<wheel>), each with its own install target
(<out>/gate-sites/); every pairing NVIDIA supports must be ok; a runtime of a newer
major than the driver is skipped:unsupported-pairing. Reports in --out (default
gate-out/): summary.md (static findings first), junit.xml (static suites included),
results.json, index.html. With the local backend, dependencies not installed with
--constraints come from the Python environment cumatrix runs in.

what the static audit reports (per ELF file, read from the zip without extracting):
  needs-libcuda          DT_NEEDED on libcuda.so*: warning (error with --strict)
  underlinked-libcuda    undefined driver (cu*) symbols and no DT_NEEDED libcuda: error
  driver-symbol-too-new  undefined cu* symbol introduced after --min-driver: error
  runtime-major          DT_NEEDED libcudart.so.N, a static libcudart N (dated by the
                         names its own tables carry), or a libcudart loaded at run
                         time (dlopen) outside --runtimes: error
  runtime-needs-newer-driver
                         that runtime major needs a newer driver than --min-driver:
                         error (a note with --forward-compat)
                         a runtime loaded at run time (subject `dlopen libcudart...`):
                         a soname in read-only data or a cudart_stub-style name table,
                         its major from the soname, the RPATH/RUNPATH into
                         nvidia/cuNN/lib and the wheel's Requires-Dist on
                         nvidia-cuda-runtime*: an error where path and dependency
                         agree, a warning where only a string hints at it
  runtime-symbol-too-new undefined cuda* symbol first exported by a libcudart newer
                         than --min-runtime: error
  abi-lookup             string naming a runtime function whose ABI changed between
                         CUDA majors (e.g. cudaMemcpyBatchAsync): warning; an error
                         (abi-lookup-driver-version) when the file asks the driver's
                         version and never the runtime's, a note when it asks the
                         runtime's; names inside a static libcudart are not lookups
  no-device-code         an --arch-list GPU that neither SASS nor PTX covers: error
  ptx-too-new            an --arch-list GPU covered only by PTX whose ISA needs a newer
                         driver than --min-driver, or than the first driver that
                         supports that GPU generation (sm_100/sm_120: CUDA 12.8),
                         whichever is newer: error
  optional-import        a failing file imported only under try/except ImportError:
                         note (suggests --optional)
  unreadable-elf         a file with the ELF magic that does not parse: error
Driver introduction versions and ABI changes are read from the headers of the CUDA
runtime wheels (fetched once into the cache; --wheel-dir uses already-downloaded
wheels); runtime symbols are dated by the exports of libcudart 11.7 to 13.5 (packaged
data, scripts/runtime-exports.py). Notes of one kind that occur more than once in a
wheel are folded into one line with a count; -v lists each.
The summary lists each file's SASS and PTX (arch and PTX ISA version).

exit status: 0 no error finding and every cell met its expectation, 1 an error
finding or a failed cell, 2 bad input (missing or non-wheel file, malformed option,
bad matrix).
"""


def add_gate_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
                    ) -> argparse.ArgumentParser:
    """Register ``gate`` on ``subparsers`` with ``func=gate_main`` (the CLI calls ``args.func``)."""
    p = subparsers.add_parser(
        "gate",
        help="pre-release gate for wheels: static ELF audit, then the matrix",
        description=("Fail a wheel release that would break on a supported driver/runtime "
                     "pairing, and say exactly why."),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("wheels", nargs="+", type=Path, metavar="WHEEL", help="wheel files to gate")
    p.add_argument("--min-driver", type=_min_driver_arg, default=None, metavar="X.Y",
                   help=("oldest driver (as the CUDA version it reports) the wheel supports; "
                         "default: X.0 of the lowest --runtimes major, else 12.0"))
    p.add_argument("--runtimes", type=_runtimes_arg, default=None, metavar="N[,N]",
                   help="CUDA runtime majors the wheel supports, e.g. 12 or 12,13")
    p.add_argument("--forward-compat", action="store_true",
                   help=("accept a runtime major newer than --min-driver (data-centre GPUs with "
                         "NVIDIA's cuda-compat package): a note instead of an error"))
    p.add_argument("--min-runtime", type=_min_driver_arg, default=None, metavar="X.Y",
                   help=("oldest CUDA runtime the wheel supports: runtime entry points it links "
                         "that are newer are errors; default: X.0 of the lowest --runtimes "
                         "major, else the oldest known runtime"))
    p.add_argument("--arch-list", type=_arch_list_arg, default=None, metavar="LIST",
                   help=("GPU architectures the wheel must cover, TORCH_CUDA_ARCH_LIST style "
                         "(\"8.0 9.0 10.0 12.0\", ';' or ' ' separated); default: not checked"))
    p.add_argument("--strict", action="store_true",
                   help="make DT_NEEDED on libcuda.so* an error")
    p.add_argument("--optional", action="append", default=[], metavar="GLOB",
                   help=("member path glob (fnmatch) of ELF files loaded only inside a guarded "
                         "import; their findings become warnings (repeatable)"))
    p.add_argument("--static-only", action="store_true", help="stop after the static audit")
    p.add_argument("-v", "--verbose", action="store_true",
                   help=("list every note; by default notes of one kind that occur more than "
                         "once in a wheel are folded into one line with a count"))
    p.add_argument("--matrix", type=Path, default=None, metavar="M",
                   help=("matrix file whose runtime x driver pairings the dynamic stage runs "
                         "(its variants, workloads and cases are ignored); default: "
                         f"./{DEFAULT_MATRIX} if present, else every known runtime on the "
                         "host driver"))
    p.add_argument("--smoke", default=None, metavar="CMD",
                   help=("shell command run in each pairing after the import cell, as its own "
                         "cell (smoke-<wheel>), with the installed wheel on PYTHONPATH"))
    p.add_argument("--constraints", type=Path, default=None, metavar="FILE",
                   help=("install the wheel with its dependencies under these pip constraints, "
                         "instead of alone (--no-deps)"))
    p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND,
                   help=("local: a child process per cell (default); docker: a container per "
                         "cell, no network, the install mounted read-only"))
    p.add_argument("--base-image", default=None, metavar="IMAGE",
                   help="docker: base image the runtime images are built on")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help=f"kill a cell after S seconds (default {DEFAULT_TIMEOUT:.0f})")
    p.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help=(f"reports go here (default {DEFAULT_OUT}/; with --static-only only when "
                         "given): summary.md, junit.xml, static.json, and after the dynamic "
                         "stage results.jsonl, results.json and index.html"))
    p.add_argument("--wheel-dir", type=Path, default=None, metavar="DIR",
                   help="directory of already-downloaded CUDA runtime wheels")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="print only the verdict lines, error findings and failed cells")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document on stdout (static findings and the dynamic stage's "
                        "results.json; docs/json-output.md); the usual lines go to stderr")
    from cumatrix.front.flags import add_cli_options
    from cumatrix.front.history_cli import add_history_options

    add_history_options(p)
    add_cli_options(p, default="auto")
    p.set_defaults(func=gate_main)
    return p


def _check_wheel(path: Path) -> None:
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if not path.is_file():
        raise UsageError(f"{path}: not a file")
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{path}: not a wheel (not a zip archive)")
    from cumatrix.binary.zipnames import bad_utf8_name, describe

    bad = bad_utf8_name(path)
    if bad is not None:
        raise UsageError(describe(path, bad))
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except zipfile.BadZipFile as e:
        raise UsageError(f"{path}: not a wheel ({e})") from e
    if not any(re.fullmatch(r"[^/]+\.dist-info/WHEEL", n) for n in names):
        raise UsageError(f"{path}: not a wheel (a zip without a *.dist-info/WHEEL file)")


def _default_min_driver(runtime_majors: tuple[int, ...] | None) -> CudaVersion:
    if runtime_majors:
        return CudaVersion(min(runtime_majors), 0)
    return min(CudaVersion.parse(v) for v in runtimes.KNOWN_WHEELS)


def _default_min_runtime(runtime_majors: tuple[int, ...] | None) -> CudaVersion:
    return _default_min_driver(runtime_majors)


def _write_outputs(out: Path, audits: Sequence[WheelAudit], record: dict[str, object],
                   verbose: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text(findings_markdown(audits, verbose=verbose), encoding="utf-8")
    (out / "static.json").write_text(dumps(record), encoding="utf-8")
    (out / "junit.xml").write_text(findings_junit(audits), encoding="utf-8")


def gate_main(args: argparse.Namespace) -> int:
    """Run ``cumatrix gate``; returns the exit status (0 pass, 1 error finding, 2 bad input).

    ``-q``: only the verdict lines and failures; ``--json``: one JSON document on stdout
    (docs/json-output.md), every other line on stderr."""
    import contextlib
    import io

    quiet = bool(getattr(args, "quiet", False))
    as_json = bool(getattr(args, "json", False))
    collected: dict[str, object] = {}
    args.gate_json = collected
    buf = io.StringIO()
    status: int
    with contextlib.ExitStack() as stack:
        if as_json:
            stack.enter_context(contextlib.redirect_stdout(sys.stderr))
        elif quiet:
            stack.enter_context(contextlib.redirect_stdout(buf))
        try:
            status = _gate(args)
        except CumatrixError as e:
            print(f"cumatrix gate: error: {e}", file=sys.stderr)
            status = e.exit_code
    if quiet and not as_json:
        # The lines a reader of a quiet gate needs: findings that fail, FAIL cells, the verdicts.
        keep = ("static audit:", "ERROR", "FAIL", "dynamic stage: pass", "dynamic stage: FAIL")
        for line in buf.getvalue().splitlines():
            if line.lstrip().startswith(keep):
                print(line)
    if as_json:
        from cumatrix.report.jsonout import dumps

        doc: dict[str, object] = {"schema": "cumatrix-gate/1", "exit_code": status,
                                  "verdict": {0: "PASS", 1: "FAIL"}.get(status, "ERROR"),
                                  "static": collected.get("static"), "dynamic": None}
        out = collected.get("dynamic_out")
        if isinstance(out, Path) and (out / "results.json").is_file():
            doc["dynamic"] = json.loads((out / "results.json").read_text(encoding="utf-8"))
        sys.stdout.write(dumps(doc))
    return status


def _gate(args: argparse.Namespace) -> int:
    from cumatrix.execute import spawn

    spawn.harden(RunOptions.from_cli(args).policy.pass_env)
    from cumatrix.core.cache import cache_root

    cache_root()  # this user's alone, or exit 3 before anything from it runs
    wheels: list[Path] = [Path(w) for w in args.wheels]
    for w in wheels:
        _check_wheel(w)
    if not args.static_only:
        _check_dynamic_inputs(args)  # bad input is exit 2 before any work
    runtime_majors: tuple[int, ...] | None = args.runtimes
    min_driver: CudaVersion = args.min_driver or _default_min_driver(runtime_majors)
    data = load_audit_data(wheel_dir=args.wheel_dir)
    settings = AuditSettings(
        min_driver=min_driver, runtimes=runtime_majors, strict=args.strict,
        optional=tuple(args.optional), forward_compat=getattr(args, "forward_compat", False),
        min_runtime=getattr(args, "min_runtime", None) or _default_min_runtime(runtime_majors),
        arch_list=getattr(args, "arch_list", None))
    audits: list[WheelAudit] = []
    for w in wheels:
        try:
            audits.append(audit_wheel(
                w, min_driver=min_driver, runtimes=runtime_majors, strict=args.strict,
                optional=tuple(args.optional), introductions=data.introductions,
                abi_changed=data.abi_changes, settings=settings, data=data,
            ))
        except (zipfile.BadZipFile, OSError) as e:
            raise UsageError(f"{w}: cannot read the wheel: {e}") from e
    exports = (f" and the exports of libcudart {data.runtime_sources[0]}-"
               f"{data.runtime_sources[-1]}" if data.runtime_sources else "")
    print(f"static audit: --min-driver {min_driver}, runtimes "
          f"{','.join(map(str, runtime_majors)) if runtime_majors else 'any'}, "
          f"facts from CUDA {' and '.join(data.sources)} headers{exports}")
    print(format_findings(audits, verbose=getattr(args, "verbose", False)), end="")
    status = 1 if any(a.errors for a in audits) else 0
    record = findings_record(audits, settings=settings, sources=data.sources)
    if isinstance(getattr(args, "gate_json", None), dict):
        args.gate_json["static"] = record
    if args.static_only:
        if args.out is not None:
            _write_outputs(args.out, audits, record, getattr(args, "verbose", False))
        return status
    dynamic = run_dynamic_stage(args, wheels, record)
    return max(status, dynamic)
