"""Outcome words are taken apart in one place (core.model), and every word of the vocabulary
has a kind."""

from __future__ import annotations

import pytest

from cumatrix.core.model import (
    EXPECTED_RE,
    OUTCOME_RE,
    Kind,
    is_neutral,
    is_ok,
    outcome_argument,
    outcome_kind,
    outcome_matches,
)

WORDS = [
    ("ok", Kind.OK, None), ("ok:batch", Kind.OK, "batch"), ("ok:n/a", Kind.OK, "n/a"),
    ("cuda-error:400", Kind.CUDA_ERROR, "400"), ("undefined-symbol:cuMemcpyBatchAsync", Kind.UNDEFINED_SYMBOL,
                                                 "cuMemcpyBatchAsync"),
    ("build-error", Kind.BUILD_ERROR, None), ("crash:SIGSEGV", Kind.CRASH, "SIGSEGV"), ("exit:-3", Kind.EXIT, "-3"),
    ("timeout", Kind.TIMEOUT, None), ("cannot-emulate", Kind.CANNOT_EMULATE, None), ("refused", Kind.REFUSED, None),
    ("skipped:no-cuda-driver", Kind.SKIPPED, "no-cuda-driver"), ("harness-error", Kind.HARNESS_ERROR, None),
    ("runtime-leak:/usr/local/cuda-13.0/lib64/libcudart.so.13", Kind.RUNTIME_LEAK,
     "/usr/local/cuda-13.0/lib64/libcudart.so.13"),
]


@pytest.mark.parametrize(("word", "kind", "arg"), WORDS)
def test_every_word_has_its_kind_and_argument(word: str, kind: Kind, arg: str | None) -> None:
    assert OUTCOME_RE.match(word)
    assert outcome_kind(word) is kind
    assert outcome_argument(word) == arg
    assert is_ok(word) == (kind is Kind.OK)
    assert is_neutral(word) == (kind in (Kind.SKIPPED, Kind.CANNOT_EMULATE))


#: Words an expectation may hold that no observation is: ``fails`` (any failure of the program).
EXPECTED_ONLY = [("fails", Kind.FAILS, None)]


def test_every_kind_is_in_the_vocabulary() -> None:
    assert {k for _, k, _ in WORDS + EXPECTED_ONLY} == set(Kind)


@pytest.mark.parametrize(("word", "kind", "arg"), EXPECTED_ONLY)
def test_an_expected_only_word_is_no_observation(word: str, kind: Kind, arg: str | None) -> None:
    assert EXPECTED_RE.match(word)
    assert not OUTCOME_RE.match(word)
    assert outcome_kind(word) is kind
    assert outcome_argument(word) == arg
    assert not is_ok(word)
    assert not is_neutral(word)
    assert all(EXPECTED_RE.match(w) for w, _, _ in WORDS)


def test_ok_with_a_path_matches_that_path_only() -> None:
    assert outcome_matches("ok", "ok", "fallback")
    assert outcome_matches("ok:batch", "ok", "batch")
    assert not outcome_matches("ok:batch", "ok", "fallback")
    assert not outcome_matches("ok:batch", "exit:1", "batch")
    assert outcome_matches("crash:SIGSEGV", "crash:SIGSEGV", None)
    assert not outcome_matches("exit:1", "exit:2", None)
