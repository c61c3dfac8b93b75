"""Walk a JSON-like document."""

from __future__ import annotations

from typing import Any


def paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path (keys and indexes) of every node of ``value``, the root's ``()`` first."""
    out = [path]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for k, v in items:
        out += paths(v, (*path, k))
    return out
