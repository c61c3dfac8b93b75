"""``-k`` expressions evaluated by the controller, as pytest evaluates them for items."""

from __future__ import annotations

import pytest

from cumatrix.core.errors import UsageError
from cumatrix.load.keyword import KeywordExpression

IDS = ["cu12.9/host/probe", "cu12.9/emulated-12.4/import-smoke", "cu13.0/host/driver-dispatch/h13.0/kv-16k-d2h",
       "none/host/proc-address/h12.8/kv-16k-h2d"]


@pytest.mark.parametrize(("expr", "selected"), [
    ("cu12.9", [0, 1]),
    ("CU12.9 and probe", [0]),
    ("host and not probe", [2, 3]),
    ("(d2h or h2d) and not driver-dispatch", [3]),
    ("not (cu12.9 or cu13.0)", [3]),
    ("emulated-12.4 or h13.0", [1, 2]),
    ("matrix.yaml", [0, 1, 2, 3]),  # the file name is one of an item's names
])
def test_selection_matches_pytest_semantics(expr: str, selected: list[int]) -> None:
    e = KeywordExpression.compile(expr)
    assert [i for i, cid in enumerate(IDS) if e.matches(cid, "matrix.yaml")] == selected


@pytest.mark.parametrize("bad", ["cu12.9 and", "(probe", "and probe", "probe )", "probe @ host"])
def test_malformed_expressions_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError, match="-k"):
        KeywordExpression.compile(bad)
