"""What crosses from provisioning to execution to judgement: a child's job and what it did."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cumatrix.core.options import DEFAULT_TIMEOUT
from cumatrix.core.witness import KernelTrace


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """A harness child's validated payload.

    ``timings`` are numbers the child measured, ``data`` the child's facts (runtime and
    driver versions, its fingerprint, probe results); both are JSON objects that the
    classifier turns into typed fields.
    """

    outcome: str
    path: str | None = None
    error_name: str | None = None
    detail: str = ""
    timings: Mapping[str, object] = field(default_factory=dict)
    data: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """Everything a backend needs to run one cell's child."""

    cell_id: str
    kind: str  # probe | command | swap
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    lib_path: tuple[str, ...] = ()  # prepended to LD_LIBRARY_PATH, in order
    timeout: float = DEFAULT_TIMEOUT
    mounts: tuple[str, ...] = ()  # host paths the child reads (docker mounts them read-only)
    writable: tuple[str, ...] = ()  # host paths the child writes (docker mounts them read-write)
    runtime_name: str = ""
    image: str | None = None
    #: A harness-owned child (probe, swap): it alone gets the private verdict channel.
    reports_verdict: bool = False
    #: A command cell that asked for the harness's interpreter (``python: harness``).
    harness_python: bool = False
    #: The directory a command cell starts in (its case's ``cwd:``, else its matrix file's);
    #: empty: where the run started.
    cwd: str = ""
    #: An emulated driver: its interposer (``libcuda.so.1``) and the real driver it forwards to.
    #: A backend that gives the cell a mount namespace puts the one over every name of the
    #: other the loader may search, and the real file where only the interposer looks
    #: (docs/emulation.md); empty: the host's driver.
    interposer: str = ""
    real_driver: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildResult:
    returncode: int | None
    signal: int | None
    timed_out: bool
    stdout_tail: str
    stderr_tail: str
    verdict: Verdict | None
    verdict_error: str | None
    duration_s: float
    oom_killed: bool = False
    extra: dict[str, object] = field(default_factory=dict)
    #: What the kernel reports the cell's processes did (the tracer's record); None where no
    #: tracer ran (tracing turned off) or the cell was decided without a child.
    trace: KernelTrace | None = None
