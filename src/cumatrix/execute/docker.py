"""The docker backend: one container per cell, through the ``docker`` Python SDK.

What a cell's container gets (cibuildwheel's ``oci_container.py`` is the model: unique
names, removed in ``finally``, an env var to keep them, the daemon checked up front):

- ``init=True``: PID 1 is docker-init, so a signal that kills the child is reported as
  exit status 128+N, mapped back here to ``signal=N`` (a segfault reads ``crash:SIGSEGV``);
- ``network_mode="none"``, CPU, memory and pids limits, and a timeout that kills the container;
- a non-root user (the invoking user's uid, or ``nobody`` when that is root), every
  capability dropped, ``no-new-privileges``, a read-only root filesystem and a tmpfs ``/tmp``;
- removal when the harness dies, even by SIGKILL: the per-process watcher of
  :mod:`cumatrix.execute.sandbox` removes the containers its harness left;
- every host path the job reads (and the directory holding the ``cumatrix`` package, for
  ``PYTHONPATH``) bind-mounted read-only at the same path;
- the label ``cumatrix=1`` and the owning process, so that :meth:`DockerBackend.cleanup_stale`
  removes what a killed run left behind without touching a live run's containers;
- the spawn helper as the entry, tracing the cell's tree (:mod:`cumatrix.execute.docker_trace`);
- the GPU, when the host has one: ``--gpus all`` through the NVIDIA container runtime, or
  else the device nodes and the driver's user-mode libraries passed explicitly.

Runtime images come from ``containers/runtime.Dockerfile``: a base image plus one runtime
wheel, built with no network; the tag is a hash of the inputs, so unchanged inputs never
rebuild.  ``image:`` runtimes are used as they are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import docker
import docker.errors
import docker.types
import requests.exceptions

from cumatrix.core.cache import temp_prefix
from cumatrix.core.errors import CumatrixError, DaemonUnavailable
from cumatrix.core.jobs import ChildResult, Job
from cumatrix.core.model import Runtime
from cumatrix.execute import docker_results as results
from cumatrix.execute import docker_trace, driverview, sandbox
from cumatrix.execute.docker_cell import NOBODY, cell_environment, cell_mounts
from cumatrix.execute.docker_gpu import DRIVER_LIB_DIR, GpuAccess, detect_gpu, driver_libraries
from cumatrix.execute.docker_images import (
    BASE_LABEL,
    RUNTIME_LABEL,
    ImageBuildError,
    ImageInfo,
    cudart_in_wheel,
    find_base_image,
    listed,
    package_root,
    runtime_dockerfile,
)
from cumatrix.execute.docker_images import dockerfile as find_dockerfile
from cumatrix.execute.docker_images import process_token as _process_token
from cumatrix.execute.protocol import ENV_FD, ENV_FILE, FileChannel
from cumatrix.provision.runtimes import (
    check_runtime_wheel,
    fetch_wheel,
    parse_requirement,
    sha256_file,
)

# Re-exported: the labels, GPU access and container listing live in docker_images and docker_gpu.
__all__ = ["BASE_LABEL", "DRIVER_LIB_DIR", "RUNTIME_LABEL", "GpuAccess", "detect_gpu", "driver_libraries",
           "find_base_image", "listed", "package_root", "runtime_dockerfile"]

#: Base image of runtime images when none is given (a common public Python image).
DEFAULT_BASE_IMAGE = "python:3.12-slim"
#: Where the host driver's user-mode libraries appear in a container (no toolkit case).
LABEL = "cumatrix"
_NAME_RE = re.compile(r"[^a-zA-Z0-9_.-]+")
# What the NVIDIA container toolkit says when an image's NVIDIA_REQUIRE_CUDA exceeds the driver.
_REFUSED_RE = re.compile(r"unsatisfied condition: cuda[^\n]*")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
#: The writable scratch of a read-only container (exec allowed: JIT caches, test binaries).
TMPFS_OPTIONS = "rw,exec,nosuid,nodev,size=1g,mode=1777"


def default_user() -> str:
    """The invoking user's ``uid:gid``, or ``nobody`` when that is root."""
    uid, gid = os.getuid(), os.getgid()
    return NOBODY if uid == 0 else f"{uid}:{gid}"


def default_cpus() -> float:
    """Half the host's cores, at least one: a cell cannot starve the harness and its peers."""
    return max(1.0, (os.cpu_count() or 2) / 2)


@dataclass(frozen=True, kw_only=True, slots=True)
class _ImageFacts:
    tag: str
    image_id: str
    env: dict[str, str] = field(default_factory=dict)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _removed(container: Any) -> bool:
    """Remove a stale container; whether this call removed it."""
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        return False  # removed meanwhile (auto-remove, or another cleaner)
    except docker.errors.APIError as e:
        if e.status_code != 409:  # 409: another cleaner's removal of it is in progress
            raise
        return False
    return True


def _build_log_tail(e: docker.errors.BuildError) -> str:
    """The last lines of a failed build's log, without terminal colours."""
    log = _ANSI_RE.sub("", "".join(str(c.get("stream") or c.get("error") or "") for c in e.build_log))
    return "\n".join(log.strip().splitlines()[-12:])


def _gather_wheels(wheels: Path, runtime: Runtime, wheel_dir: Path | None, pyver: str) -> None:
    """Put an environment runtime's wheels in ``wheels``: those of the wheel directory, else
    downloaded on the host for the base image's Python (``pyver``)."""
    # deferred: only an environment image needs the installer's modules (provisioning, ~45 ms)
    from cumatrix.core.cache import wheel_dir as default_wheel_dir
    from cumatrix.provision import pip

    wd = default_wheel_dir(wheel_dir)
    if wd is not None:
        for w in sorted(wd.glob("*.whl")):
            shutil.copyfile(w, wheels / w.name)
    else:
        plat = pip.platform_tags(f"manylinux_2_28_{os.uname().machine}")
        pip.pip_download(list(runtime.requirements), wheels, deps=True, python_version=pyver,
                         platforms=plat, what=f"runtime {runtime.name}")


def _env_image_tag(dockerfile: Path, runtime: Runtime, wheels: Path, base_image_id: str) -> str:
    """``cumatrix-env:<name>-<hash of Dockerfile + requirements + wheels + base image id>``."""
    h = hashlib.sha256(dockerfile.read_bytes() + "\n".join(runtime.requirements).encode())
    for w in sorted(wheels.iterdir()):
        h.update(sha256_file(w).encode())
    h.update(base_image_id.encode())
    slug = _NAME_RE.sub("-", runtime.name).strip("-.")[:60] or "runtime"
    return f"cumatrix-env:{slug}-{h.hexdigest()[:16]}"


# ------------------------------------------------------------------------------ the backend


class DockerBackend:
    """Runs jobs in containers on a Docker daemon (see the module docstring)."""

    name = "docker"

    def __init__(self, base_image: str | None = None, *, client: docker.DockerClient | None = None,
                 keep: bool | None = None, mem_limit: str = "2g", pids_limit: int = 1024,
                 gpu: GpuAccess | None = None, cpus: float | None = None, user: str | None = None) -> None:
        """Connect to the daemon (``DaemonUnavailable`` if none answers) and remove stale containers.

        ``keep`` defaults to ``$CUMATRIX_KEEP_CONTAINERS``; ``gpu`` defaults to :func:`detect_gpu`.
        """
        self.base_image = base_image or DEFAULT_BASE_IMAGE
        self.keep = _truthy(os.environ.get("CUMATRIX_KEEP_CONTAINERS")) if keep is None else keep
        self.mem_limit = mem_limit
        self.pids_limit = pids_limit
        self.cpus = cpus if cpus is not None else default_cpus()
        self.user = user if user is not None else default_user()
        #: Host paths the run keeps (its ``--out``) that no container may be shown, beyond the
        #: harness's own (:func:`cumatrix.execute.sandbox.kept_paths`).
        self.hidden: tuple[str, ...] = ()
        self._own_client = client is None
        if client is None:
            results.check_unix_socket()
        self._connect(client, base_image)
        self.gpu = gpu if gpu is not None else detect_gpu(self._info)
        self._host = socket.gethostname()
        self._owner = _process_token(os.getpid()) or str(os.getpid())
        self._facts: dict[str, _ImageFacts] = {}
        self._images: dict[str, ImageInfo] = {}
        self.cleanup_stale()

    def _connect(self, client: docker.DockerClient | None, base_image: str | None) -> None:
        """Ask the daemon (``client``, else the environment's) its version and facts, and find
        the base image; raises :class:`DaemonUnavailable` where none answers."""
        try:
            self.client = client or docker.from_env(timeout=120)
            self._version = self.client.version()
            self._info = self.client.info()
            self.base_image = base_image or find_base_image(self.client) or DEFAULT_BASE_IMAGE
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            self.close()
            where = os.environ.get("DOCKER_HOST") or results.DEFAULT_HOST
            raise DaemonUnavailable(f"no Docker daemon answers at {where}: {results.short(e)}; {results.START_HINT}") from e

    def close(self) -> None:
        """Close the connection to the daemon (when this backend opened it)."""
        own: docker.DockerClient | None = getattr(self, "client", None)
        if self._own_client and own is not None:
            own.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------------- facts

    def fingerprint(self) -> dict[str, object]:
        """Backend facts for a report: daemon version, API, kernel, cgroups, GPU access."""
        return {
            "backend": "docker",
            "daemon_version": self._version.get("Version"),
            "api_version": self._version.get("ApiVersion"),
            "os": self._info.get("OperatingSystem"),
            "kernel": self._info.get("KernelVersion"),
            "cgroup_version": self._info.get("CgroupVersion"),
            "runtimes": sorted((self._info.get("Runtimes") or {}).keys()),
            "gpu_access": self.gpu.mode,
            "gpu_detail": self.gpu.detail,
            "base_image": self.base_image,
            "user": self.user,
            "cpus": self.cpus,
        }

    def _labels(self, cell_id: str = "") -> dict[str, str]:
        labels = {LABEL: "1", "cumatrix.owner": self._owner, "cumatrix.host": self._host}
        if cell_id:
            labels["cumatrix.cell"] = cell_id
        if self.keep:
            labels["cumatrix.keep"] = "1"
        return labels

    # -------------------------------------------------------------------- stale containers

    def cleanup_stale(self) -> list[str]:
        """Remove containers labelled ``cumatrix`` whose owning process is gone; return their names.

        Containers of a live run (another pytest-xdist worker, a parallel ``cumatrix run``)
        stay; so do those kept on purpose (``CUMATRIX_KEEP_CONTAINERS``).
        """
        return [name for c, labels, name, status in listed(self.client, f"{LABEL}=1")
                if not self._left_alone(labels, status) and _removed(c)]

    def _left_alone(self, labels: dict[str, str], status: str) -> bool:
        """Whether a listed container stays: kept on purpose, or its run may be alive."""
        if labels.get("cumatrix.keep") == "1":
            return True
        owner = labels.get("cumatrix.owner", "")
        if labels.get("cumatrix.host") == self._host and owner:
            pid = owner.split(".", 1)[0]
            return pid.isdigit() and _process_token(int(pid)) == owner  # its run is alive
        # Another machine's run on a shared daemon: cannot tell if it is alive.
        return labels.get("cumatrix.host") not in (None, self._host) and status == "running"

    # -------------------------------------------------------------------- images

    def base_image_problem(self) -> str | None:
        """Why the base image cannot be used (absent locally: no registry is reached), or ``None``."""
        if self._image_facts(self.base_image) is not None:
            return None
        return (f"base image {self.base_image} not found locally (no registry is used): build one with "
                "containers/build-base.sh (the docker backend then finds it by its label), or pass --base-image")

    def _image_facts(self, ref: str) -> _ImageFacts | None:
        if ref in self._facts:
            return self._facts[ref]
        try:
            img = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        env = dict(e.split("=", 1) for e in (img.attrs.get("Config") or {}).get("Env") or [] if "=" in e)
        facts = _ImageFacts(tag=ref, image_id=img.id, env=env)
        self._facts[ref] = facts
        return facts

    def runtime_image_tag(self, name: str, wheel: Path, base_image_id: str) -> str:
        """``cumatrix-rt:<name>-<hash of Dockerfile + wheel sha256 + base image id>``."""
        h = hashlib.sha256()
        h.update(runtime_dockerfile().read_bytes())
        h.update(sha256_file(wheel).encode())
        h.update(base_image_id.encode())
        slug = _NAME_RE.sub("-", name).strip("-.")[:60] or "runtime"
        return f"cumatrix-rt:{slug}-{h.hexdigest()[:16]}"

    def build_runtime_image(self, runtime: Runtime, wheel: Path) -> ImageInfo:
        """Build (or find) the image of a wheel runtime; raise :class:`ImageBuildError` on failure."""
        if not runtime.requirement:
            raise ImageBuildError(f"runtime {runtime.name!r} has no wheel requirement to build an image from")
        base = self._image_facts(self.base_image)
        if base is None:
            raise ImageBuildError(
                f"base image {self.base_image} not found locally (no registry is used): build one with "
                "containers/build-base.sh and pass its tag as --base-image, or `docker pull` it")
        tag = self.runtime_image_tag(runtime.name, wheel, base.image_id)
        relpath = cudart_in_wheel(wheel)
        existing = self._image_facts(tag)
        if existing is not None:
            return ImageInfo(runtime_name=runtime.name, tag=tag, image_id=existing.image_id,
                             source=f"wheel {runtime.requirement} on {self.base_image}",
                             cudart=existing.env.get("CUMATRIX_CUDART"))
        _, version = parse_requirement(runtime.requirement)
        with tempfile.TemporaryDirectory(prefix=temp_prefix("build")) as ctx:
            shutil.copyfile(runtime_dockerfile(), Path(ctx, "Dockerfile"))
            shutil.copyfile(wheel, Path(ctx, wheel.name))
            image = self._build_image(ctx, tag, runtime, f"({runtime.requirement}) on {self.base_image}", {
                "BASE_IMAGE": self.base_image, "WHEEL": wheel.name, "CUDART_RELPATH": relpath,
                "RUNTIME_NAME": runtime.name, "RUNTIME_VERSION": version, "RUNTIME_REQUIREMENT": runtime.requirement})
        facts = self._image_facts(tag)
        return ImageInfo(runtime_name=runtime.name, tag=tag, image_id=image.id,
                         source=f"wheel {runtime.requirement} on {self.base_image}", built=True,
                         cudart=facts.env.get("CUMATRIX_CUDART") if facts else None)

    def prepare_runtime(self, runtime: Runtime, wheel_dir: Path | None = None) -> ImageInfo:
        """The image a runtime's cells run in, its wheel fetched on the host and checked here
        (outside a run; a run hands :meth:`runtime_image` the wheel it provisioned already);
        problems come back in ``ImageInfo.problem``."""
        wheel: Path | CumatrixError | None = None
        if runtime.requirement and runtime.name not in self._images:
            try:
                wheel = fetch_wheel(runtime.requirement, wheel_dir=wheel_dir)
                check_runtime_wheel(wheel, runtime.requirement, label=runtime.label)  # a runtime, nothing unsafe
            except CumatrixError as e:
                wheel = e
        return self.runtime_image(runtime, wheel, wheel_dir)

    def runtime_image(self, runtime: Runtime, wheel: Path | CumatrixError | None,
                      wheel_dir: Path | None = None) -> ImageInfo:
        """The image a runtime's cells run in, made once per runtime; problems come back in
        ``ImageInfo.problem``.

        A wheel runtime is built from the base image and ``wheel``, fetched and checked on the
        host already (or why it could not be); an environment runtime's venv is built inside
        the image (its wheels from ``wheel_dir``); an ``image:`` runtime is used as it is, after
        checking it exists locally and has python3.  A ``site`` runtime has no meaning in a
        container.
        """
        if runtime.name in self._images:
            return self._images[runtime.name]
        info: ImageInfo
        if runtime.requirement:
            info = self._wheel_image(runtime, wheel)
        elif runtime.requirements:
            try:
                info = self.build_env_image(runtime, wheel_dir)
            except CumatrixError as e:
                info = ImageInfo(runtime_name=runtime.name, tag="", image_id=None, problem=str(e),
                                 source=f"environment {' '.join(runtime.requirements)} on {self.base_image}")
        elif runtime.image:
            info = self._check_foreign_image(runtime)
        else:
            info = ImageInfo(runtime_name=runtime.name, tag="", image_id=None, source=runtime.source,
                             problem=f"runtime {runtime.name!r} is this Python environment's; it has no image "
                                     "(give it a wheel: or image: to run it with --backend docker)")
        self._images[runtime.name] = info
        return info

    def _wheel_image(self, runtime: Runtime, wheel: Path | CumatrixError | None) -> ImageInfo:
        """A wheel runtime's image, from its checked wheel (or why there is none)."""
        source = f"wheel {runtime.requirement} on {self.base_image}"
        try:
            if isinstance(wheel, CumatrixError):
                raise wheel
            if wheel is None:
                raise CumatrixError(f"runtime {runtime.name!r}: its wheel {runtime.requirement} was not provisioned")
            return self.build_runtime_image(runtime, wheel)
        except CumatrixError as e:
            return ImageInfo(runtime_name=runtime.name, tag="", image_id=None, source=source, problem=str(e))

    def build_env_image(self, runtime: Runtime, wheel_dir: Path | None = None) -> ImageInfo:
        """Bake an environment runtime into an image: uv builds its venv offline inside the build.

        The wheels are those of the wheel directory (``wheel_dir``, else ``$CUMATRIX_WHEEL_DIR``;
        they must suit the base image's Python: ``cumatrix fetch --python-version``), else
        downloaded on the host for the base image's Python.
        """
        # deferred: only an environment image needs the installer's modules (provisioning, ~45 ms)
        from cumatrix.provision.runtimes import uv_binary

        base = self._image_facts(self.base_image)
        if base is None:
            raise ImageBuildError(f"base image {self.base_image} not found locally: build one with "
                                  "containers/build-base.sh and pass its tag as --base-image")
        source = f"environment {' '.join(runtime.requirements)} on {self.base_image}"
        pyver = self._base_python(base, runtime.name)
        dockerfile = find_dockerfile("env-runtime.Dockerfile")
        with tempfile.TemporaryDirectory(prefix=temp_prefix("build")) as ctx:
            wheels = Path(ctx, "wheels")
            wheels.mkdir()
            _gather_wheels(wheels, runtime, wheel_dir, pyver)
            tag = _env_image_tag(dockerfile, runtime, wheels, base.image_id)
            existing = self._image_facts(tag)
            if existing is not None:
                return ImageInfo(runtime_name=runtime.name, tag=tag, image_id=existing.image_id, source=source,
                                 cudart=existing.env.get("CUMATRIX_CUDART"), python=pyver)
            shutil.copyfile(dockerfile, Path(ctx, "Dockerfile"))
            shutil.copy2(uv_binary(), Path(ctx, "uv"))
            Path(ctx, "requirements.txt").write_text("".join(f"{r}\n" for r in runtime.requirements))
            image = self._build_image(ctx, tag, runtime, f"({source})",
                                      {"BASE_IMAGE": self.base_image, "RUNTIME_NAME": runtime.name})
        facts = self._image_facts(tag)
        return ImageInfo(runtime_name=runtime.name, tag=tag, image_id=image.id, source=source, built=True,
                         cudart=facts.env.get("CUMATRIX_CUDART") if facts else None, python=pyver)

    def _base_python(self, base: _ImageFacts, name: str) -> str:
        """The base image's python3 version (``3.N``), asked by runtime ``name``'s check; raises
        :class:`ImageBuildError` without one."""
        check = Job(cell_id=f"{name}/python3-version", kind="command", timeout=60.0,
                    argv=("python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"))
        res = self._run(check, self.base_image, base, with_gpu=False)
        pyver = (res.stdout_tail.strip().splitlines() or [""])[-1]
        if not re.fullmatch(r"3\.\d+", pyver):
            raise ImageBuildError(f"base image {self.base_image}: no working python3 ({res.stderr_tail.strip()[-200:]})")
        return pyver

    def _build_image(self, ctx: str, tag: str, runtime: Runtime, what: str, buildargs: dict[str, str]) -> Any:
        """Build the image of ``runtime`` from context ``ctx`` (``what``: the runtime, as the
        error names it); raises :class:`ImageBuildError` on failure."""
        try:
            image, _ = self.client.images.build(
                path=ctx, tag=tag, pull=False, rm=True, forcerm=True, network_mode="none",
                labels={LABEL: "1", "cumatrix.runtime": runtime.name}, buildargs=buildargs)
        except docker.errors.BuildError as e:
            raise ImageBuildError(f"building the image of runtime {runtime.name!r} {what} failed: {e.msg}\n"
                                  f"--- build log (tail) ---\n{_build_log_tail(e)}") from e
        except docker.errors.APIError as e:
            raise ImageBuildError(f"building the image of runtime {runtime.name!r} failed: {results.short(e)}") from e
        return image

    def _check_foreign_image(self, runtime: Runtime) -> ImageInfo:
        ref = runtime.image or ""
        facts = self._image_facts(ref)
        if facts is None:
            return ImageInfo(runtime_name=runtime.name, tag=ref, image_id=None, source="image",
                             problem=f"image {ref} not found locally; build or pull it (`docker pull {ref}`)")
        # The child is `python3 -m cumatrix.child.case`: an image without python3 cannot run it.
        check = Job(cell_id=f"{runtime.name}/python3-check", kind="command", timeout=60.0,
                    argv=("python3", "-c", "import ctypes, sys; print('%d.%d.%d' % sys.version_info[:3])"))
        res = self._run(check, ref, facts, with_gpu=False)
        version = res.stdout_tail.strip().splitlines()[-1] if res.stdout_tail.strip() else ""
        if res.returncode != 0 or not re.fullmatch(r"3\.\d+\.\d+", version):
            why = (res.stderr_tail.strip().splitlines() or ["no output"])[-1]
            return ImageInfo(runtime_name=runtime.name, tag=ref, image_id=facts.image_id, source="image",
                             problem=f"image {ref} has no working python3 (the cell's child is "
                                     f"`python3 -m cumatrix.child.case`): {why}; use an image with python3 >= 3.7")
        return ImageInfo(runtime_name=runtime.name, tag=ref, image_id=facts.image_id, source="image",
                         cudart=facts.env.get("CUMATRIX_CUDART"), python=version)

    # -------------------------------------------------------------------- running

    def run_job(self, job: Job) -> ChildResult:
        """Run ``job.argv`` in a fresh container of ``job.image`` (else the runtime's prepared image)."""
        ref = job.image
        prepared = self._images.get(job.runtime_name)
        if ref is None and prepared is not None:
            if prepared.problem:
                return results.harness_error(prepared.problem, image=prepared.tag)
            ref = prepared.tag
        if ref is None:
            return results.harness_error(f"cell {job.cell_id}: no image for runtime {job.runtime_name!r} "
                                  "(prepare_runtime was not called, and the job names no image)")
        if prepared is not None and prepared.tag == ref and prepared.problem:
            return results.harness_error(prepared.problem, image=ref)
        facts = self._image_facts(ref)
        if facts is None:
            return results.harness_error(f"image {ref} not found locally; build or pull it", image=ref)
        return self._run(job, ref, facts, with_gpu=True)

    def _mounts(self, job: Job, with_gpu: bool) -> list[docker.types.Mount] | str:
        return cell_mounts(job, with_gpu, user=self.user, hidden=self.hidden, gpu=self.gpu)

    def _environment(self, job: Job, facts: _ImageFacts, with_gpu: bool) -> dict[str, str]:
        return cell_environment(job, facts.env, with_gpu, self.gpu)

    def _run(self, job: Job, ref: str, facts: _ImageFacts, *, with_gpu: bool) -> ChildResult:
        # Only a harness child gets the verdict channel: a directory mounted for it alone.
        chan = FileChannel() if job.reports_verdict else None
        rec, why = results.record_channel(self.user)
        try:
            result = self._run_in(job, ref, facts, with_gpu=with_gpu, chan=chan, rec=rec)
            if rec is None and why is not None and result.trace is None:
                result = dataclasses.replace(result, trace=why)
            return result
        finally:
            if chan is not None:
                chan.close()
            if rec is not None:
                rec.close()

    def _gpu_kwargs(self, with_gpu: bool, job: Job) -> dict[str, Any]:
        gpu = driverview.container_gpu(self.gpu, job)
        if with_gpu and gpu.mode == "nvidia-runtime":
            return {"device_requests": [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]}
        if with_gpu and gpu.mode == "device-nodes":
            return {"devices": list(gpu.devices)}
        return {}

    def _run_in(self, job: Job, ref: str, facts: _ImageFacts, *, with_gpu: bool,
                chan: FileChannel | None, rec: docker_trace.RecordChannel | None = None) -> ChildResult:
        extra: dict[str, object] = {"image": ref, "image_id": facts.image_id, "backend": "docker"}
        spec = self._container_spec(job, facts, with_gpu=with_gpu, chan=chan, rec=rec)
        if isinstance(spec, str):
            return results.harness_error(spec, image=ref, image_id=facts.image_id)
        mounts, environment, command = spec
        kwargs = self._gpu_kwargs(with_gpu, job)
        slug = _NAME_RE.sub("-", job.cell_id).strip("-.")[:80]
        name = f"cumatrix-{slug}-{uuid.uuid4().hex[:8]}"
        container = None
        start = time.monotonic()
        if not self.keep:
            sandbox.watch_container(name)  # removed by the watcher should this process die
        try:
            try:
                container = self.client.containers.create(
                    ref, command=command, name=name, environment=environment,
                    mounts=mounts, init=True, network_mode="none", mem_limit=self.mem_limit,
                    memswap_limit=self.mem_limit, pids_limit=self.pids_limit, labels=self._labels(job.cell_id),
                    nano_cpus=int(self.cpus * 1e9), user=self.user, cap_drop=["ALL"],
                    security_opt=["no-new-privileges"], read_only=True, tmpfs={"/tmp": TMPFS_OPTIONS},
                    working_dir=next(iter(results.workdir(job, others_read=self.user == NOBODY)), None),
                    stdin_open=False, tty=False, detach=True,
                    log_config=docker.types.LogConfig(type="json-file", config={"max-size": "64m", "max-file": "1"}),
                    **kwargs)
                start = time.monotonic()
                container.start()
            except docker.errors.APIError as e:
                return _not_started(job, e, extra, start)
            status, timed_out = results.wait(container, job.timeout)
            return results.collect(container, status, timed_out=timed_out, duration=time.monotonic() - start,
                            chan=chan, extra=extra, rec=rec)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            return results.harness_error(f"docker failed while running {job.cell_id}: {results.short(e)}", **extra)
        finally:
            if not self.keep:
                _discard(container, name)

    def _container_spec(self, job: Job, facts: _ImageFacts, *, with_gpu: bool, chan: FileChannel | None,
                        rec: docker_trace.RecordChannel | None
                        ) -> tuple[list[docker.types.Mount], dict[str, str], list[str]] | str:
        """The container's mounts, environment and command (the spawn helper's, tracing the
        cell, where ``rec``), or why it cannot be made."""
        mounts = self._mounts(job, with_gpu)
        if isinstance(mounts, str):
            return mounts
        environment = self._environment(job, facts, with_gpu)
        for key in (ENV_FD, ENV_FILE):
            environment.pop(key, None)
        if chan is not None:
            mounts.append(docker.types.Mount(target=chan.container_dir, source=str(chan.mount_dir), type="bind",
                                             read_only=False))
            environment.update(chan.env())
        command = list(job.argv)
        if rec is not None:  # the spawn helper is the entry and traces the cell's tree
            mounts.append(docker.types.Mount(target=docker_trace.SPAWN_IN_CONTAINER, source=str(rec.shim),
                                             type="bind", read_only=True))
            mounts.append(docker.types.Mount(target=docker_trace.SECRET_DIR_IN_CONTAINER, source=str(rec.dir),
                                             type="bind", read_only=False))
            command = rec.command(job.argv)
        return mounts, environment, command


def _not_started(job: Job, e: docker.errors.APIError, extra: dict[str, object], start: float) -> ChildResult:
    """The result of a container the daemon did not start: refused by the NVIDIA toolkit (an
    image that wants a newer driver: an outcome), else a harness error."""
    msg = results.short(e)
    m = _REFUSED_RE.search(msg)
    if m:
        extra["refused"] = msg
        return ChildResult(returncode=None, signal=None, timed_out=False, stdout_tail="",
                           stderr_tail=msg, verdict=None, verdict_error=None,
                           duration_s=time.monotonic() - start, extra=extra)
    return results.harness_error(f"container for {job.cell_id} did not start: {msg}", **extra)


def _discard(container: Any, name: str) -> None:
    """Remove a cell's container (None: none was created) and stop watching it."""
    if container is None:
        sandbox.unwatch_container(name)
        return
    try:
        container.remove(force=True)
        sandbox.unwatch_container(name)
    except docker.errors.NotFound:
        sandbox.unwatch_container(name)
    except docker.errors.APIError:
        pass  # left for the watcher, or cleanup_stale on the next start (it carries our label)
