"""Which outcomes can be neutral, and when (the judge's rule): only a cell whose program did not
fail; and the expected word ``fails`` that a rule predicts where it says a program fails but
not how.  Pure functions over typed observations; the real processes are in
tests/integration/test_neutral_outcomes.py."""

from __future__ import annotations

import pytest

from cumatrix.core.model import Case, Cell, Expected, Observed
from cumatrix.execute import observe as O
from cumatrix.judge.classify import succeeded, with_audit
from cumatrix.judge.verdict import Facts, decide, reconcile
from cumatrix.load.matrix import load
from cumatrix.predict import oracle

HOST = oracle.HostFacts(driver_version=13000)
CMD = Cell(kind="command", runtime="cu12.9", driver="emulated-12.4", case=Case(name="prog", argv=("prog",)))
CANNOT = Expected(outcomes=frozenset({"cannot-emulate"}), reason="a CUDA 12 runtime detects the interposer")


def _seen(not_used: str | None) -> O.Observation:
    return O.Observation(libraries=(), runtime=O.ObservedRuntime(file=None, soname=None, version=None, evidence="-"),
                         not_used=not_used)


@pytest.mark.parametrize(("observed", "skip"), [
    (Observed(outcome="ok", path="n/a", exit_status=0), True),
    (Observed(outcome="exit:1", exit_status=1), False),
    (Observed(outcome="crash:SIGSEGV", exit_status=-11), False),
    (Observed(outcome="timeout"), False),
    (Observed(outcome="cuda-error:35", exit_status=0), False),
    (Observed(outcome="ok", path="n/a", exit_status=3), False),  # a verdict of ok, then a non-zero exit
])
def test_runtime_not_used_makes_a_skip_only_of_a_program_that_succeeded(observed: Observed, skip: bool) -> None:
    got = with_audit(observed, _seen("the process used libcudart.so.13"))
    assert (got.outcome == "skipped:runtime-not-used") is skip
    assert succeeded(observed) is skip
    if not skip:
        assert got == observed


@pytest.mark.parametrize("outcome", ["exit:1", "exit:2", "crash:SIGABRT", "timeout", "cuda-error:35"])
def test_cannot_emulate_takes_no_failure_but_the_interposers_signature(outcome: str) -> None:
    observed = Observed(outcome=outcome, exit_status=1)
    assert reconcile(CMD, observed, HOST, CANNOT) == observed
    assert decide(CMD, CANNOT, observed, Facts(host=HOST)).status == "fail"
    assert reconcile(CMD, Observed(outcome="cuda-error:103"), HOST, CANNOT).outcome == "cannot-emulate"
    assert reconcile(CMD, Observed(outcome="ok", path="n/a"), HOST, CANNOT).outcome == "cannot-emulate"


@pytest.mark.parametrize(("outcome", "admitted"), [
    ("exit:1", True), ("exit:2", True), ("crash:SIGSEGV", True), ("cuda-error:35", True),
    ("undefined-symbol:cuInit", True), ("ok", False), ("timeout", False), ("skipped:no-cuda-driver", False),
    ("cannot-emulate", False), ("harness-error", False), ("runtime-leak:/usr/lib/libcudart.so.13", False),
])
def test_fails_admits_every_failure_of_the_program_and_nothing_else(outcome: str, admitted: bool) -> None:
    assert Expected(outcomes=frozenset({"fails"}), reason="-").admits(outcome, None) is admitted


def test_a_matrix_may_expect_fails(tmp_path: pytest.TempPathFactory) -> None:
    m = tmp_path / "m.yaml"  # type: ignore[operator]
    m.write_text("runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}\ndrivers: [host]\nprobe: false\n"
                 "cases: [{name: c, argv: ['false']}]\nexpect: [{case: c, outcome: fails}]\n")
    assert load(m).expect[0].outcomes == {"fails"}
