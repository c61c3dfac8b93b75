"""Load, validate and expand a matrix file.

The YAML is parsed once, here, into the frozen dataclasses of :mod:`cumatrix.model`;
nothing past this module sees a raw dict.  Every problem is reported with the
``file:line:col`` of the node it concerns, all at once, so a user fixes a file in one go.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from . import runtimes as _runtimes
from .errors import ConfigError, Problem, did_you_mean
from .model import (
    DIRECTIONS,
    KERNEL_IMAGES,
    NO_RUNTIME,
    POLICIES,
    OUTCOME_RE,
    SELECTOR_AXES,
    STREAM_KINDS,
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

TOP_KEYS = ("version", "runtimes", "drivers", "builds", "variants", "workloads", "cases",
            "exclude", "expect", "hosts", "probe")
RUNTIME_KEYS = ("wheel", "image", "site", "requirements")
WORKLOAD_KEYS = ("name", "direction", "block_bytes", "blocks", "layers", "stream", "repetitions", "warmup",
                 "policy", "kernel_image")
CASE_KEYS = ("name", "argv", "timeout", "env")
HOST_KEYS = ("driver", "label", "cuda")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_SIZE_RE = re.compile(r"^(\d+)\s*(KiB|MiB|GiB|K|M|G)?$")
_SIZE_MULT = {None: 1, "K": 1024, "KiB": 1024, "M": 1 << 20, "MiB": 1 << 20, "G": 1 << 30, "GiB": 1 << 30}

T = TypeVar("T")


@dataclass
class _Ctx:
    file: str
    problems: list[Problem] = field(default_factory=list)

    def err(self, node: Node | None, message: str) -> None:
        line, col = (node.start_mark.line + 1, node.start_mark.column + 1) if node is not None else (1, 1)
        self.problems.append(Problem(self.file, line, col, message))


def _kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag.endswith(":null"):
        return "empty"
    return f"{node.tag.rsplit(':', 1)[-1]} {node.value!r}"


def _pairs(ctx: _Ctx, node: MappingNode, allowed: tuple[str, ...], where: str) -> dict[str, tuple[Node, Node]]:
    """Keys of a mapping node, checking unknown and duplicate keys."""
    out: dict[str, tuple[Node, Node]] = {}
    for k, v in node.value:
        if not isinstance(k, ScalarNode):
            ctx.err(k, f"{where}: keys must be plain names")
            continue
        key = str(k.value)
        if key in out:
            ctx.err(k, f"{where}: duplicate key {key!r}")
            continue
        if allowed and key not in allowed:
            ctx.err(k, f"{where}: unknown key {key!r}{did_you_mean(key, allowed)}; allowed: {', '.join(allowed)}")
            continue
        out[key] = (k, v)
    return out


def _scalar(ctx: _Ctx, node: Node, what: str) -> str | None:
    if not isinstance(node, ScalarNode) or node.tag.endswith(":null"):
        ctx.err(node, f"{what}: expected a value, got {_kind(node)}")
        return None
    return str(node.value)


def _int(ctx: _Ctx, node: Node, what: str, *, minimum: int = 0, sizes: bool = False) -> int | None:
    text = _scalar(ctx, node, what)
    if text is None:
        return None
    m = _SIZE_RE.match(text.strip()) if sizes else re.match(r"^(\d+)()$", text.strip())
    if not m or (node.tag.endswith(":str") and not sizes):
        ctx.err(node, f"{what}: expected {'a size (16384, 16KiB, 2MiB)' if sizes else 'an integer'}, got {text!r}")
        return None
    value = int(m.group(1)) * (_SIZE_MULT[m.group(2) or None] if sizes else 1)
    if value < minimum:
        ctx.err(node, f"{what}: must be at least {minimum}, got {value}")
        return None
    return value


def _list(ctx: _Ctx, node: Node, what: str) -> list[Node]:
    if not isinstance(node, SequenceNode):
        ctx.err(node, f"{what}: expected a list, got {_kind(node)}")
        return []
    return list(node.value)


def _version(ctx: _Ctx, node: Node, what: str) -> CudaVersion | None:
    text = _scalar(ctx, node, what)
    if text is None:
        return None
    try:
        return CudaVersion.parse(text)
    except ValueError as e:
        ctx.err(node, f"{what}: {e}")
        return None


def _names(ctx: _Ctx, items: list[tuple[str, Node]], what: str) -> None:
    seen: dict[str, Node] = {}
    for name, node in items:
        if name in seen:
            first = seen[name].start_mark.line + 1
            ctx.err(node, f"duplicate {what} name {name!r} (first defined on line {first})")
        else:
            seen[name] = node


# --------------------------------------------------------------------------- sections


def _runtimes_section(ctx: _Ctx, node: Node) -> tuple[Runtime, ...]:
    if not isinstance(node, MappingNode):
        ctx.err(node, f"runtimes: expected a mapping of name -> {{wheel|image|site|requirements}}, got {_kind(node)}")
        return ()
    out = []
    for name, (knode, vnode) in _pairs(ctx, node, (), "runtimes").items():
        if not NAME_RE.match(name) or name == NO_RUNTIME:
            ctx.err(knode, f"runtimes: {name!r} is not a usable name (letters, digits, . _ + -; not {NO_RUNTIME!r})")
            continue
        if not isinstance(vnode, MappingNode):
            ctx.err(vnode, f"runtimes.{name}: expected {{wheel: REQ}}, {{image: REF}}, {{site: true}} or {{requirements: [REQ, ...]}}, got {_kind(vnode)}")
            continue
        keys = _pairs(ctx, vnode, RUNTIME_KEYS, f"runtimes.{name}")
        if len(keys) != 1:
            ctx.err(vnode, f"runtimes.{name}: give exactly one of wheel, image, site, requirements")
            continue
        key, (_, val) = next(iter(keys.items()))
        where = f"{ctx.file}:{val.start_mark.line + 1}:{val.start_mark.column + 1}"
        if key == "requirements":
            reqs = _env_requirements(ctx, val, name)
            if reqs:
                out.append(Runtime(name=name, requirements=reqs, where=where))
            continue
        text = _scalar(ctx, val, f"runtimes.{name}.{key}")
        if text is None:
            continue
        if key == "wheel":
            try:
                _runtimes.parse_requirement(text)
            except ValueError as e:
                ctx.err(val, f"runtimes.{name}.wheel: {e}")
                continue
            out.append(Runtime(name=name, requirement=text, where=where))
        elif key == "image":
            out.append(Runtime(name=name, image=text, where=where))
        else:
            if not val.tag.endswith(":bool") or text.lower() not in ("true", "yes", "on"):
                ctx.err(val, f"runtimes.{name}.site: only `site: true` is meaningful")
                continue
            out.append(Runtime(name=name, site=True, where=where))
    return tuple(out)


def _env_requirements(ctx: _Ctx, node: Node, name: str) -> tuple[str, ...]:
    """``requirements: [REQ, ...]`` of an environment runtime; each a plain requirement."""
    items = _list(ctx, node, f"runtimes.{name}.requirements")
    if not items and isinstance(node, SequenceNode):
        ctx.err(node, f"runtimes.{name}.requirements: give at least one requirement")
    reqs = []
    for item in items:
        text = _scalar(ctx, item, f"runtimes.{name}.requirements")
        if text is None:
            continue
        try:
            reqs.append(_runtimes.check_env_requirement(text))
        except ValueError as e:
            ctx.err(item, f"runtimes.{name}.requirements: {e}")
    return tuple(reqs) if len(reqs) == len(items) else ()


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
        return Driver(name=f"emulated-{v}", emulated=v)
    raise ValueError(f"unknown driver {text!r}{did_you_mean(text, ['host', 'emulated-12.4'])}: want host or emulated-X.Y")


def _drivers_section(ctx: _Ctx, node: Node) -> tuple[Driver, ...]:
    out = []
    items = []
    for item in _list(ctx, node, "drivers"):
        text = _scalar(ctx, item, "drivers[]")
        if text is None:
            continue
        try:
            d = parse_driver(text)
        except ValueError as e:
            ctx.err(item, f"drivers: {e}")
            continue
        items.append((d.name, item))
        out.append(d)
    _names(ctx, items, "driver")
    return tuple(d for i, d in enumerate(out) if d.name not in {n for n, _ in items[:i]})


def _workloads_section(ctx: _Ctx, node: Node) -> tuple[Workload, ...]:
    out, names = [], []
    for item in _list(ctx, node, "workloads"):
        if not isinstance(item, MappingNode):
            ctx.err(item, f"workloads[]: expected a mapping, got {_kind(item)}")
            continue
        keys = _pairs(ctx, item, WORKLOAD_KEYS, "workload")
        missing = [k for k in ("name", "direction", "block_bytes", "blocks") if k not in keys]
        if missing:
            ctx.err(item, f"workload: missing {', '.join(missing)}")
            continue
        name = _scalar(ctx, keys["name"][1], "workload.name")
        direction = _scalar(ctx, keys["direction"][1], "workload.direction")
        if direction is not None and direction not in DIRECTIONS:
            ctx.err(keys["direction"][1], f"workload.direction: {direction!r}{did_you_mean(direction, DIRECTIONS)}; one of {', '.join(DIRECTIONS)}")
            direction = None
        stream = "dedicated"
        if "stream" in keys:
            s = _scalar(ctx, keys["stream"][1], "workload.stream")
            if s is not None and s not in STREAM_KINDS:
                ctx.err(keys["stream"][1], f"workload.stream: {s!r}{did_you_mean(s, STREAM_KINDS)}; one of {', '.join(STREAM_KINDS)}")
            elif s is not None:
                stream = s
        choices = {}
        for key, allowed, default in (("policy", POLICIES, "copy-engine-only"), ("kernel_image", KERNEL_IMAGES, "cubin")):
            choices[key] = default
            if key in keys:
                val = _scalar(ctx, keys[key][1], f"workload.{key}")
                if val is not None and val not in allowed:
                    ctx.err(keys[key][1], f"workload.{key}: {val!r}{did_you_mean(val, allowed)}; one of {', '.join(allowed)}")
                elif val is not None:
                    choices[key] = val
        block = _int(ctx, keys["block_bytes"][1], "workload.block_bytes", minimum=16, sizes=True)
        blocks = _int(ctx, keys["blocks"][1], "workload.blocks", minimum=1)
        layers = _int(ctx, keys["layers"][1], "workload.layers", minimum=1) if "layers" in keys else 1
        reps = _int(ctx, keys["repetitions"][1], "workload.repetitions", minimum=1) if "repetitions" in keys else 20
        warm = _int(ctx, keys["warmup"][1], "workload.warmup", minimum=0) if "warmup" in keys else 3
        if name is not None and not NAME_RE.match(name):
            ctx.err(keys["name"][1], f"workload.name: {name!r} is not a usable name")
            continue
        if None in (name, direction, block, blocks, layers, reps, warm):
            continue
        assert name and direction and block and blocks and layers and reps is not None and warm is not None
        names.append((name, keys["name"][1]))
        out.append(Workload(name=name, direction=direction, block_bytes=block, blocks=blocks, layers=layers,
                            stream=stream, repetitions=reps, warmup=warm, policy=choices["policy"],
                            kernel_image=choices["kernel_image"]))
    _names(ctx, names, "workload")
    return tuple(out)


def _cases_section(ctx: _Ctx, node: Node) -> tuple[Case, ...]:
    out, names = [], []
    for item in _list(ctx, node, "cases"):
        if not isinstance(item, MappingNode):
            ctx.err(item, f"cases[]: expected a mapping with name and argv, got {_kind(item)}")
            continue
        keys = _pairs(ctx, item, CASE_KEYS, "case")
        if "name" not in keys or "argv" not in keys:
            ctx.err(item, "case: needs name and argv")
            continue
        name = _scalar(ctx, keys["name"][1], "case.name")
        argv_node = keys["argv"][1]
        argv: list[str] = []
        if isinstance(argv_node, SequenceNode):
            for a in argv_node.value:
                s = _scalar(ctx, a, "case.argv[]")
                if s is not None:
                    argv.append(s)
        else:
            s = _scalar(ctx, argv_node, "case.argv")
            if s is not None:
                try:
                    argv = shlex.split(s)
                except ValueError as e:
                    ctx.err(argv_node, f"case.argv: cannot split {s!r}: {e}")
        if not argv:
            ctx.err(argv_node, "case.argv: empty command")
            continue
        timeout = None
        if "timeout" in keys:
            t = _scalar(ctx, keys["timeout"][1], "case.timeout")
            try:
                timeout = float(t) if t is not None else None
                if timeout is not None and timeout <= 0:
                    raise ValueError
            except ValueError:
                ctx.err(keys["timeout"][1], f"case.timeout: expected seconds > 0, got {t!r}")
                continue
        env: list[tuple[str, str]] = []
        if "env" in keys:
            enode = keys["env"][1]
            if isinstance(enode, MappingNode):
                for k, (_, v) in _pairs(ctx, enode, (), "case.env").items():
                    val = _scalar(ctx, v, f"case.env.{k}")
                    if val is not None:
                        env.append((k, val))
            else:
                ctx.err(enode, f"case.env: expected a mapping, got {_kind(enode)}")
        if name is None:
            continue
        if not NAME_RE.match(name) or name == "probe" or name in VARIANT_FAMILIES:
            ctx.err(keys["name"][1], f"case.name: {name!r} is not usable (reserved, or not letters/digits/._+-)")
            continue
        names.append((name, keys["name"][1]))
        out.append(Case(name=name, argv=tuple(argv), timeout=timeout, env=tuple(env)))
    _names(ctx, names, "case")
    return tuple(out)


def _selector(ctx: _Ctx, node: MappingNode, where: str, extra: tuple[str, ...] = ()) -> tuple[Selector, dict[str, tuple[Node, Node]]]:
    keys = _pairs(ctx, node, SELECTOR_AXES + extra, where)
    values = []
    for k, (_, v) in keys.items():
        if k in extra:
            continue
        s = _scalar(ctx, v, f"{where}.{k}")
        if s is not None:
            values.append((k, s))
    if not values:
        ctx.err(node, f"{where}: name at least one axis ({', '.join(SELECTOR_AXES)})")
    return Selector(values=tuple(values), line=node.start_mark.line + 1, col=node.start_mark.column + 1), keys


def _hosts_section(ctx: _Ctx, node: Node) -> tuple[Host, ...]:
    if not isinstance(node, MappingNode):
        ctx.err(node, f"hosts: expected a mapping of name -> {{driver, label}}, got {_kind(node)}")
        return ()
    out = []
    for name, (knode, vnode) in _pairs(ctx, node, (), "hosts").items():
        if not isinstance(vnode, MappingNode):
            ctx.err(vnode, f"hosts.{name}: expected {{driver: '580.159', label: RUNNER}}, got {_kind(vnode)}")
            continue
        keys = _pairs(ctx, vnode, HOST_KEYS, f"hosts.{name}")
        if "driver" not in keys:
            ctx.err(vnode, f"hosts.{name}: missing driver (the host's driver version, e.g. '580.159')")
            continue
        drv = _scalar(ctx, keys["driver"][1], f"hosts.{name}.driver")
        if drv is not None and not re.match(r"^\d{3}(\.\d+){0,2}$", drv):
            ctx.err(keys["driver"][1], f"hosts.{name}.driver: {drv!r} is not a driver version (e.g. 580.159.04)")
            continue
        label = _scalar(ctx, keys["label"][1], f"hosts.{name}.label") if "label" in keys else name
        cuda = _version(ctx, keys["cuda"][1], f"hosts.{name}.cuda") if "cuda" in keys else None
        if drv is None or label is None:
            continue
        out.append(Host(name=name, driver=drv, label=label, cuda=cuda))
    return tuple(out)


# --------------------------------------------------------------------------- loading


def load(path: str | Path) -> Matrix:
    """Parse and validate a matrix file; raise :class:`ConfigError` listing every problem."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the matrix file: {e.strerror}") from e
    return loads(raw.decode("utf-8", errors="replace"), str(path), sha256=hashlib.sha256(raw).hexdigest())


def loads(text: str, filename: str = "<matrix>", *, sha256: str | None = None) -> Matrix:
    ctx = _Ctx(filename)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise ConfigError([Problem(filename, line, col, f"malformed YAML: {e.problem or e.context}")]) from None
    except yaml.YAMLError as e:
        raise ConfigError([Problem(filename, 1, 1, f"malformed YAML: {e}")]) from None
    if root is None or not isinstance(root, MappingNode):
        raise ConfigError([Problem(filename, 1, 1, "a matrix file is a mapping with at least `runtimes` and `drivers`")])
    top = _pairs(ctx, root, TOP_KEYS, "matrix")

    def section(key: str, fn: Callable[[_Ctx, Node], tuple[T, ...]]) -> tuple[T, ...]:
        return fn(ctx, top[key][1]) if key in top else ()

    version = 1
    if "version" in top:
        v = _int(ctx, top["version"][1], "version")
        if v is not None and v != 1:
            ctx.err(top["version"][1], f"version: this cumatrix reads version 1 matrix files, not {v}")
        version = v or 1
    for required in ("runtimes", "drivers"):
        if required not in top:
            ctx.err(root, f"matrix: missing required key {required!r}")
    rts = section("runtimes", _runtimes_section)
    drivers = section("drivers", _drivers_section)
    builds: list[CudaVersion] = []
    bitems = []
    for b in (_list(ctx, top["builds"][1], "builds") if "builds" in top else []):
        v2 = _version(ctx, b, "builds[]")
        if v2 is not None:
            builds.append(v2)
            bitems.append((str(v2), b))
    _names(ctx, bitems, "build")
    variants: list[str] = []
    vitems = []
    for item in (_list(ctx, top["variants"][1], "variants") if "variants" in top else []):
        name = _scalar(ctx, item, "variants[]")
        if name is None:
            continue
        if name not in VARIANT_FAMILIES:
            ctx.err(item, f"variants: unknown variant {name!r}{did_you_mean(name, VARIANT_FAMILIES)}; known: {', '.join(VARIANT_FAMILIES)}")
            continue
        vitems.append((name, item))
        variants.append(name)
    _names(ctx, vitems, "variant")
    workloads = section("workloads", _workloads_section)
    cases = section("cases", _cases_section)
    hosts = section("hosts", _hosts_section)
    probe = True
    if "probe" in top:
        pv = _scalar(ctx, top["probe"][1], "probe")
        probe = pv is None or pv.lower() in ("true", "yes", "on")
    if variants and not (builds and workloads):
        ctx.err(top["variants"][0], "variants need `builds` (header versions) and `workloads` to make swap cells")

    excludes: list[Selector] = []
    for item in (_list(ctx, top["exclude"][1], "exclude") if "exclude" in top else []):
        if isinstance(item, MappingNode):
            excludes.append(_selector(ctx, item, "exclude[]")[0])
        else:
            ctx.err(item, f"exclude[]: expected a mapping of axis: value, got {_kind(item)}")
    expects: list[ExpectOverride] = []
    for item in (_list(ctx, top["expect"][1], "expect") if "expect" in top else []):
        if not isinstance(item, MappingNode):
            ctx.err(item, f"expect[]: expected a mapping of axis: value plus outcome, got {_kind(item)}")
            continue
        sel, keys = _selector(ctx, item, "expect[]", extra=("outcome", "reason"))
        if "outcome" not in keys:
            ctx.err(item, "expect[]: missing `outcome` (e.g. outcome: \"crash:SIGSEGV\")")
            continue
        onode = keys["outcome"][1]
        words = [_scalar(ctx, n, "expect.outcome") for n in onode.value] if isinstance(onode, SequenceNode) else [_scalar(ctx, onode, "expect.outcome")]
        good = True
        for w in words:
            if w is not None and not OUTCOME_RE.match(w):
                ctx.err(onode, f"expect.outcome: {w!r} is not an outcome (ok, ok:batch, cuda-error:N, crash:SIGSEGV, undefined-symbol:NAME, exit:N, timeout, ...)")
                good = False
        reason = _scalar(ctx, keys["reason"][1], "expect.reason") if "reason" in keys else None
        if good and all(words):
            expects.append(ExpectOverride(selector=sel, outcomes=frozenset(w for w in words if w),
                                          reason=reason or f"matrix override (line {sel.line})"))

    if ctx.problems:
        raise ConfigError(ctx.problems)
    m = Matrix(path=filename, sha256=sha256 or hashlib.sha256(text.encode()).hexdigest(), version=version,
               runtimes=rts, drivers=drivers, builds=tuple(builds), variants=tuple(variants),
               workloads=workloads, cases=cases, exclude=tuple(excludes), expect=tuple(expects),
               hosts=hosts, probe=probe)
    _check_selectors(ctx, m, top)
    if ctx.problems:
        raise ConfigError(ctx.problems)
    return m


def _check_selectors(ctx: _Ctx, m: Matrix, top: dict[str, tuple[Node, Node]]) -> None:
    """Excludes that empty the matrix, and expects that select nothing, are errors."""
    everything = list(expand(m, apply_exclude=False))
    if not everything:
        ctx.err(top.get("drivers", top.get("runtimes", (None, None)))[1],
                "the matrix has no cells: add cases, or variants with builds and workloads, or keep the probe")
        return
    kept = [c for c in everything if not any(s.matches(c) for s in m.exclude)]
    for sel in m.exclude:
        if not any(sel.matches(c) for c in everything):
            ctx.problems.append(Problem(ctx.file, sel.line, sel.col, f"exclude selects no cell: {_sel_text(sel)}{_axis_hint(sel, everything)}"))
    if m.exclude and not kept:
        first = m.exclude[0]
        ctx.problems.append(Problem(ctx.file, first.line, first.col, "exclude removes every cell of the matrix"))
    for ov in m.expect:
        if not any(ov.selector.matches(c) for c in kept):
            ctx.problems.append(Problem(ctx.file, ov.selector.line, ov.selector.col,
                                        f"expect selects no cell: {_sel_text(ov.selector)}{_axis_hint(ov.selector, kept)}"))


def _sel_text(sel: Selector) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sel.values) + "}"


def _axis_hint(sel: Selector, cells: list[Cell]) -> str:
    for k, v in sel.values:
        known = sorted({c.axes().get(k, "") for c in cells} - {""})
        if v not in known:
            return f" ({k} {v!r} is not in the matrix{did_you_mean(v, known)}; known: {', '.join(known) or 'none'})"
    return ""


# --------------------------------------------------------------------------- expansion


def expand(m: Matrix, *, apply_exclude: bool = True) -> Iterator[Cell]:
    """Every cell of the matrix, in a stable order (driver, runtime, kind, variant, build, workload)."""
    for drv in m.drivers:
        for rt in m.runtimes:
            cells: list[Cell] = []
            if m.probe:
                cells.append(Cell(kind="probe", runtime=rt.name, driver=drv.name))
            cells += [Cell(kind="command", runtime=rt.name, driver=drv.name, case=c) for c in m.cases]
            for variant in m.variants:
                if "runtime" not in VARIANT_FAMILIES[variant]:
                    continue
                for b in m.builds:
                    for w in m.workloads:
                        cells.append(Cell(kind="swap", runtime=rt.name, driver=drv.name, variant=variant,
                                          family="runtime", build=b, workload=w))
            yield from _keep(m, cells, apply_exclude)
        cells = []
        for variant in m.variants:
            if "driver" not in VARIANT_FAMILIES[variant]:
                continue
            for b in m.builds:
                for w in m.workloads:
                    cells.append(Cell(kind="swap", runtime=NO_RUNTIME, driver=drv.name, variant=variant,
                                      family="driver", build=b, workload=w))
        yield from _keep(m, cells, apply_exclude)


def _keep(m: Matrix, cells: list[Cell], apply_exclude: bool) -> Iterator[Cell]:
    for c in cells:
        if not apply_exclude or not any(s.matches(c) for s in m.exclude):
            yield c


def cells(m: Matrix) -> list[Cell]:
    return list(expand(m))
