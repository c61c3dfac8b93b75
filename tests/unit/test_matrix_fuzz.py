"""Fuzzing the matrix loader: any input is a Matrix or a located ConfigError, never a traceback.

Seeded (derandomized) and bounded, so a CI run is repeatable and takes seconds.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cumatrix.core.errors import ConfigError
from cumatrix.core.model import Matrix
from cumatrix.load import matrix as M
from cumatrix.load import yamldoc
from helpers.trees import paths

FUZZ = settings(max_examples=400, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])

VALID = """\
version: 1
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
  cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}
drivers: [host, emulated-12.4]
builds: ["12.8", "13.0"]
variants: [proc-address, runtime-dispatch, loop]
workloads:
  - {name: kv-16k-d2h, direction: d2h, block_bytes: 16KiB, blocks: 1024, layers: 32}
cases:
  - {name: smoke, argv: [python3, -c, "import ctypes"], timeout: 30, env: {A: b}}
  - name: shell
    argv: "sh -c 'exit 0'"
exclude: [{runtime: cu13.0, driver: emulated-12.4}]
expect:
  - {variant: runtime-dispatch, runtime: cu12.9, outcome: [ok, "cuda-error:35"]}
hosts:
  h200: {driver: "580.159", label: gpu, cuda: "13.0"}
"""

# Characters that matter to YAML's grammar, and ones a loader must refuse.
SYNTAX = [*"[]{}:,-&*!|>'\"#%@`?\n \t.0", "\0", "\x01", "\x7f", "\ufeff", "é", "\u2028", "\\"]


def _loads(text: str) -> Matrix | None:
    try:
        return M.loads(text, "f.yaml")
    except ConfigError as e:
        _check_refusal(e, text)
        return None


def _check_refusal(e: ConfigError, text: str) -> None:
    """A refusal is exit 2 with at least one problem, each placed inside the document."""
    assert e.exit_code == 2
    assert e.problems, str(e)
    for p in e.problems:
        assert p.file == "f.yaml", p
        assert p.line >= 1, p
        assert p.col >= 1, p
        assert p.line <= text.count("\n") + 2, (p, text)


def test_valid_base_loads() -> None:
    assert isinstance(_loads(VALID), Matrix)


@FUZZ
@given(st.text(max_size=300))
def test_arbitrary_text(text: str) -> None:
    _loads(text)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID)), st.integers(0, 3), st.sampled_from(SYNTAX)), max_size=6))
def test_mutated_valid_matrix(edits: list[tuple[int, int, str]]) -> None:
    text = VALID
    for pos, cut, ch in edits:
        at = min(pos, len(text))
        text = text[:at] + ch + text[at + cut:]
    _loads(text)


@FUZZ
@given(st.binary(max_size=200))
def test_arbitrary_bytes(raw: bytes) -> None:
    try:
        text = yamldoc.decode(raw, "f.yaml")
    except ConfigError as e:
        _check_decode_refusal(e)
        return
    _loads(text)


def _check_decode_refusal(e: ConfigError) -> None:
    assert e.problems
    assert e.problems[0].line >= 1


_leaf = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
         | st.sampled_from(["host", "emulated-12.4", "12.8", "99.0", "d2h", "ok", "crash:SIGSEGV", "loop", "16KiB",
                            12, 7, 0, -1, 13.0, 100.5, 12.10]))
_tree = st.recursive(_leaf, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
    st.sampled_from(["runtimes", "drivers", "builds", "variants", "workloads", "cases", "exclude", "expect", "hosts",
                     "probe", "name", "argv", "timeout", "env", "wheel", "outcome", "runtime"]) | st.text(max_size=8),
    kids, max_size=5), max_leaves=20)


@FUZZ
@given(_tree)
def test_structured_documents(data: Any) -> None:
    _loads(yaml.safe_dump(data, allow_unicode=True))


@FUZZ
@given(st.integers(65, 3000), st.sampled_from(["[", "{a: ", "- "]))
def test_deep_nesting_is_refused_at_its_place(depth: int, opener: str) -> None:
    text = "".join("  " * i + "-\n" for i in range(depth)) if opener == "- " else "x: " + opener * depth
    with pytest.raises(ConfigError) as refused:  # a document nested past the limit does not load
        M.loads(text, "f.yaml")
    e = refused.value
    assert any("nested deeper than" in p.message for p in e.problems) or "malformed" in str(e), str(e)


@settings(FUZZ, max_examples=200)
@given(st.data())
def test_mutated_valid_document(data: st.DataObject) -> None:
    doc = yaml.safe_load(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        path = data.draw(st.sampled_from(paths(doc)[1:]))
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        if data.draw(st.booleans()):
            parent[path[-1]] = data.draw(_tree)
        else:
            del parent[path[-1]]
    _loads(yaml.safe_dump(doc, allow_unicode=True))


HOSTILE_SCALARS = [None, True, 0, -1, 7, 12, 13.0, 100.5, 1e308, "", "\0", "a\n", "x/y", "12", "99.0", "host",
                   [], {}, ["12.8"], {"a": 1}]


def test_every_value_replaced_by_every_hostile_scalar() -> None:
    """Exhaustive, not sampled: each value of a valid matrix swapped for each hostile value."""
    base = yaml.safe_load(VALID)
    for path in paths(base)[1:]:
        for value in HOSTILE_SCALARS:
            doc = yaml.safe_load(VALID)
            parent = doc
            for p in path[:-1]:
                parent = parent[p]
            parent[path[-1]] = value
            _loads(yaml.safe_dump(doc, allow_unicode=True))
