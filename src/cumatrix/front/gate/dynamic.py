"""The gate's dynamic stage: each wheel installed into every runtime x driver pairing and imported.

One ``import-<wheel>`` cell (and ``smoke-<wheel>`` with ``--smoke``) per wheel and pairing,
each with its own install target, run through :class:`cumatrix.orchestrate.Orchestrator`
with :class:`GateHooks`.  The hooks give facts (a failed install, a wheel for another Python,
a pairing NVIDIA does not support: :class:`~cumatrix.provision.facts.NotRun`); the oracle
predicts each cell (:func:`cumatrix.predict.oracle.expect_gate_cell`) and the judge names
every outcome.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import os
import re
import shutil
import sys
import textwrap
import time
import uuid
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from cumatrix.core.errors import EXIT_NOTHING_RAN, CumatrixError, UsageError
from cumatrix.core.jobs import Job
from cumatrix.core.model import Case, Cell, Driver, Expected, Matrix, Runtime
from cumatrix.core.options import DEFAULT_MATRIX, RunOptions, SandboxPolicy
from cumatrix.core.record import CellRecord
from cumatrix.core.wheelname import own_tags, wheel_name
from cumatrix.execute.installer import run_installer
from cumatrix.front.gate.args import DEFAULT_OUT
from cumatrix.front.history_cli import record
from cumatrix.load import matrix as _matrix
from cumatrix.orchestrate import CellRun, Orchestrator, end_record, run_header
from cumatrix.predict import oracle
from cumatrix.predict.oracle import unsupported_pairing
from cumatrix.provision import runtimes
from cumatrix.provision.facts import NotRun
from cumatrix.report import load_records, progress_line, write_all
from cumatrix.report.jsonout import dumps
from cumatrix.results.records import Seal
from cumatrix.results.store import JSONL, Store

__all__ = ["GateHooks", "GateWheel", "direct_references", "gate_cells", "gate_matrix", "run_dynamic_stage",
           "unsupported_pairing", "wheel_packages"]

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
            found = _recorded_packages(zf, names)
    return tuple(dict.fromkeys(n for n in found if _IDENT_RE.match(n)))


def _recorded_packages(zf: zipfile.ZipFile, names: list[str]) -> list[str]:
    """The top-level packages (a directory with ``__init__.py``) and modules of a wheel
    without ``top_level.txt``: of the files its ``RECORD`` lists, else of its members."""
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
    return found


def _gate_wheels(wheels: Sequence[Path]) -> list[GateWheel]:
    out: list[GateWheel] = []
    parsed = [wheel_name(w) for w in wheels]
    dists = [p.dist for p in parsed]
    for w, p, dist in zip(wheels, parsed, dists, strict=True):
        # Two versions of one distribution gated together need different case names.
        name = dist if dists.count(dist) == 1 else f"{dist}-{p.version}"
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


def _sanitise(cell_id: str) -> str:
    return _UNSAFE_RE.sub("_", cell_id.replace("/", "__")).strip(".") or "cell"


def gate_cells(matrix: Matrix, wheels: Sequence[GateWheel], *, smoke: str | None, sites: Path,
               backend: str, timeout: float | None) -> tuple[list[Cell], dict[str, _CellSite]]:
    """Command cells for every wheel on every pairing of ``matrix``, with their install targets."""
    python = "python3" if backend == "docker" else sys.executable
    pairings = [c for c in _matrix.expand(replace(matrix, probe=True)) if c.kind == "probe"]
    kinds: list[tuple[str, str | None]] = [("import", None)] + ([("smoke", smoke)] if smoke else [])
    cells: list[Cell] = []
    plan: dict[str, _CellSite] = {}
    for pair in pairings:
        for w in wheels:
            for prefix, command in kinds:
                name = f"{prefix}-{w.name}"
                site = sites / _sanitise(f"{pair.runtime}/{pair.driver}/{name}")
                argv, env = _cell_command(w, site, smoke=command, python=python, backend=backend)
                case = Case(name=name, argv=argv, timeout=timeout, env=env)
                cell = Cell(kind="command", runtime=pair.runtime, driver=pair.driver, case=case)
                cells.append(cell)
                plan[cell.id] = _CellSite(wheel=w.name, site=site, smoke=command is not None)
    return cells, plan


def _cell_command(w: GateWheel, site: Path, *, smoke: str | None, python: str,
                  backend: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The argv and environment of a cell that imports ``w`` from ``site`` (``smoke`` None),
    or runs the ``smoke`` command under ``sh -c``."""
    env: list[tuple[str, str]] = [("PYTHONPATH", str(site))]
    if smoke is None:
        return (python, "-c", _IMPORT_SCRIPT, str(site), *w.packages), tuple(env)
    if backend == "local":
        # `python3` in the smoke command is the interpreter that imported the wheel.
        path = os.environ.get("PATH", "")
        env.append(("PATH", os.pathsep.join([str(Path(sys.executable).parent), *([path] if path else [])])))
    return ("sh", "-c", smoke), tuple(env)


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
    offline = constraints is None or wheel_dir is not None  # then pip can run in the cells' sandbox
    return run_installer(argv, target=target, inputs=[p for p in (wheel, constraints) if p is not None],
                         wheel_dir=wheel_dir, sandboxable=offline, policy=policy)


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
    install_failed: dict[str, NotRun] = field(default_factory=dict)  #: wheel name -> why its cells do not run
    #: Environment runtimes (``requirements:``): the wheel is installed with its dependencies
    #: into a copy of the runtime's environment, one per (runtime, wheel).
    matrix: Matrix | None = None
    wheel_files: dict[str, Path] = field(default_factory=dict)
    wheel_dir: Path | None = None
    envs: dict[tuple[str, str], runtimes.ResolvedRuntime | NotRun] = field(default_factory=dict)

    def _runtime_version(self, cell: Cell) -> int | None:
        try:
            return self.runtime_version(cell)
        except CumatrixError:
            return None  # the orchestrator records the provisioning error itself

    def expected(self, cell: Cell, default: Expected) -> Expected:  # noqa: ARG002 - the protocol's signature
        plan = self.sites.get(cell.id)
        return oracle.expect_gate_cell(cell, self.host, runtime_version=self._runtime_version(cell),
                                       smoke=plan is not None and plan.smoke)

    def before_run(self, cell: Cell, expected: Expected) -> NotRun | None:  # noqa: ARG002 - the protocol's
        why = oracle.unsupported_pairing(cell, self.host, self._runtime_version(cell))
        if why is not None:
            return NotRun(why="unsupported-pairing", detail=why)
        plan = self.sites.get(cell.id)
        if plan is None:
            return None
        failed = self.install_failed.get(plan.wheel)
        if failed is not None:
            return failed
        env = self._environment(cell, plan)
        if isinstance(env, NotRun):
            return env
        if env is None and not plan.site.exists():
            _link_tree(self.staged[plan.wheel], plan.site)
        return None

    def _environment(self, cell: Cell, plan: _CellSite) -> runtimes.ResolvedRuntime | NotRun | None:
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
                self.envs[key] = NotRun(why="install-failed", exit_status=1,
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


def run_dynamic_stage(args: argparse.Namespace, wheels: Sequence[Path], static: dict[str, object]) -> int:
    """Stage two: install each wheel into every runtime cell of ``args.matrix`` and import it.

    One ``import-<wheel>`` cell (and ``smoke-<wheel>`` with ``--smoke``) per wheel and
    runtime x driver pairing, each with its own install target, run crash-isolated through
    :class:`cumatrix.orchestrate.Orchestrator`.  Pairings NVIDIA does not support are
    recorded as ``skipped:unsupported-pairing``.  ``results.jsonl`` holds the static findings
    beside the cells, and every report is written from it once.  Returns 0 when every cell
    met its expectation, 1 when one did not, :data:`~cumatrix.core.errors.EXIT_NOTHING_RAN`
    when every cell was skipped (nothing installed and imported: not green).
    """
    out = Path(args.out if args.out is not None else DEFAULT_OUT)
    matrix = gate_matrix(Path(args.matrix) if args.matrix is not None else None)
    gws = _gate_wheels(wheels)
    sites = (out / SITES_DIR).resolve()
    cells, plan = gate_cells(matrix, gws, smoke=args.smoke, sites=sites, backend=args.backend,
                             timeout=args.timeout)
    if not cells:
        raise UsageError(f"{matrix.path}: no runtime x driver pairing to run the wheels on")
    seal = _install_and_run(args, _Stage(matrix=matrix, wheels=gws, cells=cells, plan=plan, out=out, sites=sites),
                            static)
    # The reports and the verdict come from the records as read back, each checked against what
    # this gate sealed: a cell that edited the results (an unsandboxed gate) is refused there.
    run = load_records(out / JSONL, seal=seal)
    write_all(record(args, run, kind="gate", series=history_series(matrix, gws)), out)
    if isinstance(getattr(args, "gate_json", None), dict):
        args.gate_json["dynamic_out"] = out
    return _verdict(args, run.cells, gws, out, len(cells))


@dataclass(frozen=True, kw_only=True, slots=True)
class _Stage:
    """What the dynamic stage runs: its cells of the wheels on the matrix's pairings, each
    cell's install target (under ``sites``), and where its results go."""

    matrix: Matrix
    wheels: Sequence[GateWheel]
    cells: list[Cell]
    plan: dict[str, _CellSite]
    out: Path
    sites: Path


def _install_and_run(args: argparse.Namespace, stage: _Stage, static: dict[str, object]) -> Seal:
    """Install the wheels, run the cells and write their records (after the run header and the
    ``static`` findings) to the stage's results; what the records must show when read back."""
    matrix, gws, cells, out = stage.matrix, stage.wheels, stage.cells, stage.out
    backend: str = args.backend
    wheel_dir = Path(args.wheel_dir) if args.wheel_dir else None
    opts = RunOptions.from_cli(args)
    orch = first = Orchestrator(matrix=matrix, backend=backend, wheel_dir=wheel_dir, timeout=opts.timeout,
                                base_image=args.base_image, policy=opts.policy)
    try:
        # The daemon must answer before any cell runs (its facts join the host fingerprint).
        fingerprint = orch.host_fingerprint()
        hooks = GateHooks(host=orch.host(), runtime_version=orch.provisioner.runtime_version, sites=stage.plan,
                          matrix=matrix, wheel_files={w.name: w.path for w in gws}, wheel_dir=wheel_dir)
        orch = orch.with_hooks(hooks)
        npairs = len(cells) // (len(gws) * (2 if args.smoke else 1))
        print(f"dynamic stage: {len(gws)} wheel{'s' if len(gws) != 1 else ''} x {npairs} "
              f"pairing{'s' if npairs != 1 else ''} of {matrix.path} ({backend} backend), "
              f"{len(cells)} cells; reports in {out}/", flush=True)
        _install_wheels(args, gws, stage.sites, hooks, opts.policy)
        store = Store.open(out, fresh=True)
        store.append(run_header(matrix, [c.id for c in cells], backend=backend,
                                argv=_gate_argv(args), host=None, fingerprint=fingerprint,
                                run_id=uuid.uuid4().hex[:12]))
        store.append(static)
        try:
            _run_cells(orch, cells, store)
        finally:
            store.close()
    finally:
        orch.close()
        if first is not orch:  # the copy with hooks has its own provisioner; both hold temporary files
            first.close()
    return Seal(written=dict(store.sealed))


def _verdict(args: argparse.Namespace, ran: Sequence[CellRecord], gws: Sequence[GateWheel], out: Path,
             total: int) -> int:
    """Print the dynamic stage's verdict from the records read back; its exit status."""
    failed = [c for c in ran if c.status == "fail"]
    for rec in failed:
        print(f"FAIL {rec.id}: {rec.mismatch}")
        hint = missing_dependency(rec, args.constraints, gws)
        if hint:
            print(f"  {hint}")
    reports = f"reports in {out}/ (summary.md, junit.xml, results.json, index.html)"
    if not failed and not any(r.status != "skip" for r in ran):
        # A release gate that installed and imported nothing is not green (issue: PASS over
        # nothing tested): every cell was skipped, so say why and how to gate it for real.
        print(nothing_tested(ran, gws) + f"; {reports}")
        return EXIT_NOTHING_RAN
    print(f"dynamic stage: {'FAIL' if failed else 'pass'}: {len(failed)} of {total} cells "
          f"failed; {reports}")
    return 1 if failed else 0


def history_series(matrix: Matrix, wheels: Sequence[GateWheel]) -> str:
    """The history series of a gate run: its matrix and the wheels gated, each by name,
    version and tag, so each wheel (and each version of it) has a series of its own."""
    keys = sorted(wheel_name(w.path).key for w in wheels)
    return hashlib.sha256(dumps({"matrix": matrix.sha256, "wheels": keys}).encode()).hexdigest()


_NO_MODULE_RE = re.compile(r"No module named '([A-Za-z0-9_.]+)'")


def missing_dependency(rec: CellRecord, constraints: Path | None, wheels: Sequence[GateWheel]) -> str | None:
    """For an import cell that failed on a module outside the wheels gated, with the wheel
    installed alone (no ``--constraints``): how to give the cells its dependencies."""
    text = "\n".join(filter(None, (rec.observed.detail, rec.stderr_tail, rec.stdout_tail, rec.mismatch)))
    m = _NO_MODULE_RE.search(text)
    if m is None or constraints is not None:
        return None
    top = m.group(1).split(".")[0]
    if any(top in w.packages for w in wheels):
        return None  # a module of the wheel itself: a packaging bug, not a dependency
    return (f"hint: {top!r} is not in the wheel, which was installed without its dependencies: pass "
            "--constraints FILE (pip constraints, e.g. `pip freeze > constraints.txt`) to install "
            "them in every cell, with --wheel-dir DIR to take them from a directory instead of the "
            "index; with the local backend, a module installed in the Python that runs cumatrix is "
            "found too")


#: How to gate a wheel whose cells were all skipped for this reason, by ``skipped:<why>``.
_HOW_TO_GATE = {
    # Only the Python that runs the gate installs the wheels (environment runtimes are built
    # with it too), so a matching interpreter is the one way to test such a wheel here.
    "wheel-not-for-this-python": (
        "run the gate under a Python that can install the wheel ({tags}), e.g. `python3.X -m cumatrix gate ...`"),
    "unsupported-pairing": "give --matrix a runtime this host's driver supports",
}


def nothing_tested(records: Sequence[CellRecord], wheels: Sequence[GateWheel]) -> str:
    """The verdict line of a dynamic stage in which every cell was skipped: how many, the
    largest reason, and how to gate the wheels (or ``--static-only`` to rely on the static
    audit alone)."""
    reasons = Counter(r.observed.outcome.removeprefix("skipped:") for r in records)
    top, count = reasons.most_common(1)[0] if reasons else ("no cells", 0)
    tags = ", ".join(sorted({wheel_name(w.path).tag_text for w in wheels}))
    how = _HOW_TO_GATE.get(top, "see each cell's reason in summary.md").format(tags=tags)
    return (f"dynamic stage: NOTHING TESTED — 0 of {len(records)} cells ran ({count} skipped: {top}); "
            f"{how}; or gate with --static-only to rely on the static audit alone (exit {EXIT_NOTHING_RAN})")


def _install_wheels(args: argparse.Namespace, gws: Sequence[GateWheel], sites: Path, hooks: GateHooks,
                    policy: SandboxPolicy) -> None:
    if sites.exists():
        shutil.rmtree(sites)
    for w in gws:
        staged = sites / ".staged" / w.path.name[: -len(".whl")]
        hooks.staged[w.name] = staged
        if wheel_name(w.path).tags.isdisjoint(ours := own_tags()):
            # dist/*.whl often holds one wheel per Python version; each is run by a
            # matching interpreter, and the static audit above still covered this one.
            # Decided from the tags (PEP 425) before pip runs: pip installs with this same
            # interpreter, so its tags are the ones pip would accept.
            why = (f"{w.path.name} is not installable by this Python ({sys.executable}): the wheel's "
                   f"tags ({wheel_name(w.path).tag_text}) are none of this interpreter's (most "
                   f"preferred: {ours[0]}): gate it with a matching interpreter")
            print(f"  {why}; its cells are skipped", flush=True)
            hooks.install_failed[w.name] = NotRun(why="wheel-not-for-this-python", detail=why)
            continue
        how = f"with constraints {args.constraints}" if args.constraints else "without dependencies"
        print(f"installing {w.path.name} {how}", flush=True)
        rc, log = _pip_install(w.path, staged, args.constraints,
                               Path(args.wheel_dir) if getattr(args, "wheel_dir", None) else None, policy)
        if rc != 0:
            print(f"  pip install failed (exit {rc}); every cell of {w.name} fails:\n"
                  + textwrap.indent(log[-2000:], "    "), flush=True)
            hooks.install_failed[w.name] = NotRun(
                why="install-failed", exit_status=rc, detail=f"pip install of {w.path.name} failed: {log[-1500:]}")


def _run_cells(orch: Orchestrator, cells: Sequence[Cell], store: Store) -> None:
    """Run ``cells``, each record sealed into ``store`` as it ends (the verdict is taken later,
    from the records read back)."""
    t0 = time.monotonic()
    done = 0

    def record(run: CellRun) -> None:
        nonlocal done
        rec = run.record
        # Sealed (the digest only names the gate: a gate is never resumed), so that the
        # records read back are checked against what was written.
        store.append(rec.to_store(), digest="gate")
        done += 1
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
