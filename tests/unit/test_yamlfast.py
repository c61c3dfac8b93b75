"""The fast reader of plain YAML against libyaml's events: the same document, or it declines.

Whatever :mod:`cumatrix.load.yamlfast` accepts must come out exactly as the event builder makes it
(data, the place of every value and key, scalars as written); whatever libyaml refuses, it must
decline, so that libyaml words the error.  Checked on every YAML file of the project, on
documents generated from a grammar of block and flow YAML with tricky scalars, and on
random edits of valid documents.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cumatrix.core.errors import ConfigError
from cumatrix.load import yamldoc
from cumatrix.load.yamlfast import Unsupported, read

REPO = Path(__file__).resolve().parents[2]


def fast(text: str) -> yamldoc.Doc:
    r = yamldoc._resolver()
    doc: yamldoc.Doc = read(text, "f", loader=r, plain_starts=yamldoc._plain_text_starts(r), scalars=yamldoc._SCALARS,
                            text_tags=yamldoc._TEXT_TAGS, max_depth=yamldoc.MAX_DEPTH)
    return doc


def agree(text: str) -> str:
    """``same`` or ``declined``; an assertion error where the readers differ."""
    try:
        ours = fast(text)
    except Unsupported:
        return "declined"
    try:
        theirs = yamldoc.parse_events(text, "f")
    except ConfigError as e:
        raise AssertionError(f"the fast reader accepted what libyaml refuses ({e}):\n{text}") from None
    for part in ("data", "places", "key_places", "texts"):
        assert getattr(ours, part) == getattr(theirs, part), (part, text)
    assert repr(ours.data) == repr(theirs.data), text  # 1 and 1.0 and True are equal, yet not the same
    return "same"


def test_every_yaml_file_of_the_project_reads_the_same() -> None:
    files = [REPO / "matrix.yaml", *sorted((REPO / "examples").glob("*.yaml"))]
    assert len(files) > 3
    for f in files:
        assert agree(f.read_text()) == "same", f  # the shipped files are what the fast reader is for


def test_a_generated_matrix_reads_the_same() -> None:
    lines = ["runtimes:", "  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}", "drivers: [host, emulated-12.4]",
             "probe: false", "cases:"]
    for i in range(300):
        lines.append(f"  - {{name: c{i:05d}, argv: [/usr/bin/python3, -c, pass], timeout: {i % 7 + 1}.5}}")
        if i % 50 == 0:
            lines += [f"  - name: 'block{i}'", "    argv:", "    - sh", "    - -c", '    - "echo a, b"',
                      "    env: {A: '1', B: 2, C: ~}  # comment"]
    assert agree("\n".join(lines) + "\n") == "same"


@pytest.mark.parametrize("text", [
    "a: 1\n", "a: [1, 2]\nb: {c: d}\n", "a:\n- 1\n- 2\nb: x\n", "a:\n  - {b: 1}\n  - [c, d]\n",
    "a: b # c\n", "a: 'x # y'\n", "a: \"x, y\"\n", "a: -c\n", "a: [-c, -1, 1e3, 0x1F, .inf, ~, yes, 'no']\n",
    "a: {b: [c, {d: e}], f: []}\n", "a: {}\n", "a:\n  b:\n    c: 1\n", "a: 1:20\n", "a: nvidia/cuda:12.0\n",
    "a: 'it''s'\n", "a: ''\n", "a: <<\n<<: x\n", "a:    spaced   \n", "  a: indented root\n  b: 2\n",
])
def test_plain_documents_read_the_same(text: str) -> None:
    assert agree(text) == "same"


@pytest.mark.parametrize("text", [
    "a: &x 1\nb: *x\n", "a: !!str 1\n", "a: |\n  text\n", "a: >\n  text\n", "a:\nb: 1\n", "a: 1\na: 2\n",
    "a: {b: 1, b: 2}\n", "a: [1,\n  2]\n", "a: b\n  c\n", "--- \na: 1\n", "a: 1\n---\nb: 2\n", "a:\t1\n",
    "a: \"\\t\"\n", "a: é\n", "- a\n- b\n", "a: [a, b,]\n", "a: {b}\n", "a: {b: }\n", "a: b: c\n", "a: [a:b]\n",
    "a: @x\n", "? a\n: b\n", "a: 'open\n", "a: [1]]\n", "a: x\n b: y\n", "%YAML 1.1\n---\na: 1\n", "",
])
def test_what_it_does_not_take_it_declines(text: str) -> None:
    assert agree(text) == "declined"


# --------------------------------------------------------------------------- generated documents

_SCALARS = ["a", "b c", "-c", "-1", "1", "0x1F", "0o17", "1e3", "1.5", "12.10", "~", "null", "Null", "yes", "No", "on",
            "true", "2001-12-14", "<<", "=", "a#b", "a:b", "http://x:1", ":x", "?x", "-", "--x", "'q'", "'it''s'",
            '"dq"', '"a,b"', "''", '""', "a,b", "1:20", ".inf", "-.5", "+1", "0b101", "_1", "!x", "&a", "*a", "%x",
            "@x", "`x", "|", ">", "a b #c", "x ", "[", "]", "{", "}", "a[0]", "#", "12_000", "0.", "."]
_KEYS = ["a", "name", "argv", "b c", "n", "1", "yes", "-k", "k:v", "'q'", "<<", "x#", "="]

_scalar = st.sampled_from(_SCALARS)
_key = st.sampled_from(_KEYS)
_sp = st.sampled_from(["", " ", "  "])


@st.composite
def _flow(draw: st.DrawFn, depth: int = 0) -> str:
    if depth < 2 and draw(st.booleans()):
        items = draw(st.lists(_flow(depth + 1) if draw(st.booleans()) else _scalar, max_size=3))
        return "[" + draw(_sp) + ("," + draw(_sp)).join(items) + draw(_sp) + "]"
    if depth < 2 and draw(st.booleans()):
        pairs = draw(st.lists(st.tuples(_key, _flow(depth + 1) if draw(st.booleans()) else _scalar), max_size=3))
        return "{" + draw(_sp) + ", ".join(f"{k}{draw(_sp)}: {v}" for k, v in pairs) + draw(_sp) + "}"
    return draw(_scalar)


@st.composite
def _block(draw: st.DrawFn, indent: int = 0, depth: int = 0) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if depth > 0 and draw(st.booleans()):  # a sequence
        step = draw(st.sampled_from([0, 2])) if depth else 2
        for _ in range(draw(st.integers(1, 3))):
            how = draw(st.sampled_from(["inline", "nested", "compact"])) if depth < 3 else "inline"
            if how == "inline":
                lines.append(f"{pad}-{draw(st.sampled_from([' ', '  ']))}{draw(_flow())}")
            elif how == "compact":
                inner = draw(_block(indent + 2, depth + 1))
                if inner and not inner[0].lstrip().startswith("-"):
                    lines.append(f"{pad}- {inner[0].lstrip()}")
                    lines += inner[1:]
                else:
                    lines.append(f"{pad}- {draw(_flow())}")
            else:
                lines.append(f"{pad}-")
                lines += draw(_block(indent + step + 2, depth + 1))
        return lines
    for _ in range(draw(st.integers(1, 3))):
        key = draw(_key)
        if depth < 3 and draw(st.booleans()):
            lines.append(f"{pad}{key}:{draw(st.sampled_from(['', ' # note']))}")
            child = indent + draw(st.sampled_from([0, 2, 4]))
            lines += draw(_block(child, depth + 1))
        else:
            lines.append(f"{pad}{key}:{draw(st.sampled_from([' ', '   ']))}{draw(_flow())}"
                         + draw(st.sampled_from(["", " # c", "  ", " #"])))
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), pad + draw(st.sampled_from(["", "# comment", "  "])))
    return lines


@settings(max_examples=1500, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_block())
def test_generated_documents_read_the_same_or_are_declined(lines: list[str]) -> None:
    agree("\n".join(lines) + "\n")


def test_random_edits_of_valid_documents() -> None:
    rng = random.Random(20261203)
    bases = [p.read_text() for p in [REPO / "matrix.yaml", *sorted((REPO / "examples").glob("*.yaml"))]]
    marks = list(" -:,#[]{}'\"\n&*!|>?%@`\\~0aZ.")
    seen = {"same": 0, "declined": 0}
    for _ in range(3000):
        text = rng.choice(bases)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(text))
            op = rng.random()
            if op < 0.4:
                text = text[:at] + rng.choice(marks) + text[at:]
            elif op < 0.7:
                text = text[:at] + text[at + 1:]
            else:
                text = text[:at] + rng.choice(marks) + text[at + 1:]
        seen[agree(text)] += 1
    # both branches were exercised
    assert seen["same"] > 300, seen
    assert seen["declined"] > 300, seen
