"""YAML (and JSON) input as plain data that remembers where every value came from.

The matrix file and the bug catalog are read here: parsed once, by :mod:`cumatrix.load.yamlfast`
where the text is plain YAML, else with libyaml's C parser where PyYAML has it (the
pure-Python parser otherwise), turned into JSON-shaped data
(dicts, lists, str, int, float, bool, None) while every value's ``line:col`` is kept, then
checked against a JSON Schema shipped in the package.  Semantic checks stay with the
loaders; they locate their problems through :meth:`Doc.where`.

The document is built from parser events without recursion, so hostile input cannot
raise ``RecursionError``: nesting is capped at :data:`MAX_DEPTH` and alias expansion at
:data:`MAX_VALUES` values, each reported at its place like any other problem.

Schemas are evaluated by a predicate compiled from them (:func:`valid`), and where it
refuses a document, by :class:`SchemaCheck`, which implements the Draft 2020-12
keywords the shipped schemas use (the unit tests hold the schemas to that list and
compare verdicts with the ``jsonschema`` package).  Evaluating them here keeps
``jsonschema``'s import (a quarter second) out of every process that loads a matrix,
and lets each message carry the file:line:col and "did you mean" of the house style.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    Event,
    MappingStartEvent,
    ScalarEvent,
)
from yaml.nodes import ScalarNode

from cumatrix.core.errors import ConfigError, Problem, did_you_mean

#: libyaml's parser where PyYAML was built with it; positions are kept either way.
Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_DEPTH = 64
MAX_VALUES = 200_000

Path = tuple[str | int, ...]

# YAML 1.1 printable set (the reader refuses anything else); checked up front so that the
# place is counted in characters: libyaml reports a byte offset into its UTF-8 copy.
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_TAG = "tag:yaml.org,2002:"
_CONSTRUCT = SafeConstructor()
_SCALARS = {
    _TAG + "null": _CONSTRUCT.construct_yaml_null,
    _TAG + "bool": _CONSTRUCT.construct_yaml_bool,
    _TAG + "int": _CONSTRUCT.construct_yaml_int,
    _TAG + "float": _CONSTRUCT.construct_yaml_float,
}
#: Tags whose value stays the text as written (a date is a string to a matrix file).
_TEXT_TAGS = {_TAG + t for t in ("str", "timestamp", "merge", "value", "binary")}


@dataclass(slots=True)
class Doc:
    """A parsed document: ``data`` and where each part of it was written."""

    file: str
    data: Any
    places: dict[Path, tuple[int, int]] = field(default_factory=dict)
    key_places: dict[Path, tuple[int, int]] = field(default_factory=dict)
    texts: dict[Path, str] = field(default_factory=dict)

    def where(self, path: Path) -> tuple[int, int]:
        """``(line, col)`` of the value at ``path``, or of its closest located parent."""
        for n in range(len(path), -1, -1):
            place = self.places.get(path[:n])
            if place is not None:
                return place
        return (1, 1)

    def key_where(self, path: Path) -> tuple[int, int]:
        """``(line, col)`` of the mapping key whose value is at ``path``."""
        return self.key_places.get(path) or self.where(path)

    def text(self, path: Path, value: Any) -> str:
        """A scalar as written (``12.10``, not the float ``12.1``)."""
        return self.texts.get(path, value if isinstance(value, str) else json.dumps(value))

    def problem(self, path: Path, message: str, *, key: bool = False) -> Problem:
        line, col = self.key_where(path) if key else self.where(path)
        return Problem(self.file, line, col, message)


def _mark(m: Any) -> tuple[int, int]:
    return (m.line + 1, m.column + 1) if m is not None else (1, 1)


def _located(file: str, text: str, index: int, message: str) -> ConfigError:
    line = text.count("\n", 0, index) + 1
    col = index - (text.rfind("\n", 0, index) + 1) + 1
    return ConfigError([Problem(file, line, col, message)])


def decode(raw: bytes, file: str) -> str:
    """UTF-8 text of a file, or a :class:`ConfigError` at the first byte that is not."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        head = raw[: e.start].decode("utf-8", errors="replace")
        raise _located(file, head + " ", len(head), f"not UTF-8 text: byte 0x{raw[e.start]:02x}") from None


def parse(text: str, file: str) -> Doc:
    """Parse one YAML (or JSON) document; raise :class:`ConfigError` at the place of a problem."""
    bad = _NOT_PRINTABLE.search(text)
    if bad:
        raise _located(file, text, bad.start(),
                       f"control character U+{ord(bad.group()):04X} is not allowed in a YAML file "
                       "(write it as an escape inside double quotes, e.g. \"\\t\")")
    from cumatrix.load.yamlfast import Unsupported, read

    try:
        return read(text, file, loader=_resolver(), plain_starts=_plain_text_starts(_resolver()), scalars=_SCALARS,
                    text_tags=_TEXT_TAGS, max_depth=MAX_DEPTH)
    except Unsupported:
        pass  # libyaml reads it (and words what is wrong with it)
    return parse_events(text, file)


@cache
def _resolver() -> yaml.SafeLoader:
    """A loader, for its implicit resolvers (the same a parse uses)."""
    return Loader("")


def parse_events(text: str, file: str) -> Doc:
    """:func:`parse` through libyaml's events alone (every document, every error)."""
    loader = Loader(text)
    try:
        return _Builder(file).run(loader)
    except yaml.MarkedYAMLError as e:
        line, col = _mark(e.problem_mark or e.context_mark)
        raise ConfigError([Problem(file, line, col, f"malformed YAML: {e.problem or e.context}")]) from None
    except yaml.YAMLError as e:
        index = getattr(e, "position", 0)
        raise _located(file, text, min(index, len(text)), f"malformed YAML: {str(e).splitlines()[0]}") from None
    finally:
        loader.dispose()


@dataclass(slots=True)
class _Frame:
    path: Path | None  # None: inside an alias's anchor (located at the alias)
    value: dict[str, Any] | list[Any]
    anchor: str | None
    size: int = 1
    key: str | None = None


def _plain_text_starts(loader: yaml.SafeLoader) -> frozenset[str]:
    """First characters of a plain scalar that some implicit resolver of ``loader`` looks at.

    A plain scalar starting with any other character resolves to a string; ``None`` (a
    resolver for every first character) or a path resolver means every scalar is resolved.
    """
    resolvers = loader.yaml_implicit_resolvers
    if None in resolvers or getattr(loader, "yaml_path_resolvers", None):
        return _EVERY_START
    return frozenset(k for k in resolvers if k)


class _Everything(frozenset[str]):
    def __contains__(self, item: object) -> bool:
        return True


_EVERY_START = _Everything()


class _Builder:
    """Parser events -> JSON-shaped data, positions kept; an explicit stack, no recursion."""

    def __init__(self, file: str) -> None:
        self.doc = Doc(file=file, data=None)
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int]] = {}
        self.total = 0
        self.documents = 0
        self.done = False
        self._plain: frozenset[str] = _EVERY_START

    def fail(self, place: tuple[int, int], message: str) -> ConfigError:
        return ConfigError([Problem(self.doc.file, place[0], place[1], message)])

    def run(self, loader: yaml.SafeLoader) -> Doc:
        self._plain = _plain_text_starts(loader)
        scalar, put = ScalarEvent, self.put
        while loader.check_event():
            ev = loader.get_event()  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
            if ev.__class__ is scalar:  # most events: one branch, not the chain below
                put(self.scalar(loader, ev), 1, ev, scalar_text=str(ev.value))
            else:
                self.event(loader, ev)
        return self.doc

    def event(self, loader: yaml.SafeLoader, ev: Event) -> None:
        if isinstance(ev, DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise self.fail(_mark(ev.start_mark), "a second YAML document ('---'): one file holds one document")
        elif isinstance(ev, CollectionStartEvent):
            self.start(ev)
        elif isinstance(ev, ScalarEvent):
            self.put(self.scalar(loader, ev), 1, ev, scalar_text=str(ev.value))
        elif isinstance(ev, AliasEvent):
            self.alias(ev)
        elif ev.__class__.__name__ in ("MappingEndEvent", "SequenceEndEvent"):
            frame = self.stack.pop()
            if frame.anchor is not None:
                self.anchors[frame.anchor] = (frame.value, frame.size)
            self.put(frame.value, frame.size, ev, placed=True)

    def child_path(self) -> Path | None:
        if not self.stack:
            return ()
        top = self.stack[-1]
        if top.path is None:
            return None
        if isinstance(top.value, list):
            return (*top.path, len(top.value))
        return (*top.path, top.key) if top.key is not None else None

    def start(self, ev: CollectionStartEvent) -> None:
        place = _mark(ev.start_mark)
        if len(self.stack) >= MAX_DEPTH:
            raise self.fail(place, f"nested deeper than {MAX_DEPTH} levels")
        if self.stack and isinstance(self.stack[-1].value, dict) and self.stack[-1].key is None:
            raise self.fail(place, "mapping keys must be plain names, not lists or mappings")
        if ev.tag not in (None, "!", _TAG + "map", _TAG + "seq") and not ev.implicit:
            raise self.fail(place, f"unsupported YAML tag {ev.tag!r}")
        path = self.child_path()
        if path is not None:
            self.doc.places[path] = place
        value: dict[str, Any] | list[Any] = {} if isinstance(ev, MappingStartEvent) else []
        self.stack.append(_Frame(path=path, value=value, anchor=ev.anchor))

    def scalar(self, loader: yaml.SafeLoader, ev: ScalarEvent) -> Any:
        value, implicit = ev.value, ev.implicit
        tag = ev.tag if ev.tag not in (None, "!") and not implicit[0] else None
        if tag is None:
            if implicit[0] and value[:1] not in self._plain and value:
                return str(value)  # a plain scalar no implicit resolver looks at: a string
            tag = loader.resolve(ScalarNode, value, implicit)  # type: ignore[no-untyped-call]  # untyped in types-PyYAML
        if tag in _TEXT_TAGS:
            return str(value)
        construct = _SCALARS.get(tag)
        if construct is None:
            raise self.fail(_mark(ev.start_mark), f"unsupported YAML tag {tag!r}")
        try:
            return construct(ScalarNode(tag, ev.value))  # marks unused: problems are located here
        except (ValueError, OverflowError, yaml.YAMLError) as e:
            raise self.fail(_mark(ev.start_mark), f"cannot read {ev.value[:40]!r} as {tag.rsplit(':', 1)[-1]}: {e}") from None

    def alias(self, ev: AliasEvent) -> None:
        place = _mark(ev.start_mark)
        if ev.anchor not in self.anchors:
            inside = any(f.anchor == ev.anchor for f in self.stack)
            raise self.fail(place, f"alias *{ev.anchor} " + ("refers to a collection that contains it" if inside
                                                              else "names no anchor defined before it"))
        value, size = self.anchors[ev.anchor]
        self.total += size
        if self.total > MAX_VALUES:
            raise self.fail(place, f"aliases expand the document past {MAX_VALUES} values")
        self.put(value, size, ev)

    def put(self, value: Any, size: int, ev: Event, *, placed: bool = False, scalar_text: str | None = None) -> None:
        place = _mark(ev.start_mark)
        anchor = getattr(ev, "anchor", None)
        if scalar_text is not None:
            self.total += 1
            if anchor is not None:
                self.anchors[anchor] = (value, 1)
        if not self.stack:
            self.doc.data = value
            self.doc.places.setdefault((), place)
            return
        top = self.stack[-1]
        if isinstance(top.value, dict) and top.key is None:
            self.mapping_key(top, place, scalar_text)
            return
        top.size += size
        path = self.child_path()
        if path is not None and not placed:
            self.doc.places[path] = place
            if scalar_text is not None and not isinstance(value, str):
                self.doc.texts[path] = scalar_text
        if isinstance(top.value, list):
            top.value.append(value)
        else:
            assert top.key is not None  # a mapping frame with a value pending has its key
            top.value[top.key] = value
            top.key = None

    def mapping_key(self, top: _Frame, place: tuple[int, int], text: str | None) -> None:
        if text is None:
            raise self.fail(place, "mapping keys must be plain names (not an alias)")
        if text in top.value:
            raise self.fail(place, f"duplicate key {text!r}")
        top.key = text
        if top.path is not None:
            self.doc.key_places[(*top.path, text)] = place


# --------------------------------------------------------------------------- schemas


@cache
def schema(name: str) -> Mapping[str, Any]:
    """A JSON Schema shipped in ``cumatrix/data/``."""
    loaded: Mapping[str, Any] = json.loads(resources.files("cumatrix").joinpath(f"data/{name}").read_text())
    return loaded


#: Keywords :class:`SchemaCheck` evaluates; every other keyword in a schema is an annotation.
KEYWORDS = frozenset({"$ref", "type", "enum", "const", "pattern", "minLength", "maxLength", "minimum",
                      "exclusiveMinimum", "maximum", "items", "minItems", "required", "properties",
                      "additionalProperties", "propertyNames", "minProperties", "maxProperties"})
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description", "default",
                         "examples", "markdownDescription", "errorMessage"})
_TYPE_WORDS = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "nothing"}


def kind(value: Any) -> str:
    """How a value reads in a message: ``a list``, ``str 'host'``, ``int 3``, ``empty``."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "empty"
    if isinstance(value, float) and not math.isfinite(value):
        return f"float {'.nan' if math.isnan(value) else ('-' if value < 0 else '') + '.inf'}"
    return f"{type(value).__name__} {value!r}"


def _is(value: Any, t: str) -> bool:
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    if t == "string":
        return isinstance(value, str)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "null":
        return value is None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False  # JSON has no NaN or infinity: a timeout of .nan is not a number
    return t == "number" or float(value).is_integer()


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 and 1.0 are one number; true is not 1."""
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    # ECMA-262 '$' (the schema's dialect) ends the string; Python's also matches before a
    # final newline, which would let a name ending in "\n" through.
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern))


def where_text(path: Path) -> str:
    """``cases[1].timeout`` for a path."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


class SchemaCheck:
    """Every place where a document breaks a schema, as :class:`Problem` objects."""

    def __init__(self, doc: Doc, root_schema: Mapping[str, Any], root_name: str) -> None:
        self.doc = doc
        self.root = root_schema
        self.root_name = root_name
        self.problems: list[Problem] = []
        self.bad_paths: set[Path] = set()
        self._resolved: dict[int, Mapping[str, Any]] = {}

    def run(self) -> list[Problem]:
        self.check(self.doc.data, self.root, ())
        return self.problems

    def report(self, path: Path, message: str, *, key: bool = False, subject: Path | None = None) -> None:
        self.bad_paths.add(path)
        name = where_text(path if subject is None else subject) or self.root_name
        self.problems.append(self.doc.problem(path, f"{name}: {message}", key=key))

    def expected(self, value: Any, s: Mapping[str, Any], path: Path, default: str) -> None:
        self.report(path, f"expected {s.get('errorMessage') or default}, got {kind(value)}")

    def resolve(self, s: Mapping[str, Any]) -> Mapping[str, Any]:
        if "$ref" not in s:
            return s
        key = id(s)
        hit = self._resolved.get(key)
        if hit is None:
            hit = self._resolved[key] = self._follow(s)
        return hit

    def _follow(self, s: Mapping[str, Any]) -> Mapping[str, Any]:
        while "$ref" in s:
            ref = str(s["$ref"])
            target: Any = self.root
            for part in ref.removeprefix("#/").split("/"):
                target = target[part]
            s = {**{k: v for k, v in s.items() if k != "$ref"}, **target}
        return s

    def check(self, value: Any, s: Mapping[str, Any], path: Path) -> None:
        s = self.resolve(s)
        types = s.get("type")
        if types is not None:
            names = [types] if isinstance(types, str) else list(types)
            if not any(_is(value, t) for t in names):
                hint = " (quote it to make it a string)" if "string" in names and _is(value, "number") else ""
                self.expected(value, s, path, " or ".join(_TYPE_WORDS[t] for t in names) + hint)
                return
        if not self.check_value(value, s, path):
            return
        if isinstance(value, dict):
            self.check_object(value, s, path)
        elif isinstance(value, list):
            self.check_array(value, s, path)

    def check_value(self, value: Any, s: Mapping[str, Any], path: Path) -> bool:
        if "const" in s and not _same(value, s["const"]):
            self.expected(value, s, path, json.dumps(s["const"]))
            return False
        choices = s.get("enum")
        if choices is not None and not any(_same(value, c) for c in choices):
            hint = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
            words = ", ".join(str(c) for c in choices)
            self.report(path, f"{value!r}{hint}; one of {words}")
            return False
        if isinstance(value, str):
            return self.check_string(value, s, path)
        if _is(value, "number"):
            low, excl, high = s.get("minimum"), s.get("exclusiveMinimum"), s.get("maximum")
            if (low is not None and value < low) or (excl is not None and value <= excl) or (
                    high is not None and value > high):
                self.expected(value, s, path, "a number in range")
                return False
        return True

    def check_string(self, value: str, s: Mapping[str, Any], path: Path) -> bool:
        pattern = s.get("pattern")
        if pattern is not None and not _regex(str(pattern)).search(value):
            self.expected(value, s, path, f"a string matching {pattern}")
            return False
        if len(value) < s.get("minLength", 0) or len(value) > s.get("maxLength", len(value)):
            self.expected(value, s, path, f"a string of {s.get('minLength', 0)} to {s.get('maxLength')} characters")
            return False
        return True

    def check_array(self, value: list[Any], s: Mapping[str, Any], path: Path) -> None:
        if len(value) < s.get("minItems", 0):
            self.expected(value, s, path, f"a list of at least {s['minItems']} items")
        items = s.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                self.check(item, items, (*path, i))

    def check_object(self, value: dict[str, Any], s: Mapping[str, Any], path: Path) -> None:
        props: Mapping[str, Any] = s.get("properties", {})
        extra = s.get("additionalProperties", True)
        names = s.get("propertyNames")
        for key, item in value.items():
            if names is not None and not self._key_ok(key, names, (*path, key)):
                continue
            if key in props:
                self.check(item, props[key], (*path, key))
            elif extra is False:
                self.report((*path, key), f"unknown key {key!r}{did_you_mean(key, props)}; allowed: {', '.join(props)}",
                            key=True, subject=path)
            elif isinstance(extra, Mapping):
                self.check(item, extra, (*path, key))
        missing = [k for k in s.get("required", ()) if k not in value]
        for k in missing:
            self.report(path, f"missing required key {k!r}")
        n = len(value)
        if n < s.get("minProperties", 0) or n > s.get("maxProperties", n):
            self.expected(value, s, path, f"a mapping of {s.get('minProperties', 0)} to {s.get('maxProperties', 'any')} keys")

    def _key_ok(self, key: str, names: Mapping[str, Any], path: Path) -> bool:
        sub = SchemaCheck(self.doc, self.root, self.root_name)
        sub.doc = Doc(file=self.doc.file, data=key)
        sub.check(key, names, ())
        if not sub.problems:
            return True
        detail = sub.problems[0].message.split(": ", 1)[-1]
        self.report(path, f"key {key!r}: {detail}", key=True, subject=path[:-1])
        return False


def check(doc: Doc, schema_name: str, root_name: str) -> tuple[list[Problem], set[Path]]:
    """Problems of ``doc`` against a shipped schema, and the paths they concern.

    A document the compiled predicate accepts has none (the usual case, three times faster);
    any other is walked by :class:`SchemaCheck`, which finds and words every problem.
    """
    if valid(schema_name)(doc.data):
        return [], set()
    chk = SchemaCheck(doc, schema(schema_name), root_name)
    return chk.run(), chk.bad_paths


Predicate = Callable[[Any], bool]


@cache
def valid(schema_name: str) -> Predicate:
    """A shipped schema compiled to one yes/no function: true exactly where :class:`SchemaCheck`
    finds no problem (the unit tests hold the two to the same verdicts)."""
    root = schema(schema_name)
    return _Compiler(root).compile(root)


def _every(tests: list[Predicate]) -> Predicate:
    """One predicate that holds where each of ``tests`` does (no loop over them at each value)."""
    if not tests:
        return lambda v: True
    if len(tests) == 1:
        return tests[0]
    first, rest = tests[0], _every(tests[1:])
    return lambda v: first(v) and rest(v)


class _Compiler:
    """Schema -> nested closures, each doing only what its schema node asks."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.done: dict[int, list[Predicate]] = {}

    def compile(self, s: Mapping[str, Any]) -> Predicate:
        seen = self.done.get(id(s))
        if seen is not None:  # a schema that refers to itself: bound once compiled
            return lambda v: seen[0](v)
        box: list[Predicate] = []
        self.done[id(s)] = box
        box.append(self._node(SchemaCheck(Doc(file="", data=None), self.root, "")._follow(s)))
        return box[0]

    def _node(self, s: Mapping[str, Any]) -> Predicate:
        tests: list[Predicate] = []
        types = s.get("type")
        if types is not None:
            names = (types,) if isinstance(types, str) else tuple(types)
            # Classes that pass whatever their value (a float must be finite, a bool is no number):
            # one set lookup for the usual case, the full rule for the rest.
            sure = {c for t, c in (("object", dict), ("array", list), ("string", str), ("boolean", bool),
                                   ("null", type(None)), ("number", int), ("integer", int)) if t in names}
            tests.append(lambda v: v.__class__ in sure or any(_is(v, t) for t in names))
        if "const" in s:
            const = s["const"]
            tests.append(lambda v: _same(v, const))
        if s.get("enum") is not None:
            choices = tuple(s["enum"])
            tests.append(lambda v: any(_same(v, c) for c in choices))
        string = self._string(s)
        if string is not None:
            tests.append(lambda v: not isinstance(v, str) or string(v))
        low, excl, high = s.get("minimum"), s.get("exclusiveMinimum"), s.get("maximum")
        if (low, excl, high) != (None, None, None):
            tests.append(lambda v: not _is(v, "number") or not (
                (low is not None and v < low) or (excl is not None and v <= excl) or (high is not None and v > high)))
        array = self._array(s)
        if array is not None:
            tests.append(lambda v: not isinstance(v, list) or array(v))
        obj = self._object(s)
        if obj is not None:
            tests.append(lambda v: not isinstance(v, dict) or obj(v))
        return _every(tests)

    @staticmethod
    def _string(s: Mapping[str, Any]) -> Predicate | None:
        pattern, lo, hi = s.get("pattern"), s.get("minLength", 0), s.get("maxLength")
        if pattern is None and not lo and hi is None:
            return None
        search = _regex(str(pattern)).search if pattern is not None else None
        return lambda v: (search is None or search(v) is not None) and lo <= len(v) and (hi is None or len(v) <= hi)

    def _array(self, s: Mapping[str, Any]) -> Predicate | None:
        least, items = s.get("minItems", 0), s.get("items")
        each = self.compile(items) if isinstance(items, Mapping) else None
        if not least and each is None:
            return None
        if each is None:
            return lambda v: len(v) >= least

        def every_item(v: list[Any]) -> bool:
            if len(v) < least:
                return False
            for x in v:
                if not each(x):
                    return False
            return True

        return every_item

    def _object(self, s: Mapping[str, Any]) -> Predicate | None:
        props = {k: self.compile(sub) for k, sub in s.get("properties", {}).items()}
        extra = s.get("additionalProperties", True)
        others: Predicate | None = self.compile(extra) if isinstance(extra, Mapping) else None
        closed = extra is False
        names = self.compile(s["propertyNames"]) if s.get("propertyNames") is not None else None
        required = tuple(s.get("required", ()))
        least, most = s.get("minProperties", 0), s.get("maxProperties")
        if not (props or closed or others or names or required or least or most is not None):
            return None

        def obj(v: dict[str, Any]) -> bool:
            for key, item in v.items():
                if names is not None and not names(key):
                    return False
                test = props.get(key)
                if test is None:
                    if closed or (others is not None and not others(item)):
                        return False
                elif not test(item):
                    return False
            return all(k in v for k in required) and least <= len(v) and (most is None or len(v) <= most)

        return obj


def schema_keywords(s: Any) -> Iterator[str]:
    """Every keyword used anywhere in a schema (for the tests that hold schemas to :data:`KEYWORDS`)."""
    if isinstance(s, Mapping):
        for k, v in s.items():
            yield str(k)
            if k in ("properties", "$defs"):
                for sub in v.values():
                    yield from schema_keywords(sub)
            elif k not in ANNOTATIONS | {"enum", "const", "required", "type"}:
                yield from schema_keywords(v)
