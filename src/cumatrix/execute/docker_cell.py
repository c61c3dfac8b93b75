"""What one cell's container is given: its mounts (each host path bound from where it leads,
checked as the sandbox checks a bind, what the harness keeps masked under it) and its
environment (the job's, with the search paths and GPU variables a container needs)."""

from __future__ import annotations

from pathlib import Path

import docker.types

from cumatrix.core.jobs import Job
from cumatrix.execute import docker_results as results
from cumatrix.execute import driverview, sandbox
from cumatrix.execute.docker_gpu import DRIVER_LIB_DIR, GpuAccess
from cumatrix.execute.docker_images import package_root

#: The user cells run as when the harness runs as root (``nobody``: owns nothing).
NOBODY = "65534:65534"


def cell_mounts(job: Job, with_gpu: bool, *, user: str, hidden: tuple[str, ...],
                gpu: GpuAccess) -> list[docker.types.Mount] | str:
    """The mounts of ``job``'s container run as ``user`` (``hidden``: what the run keeps beyond
    the harness's own; ``gpu``: the backend's way to the GPU), or why one cannot be made."""
    paths = dict.fromkeys([str(package_root()), *job.mounts, *job.writable,
                           *results.workdir(job, others_read=user == NOBODY)])
    mounts = []
    masks: list[docker.types.Mount] = []
    for p in paths:
        bound = _bind(p, job, user=user, hidden=hidden)
        if isinstance(bound, str):
            return bound
        mounts.append(bound[0])
        masks += bound[1]
    mounts += masks  # docker mounts a path's parents first, whatever the order given
    mounts += _root_passable(user, paths)
    mounts += [docker.types.Mount(target=inside, source=host, type="bind", read_only=True)
               for host, inside in driverview.container_files(driverview.container_gpu(gpu, job), job, with_gpu)]
    return mounts


def _bind(p: str, job: Job, *, user: str, hidden: tuple[str, ...]
          ) -> tuple[docker.types.Mount, list[docker.types.Mount]] | str:
    """The bind of host path ``p`` and the masks over what the harness keeps under it, or why
    it cannot be mounted."""
    why = _unmountable(p, user)
    if why is not None:
        return why
    # The source is where the path leads, checked: a link into the host's /run (the
    # daemon's own socket) is refused, naming it; what the harness keeps under it is masked.
    try:
        source, kept = sandbox.host_mount(p, hidden)
    except sandbox.Refused as e:
        return f"cannot mount {p} into the container: {e}"
    bind = docker.types.Mount(target=p, source=source, type="bind", read_only=p not in job.writable)
    return bind, [_mask(at, real) for at, real in kept]


def _unmountable(p: str, user: str) -> str | None:
    """Why host path ``p`` cannot be shown to a container run as ``user`` (None: it can)."""
    if not Path(p).exists():
        return f"cannot mount {p} into the container: no such file or directory on the host"
    if user == NOBODY and not results.world_readable(p):
        return (f"cannot mount {p} into the container: cells run as the non-root user {NOBODY}, "
                f"which cannot read it (mode {Path(p).stat().st_mode & 0o777:o}); make it readable "
                f"(chmod o+rX) or run the harness as a user that owns it")
    return None


def _mask(at: str, real: str) -> docker.types.Mount:
    """An empty read-only tmpfs over a kept directory at ``at``, /dev/null over a kept file."""
    if Path(real).is_dir():
        return docker.types.Mount(target=at, source="", type="tmpfs", read_only=True, tmpfs_size=4096)
    return docker.types.Mount(target=at, source="/dev/null", type="bind", read_only=True)


def _root_passable(user: str, paths: dict[str, None]) -> list[docker.types.Mount]:
    """A tmpfs over the image's ``/root`` where a non-root ``user`` must reach paths below it."""
    if not user.startswith("0:") and user != "0" and any(p.startswith("/root/") for p in paths):
        # The image's /root is 0700: a non-root user could not reach paths mounted below it.
        return [docker.types.Mount(target="/root", source="", type="tmpfs", tmpfs_mode=0o755)]
    return []


def cell_environment(job: Job, image_env: dict[str, str], with_gpu: bool, backend_gpu: GpuAccess) -> dict[str, str]:
    """The environment of ``job``'s container (``image_env``: the image's own; ``backend_gpu``:
    the backend's way to the GPU)."""
    env = dict(job.env)
    gpu = driverview.container_gpu(backend_gpu, job)  # an emulated driver's: device nodes
    _set_lib_path(env, job, image_env, device_nodes=with_gpu and gpu.mode == "device-nodes")
    _set_pythonpath(env, job)
    env.setdefault("HOME", "/tmp")  # the user has no home in the image; /tmp is writable
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")  # the package is mounted read-only
    if with_gpu:
        _set_gpu_env(env, image_env, gpu, backend_gpu)
    return env


def _set_lib_path(env: dict[str, str], job: Job, image_env: dict[str, str], *, device_nodes: bool) -> None:
    """The job's library path (and the driver's libraries, passed as device nodes) before the image's."""
    lib_path = list(job.lib_path)
    if device_nodes:
        lib_path.append(DRIVER_LIB_DIR)
    # Prepended to the image's own LD_LIBRARY_PATH (nvidia/cuda images set one).
    own = env.get("LD_LIBRARY_PATH", image_env.get("LD_LIBRARY_PATH", ""))
    joined = ":".join([*lib_path, *([own] if own else [])])
    if joined:
        env["LD_LIBRARY_PATH"] = joined


def _set_pythonpath(env: dict[str, str], job: Job) -> None:
    """The harness's package first for its own children; none of its packages for a command cell."""
    root = str(package_root())
    py = [p for p in env.get("PYTHONPATH", "").split(":") if p]
    if job.reports_verdict or job.kind in sandbox.HARNESS_KINDS:
        if root not in py:
            py.insert(0, root)
    else:  # a command cell sees none of the harness's packages
        harness = sandbox.harness_paths() | {root}
        py = [p for p in py if p not in harness]
    if py:
        env["PYTHONPATH"] = ":".join(py)
    else:
        env.pop("PYTHONPATH", None)


def _set_gpu_env(env: dict[str, str], image_env: dict[str, str], gpu: GpuAccess, backend_gpu: GpuAccess) -> None:
    """The NVIDIA runtime's variables of a cell given the GPU (``gpu``: its way there)."""
    if gpu is not backend_gpu and backend_gpu.mode == "nvidia-runtime":
        env["NVIDIA_VISIBLE_DEVICES"] = "void"  # no hook of a default NVIDIA runtime: no GPU named
    if gpu.mode == "nvidia-runtime":
        env.setdefault("NVIDIA_VISIBLE_DEVICES", "all")
        env.setdefault("NVIDIA_DRIVER_CAPABILITIES", image_env.get("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))
