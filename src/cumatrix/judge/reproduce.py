"""The judge of a catalog entry: does a bad cell show a known bug's signature beside a good one?

``cumatrix repro --bug`` runs the entry's two cells through the orchestrator; whether that
reproduces the bug is decided here, from the cells' observations, as every other verdict is
decided in this stage.  A host without a GPU still runs both cells: provisioning builds each
variant, so a bug whose signature is the build itself (``build-error``) is decided by the
build alone, and the good cell needs only to build.
"""

from __future__ import annotations

from dataclasses import dataclass

from cumatrix.core.model import Observed
from cumatrix.load.catalog import Bug

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"


@dataclass(frozen=True, kw_only=True, slots=True)
class BugVerdict:
    """Whether each cell showed what the entry says, and the one-line reason."""

    bad_ok: bool
    good_ok: bool
    why: str

    @property
    def reproduced(self) -> bool:
        return self.bad_ok and self.good_ok

    @property
    def word(self) -> str:
        return REPRODUCED if self.reproduced else NOT_REPRODUCED


def shown(observed: Observed) -> str:
    """An outcome as the reports show it (``ok:batch``: the path of an ``ok``)."""
    p = observed.path
    return f"{observed.outcome}:{p}" if observed.outcome == "ok" and p and p != "n/a" else observed.outcome


def judge_bug(bug: Bug, *, bad_id: str, bad: Observed, bad_detail: str, good_id: str, good: Observed,
              good_detail: str) -> BugVerdict:
    """Both cells ran: the bad one must show the bug's signature, the good one must pass.

    ``*_detail`` is what the signature's ``detail_contains`` is looked for in (for a build
    error, the compiler's whole message, of which the record keeps the tail)."""
    bad_ok = bug.bad.shows(bad.outcome, bad.path, bad_detail)
    good_ok = bug.good.shows(good.outcome, good.path, good_detail)
    why = (f"bad cell {bad_id}: {shown(bad)} ({'the signature' if bad_ok else 'not the signature ' + bug.bad.outcome}); "
           f"good cell {good_id}: {shown(good)} ({'passes' if good_ok else 'expected ' + bug.good.outcome})")
    return BugVerdict(bad_ok=bad_ok, good_ok=good_ok, why=why)


def judge_build_only(bug: Bug, *, bad: Observed, bad_log: str, good: Observed) -> BugVerdict:
    """No GPU here: the cells ran as far as their builds.  The bad cell must fail to build as
    the entry says (its ``detail_contains`` in the compiler's message), the good one must build."""
    bad_failed = bad.outcome == "build-error"
    contains = bug.bad.detail_contains
    bad_ok = bad_failed and "build-error" in bug.bad.outcomes and (contains is None or contains in bad_log)
    good_ok = good.outcome != "build-error"
    why = (f"bad cell: {'build-error' if bad_failed else 'built'}"
           + (f" ({'contains' if contains in bad_log else 'lacks'} '{contains}')" if contains else "")
           + f"; good cell: {'builds' if good_ok else 'build-error'}")
    return BugVerdict(bad_ok=bad_ok, good_ok=good_ok, why=why)


def judge_static(bug: Bug, *, driver: str, bad: tuple[str, ...] | None, good: tuple[str, ...] | None) -> BugVerdict:
    """No GPU here, and the bug's evidence is in the binaries: ``bad`` and ``good`` are the
    driver entry points each built variant links directly that are newer than ``driver`` (None:
    it did not build).  The bad one must link the symbol its expected ``undefined-symbol:SYM``
    names, the good one none: loading them under that driver fails, and does not, for that reason."""
    want = [o.split(":", 1)[1] for o in bug.bad.outcomes if o.startswith("undefined-symbol:")]
    bad_ok = bad is not None and any(w in bad for w in want)
    good_ok = good is not None and not good
    def said(links: tuple[str, ...] | None) -> str:
        if links is None:
            return "did not build"
        return f"links {', '.join(links)} directly" if links else "links no driver symbol newer than that"
    why = (f"read from the built binaries against a CUDA {driver} driver: bad variant {said(bad)}; "
           f"good variant {said(good)}")
    return BugVerdict(bad_ok=bad_ok, good_ok=good_ok, why=why)
