"""A fast reader for the plain YAML that matrix files are made of; libyaml reads the rest.

libyaml hands Python one event object per scalar and bracket: 80,000 of them for a matrix of
10,000 cases in flow style, 0.4 s before anything is built.  This reader takes the common
shape line by line with a few regular expressions and builds the same :class:`~cumatrix.load.yamldoc.Doc`
(data, the place of every value and key, scalars as written) that the event builder does.

It takes only what it is sure of: block mappings with plain keys, block sequences (indentless
ones too), ``- key: value`` items, and one-line flow collections of plain, single-quoted and
escape-free double-quoted scalars, with comments.  Anything else (anchors, aliases, tags, block
or multi-line scalars, empty values, escapes, tabs, non-ASCII text, a duplicate key, anything
malformed) raises :class:`Unsupported`, and the caller parses the text with libyaml, which also
words every error.  The unit tests hold the two readers to the same documents.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from yaml.nodes import ScalarNode


class Unsupported(Exception):
    """Text this reader does not take (libyaml reads it instead)."""


# Characters that cannot start a plain scalar (YAML 1.1); "-" may, when a non-space follows.
_INDICATORS = frozenset("-?:,[]{}#&*!|>'\"%@`")
# One flow token at a position (spaces skipped first): punctuation, a quoted scalar, or a plain
# scalar of a flow context (no ":", "#" or flow indicator inside; its trailing spaces dropped).
_FLOW = re.compile(r"""([\[\]{},])|'((?:[^']|'')*)'|"([^"\\]*)"|((?:-(?=[^\s,\[\]{}])|[^\s\-?:,\[\]{}#&*!|>'"%@`])[^:,\[\]{}#]*)""")
_SPACES = re.compile(r" *")
_COMMENT = re.compile(r" *(?:#.*)?$")  # what may follow a value on its line
_TOKEN = re.compile(r""" *(?:([\[\]{},])|'((?:[^']|'')*)'|"([^"\\]*)"|((?:-(?=[^\s,\[\]{}])|[^\s\-?:,\[\]{}#&*!|>'"%@`])"""
                    r"""[^:,\[\]{}#]*?)(?= *(?:[,\]}:]|$))|(: )|(.))""")
_PLAIN = r"""((?:-(?=[^\s,\[\]{}])|[^\s\-?:,\[\]{}#&*!|>'"%@`])[^:,\[\]{}#]*?)(?= *(?:[,\]}:]|$))"""
_SCALAR_PARTS = {2: r" *('(?:[^']|'')*')", 3: r' *("[^"\\]*")', 4: " *" + _PLAIN}
_KEY = re.compile(r"([^\s\-?:,\[\]{}#&*!|>'\"%@`](?:[^:#]|:(?! |$)|(?<! )#)*?) *:(?: +|$)")


class FastReader:
    """One document of ``text``: see :func:`read`."""

    def __init__(self, text: str, file: str, loader: Any, plain_starts: Any, scalars: Any, text_tags: Any,
                 max_depth: int) -> None:
        from cumatrix.load.yamldoc import Doc

        self.doc = Doc(file=file, data=None)
        self.loader = loader
        self.plain_starts = plain_starts
        self.scalars = scalars
        self.text_tags = text_tags
        self.max_depth = max_depth
        self.resolved: dict[str, Any] = {}  # plain text -> its value (str, int, float, bool or None)
        self.shapes: list[tuple[re.Pattern[str], Callable[..., Any], int]] = []
        # (line number, indent, content) of each line that holds something
        self.lines: list[tuple[int, int, str]] = []
        for n, line in enumerate(text.split("\n"), 1):
            content = line.lstrip(" ")
            if not content or content[0] == "#":
                continue
            if content.startswith(("---", "...")) or line[0] == "%":
                raise Unsupported("document markers and directives")
            self.lines.append((n, len(line) - len(content), content.rstrip(" ")))

    # ---------------------------------------------------------------- values

    def scalar(self, raw: str, plain: bool, place: tuple[int, int], path: tuple[Any, ...] | None) -> Any:
        """A scalar's value as the event builder constructs it; its text kept where it is not a string."""
        if not plain or (raw[:1] not in self.plain_starts and raw):
            return raw
        known = self.resolved.get(raw, self)  # keys and values repeat: each text is resolved once
        if known is not self:
            if path is not None and not isinstance(known, str):
                self.doc.texts[path] = raw
            return known
        self.resolved[raw] = value = self._resolve(raw)
        if path is not None and not isinstance(value, str):
            self.doc.texts[path] = raw
        return value

    def _resolve(self, raw: str) -> Any:
        tag = self.loader.resolve(ScalarNode, raw, (True, False))
        if tag in self.text_tags:
            return raw
        construct = self.scalars.get(tag)
        if construct is None:
            raise Unsupported(tag)
        try:
            return construct(ScalarNode(tag, raw))
        except Exception as e:  # noqa: BLE001 - the event builder words it
            raise Unsupported(str(e)) from None

    def put(self, path: tuple[Any, ...], place: tuple[int, int]) -> None:
        if len(path) >= self.max_depth - 1:  # near the limit: the event builder says where it is passed
            raise Unsupported("deep")
        self.doc.places[path] = place

    def inline(self, line_no: int, content: str, col: int, path: tuple[Any, ...]) -> Any:
        """The value that fills the rest of a line from ``col`` (0-based, in the line)."""
        first = content[0]
        place = (line_no, col + 1)
        if first in "[{":
            value, end = self.flow(line_no, content, 0, col, path)
            if not _COMMENT.match(content, end):
                raise Unsupported("text after a flow collection")
            return value
        if first == "'" or first == '"':
            m = _FLOW.match(content)
            if m is None or m.end() == 0 or not _COMMENT.match(content, m.end()):
                raise Unsupported("quoted scalar")
            self.put(path, place)
            return m.group(2).replace("''", "'") if first == "'" else m.group(3)
        cut = content.find(" #")
        raw = (content if cut < 0 else content[:cut]).rstrip(" ")
        if first in _INDICATORS and not (first == "-" and len(raw) > 1 and raw[1] != " "):
            raise Unsupported("indicator")
        if ": " in raw or raw.endswith(":"):
            raise Unsupported("a mapping where a scalar is")
        self.put(path, place)
        return self.scalar(raw, True, place, path)

    def flow(self, line_no: int, line: str, pos: int, col0: int, path: tuple[Any, ...]) -> tuple[Any, int]:
        """The flow collection opening at ``line[pos]`` (on this line); it and the position after it."""
        # One token a match, contiguous (a character no other token takes is its own, refused):
        # leading spaces, then punctuation, a quoted or a plain scalar, or ": ".
        for rx, known, depth in self.shapes:  # a line shaped like one read before: one match reads it
            hit = rx.match(line, pos)
            if hit is not None:
                if len(path) + depth >= self.max_depth - 1:
                    raise Unsupported("deep")
                return self.replay(hit, known, line_no, col0, path), hit.end()
        stack: list[tuple[dict[str, Any] | list[Any], tuple[Any, ...], str | None]] = []
        want = "value"  # value | sep (after a value) | key (after "{" or a mapping's ",") | colon
        places, key_places = self.doc.places, self.doc.key_places
        parts: list[str] = []  # the line's shape: a regular expression of its tokens
        steps: list[tuple[Any, ...]] = []  # what each captured token does
        for m in _TOKEN.finditer(line, pos):
            kind = m.lastindex
            start = col0 + m.start(kind) + (0 if kind in (2, 3) else 1)  # type: ignore[arg-type]  # a quoted scalar starts at its quote
            if kind == 1:  # punctuation
                ch = m.group(1)
                if ch in "[{":
                    if want != "value" and want != "value_or_close":
                        raise Unsupported("flow collection here (a mapping's key, or after a value)")
                    top = stack[-1] if stack else None
                    sub = (*top[1], top[2] if isinstance(top[0], dict) else len(top[0])) if top else path
                    if len(sub) >= self.max_depth - 1:
                        raise Unsupported("deep")
                    places[sub] = (line_no, start)
                    stack.append(({} if ch == "{" else [], sub, None))
                    parts.append(" *(\\" + ch + ")")
                    steps.append((0, ch == "{", sub[len(path):]))
                    want = "key_or_close" if ch == "{" else "value_or_close"
                    continue
                if ch in "]}":
                    if not stack or want not in ("sep", "key_or_close", "value_or_close") \
                            or (ch == "}") != isinstance(stack[-1][0], dict):
                        raise Unsupported("flow close")
                    done = stack.pop()[0]
                    parts.append(" *\\" + ch)
                    steps.append((3,))
                    if not stack:
                        self._remember("".join(parts), steps)
                        return done, m.end()
                    self._store(stack, done)
                    want = "sep"
                    continue
                if want != "sep":  # ","
                    raise Unsupported("flow separator")
                want = "key" if isinstance(stack[-1][0], dict) else "value"
                parts.append(" *,")
                continue
            if kind == 5:  # ": "
                if want != "colon":
                    raise Unsupported("flow colon")
                want = "value"
                parts.append(" *: ")
                continue
            if kind == 6 or not stack:
                raise Unsupported("flow text")
            if want == "value_or_close":
                want = "value"
            plain = kind == 4
            raw = m.group(4) if plain else m.group(2).replace("''", "'") if kind == 2 else m.group(3)
            if want in ("key", "key_or_close"):
                if plain:  # what the event builder would refuse as a key, refused here
                    self.scalar(raw, True, (line_no, start), None)
                top = stack[-1]
                if raw in top[0]:
                    raise Unsupported("duplicate key")
                stack[-1] = (top[0], top[1], raw)
                key_places[(*top[1], raw)] = (line_no, start)
                want = "colon"
                parts.append(_SCALAR_PARTS[kind])  # type: ignore[index]
                steps.append((1, kind, top[1][len(path):]))
                continue
            if want != "value":
                raise Unsupported("flow scalar here")
            top = stack[-1]
            at = (*top[1], top[2] if isinstance(top[0], dict) else len(top[0]))
            places[at] = (line_no, start)
            value = self.scalar(raw, True, (line_no, start), at) if plain else raw
            self._store(stack, value)
            want = "sep"
            parts.append(_SCALAR_PARTS[kind])  # type: ignore[index]
            steps.append((2, kind, at[len(path):]))
        raise Unsupported("a flow collection over several lines")

    def _remember(self, shape: str, steps: list[tuple[Any, ...]]) -> None:
        if len(self.shapes) < 8 and not any(rx.pattern == shape for rx, _, _ in self.shapes):
            depth = max(len(st[-1]) for st in steps if len(st) > 1) + 1
            self.shapes.append((re.compile(shape), _compile_replay(steps), depth))

    def replay(self, m: re.Match[str], build: Callable[..., Any], line_no: int, col0: int,
               path: tuple[Any, ...]) -> Any:
        """A flow collection read by its shape's expression: what :meth:`flow` would build."""
        return build(m.groups(), m.regs, path, line_no, col0, self.doc.places, self.doc.key_places, self.scalar)

    @staticmethod
    def _store(stack: list[tuple[dict[str, Any] | list[Any], tuple[Any, ...], str | None]], value: Any) -> None:
        into, at, key = stack[-1]
        if isinstance(into, list):
            into.append(value)
        else:
            assert key is not None
            into[key] = value
            stack[-1] = (into, at, None)

    # ---------------------------------------------------------------- blocks

    def read(self) -> Any:
        if not self.lines:
            raise Unsupported("empty")
        _, indent, content = self.lines[0]
        if _KEY.match(content) is None:
            raise Unsupported("the top level is not a mapping")
        value, i = self.mapping(0, indent, ())
        if i != len(self.lines):
            raise Unsupported("text after the document")
        self.doc.data = value
        return self.doc

    def node(self, i: int, parent_indent: int, path: tuple[Any, ...]) -> tuple[Any, int]:
        """The block node whose first line is ``lines[i]``."""
        _, indent, content = self.lines[i]
        if content == "-" or content.startswith("- "):
            return self.sequence(i, indent, path)
        if indent > parent_indent and _KEY.match(content) is not None:
            return self.mapping(i, indent, path)
        raise Unsupported("block node")

    def mapping(self, i: int, indent: int, path: tuple[Any, ...], first: str | None = None) -> tuple[Any, int]:
        """A block mapping whose keys are at ``indent``; ``first``: its first line's content when
        that line starts elsewhere (``- key: value``)."""
        line_no = self.lines[i][0]
        self.put(path, (line_no, indent + 1))
        out: dict[str, Any] = {}
        while i < len(self.lines):
            line_no, ind, content = self.lines[i]
            if first is not None:
                content, ind, first = first, indent, None
            if ind != indent:
                if ind > indent:
                    raise Unsupported("indentation")
                break
            m = _KEY.match(content)
            if m is None:
                if content == "-" or content.startswith("- "):
                    break  # an indentless sequence ends here; its owner decides
                raise Unsupported("not a key")
            key = m.group(1)
            if key in out or " #" in key:
                raise Unsupported("duplicate key or comment")
            kplace = (line_no, ind + 1)
            self.scalar(key, True, kplace, None)
            self.doc.key_places[(*path, key)] = kplace
            rest = content[m.end():]
            if rest and rest[0] != "#":
                out[key] = self.inline(line_no, rest, ind + m.end(), (*path, key))
                i += 1
                continue
            # The value is on the lines below: deeper, or a sequence at this indent.
            i += 1
            if i >= len(self.lines):
                raise Unsupported("empty value")
            _, nind, ncontent = self.lines[i]
            seq = ncontent == "-" or ncontent.startswith("- ")
            if not (nind > ind or (nind == ind and seq)):
                raise Unsupported("empty value")
            out[key], i = self.node(i, ind, (*path, key))
        return out, i

    def sequence(self, i: int, indent: int, path: tuple[Any, ...]) -> tuple[Any, int]:
        self.put(path, (self.lines[i][0], indent + 1))
        out: list[Any] = []
        while i < len(self.lines):
            line_no, ind, content = self.lines[i]
            if ind != indent or not (content == "-" or content.startswith("- ")):
                if ind > indent:
                    raise Unsupported("indentation")
                break
            item = (*path, len(out))
            rest = content[1:].lstrip(" ")
            col = ind + len(content) - len(rest)
            if not rest or rest[0] == "#":
                i += 1
                if i >= len(self.lines) or self.lines[i][1] <= ind:
                    raise Unsupported("empty item")
                value, i = self.node(i, ind, item)
            elif rest == "-" or rest.startswith("- "):
                raise Unsupported("a sequence in a sequence's line")
            elif _KEY.match(rest) is not None and rest[0] not in "[{'\"":
                value, i = self.mapping(i, col, item, first=rest)
            else:
                value = self.inline(line_no, rest, col, item)
                i += 1
            out.append(value)
        return out, i


def _compile_replay(steps: list[tuple[Any, ...]]) -> Callable[..., Any]:
    """A function that builds, from a shape's match, what :meth:`FastReader.flow` built for it.

    ``steps``: ``(0, is_mapping, _)`` opens a collection, ``(1, kind, _)`` is a mapping's key,
    ``(2, kind, _)`` a value, ``(3,)`` closes; kind 2 is single-quoted, 3 double-quoted, 4 plain.
    Written out as straight-line code (as :mod:`dataclasses` writes ``__init__``): one call a line.
    """
    code = ["def build(g, r, path, line_no, col0, places, key_places, scalar):"]
    stack: list[tuple[str, str, bool, int]] = []  # (collection variable, its path variable, is_mapping, items)
    g = 0
    n = 0

    def text(kind: int, i: int) -> str:
        return f"g[{i}]" if kind == 4 else f"g[{i}][1:-1].replace(\"''\", \"'\")" if kind == 2 else f"g[{i}][1:-1]"

    def where_next() -> str:
        if not stack:
            return "path"
        var, at, is_map, items = stack[-1]
        if is_map:
            return f"{at} + (k_{var},)"
        stack[-1] = (var, at, is_map, items + 1)
        return f"{at} + ({items},)"

    for step in steps:
        op = step[0]
        if op == 3:
            var, _, _, _ = stack.pop()
            if stack:
                outer, _, is_map, _ = stack[-1]
                code.append(f"    {outer}[k_{outer}] = {var}" if is_map else f"    {outer}.append({var})")
            else:
                code.append(f"    return {var}")
            continue
        place = f"(line_no, col0 + r[{g + 1}][0] + 1)"
        if op == 1:
            var = stack[-1][0]
            code += [f"    k_{var} = {text(step[1], g)}",
                     f"    if k_{var} in {var}: raise Unsupported('duplicate key')",
                     f"    p = {place}"]
            if step[1] == 4:
                code.append(f"    scalar(k_{var}, True, p, None)")
            code.append(f"    key_places[{stack[-1][1]} + (k_{var},)] = p")
        else:
            n += 1
            at = f"a{n}"
            code += [f"    {at} = {where_next()}", f"    places[{at}] = {place}"]
            if op == 0:
                code.append(f"    c{n} = {{}}" if step[1] else f"    c{n} = []")
                stack.append((f"c{n}", at, bool(step[1]), 0))
            else:
                value = f"scalar(g[{g}], True, places[{at}], {at})" if step[1] == 4 else text(step[1], g)
                var, _, is_map, _ = stack[-1]
                code.append(f"    {var}[k_{var}] = {value}" if is_map else f"    {var}.append({value})")
        g += 1
    scope: dict[str, Any] = {"Unsupported": Unsupported}
    exec("\n".join(code), scope)  # noqa: S102 - code written above from a fixed vocabulary
    built: Callable[..., Any] = scope["build"]
    return built


def read(text: str, file: str, *, loader: Any, plain_starts: Any, scalars: Any, text_tags: Any,
         max_depth: int) -> Any:
    """The :class:`~cumatrix.load.yamldoc.Doc` of ``text``, or :class:`Unsupported`."""
    if "\t" in text or "\r" in text or not text.isascii() or "\\" in text:
        raise Unsupported("tabs, carriage returns, non-ASCII text or escapes")
    return FastReader(text, file, loader, plain_starts, scalars, text_tags, max_depth).read()
