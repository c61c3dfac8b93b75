"""``cumatrix gate``: fail a wheel release that would break on a supported driver/runtime pairing.

Stage one, the static audit, reads every ELF file of each wheel straight from the zip
(:mod:`cumatrix.binary.elf`) and checks it against facts read from real CUDA headers
(:mod:`cumatrix.provision.headers`): which driver entry points the file links, which CUDA runtime major
it needs, and which runtime entry points with a major-dependent ABI it names as strings.
Stage two, the dynamic stage, installs the wheel into each runtime cell of a matrix and
imports it there; it lives behind :func:`run_dynamic_stage`.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cumatrix.load import matrix as _matrix
from cumatrix.predict import oracle
from cumatrix.provision import runtimes
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
from cumatrix.core.jobs import Job
from cumatrix.core.model import Case, Cell, CudaVersion, Driver, Expected, Matrix, Observed, Runtime
from cumatrix.orchestrate import CellRun, Orchestrator, end_record, run_header
from cumatrix.core.options import BACKENDS, DEFAULT_BACKEND, DEFAULT_TIMEOUT, RunOptions, SandboxPolicy
from cumatrix.core.record import CellRecord
from cumatrix.report import load_records, progress_line, write_all
from cumatrix.report.jsonout import dumps
from cumatrix.results.store import JSONL, Store

# --------------------------------------------------------------------------- dynamic stage

#: The matrix the dynamic stage reads when ``--matrix`` is not given (if it exists).
DEFAULT_MATRIX = "matrix.yaml"
#: Where the dynamic stage writes when ``--out`` is not given.
DEFAULT_OUT = Path("gate-out")
#: Sub-directory of ``--out`` holding one install target per cell.
SITES_DIR = "gate-sites"
#: ``matrix`` of the run header when no matrix file is used.
BUILTIN_MATRIX = "<built-in: runtimes.KNOWN_WHEELS x host>"

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PACKAGE_INIT_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)/__init__\.py$")
_MODULE_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.py$")
_UNSAFE_RE = re.compile(r"[^A-Za-z0-9._-]+")

# Run in each import cell as `python -c SCRIPT SITE PKG...`.  The traceback goes to stdout and
# one line saying why to stderr, so the cell's recorded reason is the loader's own message
# (`libcuda.so.1: cannot open shared object file`), not a line from the middle of a traceback.
_IMPORT_SCRIPT = """\
import importlib, os, sys, traceback
site = os.path.realpath(sys.argv[1])
for name in sys.argv[2:]:
    try:
        mod = importlib.import_module(name)
    except Exception as e:
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        sys.exit(f"cannot import {name}: {type(e).__name__}: {e}")
    where = getattr(mod, "__file__", None)
    paths = [where] if where else list(getattr(mod, "__path__", []))
    if not any(os.path.realpath(p).startswith(site + os.sep) for p in paths):
        sys.exit(f"{name} was imported from {paths}, not from the installed wheel in {site}: "
                 "another copy shadows it")
    print(f"imported {name} from {paths[0]}")
if len(sys.argv) == 2:
    print("the wheel declares no top-level package: nothing to import")
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class GateWheel:
    """A wheel as the dynamic stage runs it."""

    path: Path
    name: str  #: the name in case names: ``import-<name>``, ``smoke-<name>``
    packages: tuple[str, ...]  #: top-level import names


@dataclass(frozen=True, kw_only=True, slots=True)
class _CellSite:
    wheel: str  #: GateWheel.name
    site: Path  #: the cell's own install target (PYTHONPATH)
    smoke: bool


def wheel_packages(wheel: Path) -> tuple[str, ...]:
    """Top-level import names of ``wheel``.

    From ``*.dist-info/top_level.txt`` when the wheel has one; otherwise the top-level
    directories with an ``__init__.py`` and the top-level ``*.py`` modules its ``RECORD`` lists.
    """
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/top_level\.txt", n)]
        if top:
            text = zf.read(top[0]).decode("utf-8", errors="replace")
            found = [line.strip().replace("/", ".") for line in text.splitlines()]
        else:
            record = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
            listed = names
            if record:
                rows = csv.reader(io.StringIO(zf.read(record[0]).decode("utf-8", errors="replace")))
                listed = [row[0] for row in rows if row]
            found = []
            for path in listed:
                m = _PACKAGE_INIT_RE.match(path) or _MODULE_RE.match(path)
                if m:
                    found.append(m.group(1))
    return tuple(dict.fromkeys(n for n in found if _IDENT_RE.match(n)))


def _gate_wheels(wheels: Sequence[Path]) -> list[GateWheel]:
    out: list[GateWheel] = []
    stems = [w.name.split("-") for w in wheels]
    dists = [parts[0].lower() for parts in stems]
    for w, parts, dist in zip(wheels, stems, dists):
        # Two versions of one distribution gated together need different case names.
        name = dist if dists.count(dist) == 1 else f"{dist}-{parts[1] if len(parts) > 1 else ''}"
        name = _UNSAFE_RE.sub("_", name).strip("-.") or "wheel"
        if any(g.name == name for g in out):
            raise UsageError(f"{w}: gated twice (or two wheels of the same name and version)")
        out.append(GateWheel(path=w, name=name, packages=wheel_packages(w)))
    return out


def builtin_matrix() -> Matrix:
    """The runtimes of :data:`cumatrix.provision.runtimes.KNOWN_WHEELS` on the host driver."""
    rts = tuple(Runtime(name=f"cu{v}", requirement=req) for v, req in runtimes.KNOWN_WHEELS.items())
    digest = hashlib.sha256(dumps({"runtimes": dict(runtimes.KNOWN_WHEELS),
                                   "drivers": ["host"]}).encode()).hexdigest()
    return Matrix(path=BUILTIN_MATRIX, sha256=digest, version=1, runtimes=rts,
                  drivers=(Driver(name="host"),), probe=False)


def gate_matrix(path: Path | None) -> Matrix:
    """The runtime x driver pairings the dynamic stage runs.

    ``path`` (else ``./matrix.yaml``, else :func:`builtin_matrix`) is loaded and stripped of
    variants, workloads, cases and ``expect:`` overrides: every supported pairing must be
    ``ok``.  ``exclude:`` entries that name only runtimes and drivers still apply.
    """
    if path is None:
        default = Path(DEFAULT_MATRIX)
        if not default.is_file():
            return builtin_matrix()
        path = default
    if not path.is_file():
        raise UsageError(f"--matrix {path}: no such matrix file")
    m = _matrix.load(path)
    pairs = tuple(s for s in m.exclude if {k for k, _ in s.values} <= {"runtime", "driver"})
    return replace(m, builds=(), variants=(), workloads=(), cases=(), expect=(), exclude=pairs,
                   probe=False)


def unsupported_pairing(cell: Cell, host: oracle.HostFacts, runtime_version: int | None) -> str | None:
    """Why NVIDIA does not support ``cell``'s runtime on its driver, or ``None``.

    A runtime of a newer CUDA major than the (effective) driver fails with
    ``cudaErrorInsufficientDriver``; minor-version compatibility covers the rest.  With no
    driver, or an unknown runtime version, the pairing is run (a wheel must import there).
    """
    d = oracle.effective_driver(cell, host)
    if d is None or runtime_version is None:
        return None
    if runtime_version // 1000 <= d // 1000:
        return None
    rv, dv = CudaVersion.from_int(runtime_version), CudaVersion.from_int(d)
    return (f"runtime {rv} needs a CUDA {rv.major} driver; driver {cell.driver} is CUDA {dv}, and "
            "NVIDIA supports no runtime of a newer major than the driver "
            "(cudaErrorInsufficientDriver): not run")


def _sanitise(cell_id: str) -> str:
    return _UNSAFE_RE.sub("_", cell_id.replace("/", "__")).strip(".") or "cell"


def gate_cells(matrix: Matrix, wheels: Sequence[GateWheel], *, smoke: str | None, sites: Path,
               backend: str, timeout: float | None) -> tuple[list[Cell], dict[str, _CellSite]]:
    """Command cells for every wheel on every pairing of ``matrix``, with their install targets."""
    python = "python3" if backend == "docker" else sys.executable
    pairings = [c for c in _matrix.expand(replace(matrix, probe=True)) if c.kind == "probe"]
    cells: list[Cell] = []
    plan: dict[str, _CellSite] = {}
    for pair in pairings:
        for w in wheels:
            kinds = [("import", False)] + ([("smoke", True)] if smoke else [])
            for prefix, is_smoke in kinds:
                name = f"{prefix}-{w.name}"
                cell_id = f"{pair.runtime}/{pair.driver}/{name}"
                site = sites / _sanitise(cell_id)
                env: list[tuple[str, str]] = [("PYTHONPATH", str(site))]
                if is_smoke:
                    assert smoke is not None
                    argv: tuple[str, ...] = ("sh", "-c", smoke)
                    if backend == "local":
                        # `python3` in the smoke command is the interpreter that imported the wheel.
                        path = os.environ.get("PATH", "")
                        env.append(("PATH", os.pathsep.join([str(Path(sys.executable).parent),
                                                             *([path] if path else [])])))
                else:
                    argv = (python, "-c", _IMPORT_SCRIPT, str(site), *w.packages)
                case = Case(name=name, argv=argv, timeout=timeout, env=tuple(env))
                cell = Cell(kind="command", runtime=pair.runtime, driver=pair.driver, case=case)
                cells.append(cell)
                plan[cell.id] = _CellSite(wheel=w.name, site=site, smoke=is_smoke)
    return cells, plan


def direct_references(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` entries of ``wheel``'s metadata that are direct references
    (``name @ file:///dir``, ``name @ https://...``): pip would fetch or build those from
    wherever they point, outside any index and any constraint."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            meta = next((n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), None)
            text = zf.read(meta).decode("utf-8", "replace") if meta else ""
    except (zipfile.BadZipFile, OSError, KeyError):
        return []
    out = []
    for line in text.splitlines():
        if not line.strip():
            break  # the headers end at the first blank line; the description follows
        key, _, value = line.partition(":")
        if key.strip().lower() == "requires-dist" and "@" in value.split(";", 1)[0]:
            out.append(value.strip())
    return out


def _pip_install(wheel: Path, target: Path, constraints: Path | None,
                 wheel_dir: Path | None = None, policy: SandboxPolicy | None = None) -> tuple[int, str]:
    argv = [sys.executable, "-m", "pip", "install", "--target", str(target), "--no-compile",
            "--disable-pip-version-check", "--no-input", "--no-warn-script-location", "-q"]
    if constraints is None:
        argv += ["--no-deps", "--no-index"]  # the wheel alone: nothing fetched
    else:
        refs = direct_references(wheel)
        if refs:
            return 2, (f"{wheel.name} asks for dependencies by direct reference ({'; '.join(refs)}): the gate "
                       "installs wheels only, from an index or --wheel-dir, never a build from a path or URL")
        # Wheels only: no dependency is built, so no build backend of anyone's runs here.
        argv += ["--constraint", str(constraints), "--only-binary", ":all:"]
        if wheel_dir is not None:
            argv += ["--no-index", "--find-links", str(wheel_dir)]  # nothing reaches the network
    argv.append(str(wheel))
    env = None
    if policy is not None and (constraints is None or wheel_dir is not None):  # offline: in the cells' sandbox
        boxed = _sandboxed(argv, target, [p for p in (wheel, constraints) if p is not None], wheel_dir, policy)
        if boxed is not None:
            argv, env = boxed
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        return 124, "pip install did not finish in 30 minutes"
    return proc.returncode, (proc.stderr or proc.stdout).strip()


def _sandboxed(argv: list[str], target: Path, files: Sequence[Path], wheel_dir: Path | None,
               policy: SandboxPolicy) -> tuple[list[str], dict[str, str]] | None:
    """``argv`` (pip) under the cells' sandbox, where the gate sandboxes its cells and bubblewrap
    runs: no network, the host read-only but for ``target``, and as a root harness's cells run
    (an unprivileged uid).  ``files`` (the wheel, the constraints) are copied beside ``target``
    where that uid reads them.  None where there is no sandbox to use, or (as root) a
    ``wheel_dir`` that uid may not read: pip then runs on the host, wheels only, as before."""
    from cumatrix.core.jobs import Job
    from cumatrix.execute import sandbox

    if policy.sandbox == "off":
        return None
    bwrap, _why = sandbox.bubblewrap()
    if bwrap is None:
        return None
    root = os.geteuid() == 0
    if root and wheel_dir is not None and os.stat(wheel_dir).st_mode & 0o005 != 0o005:
        return None
    target.mkdir(parents=True, exist_ok=True)
    given = target.with_name(target.name + ".in")
    given.mkdir(mode=0o755, exist_ok=True)
    given.chmod(0o755)
    argv = list(argv)
    for f in files:
        copy = given / f.name
        shutil.copyfile(f, copy)
        copy.chmod(0o644)
        argv = [str(copy) if a == str(f) else a for a in argv]
    if root:
        os.chown(target, policy.uid, policy.uid)  # the sandbox's uid writes the install
    read = [str(given), *([str(wheel_dir)] if wheel_dir is not None else [])]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/tmp", "TMPDIR": "/tmp",
           "LANG": os.environ.get("LANG", "C.UTF-8"), "PIP_NO_CACHE_DIR": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    job = Job(cell_id="pip", kind="command", argv=tuple(argv), mounts=tuple(read))
    return sandbox.bwrap_argv(bwrap, job, env, str(target), policy, write_dirs=[str(target)]), env


def _link_tree(src: Path, dst: Path) -> None:
    # Hard links: a 300 MB wheel in twelve cells costs 300 MB, not 3.6 GB.  Python writes
    # bytecode to new files, never through a link; the docker backend mounts the copy read-only.
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, symlinks=True, copy_function=link)


@dataclass
class GateHooks:
    """What the gate changes about its cells: unsupported pairings are skipped, each cell
    gets its own install of the wheel, and smoke commands run under ``sh -c``."""

    host: oracle.HostFacts
    runtime_version: Callable[[Cell], int | None]
    sites: dict[str, _CellSite] = field(default_factory=dict)
    staged: dict[str, Path] = field(default_factory=dict)  #: wheel name -> pip's install
    install_failed: dict[str, Observed] = field(default_factory=dict)  #: wheel name -> outcome
    #: Environment runtimes (``requirements:``): the wheel is installed with its dependencies
    #: into a copy of the runtime's environment, one per (runtime, wheel).
    matrix: Matrix | None = None
    wheel_files: dict[str, Path] = field(default_factory=dict)
    wheel_dir: Path | None = None
    envs: dict[tuple[str, str], runtimes.ResolvedRuntime | Observed] = field(default_factory=dict)

    def unsupported(self, cell: Cell) -> str | None:
        try:
            rv = self.runtime_version(cell)
        except CumatrixError:
            return None  # the orchestrator records the provisioning error itself
        return unsupported_pairing(cell, self.host, rv)

    def expected(self, cell: Cell, default: Expected) -> Expected:
        why = self.unsupported(cell)
        if why is not None:
            return Expected(outcomes=frozenset({"skipped:unsupported-pairing"}), reason=why,
                            rule="unsupported-pairing")
        plan = self.sites.get(cell.id)
        what = ("the --smoke command must exit 0" if plan is not None and plan.smoke
                else "the wheel's top-level packages must import")
        d = oracle.effective_driver(cell, self.host)
        where = (f"on every pairing NVIDIA supports (driver {cell.driver}: CUDA "
                 f"{CudaVersion.from_int(d)})" if d is not None else
                 "with no NVIDIA driver on the host too (CPU-only CI, docs builds)")
        return Expected(outcomes=frozenset({"ok"}), reason=f"{what} {where}", rule="gate")

    def before_run(self, cell: Cell, expected: Expected) -> Observed | None:
        if expected.rule == "unsupported-pairing":
            return Observed(outcome="skipped:unsupported-pairing", detail=expected.reason)
        plan = self.sites.get(cell.id)
        if plan is None:
            return None
        failed = self.install_failed.get(plan.wheel)
        if failed is not None:
            return failed
        env = self._environment(cell, plan)
        if isinstance(env, Observed):
            return env
        if env is None and not plan.site.exists():
            _link_tree(self.staged[plan.wheel], plan.site)
        return None

    def _environment(self, cell: Cell, plan: _CellSite) -> runtimes.ResolvedRuntime | Observed | None:
        """For an environment runtime: its environment with the wheel and its dependencies installed."""
        rt = self.matrix.runtime(cell.runtime) if self.matrix is not None else None
        if rt is None or not rt.requirements:
            return None
        key = (cell.runtime, plan.wheel)
        if key not in self.envs:
            try:
                self.envs[key] = runtimes.install_into_environment(rt, [self.wheel_files[plan.wheel]],
                                                                   wheel_dir=self.wheel_dir)
            except CumatrixError as e:
                self.envs[key] = Observed(outcome="exit:1", exit_status=1,
                                          detail=f"installing {plan.wheel} with its dependencies into {rt.label} "
                                                 f"failed: {e}")
        return self.envs[key]

    def job(self, cell: Cell, job: Job) -> Job:
        plan = self.sites.get(cell.id)
        if plan is None:
            return job
        env = self.envs.get((cell.runtime, plan.wheel))
        if isinstance(env, runtimes.ResolvedRuntime) and env.env_dir is not None:
            # The cell runs inside the environment that holds the wheel: its python, its bin/ first.
            argv = job.argv
            if not plan.smoke:
                argv = (str(env.env_dir / "bin" / "python"), *argv[1:3], str(env.env_dir), *argv[4:])
            extra = tuple((k, v) for k, v in job.env if k != "PYTHONPATH") + env.cell_env()
            return replace(job, argv=argv, env=extra, mounts=(*job.mounts, str(env.env_dir)))
        return replace(job, mounts=(*job.mounts, str(plan.site)))  # docker: read-only, same path

    def shell_wrapped(self, cell: Cell) -> bool:
        plan = self.sites.get(cell.id)
        return plan is not None and plan.smoke


def _gate_argv(args: argparse.Namespace) -> list[str]:
    out = ["cumatrix", "gate", *(str(w) for w in args.wheels)]
    for flag, attr in (("--min-driver", "min_driver"), ("--runtimes", "runtimes"),
                       ("--matrix", "matrix"), ("--smoke", "smoke"),
                       ("--constraints", "constraints"), ("--out", "out"),
                       ("--backend", "backend"), ("--base-image", "base_image"),
                       ("--timeout", "timeout"), ("--wheel-dir", "wheel_dir")):
        value = getattr(args, attr, None)
        if value is None or (attr == "backend" and value == "local"):
            continue
        out += [flag, ",".join(map(str, value)) if isinstance(value, tuple) else str(value)]
    out += [f"--optional={g}" for g in getattr(args, "optional", [])]
    out += ["--strict"] if getattr(args, "strict", False) else []
    return out


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


def run_dynamic_stage(args: argparse.Namespace, wheels: Sequence[Path], static: dict[str, object]) -> int:
    """Stage two: install each wheel into every runtime cell of ``args.matrix`` and import it.

    One ``import-<wheel>`` cell (and ``smoke-<wheel>`` with ``--smoke``) per wheel and
    runtime x driver pairing, each with its own install target, run crash-isolated through
    :class:`cumatrix.orchestrate.Orchestrator`.  Pairings NVIDIA does not support are
    recorded as ``skipped:unsupported-pairing``.  ``results.jsonl`` holds the static findings
    beside the cells, and every report is written from it once.  Returns 0 when every cell
    met its expectation, 1 otherwise.
    """
    out = Path(args.out if args.out is not None else DEFAULT_OUT)
    backend: str = args.backend
    wheel_dir = Path(args.wheel_dir) if args.wheel_dir else None
    matrix = gate_matrix(Path(args.matrix) if args.matrix is not None else None)
    gws = _gate_wheels(wheels)
    sites = (out / SITES_DIR).resolve()
    cells, plan = gate_cells(matrix, gws, smoke=args.smoke, sites=sites, backend=backend,
                             timeout=args.timeout)
    if not cells:
        raise UsageError(f"{matrix.path}: no runtime x driver pairing to run the wheels on")
    opts = RunOptions.from_cli(args)
    orch = first = Orchestrator(matrix=matrix, backend=backend, wheel_dir=wheel_dir, timeout=opts.timeout,
                                base_image=args.base_image, policy=opts.policy)
    try:
        # The daemon must answer before any cell runs (its facts join the host fingerprint).
        fingerprint = orch.host_fingerprint()
        hooks = GateHooks(host=orch.host(), runtime_version=orch.provisioner.runtime_version, sites=plan,
                          matrix=matrix, wheel_files={w.name: w.path for w in gws}, wheel_dir=wheel_dir)
        orch = orch.with_hooks(hooks)
        npairs = len(cells) // (len(gws) * (2 if args.smoke else 1))
        print(f"dynamic stage: {len(gws)} wheel{'s' if len(gws) != 1 else ''} x {npairs} "
              f"pairing{'s' if npairs != 1 else ''} of {matrix.path} ({backend} backend), "
              f"{len(cells)} cells; reports in {out}/", flush=True)
        _install_wheels(args, gws, sites, hooks, opts.policy)
        store = Store.open(out, fresh=True)
        store.append(run_header(matrix, [c.id for c in cells], backend=backend,
                                argv=_gate_argv(args), host=None, fingerprint=fingerprint,
                                run_id=uuid.uuid4().hex[:12]))
        store.append(static)
        try:
            failed = _run_cells(orch, cells, store)
        finally:
            store.close()
    finally:
        orch.close()
        if first is not orch:  # the copy with hooks has its own provisioner; both hold temporary files
            first.close()
    from cumatrix.front.history_cli import record

    write_all(record(args, load_records(out / JSONL), kind="gate"), out)
    if isinstance(getattr(args, "gate_json", None), dict):
        args.gate_json["dynamic_out"] = out
    for rec in failed:
        print(f"FAIL {rec.id}: {rec.mismatch}")
    print(f"dynamic stage: {'FAIL' if failed else 'pass'}: {len(failed)} of {len(cells)} cells "
          f"failed; reports in {out}/ (summary.md, junit.xml, results.json, index.html)")
    return 1 if failed else 0


def _install_wheels(args: argparse.Namespace, gws: Sequence[GateWheel], sites: Path, hooks: GateHooks,
                    policy: SandboxPolicy) -> None:
    if sites.exists():
        shutil.rmtree(sites)
    for w in gws:
        staged = sites / ".staged" / w.path.name[: -len(".whl")]
        how = f"with constraints {args.constraints}" if args.constraints else "without dependencies"
        print(f"installing {w.path.name} {how}", flush=True)
        rc, log = _pip_install(w.path, staged, args.constraints,
                               Path(args.wheel_dir) if getattr(args, "wheel_dir", None) else None, policy)
        if rc != 0 and "is not a supported wheel on this platform" in log:
            # dist/*.whl often holds one wheel per Python version; each is run by a
            # matching interpreter, and the static audit above still covered this one.
            why = (f"{w.path.name} is not installable by this Python ({sys.executable}, "
                   f"{sys.implementation.cache_tag}): gate it with a matching interpreter")
            print(f"  {why}; its cells are skipped", flush=True)
            hooks.install_failed[w.name] = Observed(outcome="skipped:wheel-not-for-this-python", detail=why)
        elif rc != 0:
            print(f"  pip install failed (exit {rc}); every cell of {w.name} fails:\n"
                  + textwrap.indent(log[-2000:], "    "), flush=True)
            hooks.install_failed[w.name] = Observed(
                outcome=f"exit:{rc}", exit_status=rc, detail=f"pip install of {w.path.name} failed: {log[-1500:]}")
        hooks.staged[w.name] = staged


def _run_cells(orch: Orchestrator, cells: Sequence[Cell], store: Store) -> list[CellRecord]:
    failed: list[CellRecord] = []
    t0 = time.monotonic()
    done = 0

    def record(run: CellRun) -> None:
        nonlocal done
        rec = run.record
        store.append(rec.to_store())
        done += 1
        if rec.status == "fail":
            failed.append(rec)
        obs = rec.observed
        outcome = obs.outcome + (f" [{obs.path}]" if obs.path not in (None, "n/a") else "")
        print(progress_line(done, len(cells), time.monotonic() - t0, rec.id, rec.status, outcome),
              file=sys.stderr, flush=True)

    interrupted = True
    try:
        orch.run_all(cells, record)
        interrupted = False
    finally:
        # A killed gate still leaves a report of what it finished.
        store.append(end_record(interrupted=interrupted))
    return failed


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
