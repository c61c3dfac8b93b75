"""Stage two: provision a cell.  ``Cell`` (+ its expectation) -> :class:`~cumatrix.core.jobs.Job`.

Resolves the cell's runtime (a wheel unpacked into the cache, a site install, an image),
builds the reference variant against the cell's headers, generates the driver interposer
for an emulated driver, and assembles the child's command line and environment.  A cell
that is decided without running (a variant that does not compile, no driver to run on)
comes back as an :class:`~cumatrix.core.model.Observed` instead of a job.

What it provisions is cached on disk by content, so pytest-xdist workers share it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from cumatrix.core.options import DEFAULT_TIMEOUT
from cumatrix.core.cache import default_table, temp_prefix
from cumatrix.core.errors import CumatrixError
from cumatrix.core.jobs import Job
from cumatrix.core.private import replace_new
from cumatrix.core.model import NO_RUNTIME, Cell, Expected, Matrix, Observed
from cumatrix.core.witness import KernelTrace
from cumatrix.execute import observe, provenance
from cumatrix.provision import runtimes as _runtimes

if TYPE_CHECKING:
    from cumatrix.execute.docker import DockerBackend

#: The directory holding the ``cumatrix`` package: a harness child's ``PYTHONPATH``.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True, kw_only=True, slots=True)
class Audit:
    """A job's rtld-audit: its log, the cell's own runtime, and whether it was enforced."""

    plan: observe.AuditPlan
    cell: observe.CellRuntime | None
    mode: observe.RuntimeMode
    #: What the cell intended (its search path, the program's environment, allowed host
    #: runtimes): where each mapped library came from is judged against it.
    setting: provenance.Setting | None = None

    def conclude(self, trace: KernelTrace | None = None, *,
                 intros: Callable[[], Mapping[str, int]] | None = None) -> observe.Observation:
        """What the cell's processes mapped: the kernel's record (``trace``) where the tree was
        traced, the audit log adding detail only to what the kernel saw; the audit log alone
        (named as such) where it was not.  ``intros`` dates a static runtime found in a mapped
        file.  The cell's private directory is removed."""
        try:
            return observe.conclude(self.plan, self.cell, mode=self.mode, setting=self.setting, trace=trace,
                                    intros=intros)
        finally:
            self.discard()

    def discard(self) -> None:
        """Remove the cell's private audit directory (and its log)."""
        shutil.rmtree(self.plan.log.parent, ignore_errors=True)


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
    docker: DockerBackend | None = None
    _resolved: dict[str, _runtimes.ResolvedRuntime | CumatrixError] = field(default_factory=dict)
    _interposers: dict[str, str] = field(default_factory=dict)
    _audit_dir: str | None = None
    _container_lib: Path | None = None

    def close(self) -> None:
        """Remove the run's temporary directory (audit logs, the containers' audit library)."""
        if self._audit_dir is not None:
            shutil.rmtree(self._audit_dir, ignore_errors=True)
            self._audit_dir = None
            self._container_lib = None

    # ----------------------------------------------------------------- runtimes

    def runtime(self, name: str) -> _runtimes.ResolvedRuntime:
        """The resolved runtime ``name`` (resolved once; a failure is remembered)."""
        if name not in self._resolved:
            try:
                self._resolved[name] = _runtimes.resolve(self.settings.matrix.runtime(name), wheel_dir=self.settings.wheel_dir)
            except CumatrixError as e:
                self._resolved[name] = e
        got = self._resolved[name]
        if isinstance(got, CumatrixError):
            raise got
        return got

    def resolved(self, name: str) -> _runtimes.ResolvedRuntime | None:
        """The runtime ``name`` if it was resolved without error, else ``None``."""
        got = self._resolved.get(name)
        return got if isinstance(got, _runtimes.ResolvedRuntime) else None

    def runtime_version(self, cell: Cell) -> int | None:
        """``cudaRuntimeGetVersion`` of the cell's runtime, as far as it is known before the run."""
        if cell.runtime == NO_RUNTIME:
            return None
        rt = self.settings.matrix.runtime(cell.runtime)
        if rt.image:
            from cumatrix.predict.oracle import image_runtime_version

            return image_runtime_version(rt.image)
        return self.runtime(cell.runtime).version

    def interposer_dir(self, cell: Cell) -> str | None:
        """Directory of the generated ``libcuda.so.1`` for an emulated driver."""
        if not cell.driver.startswith("emulated-"):
            return None
        if cell.driver not in self._interposers:
            self._interposers[cell.driver] = self._build_interposer(cell.driver)
        return self._interposers[cell.driver]

    def has_interposer(self, driver: str) -> bool:
        """Whether the interposer of emulated driver ``driver`` is built already."""
        return driver in self._interposers

    def _build_interposer(self, driver: str) -> str:
        from cumatrix.provision import drivers
        from cumatrix.provision import headers
        from cumatrix.host.fingerprint import SearchLog, search_real_libcuda

        emu = self.settings.matrix.driver(driver).emulated
        if emu is None:
            raise CumatrixError(f"{driver} is not an emulated driver")
        log = SearchLog()
        hit = search_real_libcuda(log)
        if hit is None:
            raise CumatrixError(f"no real driver to put an interposer in front of: {log.not_found('libcuda.so.1')}")
        real = hit.path
        found = [self.runtime(r.name).include_dir for r in self.settings.matrix.runtimes if r.requirement]
        includes = [i for i in found if i is not None] or [_runtimes.headers_for("13.5", wheel_dir=self.settings.wheel_dir)]
        intro = headers.load_introductions(headers.newest_typedefs(includes))
        ip = drivers.build_interposer(emu, real_libcuda=real, introductions=intro,
                                      real_driver_version=self.host_driver)
        return str(ip.lib_dir)

    # ----------------------------------------------------------------- jobs

    def prepare(self, cell: Cell, expected: Expected) -> Job | Observed:
        """The job that runs ``cell``, or the outcome of a cell decided without running."""
        early = self._decided_early(cell, expected)
        if early is not None:
            return early
        return self.job(cell)

    def _decided_early(self, cell: Cell, expected: Expected) -> Observed | None:
        rt = self.settings.matrix.runtime(cell.runtime) if cell.runtime != NO_RUNTIME else None
        if rt is not None and rt.image and self.settings.backend != "docker":
            return Observed(outcome="skipped:needs-docker",
                            detail=f"runtime {rt.name} is the image {rt.image}; run with --backend docker")
        if cell.kind == "swap" and self.host_driver is None:
            # Building needs no GPU: a variant that does not compile says so on any host.
            spec = self.swap_spec(cell, None)
            if isinstance(spec, Observed) and spec.outcome == "build-error":
                return spec
            return Observed(outcome="skipped:no-cuda-driver", detail="no NVIDIA driver on this host")
        if cell.driver.startswith("emulated-") and self.host_driver is None:
            return Observed(outcome="skipped:no-cuda-driver", detail="driver emulation needs a real driver underneath")
        if expected.rule == "emulate-newer":
            return Observed(outcome="harness-error", detail=expected.reason)
        return None

    def job(self, cell: Cell) -> Job | Observed:
        """The child's command line, environment and mounts for ``cell``."""
        env: list[tuple[str, str]] = [("CUMATRIX_CELL", cell.id)]
        lib_path: list[str] = []
        mounts: list[str] = []
        image: str | None = None
        libcudart: str | None = None
        ip = self.interposer_dir(cell)
        if ip:
            lib_path.append(ip)
            mounts.append(ip)
        if cell.runtime != NO_RUNTIME:
            rt = self.settings.matrix.runtime(cell.runtime)
            if self.settings.backend == "docker":
                image = self._docker().prepare_runtime(rt, self.settings.wheel_dir).tag
            else:
                res = self.runtime(cell.runtime)
                lib_path.append(str(res.lib_dir))
                libcudart = str(res.libcudart)
                env.append(("CUMATRIX_CUDART", libcudart))
                env += list(res.cell_env())  # an environment runtime: the cell runs inside its venv
        elif self.settings.backend == "docker":
            image = self._docker().base_image  # driver-family cells load no runtime
        if cell.kind == "command":
            case = cell.need_case()
            return Job(cell_id=cell.id, kind=cell.kind, argv=case.argv, env=(*env, *case.env),
                       harness_python=case.harness_python,
                       lib_path=tuple(lib_path), timeout=case.timeout or self.settings.timeout, mounts=tuple(mounts),
                       runtime_name=cell.runtime, image=image)
        # A harness child: it alone gets the harness's package on its path, and the verdict channel.
        python = "python3" if self.settings.backend == "docker" else sys.executable
        env += [("PYTHONPATH", PACKAGE_PARENT), *self.settings.child_env]
        mounts.append(PACKAGE_PARENT)
        if cell.kind == "probe":
            spec: dict[str, object] = {"kind": "probe", "libcudart": libcudart}
        else:
            got = self.swap_spec(cell, libcudart)
            if isinstance(got, Observed):
                return got
            spec = got
            mounts += [str(spec["library"]), str(spec["baseline"])]
            env += self._swap_env(cell, mounts)
        return Job(cell_id=cell.id, kind=cell.kind, argv=(python, "-m", "cumatrix.child.case", json.dumps(spec)),
                   env=tuple(env), lib_path=tuple(lib_path), timeout=self.settings.timeout, mounts=tuple(mounts),
                   runtime_name=cell.runtime, image=image, reports_verdict=True)

    # ----------------------------------------------------------------- the runtime axis

    def runtime_mode(self, cell: Cell) -> observe.RuntimeMode:
        """``offered`` where the runtime or the case says so; else the cell's runtime is enforced."""
        rt = self.settings.matrix.runtime(cell.runtime) if cell.runtime != NO_RUNTIME else None
        offered = (rt is not None and rt.offered) or (cell.case is not None and cell.case.offered)
        return "offered" if offered else "enforced"

    def audited(self, cell: Cell, job: Job) -> tuple[Job, Audit | None]:
        """``job`` under the rtld-audit that records what its process tree maps and enforces the
        cell's runtime over a bundled copy of the same soname (issue: programs that carry their own)."""
        cell_rt = self._cell_runtime(cell)
        mode = self.runtime_mode(cell)
        if self._audit_dir is None:
            # Removed by close(); `cumatrix clean` removes one a killed run left behind.
            self._audit_dir = tempfile.mkdtemp(prefix=temp_prefix("audit"))
        docker = self.settings.backend == "docker"
        try:
            library = self._container_audit_library() if docker else None
            # A directory of its own per cell (mkdtemp: 0700, a name no other process can
            # predict) in the run's, removed after it: no cell prepares or reads another's log.
            cell_dir = Path(tempfile.mkdtemp(prefix="cell-", dir=self._audit_dir))
            plan = observe.audit_plan(cell_dir / "audit.log", library=library,
                                      enforce=observe.enforce_rules(cell_rt, mode) if cell_rt else ())
        except observe.AuditError:
            return job, None  # no compiler: the cell runs unobserved
        setting = self._provenance_setting(cell, job, cell_rt)
        job = dataclasses.replace(job, env=job.env + plan.env, mounts=job.mounts + plan.mounts,
                                  writable=job.writable + plan.writable)
        return job, Audit(plan=plan, cell=cell_rt, mode=mode, setting=setting)

    def _provenance_setting(self, cell: Cell, job: Job, cell_rt: observe.CellRuntime | None) -> provenance.Setting:
        """What ``cell`` intended its processes to load (before the audit's variables are added).

        A command's own Python environment is the program's distribution (read on this host;
        in a container the paths are the image's, so only the rest applies); a ``site: true``
        runtime's cell runs in the environment of cumatrix itself."""
        rt = self.settings.matrix.runtime(cell.runtime) if cell.runtime != NO_RUNTIME else None
        local = self.settings.backend != "docker"
        extra = provenance.this_environment() if local and rt is not None and rt.site else ()
        argv0 = job.argv[0] if local and cell.kind == "command" and job.argv else None
        return provenance.setting(cell_file=cell_rt.path if cell_rt else None, lib_path=job.lib_path, job_env=job.env,
                                  argv0=argv0, allow=cell.case.allow_runtime if cell.case else (),
                                  extra_package_dirs=extra)

    def _container_audit_library(self) -> Path:
        """The audit library where a container's non-root user can reach it: the cache is often
        under ``/root``, whose 0700 mode in the image hides everything mounted below it.  The
        copy is in a directory of this user's that no one else may write (made anew under a name
        no one can guess where another user took the usual one), so no other local user can put
        a library of theirs where the containers will load it; looked up once per provisioner."""
        if self._container_lib is not None and self._container_lib.is_file():
            return self._container_lib
        built = observe.build_audit_library()
        if self._audit_dir is None:
            self._audit_dir = tempfile.mkdtemp(prefix=temp_prefix("audit"))
        # The run's own temporary directory (removed by close()), opened for traversal only: made
        # by mkdtemp, its name is unguessable and it is ours, so no other user of a shared /tmp
        # can have put a library of theirs where every container would load it.
        os.chmod(self._audit_dir, 0o711)
        shared = Path(self._audit_dir) / f"lib-{built.parent.name}"
        target = shared / built.name
        if not target.is_file():
            shared.mkdir(mode=0o755, exist_ok=True)
            shared.chmod(0o755)  # whatever the umask
            tmp = shared / f".{built.name}.{os.getpid()}"
            with open(replace_new(tmp, 0o755), "wb") as dst, open(built, "rb") as src:
                shutil.copyfileobj(src, dst)
            tmp.chmod(0o755)
            tmp.replace(target)
        self._container_lib = target
        return target

    def _cell_runtime(self, cell: Cell) -> observe.CellRuntime | None:
        if cell.runtime == NO_RUNTIME:
            return None
        rt = self.settings.matrix.runtime(cell.runtime)
        if self.settings.backend != "docker":
            res = self.runtime(cell.runtime)
            return observe.cell_runtime(res.libcudart, res.version, soname=res.soname)
        version = self.runtime_version(cell)
        if rt.requirement and version is not None:
            inside = self._docker().prepare_runtime(rt, self.settings.wheel_dir).cudart
            if inside:
                return observe.CellRuntime(soname=os.path.basename(inside), version=version, path=inside)
        return None

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

    def swap_spec(self, cell: Cell, libcudart: str | None) -> dict[str, object] | Observed:
        """The swap child's spec, building the variant and its loop baseline first."""
        from cumatrix.provision import build

        w, b = cell.need_workload(), cell.need_build()
        if not (cell.variant and cell.family):
            raise CumatrixError(f"swap cell {cell.id} has no variant or family")
        headers = _runtimes.headers_for(b, wheel_dir=self.settings.wheel_dir, runtimes=self.settings.matrix.runtimes)
        lib = build.build_variant(cell.variant, cell.family, headers)
        if not lib.ok:
            return Observed(outcome="build-error", detail=lib.log.strip()[-2000:])
        base = build.build_variant("loop", cell.family, headers)
        if not base.ok:
            return Observed(outcome="harness-error", detail=f"the loop baseline did not build: {base.log[-500:]}")
        spec: dict[str, object] = {
            "kind": "swap", "family": cell.family, "variant": cell.variant, "library": str(lib.library),
            "baseline": str(base.library), "libcudart": libcudart, "direction": w.direction,
            "block_bytes": w.block_bytes, "blocks": w.blocks, "layers": w.layers, "stream": w.stream,
            "repetitions": w.repetitions, "warmup": w.warmup}
        if cell.variant == "proc-address":  # the only variant with a path policy
            spec["policy"] = w.policy
        return spec

    def _docker(self) -> DockerBackend:
        if self.docker is None:
            raise CumatrixError("the docker backend was not started")
        return self.docker
