"""What the reports say of a run beside its verdict: the facts of the run header that
``summary.md``, ``index.html`` and ``junit.xml`` each show in their own markup."""

from __future__ import annotations

from cumatrix.results.records import RunData


def chosen_by(run: RunData) -> str | None:
    """The label of the selection that chose the run's cells (a covering plan's), or ``None``
    when the run ran every cell of its matrix."""
    selection = run.header.selection
    if selection is None or selection.full:
        return None
    return selection.label()


def gpu_names(run: RunData) -> tuple[int, list[str]] | None:
    """``(how many GPUs the host fingerprint lists, their distinct names, sorted)``, or ``None``
    when it lists none."""
    gpus = run.header.host_fingerprint.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        return None
    return len(gpus), sorted({str(g.get("name", "?")) for g in gpus if isinstance(g, dict)})
