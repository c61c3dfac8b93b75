"""The shipped schemas: valid JSON Schema, and the fast verdict (fastjsonschema) agrees with the
validator that words the problems (jsonschema), in the schemas' dialect."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cumatrix.load import matrix as M
from cumatrix.load import schema as S
from cumatrix.load import yamldoc
from helpers.trees import paths

jsonschema = pytest.importorskip("jsonschema")

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
SCHEMAS = ("matrix.schema.json", "bugs.schema.json")


def _schema(name: str) -> dict[str, Any]:
    return json.loads(resources.files("cumatrix").joinpath(f"data/{name}").read_text())


@pytest.mark.parametrize("name", SCHEMAS)
def test_shipped_schema_is_draft_2020_12_and_uses_only_worded_keywords(name: str) -> None:
    schema = _schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    worded = {*S._VALUE_KEYWORDS, "required", "additionalProperties", "propertyNames", "properties", "items", "$ref"}
    annotations = {"$schema", "$id", "$defs", "$comment", "title", "description", "default", "examples",
                   "markdownDescription", "errorMessage"}
    assert set(S.keywords(schema)) - worded - annotations == set()


def test_schema_path_is_the_installed_file() -> None:
    assert json.loads(M.schema_path().read_text()) == _schema("matrix.schema.json")


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_examples_follow_the_schema_by_both_evaluators(example: Path) -> None:
    doc = yamldoc.parse(example.read_text(), str(example))
    assert S.check(doc, "matrix.schema.json", "matrix")[0] == []
    jsonschema.Draft202012Validator(_schema("matrix.schema.json")).validate(doc.data)
    M.load(example)


# A valid matrix as data; mutations of it probe every branch of the schema.
BASE: dict[str, Any] = {
    "version": 1,
    "runtimes": {"cu12.9": {"wheel": "nvidia-cuda-runtime-cu12==12.9.79"}, "site": {"site": True}},
    "drivers": ["host", "emulated-12.4"],
    "builds": ["12.8", 13.0],
    "variants": ["proc-address", "loop"],
    "workloads": [{"name": "w", "direction": "d2h", "block_bytes": "16KiB", "blocks": 4, "layers": 2}],
    "cases": [{"name": "c", "argv": ["echo", 1], "timeout": 2.5, "env": {"A": "b", "N": 3}}],
    "exclude": [{"runtime": "cu12.9", "driver": "host"}],
    "expect": [{"variant": "loop", "outcome": ["ok", "exit:1"], "reason": "r"}],
    "hosts": {"h": {"driver": "580.159", "label": "gpu", "cuda": "13.0"}},
    "probe": True,
}

_scalars = (st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=10)
            | st.sampled_from(["host", "12.8", "d2h", "ok", "a=b", "a\0", "x/y", "16KiB", "-1", "loop"]))
_values = st.recursive(_scalars, lambda kids: st.lists(kids, max_size=3)
                       | st.dictionaries(st.sampled_from(["name", "argv", "wheel", "x", "outcome", "driver"]) | st.text(max_size=6),
                                         kids, max_size=3), max_leaves=6)


def _mutate(doc: Any, path: tuple[Any, ...], op: str, new: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    if not path:
        return new
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    if op == "delete":
        del parent[path[-1]]
    elif op == "add" and isinstance(parent, dict):
        parent[f"{path[-1]}x"] = new
    else:
        parent[path[-1]] = new
    return doc


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return all(_finite(v) for v in items)


def _problems(name: str, doc: Any) -> list[Any]:
    return S.check(yamldoc.Doc(file="m", data=doc, finite=_finite(doc)), name, "m")[0]


@settings(max_examples=300, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_schema_verdicts_agree_with_jsonschema(data: st.DataObject) -> None:
    doc: Any = BASE
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths(doc)))
        doc = _mutate(doc, path, data.draw(st.sampled_from(["replace", "delete", "add"])), data.draw(_values))
    theirs = list(jsonschema.Draft202012Validator(_schema("matrix.schema.json")).iter_errors(doc))
    ours = _problems("matrix.schema.json", doc)
    # The dialect's '$' (see below) is the one place where the two may differ.
    if not _newline_end(doc):
        assert (ours == []) == (theirs == []), (doc, ours, [e.message for e in theirs])
    # The fast verdict that spares valid documents the walk: the same verdict, always.
    assert S._verdict("matrix.schema.json")(doc) == (ours == []), (doc, ours)


def _newline_end(value: Any) -> bool:
    if isinstance(value, str):
        return value.endswith("\n")
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value if isinstance(value, list) else []
    return any(_newline_end(v) for v in items)


@pytest.mark.parametrize("name", ["matrix.schema.json", "bugs.schema.json"])
def test_the_fast_verdict_agrees_with_the_worded_check_on_hostile_values(name: str) -> None:
    hostile = [None, True, False, 0, 1, -1, 1.0, 2.5, math.nan, math.inf, "", "x", "a\n", "a\0", [], [1], {}, {"x": 1}]
    verdict = S._verdict(name)
    validator = S._validator(name)
    docs: list[Any] = list(hostile)
    base = BASE if name == "matrix.schema.json" else json.loads(resources.files("cumatrix").joinpath("data/bugs.json").read_text())
    for path in paths(base)[:: 1 if base is BASE else 4]:  # the catalog is long: every fourth place of it
        for v in hostile:
            docs.append(_mutate(base, path, "replace", v))
            docs.append(_mutate(base, path, "add", v))
        if path:
            docs.append(_mutate(base, path, "delete", None))
    for doc in docs:
        worded = _problems(name, doc)
        assert (worded == []) == validator.is_valid(doc), (doc, worded)
        if _finite(doc):
            assert verdict(doc) == (worded == []), (doc, worded)


def test_the_schema_dialect_is_ecma_and_json() -> None:
    # Python's '$' matches before a final newline; the schema's dialect (ECMA-262) does not,
    # so "c\n" is no name.  JSON has no NaN: a timeout of .nan is no number.
    doc = json.loads(json.dumps(BASE))
    doc["cases"][0]["name"] = "c\n"
    assert jsonschema.Draft202012Validator(_schema("matrix.schema.json")).is_valid(doc)
    assert [p.message for p in _problems("matrix.schema.json", doc)] == [
        ("cases[0].name: expected a name of letters, digits and . _ + - (at most 64, starting with a letter or digit; "
         "no spaces, slashes or control characters), got str 'c\\n'")]
    doc["cases"][0]["name"], doc["cases"][0]["timeout"] = "c", math.nan
    assert [p.message for p in _problems("matrix.schema.json", doc)] == [
        "cases[0].timeout: expected seconds > 0 and at most 604800 (a week), got float .nan"]
