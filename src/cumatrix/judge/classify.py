"""Stage four: turn a finished child (:class:`~cumatrix.execute.local.ChildResult`) into an
:class:`~cumatrix.core.model.Observed` outcome, in the outcome words the README lists.

A harness child's verdict is taken as it reported it, unless a signal ended it; every other
child (a command, a gate cell) is judged from what the operating system says: timeout,
signal, exit status, and an ``undefined symbol`` only where the loader made it (the tracer
saw a process end as the loader ends one, :func:`cumatrix.core.witness.loader_undefined_symbol`).
Nothing a program prints can make it pass.  The child's raw payload stops here: what follows sees typed timings and facts.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import replace

from cumatrix.core.jobs import ChildResult, Verdict
from cumatrix.core.model import ChildFacts, Kind, Observed, Timings, is_neutral, is_ok, outcome_kind
from cumatrix.core.witness import loader_undefined_symbol
from cumatrix.execute import observe, provenance
from cumatrix.execute.local import HARNESS_PROBLEM
from cumatrix.provision.facts import NotRun, NotRunWhy

#: Facts a child's fingerprint may carry, read into :class:`ChildFacts`.
_FACT_KEYS = ("runtime_version", "runtime_file", "driver_version", "libcuda_file", "gpu_name",
              "compute_capability", "forward_compat")


def signal_name(num: int) -> str:
    """``SIGSEGV`` for 11; ``SIG99`` for a number the platform does not name."""
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def classify(res: ChildResult, *, kind: str) -> Observed:
    """The outcome of a finished child; ``kind`` is the cell's (probe, swap, command)."""
    tail = res.stderr_tail[-600:].strip()
    problem = res.extra.get(HARNESS_PROBLEM)
    if isinstance(problem, str):  # the child never started: the harness's failure, not the cell's
        return harness_error(problem)
    refused = res.extra.get("refused")
    if isinstance(refused, str):
        return Observed(outcome="refused", detail=refused)
    if res.timed_out:
        return Observed(outcome="timeout", detail=f"no result after {res.duration_s:.1f} s; process group killed")
    if res.signal is not None:
        return _crashed(res, res.signal, tail)
    if res.verdict is not None:
        return _from_verdict(res, res.verdict)
    loader = _loader_refused(res)
    if loader is not None:
        return loader
    if res.verdict_error:
        return Observed(outcome="harness-error", detail=f"malformed verdict: {res.verdict_error}",
                        exit_status=res.returncode)
    return _by_exit_status(res, kind, tail)


def _by_exit_status(res: ChildResult, kind: str, tail: str) -> Observed:
    """A child that ended by itself with no verdict to take: a command by its exit status; a
    harness child's own code failed."""
    if kind == "command":
        if res.returncode == 0:
            return Observed(outcome="ok", path="n/a", exit_status=0)
        return Observed(outcome=f"exit:{res.returncode}", detail=tail, exit_status=res.returncode)
    why = "exited 0 without a verdict" if res.returncode == 0 else f"exited {res.returncode} without a verdict"
    return Observed(outcome="harness-error", detail=f"{why}: {tail}", exit_status=res.returncode)


def _crashed(res: ChildResult, signum: int, tail: str) -> Observed:
    """A child a signal ended. No verdict is taken from it: whoever can kill it may have written one for it."""
    detail = "OOM-killed (memory limit reached)" if res.oom_killed else tail
    if res.verdict is not None:
        detail = f"killed by {signal_name(signum)}; its verdict ({res.verdict.outcome}) is not taken. {detail}"
    return Observed(outcome=f"crash:{signal_name(signum)}", detail=detail.strip(), exit_status=-signum)


def _loader_refused(res: ChildResult) -> Observed | None:
    """A child that failed because the dynamic loader (or Python's import) reported an undefined
    symbol, as :func:`loader_undefined_symbol` establishes it; None for any other end."""
    if res.returncode in (None, 0):
        return None
    loader = loader_undefined_symbol(res.stderr_tail, res.trace, returncode=res.returncode)
    if loader is None:
        return None
    sym, why = loader
    line = _line_with(res.stderr_tail, f"undefined symbol: {sym}")
    return Observed(outcome=f"undefined-symbol:{sym}", detail=f"{line} ({why})", exit_status=res.returncode)


#: The outcome of each fact that stops a cell before its child (``exit:`` takes the failed
#: step's exit status).
_NOT_RUN: dict[NotRunWhy, str] = {
    "needs-docker": "skipped:needs-docker",
    "no-driver": "skipped:no-cuda-driver",
    "no-compiler": "skipped:no-compiler",
    "build-failed": "build-error",
    "emulation-impossible": "harness-error",
    "install-failed": "exit:",
    "wheel-not-for-this-python": "skipped:wheel-not-for-this-python",
    "unsupported-pairing": "skipped:unsupported-pairing",
    "harness-failed": "harness-error",
}


def not_run(fact: NotRun) -> Observed:
    """The outcome of a cell that no child ran, from the fact that stopped it."""
    outcome = _NOT_RUN[fact.why]
    if outcome == "exit:":
        status = fact.exit_status if fact.exit_status not in (None, 0) else 1
        return Observed(outcome=f"exit:{status}", exit_status=status, detail=fact.detail)
    return Observed(outcome=outcome, detail=fact.detail, exit_status=fact.exit_status)


def harness_error(detail: str) -> Observed:
    """The outcome of a cell the harness itself failed (a provisioning or backend error)."""
    return not_run(NotRun(why="harness-failed", detail=detail))


def with_audit(observed: Observed, seen: observe.Observation | None) -> Observed:
    """A process that used a runtime from outside both its own distribution and the cell
    (the host's toolkit, the loader cache, a stray ``LD_LIBRARY_PATH``) fails:
    ``runtime-leak:PATH``, saying how the loader found it.  One that used a runtime of another
    soname than the cell's, its own, and succeeded did not test the cell's pairing:
    ``skipped:runtime-not-used``, naming what it loaded and from where.  One that failed
    keeps its own outcome and is judged against its prediction: a skip never hides a failure
    (the runtime it used stays a fact on the record, ``runtime_not_used``).  Where the kernel's
    record of the tree is incomplete, a passing outcome is ``harness-error``: it would rest on
    part of the tree only."""
    if seen is None or observed.outcome == "harness-error":
        return observed
    if seen.escaped is not None:
        return replace(observed, outcome="harness-error", path=None,
                       detail=f"{seen.escaped}: an attempt to run a process untraced; "
                              f"the process's own outcome: {observed.outcome}")
    if seen.leak is not None:
        return replace(observed, outcome=f"{provenance.OUTCOME_PREFIX}{seen.leak.path}", path=None,
                       detail=f"{seen.leak_detail}; the process's own outcome: {observed.outcome}")
    if seen.incomplete is not None and outcome_kind(observed.outcome) is Kind.OK:
        # What was seen passed, but not all of the tree was seen: no pass on that strength.
        return replace(observed, outcome="harness-error", path=None,
                       detail=f"{seen.incomplete}: the cell is not judged on part of its processes; "
                              f"the process's own outcome: {observed.outcome}")
    if seen.not_used is None or not succeeded(observed):
        return observed
    return replace(observed, outcome=observe.OUTCOME_NOT_USED, path=None,
                   detail=f"{seen.not_used}; the process's own outcome: {observed.outcome}")


def succeeded(observed: Observed) -> bool:
    """Whether the program did not fail: it ended ``ok`` (exit 0, or a harness child's ``ok``),
    or a harness child reported a skip of its own.  Only such a cell may become neutral."""
    return (is_ok(observed.outcome) or is_neutral(observed.outcome)) and observed.exit_status in (None, 0)


def _from_verdict(res: ChildResult, v: Verdict) -> Observed:
    detail = v.detail
    data = dict(v.data)
    fp = data.pop("fingerprint", None)
    return Observed(outcome=v.outcome, path=v.path, error_name=v.error_name, detail=detail,
                    exit_status=res.returncode, data=data,
                    timings=Timings.from_json(v.timings), facts=child_facts(fp, data))


def child_facts(fingerprint: object, data: Mapping[str, object]) -> ChildFacts:
    """Typed facts from a child's ``fingerprint`` object and its runtime version."""
    fp: Mapping[str, object] = fingerprint if isinstance(fingerprint, Mapping) else {}
    rv = data.get("runtime_version")
    if rv is None:
        versions = data.get("versions")
        rv = versions.get("runtime") if isinstance(versions, Mapping) else None
    values: dict[str, object] = {k: fp.get(k) for k in _FACT_KEYS}
    values["runtime_version"] = rv if rv is not None else fp.get("runtime_version")
    return ChildFacts(
        runtime_version=_int(values["runtime_version"]), runtime_file=_str(values["runtime_file"]),
        driver_version=_int(values["driver_version"]), libcuda_file=_str(values["libcuda_file"]),
        gpu_name=_str(values["gpu_name"]), compute_capability=_str(values["compute_capability"]),
        forward_compat=values["forward_compat"] if isinstance(values["forward_compat"], bool) else None)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _line_with(text: str, needle: str) -> str:
    for line in text.splitlines():
        if needle in line:
            return line.strip()
    return needle
