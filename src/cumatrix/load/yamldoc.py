"""YAML (and JSON) input as plain data that remembers where every value came from.

The matrix file and the bug catalog are read here: composed into a node graph by libyaml's C
composer through PyYAML (:func:`yaml.compose`; the pure-Python one where PyYAML was built
without libyaml), then turned into JSON-shaped data (dicts, lists, str, int, float, bool, None)
while each value's and each key's ``line:col`` (the nodes' ``start_mark``) is kept.  Shapes
are checked afterwards against the JSON Schemas in :mod:`cumatrix.load.schema`; semantic
checks stay with the loaders, which locate their problems through :meth:`Doc.where`.

Hostile input stays a located problem: libyaml refuses nesting past its own limit, the walk
here refuses it past :data:`MAX_DEPTH`, and alias expansion past :data:`MAX_VALUES` values
(an alias is one shared node: expanding it again costs nothing to compose, everything to use).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from cumatrix.core.errors import ConfigError, Problem
from cumatrix.load import gcpause

#: libyaml's composer where PyYAML was built with it; positions are kept either way.
Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_DEPTH = 64
MAX_VALUES = 200_000

Path = tuple[str | int, ...]
Place = tuple[int, int]

# YAML 1.1 printable set (the reader refuses anything else); checked up front so that the
# place is counted in characters: libyaml reports a byte offset into its UTF-8 copy.
_NOT_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_TAG = "tag:yaml.org,2002:"
_STR = _TAG + "str"
_CONSTRUCT = SafeConstructor()
_SCALARS = {
    _TAG + "null": _CONSTRUCT.construct_yaml_null,
    _TAG + "bool": _CONSTRUCT.construct_yaml_bool,
    _TAG + "int": _CONSTRUCT.construct_yaml_int,
    _TAG + "float": _CONSTRUCT.construct_yaml_float,
}
#: Tags whose value stays the text as written (a date is a string to a matrix file; a merge
#: key ``<<`` is a key like any other, which the schema then names as unknown).
_TEXT_TAGS = {_TAG + t for t in ("str", "timestamp", "merge", "value", "binary")}
_MAP, _SEQ = _TAG + "map", _TAG + "seq"
_NAME_AT = re.compile(r"[&*]([^\s,\[\]{}]+)")


class _Composer(Loader):  # type: ignore[valid-type,misc]  # a class chosen at import time
    """:data:`Loader`, whose composer asks the resolver the tag of each scalar once per text
    (a matrix repeats its keys and words; a fifth of the composing time at 10,000 cases)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._tags: dict[tuple[Any, Any, Any], str] = {}

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        key = (kind, value, implicit)
        tag = self._tags.get(key)
        if tag is None:
            tag = self._tags[key] = super().resolve(kind, value, implicit)
        return tag


@dataclass(slots=True)
class Doc:
    """A parsed document: ``data`` and where each part of it was written.

    ``finite``: every number in ``data`` is known to be finite (a YAML ``.nan`` or ``.inf``
    makes it false, as does data that did not come from :func:`parse`); JSON has no such
    numbers, and :mod:`cumatrix.load.schema` refuses them where a number is wanted.
    """

    file: str
    data: Any
    places: dict[Path, Place] = field(default_factory=dict)
    key_places: dict[Path, Place] = field(default_factory=dict)
    texts: dict[Path, str] = field(default_factory=dict)
    finite: bool = False

    def where(self, path: Path) -> Place:
        """``(line, col)`` of the value at ``path``, or of its closest located parent."""
        for n in range(len(path), -1, -1):
            place = self.places.get(path[:n])
            if place is not None:
                return place
        return (1, 1)

    def key_where(self, path: Path) -> Place:
        """``(line, col)`` of the mapping key whose value is at ``path``."""
        return self.key_places.get(path) or self.where(path)

    def text(self, path: Path, value: Any) -> str:
        """A scalar as written (``12.10``, not the float ``12.1``)."""
        return self.texts.get(path, value if isinstance(value, str) else json.dumps(value))

    def problem(self, path: Path, message: str, *, key: bool = False) -> Problem:
        """A :class:`Problem` at the value (or, with ``key``, the mapping key) at ``path``."""
        line, col = self.key_where(path) if key else self.where(path)
        return Problem(self.file, line, col, message)


def _mark(m: Any) -> Place:
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
    # Composing and walking make hundreds of thousands of objects at 10,000 cases and no cyclic
    # garbage; collections set off by their number would walk them all again and again.
    with gcpause.paused():
        try:
            loader = _Composer(text)
            try:
                root = loader.get_single_node()
            finally:
                loader.dispose()
        except yaml.MarkedYAMLError as e:
            raise ConfigError([_yaml_problem(file, text, e)]) from None
        except yaml.YAMLError as e:
            index = getattr(e, "position", 0)
            raise _located(file, text, min(index, len(text)), f"malformed YAML: {str(e).splitlines()[0]}") from None
        doc = Doc(file=file, data=None)
        if root is not None:
            _Walk(doc, text).run(root)
        return doc


def _name_at(text: str, place: Place) -> str:
    """The anchor or alias name written at ``place`` (``&name`` / ``*name``), or ``?``."""
    lines = text.split("\n")
    line = lines[place[0] - 1] if 0 < place[0] <= len(lines) else ""
    m = _NAME_AT.match(line, place[1] - 1)
    return m.group(1) if m else "?"


def _yaml_problem(file: str, text: str, e: yaml.MarkedYAMLError) -> Problem:
    """What libyaml refused, in the words of a matrix file's user."""
    if e.context == "expected a single document in the stream":
        line, col = _mark(e.problem_mark)
        return Problem(file, line, col, "a second YAML document ('---'): one file holds one document")
    if e.problem == "found undefined alias":
        place = _mark(e.problem_mark)
        return Problem(file, *place, f"alias *{_name_at(text, place)} names no anchor defined before it")
    if (e.context or "").startswith("found duplicate anchor"):
        first, place = _mark(e.context_mark), _mark(e.problem_mark)
        return Problem(file, *place, f"anchor &{_name_at(text, place)} is defined twice "
                                     f"(first on line {first[0]}); give each anchor its own name")
    line, col = _mark(e.problem_mark or e.context_mark)
    return Problem(file, line, col, f"malformed YAML: {e.problem or e.context}")


def _consumed(node: Node) -> Iterator[Any]:
    """A collection node's items, each let go once walked: the composed graph (35 MB at
    10,000 cases) shrinks as the data grows, instead of being held beside all of it.  An
    alias's node lives on where another collection holds it."""
    items: list[Any] = node.value
    node.value = []
    items.reverse()
    while items:
        yield items.pop()


class _Walk:
    """Composed nodes -> JSON-shaped data in ``doc``, places and written texts kept.

    Depth-first in document order.  An alias is the anchor's node handed out once more by
    the composer: the n-th node met again is the n-th alias of the text, and the parser's
    events say where that one was written (read only for a text that has aliases).
    """

    def __init__(self, doc: Doc, text: str) -> None:
        self.doc = doc
        self.text = text
        # id(node) -> (value, values it holds) of each collection (and, in a text with aliases,
        # each scalar) met; None while a collection is being built (an alias to it: a cycle).
        self.seen: dict[int, tuple[Any, int] | None] = {}
        self.total = 0
        self.finite = True
        self.resolved: dict[tuple[str, str], Any] = {}  # (tag, text) -> value: texts repeat
        self.aliases_met = 0
        self._alias_places: list[tuple[str, Place]] | None = None
        # A text without '*' has no alias: its scalars need not be told apart from one another.
        self.track = "*" in text

    def fail(self, place: Place, message: str) -> ConfigError:
        return ConfigError([Problem(self.doc.file, place[0], place[1], message)])

    def run(self, root: Node) -> None:
        self.doc.places[()] = _mark(root.start_mark)
        if isinstance(root, ScalarNode):
            self.doc.data = root.value if root.tag == _STR else self.scalar(root, ())
        else:
            self.doc.data, _ = self.collection(root, (), 0)
        self.doc.finite = self.finite

    # ---------------------------------------------------------------- aliases

    def alias_place(self) -> tuple[str, Place]:
        """Name and place of the alias just met (the ``aliases_met``-th of the text)."""
        if self._alias_places is None:
            self._alias_places = [(str(ev.anchor), _mark(ev.start_mark)) for ev in yaml.parse(self.text, Loader=Loader)
                                  if isinstance(ev, yaml.AliasEvent)]
        return self._alias_places[self.aliases_met - 1]

    def again(self, node: Node, path: Path) -> tuple[Any, int]:
        """A node met before: an alias, whose value is the anchor's, counted again."""
        self.aliases_met += 1
        name, place = self.alias_place()
        self.doc.places[path] = place
        known = self.seen[id(node)]
        if known is None:
            raise self.fail(place, f"alias *{name} refers to a collection that contains it")
        value, size = known
        self.total += size
        if self.total > MAX_VALUES:
            raise self.fail(place, f"aliases expand the document past {MAX_VALUES} values")
        return value, size

    # ---------------------------------------------------------------- values

    def scalar(self, node: ScalarNode, path: Path | None) -> Any:
        """The value of a scalar whose tag is not ``str``; its text kept at ``path``."""
        tag, text = node.tag, node.value
        if tag in _TEXT_TAGS:
            return text
        if path is not None:
            self.doc.texts[path] = text
        key = (tag, text)
        if key in self.resolved:
            return self.resolved[key]
        construct = _SCALARS.get(tag)
        if construct is None:
            raise self.fail(_mark(node.start_mark), f"unsupported YAML tag {tag!r}")
        try:
            value = construct(node)
        except (ValueError, OverflowError, yaml.YAMLError) as e:
            raise self.fail(_mark(node.start_mark), f"cannot read {text[:40]!r} as {tag.rsplit(':', 1)[-1]}: {e}") from None
        if isinstance(value, float) and not math.isfinite(value):
            self.finite = False
        self.resolved[key] = value
        return value

    def tracked(self, node: Node, path: Path, depth: int) -> tuple[Any, int]:
        """The value of any node in a text with aliases (a scalar may be met again)."""
        if not isinstance(node, ScalarNode):
            return self.collection(node, path, depth)
        if id(node) in self.seen:
            return self.again(node, path)
        value = node.value if node.tag == _STR else self.scalar(node, path)
        self.seen[id(node)] = (value, 1)
        self.total += 1
        return value, 1

    def collection(self, node: Node, path: Path, depth: int) -> tuple[Any, int]:
        """The value of a mapping or sequence node at ``path`` and how many values it holds."""
        seen = self.seen
        if id(node) in seen:
            return self.again(node, path)
        if depth >= MAX_DEPTH:
            raise self.fail(_mark(node.start_mark), f"nested deeper than {MAX_DEPTH} levels")
        if node.tag not in (_MAP, _SEQ):
            raise self.fail(_mark(node.start_mark), f"unsupported YAML tag {node.tag!r}")
        seen[id(node)] = None
        built: dict[str, Any] | list[Any]
        if isinstance(node, MappingNode):
            built, size = self.mapping(node, path, depth)
        else:
            assert isinstance(node, SequenceNode)
            built, size = self.sequence(node, path, depth)
        seen[id(node)] = (built, size)
        return built, size

    # The two loops below run once for each value of a matrix: scalars are read inline.

    def sequence(self, node: SequenceNode, path: Path, depth: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        size = own = 1  # own: this collection and its scalars (nested ones count their own)
        places, track = self.doc.places, self.track
        for i, item in enumerate(_consumed(node)):
            at = (*path, i)
            m = item.start_mark
            places[at] = (m.line + 1, m.column + 1)
            if item.__class__ is ScalarNode and not track:
                out.append(item.value if item.tag == _STR else self.scalar(item, at))
                size += 1
                own += 1
            else:
                value, n = self.tracked(item, at, depth + 1)
                out.append(value)
                size += n
        self.total += own
        return out, size

    def mapping(self, node: MappingNode, path: Path, depth: int) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        size = own = 1  # own: this collection and its scalars (nested ones count their own)
        places, key_places, track = self.doc.places, self.doc.key_places, self.track
        for key_node, item in _consumed(node):
            key = self.key(key_node) if track or key_node.__class__ is not ScalarNode else key_node.value
            if key_node.tag != _STR:  # a key is its text as written ("1"), and must still be readable YAML
                self.scalar(key_node, None)
            m = key_node.start_mark
            if key in out:
                raise self.fail((m.line + 1, m.column + 1), f"duplicate key {key!r}")
            at = (*path, key)
            key_places[at] = (m.line + 1, m.column + 1)
            m = item.start_mark
            places[at] = (m.line + 1, m.column + 1)
            if item.__class__ is ScalarNode and not track:
                out[key] = item.value if item.tag == _STR else self.scalar(item, at)
                size += 1
                own += 1
            else:
                out[key], n = self.tracked(item, at, depth + 1)
                size += n
        self.total += own
        return out, size

    def key(self, node: Node) -> str:
        """A mapping key that is no plain scalar (refused), or one in a text with aliases."""
        if id(node) in self.seen:
            self.aliases_met += 1
            raise self.fail(self.alias_place()[1], "mapping keys must be plain names (not an alias)")
        if not isinstance(node, ScalarNode):
            raise self.fail(_mark(node.start_mark), "mapping keys must be plain names, not lists or mappings")
        # An alias may name it later, as a value.
        self.seen[id(node)] = (node.value if node.tag == _STR else self.scalar(node, None), 1)
        text: str = node.value
        return text
