"""Read the records a run wrote into its ``--out`` directory (``results.jsonl``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_records(out: Path) -> list[dict[str, Any]]:
    """Every record of ``out/results.jsonl``, in order."""
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line]


def read_cells(out: Path) -> dict[str, dict[str, Any]]:
    """The cell records, by cell id."""
    return {str(r["id"]): r for r in read_records(out) if r.get("type") == "cell"}


def read_cells_by_case(out: Path) -> dict[str, dict[str, Any]]:
    """The cell records, by the last part of the cell id (the case's name)."""
    return {str(r["id"]).split("/")[-1]: r for r in read_records(out) if r.get("type") == "cell"}
