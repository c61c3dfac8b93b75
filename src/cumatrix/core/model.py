"""The typed data every stage passes on: matrix parts, cells, outcomes, results.

Nothing past :mod:`cumatrix.load.matrix` sees a raw YAML dict; nothing past
:mod:`cumatrix.execute.local` sees a raw child line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

# --------------------------------------------------------------------------- variants

Family = Literal["driver", "runtime"]

#: Variants and the API family each belongs to.  ``loop`` exists in both families; a
#: matrix that names ``loop`` gets a driver-family and a runtime-family loop cell.
VARIANT_FAMILIES: dict[str, tuple[Family, ...]] = {
    "proc-address": ("driver",),
    "direct-link": ("driver",),
    "runtime-dispatch": ("runtime",),
    "driver-dispatch": ("runtime",),
    "header-dispatch": ("runtime",),
    "loop": ("driver", "runtime"),
}

#: Runtime name used in cell ids for driver-family cells, which load no CUDA runtime.
NO_RUNTIME = "none"

DIRECTIONS = ("d2h", "h2d", "d2d")
#: Path policies of the reference (``kvswap_set_policy``); only ``proc-address`` has them.
POLICIES = ("copy-engine-only", "fastest", "beside-compute", "kernel", "batch", "loop")


# --------------------------------------------------------------------------- versions


@dataclass(frozen=True, order=True, slots=True)
class CudaVersion:
    """A CUDA version as ``major.minor``; ``int()`` gives CUDA's encoding (12080)."""

    major: int
    minor: int

    _RE = re.compile(r"^(\d{1,2})\.(\d{1,2})$")

    @classmethod
    def parse(cls, text: str) -> CudaVersion:
        m = cls._RE.match(str(text).strip())
        if not m:
            raise ValueError(f"not a CUDA version (want MAJOR.MINOR such as 12.8): {text!r}")
        return cls(int(m.group(1)), int(m.group(2)))

    @classmethod
    def from_int(cls, value: int) -> CudaVersion:
        return cls(value // 1000, (value % 1000) // 10)

    def __int__(self) -> int:
        return self.major * 1000 + self.minor * 10

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


# --------------------------------------------------------------------------- matrix parts


@dataclass(frozen=True, kw_only=True, slots=True)
class Runtime:
    """A CUDA runtime a cell loads: a wheel requirement, an image, or this Python's."""

    name: str
    requirement: str | None = None
    image: str | None = None
    site: bool = False
    #: An environment built from these pip requirements (``{requirements: [...]}``).
    requirements: tuple[str, ...] = ()
    #: ``offered: true``: programs may bring their own copy of the runtime (observed, not
    #: enforced); by default the cell's runtime wins over a bundled copy of the same soname.
    offered: bool = False
    #: ``file:line:col`` of the definition in the matrix, for messages (not part of identity).
    where: str = field(default="", compare=False)

    @property
    def source(self) -> str:
        if self.requirement:
            return f"wheel {self.requirement}"
        if self.image:
            return f"image {self.image}"
        if self.requirements:
            return f"environment {' '.join(self.requirements)}"
        return "site (this Python environment)"

    @property
    def label(self) -> str:
        """``file:line:col: runtimes.NAME`` (or ``runtimes.NAME``) for messages."""
        return f"{self.where}: runtimes.{self.name}" if self.where else f"runtimes.{self.name}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Driver:
    """``host`` (the real driver) or ``emulated-X.Y`` (interposer over the real one)."""

    name: str
    emulated: CudaVersion | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    name: str
    direction: str
    block_bytes: int
    blocks: int
    layers: int = 1
    stream: str = "dedicated"
    repetitions: int = 20
    warmup: int = 3
    #: proc-address's path policy.  Matrix cells default to copy-engine-only so that they show
    #: the batch/fallback behaviour of the driver; ``fastest`` and ``kernel`` exercise the kernel.
    policy: str = "copy-engine-only"
    kernel_image: str = "cubin"  # ptx hands the kernel to the driver's JIT


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """An arbitrary command run under every runtime x driver pairing."""

    name: str
    argv: tuple[str, ...]
    timeout: float | None = None
    env: tuple[tuple[str, str], ...] = ()
    #: ``runtime: offered``: the runtime is offered to this command, not enforced over its own.
    offered: bool = False
    #: ``allow_runtime``: host runtimes (absolute paths or globs) the command uses on purpose;
    #: any other runtime from outside its own distribution and the cell is ``runtime-leak:PATH``.
    allow_runtime: tuple[str, ...] = ()
    #: ``python: harness``: the harness's own interpreter first on the command's PATH (else
    #: never: a plain ``python3`` must not find what only the harness has installed).
    harness_python: bool = False
    #: ``cwd:``: the directory the command starts in, absolute once loaded from a file (a
    #: relative one is read from the matrix file's directory; none named: that directory);
    #: None: where the run started (the bundled default matrix, matrix text read from no file).
    cwd: str | None = None


#: Axis names a selector (``exclude``/``expect``) may use.
SELECTOR_AXES = ("runtime", "driver", "variant", "build", "workload", "case", "kind", "family")


@dataclass(frozen=True, kw_only=True, slots=True)
class Selector:
    """Matches cells whose axes equal every given value (``None`` = any)."""

    values: tuple[tuple[str, str], ...]
    line: int = 0
    col: int = 0

    def matches(self, cell: Cell) -> bool:
        axes = cell.axes()
        return all(axes.get(k) == v for k, v in self.values)


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpectOverride:
    selector: Selector
    outcomes: frozenset[str]
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Host:
    """A machine of a nightly matrix spread over several hosts (for ``plan``)."""

    name: str
    driver: str
    label: str
    cuda: CudaVersion | None = None
    #: Slurm: the partition and the --constraint (node features) of this host's array task.
    partition: str | None = None
    constraint: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Matrix:
    path: str
    sha256: str
    version: int
    runtimes: tuple[Runtime, ...]
    drivers: tuple[Driver, ...]
    builds: tuple[CudaVersion, ...] = ()
    variants: tuple[str, ...] = ()
    workloads: tuple[Workload, ...] = ()
    cases: tuple[Case, ...] = ()
    exclude: tuple[Selector, ...] = ()
    expect: tuple[ExpectOverride, ...] = ()
    hosts: tuple[Host, ...] = ()
    probe: bool = True
    #: ``sandbox:`` (off | auto | on); None: the run's default (see :mod:`cumatrix.core.options`).
    sandbox: str | None = None

    def runtime(self, name: str) -> Runtime:
        for r in self.runtimes:
            if r.name == name:
                return r
        raise KeyError(name)

    def driver(self, name: str) -> Driver:
        for d in self.drivers:
            if d.name == name:
                return d
        raise KeyError(name)


# --------------------------------------------------------------------------- cells

CellKind = Literal["probe", "command", "swap"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Cell:
    """One isolated run: a runtime x driver pairing and what runs there.

    Ids are stable and readable: ``cu12.9/host/probe``, ``cu12.9/host/import-smoke``,
    ``cu12.9/host/driver-dispatch/h13.0/kv-16k-d2h``, ``none/emulated-12.4/proc-address/h12.8/kv-16k-d2h``.
    """

    kind: CellKind
    runtime: str  # a runtime name, or NO_RUNTIME for driver-family swap cells
    driver: str
    variant: str | None = None
    family: Family | None = None
    build: CudaVersion | None = None
    workload: Workload | None = None
    case: Case | None = None

    @property
    def id(self) -> str:
        head = f"{self.runtime}/{self.driver}"
        if self.kind == "probe":
            return f"{head}/probe"
        if self.kind == "command":
            return f"{head}/{self.need_case().name}"
        return f"{head}/{self.variant}/h{self.need_build()}/{self.need_workload().name}"

    def need_case(self) -> Case:
        if self.case is None:
            raise ValueError(f"{self.kind} cell without a case")
        return self.case

    def need_workload(self) -> Workload:
        if self.workload is None:
            raise ValueError(f"{self.kind} cell without a workload")
        return self.workload

    def need_build(self) -> CudaVersion:
        if self.build is None:
            raise ValueError(f"{self.kind} cell without build headers")
        return self.build

    def axes(self) -> dict[str, str]:
        out: dict[str, str] = {"runtime": self.runtime, "driver": self.driver, "kind": self.kind}
        if self.variant:
            out["variant"] = self.variant
        if self.family:
            out["family"] = self.family
        if self.build:
            out["build"] = str(self.build)
        if self.workload:
            out["workload"] = self.workload.name
        if self.case:
            out["case"] = self.case.name
        return out


# --------------------------------------------------------------------------- outcomes


class Kind(StrEnum):
    """The kind of an outcome word: what comes before its ``:``."""

    OK = "ok"
    CUDA_ERROR = "cuda-error"
    UNDEFINED_SYMBOL = "undefined-symbol"
    BUILD_ERROR = "build-error"
    CRASH = "crash"
    EXIT = "exit"
    TIMEOUT = "timeout"
    CANNOT_EMULATE = "cannot-emulate"
    REFUSED = "refused"
    SKIPPED = "skipped"
    RUNTIME_LEAK = "runtime-leak"
    HARNESS_ERROR = "harness-error"
    FAILS = "fails"  # expected only (:data:`FAILS`)


OUTCOME_RE = re.compile(
    r"^(?:ok(?::(?:batch|fallback|kernel|n/a))?"
    r"|cuda-error:\d+|undefined-symbol:[A-Za-z_][A-Za-z0-9_]*|build-error"
    r"|crash:SIG[A-Z0-9+]+|exit:-?\d+|timeout|cannot-emulate|refused"
    r"|skipped:[a-z0-9][a-z0-9-]*|harness-error"
    # The path of a runtime from outside both the program and the cell (any character a
    # path may hold but control characters).
    r"|runtime-leak:/[^\x00-\x1f\x7f]*)$"
)

PATHS = ("batch", "fallback", "kernel", "n/a")

#: The expected word for "the program fails, in a way no rule says": any non-zero exit, a
#: signal, a CUDA error a harness child reports, or the loader's undefined symbol.  What a rule
#: predicts where NVIDIA's says a program fails but not how it reports it (a program's CUDA 13
#: runtime on a 12.x driver: Python exits 1, a C program exits with whatever code it chose).
#: Expected only: never an observation.
FAILS = Kind.FAILS.value

#: The kinds of outcome that are a program's own failure (what :data:`FAILS` admits): not a
#: timeout (a hang is no failure a rule predicts), a leak, a skip or the harness's own error.
FAILURE_KINDS = frozenset({Kind.EXIT, Kind.CRASH, Kind.CUDA_ERROR, Kind.UNDEFINED_SYMBOL})

#: An expected outcome word: an outcome word, or :data:`FAILS`.
EXPECTED_RE = re.compile(f"^(?:{FAILS}|{OUTCOME_RE.pattern[1:-1]})$")


def outcome_kind(outcome: str) -> Kind:
    """The kind of an outcome word: ``crash:SIGSEGV`` -> :attr:`Kind.CRASH`.

    The one place that takes an outcome word apart; every other module asks this (or the
    predicates below) instead of testing string prefixes.
    """
    return Kind(outcome.split(":", 1)[0])


def outcome_argument(outcome: str) -> str | None:
    """What follows the kind: ``exit:3`` -> ``"3"``, ``ok:batch`` -> ``"batch"``, ``timeout`` -> None."""
    _, sep, arg = outcome.partition(":")
    return arg if sep else None


def is_ok(outcome: str) -> bool:
    """``ok`` on any path."""
    return outcome_kind(outcome) is Kind.OK


def is_neutral(outcome: str) -> bool:
    """Outcomes that neither pass nor fail a cell (reported as skipped).  Only a cell whose
    program did not fail may end on one (the judge's rule; docs/reference/outcomes.md)."""
    return outcome_kind(outcome) in (Kind.SKIPPED, Kind.CANNOT_EMULATE)


def is_failure(outcome: str) -> bool:
    """A program's own failure: what the expected word :data:`FAILS` admits."""
    return outcome_kind(outcome) in FAILURE_KINDS


def outcome_matches(expected: str, outcome: str, path: str | None) -> bool:
    """Whether an observed ``outcome`` (and ``path``) satisfies one expected word.

    ``ok`` matches ``ok`` on any path; ``ok:batch`` only on the batch path; ``fails`` any
    failure of the program (:func:`is_failure`).
    """
    if expected == FAILS:
        return is_failure(outcome)
    if outcome_kind(expected) is Kind.OK and outcome_argument(expected) is not None:
        return outcome == "ok" and path == outcome_argument(expected)
    return expected == outcome


@dataclass(frozen=True, kw_only=True, slots=True)
class Expected:
    """What the oracle predicts for a cell: a set of outcome words and why."""

    outcomes: frozenset[str]
    reason: str
    rule: str = ""  # short id of the rule that produced it

    def admits(self, outcome: str, path: str | None) -> bool:
        return any(outcome_matches(e, outcome, path) for e in self.outcomes)

    def label(self) -> str:
        return " | ".join(sorted(self.outcomes))


@dataclass(frozen=True, kw_only=True, slots=True)
class Spread:
    """Spread of the repeated GB/s measurements of one swap cell."""

    min: float | None = None
    p10: float | None = None
    p90: float | None = None
    max: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Timings:
    """Timings of a cell; only ``wall_s`` for cells that are not swaps."""

    wall_s: float | None = None
    gbps: float | None = None
    loop_gbps: float | None = None
    speedup: float | None = None
    repetitions: int | None = None
    spread: Spread | None = None
    bytes: int | None = None

    def to_json(self) -> dict[str, object]:
        """The timings as a JSON object, leaving out what was not measured."""
        out: dict[str, object] = {}
        for name in ("wall_s", "gbps", "loop_gbps", "speedup", "repetitions", "bytes"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.spread is not None:
            out["spread"] = {
                k: getattr(self.spread, k)
                for k in ("min", "p10", "p90", "max")
                if getattr(self.spread, k) is not None
            }
        return out


    @classmethod
    def from_json(cls, t: Mapping[str, object]) -> Timings:
        """Timings from a JSON object; values of the wrong type are left out."""
        s = t.get("spread")
        spread = None
        if isinstance(s, Mapping):
            spread = Spread(min=_num(s.get("min")), p10=_num(s.get("p10")), p90=_num(s.get("p90")),
                            max=_num(s.get("max")))
        reps, nbytes = _num(t.get("repetitions")), _num(t.get("bytes"))
        return cls(wall_s=_num(t.get("wall_s")), gbps=_num(t.get("gbps")), loop_gbps=_num(t.get("loop_gbps")),
                   speedup=_num(t.get("speedup")), repetitions=None if reps is None else int(reps),
                   spread=spread, bytes=None if nbytes is None else int(nbytes))


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildFacts:
    """What a harness child saw of the CUDA stack it ran on (part of the fingerprint)."""

    runtime_version: int | None = None
    runtime_file: str | None = None
    driver_version: int | None = None
    libcuda_file: str | None = None
    gpu_name: str | None = None
    compute_capability: str | None = None
    forward_compat: bool | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Observed:
    """What a child did, classified.

    ``data`` is what a harness child reported beyond the typed fields (for the probe: the
    runtime's version, whether it exports the batch copy), shown in reports as it is.
    """

    outcome: str
    path: str | None = None
    error_name: str | None = None
    detail: str = ""
    exit_status: int | None = None
    data: Mapping[str, object] = field(default_factory=dict)
    timings: Timings = field(default_factory=Timings)
    facts: ChildFacts = field(default_factory=ChildFacts)
