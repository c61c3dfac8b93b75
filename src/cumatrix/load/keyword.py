"""``-k`` expressions, matched against cell ids by pytest's own ``-k`` grammar.

The controller of an xdist run collects no items, yet its run header lists the cells the
run intends: it evaluates ``-k`` itself, with the expression compiler pytest uses for
``-k`` (:class:`_pytest.mark.expression.Expression`), so both read an expression alike.
As for pytest's items, an identifier matches when it is a case-insensitive substring of
one of the names (a cell's id, its matrix file's name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from _pytest.mark import expression as _pytest_expression

from cumatrix.core.errors import UsageError

# pytest 8 raises its ParseError for a malformed expression; later versions a SyntaxError.
_MALFORMED: tuple[type[Exception], ...] = tuple(
    {SyntaxError, getattr(_pytest_expression, "ParseError", SyntaxError)})


@dataclass(frozen=True, slots=True)
class KeywordExpression:
    """A compiled ``-k`` expression."""

    text: str
    compiled: Any  # pytest's Expression (private to pytest: not named in this module's types)

    @classmethod
    def compile(cls, text: str) -> KeywordExpression:
        """Compile ``text``; a malformed expression is a :class:`UsageError` (exit 2)."""
        if not text.strip():
            return cls(text, None)
        try:
            compiled = _pytest_expression.Expression.compile(text)
        except _MALFORMED as e:
            column = getattr(e, "offset", None) or getattr(e, "column", None)
            where = f"at column {column}: " if column else ""
            raise UsageError(f"-k {text!r}: {where}{getattr(e, 'msg', None) or e}") from None
        if "=" in text:  # only `name(arg=value)` has one: -m's keyword arguments, as pytest says for -k
            raise UsageError(f"-k {text!r}: keyword arguments (name=value) are not supported by -k")
        return cls(text, compiled)

    def matches(self, *names: str) -> bool:
        """Whether an item with these names (cell id, file name) is selected."""
        if self.compiled is None:
            return True
        lowered = [n.lower() for n in names]

        def match(ident: str, /, **_kwargs: object) -> bool:  # no kwargs: compile() refused them
            needle = ident.lower()
            return any(needle in n for n in lowered)

        return bool(self.compiled.evaluate(match))
