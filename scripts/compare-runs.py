#!/usr/bin/env python3
"""Compare two runs of the same matrix cell by cell: outcome, path and status.

    python3 scripts/compare-runs.py reports/gpu-h200/results.json NEW/results.json > comparison.md

Exit status 0 when every cell of the old run has the same outcome, path and status in the new
one (cells only one run has are listed, and count as differences), 1 otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def cells(path: Path) -> dict[str, tuple[str, str, str]]:
    doc = json.loads(path.read_text())
    out = {}
    for c in doc["cells"]:
        obs = c["observed"]
        out[c["id"]] = (obs["outcome"], obs.get("path") or "", c["status"])
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    old_path, new_path = Path(argv[0]), Path(argv[1])
    old, new = cells(old_path), cells(new_path)
    ids = list(old) + [i for i in new if i not in old]
    same = [i for i in ids if old.get(i) == new.get(i)]
    differ = [i for i in ids if old.get(i) != new.get(i)]
    print(f"# Cell by cell: `{old_path}` against `{new_path}`\n")
    print(f"{len(ids)} cells: {len(same)} the same (outcome, path, status), {len(differ)} different\n")
    print("| cell | before | after | same |")
    print("|---|---|---|---|")
    for i in ids:
        def show(v: tuple[str, str, str] | None) -> str:
            if v is None:
                return "(not in this run)"
            outcome, path, status = v
            return f"{outcome}{':' + path if outcome == 'ok' and path and path != 'n/a' else ''} ({status})"
        print(f"| `{i}` | {show(old.get(i))} | {show(new.get(i))} | {'yes' if i in same else '**NO**'} |")
    return 0 if not differ else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
