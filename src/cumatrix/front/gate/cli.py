"""``cumatrix gate``: fail a wheel release that would break on a supported driver/runtime pairing.

Stage one, the static audit, reads every ELF file of each wheel straight from the zip
(:mod:`cumatrix.binary.elf`) and checks it against facts read from real CUDA headers
(:mod:`cumatrix.provision.headers`): which driver entry points the file links, which CUDA runtime major
it needs, and which runtime entry points with a major-dependent ABI it names as strings.
Stage two, the dynamic stage, installs the wheel into each runtime cell of a matrix and
imports it there; it lives in :mod:`cumatrix.front.gate.dynamic`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import re
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

from cumatrix.audit.static import (
    AuditData,
    AuditSettings,
    WheelAudit,
    audit_wheel,
    findings_junit,
    findings_markdown,
    findings_record,
    format_findings,
    load_audit_data,
)
from cumatrix.binary.zipnames import bad_utf8_name, describe
from cumatrix.core.cache import cache_root
from cumatrix.core.errors import EXIT_NOTHING_RAN, CumatrixError, UsageError
from cumatrix.core.model import CudaVersion
from cumatrix.core.options import RunOptions
from cumatrix.core.private import write_new
from cumatrix.execute import spawn
from cumatrix.front.gate.args import DEFAULT_OUT, add_gate_parser
from cumatrix.front.gate.dynamic import (
    SITES_DIR,
    direct_references,
    gate_matrix,
    run_dynamic_stage,
    unsupported_pairing,
    wheel_packages,
)
from cumatrix.front.history_cli import check_history
from cumatrix.load import matrix as _matrix
from cumatrix.provision import runtimes
from cumatrix.report.jsonout import dumps
from cumatrix.results.store import prepare_out

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
    check_history(args)
    if importlib.util.find_spec("pip") is None:
        raise UsageError(f"the dynamic stage installs wheels with pip, which {sys.executable} "
                         "lacks: `python -m ensurepip`, or gate with --static-only")



def _check_wheel(path: Path) -> None:
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if not path.is_file():
        raise UsageError(f"{path}: not a file")
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{path}: not a wheel (not a zip archive)")
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
    # Each a new file renamed into place: a link planted in --out is replaced, never written through.
    write_new(out / "summary.md", findings_markdown(audits, verbose=verbose), replace=True)
    write_new(out / "static.json", dumps(record), replace=True)
    write_new(out / "junit.xml", findings_junit(audits), replace=True)


def gate_main(args: argparse.Namespace) -> int:
    """Run ``cumatrix gate``; returns the exit status (0 pass, 1 error finding, 2 bad input,
    5 a dynamic stage in which no cell ran).

    ``-q``: only the verdict lines and failures; ``--json``: one JSON document on stdout
    (docs/json-output.md), every other line on stderr."""
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
        _print_quiet(buf.getvalue())
    if as_json:
        sys.stdout.write(dumps(_json_doc(status, collected)))
    return status


def _print_quiet(text: str) -> None:
    """The lines a reader of a quiet gate needs: findings that fail, FAIL cells, the verdicts."""
    keep = ("static audit:", "ERROR", "FAIL", "dynamic stage: pass", "dynamic stage: FAIL",
            "dynamic stage: NOTHING TESTED")
    for line in text.splitlines():
        if line.lstrip().startswith(keep):
            print(line)


def _json_doc(status: int, collected: dict[str, object]) -> dict[str, object]:
    """``gate --json``'s document: the verdict, the static findings and the dynamic stage's results."""
    doc: dict[str, object] = {"schema": "cumatrix-gate/1", "exit_code": status,
                              "verdict": {0: "PASS", 1: "FAIL", EXIT_NOTHING_RAN: "NOTHING TESTED"}.get(status, "ERROR"),
                              "static": collected.get("static"), "dynamic": None}
    out = collected.get("dynamic_out")
    if isinstance(out, Path) and (out / "results.json").is_file():
        doc["dynamic"] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return doc


def _gate(args: argparse.Namespace) -> int:
    wheels: list[Path] = [Path(w) for w in args.wheels]
    _check_inputs(args, wheels)
    runtime_majors: tuple[int, ...] | None = args.runtimes
    min_driver: CudaVersion = args.min_driver or _default_min_driver(runtime_majors)
    data = load_audit_data(wheel_dir=args.wheel_dir)
    settings = _audit_settings(args, min_driver, runtime_majors)
    audits = [_audit(args, w, settings, data) for w in wheels]
    print(_audit_line(min_driver, runtime_majors, data))
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


def _audit_line(min_driver: CudaVersion, runtime_majors: tuple[int, ...] | None, data: AuditData) -> str:
    """The static audit's first line: what it checks against, and where its facts come from."""
    exports = (f" and the exports of libcudart {data.runtime_sources[0]}-"
               f"{data.runtime_sources[-1]}" if data.runtime_sources else "")
    return (f"static audit: --min-driver {min_driver}, runtimes "
            f"{','.join(map(str, runtime_majors)) if runtime_majors else 'any'}, "
            f"facts from CUDA {' and '.join(data.sources)} headers{exports}")


def _check_inputs(args: argparse.Namespace, wheels: list[Path]) -> None:
    """Everything the gate needs before any work: bad input is exit 2, a host that cannot
    hold the run exit 3."""
    spawn.harden(RunOptions.from_cli(args).policy.pass_env)
    cache_root()  # this user's alone, or exit 3 before anything from it runs
    for w in wheels:
        _check_wheel(w)
    if not args.static_only:
        _check_dynamic_inputs(args)  # bad input is exit 2 before any work
    if args.out is not None or not args.static_only:
        # A file where --out belongs is this host's problem (exit 3, as `run` says it), found
        # before any work: exit 1 is the wheel's verdict, never a harness's crash.
        prepare_out(Path(args.out if args.out is not None else DEFAULT_OUT))


def _audit_settings(args: argparse.Namespace, min_driver: CudaVersion,
                    runtime_majors: tuple[int, ...] | None) -> AuditSettings:
    """The static audit's settings, from the options (the defaults for those not given)."""
    return AuditSettings(
        min_driver=min_driver, runtimes=runtime_majors, strict=args.strict,
        optional=tuple(args.optional), forward_compat=getattr(args, "forward_compat", False),
        min_runtime=getattr(args, "min_runtime", None) or _default_min_runtime(runtime_majors),
        arch_list=getattr(args, "arch_list", None))


def _audit(args: argparse.Namespace, wheel: Path, settings: AuditSettings, data: AuditData) -> WheelAudit:
    """The static audit of one wheel; a wheel that cannot be read is bad input (exit 2)."""
    try:
        return audit_wheel(
            wheel, min_driver=settings.min_driver, runtimes=settings.runtimes, strict=args.strict,
            optional=tuple(args.optional), introductions=data.introductions,
            abi_changed=data.abi_changes, settings=settings, data=data,
        )
    except (zipfile.BadZipFile, OSError) as e:
        raise UsageError(f"{wheel}: cannot read the wheel: {e}") from e
