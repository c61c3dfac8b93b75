"""``-k`` expressions, matched against cell ids the way pytest matches them against items.

The controller of an xdist run collects no items, yet its run header lists the cells the
run intends: it evaluates ``-k`` itself.  The grammar is pytest's::

    expr     := and_expr ("or" and_expr)*
    and_expr := not_expr ("and" not_expr)*
    not_expr := "not" not_expr | "(" expr ")" | IDENT

An identifier matches when it is a case-insensitive substring of one of the names.

pytest's own compiler (``_pytest.mark.expression``) is private API, which the plugin does not
use; this is the same grammar in a few dozen lines, tested against pytest's selection.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from cumatrix.core.errors import UsageError

_TOKEN_RE = re.compile(r"\s*(\(|\)|[\w:+\-.\[\]\\/]+)")
_KEYWORDS = ("and", "or", "not")


@dataclass(frozen=True, slots=True)
class _Node:
    op: str  # "ident" | "and" | "or" | "not"
    value: str = ""
    args: tuple[_Node, ...] = ()

    def eval(self, names: tuple[str, ...]) -> bool:
        if self.op == "ident":
            return any(self.value in n for n in names)
        if self.op == "not":
            return not self.args[0].eval(names)
        if self.op == "and":
            return all(a.eval(names) for a in self.args)
        return any(a.eval(names) for a in self.args)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = self._tokenize(text)
        self.pos = 0

    def _tokenize(self, text: str) -> list[str]:
        tokens: list[str] = []
        i = 0
        while i < len(text):
            if text[i].isspace():
                i += 1
                continue
            m = _TOKEN_RE.match(text, i)
            if m is None:
                raise UsageError(f"-k {text!r}: unexpected character {text[i]!r} at column {i + 1}")
            tokens.append(m.group(1))
            i = m.end()
        return tokens

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise UsageError(f"-k {self.text!r}: the expression ends too early")
        self.pos += 1
        return tok

    def _chain(self, op: str, operand: Callable[[], _Node]) -> _Node:
        parts = [operand()]
        while self.peek() == op:
            self.take()
            parts.append(operand())
        return parts[0] if len(parts) == 1 else _Node(op, args=tuple(parts))

    def expr(self) -> _Node:
        return self._chain("or", self.and_expr)

    def and_expr(self) -> _Node:
        return self._chain("and", self.not_expr)

    def not_expr(self) -> _Node:
        tok = self.take()
        if tok == "not":
            return _Node("not", args=(self.not_expr(),))
        if tok == "(":
            inner = self.expr()
            if self.take() != ")":
                raise UsageError(f"-k {self.text!r}: missing ')'")
            return inner
        if tok in _KEYWORDS or tok == ")":
            raise UsageError(f"-k {self.text!r}: unexpected {tok!r}")
        return _Node("ident", value=tok.lower())


@dataclass(frozen=True, slots=True)
class KeywordExpression:
    """A compiled ``-k`` expression."""

    root: _Node

    @classmethod
    def compile(cls, text: str) -> KeywordExpression:
        if not text.strip():
            return cls(_Node("and"))
        p = _Parser(text)
        root = p.expr()
        if p.peek() is not None:
            raise UsageError(f"-k {text!r}: unexpected {p.peek()!r}")
        return cls(root)

    def matches(self, *names: str) -> bool:
        """Whether an item with these names (cell id, file name) is selected."""
        return self.root.eval(tuple(n.lower() for n in names))
