"""The one orchestrator: a cell through every stage, for every front end.

The cell's runtime is provisioned first, once per run (:mod:`~cumatrix.provision.runtimeset`),
and handed to every stage after it: ``Cell -> Expected`` (:mod:`~cumatrix.predict.oracle`)
``-> Job`` (:mod:`~cumatrix.provision.cell`) ``-> ChildResult`` (:mod:`~cumatrix.execute.local`
or :mod:`~cumatrix.execute.docker`, under the rtld-audit of :mod:`~cumatrix.execute.cellaudit`)
``-> Observed`` (:mod:`~cumatrix.judge.classify`) ``-> CellRecord`` (:mod:`~cumatrix.judge.verdict`).
Provisioning and a front end's hooks give facts (a job, or a
:class:`~cumatrix.provision.facts.NotRun`); only the oracle and the judge name outcomes.

The pytest plugin (and so ``cumatrix run``), the gate's dynamic stage, ``repro`` and
``calibrate`` all run cells through :meth:`Orchestrator.run`, which hands back the record
and the job it ran (``repro`` prints that job; it never rebuilds one).  Front ends that
need more (the gate installs a wheel into each cell) plug in a :class:`CellHooks`.  A harness
child that is no cell of a matrix (``calibrate``'s measuring child, ``repro``'s debugger run)
goes through :func:`run_child`: spawned by the execute stage like a cell, judged by the judge.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Self

from cumatrix import __version__
from cumatrix.audit.static import runtime_introductions
from cumatrix.core.errors import CumatrixError
from cumatrix.core.jobs import ChildResult, Job
from cumatrix.core.model import NO_RUNTIME, Cell, Expected, Matrix, Observed
from cumatrix.core.options import DEFAULT_TIMEOUT, SandboxPolicy
from cumatrix.core.record import CellRecord, Status
from cumatrix.execute import driverview, observe
from cumatrix.execute.cellaudit import Audit, CellAuditor, missing_evidence
from cumatrix.execute.local import LocalChild, ReadyChild, SpawnMode, ready_local, run_local, start_local
from cumatrix.host.fingerprint import host_fingerprint
from cumatrix.judge.classify import classify, harness_error, not_run, with_audit
from cumatrix.judge.verdict import Facts, decide_child, judge, utcnow
from cumatrix.predict import oracle
from cumatrix.provision.cell import Provisioner, Settings
from cumatrix.provision.facts import NotRun
from cumatrix.provision.runtimeset import ProvisionedRuntime, RuntimeSet

if TYPE_CHECKING:
    from cumatrix.execute.docker import DockerBackend


class CellHooks(Protocol):
    """What a front end may change about its cells (the gate's dynamic stage uses it)."""

    def expected(self, cell: Cell, default: Expected) -> Expected:
        """The expectation of ``cell``, given the oracle's."""

    def before_run(self, cell: Cell, expected: Expected) -> NotRun | None:
        """A fact that decides the cell without running it (the judge names its outcome), or ``None``."""

    def job(self, cell: Cell, job: Job) -> Job:
        """The job to run for ``cell``, given the provisioned one."""

    def shell_wrapped(self, cell: Cell) -> bool:
        """Whether the cell's command runs under ``sh -c``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CellRun:
    """A finished cell: its record, and the job that ran (``None``: decided without a child)."""

    record: CellRecord
    job: Job | None


@dataclass(kw_only=True, slots=True)
class _Turn:
    """A cell on its way through the stages (made ready ahead of its turn, or in it)."""

    cell: Cell
    started: str
    t0: float
    expected: Expected
    runtime: ProvisionedRuntime | None = None  # the cell's runtime, as the run provisioned it
    job: Job | None = None
    audit: Audit | None = None
    not_run: NotRun | None = None  # decided without a child (or failed to provision)
    child: LocalChild | None = None
    ready: ReadyChild | None = None  # its child made ready ahead, its program not started
    ready_s: float = 0.0  # how long stages one and two took
    ahead: bool = False


@dataclass
class Orchestrator:
    """Runs the cells of one matrix; one per process (the pytest controller, each worker)."""

    matrix: Matrix
    backend: str = "local"
    wheel_dir: Path | None = None
    timeout: float = DEFAULT_TIMEOUT
    base_image: str | None = None
    host_label: str | None = None
    require_gpu: bool = False
    hooks: CellHooks | None = None
    child_env: tuple[tuple[str, str], ...] = ()
    #: What a local cell's child sees of the host (the run's options; None: the environment's).
    policy: SandboxPolicy | None = None
    _host_fp: dict[str, object] | None = None
    _missing: tuple[str, ...] | None = None
    _docker: DockerBackend | None = None
    _provisioner: Provisioner | None = field(default=None, repr=False)
    _runtimes: RuntimeSet | None = field(default=None, repr=False)
    _auditor: CellAuditor | None = field(default=None, repr=False)
    _ahead: _Turn | None = field(default=None, repr=False)

    # ----------------------------------------------------------------- host

    def host_fingerprint(self) -> dict[str, object]:
        """The host's driver, GPUs and (docker backend) daemon, looked up once."""
        if self._host_fp is None:
            fp: dict[str, object] = dict(host_fingerprint())
            if self.backend == "docker":
                fp["docker"] = self.docker().fingerprint()
            self._host_fp = fp
        return self._host_fp

    def missing_evidence(self) -> tuple[str, ...]:
        """What no cell of this run can be observed by here (no compiled helper), looked up once."""
        if self._missing is None:
            self._missing = missing_evidence()
        return self._missing

    def host(self) -> oracle.HostFacts:
        dv = self.host_fingerprint().get("driver_version")
        return oracle.HostFacts(driver_version=int(str(dv)) if dv else None, backend=self.backend)

    def docker(self) -> DockerBackend:
        if self._docker is None:
            # deferred: the docker SDK costs ~80 ms and ~200 modules; only the docker backend needs it
            from cumatrix.execute.docker import DockerBackend

            self._docker = DockerBackend(self.base_image)
            if self.policy is not None:
                self._docker.hidden = self.policy.hidden  # the run's --out: masked in containers too
        return self._docker

    @property
    def runtimes(self) -> RuntimeSet:
        """The run's runtimes, each provisioned once, when its first cell asks (shared by the
        copies :meth:`with_hooks` makes)."""
        if self._runtimes is None:
            self._runtimes = RuntimeSet(matrix=self.matrix, wheel_dir=self.wheel_dir)
        return self._runtimes

    @property
    def provisioner(self) -> Provisioner:
        if self._provisioner is None:
            settings = Settings(matrix=self.matrix, backend=self.backend, wheel_dir=self.wheel_dir,
                                timeout=self.timeout, child_env=self.child_env)
            self._provisioner = Provisioner(settings=settings, host_driver=self.host().driver_version,
                                            runtime_set=self.runtimes)
        return self._provisioner

    @property
    def auditor(self) -> CellAuditor:
        """What puts this run's cells under the rtld-audit (and holds the run's audit directory)."""
        if self._auditor is None:
            self._auditor = CellAuditor(provisioner=self.provisioner, backend=self.backend,
                                        docker=self.docker() if self.backend == "docker" else None)
        return self._auditor

    def close(self) -> None:
        """Undo a cell started ahead; remove the run's temporary files; release the docker
        client, if one was opened."""
        self.cancel_ahead()
        if self._auditor is not None:
            self._auditor.close()
        if self._docker is not None:
            self._docker.close()
            self._docker = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- stages

    def expected(self, cell: Cell, runtime: ProvisionedRuntime | None) -> Expected:
        """Stage one: what the oracle (and the front end's hooks) predict for ``cell``, whose
        runtime the run provisioned as ``runtime`` (None: it loads none)."""
        rv = runtime.version if runtime is not None else None
        exp = oracle.expect(cell, self.host(), runtime_version=rv, matrix=self.matrix)
        return self.hooks.expected(cell, exp) if self.hooks else exp

    def execute(self, job: Job) -> ChildResult:
        """Stage three: run the job's child on the backend."""
        if self.backend == "docker":
            return self.docker().run_job(job)
        return run_local(job, policy=self.policy, cwd=job.cwd or None)

    def run(self, cell: Cell, *, then: Cell | None = None) -> CellRun:
        """Run one cell through every stage; never raises for the cell's own failure.

        ``then``, the cell that will run next (if any), is made ready while this cell's
        child runs (its job, and its child up to the program: environment, cgroup, and where
        the fork server holds it, tracer, namespaces and root) and its program started the
        moment this one ends, so that this cell's classification and reporting, and the next
        one's sandbox, happen beside a running child instead of between two.  Cells never
        overlap: the next program starts only once this one's processes are gone.  A cell
        run next that is not ``then`` finds it undone (:meth:`cancel_ahead`).
        """
        turn = self._take_ahead(cell) or self._begin(cell)
        child: ChildResult | None = None
        try:
            try:
                running = self._launch(turn)
                if then is not None and self._may_start_ahead(then):
                    self._ahead = self._ready_ahead(then)
                if running is not None:
                    child = running.wait(gone=self._launch_ahead)
                elif turn.job is not None and turn.not_run is None:
                    child = self.execute(turn.job)
            except CumatrixError as e:
                turn.not_run = NotRun(why="harness-failed", detail=str(e))
            self._launch_ahead()
        except BaseException:
            self.cancel_ahead()
            raise
        return self._conclude(turn, child)

    def _begin(self, cell: Cell) -> _Turn:
        """Stages one and two: the expectation and the job (with its audit), not yet run; the
        cell's runtime, provisioned once per run, first: each stage is handed it."""
        t0, started = time.monotonic(), utcnow()
        runtime = self.runtimes.for_cell(cell)
        turn = _Turn(cell=cell, started=started, t0=t0, expected=self.expected(cell, runtime), runtime=runtime)
        try:
            prepared = (self.hooks.before_run(cell, turn.expected) if self.hooks else None) \
                or self.provisioner.prepare(cell, runtime)
            if isinstance(prepared, Job):
                job = self._in_image(runtime, self.hooks.job(cell, prepared) if self.hooks else prepared)
                turn.job, turn.audit = self.auditor.audited(cell, job, runtime)
            else:
                turn.not_run = prepared
        except CumatrixError as e:
            turn.not_run = NotRun(why="harness-failed", detail=str(e))
        turn.ready_s = time.monotonic() - t0
        return turn

    def _launch(self, turn: _Turn) -> LocalChild | None:
        """Start the turn's child (local backend), once; ``None`` where it runs another way."""
        if turn.child is None and turn.job is not None and turn.not_run is None and self.backend == "local":
            if turn.ahead:  # its clock starts now, as if it had been made ready just before
                turn.started, turn.t0 = utcnow(), time.monotonic() - turn.ready_s
            ready, turn.ready = turn.ready, None
            turn.child = ready.go() if ready is not None else start_local(turn.job, policy=self.policy,
                                                                          cwd=turn.job.cwd or None)
        return turn.child

    def _launch_ahead(self) -> None:
        """Start the cell made ready ahead (once: a second call finds it started)."""
        if self._ahead is not None:
            self._launch(self._ahead)

    def _conclude(self, turn: _Turn, child: ChildResult | None) -> CellRun:
        """Stages four and five: what the child did, judged against the expectation."""
        cell, expected, seen = turn.cell, turn.expected, None
        observed = not_run(turn.not_run) if turn.not_run is not None else None
        try:
            if observed is None:
                assert child is not None  # a turn with a job and no outcome yet has run its child
                seen = (turn.audit.conclude(child.trace, intros=runtime_introductions)
                        if turn.audit is not None else None)
                observed = with_audit(classify(child, kind=cell.kind), seen)
                expected = self._program_expectation(cell, expected, seen)
        except CumatrixError as e:
            observed = harness_error(str(e))
        finally:
            if turn.audit is not None:
                turn.audit.discard()  # the cell's private directory goes with it, whatever happened
        record = judge(cell, expected, observed, child, self._facts(turn, seen, child), started=turn.started,
                       duration_s=time.monotonic() - turn.t0)
        return CellRun(record=record, job=turn.job)

    # ----------------------------------------------------------------- the next cell, ahead

    def _may_start_ahead(self, cell: Cell) -> bool:
        """Whether ``cell`` can be made ready while another cell's child runs: only where that
        costs no provisioning (a wheel to fetch, an interposer or a variant to build would
        stall the running cell's output), and not for swap cells, which time the GPU."""
        if self.backend != "local" or self.hooks is not None or cell.kind not in ("command", "probe"):
            return False
        if cell.driver.startswith("emulated-") and not self.provisioner.has_interposer(cell.driver):
            return False
        return cell.runtime == NO_RUNTIME or self.runtimes.resolved(cell.runtime) is not None

    def _ready_ahead(self, cell: Cell) -> _Turn | None:
        try:
            turn = self._begin(cell)
        except Exception:  # noqa: BLE001 - it fails again, and is reported, in its own turn
            return None
        turn.ahead = True
        if turn.job is not None and turn.not_run is None:
            # Its sandbox made while this cell runs, its program waiting for its turn; a failure
            # here is made again in its turn, and reported there.
            with contextlib.suppress(CumatrixError):
                turn.ready = ready_local(turn.job, policy=self.policy, cwd=turn.job.cwd or None)
        return turn

    def _take_ahead(self, cell: Cell) -> _Turn | None:
        if self._ahead is not None and self._ahead.cell != cell:
            self.cancel_ahead()
        turn, self._ahead = self._ahead, None
        return turn

    def cancel_ahead(self) -> None:
        """Undo the cell made ready (or started) ahead of its turn: a run that stops early."""
        turn, self._ahead = self._ahead, None
        if turn is not None:
            self._drop(turn)

    @staticmethod
    def _drop(turn: _Turn) -> None:
        if turn.ready is not None:
            turn.ready.cancel()
            turn.ready = None
        if turn.child is not None:
            turn.child.cancel()
        if turn.audit is not None:
            turn.audit.discard()

    def _in_image(self, runtime: ProvisionedRuntime | None, job: Job) -> Job:
        """A docker cell's job names the image it runs in: its runtime's, built here once
        (a problem building it is the backend's to report), else the base image."""
        if self.backend != "docker":
            return job
        docker = self.docker()
        if runtime is None:
            return replace(job, image=docker.base_image)  # driver-family cells load no runtime
        return replace(job, image=docker.runtime_image(runtime.entry, runtime.wheel(), self.wheel_dir).tag)

    def _program_expectation(self, cell: Cell, expected: Expected, seen: observe.Observation | None) -> Expected:
        """A cell re-predicted from what its processes really mapped: a command from the runtime
        it used; any cell from the PTX producers it mapped (NVRTC, nvJitLink) against the
        driver's JIT ceiling."""
        if seen is None:
            return expected
        if cell.kind == "command":
            expected = oracle.expect_program(cell, self.host(), expected, runtime_version=seen.runtime.version,
                                             evidence=seen.runtime.evidence, driver_used=seen.driver_mapped)
        if seen.driver_mapped is False:
            return expected
        return oracle.expect_jit(cell, self.host(), expected,
                                 tuple((lib.soname, lib.version) for lib in seen.libraries),
                                 device_code=seen.device_code, arch=self._gpu_arch())

    def _gpu_arch(self) -> int | None:
        """The SM number of the host's first GPU (90 for compute capability 9.0), if known."""
        gpus = self.host_fingerprint().get("gpus")
        first = gpus[0] if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) else {}
        major, _, minor = str(first.get("compute_capability", "")).partition(".")
        return int(major) * 10 + int(minor) if major.isdigit() and minor.isdigit() else None

    def _facts(self, turn: _Turn, seen: observe.Observation | None, child: ChildResult | None = None) -> Facts:
        cell, res = turn.cell, turn.runtime.ok if turn.runtime is not None else None
        return Facts(host=self.host(), host_fingerprint=self.host_fingerprint(), backend=self.backend,
                     host_label=self.host_label, provisioned_runtime=res.version if res else None,
                     provisioned_runtime_file=str(res.libcudart) if res else None, require_gpu=self.require_gpu,
                     shell_wrapped=bool(self.hooks and self.hooks.shell_wrapped(cell)),
                     observed=seen.fingerprint() if seen is not None else {},
                     # a cell observed in part never looks like one observed in full
                     missing_evidence=(*self.missing_evidence(), *self.provisioner.interposer_evidence(cell),
                                       *driverview.emulation_evidence(cell.driver, child.extra if child else None)))

    def run_all(self, cells: Iterable[Cell], on_record: Callable[[CellRun], None]) -> None:
        """Run ``cells`` one after another, handing each finished cell to ``on_record``."""
        todo = list(cells)
        try:
            for i, cell in enumerate(todo):
                on_record(self.run(cell, then=todo[i + 1] if i + 1 < len(todo) else None))
        finally:
            self.cancel_ahead()

    def with_hooks(self, hooks: CellHooks) -> Orchestrator:
        """A copy of this orchestrator that uses ``hooks``."""
        return replace(self, hooks=hooks, _provisioner=None, _auditor=None, _ahead=None)  # the runtimes are shared


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildRun:
    """A harness child run outside a matrix: what it did, its outcome and the judge's verdict."""

    child: ChildResult
    observed: Observed
    status: Status
    mismatch: str | None


def run_child(job: Job, expected: Expected, *, mode: SpawnMode = "cell",
              base_env: dict[str, str] | None = None, policy: SandboxPolicy | None = None) -> ChildRun:
    """Run ``job`` (no cell of a matrix) as a cell's child is run, and judge it against ``expected``.

    The execute stage spawns it (environment allowlist, limits, sandbox policy, timeout,
    containment of its whole tree); ``mode="debugger"`` is a debugger's run, untraced by the
    kernel tracer (its result says so).  :func:`~cumatrix.judge.classify.classify` names its
    outcome and :func:`~cumatrix.judge.verdict.decide_child` decides pass or fail."""
    child = run_local(job, base_env=base_env, mode=mode, policy=policy, cwd=job.cwd or None)
    observed = classify(child, kind=job.kind)
    verdict = decide_child(expected, observed)
    return ChildRun(child=child, observed=verdict.observed, status=verdict.status, mismatch=verdict.mismatch)


def run_debugger(job: Job, *, policy: SandboxPolicy | None = None) -> ChildResult:
    """Run ``job``, whose program is a debugger leading the tree (``repro``'s ``gdb -batch``),
    as a cell's child is run but untraced by the kernel tracer (``mode="debugger"``): the
    result's ``extra["evidence"]`` says its evidence is the debugger's run.  What it shows is
    a report's evidence, not an outcome: nothing judges it."""
    return run_local(job, mode="debugger", policy=policy, cwd=job.cwd or None)


def run_header(matrix: Matrix, cell_ids: list[str], *, backend: str, argv: list[str], host: str | None,
               fingerprint: dict[str, object], run_id: str,
               plan: dict[str, object] | None = None, submission: str | None = None,
               sandbox: str | None = None, selection: dict[str, object] | None = None) -> dict[str, object]:
    """The ``run`` record that opens a run's segment of ``results.jsonl``.

    ``sandbox``: how the run's local cells were held (``bubblewrap``, ``off``, ``none: why``;
    None: not local cells); where that is no mount namespace and the matrix emulates a driver,
    ``driver_emulation`` says that emulation follows the search path only.

    ``plan`` (:meth:`cumatrix.core.planned.PlannedCells.to_json`): every cell the matrix means to
    run and on which host, so that a merge of several hosts' runs can name what none ran.
    ``submission``: the id of the submission of a plan this run is one host of (``cumatrix
    submit``, the Slurm scripts): a merge of that submission takes only runs that carry it.
    ``selection`` (:meth:`cumatrix.core.planned.Selection.to_json`): the covering plan or the
    night of a rotation the run took its cells from (absent: every cell).
    """
    return {"schema": 1, "type": "run", "run_id": run_id, "matrix": matrix.path, "matrix_sha256": matrix.sha256,
            "started": utcnow(), "harness_version": __version__, "argv": argv, "backend": backend, "sandbox": sandbox, "host": host,
            "host_fingerprint": fingerprint, "cells_total": len(cell_ids), "cells": cell_ids,
            **driverview.emulation_header(backend, sandbox, any(d.emulated for d in matrix.drivers)),
            **({"plan": plan} if plan is not None else {}),
            **({"submission": submission} if submission is not None else {}),
            **({"selection": selection} if selection is not None else {}), "pid": os.getpid()}


def end_record(*, interrupted: bool) -> dict[str, object]:
    """The ``end`` record that closes a run's segment."""
    return {"schema": 1, "type": "end", "finished": utcnow(), "interrupted": interrupted}
