"""The JSON Schemas shipped in ``cumatrix/data/``, checked against a :class:`~cumatrix.load.yamldoc.Doc`.

Two maintained validators, each where it is fastest: ``fastjsonschema`` gives the verdict
(it compiles a schema to Python once per process; 0.08 s for 10,000 cases, where
``jsonschema`` takes 0.6 s), and only a document it refuses is walked by ``jsonschema``,
whose errors carry the path of the value they concern.  Each error becomes a
:class:`~cumatrix.core.errors.Problem` at that value's ``file:line:col``, in the house words
(``cases[0].timeout: expected seconds > 0 ..., got float .nan``, ``unknown key 'agrv' (did you
mean 'argv'?)``), with a schema's ``errorMessage`` annotation where it has one.

Two readings are the schema dialect's (ECMA-262, JSON), not Python's: a pattern's ``$`` ends
the string (Python's also matches before a final newline), and a number is finite (YAML has
``.nan`` and ``.inf``; JSON has neither).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from cumatrix.core.errors import Problem, did_you_mean
from cumatrix.load.yamldoc import Doc, Path

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

_TYPE_WORDS = {"object": "a mapping", "array": "a list", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "nothing"}
#: Keywords about one value: only the first that fails is reported (a value that is no
#: string is not also said to miss a pattern).
_VALUE_KEYWORDS = ("type", "const", "enum", "pattern", "minLength", "maxLength", "minimum", "exclusiveMinimum",
                   "maximum", "minItems", "minProperties", "maxProperties")


@cache
def schema(name: str) -> Mapping[str, Any]:
    """A JSON Schema shipped in ``cumatrix/data/``."""
    loaded: Mapping[str, Any] = json.loads(resources.files("cumatrix").joinpath(f"data/{name}").read_text())
    return loaded


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


def where_text(path: Path) -> str:
    """``cases[1].timeout`` for a path."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def check(doc: Doc, schema_name: str, root_name: str) -> tuple[list[Problem], set[Path]]:
    """Problems of ``doc`` against a shipped schema (in file order), and the paths they concern."""
    if doc.finite and _verdict(schema_name)(doc.data):
        return [], set()
    words = _Words(doc, root_name)
    for error in _validator(schema_name).iter_errors(doc.data):
        words.add(error)
    words.problems.sort(key=lambda p: (p.line, p.col))
    return words.problems, words.bad_paths


def _dialect(s: Any) -> Any:
    """A schema with every ``pattern`` anchored as ECMA-262 anchors it (``$``: the end, not
    before a final newline), for a validator that runs patterns with Python's :mod:`re`."""
    if isinstance(s, dict):
        return {k: re.sub(r"(?<!\\)\$", r"\\Z", v) if k == "pattern" and isinstance(v, str) else _dialect(v)
                for k, v in s.items()}
    if isinstance(s, list):
        return [_dialect(v) for v in s]
    return s


@cache
def _verdict(schema_name: str) -> Callable[[Any], bool]:
    """Yes or no for a whole document, compiled once a process (``$`` ends the string here too)."""
    import fastjsonschema  # deferred: compiled only where a matrix is parsed, not read back

    validate = fastjsonschema.compile(dict(schema(schema_name)))

    def verdict(data: Any) -> bool:
        try:
            validate(data)
        except fastjsonschema.JsonSchemaValueException:
            return False
        return True

    return verdict


def _finite_number(_checker: Any, value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and (not isinstance(value, float) or math.isfinite(value)))


def _finite_integer(checker: Any, value: Any) -> bool:
    return _finite_number(checker, value) and float(value).is_integer()


@cache
def _validator(schema_name: str) -> Validator:
    """A ``jsonschema`` validator of the schema, in its dialect (finite numbers, ECMA ``$``)."""
    from jsonschema import validators  # deferred: 0.1 s to import, for a document with problems only

    base = validators.validator_for(schema(schema_name))
    types = base.TYPE_CHECKER.redefine_many({"number": _finite_number, "integer": _finite_integer})
    cls = validators.extend(base, type_checker=types)
    return cls(_dialect(schema(schema_name)))


class _Words:
    """``jsonschema`` errors -> located problems in the house words."""

    def __init__(self, doc: Doc, root_name: str) -> None:
        self.doc = doc
        self.root_name = root_name
        self.problems: list[Problem] = []
        self.bad_paths: set[Path] = set()
        self._said: set[tuple[Path, bool]] = set()  # (path, about a key): one value problem each

    def report(self, path: Path, message: str, *, key: bool = False, subject: Path | None = None) -> None:
        self.bad_paths.add(path)
        name = where_text(path if subject is None else subject) or self.root_name
        self.problems.append(self.doc.problem(path, f"{name}: {message}", key=key))

    def add(self, e: ValidationError) -> None:
        path: Path = tuple(e.absolute_path)
        if "propertyNames" in e.relative_schema_path:  # the key is the instance; the path, its mapping's
            self.bad_key(path, e)
        elif e.validator == "additionalProperties" and e.validator_value is False:
            self.unknown_keys(path, e.instance, e.schema)
        elif e.validator == "required":
            self.missing_keys(path, e.validator_value, e.instance)
        elif e.validator in _VALUE_KEYWORDS:
            if (path, False) not in self._said:
                self._said.add((path, False))
                self.report(path, self.value_words(e.validator, e.validator_value, e.instance, e.schema))
        else:  # a keyword the shipped schemas do not use yet: jsonschema's own words
            self.report(path, e.message)

    def bad_key(self, path: Path, e: ValidationError) -> None:
        """A key of the mapping at ``path`` that its ``propertyNames`` refuse, said once a key."""
        key = str(e.instance)
        if (at := (*path, key), True) in self._said:
            return
        self._said.add((at, True))
        detail = self.value_words(e.validator, e.validator_value, e.instance, e.schema)
        self.report(at, f"key {key!r}: {detail}", key=True, subject=path)

    def missing_keys(self, path: Path, required: Sequence[str], value: Any) -> None:
        """Every required key the mapping at ``path`` lacks, said once (one error a missing key)."""
        if (path, False) in self._said or not isinstance(value, dict):
            return
        self._said.add((path, False))  # one error a missing key: each said once, here
        for k in required:
            if k not in value:
                self.report(path, f"missing required key {k!r}")

    def unknown_keys(self, path: Path, value: Mapping[str, Any], s: Mapping[str, Any]) -> None:
        props: Mapping[str, Any] = s.get("properties", {})
        for k in value:
            if k not in props:
                self.report((*path, k), f"unknown key {k!r}{did_you_mean(k, props)}; allowed: {', '.join(props)}",
                            key=True, subject=path)

    @staticmethod
    def value_words(keyword: str, wanted: Any, value: Any, s: Mapping[str, Any]) -> str:
        """What is wrong with one value, by the keyword it fails."""
        custom = s.get("errorMessage")
        if keyword == "enum":
            return _enum_words(wanted, value)
        if keyword == "type":
            default = _type_words(wanted, value)
        else:
            default = _DEFAULTS[keyword](s) if keyword in _DEFAULTS else keyword
        return f"expected {custom or default}, got {kind(value)}"


def _enum_words(wanted: Any, value: Any) -> str:
    """A value that is none of ``wanted``: it, the nearest of them, and all of them."""
    hint = did_you_mean(value, [str(c) for c in wanted]) if isinstance(value, str) else ""
    return f"{value!r}{hint}; one of {', '.join(str(c) for c in wanted)}"


def _type_words(wanted: str | Sequence[str], value: Any) -> str:
    """The type(s) ``wanted`` in words; a number where a string may go is told to quote it."""
    names = [wanted] if isinstance(wanted, str) else list(wanted)
    number = _finite_number(None, value)
    hint = " (quote it to make it a string)" if "string" in names and number else ""
    return " or ".join(_TYPE_WORDS[t] for t in names) + hint


_DEFAULTS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "const": lambda s: json.dumps(s["const"]),
    "pattern": lambda s: f"a string matching {s['pattern']}",
    "minLength": lambda s: f"a string of {s.get('minLength', 0)} to {s.get('maxLength')} characters",
    "maxLength": lambda s: f"a string of {s.get('minLength', 0)} to {s.get('maxLength')} characters",
    "minimum": lambda _: "a number in range",
    "exclusiveMinimum": lambda _: "a number in range",
    "maximum": lambda _: "a number in range",
    "minItems": lambda s: f"a list of at least {s['minItems']} items",
    "minProperties": lambda s: f"a mapping of {s.get('minProperties', 0)} to {s.get('maxProperties', 'any')} keys",
    "maxProperties": lambda s: f"a mapping of {s.get('minProperties', 0)} to {s.get('maxProperties', 'any')} keys",
}


def keywords(s: Any) -> Iterable[str]:
    """Every keyword used anywhere in a schema (the tests hold the shipped schemas to those
    whose errors this module words)."""
    if isinstance(s, Mapping):
        for k, v in s.items():
            yield str(k)
            if k in ("properties", "$defs"):
                for sub in v.values():
                    yield from keywords(sub)
            elif k not in ("enum", "const", "required", "type", "examples", "default"):
                yield from keywords(v)
