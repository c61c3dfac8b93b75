"""The history store and its diff, on real SQLite files: what is kept, how runs compare,
bad files and run ids, prune, and the reports' "since the last run" section."""

from __future__ import annotations

import json
import sqlite3
import xml.etree.ElementTree as ET
import zlib
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest

from cumatrix.core.planned import Selection
from cumatrix.report import write_all
from cumatrix.report.jsonout import schema
from cumatrix.results.history import MIGRATIONS, SCHEMA_VERSION, CellKey, History, HistoryError, default_path
from cumatrix.results.historydiff import classify, diff, flips_of, noise_of, resolve
from history_nights import State, night_run

OK = State("pass")
SWAP = "cu12.9/host/loop/h12.9/kv"


def _states(**changes: State) -> dict[str, State]:
    base = {f"cu12.9/host/c{i}": OK for i in range(4)}
    base[SWAP] = State("pass", path="batch", gbps=100.0, speedup=2.0)
    base.update({(SWAP if k == "kv" else f"cu12.9/host/{k}"): v for k, v in changes.items()})
    return base


def test_default_location_follows_xdg_and_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CUMATRIX_HISTORY", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "cumatrix" / "history.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local" / "share" / "cumatrix" / "history.sqlite"
    monkeypatch.setenv("CUMATRIX_HISTORY", str(tmp_path / "h.sqlite"))
    assert default_path() == tmp_path / "h.sqlite"


def test_a_new_history_is_created_private_in_wal_mode_at_the_latest_schema(tmp_path: Path) -> None:
    path = tmp_path / "data" / "cumatrix" / "history.sqlite"
    with History.open(path):
        pass
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_a_history_of_an_older_schema_is_upgraded_step_by_step(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from cumatrix.results import history

    path = tmp_path / "h.sqlite"
    with History.open(path) as h:
        h.append(night_run(tmp_path, 0, _states()), kind="run", commit=None)
    step = "CREATE TABLE notes(run INTEGER NOT NULL, text TEXT NOT NULL)"
    monkeypatch.setattr(history, "MIGRATIONS", (*MIGRATIONS, step))
    monkeypatch.setattr(history, "SCHEMA_VERSION", len(MIGRATIONS) + 1)
    with History.open(path) as h:  # the next cumatrix opens it: one more step, the runs kept
        assert [r.run_uid for r in h.runs()] == ["night00abcd"]
        assert h.conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) + 1
        assert h.conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 0
    monkeypatch.undo()
    with pytest.raises(HistoryError, match="newer cumatrix"), History.open(path):  # and this one no longer reads it
        pass


def test_a_history_of_schema_1_gains_the_runs_selection(tmp_path: Path) -> None:
    """A history written before runs recorded their selection (schema 1) is upgraded in place:
    its runs read back as runs of every cell, and a run of a covering plan keeps its selection."""
    path = tmp_path / "h.sqlite"
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0].split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO runs(run_uid, kind, recorded, matrix, digest, host, fingerprint, verdict, n_pass, "
                 "n_fail, n_skip, n_not_run) VALUES ('old1', 'run', '2026-11-01T02:00:00Z', 'm.yaml', ?, 'h', '{}', "
                 "'PASS', 1, 0, 0, 0)", ("ab" * 32,))
    conn.commit()
    conn.close()
    run = night_run(tmp_path, 1, _states())
    sel = Selection(strength=2, seed=3, rotate=7, night=8)
    run = replace(run, runs=(replace(run.header, selection=sel), *run.runs[1:]))
    with History.open(path) as h:
        assert h.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        rid = h.append(run, kind="run", commit=None)
        old, new = h.runs()
        assert old.run_uid == "old1"
        assert old.selection is None
        assert new.id == rid
        assert new.selection == sel
        assert new.to_json()["selection"]["label"] == "rotation 1 of 7, cover 2, seed 3"


def test_append_keeps_a_short_row_per_cell_and_full_records_only_where_news(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    first = night_run(tmp_path, 0, _states())
    fixed = night_run(tmp_path, 3, _states(c1=State("pass", path="n/a")))
    second = night_run(tmp_path, 1, _states(c1=State("fail", outcome="exit:1")))
    third = night_run(tmp_path, 2, _states(c1=State("fail", outcome="exit:1")))
    with History.open(path) as h:
        ids = [h.append(r, kind="run", commit="abc123") for r in (first, second, third)]
        kept = [sorted(str(k) for k in h.records(i)) for i in ids]
        fixed_id = h.append(fixed, kind="run", commit=None)
        assert sorted(str(k) for k in h.records(fixed_id)) == ["cu12.9/host/c1"]  # the fix is news too
        stored = h.records(ids[1])[CellKey(name="cu12.9/host/c1")]
        rows = h.results(ids[2])
        runs = h.runs()
    # night 0: every cell passes (nothing is news); night 1: c1 changed; night 2: c1 still fails (kept)
    assert kept == [[], ["cu12.9/host/c1"], ["cu12.9/host/c1"]]
    assert stored == next(c for c in second.cells if c.id == "cu12.9/host/c1")  # the one to_json/from_json
    assert rows[CellKey(name=SWAP)].gbps == 100.0
    assert rows[CellKey(name=SWAP)].outcome == "ok:batch"
    assert rows[CellKey(name="cu12.9/host/c1")].status == "fail"
    assert [(r.id, r.passed, r.failed, r.git_commit, r.digest, r.host) for r in runs] == [
        (ids[0], 5, 0, "abc123", first.header.matrix_sha256, "nightly-host"),
        (ids[1], 4, 1, "abc123", first.header.matrix_sha256, "nightly-host"),
        (ids[2], 4, 1, "abc123", first.header.matrix_sha256, "nightly-host"),
        (fixed_id, 5, 0, None, first.header.matrix_sha256, "nightly-host")]
    # what is stored of a record is its to_json, compressed
    conn = sqlite3.connect(path)
    body = conn.execute("SELECT body FROM records WHERE run = ?", (ids[1],)).fetchone()[0]
    assert json.loads(zlib.decompress(body))["id"] == "cu12.9/host/c1"
    conn.close()


@pytest.mark.parametrize(("before", "after", "where"), [
    (OK, OK, None),
    (OK, State("fail", outcome="exit:1"), "new_failures"),
    (None, State("fail", outcome="exit:1"), "new_failures"),
    (State("fail", outcome="exit:1"), OK, "fixed"),
    (State("fail", outcome="exit:1"), State("fail", outcome="crash:SIGSEGV"), "changed"),
    (State("pass", path="batch"), State("pass", path="fallback"), "changed"),
    (OK, State("skip", outcome="skipped:no-cuda-driver"), "newly_skipped"),
    (OK, None, "newly_not_run"),
    (State("skip", outcome="skipped:no-cuda-driver"), OK, "changed"),
])
def test_classify_sorts_each_change_into_one_list(before: State | None, after: State | None, where: str | None) -> None:
    from cumatrix.results.history import Result

    def res(s: State | None) -> Result | None:
        return None if s is None else Result(status=s.status, outcome=s.label, gbps=None, speedup=None)

    assert classify(res(before), res(after)) == where


def test_noise_is_the_scaled_mad_with_a_floor() -> None:
    assert noise_of([10.0, 10.0, 10.0]) == (10.0, pytest.approx(0.2))  # the 2% floor
    m, noise = noise_of([90.0, 100.0, 110.0, 100.0, 100.0])
    assert m == 100.0
    assert noise == pytest.approx(2.0)
    m, noise = noise_of([80.0, 90.0, 100.0, 110.0, 120.0])
    assert m == 100.0
    assert noise == pytest.approx(1.4826 * 10)
    assert flips_of(["ok", "ok", "exit:1", "ok"]) == 2
    assert flips_of(["ok"]) == 0


def test_diff_defaults_to_the_last_two_runs_of_the_newest_runs_matrix(tmp_path: Path) -> None:
    with History.open(tmp_path / "h.sqlite") as h:
        a = h.append(night_run(tmp_path, 0, _states()), kind="run", commit=None)
        other = h.append(night_run(tmp_path, 1, _states(), digest="cd" * 32), kind="run", commit=None)
        b = h.append(night_run(tmp_path, 2, _states(c0=State("fail", outcome="exit:1"))), kind="run", commit=None)
        ra, rb = resolve(h, None, None)
        assert (ra.id, rb.id) == (a, b)  # the other matrix's run in between is passed over
        assert [x.id for x in resolve(h, str(b), None)] == [a, b]
        with pytest.raises(HistoryError, match="first run of its matrix"):
            resolve(h, str(other), None)
        d = diff(h, ra, rb)
        assert [str(c.cell) for c in d.new_failures] == ["cu12.9/host/c0"]
        assert not d.fixed
        assert not d.flaky
        assert h.run(h.run(str(b)).run_uid[:8]).id == b  # a run id prefix names it too
        with pytest.raises(HistoryError, match="ambiguous"):
            h.run("night0")
        for bad in ("99", "zzzzzz"):
            with pytest.raises(HistoryError, match="no run") as e:
                h.run(bad)
            assert e.value.exit_code == 2


def test_speed_beyond_noise_and_flips_within_the_window(tmp_path: Path) -> None:
    wobble = [100.0, 101.0, 99.0, 100.5, 99.5, 100.0]
    with History.open(tmp_path / "h.sqlite") as h:
        for n, g in enumerate(wobble):
            flip = State("fail", outcome="exit:1") if n in (2, 4) else OK
            h.append(night_run(tmp_path, n, _states(kv=State("pass", path="batch", gbps=g, speedup=2.0), c3=flip)),
                     kind="run", commit=None)
        same = diff(h, *resolve(h, None, None))
        assert not same.speed  # within the noise
        h.append(night_run(tmp_path, 9, _states(kv=State("pass", path="batch", gbps=80.0, speedup=1.6))),
                 kind="run", commit=None)
        d = diff(h, *resolve(h, None, None), trends=True)
        flaky_small = diff(h, *resolve(h, None, None), window=2)
    assert sorted((s.metric, round(s.median, 2), s.after) for s in d.speed) == [("gbps", 100.0, 80.0),
                                                                               ("speedup", 2.0, 1.6)]
    assert [(str(f.cell), f.flips) for f in d.flaky] == [("cu12.9/host/c3", 4)]
    assert not flaky_small.flaky  # only the last two runs: one flip at most
    assert [g for _, g in d.trends[CellKey(name=SWAP)]] == [*wobble, 80.0]  # type: ignore[index]


def test_prune_keeps_the_newest_of_each_matrix_or_drops_the_old(tmp_path: Path) -> None:
    with History.open(tmp_path / "h.sqlite") as h:
        ids = [h.append(night_run(tmp_path, n, _states()), kind="run", commit=None) for n in range(5)]
        other = h.append(night_run(tmp_path, 5, _states(), digest="cd" * 32), kind="run", commit=None)
        assert h.prune(keep=2) == ids[:3]
        assert [r.id for r in h.runs()] == [*ids[3:], other]
        from datetime import UTC, datetime

        gone = h.prune(older_than_days=1.0, now=datetime(2026, 11, 6, 12, tzinfo=UTC))  # nights: Nov 1-6, 02:00
        assert gone == ids[3:]
        assert [r.id for r in h.runs()] == [other]
        assert h.conn.execute("SELECT count(*) FROM results WHERE run IN (?, ?)", ids[3:]).fetchone()[0] == 0


def test_files_that_are_not_a_history_are_bad_input(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, but long enough to have a header " * 20)
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t(x)")
    conn.close()
    newer = tmp_path / "newer.sqlite"
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    for path, words in ((text, "not a cumatrix history"), (other, "not a cumatrix history"),
                        (newer, "newer cumatrix"), (tmp_path, "is a directory")):
        with pytest.raises(HistoryError, match=words) as e, History.open(path):
            pass
        assert e.value.exit_code == 2
    with pytest.raises(HistoryError, match="no history here yet"), History.open(tmp_path / "absent.sqlite",
                                                                                 create=False):
        pass


def test_every_report_gains_a_since_the_last_run_section(tmp_path: Path) -> None:
    with History.open(tmp_path / "h.sqlite") as h:
        h.append(night_run(tmp_path, 0, _states()), kind="run", commit=None)
        for n, g in enumerate((101.0, 99.0, 100.0), start=1):
            h.append(night_run(tmp_path, n, _states(kv=State("pass", path="batch", gbps=g, speedup=2.0))),
                     kind="run", commit=None)
        run = night_run(tmp_path, 5, _states(c2=State("fail", outcome="crash:SIGSEGV"),
                                              kv=State("pass", path="batch", gbps=50.0, speedup=1.0)))
        h.append(run, kind="run", commit=None)
        d = diff(h, *resolve(h, None, None), trends=True)
    out = tmp_path / "out"
    write_all(replace(run, since=d), out)
    md = (out / "summary.md").read_text()
    assert "### Since the last run" in md
    assert md.index("### Since the last run") < md.index("### ❌ Mismatches")  # read first
    assert "<code>cu12.9/host/c2</code>: ok:n/a → **crash:SIGSEGV**" in md
    assert "gbps 50, median 100" in md
    doc = json.loads((out / "results.json").read_text())
    jsonschema.Draft202012Validator(schema()).validate(doc)
    assert [c["cell"] for c in doc["since_last_run"]["new_failures"]] == ["cu12.9/host/c2"]
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property") if p.get("name", "").startswith("since")}
    assert props["since_last_run.new_failures"] == "1"
    assert props["since_last_run.speed"] == "2"
    assert "cu12.9/host/c2: ok:n/a -> crash:SIGSEGV" in (suite.findtext("system-out") or "")
    page = (out / "index.html").read_text()
    assert "<h2>Since the last run</h2>" in page
    assert page.count("<svg class=spark") == 1
    assert "<polyline points=" in page
    assert "http" not in page.split("<svg class=spark", 1)[1].split("</svg>", 1)[0].replace(
        "http://www.w3.org", "")  # no fetch from the plot
    # without a previous run, no section anywhere
    write_all(run, tmp_path / "plain")
    assert "Since the last run" not in (tmp_path / "plain" / "summary.md").read_text()
    assert "since_last_run" not in json.loads((tmp_path / "plain" / "results.json").read_text())


def test_a_merge_is_stored_per_cell_and_host_and_a_host_that_skipped_a_cell_shows_in_diff(tmp_path: Path) -> None:
    from cumatrix.report.merge import merge_runs
    from history_nights import write_night

    both = {"cu12.9/host/c0": OK, "cu12.9/host/c1": OK}
    with History.open(tmp_path / "h.sqlite") as h:
        for night, second in ((0, both), (1, {**both, "cu12.9/host/c1": State("not-run")})):
            dirs = [write_night(tmp_path / f"n{night}" / host, night, states)
                    for host, states in (("h1", both), ("h2", second))]
            rid = h.append(merge_runs(dirs, host_names=None), kind="merge", commit=None)
        assert sorted(str(k) for k in h.results(rid)) == ["cu12.9/host/c0 on h1", "cu12.9/host/c0 on h2",
                                                          "cu12.9/host/c1 on h1"]
        assert h.run(str(rid)).host == "h1, h2"
        d = diff(h, *resolve(h, None, None))
    assert [(str(c.cell), c.to_json()["after"]) for c in d.newly_not_run] == [("cu12.9/host/c1 on h2", "not-run")]
