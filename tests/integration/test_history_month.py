"""A month of nightlies: 30 runs with injected regressions, fixes, flips, skips, a path
change and bandwidth moves, each recorded by the real ``cumatrix merge`` into one real
SQLite history; after every night ``cumatrix diff --json`` must list exactly what was
injected, and the flaky list exactly the cells that flipped twice within the window."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

from history_nights import State, write_night

NIGHTS = 30
WINDOW = 10  # diff's default
COMMANDS = [f"cu12.9/host/c{i:02d}" for i in range(8)]
SWAPS = [f"cu12.9/host/loop/h12.9/w{i}" for i in range(3)]
C = dict(zip(("c00", "c01", "c02", "c03", "c04", "c05", "c06", "c07"), COMMANDS, strict=True))
FAIL = State("fail", outcome="exit:1")


def command_state(cell: str, k: int) -> State:
    """The injected schedule of the command cells."""
    if cell == C["c01"] and k >= 5:  # a regression that stays
        return FAIL
    if cell == C["c02"] and 8 <= k <= 12:  # broken for five nights, then fixed
        return FAIL
    if cell == C["c03"] and k >= 20 and k % 2 == 0:  # flips every other night
        return FAIL
    if cell == C["c04"] and k >= 15:  # skipped from night 15
        return State("skip", outcome="skipped:no-cuda-driver", path=None)
    if cell == C["c05"] and k == 18:  # not run one night
        return State("not-run")
    if cell == C["c06"]:  # one failure turning into another, then fixed
        if k == 10:
            return State("fail", outcome="crash:SIGSEGV")
        if k == 11:
            return State("fail", outcome="exit:2")
    return State("pass")


def level(cell: str, k: int) -> float:
    """Bandwidth level: w1 drops 30% from night 25; w2 jumps 40% on night 7 alone."""
    if cell == SWAPS[1] and k >= 25:
        return 0.7
    if cell == SWAPS[2] and k == 7:
        return 1.4
    return 1.0


def swap_state(cell: str, k: int) -> State:
    i = SWAPS.index(cell)
    wobble = 1 + 0.005 * ((k * 7 + i * 3) % 5 - 2) / 2  # within +-0.5%: run-to-run noise
    path = "fallback" if cell == SWAPS[0] and k >= 22 else "batch"  # the path changes on night 22
    lv = level(cell, k) * wobble
    return State("pass", path=path, gbps=100.0 * (i + 1) * lv, speedup=2.0 * lv)


def night(k: int) -> dict[str, State]:
    return {**{c: command_state(c, k) for c in COMMANDS}, **{s: swap_state(s, k) for s in SWAPS}}


# ----------------------------------------------------------------- the expected diff, from the schedule


def expected(k: int) -> dict[str, set[tuple[Any, ...]]]:
    """What diff must say of night k against night k-1, from the schedule and the rules of
    docs/history.md (not from the code under test)."""
    before, after = night(k - 1), night(k)
    out: dict[str, set[tuple[Any, ...]]] = {n: set() for n in ("new_failures", "fixed", "changed", "newly_skipped",
                                                                "newly_not_run", "speed", "flaky")}
    for cell in before:
        b, a = before[cell], after[cell]
        if (b.status, b.label) == (a.status, a.label):
            continue
        if a.status == "fail" and b.status != "fail":
            where = "new_failures"
        elif b.status == "fail" and a.status == "pass":
            where = "fixed"
        elif a.status == "skip" and b.status in ("pass", "fail"):
            where = "newly_skipped"
        elif a.status == "not-run":
            where = "newly_not_run"
        else:
            where = "changed"
        out[where].add((cell, b.label, a.label))
    for cell in SWAPS:  # moved: the level differs from the median level of the runs before by > 10%
        earlier = [level(cell, j) for j in range(max(0, k - WINDOW), k)]
        if len(earlier) >= 3 and abs(level(cell, k) / statistics.median(earlier) - 1) > 0.1:
            out["speed"] |= {(cell, "gbps"), (cell, "speedup")}
    for cell in before:
        seq = [night(j)[cell].label for j in range(max(0, k - WINDOW + 1), k + 1) if night(j)[cell].status != "not-run"]
        flips = sum(1 for x, y in itertools.pairwise(seq) if x != y)
        if flips >= 2:
            out["flaky"].add((cell, flips))
    return out


def got(doc: dict[str, Any]) -> dict[str, set[tuple[Any, ...]]]:
    out = {n: {(c["cell"], c["before"], c["after"]) for c in doc[n]}
           for n in ("new_failures", "fixed", "changed", "newly_skipped", "newly_not_run")}
    out["speed"] = {(s["cell"], s["metric"]) for s in doc["speed"]}
    out["flaky"] = {(f["cell"], f["flips"]) for f in doc["flaky"]}
    return out


def test_the_schedule_injects_what_the_test_says() -> None:
    """The model the month is checked against, pinned on the nights of each injection."""
    assert expected(5)["new_failures"] == {(C["c01"], "ok:n/a", "exit:1")}
    assert not expected(6)["new_failures"]
    assert expected(13)["fixed"] == {(C["c02"], "exit:1", "ok:n/a")}
    assert expected(11)["changed"] == {(C["c06"], "crash:SIGSEGV", "exit:2")}
    assert expected(15)["newly_skipped"] == {(C["c04"], "ok:n/a", "skipped:no-cuda-driver")}
    assert expected(18)["newly_not_run"] == {(C["c05"], "ok:n/a", "not-run")}
    assert expected(19)["changed"] == {(C["c05"], "not-run", "ok:n/a")}
    assert expected(22)["changed"] == {(SWAPS[0], "ok:batch", "ok:fallback")}
    assert expected(7)["speed"] == {(SWAPS[2], "gbps"), (SWAPS[2], "speedup")}
    assert not expected(8)["speed"]
    assert {c for c, _ in expected(25)["speed"]} == {SWAPS[1]} == {c for c, _ in expected(29)["speed"]}
    assert (C["c02"], 2) in expected(16)["flaky"]
    assert (C["c02"], 2) not in expected(17)["flaky"]
    assert (C["c03"], 9) in expected(29)["flaky"]
    assert not any(c == C["c01"] for c, _ in expected(29)["flaky"])


def test_a_month_of_nightlies(tmp_path: Path, cli: Callable[..., CompletedProcess[str]]) -> None:
    hist = tmp_path / "history.sqlite"
    mismatches = []
    for k in range(NIGHTS):
        d = write_night(tmp_path / f"night-{k:02d}", k, night(k))
        p = cli("merge", d, "--out", tmp_path / f"report-{k:02d}", "--history", hist, cwd=tmp_path)
        incomplete = any(s.status in ("fail", "not-run") for s in night(k).values())
        assert p.returncode == (1 if incomplete else 0), p.stderr  # merge's own status: FAIL or INCOMPLETE is 1
        assert "warning" not in p.stderr, p.stderr
        if k == 0:
            p = cli("diff", "--history", hist, cwd=tmp_path)
            assert p.returncode == 2
            assert "first run of its matrix" in p.stderr
            assert "Traceback" not in p.stderr
            continue
        p = cli("diff", "--json", "--history", hist, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert (doc["a"]["id"], doc["b"]["id"]) == (k, k + 1)
        if got(doc) != expected(k):
            mismatches.append((k, got(doc), expected(k)))
    assert not mismatches, mismatches

    # the reports of the night of the bandwidth drop say so, first thing after the verdict
    md = (tmp_path / "report-25" / "summary.md").read_text()
    assert "### Since the last run" in md
    assert f"<code>{SWAPS[1]}</code>: gbps 140" in md
    page = (tmp_path / "report-25" / "index.html").read_text()
    assert page.count("<svg class=spark") == len(SWAPS)

    # an explicit pair, a run id, the text form
    p = cli("diff", "4", "14", "--history", hist, cwd=tmp_path)  # nights 3 and 13
    assert p.returncode == 0
    assert f"{C['c01']}: ok:n/a -> exit:1" in p.stdout
    assert "new failures (1)" in p.stdout
    p = cli("diff", "night13abcd", "--history", hist, "--json", cwd=tmp_path)
    assert p.returncode == 0
    assert json.loads(p.stdout)["fixed"][0]["cell"] == C["c02"]
    for bad in (("diff", "77"), ("diff", "1", "nosuchrun")):
        p = cli(*bad, "--history", hist, cwd=tmp_path)
        assert p.returncode == 2, p.stderr
        assert "no run" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr, p.stderr

    p = cli("history", "--json", "--history", hist, cwd=tmp_path)
    runs = json.loads(p.stdout)["runs"]
    assert [r["run_id"] for r in runs] == [f"night{k:02d}abcd" for k in range(NIGHTS)]
    assert [r["counts"]["fail"] for r in runs] == [sum(s.status == "fail" for s in night(k).values())
                                                  for k in range(NIGHTS)]
    p = cli("history", "--prune", "--keep", "10", "--history", hist, cwd=tmp_path)
    assert p.returncode == 0
    assert "deleted 20 runs" in p.stdout
    p = cli("history", "--history", hist, cwd=tmp_path)
    assert p.stdout.count("nightly.yaml") == 10
    p = cli("diff", "--json", "--history", hist, cwd=tmp_path)
    assert got(json.loads(p.stdout)) == expected(NIGHTS - 1)  # the window is what is left
