"""Report writers: results.json against its schema, JUnit, Markdown, HTML, bad input, merge."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import jsonschema
import pytest

from cumatrix.core.errors import ConfigError
from cumatrix.report import load_records, merge_runs, progress_line, write_all
from cumatrix.report.jsonout import schema, to_json
from helpers.sample_run import NASTY, sample_records, write_jsonl


def _run_dir(tmp: Path, name: str, records: list[dict[str, object]], tail: str = "") -> Path:
    d = tmp / name
    d.mkdir()
    write_jsonl(d / "results.jsonl", records, tail=tail)
    return d


def _validate(doc: object) -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.Draft202012Validator(schema()).validate(doc)


# --------------------------------------------------------------------------- results.json


def test_results_json_validates_against_shipped_schema(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, "run", sample_records())
    paths = write_all(load_records(d / "results.jsonl"), d)
    assert [p.name for p in paths] == ["results.json", "junit.xml", "summary.md", "index.html"]
    doc = json.loads((d / "results.json").read_text())
    _validate(doc)
    assert doc["schema"] == 1
    assert doc["verdict"] == "FAIL"
    # the 34 skipped cells (cannot-emulate) ran their process before they were skipped: they
    # ran, but tested nothing
    assert doc["counts"] == {"total": 126, "pass": 90, "fail": 2, "skip": 34, "not_run": 0, "tested": 92, "ran": 126,
                             "skipped_after_running": 34}
    assert doc["headline"].startswith("cumatrix: FAIL — 92 of 126 cells tested: 2 did not meet expectations; ")
    assert doc["run"]["matrix_sha256"] == "a" * 64
    assert doc["run"]["finished"] == "2026-12-02T13:04:40Z"
    assert doc["run"]["host_fingerprint"]["driver_string"] == "580.159.04"
    cell = next(c for c in doc["cells"] if c["id"] == "cu12.9/host/runtime-dispatch/h12.8/kv-16k-d2h")
    assert cell["timings"]["speedup"] == pytest.approx(2.09)
    assert cell["timings"]["spread"]["p10"] < cell["timings"]["gbps"] < cell["timings"]["spread"]["p90"]
    assert cell["expected"]["outcomes"] == ["ok:batch"]
    assert not list((d).glob(".*.tmp"))


def test_schema_rejects_a_document_missing_its_version(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, "run", sample_records())
    doc = to_json(load_records(d / "results.jsonl"))
    del doc["schema"]
    with pytest.raises(jsonschema.ValidationError):
        _validate(doc)


def test_unknown_record_types_are_carried_through(tmp_path: Path) -> None:
    recs = sample_records()
    recs.insert(1, {"schema": 1, "type": "static", "findings": [{"elf": "x.so", "needs": "libcuda.so.1"}]})
    d = _run_dir(tmp_path, "run", recs)
    run = load_records(d / "results.jsonl")
    assert run.extra[0]["type"] == "static"
    doc = to_json(run)
    _validate(doc)
    assert doc["extra"][0]["findings"][0]["elf"] == "x.so"


# --------------------------------------------------------------------------- bad input


def test_truncated_last_line_is_ignored_with_a_warning(tmp_path: Path) -> None:
    recs = sample_records(truncate_after=10)
    half = json.dumps(sample_records()[11])[:57]  # a record cut mid-write
    d = _run_dir(tmp_path, "run", recs, tail=half)
    run = load_records(d / "results.jsonl")
    assert len(run.cells) == 10
    assert len(run.not_run) == 126 - 10  # listed in the header, never dropped
    assert run.verdict == "FAIL"  # the timeout probe is among the first ten
    assert run.interrupted
    assert len(run.warnings) == 1
    assert "cut mid-write" in run.warnings[0]
    write_all(run, d)
    doc = json.loads((d / "results.json").read_text())
    _validate(doc)
    assert doc["warnings"] == list(run.warnings)
    assert (d / "summary.md").read_text().count("⏸ not run") == 116
    assert "cut mid-write" in (d / "index.html").read_text()


def test_resumed_run_after_a_cut_line_keeps_the_latest_record(tmp_path: Path) -> None:
    recs = sample_records()
    header, first = recs[0], dict(recs[1])
    rerun = dict(first, status="pass", mismatch=None,
                 observed={"outcome": "ok", "path": "n/a", "error_name": None, "detail": "", "exit_status": 0})  # fmt: skip
    lines = [json.dumps(header), json.dumps(first), json.dumps(recs[2])[:40], json.dumps(header), json.dumps(rerun)]
    p = tmp_path / "results.jsonl"
    p.write_text("\n".join(lines) + "\n")
    run = load_records(p)
    assert len(run.runs) == 2
    assert [c.id for c in run.cells] == [first["id"]]
    assert run.cells[0].status == "pass"
    assert len(run.warnings) == 1


def test_garbage_in_the_middle_is_an_error_with_a_place(tmp_path: Path) -> None:
    recs = sample_records()
    p = tmp_path / "results.jsonl"
    p.write_text(json.dumps(recs[0]) + "\n{not json\n" + json.dumps(recs[1]) + "\n")
    with pytest.raises(ConfigError) as e:
        load_records(p)
    assert f"{p}:2:2:" in str(e.value)
    assert e.value.exit_code == 2


def test_newer_schema_is_refused_clearly(tmp_path: Path) -> None:
    recs = sample_records()
    recs[3] = dict(recs[3], schema=2)
    d = _run_dir(tmp_path, "run", recs)
    with pytest.raises(ConfigError) as e:
        load_records(d / "results.jsonl")
    msg = str(e.value)
    assert "written by a newer cumatrix (schema 2); upgrade" in msg
    assert msg.startswith(f"{d / 'results.jsonl'}:4:1:")
    assert e.value.exit_code == 2


def test_an_observed_outcome_that_is_no_outcome_word_is_refused_with_its_line(tmp_path: Path) -> None:
    recs = sample_records()
    at = next(i for i, r in enumerate(recs) if r["type"] == "cell")
    recs[at] = dict(recs[at], observed={**recs[at]["observed"], "outcome": "fine"})  # type: ignore[dict-item]
    p = write_jsonl(tmp_path / "results.jsonl", recs)
    with pytest.raises(ConfigError) as e:
        load_records(p)
    assert str(e.value).startswith(f"{p}:{at + 1}:")
    assert "outcome 'fine' is not an outcome word" in str(e.value)
    assert e.value.exit_code == 2


def test_file_without_run_header_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "results.jsonl"
    p.write_text("")
    with pytest.raises(ConfigError, match="no run header"):
        load_records(p)


def test_empty_run_writes_all_four_files(tmp_path: Path) -> None:
    header = dict(sample_records()[0], cells=[], cells_total=0)
    end = {"schema": 1, "type": "end", "finished": "2026-12-02T13:00:01Z", "interrupted": False}
    d = _run_dir(tmp_path, "run", [header, end])
    run = load_records(d / "results.jsonl")
    assert run.verdict == "EMPTY"
    write_all(run, d)
    doc = json.loads((d / "results.json").read_text())
    _validate(doc)
    assert doc["cells"] == []
    assert doc["counts"]["total"] == 0
    root = ET.parse(d / "junit.xml").getroot()
    assert root.get("tests") == "0"
    assert root.findall(".//testcase") == []
    md = (d / "summary.md").read_text()
    assert md.splitlines()[0] == "**cumatrix: EMPTY** — the matrix selection has no cells; nothing ran"
    assert "no cells" in (d / "index.html").read_text()


# --------------------------------------------------------------------------- headline


def _as_skipped(rec: dict[str, object], reason: str) -> dict[str, object]:
    return dict(rec, status="skip", mismatch=None, observed={"outcome": reason, "detail": "no libcuda.so.1"})


def test_a_run_in_which_no_cell_ran_is_not_a_pass(tmp_path: Path) -> None:
    """Every cell skipped (a GPU runner whose driver vanished): NOTHING TESTED everywhere, never PASS."""
    recs = sample_records()
    cells = [_as_skipped(r, "skipped:no-cuda-driver") if r["type"] == "cell" else r for r in recs]
    d = _run_dir(tmp_path, "run", cells)
    run = load_records(d / "results.jsonl")
    n = len(run.cells)
    assert run.verdict == "NOTHING TESTED"
    assert run.counts.tested == 0
    write_all(run, d)
    line = (f"0 of {n} cells tested; {n} skipped ({n} skipped:no-cuda-driver: no CUDA driver, the GPU cells were "
            "not tested); 0 not run")
    assert (d / "summary.md").read_text().splitlines()[0] == f"**cumatrix: NOTHING TESTED** — {line}"
    doc = json.loads((d / "results.json").read_text())
    _validate(doc)
    assert doc["verdict"] == "NOTHING TESTED"
    props = {p.get("name"): p.get("value") for p in ET.parse(d / "junit.xml").getroot().find("testsuite").iter("property")}  # type: ignore[union-attr]
    assert props["verdict"] == "NOTHING TESTED"
    assert line in (props["headline"] or "")
    page = (d / "index.html").read_text()
    assert "NOTHING TESTED" in page
    assert line in page
    assert "PASS" not in page.split("<body", 1)[1].split("</header>")[0]


def test_a_cell_skipped_after_its_process_ran_tested_nothing(tmp_path: Path) -> None:
    """A probe that loaded its runtime and found no driver ran, but tested nothing: a run of
    such cells alone is NOTHING TESTED, not a PASS of cells that 'ran'."""
    recs = sample_records()
    cells = [dict(r, status="skip", mismatch=None, observed={"outcome": "cannot-emulate", "exit_status": 0})
             if r["type"] == "cell" else r for r in recs]
    d = _run_dir(tmp_path, "run", cells)
    run = load_records(d / "results.jsonl")
    assert run.counts.ran == len(run.cells)
    assert run.counts.tested == 0
    assert run.verdict == "NOTHING TESTED"


def test_headline_says_how_many_were_tested_skipped_and_not_run(tmp_path: Path) -> None:
    # The sample's two mismatches and one pass become GPU cells skipped for want of a driver,
    # beside the sample's cannot-emulate cells.
    recs = sample_records()
    picked = [i for i, r in enumerate(recs) if r.get("status") == "fail"]
    picked.append(next(i for i, r in enumerate(recs) if r.get("status") == "pass"))
    for i in picked:
        recs[i] = _as_skipped(recs[i], "skipped:no-cuda-driver")
    d = _run_dir(tmp_path, "run", recs)
    run = load_records(d / "results.jsonl")
    c = run.counts
    assert run.verdict == "PASS"
    assert c.tested == c.passed == len(run.cells) - 3 - c.partial
    assert dict(c.all_skip_reasons) == {"skipped:no-cuda-driver": 3, "cannot-emulate": c.partial}
    from cumatrix.report.headline import headline

    assert headline(run) == (
        f"cumatrix: PASS — {c.tested} of {c.total} cells tested: all met expectations; {c.skipped} skipped "
        f"({c.partial} cannot-emulate: the real driver cannot stand in for the emulated one there; 3 "
        "skipped:no-cuda-driver: no CUDA driver, the GPU cells were not tested); 0 not run"
    )


# --------------------------------------------------------------------------- junit


def test_junit_one_testcase_per_cell_with_failures_skips_and_properties(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, "run", sample_records(truncate_after=60))
    write_all(load_records(d / "results.jsonl"), d)
    root = ET.parse(d / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 126
    assert root.get("tests") == "126"
    assert len({(c.get("classname"), c.get("name")) for c in cases}) == 126
    failures = root.findall(".//testcase/failure")
    assert root.get("failures") == str(len(failures)) == "2"
    skipped = [c for c in cases if c.find("skipped") is not None]
    assert root.get("skipped") == str(len(skipped))
    assert sum(1 for c in skipped if c.find("skipped").get("message") == "not run") == 66  # type: ignore[union-attr]
    bad = next(c for c in cases if c.get("name") == "cu13.0/host/header-dispatch/h12.8/kv-16k-d2h")
    assert bad.get("classname") == "cumatrix.cu13_0.host"
    f = bad.find("failure")
    assert f is not None
    assert "9-param call" in (f.get("message") or "")
    assert "<script>window.__pwned = 1</script>" in (f.text or "")  # escaped by XML, read back as text
    assert "\x1b" not in (f.text or "")
    assert "\x07" not in (f.text or "")
    ok = next(c for c in cases if c.get("name") == "cu12.9/host/runtime-dispatch/h12.8/kv-16k-d2h")
    props = {p.get("name"): p.get("value") for p in ok.iter("property")}
    assert props["outcome"] == "ok"
    assert props["path"] == "batch"
    assert props["expected"] == "ok:batch"
    assert float(props["speedup"] or 0) == pytest.approx(2.09)
    assert float(props["gbps"] or 0) == pytest.approx(15.7)


# --------------------------------------------------------------------------- markdown


def test_summary_verdict_mismatches_grid_and_speed(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, "run", sample_records())
    write_all(load_records(d / "results.jsonl"), d)
    md = (d / "summary.md").read_text()
    lines = md.splitlines()
    assert lines[0] == (
        "**cumatrix: FAIL** — 92 of 126 cells tested: 2 did not meet expectations; 34 skipped (34 cannot-emulate: "
        "the real driver cannot stand in for the emulated one there); 0 not run"
    )
    assert md.index("Mismatches (2)") < md.index("Outcomes by driver") < md.index("Bandwidth")
    assert "9-param call into a 13.x runtime" in md
    # The grid with the mismatch is open; a grid where all went as expected is folded.
    assert "#### driver host · workload kv-16k-d2h" in md
    assert "<details><summary>driver host · workload kv-4k-h2d: 30 cells, all as expected" in md
    assert "| **cu12.9** |" in md
    assert "proc-address h12.8" in md
    assert "❌ crash:SIGSEGV" in md
    assert "🎯 crash:SIGSEGV" in md
    assert "✅ ok:batch" in md
    assert "| runtime-dispatch | 12.8 | cu12.9 | host | 15.7 | 15.2–16.0 | 7.5 | 2.09× | 20 |" in md
    assert len(md.encode()) < 1024 * 1024


def test_markdown_escapes_metacharacters_and_ansi(tmp_path: Path) -> None:
    recs = sample_records()
    for r in recs:
        if r.get("id") == "cu13.0/host/header-dispatch/h12.8/kv-16k-d2h":
            r["mismatch"] = NASTY
    d = _run_dir(tmp_path, "run", recs)
    write_all(load_records(d / "results.jsonl"), d)
    md = (d / "summary.md").read_text()
    assert "\x1b" not in md
    assert "[31m" not in md
    assert "\x07" not in md
    # Rendered as GitHub would (CommonMark with tables): the child's HTML stays text, in lines
    # and in the stderr excerpts' fenced blocks alike.
    from markdown_it import MarkdownIt

    page = MarkdownIt("commonmark").enable("table").render(md)
    assert "<script>" not in page
    assert "<img" not in page
    assert "&lt;script&gt;" in md
    assert "&lt;script&gt;" in page
    line = next(ln for ln in md.splitlines() if "header-dispatch/h12.8/kv-16k-d2h</code>: observed" in ln)
    assert r"\*bold\*" in line
    assert r"\`tick\`" in line
    assert r"\| pipe" in line
    assert r"\_under\_" in line
    assert r"\[link\]" in line


# --------------------------------------------------------------------------- html


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.tags: list[str] = []
        self.attrs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [name for name, _ in attrs]
        if tag == "script":
            self.scripts.append(dict(attrs))


def test_html_is_self_contained_and_escapes_cell_text(tmp_path: Path) -> None:
    d = _run_dir(tmp_path, "run", sample_records())
    write_all(load_records(d / "results.jsonl"), d)
    page = (d / "index.html").read_text()
    parser = _Scripts()
    parser.feed(page)
    # exactly the two data blocks and the page's own script; no <img>, no external anything
    assert parser.scripts == [{"type": "application/json", "id": "cumatrix-data"},
                              {"type": "application/json", "id": "cumatrix-details"}, {}]
    assert "img" not in parser.tags
    assert "link" not in parser.tags
    assert "iframe" not in parser.tags
    assert not {"src", "href", "srcset", "onerror", "onload", "action"} & set(parser.attrs)
    assert "<script>window.__pwned" not in page
    assert "\x1b" not in page
    assert "default-src 'none'" in page
    blocks = {}
    for name in ("cumatrix-data", "cumatrix-details"):
        text = page.split(f'<script type="application/json" id={name}>', 1)[1].split("</script>", 1)[0]
        assert "</" not in text
        assert "<" not in text
        blocks[name] = json.loads(text)
    ids = [c[0] for c in blocks["cumatrix-data"]["cells"]]
    bad = blocks["cumatrix-details"][ids.index("cu13.0/host/header-dispatch/h12.8/kv-16k-d2h")]
    assert "<script>window.__pwned = 1</script>" in bad["se"]
    assert "\x1b" not in bad["se"]
    # The mismatch list is markup from the template: escaped by autoescaping, not by hand.
    assert "9-param call into a 13.x runtime" in page
    assert "&lt;script&gt;" not in blocks["cumatrix-details"][0].get("se", "")


def test_html_page_stays_small_per_cell(tmp_path: Path) -> None:
    """The page carries each cell in a compact index (repeated strings once): under 1 KB a cell."""
    d = _run_dir(tmp_path, "run", sample_records(nasty_stderr=False))
    run = load_records(d / "results.jsonl")
    write_all(run, d)
    size = (d / "index.html").stat().st_size
    fixed = len((d / "index.html").read_text().split("<script type=\"application/json\"", 1)[0])
    assert (size - fixed) / len(run.cells) < 1024, (size, fixed, len(run.cells))


# --------------------------------------------------------------------------- merge


def test_merge_refuses_two_matrices(tmp_path: Path) -> None:
    a = _run_dir(tmp_path, "h200", sample_records())
    other = sample_records()
    other[0] = dict(other[0], matrix="nightly.yaml", matrix_sha256="b" * 64)
    b = _run_dir(tmp_path, "a100", other)
    with pytest.raises(ConfigError) as e:
        merge_runs([a, b], host_names=None)
    msg = str(e.value)
    assert str(a / "results.jsonl") in msg
    assert str(b / "results.jsonl") in msg
    assert "a" * 64 in msg
    assert "b" * 64 in msg
    assert e.value.exit_code == 2


def test_merge_tags_hosts_and_shows_cells_no_host_ran(tmp_path: Path) -> None:
    full = sample_records()
    ids = [r["id"] for r in full if r["type"] == "cell"]
    a_recs = [full[0], *[r for r in full[1:-1] if "/host/" in str(r["id"])]]
    b_head = dict(full[0], host="a100-550")
    b_recs = [b_head, *[r for r in full[1:-1] if "/host/" in str(r["id"])][:20]]
    a = _run_dir(tmp_path, "h200-580", a_recs)
    b = _run_dir(tmp_path, "b", b_recs)
    run = merge_runs([a, b], host_names=None)
    assert run.hosts == ("h200-580", "a100-550")  # directory name, then the header's host
    host_ids = {c.id for c in run.cells}
    assert {c.host for c in run.cells} == {"h200-580", "a100-550"}
    first = ids[0]
    assert sorted(c.host or "" for c in run.cells if c.id == first) == ["a100-550", "h200-580"]
    assert set(run.not_run) == set(ids) - host_ids
    assert run.not_run
    assert all("/emulated-12.4/" in cid for cid in run.not_run)
    write_all(run, tmp_path / "merged")
    doc = json.loads((tmp_path / "merged" / "results.json").read_text())
    _validate(doc)
    assert doc["hosts"] == ["h200-580", "a100-550"]
    assert doc["counts"]["not_run"] == len(run.not_run)
    root = ET.parse(tmp_path / "merged" / "junit.xml").getroot()
    names = [(c.get("classname"), c.get("name")) for c in root.iter("testcase")]
    assert len(names) == len(set(names)) == len(run.cells) + len(run.not_run)
    md = (tmp_path / "merged" / "summary.md").read_text()
    assert "host a100-550 · driver host" in md
    assert "(no host)" in md
    renamed = merge_runs([a, b], host_names=["x", "y"])
    assert renamed.hosts == ("x", "y")


def test_merge_refuses_two_runs_claiming_one_host(tmp_path: Path) -> None:
    a = _run_dir(tmp_path, "one", [dict(sample_records()[0], host="same")])
    b = _run_dir(tmp_path, "two", [dict(sample_records()[0], host="same")])
    with pytest.raises(ConfigError, match="both host 'same'"):
        merge_runs([a, b], host_names=None)


# --------------------------------------------------------------------------- progress


def test_progress_line_counts_and_eta() -> None:
    line = progress_line(12, 120, 60.0, "cu12.9/host/driver-dispatch/h13.0/kv-16k-d2h", "pass", "crash:SIGSEGV")
    assert line == "[ 12/120  10%] ETA  9m00s  PASS  cu12.9/host/driver-dispatch/h13.0/kv-16k-d2h  crash:SIGSEGV"
    assert "ETA     --" in progress_line(0, 5, 0.0, "x", "skip", "skipped:no-docker")
    assert "\x1b" not in progress_line(1, 1, 1.0, "\x1b[31mx", "fail", "timeout")
