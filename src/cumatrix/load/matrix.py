"""Load, validate and expand a matrix file.

The YAML is parsed once per process (:func:`load` caches by content), here, into the
frozen dataclasses of :mod:`cumatrix.core.model`; nothing past this module sees a raw dict.
Shapes are checked against ``data/matrix.schema.json`` (:mod:`cumatrix.load.schema`), then
each section is built by a small function that makes the checks a schema cannot (known
header versions, reserved and duplicate names, selectors that match a cell).  Every
problem is reported with the ``file:line:col`` of the value it concerns, all at once,
so a user fixes a file in one go.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cumatrix.core.errors import ConfigError, Problem, did_you_mean
from cumatrix.core.model import (
    EXPECTED_RE,
    NO_RUNTIME,
    SELECTOR_AXES,
    VARIANT_FAMILIES,
    Case,
    Cell,
    CudaVersion,
    Driver,
    ExpectOverride,
    Host,
    Matrix,
    Runtime,
    Selector,
    Workload,
)
from cumatrix.core.options import matrix_sandbox
from cumatrix.core.suggest import outcome_hint, version_hint
from cumatrix.load import gcpause, saved, workdir
from cumatrix.load import requirements as _runtimes
from cumatrix.load.expansion import cells, expand

if TYPE_CHECKING:  # PyYAML (25 ms to import) only where a matrix is parsed, not read back from the cache
    from cumatrix.load import yamldoc

# cells and expand live in cumatrix.load.expansion; callers know them as this module's.
__all__ = [
    "BLOCK_BYTES_MAX",
    "MAX_CELLS",
    "NAME_RE",
    "RUNTIME_FORMS",
    "SCHEMA",
    "TIMEOUT_MAX",
    "cell_bound",
    "cells",
    "check_env_name",
    "check_name",
    "check_timeout",
    "expand",
    "known_builds",
    "load",
    "loads",
    "parse_driver",
    "schema_path",
]

#: The JSON Schema of a matrix file, shipped in the package.  Editors that speak the YAML
#: language server complete and check a matrix from it when the file's first line is
#: ``# yaml-language-server: $schema=<path or URL of matrix.schema.json>``
#: (``cumatrix schema --path`` prints the installed copy's path).
SCHEMA = "matrix.schema.json"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # used with fullmatch: no trailing newline
_SIZE_RE = re.compile(r"(\d+)\s*(KiB|MiB|GiB|K|M|G)?")
_SIZE_MULT = {None: 1, "K": 1024, "KiB": 1024, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30}
_HOST_DRIVER_RE = re.compile(r"\d{3}(\.\d+){0,2}")
#: Sections built in this order; each sees the sections before it.
_RESERVED_CASE_NAMES = frozenset({"probe", *VARIANT_FAMILIES})


def schema_path() -> Path:
    """Where the installed matrix JSON Schema lives (for an editor's ``$schema=`` line)."""
    from importlib import resources  # deferred: only `cumatrix schema --path` asks

    return Path(str(resources.files("cumatrix").joinpath(f"data/{SCHEMA}")))


@dataclass
class _Ctx:
    """The document being built and the problems found so far."""

    doc: yamldoc.Doc
    problems: list[Problem] = field(default_factory=list)
    #: Where a case with no ``cwd:`` starts (None: where the run started).
    home: str | None = None

    def err(self, path: yamldoc.Path, message: str, *, key: bool = False) -> None:
        self.problems.append(self.doc.problem(path, message, key=key))

    def text(self, path: yamldoc.Path, value: Any) -> str:
        return self.doc.text(path, value)

    def version(self, path: yamldoc.Path, raw: Any) -> CudaVersion | None:
        """A CUDA version as written; the schema lets numbers through (``13.0``), so check here."""
        try:
            return CudaVersion.parse(self.text(path, raw))
        except ValueError as e:
            from cumatrix.load.schema import where_text  # deferred with the parser (PyYAML, 25 ms)

            self.err(path, f"{where_text(path)}: {e}")
            return None

    def unique(self, items: Sequence[tuple[str, yamldoc.Path]], what: str) -> None:
        seen: dict[str, yamldoc.Path] = {}
        for name, path in items:
            if name in seen:
                first = self.doc.where(seen[name])[0]
                self.err(path, f"duplicate {what} name {name!r} (first defined on line {first})")
            else:
                seen[name] = path


# --------------------------------------------------------------------------- validators
# The CLI's own options go through these too, so `--timeout nan` fails like `timeout: .nan`.


#: The longest timeout a cell may have (seconds: a week); the schema says the same.
TIMEOUT_MAX = 604800
#: The largest block of a workload (bytes): 64 GiB, beyond any GPU's memory today.
BLOCK_BYTES_MAX = 64 << 30
#: The most cells one matrix may make (before ``exclude``), checked before expanding it.
MAX_CELLS = 1_000_000


def check_timeout(value: object, what: str = "--timeout") -> float:
    """Seconds in (0, :data:`TIMEOUT_MAX`], from a number or its text; :class:`ConfigError` (exit 2) otherwise."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        seconds = math.nan
    if isinstance(value, bool) or not math.isfinite(seconds) or not 0 < seconds <= TIMEOUT_MAX:
        raise ConfigError(f"{what}: expected seconds > 0 and at most {TIMEOUT_MAX} (a week), got {value!r}")
    return seconds


def check_name(value: str, what: str) -> str:
    """A name that may appear in cell ids, file names and JUnit (letters, digits, ``._+-``)."""
    if not NAME_RE.fullmatch(value) or len(value) > 64:
        raise ConfigError(f"{what}: {value!r} is not a usable name (letters, digits and . _ + -, at most 64, "
                          "starting with a letter or digit)")
    return value


def check_env_name(value: str, what: str = "--pass-env") -> str:
    """An environment variable name: not empty, no ``=``, no NUL."""
    if not value or "=" in value or "\0" in value:
        raise ConfigError(f"{what}: {value!r} is not an environment variable name (no '=' or NUL bytes)")
    return value


# --------------------------------------------------------------------------- sections


def _where(ctx: _Ctx, path: yamldoc.Path) -> str:
    line, col = ctx.doc.where(path)
    return f"{ctx.doc.file}:{line}:{col}"


def _rt_wheel(ctx: _Ctx, name: str, entry: Mapping[str, Any], path: yamldoc.Path) -> Runtime | None:
    try:
        _runtimes.parse_requirement(entry["wheel"])
    except ValueError as e:
        ctx.err((*path, "wheel"), f"runtimes.{name}.wheel: {e}")
        return None
    return Runtime(name=name, requirement=entry["wheel"], offered=bool(entry.get("offered")), where=_where(ctx, (*path, "wheel")))


def _rt_image(ctx: _Ctx, name: str, entry: Mapping[str, Any], path: yamldoc.Path) -> Runtime | None:
    return Runtime(name=name, image=entry["image"], where=_where(ctx, (*path, "image")))


def _rt_site(ctx: _Ctx, name: str, entry: Mapping[str, Any], path: yamldoc.Path) -> Runtime | None:
    return Runtime(name=name, site=True, offered=bool(entry.get("offered")), where=_where(ctx, (*path, "site")))


def _rt_requirements(ctx: _Ctx, name: str, entry: Mapping[str, Any], path: yamldoc.Path) -> Runtime | None:
    """An environment built from pip requirements (plain requirements only: no options, paths or URLs)."""
    reqs: list[str] = []
    for i, text in enumerate(entry["requirements"]):
        try:
            reqs.append(_runtimes.check_env_requirement(str(text)))
        except ValueError as e:
            ctx.err((*path, "requirements", i), f"runtimes.{name}.requirements[{i}]: {e}")
    if len(reqs) != len(entry["requirements"]):
        return None
    return Runtime(name=name, requirements=tuple(reqs), offered=bool(entry.get("offered")),
                   where=_where(ctx, (*path, "requirements")))


#: The forms of a runtime entry: its one form key -> a builder.  A new form adds a builder
#: here and its key to ``$defs/runtime`` in the schema; keys that qualify any form (not in
#: this table) reach every builder in ``entry``.
RUNTIME_FORMS: dict[str, Callable[[_Ctx, str, Mapping[str, Any], yamldoc.Path], Runtime | None]] = {
    "wheel": _rt_wheel,
    "image": _rt_image,
    "site": _rt_site,
    "requirements": _rt_requirements,
}


def _runtimes_section(ctx: _Ctx, data: Mapping[str, Any]) -> tuple[Runtime, ...]:
    out = []
    for name, entry in data.items():
        path: yamldoc.Path = ("runtimes", name)
        if name == NO_RUNTIME:
            ctx.err(path, f"runtimes: {name!r} is reserved (driver-family cells load no runtime)", key=True)
            continue
        forms = [k for k in entry if k in RUNTIME_FORMS]
        if len(forms) != 1:
            ctx.err(path, f"runtimes.{name}: give exactly one of {', '.join(RUNTIME_FORMS)}")
            continue
        rt = RUNTIME_FORMS[forms[0]](ctx, name, entry, path)
        if rt is not None:
            out.append(rt)
    return tuple(out)


def parse_driver(text: str) -> Driver:
    """``host`` or ``emulated-X.Y``."""
    if text == "host":
        return Driver(name="host")
    if text.startswith("emulated-"):
        try:
            v = CudaVersion.parse(text[len("emulated-"):])
        except ValueError:
            raise ValueError(f"malformed emulated driver {text!r}: want emulated-MAJOR.MINOR, e.g. emulated-12.4") from None
        if v.major < 12:
            raise ValueError(f"{text}: emulation reads symbol versions from CUDA 12+ headers; use 12.0 or newer")
        known = _runtimes.cuda_releases()
        if str(v) not in known:  # emulated-12.44, emulated-12.7: no driver of that CUDA version exists
            raise ValueError(f"{text}: there is no CUDA {v} release to emulate{version_hint(str(v), known)} "
                             f"(known: {', '.join(known)})")
        return Driver(name=f"emulated-{v}", emulated=v)
    from cumatrix.core.suggest import driver_hint  # deferred: for a misspelt driver only

    versions = list(_runtimes.KNOWN_WHEELS)
    tail = text.rpartition("-")[2]
    if tail.replace(".", "", 1).isdigit() and "." in tail:
        versions.insert(0, tail)  # a misspelt prefix keeps the version written (emulatd-12.7 -> emulated-12.7)
    raise ValueError(f"unknown driver {text!r}{driver_hint(text, versions)}: want host or emulated-X.Y")


def _drivers_section(ctx: _Ctx, data: list[str]) -> tuple[Driver, ...]:
    out: dict[str, Driver] = {}
    names = []
    for i, text in enumerate(data):
        try:
            d = parse_driver(text)
        except ValueError as e:
            ctx.err(("drivers", i), f"drivers: {e}")
            continue
        names.append((d.name, ("drivers", i)))
        out.setdefault(d.name, d)
    ctx.unique(names, "driver")
    return tuple(out.values())


def _builds_section(ctx: _Ctx, data: list[Any]) -> tuple[CudaVersion, ...]:
    out, names = [], []
    for i, raw in enumerate(data):
        v = ctx.version(("builds", i), raw)
        if v is None:
            continue
        out.append(v)
        names.append((str(v), ("builds", i)))
    ctx.unique(names, "build")
    return tuple(dict.fromkeys(out))


def _variants_section(ctx: _Ctx, data: list[str]) -> tuple[str, ...]:
    ctx.unique([(v, ("variants", i)) for i, v in enumerate(data)], "variant")
    return tuple(dict.fromkeys(data))


def _size(ctx: _Ctx, path: yamldoc.Path, raw: float | str) -> int | None:
    if not isinstance(raw, str):
        value = int(raw)  # JSON's integers include 16384.0
    else:
        m = _SIZE_RE.fullmatch(raw.strip())
        assert m is not None  # the schema's pattern
        value = int(m.group(1)) * _SIZE_MULT[m.group(2)]
    if not 16 <= value <= BLOCK_BYTES_MAX:
        ctx.err(path, f"workloads: block_bytes must be from 16 to {BLOCK_BYTES_MAX} (64 GiB), got {value}")
        return None
    return value


def _workloads_section(ctx: _Ctx, data: list[Mapping[str, Any]]) -> tuple[Workload, ...]:
    out, names = [], []
    for i, w in enumerate(data):
        block = _size(ctx, ("workloads", i, "block_bytes"), w["block_bytes"])
        if block is None:
            continue
        names.append((w["name"], ("workloads", i, "name")))
        extra: dict[str, Any] = {k: w[k] for k in ("stream", "policy", "kernel_image") if k in w}
        extra |= {k: int(w[k]) for k in ("layers", "repetitions", "warmup") if k in w}  # 4.0 is an integer too
        out.append(Workload(name=w["name"], direction=w["direction"], block_bytes=block, blocks=int(w["blocks"]),
                            **extra))
    ctx.unique(names, "workload")
    return tuple(out)


def _argv(ctx: _Ctx, path: yamldoc.Path, raw: str | list[Any]) -> tuple[str, ...] | None:
    if isinstance(raw, list):
        # A string is its own text (texts are kept for other scalars only): no path built for it.
        return tuple(a if isinstance(a, str) else ctx.text((*path, j), a) for j, a in enumerate(raw))
    try:
        words = shlex.split(raw)
    except ValueError as e:
        ctx.err(path, f"cases: argv: cannot split {raw!r}: {e}")
        return None
    if not words:
        ctx.err(path, "cases: argv: empty command")
        return None
    return tuple(words)


def _allow_runtime(ctx: _Ctx, path: yamldoc.Path, raw: Sequence[str]) -> tuple[str, ...]:
    """A case's ``allow_runtime`` entries: absolute paths or globs of runtime files (the schema
    checked that they are absolute); a directory or a path with ``.``/``..`` segments names no file."""
    out = []
    for j, entry in enumerate(raw):
        if entry.endswith("/"):
            ctx.err((*path, j), f"cases: allow_runtime: {entry!r} is a directory; name the runtime file "
                                f"(e.g. {entry}libcudart.so.13) or a glob ({entry}libcudart.so.*)")
        elif os.path.normpath(entry) != entry:
            ctx.err((*path, j), f"cases: allow_runtime: {entry!r} is not a plain path (write it as "
                                f"{os.path.normpath(entry)!r}): mapped paths are compared as written")
        else:
            out.append(entry)
    return tuple(out)


def _cases_section(ctx: _Ctx, data: list[Mapping[str, Any]]) -> tuple[Case, ...]:
    out, names = [], []
    for i, c in enumerate(data):
        path: yamldoc.Path = ("cases", i)
        if c["name"] in _RESERVED_CASE_NAMES:
            ctx.err((*path, "name"), f"cases: name {c['name']!r} is reserved (probe and the variant names)")
            continue
        argv = _argv(ctx, (*path, "argv"), c["argv"])
        if argv is None:
            continue
        env = tuple((k, ctx.text((*path, "env", k), v)) for k, v in (c.get("env") or {}).items())
        names.append((c["name"], (*path, "name")))
        timeout = c.get("timeout")
        allow = _allow_runtime(ctx, (*path, "allow_runtime"), c.get("allow_runtime") or ())
        try:
            cwd = workdir.case_dir(ctx.doc.file, c["cwd"]) if "cwd" in c else ctx.home
        except ValueError as e:
            ctx.err((*path, "cwd"), f"cases: cwd: {e}")
            continue
        out.append(Case(name=c["name"], argv=argv, timeout=float(timeout) if timeout is not None else None, env=env,
                        offered=c.get("runtime") == "offered", allow_runtime=allow,
                        harness_python=c.get("python") == "harness", cwd=cwd))
    ctx.unique(names, "case")
    return tuple(out)


def _hosts_section(ctx: _Ctx, data: Mapping[str, Any]) -> tuple[Host, ...]:
    out = []
    for name, h in data.items():
        path: yamldoc.Path = ("hosts", name, "driver")
        drv = ctx.text(path, h["driver"])
        if not _HOST_DRIVER_RE.fullmatch(drv):
            ctx.err(path, f"hosts.{name}.driver: {drv!r} is not a driver version (e.g. 580.159.04)")
            continue
        cuda = ctx.version(("hosts", name, "cuda"), h["cuda"]) if "cuda" in h else None
        if "cuda" in h and cuda is None:
            continue
        out.append(Host(name=name, driver=drv, label=h.get("label", name), cuda=cuda,
                        partition=h.get("partition"), constraint=h.get("constraint")))
    return tuple(out)


def _selector(ctx: _Ctx, path: yamldoc.Path, raw: Mapping[str, Any]) -> Selector:
    values = tuple((k, ctx.text((*path, k), v)) for k, v in raw.items() if k in SELECTOR_AXES)
    if not values:
        ctx.err(path, f"{path[0]}[{path[1]}]: name at least one axis ({', '.join(SELECTOR_AXES)})")
    line, col = ctx.doc.where(path)
    return Selector(values=values, line=line, col=col)


def _exclude_section(ctx: _Ctx, data: list[Mapping[str, Any]]) -> tuple[Selector, ...]:
    return tuple(_selector(ctx, ("exclude", i), item) for i, item in enumerate(data))


def _expect_section(ctx: _Ctx, data: list[Mapping[str, Any]]) -> tuple[ExpectOverride, ...]:
    out = []
    for i, item in enumerate(data):
        path: yamldoc.Path = ("expect", i)
        sel = _selector(ctx, path, item)
        words = item["outcome"] if isinstance(item["outcome"], list) else [item["outcome"]]
        bad = [w for w in words if not EXPECTED_RE.match(w)]
        for w in bad:
            ctx.err((*path, "outcome"), f"expect[{i}].outcome: {w!r} is not an outcome{outcome_hint(w)} (ok, ok:batch, "
                                        "cuda-error:N, crash:SIGSEGV, undefined-symbol:NAME, exit:N, fails, timeout, ...)")
        if not bad:
            out.append(ExpectOverride(selector=sel, outcomes=frozenset(words),
                                      reason=item.get("reason") or f"matrix override {_sel_text(sel)}"))
    return tuple(out)


_SECTIONS: tuple[tuple[str, Callable[[_Ctx, Any], Any]], ...] = (
    ("runtimes", _runtimes_section), ("drivers", _drivers_section), ("builds", _builds_section),
    ("variants", _variants_section), ("workloads", _workloads_section), ("cases", _cases_section),
    ("hosts", _hosts_section), ("exclude", _exclude_section), ("expect", _expect_section),
)


# --------------------------------------------------------------------------- loading

_CACHE: dict[tuple[str, str, str | None], Matrix] = {}
_CACHE_SIZE = 16


def load(path: str | Path) -> Matrix:
    """Parse and validate a matrix file; raise :class:`ConfigError` listing every problem.

    One parse per process: a file read again with the same content (by SHA-256) returns
    the :class:`Matrix` already built, so the plugin's and the CLI's several loads cost one.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the matrix file: {e.strerror or e}") from e
    sha = hashlib.sha256(raw).hexdigest()
    home = workdir.default_dir(path)  # that of the path as given (a symbolic link's, not its target's)
    key = (os.path.realpath(path), sha, home)  # the CLI's relative name and pytest's absolute one are one file
    hit = _CACHE.get(key)
    if hit is None:
        with gcpause.paused():  # objects that live as long as the matrix; no cyclic garbage
            hit = saved.read(raw, sha, str(path), home)
            if hit is None:
                from cumatrix.load.yamldoc import decode  # deferred: PyYAML only where a matrix is parsed

                hit = loads(decode(raw, str(path)), str(path), sha256=sha, home=home)
                saved.write(raw, sha, hit, home)
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = hit
    return hit if hit.path == str(path) else replace(hit, path=str(path))


def loads(text: str, filename: str = "<matrix>", *, sha256: str | None = None, home: str | None = None) -> Matrix:
    """Parse and validate matrix text: the schema's shape checks, then the semantic ones.  A case
    with no ``cwd:`` starts in ``home`` (:func:`load`: the file's directory; None: where the run started)."""
    from cumatrix.load import schema, yamldoc  # deferred: PyYAML only where a matrix is parsed

    doc = yamldoc.parse(text, filename)
    if not isinstance(doc.data, dict):
        raise ConfigError([doc.problem((), "a matrix file is a mapping with at least `runtimes` and `drivers`")])
    problems, bad = schema.check(doc, SCHEMA, "matrix")
    ctx = _Ctx(doc, problems, home)
    data: dict[str, Any] = doc.data
    built = _built_sections(ctx, data, {p[0] for p in bad if p})
    if ctx.problems:
        raise ConfigError(ctx.problems)
    m = Matrix(path=filename, sha256=sha256 or hashlib.sha256(text.encode()).hexdigest(), version=1,
               probe=data.get("probe", True),
               sandbox=matrix_sandbox(data.get("sandbox")), **built)
    _check_size(ctx, m)  # before anything expands the cells
    if ctx.problems:
        raise ConfigError(ctx.problems)
    _check_selectors(ctx, m)
    if ctx.problems:
        raise ConfigError(ctx.problems)
    return m


def _built_sections(ctx: _Ctx, data: dict[str, Any], broken: set[Any]) -> dict[str, Any]:
    """The matrix's sections, checked across each other. One with a shape problem (``broken``) is not
    built; every other section still is, so one ``cumatrix validate`` lists every problem of the file."""
    built = {key: fn(ctx, data[key]) for key, fn in _SECTIONS if key in data and key not in broken}
    if "runtimes" not in broken and not any(p.message.startswith("runtimes") for p in ctx.problems):
        _check_builds(ctx, built)  # beside other sections' problems: one validate lists them all
    if not ctx.problems and _swapless_variants(built):
        ctx.err(("variants",), "variants need `builds` (header versions) and `workloads` to make swap cells", key=True)
    return built


def _swapless_variants(built: Mapping[str, Any]) -> bool:
    """Whether the built sections name variants but no builds or no workloads to make them swap cells of."""
    return bool(built.get("variants")) and not (built.get("builds") and built.get("workloads"))


def known_builds(runtimes: tuple[Runtime, ...]) -> list[str]:
    """Header versions a build can use: the known wheels' and the matrix's own wheel runtimes'."""
    known = set(_runtimes.KNOWN_WHEELS)
    for rt in runtimes:
        if rt.requirement:
            _, version = _runtimes.parse_requirement(rt.requirement)
            known.add(".".join(version.split(".")[:2]))
    return sorted(known, key=lambda v: tuple(int(p) if p.isdigit() else 0 for p in v.split(".")))


def cell_bound(m: Matrix) -> int:
    """How many cells the matrix makes before ``exclude``: worked out, not expanded."""
    per_runtime = int(m.probe) + len(m.cases)
    swaps = len(m.builds) * len(m.workloads)
    runtime_v = sum(1 for v in m.variants if "runtime" in VARIANT_FAMILIES[v])
    driver_v = sum(1 for v in m.variants if "driver" in VARIANT_FAMILIES[v])
    return len(m.drivers) * (len(m.runtimes) * (per_runtime + runtime_v * swaps) + driver_v * swaps)


def _check_size(ctx: _Ctx, m: Matrix) -> None:
    """A matrix of more than :data:`MAX_CELLS` cells is refused before it is expanded (a few
    megabytes of YAML can name 10^8 cells, which would exhaust memory)."""
    n = cell_bound(m)
    if n <= MAX_CELLS:
        return
    sizes = {"drivers": len(m.drivers), "runtimes": len(m.runtimes), "cases": len(m.cases),
             "builds": len(m.builds), "workloads": len(m.workloads), "variants": len(m.variants)}
    biggest = max(sizes, key=lambda k: sizes[k])
    ctx.err((biggest,), f"the matrix makes {n:,} cells (" + " x ".join(f"{v} {k}" for k, v in sizes.items() if v)
            + f"); at most {MAX_CELLS:,} are run in one matrix: split it, or narrow it", key=True)


def _check_builds(ctx: _Ctx, built: Mapping[str, Any]) -> None:
    """Each header version must come from somewhere: a known wheel or a wheel runtime of the matrix."""
    known = known_builds(built.get("runtimes", ()))
    for i, v in enumerate(built.get("builds", ())):
        if str(v) not in known:
            ctx.err(("builds", i), f"builds: no CUDA {v} headers: they come from a runtime wheel of that version; "
                                   f"known: {', '.join(known)}{version_hint(str(v), known)} "
                                   "(or add a runtime wheel of that version to `runtimes`)")


def _check_selectors(ctx: _Ctx, m: Matrix) -> None:
    """Excludes that empty the matrix, and expects that select nothing, are errors."""
    # Without excludes these are the matrix's cells: expanded once, for this check and its users.
    everything = cells(m) if not m.exclude else list(expand(m, apply_exclude=False))
    if not everything:
        ctx.err(("drivers",), "the matrix has no cells: add cases, or variants with builds and workloads, "
                              "or keep the probe", key=True)
        return
    kept = [c for c in everything if not any(s.matches(c) for s in m.exclude)]
    _check_excludes(ctx, m.exclude, everything, kept)
    for ov in m.expect:
        _check_selects(ctx, "expect", ov.selector, kept)


def _check_excludes(ctx: _Ctx, exclude: Sequence[Selector], everything: list[Cell], kept: list[Cell]) -> None:
    """Each exclude selects some cell of ``everything``, and together they leave some ``kept``."""
    for sel in exclude:
        _check_selects(ctx, "exclude", sel, everything)
    if exclude and not kept:
        first = exclude[0]
        ctx.problems.append(Problem(ctx.doc.file, first.line, first.col, "exclude removes every cell of the matrix"))


def _check_selects(ctx: _Ctx, what: str, sel: Selector, among: list[Cell]) -> None:
    """``sel`` (of ``what``: exclude or expect) selects some cell of ``among``, else a problem at its place."""
    if not any(sel.matches(c) for c in among):
        ctx.problems.append(Problem(ctx.doc.file, sel.line, sel.col,
                                    f"{what} selects no cell: {_sel_text(sel)}{_axis_hint(sel, among)}"))


def _sel_text(sel: Selector) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sel.values) + "}"


def _axis_hint(sel: Selector, cells: list[Cell]) -> str:
    for k, v in sel.values:
        known = sorted({c.axes().get(k, "") for c in cells} - {""})
        if v not in known:
            return f" ({k} {v!r} is not in the matrix{did_you_mean(v, known)}; known: {', '.join(known) or 'none'})"
    return ""

