"""Stage five: the judge.  The one place where a cell's status, mismatch and reason are
decided, and where its :class:`~cumatrix.core.record.CellRecord` is made.

Everything before it produces facts (the expectation, the job, the child's result, the
observed outcome); everything after it renders the record.  The rules, in order:

1. a ``sh -c`` wrapper's exit status 128+N is the signal N its command died of (gate
   ``--smoke`` commands: dash does not ``exec`` the last command);
2. an outcome that means "this pairing cannot be emulated" becomes ``cannot-emulate``: a
   program that succeeded where emulation cannot vouch for it, or the interposer's own
   signature (error 103); any other failure keeps its outcome and is judged;
3. neutral outcomes (``skipped:*``, ``cannot-emulate``) neither pass nor fail, except
   ``skipped:no-cuda-driver`` and ``skipped:no-compiler`` under ``require_gpu`` (a GPU runner
   whose driver vanished, or that cannot build its GPU cells); only a cell whose program did not
   fail reaches this rule as neutral (a failed program's ``runtime-not-used`` stays a fact,
   :func:`cumatrix.judge.classify.with_audit`);
4. a probe's own facts must agree with the runtime provisioned and NVIDIA's table;
5. otherwise the cell passes when the observed outcome is in the expected set.
"""

from __future__ import annotations

import datetime as dt
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from cumatrix.core.jobs import ChildResult
from cumatrix.core.model import Cell, Expected, Kind, Observed, is_neutral, is_ok, outcome_kind
from cumatrix.core.record import CellRecord, Status
from cumatrix.predict import oracle

#: Bytes of each child stream kept in a record.
STREAM_KEEP = 4096


def utcnow() -> str:
    """Now, as the records write it."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, kw_only=True, slots=True)
class Facts:
    """What the judge knows beside the cell's own observation."""

    host: oracle.HostFacts
    host_fingerprint: Mapping[str, object] = field(default_factory=dict)
    backend: str = "local"
    host_label: str | None = None
    #: ``cudaRuntimeGetVersion`` of the runtime provisioned for the cell, if known.
    provisioned_runtime: int | None = None
    provisioned_runtime_file: str | None = None
    require_gpu: bool = False
    #: The cell's command runs under ``sh -c`` (exit 128+N means signal N).
    shell_wrapped: bool = False
    #: What the rtld-audit saw (``libraries``, ``runtime_file``, ``runtime_version``,
    #: ``runtime_evidence``, ``runtime_origin``): the runtime really used, which wins over the one offered.
    observed: Mapping[str, object] = field(default_factory=dict)
    #: The evidence no cell here could have (``trace``, ``audit``: a compiled part neither
    #: installed nor buildable), each with why; recorded on every cell it concerns.
    missing_evidence: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    status: Status
    mismatch: str | None
    observed: Observed


def decide(cell: Cell, expected: Expected, observed: Observed, facts: Facts) -> Verdict:
    """Status, mismatch and the final observation of ``cell`` (rules 1 to 5 above)."""
    if facts.shell_wrapped:
        observed = shell_signal(observed)
    observed = reconcile(cell, observed, facts.host, expected)
    if is_neutral(observed.outcome):
        return _neutral(observed, require_gpu=facts.require_gpu)
    if not expected.admits(observed.outcome, observed.path):
        return Verdict(status="fail", mismatch=_mismatch(expected, observed), observed=observed)
    if cell.kind == "probe":
        wrong = probe_disagreement(observed, facts.provisioned_runtime)
        if wrong:
            return Verdict(status="fail", mismatch=wrong, observed=observed)
    return Verdict(status="pass", mismatch=None, observed=observed)


def _neutral(observed: Observed, *, require_gpu: bool) -> Verdict:
    """A neutral outcome is a skip, unless ``--require-gpu`` makes a cell that could not reach a
    GPU a failure."""
    if require_gpu and observed.outcome == "skipped:no-cuda-driver":
        return Verdict(status="fail", observed=observed,
                       mismatch="--require-gpu: this cell needs a GPU and the host has no usable NVIDIA driver "
                                f"({observed.detail or 'no driver'})")
    if require_gpu and observed.outcome == "skipped:no-compiler":
        # A GPU runner without gcc would otherwise pass a nightly whose GPU cells never built.
        return Verdict(status="fail", observed=observed,
                       mismatch=f"--require-gpu: this GPU cell could not be built here ({observed.detail})")
    return Verdict(status="skip", mismatch=None, observed=observed)


def decide_child(expected: Expected, observed: Observed) -> Verdict:
    """The verdict on a harness child run outside a matrix (``calibrate``'s measuring child):
    rule 5 alone, it passes when its outcome is in the expected set."""
    if expected.admits(observed.outcome, observed.path):
        return Verdict(status="pass", mismatch=None, observed=observed)
    return Verdict(status="fail", mismatch=_mismatch(expected, observed), observed=observed)


def _mismatch(expected: Expected, observed: Observed) -> str:
    shown = observed.outcome + (f" (path {observed.path})" if observed.path and observed.outcome == "ok" else "")
    why = f"expected {expected.label()} because {expected.reason}; observed {shown}"
    if observed.detail:
        why += f": {observed.detail.splitlines()[0][:300]}"
    return why


def shell_signal(observed: Observed) -> Observed:
    """A shell reports a child killed by signal N as exit 128+N (dash does not exec ``-c``)."""
    code = observed.exit_status
    if outcome_kind(observed.outcome) is not Kind.EXIT or code is None or not 128 < code < 128 + 65:
        return observed
    try:
        name = signal.Signals(code - 128).name
    except ValueError:
        return observed
    detail = f"the shell running the command exited {code}: its command was killed by {name}"
    if observed.detail:
        detail += f"; {observed.detail}"
    return replace(observed, outcome=f"crash:{name}", detail=detail)


def reconcile(cell: Cell, observed: Observed, host: oracle.HostFacts, expected: Expected) -> Observed:
    """Map observations that mean "this pairing cannot be emulated" to ``cannot-emulate``."""
    # A leaked runtime is the program's fault on any driver: emulation does not excuse it.  Nor
    # does it excuse any other failure but the interposer's own signature (error 103, below): a
    # program that failed otherwise is judged against its prediction, never made neutral.
    if expected.outcomes == {"cannot-emulate"} and (is_ok(observed.outcome) or emulation_detected(observed)):
        shown = f"observed {observed.outcome}" + (f" (path {observed.path})" if observed.path else "")
        return replace(observed, outcome="cannot-emulate", detail=f"{shown}; {expected.reason}")
    d = oracle.effective_driver(cell, host)
    if cell.driver.startswith("emulated-") and emulation_detected(observed) and d != host.driver_version:
        return replace(observed, outcome="cannot-emulate",
                       detail=f"observed cuda-error:103 ({observed.error_name or 'integrity checks failed'}): "
                              "the runtime detected the interposer")
    return observed


def emulation_detected(observed: Observed) -> bool:
    """The one failure that says the emulation, not the program, failed: a CUDA 12 runtime's
    integrity check refusing the interposer (``cudaErrorSoftwareValidityNotEstablished``, 103),
    as a harness child reports it (a command's exit status cannot say which error it was)."""
    return observed.outcome == "cuda-error:103"


def probe_disagreement(observed: Observed, provisioned: int | None) -> str | None:
    """A probe's facts must agree with the wheel it was given and with NVIDIA's table."""
    rv = observed.facts.runtime_version
    if rv is None:
        return None
    if provisioned is not None and rv != provisioned:
        return f"the child loaded runtime {rv}, not the provisioned {provisioned}: another libcudart shadows it"
    exported = observed.data.get("batch_exported")
    if exported is not None and bool(exported) != (rv >= oracle.batch_introduced()):
        return (f"runtime {rv} {'exports' if exported else 'does not export'} cudaMemcpyBatchAsync, "
                f"against the rule that it appears in {oracle.batch_introduced()}")
    return None


def fingerprint(observed: Observed, child: ChildResult | None, facts: Facts) -> dict[str, object]:
    """The record's fingerprint: the host's facts, overridden by what the child itself saw."""
    hfp = facts.host_fingerprint
    gpus = hfp.get("gpus")
    gpu0: Mapping[str, object] = gpus[0] if isinstance(gpus, list) and gpus and isinstance(gpus[0], Mapping) else {}
    cf = observed.facts
    extra = child.extra if child is not None else {}

    def pick(child_value: object, host_value: object) -> object:
        return child_value if child_value is not None else host_value

    runtime_file, runtime_version, audit = _runtime_seen(observed, facts)
    if child is not None and child.trace is not None:
        audit["trace"] = child.trace.to_json()
    if facts.missing_evidence:
        audit["missing_evidence"] = [m.split(":", 1)[0] for m in facts.missing_evidence]
        audit["missing_evidence_why"] = list(facts.missing_evidence)
    return {**audit,
        "backend": facts.backend,
        "driver_version": pick(cf.driver_version, hfp.get("driver_version")),
        "driver_string": hfp.get("driver_string"),
        "gpu_name": pick(cf.gpu_name, gpu0.get("name")),
        "compute_capability": pick(cf.compute_capability, gpu0.get("compute_capability")),
        "forward_compat": pick(cf.forward_compat, hfp.get("forward_compat", False)),
        "libcuda_file": cf.libcuda_file,
        "runtime_file": runtime_file,
        "runtime_version": runtime_version,
        "image": extra.get("image"),
        "image_id": extra.get("image_id"),
        # How the cell was held: its process tree (cgroup-v2 | subreaper), its sandbox.
        "containment": extra.get("containment"),
        "sandbox": extra.get("sandbox"),
        "killed_after": extra.get("killed_after"),
    }


def _runtime_seen(observed: Observed, facts: Facts) -> tuple[str | None, int | None, dict[str, object]]:
    """(runtime file, runtime version, the rest of the audit's record): what the process tree
    mapped where it was observed, else what the child said, else what was provisioned."""
    cf = observed.facts
    runtime_file = cf.runtime_file or facts.provisioned_runtime_file
    runtime_version = cf.runtime_version if cf.runtime_version is not None else (
        facts.provisioned_runtime if runtime_file == facts.provisioned_runtime_file else None)
    audit: dict[str, object] = {}
    if facts.observed:  # observed: what the process tree mapped, not what was offered
        audit = {k: v for k, v in facts.observed.items() if k not in ("runtime_file", "runtime_version")}
        runtime_file = _opt_str(facts.observed.get("runtime_file"))
        seen_version = facts.observed.get("runtime_version")
        runtime_version = cf.runtime_version if cf.runtime_version is not None else (
            seen_version if isinstance(seen_version, int) else None)
    return runtime_file, runtime_version, audit


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def judge(cell: Cell, expected: Expected, observed: Observed, child: ChildResult | None, facts: Facts, *,
          started: str, duration_s: float) -> CellRecord:
    """The record of a finished cell."""
    v = decide(cell, expected, observed, facts)
    wall = child.duration_s if child is not None else duration_s
    timings = replace(v.observed.timings, wall_s=round(wall, 4))
    return CellRecord(
        id=cell.id, axes=cell.axes(), host=facts.host_label, expected=expected, observed=v.observed,
        status=v.status, mismatch=v.mismatch, timings=timings, fingerprint=fingerprint(v.observed, child, facts),
        stderr_tail=child.stderr_tail[-STREAM_KEEP:] if child else "",
        stdout_tail=child.stdout_tail[-STREAM_KEEP:] if child else "",
        started=started, duration_s=round(duration_s, 4))
