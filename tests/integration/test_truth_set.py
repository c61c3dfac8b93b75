"""The static audit against the hand-checked truth set of published wheels (tests/truth/).

Each wheel is downloaded once into ``$XDG_CACHE_HOME/cumatrix/truth`` and its sha256 checked;
where it cannot be downloaded (no network) its test is skipped with the reason.  The
agreement figure over the whole set is printed by ``python tests/truth/truth.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "truth"))
import truth
from cumatrix.audit.static import AuditData, load_audit_data

pytestmark = pytest.mark.network

ENTRIES = truth.load()


@pytest.fixture(scope="module")
def data() -> AuditData:
    return load_audit_data()


def test_truth_set_spans_the_classes() -> None:
    # At least 40 wheels; CUDA 11, 12 and 13 builds; static, linked and dlopen'd runtimes; a
    # runtime vendored under a hashed name, driver symbols bound through the wheel's own stub
    # libraries, other CUDA libraries of a major outside --runtimes, fat binary modules of
    # mixed device-code coverage, NVIDIA's libraries whose kernel sets are dispatched by GPU, and
    # a library that keeps its kernels in its data.
    assert len(ENTRIES) >= 40
    assert {c for e in ENTRIES for c in e["cuda"]} >= {"11", "12", "13"}
    assert {c for e in ENTRIES for c in e["classes"]} >= {"static", "dynamic", "dlopen",
                                                          "sass", "ptx", "vendored", "stub",
                                                          "library", "modules", "dispatch",
                                                          "embedded"}
    assert all(c.get("evidence") for e in ENTRIES for r in e["runs"] for c in r["checks"]
               if "exit" not in c)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["requirement"] for e in ENTRIES])
def test_gate_agrees_with_the_truth_set(entry: dict[str, Any], data: AuditData) -> None:
    try:
        wheel = truth.fetch(entry, truth.cache())
    except truth.Unavailable as e:
        pytest.skip(f"cannot download the truth-set wheel here: {e}")
    outcomes = list(truth.evaluate(entry, wheel, data))
    wrong = [f"[{o.args}] {o.check} (gate: {o.got})" for o in outcomes if not o.agreed]
    assert not wrong, "\n".join(wrong)
