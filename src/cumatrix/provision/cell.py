"""Stage two: provision a cell.  ``Cell`` (+ its expectation) -> :class:`~cumatrix.core.jobs.Job`.

Puts the cell's runtime in its job (provisioned once per run by
:mod:`~cumatrix.provision.runtimeset`: a wheel unpacked into the cache, an environment, a site
install; an image is the docker backend's), builds the reference variant against the cell's
headers, generates the driver interposer for an emulated driver, and assembles the child's
command line and environment.  A cell that is decided without running (a variant that does
not compile, no driver to run on) comes back as a :class:`~cumatrix.provision.facts.NotRun`
fact instead of a job: the judge names its outcome.  Which container image a job runs in, and the rtld-audit around its
child, are the execute stage's (the orchestrator adds both).

What it provisions is cached on disk by content, so pytest-xdist workers share it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cumatrix.core.cache import default_table
from cumatrix.core.errors import CumatrixError
from cumatrix.core.jobs import Job
from cumatrix.core.model import NO_RUNTIME, Cell, CudaVersion, Matrix
from cumatrix.core.options import DEFAULT_TIMEOUT
from cumatrix.host.fingerprint import SearchLog, search_real_libcuda
from cumatrix.predict.oracle import emulate_newer_reason
from cumatrix.predict.rules import emulation_newer_than_host
from cumatrix.provision import build, drivers, headers, prebuilt_driver
from cumatrix.provision import runtimes as _runtimes
from cumatrix.provision.facts import NotRun
from cumatrix.provision.runtimeset import ProvisionedRuntime, RuntimeSet

#: The directory holding the ``cumatrix`` package: a harness child's ``PYTHONPATH``.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """What a run provisions its cells with."""

    matrix: Matrix
    backend: str = "local"
    wheel_dir: Path | None = None
    timeout: float = DEFAULT_TIMEOUT
    #: Extra environment every harness child gets (``repro`` asks swap children to list
    #: the libraries they mapped).
    child_env: tuple[tuple[str, str], ...] = ()


@dataclass
class Provisioner:
    """Turns cells of one matrix into jobs; holds what it resolved for the run."""

    settings: Settings
    host_driver: int | None = None
    #: The run's runtimes, each provisioned once (None: its own, made from the settings); the
    #: orchestrator shares one among its copies, so that the gate's hooks see the same.
    runtime_set: RuntimeSet | None = None
    _interposers: dict[str, drivers.Interposer] = field(default_factory=dict)
    #: The ``include/`` serving each header version (``builds:``), found once for the run.
    _headers: dict[str, Path] = field(default_factory=dict)
    #: Per emulated driver made from the prebuilt interposer: the real driver's exports it lacks.
    _interposer_missing: dict[str, tuple[str, ...]] = field(default_factory=dict)

    # ----------------------------------------------------------------- runtimes

    @property
    def runtimes(self) -> RuntimeSet:
        """The run's runtimes, each provisioned once."""
        if self.runtime_set is None:
            self.runtime_set = RuntimeSet(matrix=self.settings.matrix, wheel_dir=self.settings.wheel_dir)
        return self.runtime_set

    def runtime(self, name: str) -> _runtimes.ResolvedRuntime:
        """The resolved runtime ``name`` (resolved once; a failure is remembered)."""
        return self.runtimes.provisioned(name).need()

    def resolved(self, name: str) -> _runtimes.ResolvedRuntime | None:
        """The runtime ``name`` if it was resolved without error, else ``None``."""
        return self.runtimes.resolved(name)

    def headers(self, version: str | CudaVersion) -> Path:
        """The ``include/`` of the runtime wheel serving headers ``version`` (a runtime of the
        matrix with that major.minor, else the known wheel), found once for the run: every swap
        cell of that version builds against it."""
        key = str(version)
        if key not in self._headers:
            self._headers[key] = _runtimes.headers_for(version, wheel_dir=self.settings.wheel_dir,
                                                       runtimes=self.settings.matrix.runtimes)
        return self._headers[key]

    def runtime_version(self, cell: Cell) -> int | None:
        """``cudaRuntimeGetVersion`` of the cell's runtime, as far as it is known before the run."""
        got = self.runtimes.for_cell(cell)
        return got.known_version() if got is not None else None

    def interposer_dir(self, cell: Cell) -> str | None:
        """Directory of the generated ``libcuda.so.1`` for an emulated driver."""
        if not cell.driver.startswith("emulated-"):
            return None
        if cell.driver not in self._interposers:
            self._interposers[cell.driver] = self._build_interposer(cell.driver)
        return str(self._interposers[cell.driver].lib_dir)

    def interposer_evidence(self, cell: Cell) -> tuple[str, ...]:
        """What the cell's emulated driver lacks, in the words of missing evidence (empty where
        it exports all the real driver keeps at its version: compiled here, or a prebuilt that
        carries every name)."""
        missing = self._interposer_missing.get(cell.driver, ())
        if not missing:
            return ()
        why = (f"interposer: {cell.driver} was made from the prebuilt interposer (no C compiler here), which "
               f"does not carry {len(missing)} export(s) of the real driver: {', '.join(missing)}; a program "
               "that links one fails to load under it; install gcc to compile the interposer on this host")
        return (why,)

    def has_interposer(self, driver: str) -> bool:
        """Whether the interposer of emulated driver ``driver`` is built already."""
        return driver in self._interposers

    def _build_interposer(self, driver: str) -> drivers.Interposer:
        emu = self.settings.matrix.driver(driver).emulated
        if emu is None:
            raise CumatrixError(f"{driver} is not an emulated driver")
        log = SearchLog()
        hit = search_real_libcuda(log)
        if hit is None:
            raise CumatrixError(f"no real driver to put an interposer in front of: {log.not_found('libcuda.so.1')}")
        real = hit.path
        if self.host_driver is None:
            raise CumatrixError("driver emulation needs a real driver underneath")
        found = [self.runtime(r.name).include_dir for r in self.settings.matrix.runtimes if r.requirement]
        includes = [i for i in found if i is not None] or [_runtimes.headers_for("13.5", wheel_dir=self.settings.wheel_dir)]
        intro = headers.load_introductions(headers.newest_typedefs(includes))
        ip = drivers.build_interposer(emu, real_libcuda=real, introductions=intro,
                                      real_driver_version=self.host_driver)
        self._interposer_missing[driver] = ip.missing
        return ip

    # ----------------------------------------------------------------- jobs

    def prepare(self, cell: Cell, runtime: ProvisionedRuntime | None = None) -> Job | NotRun:
        """The job that runs ``cell``, or the fact that decides it without running.

        ``runtime``: the cell's runtime as the run provisioned it (the orchestrator's, handed
        on); None: looked up here, where the job needs it."""
        early = self._decided_early(cell)
        if early is not None:
            return early
        return self.job(cell, runtime)

    def _decided_early(self, cell: Cell) -> NotRun | None:
        early = self.stopped_before_child(cell)
        if early is not None and early.why == "no-driver" and cell.kind == "swap":
            # Building needs no GPU: a variant that does not compile says so on any host.
            spec = self.swap_spec(cell, None)
            if isinstance(spec, NotRun) and spec.why == "build-failed":
                return spec
        return early

    def stopped_before_child(self, cell: Cell) -> NotRun | None:
        """What stops ``cell`` before a child of it runs, decided from the host and the matrix
        alone (nothing is built): the run's first line counts the cells it will skip with this,
        and :meth:`prepare` decides them with it (a swap variant that does not compile is then a
        build-error rather than a skip, on any host)."""
        rt = self.settings.matrix.runtime(cell.runtime) if cell.runtime != NO_RUNTIME else None
        if rt is not None and rt.image and self.settings.backend != "docker":
            return NotRun(why="needs-docker", detail=f"runtime {rt.name} is the image {rt.image}; run with --backend docker")
        if cell.kind == "swap":
            swap = self._swap_decided()
            if swap is not None:
                return swap
        if cell.driver.startswith("emulated-"):
            return self._emulation_decided(cell)
        return None

    def _swap_decided(self) -> NotRun | None:
        """A swap cell decided before any child: no compiler for its variants, or no driver."""
        if not _has_gcc(os.environ.get("PATH", "")):
            # A platform wheel carries the observation's compiled parts, not the reference
            # variants: they are built per header version of the matrix, here (docs/install.md).
            return NotRun(why="no-compiler", detail="the reference variants are compiled with gcc at run time and "
                          "there is no gcc on PATH: install gcc (apt-get install gcc)")
        if self.host_driver is None:
            return NotRun(why="no-driver", detail="no NVIDIA driver on this host")
        return None

    def _emulation_decided(self, cell: Cell) -> NotRun | None:
        """A cell on an emulated driver decided before any child: nothing to emulate over, a
        driver newer than the host's, or no way to make its interposer."""
        if self.host_driver is None:
            return NotRun(why="no-driver", detail="driver emulation needs a real driver underneath")
        version = int(CudaVersion.parse(cell.driver[len("emulated-"):]))
        if emulation_newer_than_host(version, self.host_driver):
            return NotRun(why="emulation-impossible", detail=emulate_newer_reason(version, self.host_driver))
        if (not self.has_interposer(cell.driver) and not _has_gcc(os.environ.get("PATH", ""))
                and prebuilt_driver.prebuilt_interposer() is None):
            return NotRun(why="no-compiler", detail=f"the interposer of {cell.driver} is generated and compiled "
                          "with gcc at run time, there is no gcc on PATH and no prebuilt interposer in this "
                          "install: install gcc (apt-get install gcc), or a platform wheel of cumatrix")
        return None

    def job(self, cell: Cell, runtime: ProvisionedRuntime | None = None) -> Job | NotRun:
        """The child's command line, environment and mounts for ``cell`` (``runtime``: as for
        :meth:`prepare`)."""
        parts = _JobParts(env=[("CUMATRIX_CELL", cell.id)])
        self._add_interposer(cell, parts)
        if cell.runtime != NO_RUNTIME and self.settings.backend != "docker":  # a container's runtime is its image's
            parts.add_runtime((runtime or self.runtimes.provisioned(cell.runtime)).need())
        if cell.kind == "command":
            case = cell.need_case()
            return Job(cell_id=cell.id, kind=cell.kind, argv=case.argv, env=(*parts.env, *case.env),
                       harness_python=case.harness_python, cwd=case.cwd or "",
                       lib_path=tuple(parts.lib_path), timeout=case.timeout or self.settings.timeout,
                       mounts=tuple(parts.mounts), runtime_name=cell.runtime, interposer=parts.interposer,
                       real_driver=parts.real_driver)
        return self._harness_job(cell, parts)

    def _add_interposer(self, cell: Cell, parts: _JobParts) -> None:
        """An emulated driver's interposer first on the cell's library path (built once)."""
        ip = self.interposer_dir(cell)
        if ip:
            parts.lib_path.append(ip)
            parts.mounts.append(ip)
            built = self._interposers[cell.driver]
            parts.interposer, parts.real_driver = str(built.library), str(built.real_libcuda)

    def _harness_job(self, cell: Cell, parts: _JobParts) -> Job | NotRun:
        """A harness child's job (probe, swap): it alone gets the harness's package on its path,
        and the verdict channel."""
        python = "python3" if self.settings.backend == "docker" else sys.executable
        env, mounts = parts.env, parts.mounts
        env += [("PYTHONPATH", PACKAGE_PARENT), *self.settings.child_env]
        mounts.append(PACKAGE_PARENT)
        if cell.kind == "probe":
            spec: dict[str, object] = {"kind": "probe", "libcudart": parts.libcudart}
        else:
            got = self.swap_spec(cell, parts.libcudart)
            if isinstance(got, NotRun):
                return got
            spec = got
            mounts += [str(spec["library"]), str(spec["baseline"])]
            env += self._swap_env(cell, mounts)
        return Job(cell_id=cell.id, kind=cell.kind, argv=(python, "-m", "cumatrix.child.case", json.dumps(spec)),
                   env=tuple(env), lib_path=tuple(parts.lib_path), timeout=self.settings.timeout, mounts=tuple(mounts),
                   runtime_name=cell.runtime, reports_verdict=True, interposer=parts.interposer,
                   real_driver=parts.real_driver)

    # ----------------------------------------------------------------- swap cells

    def _swap_env(self, cell: Cell, mounts: list[str]) -> list[tuple[str, str]]:
        env: list[tuple[str, str]] = []
        if cell.need_workload().kernel_image == "ptx":
            env.append(("KVSWAP_KERNEL_IMAGE", "ptx"))
        table = default_table()
        if "KVSWAP_CALIBRATION" not in os.environ and table.is_file():
            env.append(("KVSWAP_CALIBRATION", str(table)))  # what `cumatrix calibrate` measured here
            mounts.append(str(table))
        return env

    def swap_spec(self, cell: Cell, libcudart: str | None) -> dict[str, object] | NotRun:
        """The swap child's spec, building the variant and its loop baseline first."""
        w, b = cell.need_workload(), cell.need_build()
        if not (cell.variant and cell.family):
            raise CumatrixError(f"swap cell {cell.id} has no variant or family")
        headers = self.headers(b)
        lib = build.build_variant(cell.variant, cell.family, headers)
        if not lib.ok:
            return NotRun(why="build-failed", detail=lib.log.strip()[-2000:])
        base = build.build_variant("loop", cell.family, headers)
        if not base.ok:
            return NotRun(why="harness-failed", detail=f"the loop baseline did not build: {base.log[-500:]}")
        spec: dict[str, object] = {
            "kind": "swap", "family": cell.family, "variant": cell.variant, "library": str(lib.library),
            "baseline": str(base.library), "libcudart": libcudart, "direction": w.direction,
            "block_bytes": w.block_bytes, "blocks": w.blocks, "layers": w.layers, "stream": w.stream,
            "repetitions": w.repetitions, "warmup": w.warmup}
        if cell.variant == "proc-address":  # the only variant with a path policy
            spec["policy"] = w.policy
        return spec


@dataclass(slots=True)
class _JobParts:
    """What a cell's job is assembled from, gathered step by step (interposer, runtime, kind)."""

    env: list[tuple[str, str]]
    lib_path: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    interposer: str = ""
    real_driver: str = ""
    libcudart: str | None = None

    def add_runtime(self, res: _runtimes.ResolvedRuntime) -> None:
        """The cell's runtime: its directory on the library path, its library named to the child."""
        self.lib_path.append(str(res.lib_dir))
        self.libcudart = str(res.libcudart)
        self.env.append(("CUMATRIX_CUDART", self.libcudart))
        self.env += list(res.cell_env())  # an environment runtime: the cell runs inside its venv


@functools.lru_cache(maxsize=8)
def _has_gcc(path: str) -> bool:
    """Whether ``gcc`` is on ``path`` (asked per cell; the answer only changes with PATH)."""
    return shutil.which("gcc", path=path) is not None

