"""Matrix validation and expansion: every problem as file:line:col, exit 2, no traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cumatrix import matrix as M
from cumatrix.errors import ConfigError

RT = "runtimes:\n  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\n"

# (name, matrix text, line, col, message regex)
BAD = [
    ("malformed-yaml", RT + "drivers: [host\ncases: []\n", None, None, r"malformed YAML"),
    ("unknown-top-key", RT + "driver: [host]\n", 3, 1, r"unknown key 'driver' \(did you mean 'drivers'\?\)"),
    ("unknown-case-key", RT + "drivers: [host]\ncases:\n  - {name: a, agrv: [true]}\n", 5, 15,
     r"unknown key 'agrv' \(did you mean 'argv'\?\)"),
    ("wrong-type-list", RT + "drivers: host\n", 3, 10, r"drivers: expected a list, got str 'host'"),
    ("wrong-type-timeout", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true], timeout: soon}\n", 5, 38,
     r"case\.timeout: expected seconds > 0, got 'soon'"),
    ("bad-version", RT + "drivers: [host]\nbuilds: ['12.x']\nvariants: [loop]\n"
     "workloads: [{name: w, direction: d2h, block_bytes: 4096, blocks: 4}]\n", 4, 10,
     r"builds\[\]: not a CUDA version .*'12\.x'"),
    ("bad-emulated-driver", RT + "drivers: [host, emulated-twelve]\n", 3, 17, r"malformed emulated driver 'emulated-twelve'"),
    ("bad-requirement", "runtimes:\n  cu12: {wheel: 'nvidia-cuda-runtime-cu12>=12'}\ndrivers: [host]\n", 2, 17,
     r"not a pinned requirement: 'nvidia-cuda-runtime-cu12>=12'"),
    ("duplicate-case", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true]}\n  - {name: a, argv: [false]}\n",
     6, 12, r"duplicate case name 'a' \(first defined on line 5\)"),
    ("duplicate-workload", RT + "drivers: [host]\nbuilds: ['13.0']\nvariants: [loop]\nworkloads:\n"
     "  - {name: w, direction: d2h, block_bytes: 4096, blocks: 4}\n"
     "  - {name: w, direction: h2d, block_bytes: 4096, blocks: 4}\n", 8, 12, r"duplicate workload name 'w'"),
    ("duplicate-yaml-key", RT + "drivers: [host]\ndrivers: [host]\n", 4, 1, r"duplicate key 'drivers'"),
    ("duplicate-runtime-key", "runtimes:\n  a: {wheel: nvidia-cuda-runtime==13.0.96}\n  a: {wheel: nvidia-cuda-runtime==13.0.96}\n"
     "drivers: [host]\n", 3, 3, r"duplicate key 'a'"),
    ("exclude-empties", RT + "drivers: [host]\nexclude: [{runtime: cu12.9}]\n", 4, 11, r"exclude removes every cell"),
    ("expect-selects-nothing", RT + "drivers: [host]\nexpect:\n  - {runtime: cu12.8, outcome: ok}\n", 5, 5,
     r"expect selects no cell: \{runtime: cu12\.8\} \(runtime 'cu12\.8' is not in the matrix \(did you mean 'cu12\.9'\?\)"),
    ("bad-outcome-word", RT + "drivers: [host]\nexpect:\n  - {runtime: cu12.9, outcome: segfault}\n", 5, 32,
     r"'segfault' is not an outcome"),
    ("missing-drivers", RT, 1, 1, r"missing required key 'drivers'"),
]


@pytest.mark.parametrize(("text", "line", "col", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_matrix_reports_place_and_exits_2(tmp_path: Path, cli, text: str, line: int | None, col: int | None,
                                               message: str) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(text)
    proc = cli("validate", f)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    num = r"\d+"
    where = rf"{re.escape(str(f))}:{line or num}:{col or num}: "
    assert re.search(rf"^{where}.*{message}", proc.stderr, re.M), proc.stderr
    for ln in proc.stderr.strip().splitlines():  # every line is a located problem
        assert ln.startswith(f"{f}:"), ln


def test_every_problem_reported_at_once() -> None:
    text = RT + "drivers: [host, hots]\ncases:\n  - {name: a, argv: [true], timeuot: 3}\nexlude: []\n"
    with pytest.raises(ConfigError) as ei:
        M.loads(text, "m.yaml")
    msgs = [str(p) for p in ei.value.problems]
    assert any(m.startswith("m.yaml:3:17: drivers: unknown driver 'hots'") for m in msgs), msgs
    assert any(m.startswith("m.yaml:5:29: case: unknown key 'timeuot' (did you mean 'timeout'?)") for m in msgs), msgs
    assert any(m.startswith("m.yaml:6:1: matrix: unknown key 'exlude' (did you mean 'exclude'?)") for m in msgs), msgs


def test_unreadable_file_exits_2(tmp_path: Path, cli) -> None:
    proc = cli("validate", tmp_path / "nope.yaml")
    assert proc.returncode == 2
    assert "nope.yaml" in proc.stderr and "Traceback" not in proc.stderr


def test_minimal_matrix_is_valid(write_matrix, cli) -> None:
    f = write_matrix("""
        runtimes:
          cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
        drivers: [host]
        cases:
          - {name: hello, argv: [echo, hi]}
          - {name: shell, argv: "sh -c 'exit 0'", timeout: 5}
    """)
    proc = cli("validate", f, "--list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == ["cu12.9/host/probe", "cu12.9/host/hello", "cu12.9/host/shell"]
    m = M.load(f)
    assert m.cases[1].argv == ("sh", "-c", "exit 0") and m.cases[1].timeout == 5.0


FULL = """
version: 1
runtimes:
  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}
  cu13.0: {wheel: nvidia-cuda-runtime==13.0.96}
drivers: [host, emulated-12.4]
builds: ["12.8", "13.0"]
variants: [proc-address, runtime-dispatch]
workloads:
  - {name: kv-16k-d2h, direction: d2h, block_bytes: 16KiB, blocks: 1024, layers: 32}
cases:
  - {name: import-smoke, argv: [python3, -c, "import ctypes"]}
exclude: [{runtime: cu13.0, driver: emulated-12.4}]
expect:
  - {variant: runtime-dispatch, runtime: cu12.9, outcome: [ok, "cuda-error:35"]}
"""


def test_expansion_ids_are_stable_and_readable() -> None:
    ids = [c.id for c in M.cells(M.loads(FULL, "full.yaml"))]
    assert ids == [c.id for c in M.cells(M.loads(FULL, "full.yaml"))]
    assert len(ids) == len(set(ids))
    assert ids[:4] == ["cu12.9/host/probe", "cu12.9/host/import-smoke",
                       "cu12.9/host/runtime-dispatch/h12.8/kv-16k-d2h", "cu12.9/host/runtime-dispatch/h13.0/kv-16k-d2h"]
    for want in ("none/host/proc-address/h12.8/kv-16k-d2h", "none/emulated-12.4/proc-address/h13.0/kv-16k-d2h",
                 "cu13.0/host/probe", "cu12.9/emulated-12.4/import-smoke"):
        assert want in ids
    assert not any(i.startswith("cu13.0/emulated-12.4/") for i in ids)  # excluded
    # 2 runtimes x host (probe + case + 2 builds) + cu12.9 x emulated (4) + driver family 2 drivers x 2 builds
    assert len(ids) == 4 * 2 + 4 + 2 * 2
    assert all(re.fullmatch(r"[A-Za-z0-9._+/-]+", i) for i in ids)


def test_validate_lists_the_same_ids(tmp_path: Path, cli) -> None:
    f = tmp_path / "full.yaml"
    f.write_text(FULL)
    proc = cli("validate", f, "--list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == [c.id for c in M.cells(M.load(f))]
    assert "16 cells" in proc.stdout.splitlines()[0]
