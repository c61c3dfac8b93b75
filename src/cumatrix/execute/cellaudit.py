"""The rtld-audit of a cell: what its process tree maps, and the cell's runtime enforced.

The orchestrator hands each provisioned job, with the cell's runtime as the run provisioned it
(:class:`~cumatrix.provision.runtimeset.ProvisionedRuntime`), to :meth:`CellAuditor.audited`, which adds the
audit's variables and mounts and keeps what the cell intended (its runtime, the program's
own environment) to judge the audit's log against after the child ends
(:meth:`Audit.conclude`).  It lives with execution: provisioning says what a cell is, the
audit is how its child is watched.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cumatrix.core.cache import temp_prefix
from cumatrix.core.errors import CumatrixError
from cumatrix.core.jobs import Job
from cumatrix.core.model import Cell
from cumatrix.core.private import replace_new
from cumatrix.core.witness import KernelTrace
from cumatrix.execute import observe, provenance, spawn
from cumatrix.provision.cell import Provisioner
from cumatrix.provision.runtimeset import ProvisionedRuntime

if TYPE_CHECKING:
    from cumatrix.execute.docker import DockerBackend


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



@dataclass
class CellAuditor:
    """Puts the cells of one run under the rtld-audit; holds the run's temporary directory."""

    provisioner: Provisioner
    backend: str = "local"
    docker: DockerBackend | None = None
    _audit_dir: str | None = None
    _container_lib: Path | None = None

    def close(self) -> None:
        """Remove the run's temporary directory (audit logs, the containers' audit library)."""
        if self._audit_dir is not None:
            shutil.rmtree(self._audit_dir, ignore_errors=True)
            self._audit_dir = None
            self._container_lib = None

    def _need_docker(self) -> DockerBackend:
        if self.docker is None:
            raise CumatrixError("the docker backend was not started")
        return self.docker

    @staticmethod
    def runtime_mode(cell: Cell, runtime: ProvisionedRuntime | None) -> observe.RuntimeMode:
        """``offered`` where the cell's runtime or its case says so; else the cell's runtime is enforced."""
        offered = (runtime is not None and runtime.entry.offered) or (cell.case is not None and cell.case.offered)
        return "offered" if offered else "enforced"

    def audited(self, cell: Cell, job: Job, runtime: ProvisionedRuntime | None) -> tuple[Job, Audit | None]:
        """``job`` under the rtld-audit that records what its process tree maps and enforces the
        cell's runtime (``runtime``, as the run provisioned it; None: the cell loads none) over a
        bundled copy of the same soname (issue: programs that carry their own)."""
        cell_rt = self._cell_runtime(runtime)
        mode = self.runtime_mode(cell, runtime)
        if self._audit_dir is None:
            # Removed by close(); `cumatrix clean` removes one a killed run left behind.
            self._audit_dir = tempfile.mkdtemp(prefix=temp_prefix("audit"))
        docker = self.backend == "docker"
        try:
            library = self._container_audit_library() if docker else None
            # A directory of its own per cell (mkdtemp: 0700, a name no other process can
            # predict) in the run's, removed after it: no cell prepares or reads another's log.
            cell_dir = Path(tempfile.mkdtemp(prefix="cell-", dir=self._audit_dir))
            plan = observe.audit_plan(cell_dir / "audit.log", library=library,
                                      enforce=observe.enforce_rules(cell_rt, mode) if cell_rt else ())
        except observe.AuditError:
            return job, None  # no compiler: the cell runs unobserved
        setting = self._provenance_setting(cell, job, cell_rt, runtime)
        job = dataclasses.replace(job, env=job.env + plan.env, mounts=job.mounts + plan.mounts,
                                  writable=job.writable + plan.writable)
        return job, Audit(plan=plan, cell=cell_rt, mode=mode, setting=setting)

    def _provenance_setting(self, cell: Cell, job: Job, cell_rt: observe.CellRuntime | None,
                            runtime: ProvisionedRuntime | None) -> provenance.Setting:
        """What ``cell`` intended its processes to load (before the audit's variables are added).

        A command's own Python environment is the program's distribution (read on this host;
        in a container the paths are the image's, so only the rest applies); a ``site: true``
        runtime's cell runs in the environment of cumatrix itself."""
        local = self.backend != "docker"
        extra = provenance.this_environment() if local and runtime is not None and runtime.entry.site else ()
        argv0 = job.argv[0] if local and cell.kind == "command" and job.argv else None
        return provenance.setting(cell_file=cell_rt.path if cell_rt else None, lib_path=job.lib_path, job_env=job.env,
                                  argv0=argv0, allow=cell.case.allow_runtime if cell.case else (),
                                  extra_package_dirs=extra)

    def _container_audit_library(self) -> Path:
        """The audit library where a container's non-root user can reach it: the cache is often
        under ``/root``, whose 0700 mode in the image hides everything mounted below it.  The
        copy is in a directory of this user's that no one else may write (made anew under a name
        no one can guess where another user took the usual one), so no other local user can put
        a library of theirs where the containers will load it; looked up once per run."""
        if self._container_lib is not None and self._container_lib.is_file():
            return self._container_lib
        built = observe.build_audit_library()
        if self._audit_dir is None:
            self._audit_dir = tempfile.mkdtemp(prefix=temp_prefix("audit"))
        # The run's own temporary directory (removed by close()), opened for traversal only: made
        # by mkdtemp, its name is unguessable and it is ours, so no other user of a shared /tmp
        # can have put a library of theirs where every container would load it.
        Path(self._audit_dir).chmod(0o711)
        shared = Path(self._audit_dir) / f"lib-{built.parent.name}"
        target = shared / built.name
        if not target.is_file():
            shared.mkdir(mode=0o755, exist_ok=True)
            shared.chmod(0o755)  # whatever the umask
            tmp = shared / f".{built.name}.{os.getpid()}"
            with os.fdopen(replace_new(tmp, 0o755), "wb") as dst, built.open("rb") as src:
                shutil.copyfileobj(src, dst)
            tmp.chmod(0o755)
            tmp.replace(target)
        self._container_lib = target
        return target

    def _cell_runtime(self, runtime: ProvisionedRuntime | None) -> observe.CellRuntime | None:
        """The runtime the audit enforces: the resolved library here, the image's copy of the
        wheel's in a container."""
        if runtime is None:
            return None
        if self.backend != "docker":
            res = runtime.need()
            return observe.cell_runtime(res.libcudart, res.version, soname=res.soname)
        version = runtime.known_version()
        if runtime.entry.requirement and version is not None:
            inside = self._need_docker().runtime_image(runtime.entry, runtime.wheel(),
                                                       self.provisioner.settings.wheel_dir).cudart
            if inside:
                return observe.CellRuntime(soname=Path(inside).name, version=version, path=inside)
        return None


def missing_evidence() -> tuple[str, ...]:
    """What this host cannot observe of a local cell (no compiled spawn helper or audit library,
    in the install or buildable), each with what goes missing and how to get it back; empty
    where every cell is observed in full."""
    missing = []
    if spawn.spawn_shim() is None:
        missing.append("trace: the spawn helper (csrc/spawn.c) is neither in this install nor buildable here "
                       "(no C compiler): the kernel's record of what each process mapped, the process-tree "
                       "trace and the cell's containment are missing; install a platform wheel of cumatrix, "
                       "or gcc")
    try:
        observe.build_audit_library()
    except observe.AuditError as e:
        missing.append(f"audit: the rtld-audit library (csrc/audit.c) is neither in this install nor buildable "
                       f"here ({str(e).splitlines()[0]}): what each process loaded, and the cell's runtime "
                       "enforced over a bundled copy, are missing")
    return tuple(missing)
