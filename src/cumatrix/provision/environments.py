"""Environment runtimes' virtual environments, keyed by the bytes of the wheels resolved into them.

``{requirements: [...]}`` with a wheel directory is resolved first, offline (``uv pip
compile``): that names every project and version the environment will hold, dependencies
included; the wheel files of the directory carrying those names and versions are hashed,
and the environment's directory is keyed by those hashes.  A second wheel directory holding
other bytes under the same names and versions therefore gets another environment, and the
cells that use it other inputs (``results.store`` puts the same hashes in a cell's digest).

The environment is then installed from copies of exactly those files, checked against the
hashes of its key, so what it holds is what its key says even if the directory changes
while it is built.  Without a wheel directory the package index is the source (its files
are immutable under a name and version) and the key is the requirement text.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from cumatrix.core.cache import cache_dir, cache_root
from cumatrix.core.cache import wheel_dir as default_wheel_dir
from cumatrix.core.errors import CumatrixError, RuntimeNotFound
from cumatrix.core.wheelname import maybe_wheel_name
from cumatrix.core.witness import file_sha256
from cumatrix.load.requirements import check_env_requirement

#: Bumped when what an environment's key covers changes: old environments are then not reused.
_LAYOUT = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedWheel:
    """One wheel file an environment is built from: its file name and the sha256 of its bytes."""

    path: Path
    sha256: str


def uv_binary() -> str:
    """The ``uv`` executable of the ``uv`` package cumatrix depends on."""
    try:
        # deferred: uv's Python package is optional; its binary is looked for elsewhere when absent
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):  # not installed, or its binary is missing
        found = shutil.which("uv")
        if found:
            return found
        raise CumatrixError("uv is not installed (pip install uv): environment runtimes are built with it") from None


def _uv_env() -> dict[str, str]:
    env = dict(os.environ)
    # One cache beside the environments, so uv hard-links from it (links need one filesystem).
    if not env.get("UV_CACHE_DIR"):
        env["UV_CACHE_DIR"] = str(cache_root() / "uv")
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env.pop("VIRTUAL_ENV", None)
    return env


def _run_uv(args: list[str], what: str, stdin: str | None = None) -> str:
    proc = subprocess.run([uv_binary(), *args], capture_output=True, text=True, env=_uv_env(), timeout=1800,
                          input=stdin, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise RuntimeNotFound(f"{what}: uv failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def _pins(requirements: Sequence[str], extra_wheels: Sequence[Path], wheel_dir: Path, python: str,
          what: str) -> list[tuple[str, str]]:
    """``(normalised name, version)`` of every project an offline install resolves to."""
    lines = [*requirements, *(str(w.resolve()) for w in extra_wheels)]
    out = _run_uv(["pip", "compile", "--no-config", "--quiet", "--no-header", "--no-annotate", "--offline",
                   "--no-index", "--find-links", str(wheel_dir), "--python", python, "-"], what,
                  stdin="\n".join(lines) + "\n")
    pins = []
    for line in out.splitlines():
        pin = pin_of(line, what)
        if pin is not None:
            pins.append(pin)
    return pins


def pin_of(line: str, what: str = "uv pip compile") -> tuple[str, str] | None:
    """``(normalised name, version)`` of one line of a resolution (``pip freeze``'s and ``uv pip
    compile``'s format), read as PEP 508 reads it; None for the lines that pin nothing.

    Those are, deliberately: blank lines and comments; option lines (``-e ...``, ``--hash=...``
    continuing a pin, ``--index-url ...``), which name no wheel of the directory; and direct
    references, ``name @ file:///...`` or a path as it was given (``/dist/x-1.0-py3-none-any.whl``,
    which uv echoes): an extra wheel, hashed as given.  A requirement that is
    not pinned to one version by ``==``/``===``, or a line that is no requirement, is an error:
    the environment's key would otherwise leave out a wheel it is built from.
    """
    text = line.split(" #", 1)[0].strip().removesuffix("\\").strip()  # a trailing comment, a continuation
    if not text or text.startswith(("#", "-", "/", "./", "../")):
        return None
    try:
        req = Requirement(text)
    except InvalidRequirement as e:
        raise RuntimeNotFound(f"{what}: cannot read {line.strip()!r} of the resolution: "
                              f"{str(e).splitlines()[0]}") from e
    if req.url:
        return None
    pins = list(req.specifier)
    if len(pins) != 1 or pins[0].operator not in ("==", "===") or pins[0].version.endswith(".*"):
        raise RuntimeNotFound(f"{what}: {line.strip()!r} of the resolution does not pin one version")
    return canonicalize_name(req.name), pins[0].version


def _files_of(wheel_dir: Path, pins: Sequence[tuple[str, str]]) -> list[Path]:
    """The wheel files of ``wheel_dir`` carrying a pinned name and version (every platform tag)."""
    wanted = {(canonicalize_name(n), v) for n, v in pins}
    found = []
    for w in sorted(wheel_dir.glob("*.whl")):
        parsed = maybe_wheel_name(w)
        if parsed is None:
            continue  # not a wheel's file name: pip would not have resolved to it either
        if any(parsed.name == n and parsed.is_version(v) for n, v in wanted):
            found.append(w)
    return found


#: Resolutions of this process, by everything they depend on (the directory's listing included).
_RESOLVED: dict[str, tuple[ResolvedWheel, ...]] = {}


def resolve_wheels(requirements: Sequence[str], wheel_dir: Path | None, extra_wheels: Sequence[Path] = (),
                   python: str | None = None, *, what: str = "") -> tuple[ResolvedWheel, ...]:
    """The wheels of ``wheel_dir`` an offline install of ``requirements`` (and ``extra_wheels``)
    resolves to, dependencies included, each with its sha256; () without a wheel directory."""
    if wheel_dir is None or not wheel_dir.is_dir():
        return ()
    py = python or sys.executable
    listing = sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns, e.stat().st_ino)
                     for e in os.scandir(wheel_dir) if e.name.endswith(".whl"))
    memo = json.dumps([list(requirements), [str(w) for w in extra_wheels], str(wheel_dir), py, listing])
    if memo not in _RESOLVED:
        pins = _pins(requirements, extra_wheels, wheel_dir, py, what or f"environment {' '.join(requirements)}")
        _RESOLVED[memo] = tuple(ResolvedWheel(path=w, sha256=file_sha256(w)) for w in _files_of(wheel_dir, pins))
    return _RESOLVED[memo]


def candidate_wheels(requirements: Sequence[str], wheel_dir: Path | None) -> list[Path]:
    """The wheel files of ``wheel_dir`` an offline install of ``requirements`` resolves to."""
    return [w.path for w in resolve_wheels(requirements, wheel_dir)]


def environment_hash(requirements: Sequence[str], extra_wheels: Sequence[Path] = (), python: str | None = None,
                     *, wheel_dir: Path | None = None, resolved: Sequence[ResolvedWheel] | None = None) -> str:
    """Content hash of an environment: its requirements, the bytes of the wheels it is built
    from (the extra wheels, and with a wheel directory every wheel the requirements resolve to
    there, dependencies included), the interpreter and platform.  A wheel replaced under its
    name and version makes another environment."""
    py = python or sys.executable
    if resolved is None:
        resolved = resolve_wheels(requirements, wheel_dir, extra_wheels, python)
    key = {"requirements": sorted(r.strip() for r in requirements),
           "wheels": sorted(file_sha256(w) for w in extra_wheels),
           "resolved_wheels": sorted(w.sha256 for w in resolved),
           "python": os.path.realpath(py), "python_version": sys.version.split()[0] if python is None else "",
           "platform": sysconfig.get_platform(), "layout": _LAYOUT}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stage(resolved: Sequence[ResolvedWheel], into: Path, what: str) -> None:
    """Copy the resolved wheels into ``into``, each checked against the hash the key holds."""
    for w in resolved:
        copy = into / w.path.name
        shutil.copyfile(w.path, copy)
        got = file_sha256(copy)
        if got != w.sha256:
            raise RuntimeNotFound(f"{what}: {w.path} changed while the environment was built "
                                  f"(sha256 {w.sha256[:12]}... then {got[:12]}...); run again")


def _install(env_dir: Path, reqs: Sequence[str], extra_wheels: Sequence[Path], resolved: Sequence[ResolvedWheel],
             wheel_dir: Path | None, what: str) -> None:
    with tempfile.TemporaryDirectory(prefix=".stage-", dir=env_dir.parent) as staging:
        if wheel_dir is not None:
            _stage(resolved, Path(staging), what)
        source = ["--offline", "--no-index", "--find-links", staging] if wheel_dir is not None else []
        # --no-build: a source distribution would run its build backend on the host
        _run_uv(["pip", "install", "--no-config", "--quiet", "--no-build", "--link-mode", "hardlink", "--python",
                 str(env_dir / "bin" / "python"), *source, "--", *reqs, *map(str, extra_wheels)], what)


def build_environment(requirements: Sequence[str], *, wheel_dir: Path | None = None,
                      extra_wheels: Sequence[Path] = (), python: str | None = None, what: str = "") -> Path:
    """A virtual environment holding ``requirements`` (and ``extra_wheels`` with their dependencies).

    Built once per :func:`environment_hash` under ``<cache>/envs/``, with uv linking files
    from its cache (``--link-mode hardlink``).  With a wheel directory (``wheel_dir``, else
    ``$CUMATRIX_WHEEL_DIR``) uv works offline, from copies of the wheels the key was made of.
    Nothing of the packages runs on the host: only wheels are installed (``--no-build``;
    wheels have no install hooks, uv compiles no bytecode unless asked), and what was
    installed is read from the dist-info files, never by starting the environment's Python.
    """
    what = what or f"environment {' '.join(requirements)}"
    reqs = [check_env_requirement(r) for r in requirements]
    wheel_dir = default_wheel_dir(wheel_dir)
    py = python or sys.executable
    resolved = resolve_wheels(reqs, wheel_dir, extra_wheels, python, what=what)
    digest = environment_hash(reqs, extra_wheels, python, wheel_dir=wheel_dir, resolved=resolved)
    root = cache_dir("envs")
    env_dir = root / digest
    with _locked(root / f"{digest}.lock"):
        if (env_dir / ".complete").is_file():
            return env_dir
        shutil.rmtree(env_dir, ignore_errors=True)  # a build that died half-way
        _run_uv(["venv", "--no-config", "--quiet", "--python", py, str(env_dir)], what)
        _install(env_dir, reqs, extra_wheels, resolved, wheel_dir, what)
        # Read from the dist-info files, not by `uv pip list`: that starts the environment's
        # interpreter, and a wheel's .pth file would run on the host.
        from importlib import metadata as importlib_metadata

        installed = sorted(f"{d.metadata['Name']}=={d.version}"
                           for d in importlib_metadata.distributions(path=env_site_packages(env_dir)))
        (env_dir / ".complete").write_text(json.dumps({
            "requirements": reqs, "installed": installed, "extra_wheels": [w.name for w in extra_wheels],
            "wheels": {w.path.name: w.sha256 for w in resolved}}))
    return env_dir


@dataclass(frozen=True, kw_only=True, slots=True)
class BuiltEnvironment:
    """A built environment, as a runtime reads it: its directory, site-packages and what it holds."""

    env_dir: Path
    site_packages: tuple[str, ...]
    installed: tuple[str, ...]  # ``name==version``, read from its dist-info files when it was built


def built_environment(requirements: Sequence[str], *, wheel_dir: Path | None = None,
                      extra_wheels: Sequence[Path] = (), what: str = "") -> BuiltEnvironment:
    """The environment of ``requirements`` (:func:`build_environment`), with what it holds."""
    env_dir = build_environment(requirements, wheel_dir=wheel_dir, extra_wheels=extra_wheels, what=what)
    info = json.loads((env_dir / ".complete").read_text())
    return BuiltEnvironment(env_dir=env_dir, site_packages=tuple(env_site_packages(env_dir)),
                            installed=tuple(info.get("installed", ())))


def env_site_packages(env_dir: Path) -> list[str]:
    """The site-packages directories of a virtual environment, found on disk (no interpreter run)."""
    return sorted(str(p) for p in env_dir.glob("lib/python3*/site-packages") if p.is_dir())
