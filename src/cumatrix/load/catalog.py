"""The bug catalog (``data/bugs.json``): known real-world failures as typed data.

Each entry is a bad cell that must show the bug's signature and a good cell, on the same
pairing, that must pass; ``cumatrix repro`` runs both.  The file is checked against
``data/bugs.schema.json`` (shapes, with ``file:line:col``), then here (known wheels and
drivers, variant families, outcome words, unique ids).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from cumatrix.core.errors import ConfigError, Problem, UsageError, did_you_mean
from cumatrix.core.model import (
    NO_RUNTIME,
    OUTCOME_RE,
    VARIANT_FAMILIES,
    Cell,
    CudaVersion,
    Driver,
    Matrix,
    Runtime,
    Workload,
    is_neutral,
    is_ok,
    outcome_matches,
)
from cumatrix.load import yamldoc
from cumatrix.load.requirements import KNOWN_WHEELS
from cumatrix.load.schema import check, where_text

CATALOG_SCHEMA = 1
CATALOG_FILE = "cumatrix/data/bugs.json"
SCHEMA = "bugs.schema.json"

# --------------------------------------------------------------------------- the catalog


@dataclass(frozen=True, kw_only=True, slots=True)
class BugRef:
    """An upstream issue or pull request."""

    project: str
    kind: str  # PR | issue
    number: int
    role: str  # introduced | fixed | reported
    url: str

    def __str__(self) -> str:
        return f"{self.project} {self.kind} {self.number} ({self.role})"


@dataclass(frozen=True, kw_only=True, slots=True)
class BugNeeds:
    """What reproducing a bug needs of the host: a GPU, a driver at least this new, or (for a
    build break) only a compiler when there is no GPU."""

    gpu: bool
    driver_min: CudaVersion | None = None
    build_only_without_gpu: bool = False
    #: Without a GPU, the evidence is in the built binaries (a driver symbol newer than the
    #: emulated driver, linked directly): read statically instead of loaded.
    static_without_gpu: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class BugCell:
    """One cell of a catalog entry, by its axes, and the outcome it must show."""

    runtime: CudaVersion | None  # None: a driver-family cell, no CUDA runtime loaded
    driver: Driver
    variant: str
    build: CudaVersion
    workload: Workload
    outcomes: tuple[str, ...]  # any of these; a fallback may be the loop or the copy kernel
    detail_contains: str | None = None

    @property
    def outcome(self) -> str:
        return " or ".join(self.outcomes)

    @property
    def family(self) -> str:
        return "runtime" if self.runtime is not None else "driver"

    def cell(self) -> Cell:
        rt = f"cu{self.runtime}" if self.runtime is not None else NO_RUNTIME
        return Cell(kind="swap", runtime=rt, driver=self.driver.name, variant=self.variant,
                    family="runtime" if self.runtime is not None else "driver", build=self.build,
                    workload=self.workload)

    def shows(self, outcome: str, path: str | None, detail: str) -> bool:
        """Whether an observation is this cell's outcome (and carries its detail text)."""
        if not any(outcome_matches(o, outcome, path) for o in self.outcomes):
            return False
        return self.detail_contains is None or self.detail_contains in detail


@dataclass(frozen=True, kw_only=True, slots=True)
class Bug:
    id: str
    title: str
    refs: tuple[BugRef, ...]
    needs: BugNeeds
    bad: BugCell
    good: BugCell

    def needs_text(self) -> str:
        cells = (self.bad, self.good)
        heads = sorted({str(c.build) for c in cells})
        parts = [f"gpu {'yes' if self.needs.gpu else 'no'}"]
        if self.needs.driver_min:
            parts.append(f"driver >= CUDA {self.needs.driver_min}")
        parts.append(f"emulated driver {_emulated_text(cells)}")
        parts.append(f"headers {', '.join(heads)}")
        parts.append(f"runtime {_runtimes_text(cells)}")
        return "; ".join(parts)

    def matrix(self) -> Matrix:
        """An in-memory matrix holding exactly this entry's two cells."""
        cells = (self.bad, self.good)
        rts = []
        for v in sorted({c.runtime for c in cells if c.runtime is not None}):
            rts.append(Runtime(name=f"cu{v}", requirement=KNOWN_WHEELS[str(v)]))
        drivers = tuple({c.driver.name: c.driver for c in cells}.values())
        return Matrix(path=f"<catalog entry {self.id}>", sha256=hashlib.sha256(self.id.encode()).hexdigest(),
                      version=1, runtimes=tuple(rts), drivers=drivers,
                      builds=tuple(sorted({c.build for c in cells})),
                      variants=tuple(dict.fromkeys(c.variant for c in cells)),
                      workloads=tuple({c.workload.name: c.workload for c in cells}.values()), probe=False)


def _emulated_text(cells: tuple[BugCell, ...]) -> str:
    """The emulated drivers of ``cells``, or ``no``."""
    emulated = {c.driver.emulated for c in cells if c.driver.emulated}
    return ", ".join(str(e) for e in sorted(emulated)) if emulated else "no"


def _runtimes_text(cells: tuple[BugCell, ...]) -> str:
    """The CUDA runtimes ``cells`` load, or that they use the driver API alone."""
    rts = sorted({f"cu{c.runtime}" for c in cells if c.runtime is not None})
    return ", ".join(rts) if rts else "none (driver API only)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Catalog:
    schema: int
    bugs: tuple[Bug, ...]

    def get(self, bug_id: str) -> Bug:
        for b in self.bugs:
            if b.id == bug_id:
                return b
        ids = [b.id for b in self.bugs]
        raise UsageError(f"unknown bug {bug_id!r}{did_you_mean(bug_id, ids)}; known: {', '.join(ids)} "
                         "(`cumatrix repro --list`)")


class _Ctx:
    def __init__(self, doc: yamldoc.Doc, problems: list[Problem]) -> None:
        self.doc = doc
        self.problems = problems

    def err(self, path: yamldoc.Path, message: str) -> None:
        self.problems.append(self.doc.problem(path, f"{where_text(path)}: {message}"))


def _version(ctx: _Ctx, path: yamldoc.Path, raw: Any) -> CudaVersion | None:
    # The schema lets numbers through (13.0 reads as a version); their text is checked here.
    try:
        return CudaVersion.parse(ctx.doc.text(path, raw))
    except ValueError as e:
        ctx.err(path, str(e))
        return None


def _known_wheel(ctx: _Ctx, path: yamldoc.Path, v: CudaVersion, what: str) -> None:
    if str(v) not in KNOWN_WHEELS:
        ctx.err(path, f"no known wheel for {what} {v} (known: {', '.join(KNOWN_WHEELS)})")


def _cell(ctx: _Ctx, path: yamldoc.Path, raw: Mapping[str, Any], workloads: Mapping[str, Workload]) -> BugCell | None:
    from cumatrix.load.matrix import parse_driver  # deferred: the matrix loader only where a catalog is built

    n = len(ctx.problems)
    runtime = None if raw["runtime"] is None else _known_version(ctx, (*path, "runtime"), raw["runtime"], "CUDA")
    build = _known_version(ctx, (*path, "build"), raw["build"], "headers")
    try:
        driver = parse_driver(raw["driver"])
    except ValueError as e:
        ctx.err((*path, "driver"), str(e))
    fams = VARIANT_FAMILIES[raw["variant"]]
    if ("runtime" if raw["runtime"] is not None else "driver") not in fams:
        ctx.err((*path, "variant"), f"{raw['variant']} is a {'/'.join(fams)}-family variant: "
                                    f"{'give a runtime' if 'runtime' in fams else 'runtime must be null'}")
    wl = workloads.get(raw["workload"])
    if wl is None:
        ctx.err((*path, "workload"), f"unknown workload {raw['workload']!r}{did_you_mean(raw['workload'], workloads)}")
    outcomes = _outcomes(ctx, path, raw["outcome"])
    if len(ctx.problems) > n or wl is None or build is None:
        return None
    return BugCell(runtime=runtime, driver=driver, variant=raw["variant"], build=build, workload=wl,
                   outcomes=outcomes, detail_contains=raw.get("detail_contains"))


def _known_version(ctx: _Ctx, path: yamldoc.Path, raw: Any, what: str) -> CudaVersion | None:
    """A cell's CUDA version (its runtime's, or its headers'), which must be one whose wheel is known."""
    version = _version(ctx, path, raw)
    if version is not None:
        _known_wheel(ctx, path, version, what)
    return version


def _outcomes(ctx: _Ctx, path: yamldoc.Path, raw: Any) -> tuple[str, ...]:
    """A cell's outcome, or its list of outcomes, each an outcome word."""
    outcomes = tuple(raw) if isinstance(raw, list) else (raw,)
    for o in outcomes:
        if not OUTCOME_RE.match(o):
            ctx.err((*path, "outcome"), f"{o!r} is not an outcome word")
    return outcomes


def _bug(ctx: _Ctx, i: int, raw: Mapping[str, Any], workloads: Mapping[str, Workload]) -> Bug | None:
    path: yamldoc.Path = ("bugs", i)
    bad = _cell(ctx, (*path, "bad"), raw["bad"], workloads)
    good = _cell(ctx, (*path, "good"), raw["good"], workloads)
    bad = _bad_cell(ctx, path, bad)
    good = _good_cell(ctx, path, good)
    refs = tuple(BugRef(project=r["project"], kind=r["kind"], number=int(r["number"]), role=r["role"], url=r["url"])
                 for r in raw["refs"])
    if bad is None or good is None:
        return None
    return Bug(id=raw["id"], title=raw["title"], refs=refs, bad=bad, good=good,
               needs=_needs(ctx, (*path, "needs"), raw["needs"]))


def _bad_cell(ctx: _Ctx, path: yamldoc.Path, bad: BugCell | None) -> BugCell | None:
    """``bad`` when its outcome is a failure signature (not ok, not neutral), else None (said)."""
    if bad is not None and any(is_neutral(o) or is_ok(o) for o in bad.outcomes):
        ctx.err((*path, "bad", "outcome"), f"{bad.outcome!r} is not a failure signature")
        return None
    return bad


def _good_cell(ctx: _Ctx, path: yamldoc.Path, good: BugCell | None) -> BugCell | None:
    """``good`` when every outcome it allows passes, else None (said)."""
    if good is not None and not all(is_ok(o) for o in good.outcomes):
        ctx.err((*path, "good", "outcome"), f"the good cell must pass (ok...), not {good.outcome!r}")
        return None
    return good


def _needs(ctx: _Ctx, path: yamldoc.Path, needs: Mapping[str, Any]) -> BugNeeds:
    """An entry's ``needs`` (its ``driver_min``, when given, a CUDA version)."""
    dmin = needs.get("driver_min")
    return BugNeeds(gpu=needs["gpu"], build_only_without_gpu=needs.get("build_only_without_gpu", False),
                    static_without_gpu=needs.get("static_without_gpu", False),
                    driver_min=_version(ctx, (*path, "driver_min"), dmin) if dmin is not None else None)


def _unique_ids(ctx: _Ctx, bugs: list[Any]) -> None:
    seen: dict[str, int] = {}
    for i, b in enumerate(bugs):
        bid = b.get("id") if isinstance(b, dict) else None
        if isinstance(bid, str) and bid in seen:
            ctx.err(("bugs", i, "id"), f"duplicate id {bid!r} (first: bugs[{seen[bid]}])")
        elif isinstance(bid, str):
            seen[bid] = i


def _parse(text: str, source: str) -> yamldoc.Doc:
    """The catalog's data with places: JSON read by the YAML parser (JSON is YAML's flow style)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError([Problem(source, e.lineno, e.colno, f"not JSON: {e.msg}")]) from e
    try:
        doc = yamldoc.parse(text, source)
    except ConfigError:
        doc = yamldoc.Doc(file=source, data=None)
    if doc.data != data:  # a JSON corner YAML reads otherwise: keep JSON's reading, places at 1:1
        doc = yamldoc.Doc(file=source, data=data)
    return doc


def _broken_entries(problems: list[Problem], bad: set[yamldoc.Path]) -> set[str | int]:
    """The indices of the entries with a shape problem (``bad``: the schema's paths).

    An entry with a shape problem is not built; the others still are, so one load lists
    every problem.  A problem outside the entries leaves nothing to build on: ConfigError."""
    broken = {p[1] for p in bad if len(p) > 1 and p[0] == "bugs"}
    if any(len(p) < 2 or p[0] != "bugs" for p in bad):
        raise ConfigError(problems)
    return broken


def _workloads(raw: Mapping[str, Any]) -> dict[str, Workload]:
    """The catalog's named workloads."""
    return {name: Workload(name=name, direction=w["direction"], block_bytes=int(w["block_bytes"]),
                           blocks=int(w["blocks"]), stream=w.get("stream", "dedicated"))
            for name, w in raw.items()}


def load_catalog(text: str | None = None, *, source: str = CATALOG_FILE) -> Catalog:
    """Parse and validate the bug catalog (the packaged one unless ``text`` is given).

    Raises :class:`ConfigError` listing every problem with its ``file:line:col``.
    """
    if text is None:
        text = resources.files("cumatrix").joinpath("data/bugs.json").read_text()
    doc = _parse(text, source)
    problems, bad = check(doc, SCHEMA, "catalog")
    broken = _broken_entries(problems, bad)
    ctx = _Ctx(doc, problems)
    workloads = _workloads(doc.data["workloads"])
    bugs = [_bug(ctx, i, b, workloads) for i, b in enumerate(doc.data["bugs"]) if i not in broken]
    _unique_ids(ctx, doc.data["bugs"])
    if ctx.problems:
        raise ConfigError(ctx.problems)
    return Catalog(schema=CATALOG_SCHEMA, bugs=tuple(b for b in bugs if b is not None))


