"""What must hold before any cell of ``cumatrix run`` runs, and what the run says first:
--out free and writable, the sandbox a run requires, the daemon, every runtime resolved,
and which cells this host will not test (no driver, no gcc, evidence missing)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

from cumatrix.core.cache import cache_root
from cumatrix.core.errors import ConfigError, EnvironmentProblem
from cumatrix.core.options import DEFAULT_OUT, RunOptions, SandboxPolicy
from cumatrix.load import matrix as _matrix


def preflight(opts: RunOptions, m: Any, mpath: Path, *, quiet: bool) -> None:
    """What must hold before any cell runs: --out is free and writable (exit 2 / 3), the daemon
    answers, every runtime resolves (a requirement that does not resolve is bad input, exit 2,
    found once rather than per cell)."""
    # deferred: the results store costs ~40 ms, which --help and validate do without
    from cumatrix.results.store import Store

    cache_root()  # this user's alone, or exit 3 before anything from it runs
    # deferred: the record key's module, with the results store below
    from cumatrix.results.recordkey import record_key

    record_key()  # every record is sealed with it: a state directory that cannot hold it is exit 3 here
    if opts.backend == "local":
        _require_sandbox(opts.for_matrix(m.sandbox))
    with Store.open(opts.out or Path(DEFAULT_OUT), fresh=False):
        pass
    _say_missing_evidence()
    _check_compiler(m)
    if opts.backend == "docker":
        # deferred: the docker SDK costs ~80 ms and ~200 modules; only the docker backend needs it
        from cumatrix.execute.docker import DockerBackend

        with DockerBackend(opts.base_image) as be:  # the daemon must answer before any cell runs
            if be.base_image_problem() is not None:
                raise EnvironmentProblem(str(be.base_image_problem()))
    # deferred: the orchestrator costs ~215 ms and ~190 modules, which --help and validate do without
    from cumatrix.orchestrate import Orchestrator

    # Both backends say the same first lines: what will not be tested here, then each runtime.
    policy = opts.for_matrix(m.sandbox)
    with Orchestrator(matrix=m, backend=opts.backend, wheel_dir=opts.wheel_dir, policy=policy) as orch:
        _say_untested(m, orch, require_gpu=opts.require_gpu, selection=opts.selection)
        _preflight_local(m, mpath, orch, quiet=quiet)


def _require_sandbox(policy: SandboxPolicy) -> None:
    """``--require-sandbox`` (or ``--sandbox``, ``sandbox: on``): a host that cannot sandbox runs
    nothing (exit 3), rather than every cell failing the same way."""
    if policy.sandbox != "on":
        return
    # deferred: the sandbox module is the execute stage's; only a run that requires it checks here
    from cumatrix.execute import sandbox

    held, _line = sandbox.describe(policy)
    if held not in sandbox.SANDBOXED:
        why = held.removeprefix("none: ")
        raise EnvironmentProblem(f"--require-sandbox: this host cannot sandbox cells: {why}; "
                                 f"fix: {sandbox.fix_for(why)}")


def _say_untested(m: Any, orch: Any, *, require_gpu: bool, selection: Any = None) -> None:
    """The run's first line, on a host without a CUDA driver: how many cells will be skipped,
    not tested, and how to test them.  The headline at the end counts them again; a reader who
    stops at the first line must not take the cells that follow for a GPU run."""
    if orch.host().driver_version is not None:
        return
    # deferred: the prediction rules cost ~20 ms, which --help and validate do without
    from cumatrix.predict.oracle import expect

    every = _matrix.cells(m)
    if selection is not None and not selection.full:  # of the cells the covering plan takes
        # deferred: the covering plans, only for a run that asks for one
        from cumatrix.front.cover import choose

        every = choose(m, every, selection)
    gpu = 0
    for c in every:
        # What the run will do with the cell, decided as the run decides it: a cell stopped before
        # its child for another reason (no gcc, an image runtime under --backend local) is counted
        # there, not here; the rest need a driver where the run's own decision (an emulated
        # driver, a swap) or the prediction (a probe) says so.  The headline counts the same cells.
        early = orch.provisioner.stopped_before_child(c)
        predicted = expect(c, orch.host(), runtime_version=None)
        if early is not None:
            # A variant predicted not to compile is built first and is a build-error on any host.
            gpu += early.why == "no-driver" and set(predicted.outcomes) != {"build-error"}
        elif predicted.rule == "no-driver":
            gpu += 1
    if gpu:
        what = "each is an error (--require-gpu)" if require_gpu else "run on a GPU host to test them"
        print(f"cumatrix: no CUDA driver on this host: {gpu} of {len(every)} cells need a GPU and will be "
              f"skipped, NOT tested; {what}", file=sys.stderr, flush=True)


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


def _say_missing_evidence() -> None:
    """First, before any cell: what no cell of this run will be observed by (every record names
    it too), so that a run without its compiled parts never passes as if observed in full."""
    # deferred: the audit's module costs the provisioner's imports, which --help and validate do without
    from cumatrix.execute.cellaudit import missing_evidence

    for m in missing_evidence():
        print(f"cumatrix: WARNING: evidence missing on this host: {m}", file=sys.stderr)


def _check_compiler(m: Any) -> None:
    """Swap cells (compiled variants) and emulated drivers (a generated libcuda, where the install
    carries no prebuilt one) need gcc: without it their cells are skipped:no-compiler, and the
    run says so first; the rest runs."""
    emulated = any(d.emulated for d in m.drivers)
    if emulated and shutil.which("gcc") is None:
        # Here, not at the top: only a matrix with emulated drivers pays for the ELF reader it loads.
        from cumatrix.provision.prebuilt_driver import prebuilt_interposer

        emulated = prebuilt_interposer() is None
        if not emulated:
            print(f"cumatrix: NOTE: {m.path}: no gcc on PATH: the emulated drivers are made from the prebuilt "
                  "interposer of this install; an entry point of the real driver it lacks is named on every "
                  "record of a cell under it (fingerprint.missing_evidence)", file=sys.stderr)
    needs = [what for what, used in (("the reference variants", bool(m.variants and m.workloads)),
                                     ("emulated drivers", emulated)) if used]
    if needs and shutil.which("gcc") is None:
        print(f"cumatrix: WARNING: {m.path}: {' and '.join(needs)} are compiled with gcc at run time, and there "
              "is no gcc on PATH: their cells are skipped:no-compiler (install gcc: apt-get install gcc)",
              file=sys.stderr)
