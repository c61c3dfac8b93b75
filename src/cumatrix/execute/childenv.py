"""A cell's environment (an allowlist of the harness's) and resource limits."""

# Paths stay strings here on purpose (ruff's PTH rules off for this module): they are what
# bwrap's argv, /proc and the kernel take, and this runs for every cell.
# ruff: noqa: PTH118, PTH120

from __future__ import annotations

import fnmatch
import functools
import math
import os
import re
import resource
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cumatrix.core.options import SandboxPolicy, sandbox_policy

if TYPE_CHECKING:
    from cumatrix.core.jobs import Job


#: Variables a cell inherits from the harness's environment (names, then ``fnmatch`` patterns).
#: Everything else (tokens, cloud keys, the harness's own Python setup) stays out.
ENV_ALLOW = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
             "LD_LIBRARY_PATH", "DISPLAY", "SOURCE_DATE_EPOCH")
ENV_ALLOW_PATTERNS = ("LC_*", "CUDA_*", "NVIDIA_*", "__GL_*", "CUPTI_*", "NCCL_*")
#: ...for the harness's own children (probe, swap) as well: their knobs.
ENV_ALLOW_HARNESS = ("CUMATRIX_*", "KVSWAP_*", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE")
#: A pattern match is dropped all the same when the name says it holds a secret
#: (``NVIDIA_API_KEY``, ``NGC_API_KEY``-style names are common CI secrets).
_SECRET_RE = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
#: The kinds whose child is the harness's own code (``python -m cumatrix.child.case``).
HARNESS_KINDS = ("probe", "swap")
SCOPE_ENV = "CUMATRIX_SCOPE"

#: Resource limits (soft = hard).  No RLIMIT_AS or RLIMIT_DATA: CUDA reserves huge virtual
#: ranges (unified addressing) and fails to initialise under an address-space limit.
#: No RLIMIT_MEMLOCK change: pinned host memory is the driver's business.
NOFILE_MAX = 65536
NPROC_MAX = 32768
CPU_SLACK_S = 30




def _pattern(pats: Iterable[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in pats) or "(?!)")


_ALLOW_RE = _pattern(ENV_ALLOW_PATTERNS)
_ALLOW_HARNESS_RE = _pattern(ENV_ALLOW_PATTERNS + ENV_ALLOW_HARNESS)


@functools.lru_cache(maxsize=4096)
def _allowed(name: str, harness: bool, pass_env: tuple[str, ...]) -> bool:
    """Whether a child gets the variable ``name`` (decided once per name: every cell asks)."""
    if name in ENV_ALLOW:
        return True
    if _pattern(pass_env).match(name):
        return True  # asked for by name: the user's call, secret-looking or not
    pats = _ALLOW_HARNESS_RE if harness else _ALLOW_RE
    return pats.match(name) is not None and not _SECRET_RE.search(name)


_ENVIRON_SEEN: dict[tuple[bool, tuple[str, ...]], tuple[object, dict[str, str]]] = {}


def _allowed_environ(harness: bool, passed: tuple[str, ...]) -> dict[str, str]:
    """The allowlist of this process's environment, filtered again only when it changed.

    Every cell asks, and decoding each variable of ``os.environ`` is most of a child's
    environment's cost (50 variables: 0.3 ms a cell); the raw table is compared instead.
    """
    raw = getattr(os.environ, "_data", None)  # CPython's bytes table behind os.environ
    seen = dict(raw) if isinstance(raw, dict) else None
    if seen is not None and not _allowed("PYTEST_CURRENT_TEST", harness, passed):
        seen.pop(b"PYTEST_CURRENT_TEST", None)  # pytest sets it anew at every phase of every item
    key = (harness, passed)
    hit = _ENVIRON_SEEN.get(key)
    if seen is not None and hit is not None and hit[0] == seen:
        return hit[1]
    env = _filtered(os.environ, harness, passed)
    if seen is not None:
        _ENVIRON_SEEN[key] = (seen, env)
    return env


def _filtered(base: Mapping[str, str], harness: bool, passed: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k, v in base.items() if _allowed(k, harness, passed)}


def harness_paths() -> set[str]:
    """Directories of the harness's own Python packages (never on a command cell's path)."""
    out = {str(Path(__file__).resolve().parents[2])}
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            out.add(str(Path(p).resolve()))
    return out


@functools.lru_cache(maxsize=64)
def _without_harness_bin(path: str) -> str:
    """``PATH`` without the harness's own virtual environment's ``bin`` (where an activated venv
    put it first): a command cell's ``python3`` is then the system's, which lacks what only the
    harness installed.  A case that wants the harness's interpreter says ``python: harness``."""
    if sys.prefix == sys.base_prefix:
        return path  # not in a venv: its interpreter is the system's anyway
    own = os.path.realpath(os.path.join(sys.prefix, "bin"))
    kept = [p for p in path.split(os.pathsep) if p and os.path.realpath(p) != own]
    return os.pathsep.join(kept)


def child_env(job: Job, *, base_env: Mapping[str, str] | None = None,
              policy: SandboxPolicy | None = None) -> dict[str, str]:
    """The environment of a job's child: the allowlist of ``base_env``, then the job's own.

    A command cell's ``PYTHONPATH`` loses the harness's package directories: a cell that
    runs a plain ``python3`` must not import what only the harness has installed.
    """
    policy = policy or sandbox_policy()
    harness = job.reports_verdict or job.kind in HARNESS_KINDS
    passed = tuple(policy.pass_env)
    env = dict(_allowed_environ(harness, passed)) if base_env is None else _filtered(base_env, harness, passed)
    if not harness and "PATH" in env:
        _command_path(env, job)
    env.update(job.env)  # a case that sets PATH itself gets exactly that
    if not harness and "PYTHONPATH" in env:
        _without_harness_packages(env)
    if job.lib_path:
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*job.lib_path, *([old] if old else [])])
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def _command_path(env: dict[str, str], job: Job) -> None:
    """A command cell's ``PATH``: without the harness's venv, but where the case asks for it."""
    env["PATH"] = _without_harness_bin(env["PATH"])
    if job.harness_python:  # `python: harness`: asked for by the case, so first
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]])


def _without_harness_packages(env: dict[str, str]) -> None:
    """A command cell's ``PYTHONPATH`` without the harness's package directories (none left: unset)."""
    own = harness_paths()
    keep = [p for p in env["PYTHONPATH"].split(os.pathsep)
            if p and str(Path(p).resolve()) not in own]
    if keep:
        env["PYTHONPATH"] = os.pathsep.join(keep)
    else:
        del env["PYTHONPATH"]


def limits(job: Job) -> list[tuple[str, int, int]]:
    """(name, soft, hard) resource limits of a job's child; none raises a current limit."""
    return list(_limits(job.timeout))


@functools.lru_cache(maxsize=16)
def _limits(timeout: float) -> tuple[tuple[str, int, int], ...]:
    """:func:`limits` for a timeout, worked out once (every cell of a run asks; a harness's own
    limits do not change while it runs)."""
    cpus = os.cpu_count() or 1
    # CPU seconds: what every core could burn until the wall-clock timeout, and some.
    cpu = math.ceil(timeout * cpus) + CPU_SLACK_S if math.isfinite(timeout) else None
    wanted: list[tuple[str, int, int | None]] = [
        ("core", resource.RLIMIT_CORE, 0),
        ("nofile", resource.RLIMIT_NOFILE, NOFILE_MAX),
        ("nproc", resource.RLIMIT_NPROC, NPROC_MAX),
        ("cpu", resource.RLIMIT_CPU, cpu),
    ]
    out = []
    for name, res, cap in wanted:
        if cap is None:
            continue
        soft, hard = resource.getrlimit(res)
        new_hard = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        new_soft = new_hard if soft == resource.RLIM_INFINITY else min(soft, new_hard)
        out.append((name, new_soft, new_hard))
    return tuple(out)


