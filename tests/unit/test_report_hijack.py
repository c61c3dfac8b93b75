"""Reports that cannot be hijacked: a cell's output stays text in summary.md, rendered by a real
CommonMark renderer (markdown-it-py), and reaches the terminal without escape sequences.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cumatrix.report import load_records, write_all
from cumatrix.report.text import md_fenced
from helpers.sample_run import sample_records, write_jsonl

markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py renders the summary (test extra)")

FAILED_ID = "cu13.0/host/header-dispatch/h12.8/kv-16k-d2h"
BREAKOUT = ("fatal: boom\n\n\n</pre></details>\n\n![img](http://attacker.invalid/x.png)\n"
            "[click](http://attacker.invalid/)\n# Owned heading\n```\n````\n<script>alert(1)</script>\n")


def _render(tmp_path: Path, stderr: str) -> tuple[str, str]:
    recs = sample_records()
    for r in recs:
        if r.get("id") == FAILED_ID:
            r["stderr_tail"] = stderr
    d = tmp_path / "run"
    d.mkdir(exist_ok=True)
    write_jsonl(d / "results.jsonl", recs)
    write_all(load_records(d / "results.jsonl"), d)
    md = (d / "summary.md").read_text()
    return md, markdown_it.MarkdownIt("commonmark").render(md)


def test_a_cells_stderr_cannot_break_out_of_its_block(tmp_path: Path) -> None:
    _md, page = _render(tmp_path, BREAKOUT)
    assert "<img" not in page
    assert 'href="http://attacker.invalid' not in page
    assert "<h1>Owned heading</h1>" not in page
    assert "<script>" not in page
    assert "# Owned heading" in page
    assert "![img](http://attacker.invalid/x.png)" in page
    assert "&lt;script&gt;" in page


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.lists(st.sampled_from(["\n", "`", "```", "````", "~~~", "# h", "![i](http://x.invalid/i.png)",
                                      "[l](http://x.invalid/)", "<b>", "</details>", "</pre>", "    ", "-", "x"]),
                     max_size=30).map("".join))
def test_any_output_stays_inside_one_code_block(body: str) -> None:
    block = "\n".join(md_fenced(body))
    tokens = markdown_it.MarkdownIt("commonmark").parse(block)
    assert [t.type for t in tokens] == ["fence"]
    assert tokens[0].content == body + "\n"  # all of it, as written


def test_terminal_text_keeps_no_control_sequence() -> None:
    from cumatrix.report.text import clean

    nasty = "\x1b]0;owned title\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b[Hcleared\x9b31mC1\x1bP+q\x1b\\done"
    assert "\x1b" not in clean(nasty)
    assert "\x07" not in clean(nasty)
    assert "\x9b" not in clean(nasty)
    assert "cleared" in clean(nasty)
    assert "done" in clean(nasty)


def test_the_pytest_failure_section_is_clean(tmp_path: Path, cli_env: object) -> None:
    import subprocess
    import sys

    m = tmp_path / "m.yaml"
    code = ("import sys; sys.stderr.write('\\x1b]0;owned\\x07\\x1b]52;c;ZXZpbA==\\x07\\x1b[2Jafter-clear\\n'); "
            "sys.exit(3)")
    m.write_text("runtimes: {cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}}\ndrivers: [host]\nprobe: false\n"
                 f"cases:\n  - {{name: esc, argv: [{sys.executable}, -c, \"{code}\"]}}\n")
    wheels = Path.home() / ".cache" / "cumatrix" / "wheels"
    if not list(wheels.glob("nvidia_cuda_runtime_cu12-12.9.79-*.whl")):
        pytest.skip(f"no nvidia-cuda-runtime-cu12 12.9.79 wheel in {wheels}")
    proc = subprocess.run([sys.executable, "-m", "pytest", str(m), "-p", "no:cacheprovider", "-q",
                           f"--cumatrix-wheel-dir={wheels}"], cwd=tmp_path, env=cli_env(), capture_output=True,
                          timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out.decode(errors="replace")
    assert b"after-clear" in out  # the failure section is shown...
    assert b"\x1b]" not in out
    assert b"\x07" not in out
    assert b"\x1b[2J" not in out
