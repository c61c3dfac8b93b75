"""``cumatrix doctor``: every tool and service a feature of cumatrix needs, and how to fix each.

Each check says which features need it, what it found, and one fix a person can type.
What the default ``cumatrix run`` needs (Python, the matrix's runtimes, the compiled parts that
observe each cell, and gcc where the install carries no prebuilt driver interposer) is
*required*: when one fails, ``doctor`` exits 1.  The rest (gcc beside a platform wheel's
prebuilt interposer, a GPU, nvcc, the Docker daemon and the base image, debootstrap, Chromium,
bubblewrap, gdb, Slurm's client) only switch features on; ``--require FEATURE`` makes any of
them required, for a CI job that relies on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from cumatrix.core.cache import cache_dir
from cumatrix.core.cache import wheel_dir as _wheel_dir
from cumatrix.core.errors import UsageError
from cumatrix.host.fingerprint import cached_runtimes, host_fingerprint
from cumatrix.load import matrix as _matrix
from cumatrix.provision.prebuilt_driver import prebuilt_interposer
from cumatrix.provision.runtimes import find_wheel, parse_requirement

Status = Literal["ok", "missing", "warn"]

#: Features a check can switch on, for ``--require``.
FEATURES = ("run", "emulate", "swap", "gpu", "docker", "base-image", "browser", "nvcc", "debootstrap", "debugger",
            "sandbox", "slurm")
#: A swap cell without gcc is skipped:no-compiler, which the run says first; emulated drivers
#: without gcc or the prebuilt interposer cannot be made at all.
_REQUIRED_BY_DEFAULT = frozenset({"run", "emulate"})
#: What ``submit --slurm`` calls (``front.slurm``: sbatch submits, squeue and scontrol follow and
#: release the jobs); the ``submit.sh`` that ``plan --format slurm`` writes calls sbatch.
_SLURM_TOOLS = ("sbatch", "squeue", "scontrol")
_BROWSERS = ("chromium", "chromium-browser", "google-chrome")
_PIP_TIMEOUT_S = 30


@dataclass(frozen=True, kw_only=True, slots=True)
class Check:
    """One finding: what was looked for, for which features, what was found, how to fix it."""

    name: str
    features: tuple[str, ...]
    status: Status
    found: str
    fix: str = ""

    def required(self, wanted: frozenset[str]) -> bool:
        return any(f in wanted for f in self.features)


# --------------------------------------------------------------------------- base image




# --------------------------------------------------------------------------- the checks


def _first_line(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({e})"
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0].strip() if lines else ""


def _tool(name: str, features: tuple[str, ...], version_args: list[str], fix: str) -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name=name, features=features, status="missing", found="not on PATH", fix=fix)
    version = _first_line([path, *version_args])
    return Check(name=name, features=features, status="ok", found=f"{path}: {version}" if version else path)


def check_python() -> Check:
    v = sys.version_info
    ok = v >= (3, 11)
    return Check(name="python", features=("run",), status="ok" if ok else "missing",
                 found=f"{sys.executable} {v.major}.{v.minor}.{v.micro}",
                 fix="" if ok else "install Python >= 3.11 and reinstall cumatrix in a venv made from it")


def check_gcc() -> Check:
    """gcc builds the reference's swap variants, ``cumatrix build`` and the examples everywhere;
    the emulated drivers too, unless the install carries the prebuilt interposer (a platform
    wheel), which is configured per host without a compiler."""
    interposer = prebuilt_interposer()
    if interposer is None:
        return _tool("gcc", ("emulate", "swap"), ["--version"],
                     "apt-get install gcc (emulated drivers, the reference's swap variants, `cumatrix build` and "
                     "the examples compile C here; a platform wheel of cumatrix carries a prebuilt driver "
                     "interposer instead)")
    return _tool("gcc", ("swap",), ["--version"],
                 f"optional: emulated drivers use the prebuilt interposer {interposer}; apt-get install gcc to "
                 "build the reference's swap variants (their cells are skipped:no-compiler without it), "
                 "`cumatrix build` and the examples")


def check_evidence() -> Check:
    """The spawn helper and the rtld-audit library: shipped in a platform wheel, else compiled
    here at first use; without both, cells run observed in part (and their records say so)."""
    # deferred: the audit's module costs the provisioner's imports, which the other checks do without
    from cumatrix.execute import prebuilt
    from cumatrix.execute.cellaudit import missing_evidence

    missing = missing_evidence()
    if missing:
        return Check(name="evidence", features=("run",), status="missing",
                     found="; ".join(m.split(":", 1)[0] + " missing" for m in missing),
                     fix="install a platform wheel of cumatrix (it carries them), or gcc to compile them here")
    shipped = all(prebuilt.prebuilt(n) is not None for n in (prebuilt.SPAWN, prebuilt.AUDIT))
    return Check(name="evidence", features=("run",), status="ok",
                 found="spawn helper and audit library " + (f"in {prebuilt.LIBEXEC}" if shipped
                                                            else "compiled here (in the cache)"))


def check_gdb() -> Check:
    # repro.native: gdb, else cuda-gdb, for a crash's native backtrace
    for name in ("gdb", "cuda-gdb"):
        if shutil.which(name):
            return _tool(name, ("debugger",), ["--version"], "")
    return Check(name="gdb", features=("debugger",), status="missing", found="neither gdb nor cuda-gdb on PATH",
                 fix="apt-get install gdb (`cumatrix repro --debugger` and the bug catalog's crash backtraces)")


def check_slurm() -> Check:
    paths = [shutil.which(n) for n in _SLURM_TOOLS]
    absent = [n for n, p in zip(_SLURM_TOOLS, paths, strict=True) if p is None]
    if absent:
        return Check(name="slurm client", features=("slurm",), status="missing",
                     found=f"{', '.join(absent)} not on PATH",
                     fix="apt-get install slurm-client (`cumatrix submit --slurm` submits with sbatch and follows "
                         "the jobs with squeue and scontrol; the submit.sh `plan --format slurm` writes calls "
                         "sbatch)")
    sbatch, *rest = [p for p in paths if p]
    return Check(name="slurm client", features=("slurm",), status="ok",
                 found=f"{sbatch}: {_first_line([sbatch, '--version'])}; {', '.join(rest)}")


def check_nvcc() -> Check:
    c = _tool("nvcc", ("nvcc",), ["--version"],
              "optional: install the CUDA toolkit (only the kernel-source test compiles with nvcc; "
              "cells compile the kernel with NVRTC at run time)")
    if c.status == "ok":
        out = _first_line(["sh", "-c", "nvcc --version | tail -n 2 | head -n 1"])
        c = Check(name=c.name, features=c.features, status="ok", found=f"{shutil.which('nvcc')}: {out}")
    return c


def check_debootstrap() -> Check:
    path = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.access(p, os.X_OK)), None)
    if path is None:
        return Check(name="debootstrap", features=("debootstrap",), status="missing", found="not found",
                     fix="apt-get install debootstrap (containers/build-base.sh builds the base image with it)")
    return Check(name="debootstrap", features=("debootstrap",), status="ok", found=path)


def check_sandbox() -> Check:
    """bubblewrap that can create the cells' sandbox here (``run`` sandboxes by default and
    says so in one line where it cannot; ``--require sandbox`` for CI, as ``run --require-sandbox``)."""
    # deferred: the sandbox is the execute stage's, which the other checks do without
    from cumatrix.execute import forkserver, sandbox

    path, why = sandbox.bubblewrap()
    if path is None:
        return Check(name="sandbox", features=("sandbox",), status="warn",
                     found=f"cells would run unsandboxed, as this user: {why}", fix=sandbox.fix_for(why))
    held, _ = sandbox.describe(sandbox.Policy(sandbox="on"))
    how = ("the fork server builds each cell's sandbox (namespaces; CUMATRIX_FORK_SERVER=off: bubblewrap per cell)"
           if held == "namespaces" else "cells run under bubblewrap by default")
    why_not = forkserver.why_not()
    if held != "namespaces" and why_not:  # a root host whose fork server failed its check cell
        how += f" (the fork server is not used: {why_not})"
    return Check(name="sandbox", features=("sandbox",), status="ok",
                 found=f"{path}: {_first_line([path, '--version'])}; {how}")


def check_browser() -> Check:
    for name in _BROWSERS:
        path = shutil.which(name)
        if path:
            return Check(name="chromium", features=("browser",), status="ok",
                         found=f"{path}: {_first_line([path, '--headless', '--no-sandbox', '--version'])}")
    return Check(name="chromium", features=("browser",), status="missing", found="no chromium on PATH",
                 fix="apt-get install chromium (the browser tests open index.html in headless Chromium)")


def check_gpu(fp: Mapping[str, Any]) -> Check:
    dv = fp.get("driver_version")
    gpus = fp.get("gpus") or []
    if dv and gpus:
        names = ", ".join(sorted({str(g.get("name")) for g in gpus}))
        drv = f"CUDA {dv // 1000}.{dv % 1000 // 10}"
        extra = f" ({fp['driver_string']})" if fp.get("driver_string") else ""
        return Check(name="gpu", features=("gpu",), status="ok", found=f"{len(gpus)}x {names}, driver {drv}{extra}")
    why = fp.get("driver_error") or "no libcuda.so.1 loads"
    return Check(name="gpu", features=("gpu",), status="missing", found=f"none: {why}",
                 fix="GPU cells will be skipped:no-cuda-driver here; run on a host with an NVIDIA driver "
                     "(nvidia-smi must work), with --require-gpu in nightly jobs")


def check_docker(fp: Mapping[str, Any]) -> Check:
    d = fp.get("docker") or {}
    if d.get("answers"):
        return Check(name="docker daemon", features=("docker", "base-image"), status="ok",
                     found=f"dockerd {d.get('version')} answers at {os.environ.get('DOCKER_HOST') or 'the default socket'}")
    return Check(name="docker daemon", features=("docker", "base-image"), status="missing",
                 found=f"no daemon: {d.get('why', 'unknown')}",
                 fix="apt-get install docker.io, then `sudo dockerd &` (or `sudo systemctl start docker`), "
                     "or point DOCKER_HOST at a running daemon")


def check_base_image(docker_ok: bool) -> Check:
    name, features = "base image", ("base-image",)
    fix = "bash containers/build-base.sh (debootstrap, no registry; prints the tag) or pass --base-image IMAGE"
    if not docker_ok:
        return Check(name=name, features=features, status="missing", found="not checked: no Docker daemon", fix=fix)
    # deferred: the docker SDK (execute.docker imports it too) is needed only once the daemon answered;
    # a missing or broken SDK stays a finding of docker_status, not an ImportError of this command
    import docker
    import docker.errors

    from cumatrix.execute.docker import BASE_LABEL, find_base_image

    try:
        client = docker.from_env(timeout=10)
        try:
            tag = find_base_image(client)
        finally:
            client.close()
    except (docker.errors.DockerException, OSError) as e:  # the daemon went away between the two checks
        return Check(name=name, features=features, status="missing", found=f"cannot list images: {e}", fix=fix)
    if tag is None:
        return Check(name=name, features=features, status="missing",
                     found=f"no image labelled {BASE_LABEL}", fix=fix)
    return Check(name=name, features=features, status="ok", found=f"{tag} (used when --base-image is not given)")


def _pip_reaches_index(project: str) -> tuple[bool, str]:
    cmd = [sys.executable, "-m", "pip", "index", "versions", project, "--disable-pip-version-check"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, str(e)
    if proc.returncode == 0:
        return True, ""
    tail = (proc.stderr or proc.stdout).strip().splitlines()
    return False, tail[-1] if tail else f"pip exited {proc.returncode}"


def _matrix_requirements(matrix: Path | None) -> list[tuple[str, str]]:
    """(runtime name, requirement) of a matrix's wheel runtimes; [] without one."""
    if matrix is None or not matrix.is_file():
        return []
    m = _matrix.load(matrix)
    return [(rt.name, rt.requirement) for rt in m.runtimes if rt.requirement]


def check_runtimes(matrix: Path | None, wheel_dir: Path | None) -> Check:
    """Every wheel runtime of the matrix: cached, in the wheel directory, or fetchable."""
    wheel_dir = _wheel_dir(wheel_dir)  # $CUMATRIX_WHEEL_DIR when none is given

    cached = cached_runtimes()
    reqs = _matrix_requirements(matrix)
    absent = _absent_wheels(reqs, [d for d in (wheel_dir, cache_dir("wheels")) if d is not None])
    head = f"{len(cached)} unpacked in the cache"
    if matrix is not None and reqs:
        head += f"; {matrix}: {len(reqs) - len(absent)} of {len(reqs)} wheels at hand"
    if not absent:
        return Check(name="runtimes", features=("run",), status="ok", found=head)
    if wheel_dir is not None:
        return Check(name="runtimes", features=("run",), status="missing",
                     found=f"{head}; not in {wheel_dir}: {', '.join(r for _, r in absent)}",
                     fix=f"pip download --no-deps --only-binary=:all: -d {wheel_dir} " + " ".join(
                         f"'{r}'" for _, r in absent))
    return _index_check(head, absent)


def _absent_wheels(reqs: list[tuple[str, str]], dirs: list[Path]) -> list[tuple[str, str]]:
    """The (runtime name, requirement) of ``reqs`` whose wheel no directory of ``dirs`` holds."""
    absent: list[tuple[str, str]] = []
    for name, req in reqs:
        dist, version = parse_requirement(req)
        if not any(d.is_dir() and find_wheel(d, dist, version) for d in dirs):
            absent.append((name, req))
    return absent


def _index_check(head: str, absent: list[tuple[str, str]]) -> Check:
    """The runtimes check when ``absent`` wheels must come from the package index: ok while it answers."""
    ok, why = _pip_reaches_index(parse_requirement(absent[0][1])[0])
    if ok:
        return Check(name="runtimes", features=("run",), status="ok",
                     found=f"{head}; {len(absent)} to fetch from the package index (it answers)")
    return Check(name="runtimes", features=("run",), status="missing",
                 found=f"{head}; {len(absent)} not at hand and the package index does not answer ({why})",
                 fix="on a host with network: pip download --no-deps --only-binary=:all: -d wheels/ " + " ".join(
                     f"'{r}'" for _, r in absent) + "; then copy wheels/ here and pass --wheel-dir wheels/")


def run_checks(matrix: Path | None, wheel_dir: Path | None, fp: Mapping[str, Any]) -> list[Check]:
    """Every check, in the order ``doctor`` prints them."""
    docker_check = check_docker(fp)
    steps: list[Callable[[], Check]] = [
        check_python, check_gcc, lambda: check_runtimes(matrix, wheel_dir), lambda: check_gpu(fp),
        check_nvcc, lambda: docker_check, lambda: check_base_image(docker_check.status == "ok"),
        check_debootstrap, check_browser, check_sandbox,
    ]
    steps.extend([check_evidence, check_gdb, check_slurm])
    return [step() for step in steps]


# --------------------------------------------------------------------------- the command


def _host_lines(fp: Mapping[str, Any], version: str) -> list[str]:
    dv = fp.get("driver_version")
    drv = f"CUDA {dv // 1000}.{dv % 1000 // 10}" if dv else "none found"
    if fp.get("driver_string"):
        drv += f"  ({fp['driver_string']})"
    return [f"cumatrix {version} on {fp['hostname']} ({fp['platform']}, Python {fp['python']})",
            f"driver      {drv}",
            f"fwd compat  {'in use' if fp.get('forward_compat') else 'not in use'}"]


def render(checks: Iterable[Check], wanted: frozenset[str]) -> list[str]:
    """The human report: one line per check, its fix under it."""
    marks = {"ok": "ok  ", "warn": "warn", "missing": "MISS"}
    out = []
    for c in checks:
        need = "required" if c.required(wanted) else "optional"
        out.append(f"[{marks[c.status]}] {c.name:<14} {c.found}")
        if c.status != "ok":
            out.append(f"       {'':<14} fix ({need}: {', '.join(c.features)}): {c.fix}")
    return out


def parse_features(text: str | None) -> frozenset[str]:
    """``--require gpu,docker`` -> the features; unknown names are a usage error."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in FEATURES]
    if unknown:
        raise UsageError(f"--require: unknown feature {', '.join(unknown)} (known: {', '.join(FEATURES)})")
    return frozenset(names)


def doctor(*, as_json: bool, matrix: Path | None, wheel_dir: Path | None, require: str | None,
           version: str) -> int:
    """Print the checks; 0 when every required one passes, 1 otherwise."""
    wanted = _REQUIRED_BY_DEFAULT | parse_features(require)
    fp = host_fingerprint(with_docker=True)
    checks = run_checks(matrix, wheel_dir, fp)
    failed = [c for c in checks if c.status != "ok" and c.required(wanted)]
    if as_json:
        data = dict(fp, cached_runtimes=cached_runtimes(), cumatrix=version,
                    checks=[dict(asdict(c), required=c.required(wanted)) for c in checks], ok=not failed)
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        for line in [*_host_lines(fp, version), *render(checks, wanted)]:
            print(line)
        if failed:
            print(f"doctor: {len(failed)} required check(s) failed: {', '.join(c.name for c in failed)}")
        else:
            print("doctor: everything the required features need is here")
    return 1 if failed else 0
