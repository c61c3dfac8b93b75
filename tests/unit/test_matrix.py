"""Matrix validation and expansion: every problem as file:line:col, exit 2, no traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cumatrix.core.errors import ConfigError
from cumatrix.load import matrix as M
from cumatrix.load import workdir

RT = "runtimes:\n  cu12.9: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\n"

# (name, matrix text, line, col, message regex)
BAD = [
    ("malformed-yaml", RT + "drivers: [host\ncases: []\n", None, None, r"malformed YAML"),
    ("unknown-top-key", RT + "driver: [host]\n", 3, 1, r"unknown key 'driver' \(did you mean 'drivers'\?\)"),
    ("unknown-case-key", RT + "drivers: [host]\ncases:\n  - {name: a, agrv: [true]}\n", 5, 15,
     r"unknown key 'agrv' \(did you mean 'argv'\?\)"),
    ("wrong-type-list", RT + "drivers: host\n", 3, 10, r"drivers: expected a list, got str 'host'"),
    ("wrong-type-timeout", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true], timeout: soon}\n", 5, 38,
     r"cases\[0\]\.timeout: expected seconds > 0 and at most 604800 \(a week\), got str 'soon'"),
    ("bad-version", RT + "drivers: [host]\nbuilds: ['12.x']\nvariants: [loop]\n"
     "workloads: [{name: w, direction: d2h, block_bytes: 4096, blocks: 4}]\n", 4, 10,
     r"builds\[0\]: expected a CUDA version MAJOR\.MINOR .*got str '12\.x'"),
    ("bad-emulated-driver", RT + "drivers: [host, emulated-twelve]\n", 3, 17, r"malformed emulated driver 'emulated-twelve'"),
    # Well-formed, but no such CUDA release: no driver to emulate (12.7 was never released).
    ("no-such-emulated-release", RT + "drivers: [host, emulated-12.44]\n", 3, 17,
     r"emulated-12\.44: there is no CUDA 12\.44 release to emulate.*known: 12\.0, 12\.1, "),
    ("skipped-emulated-release", RT + "drivers: [host, emulated-12.7]\n", 3, 17, r"no CUDA 12\.7 release"),
    ("bad-requirement", "runtimes:\n  cu12: {wheel: 'nvidia-cuda-runtime-cu12>=12'}\ndrivers: [host]\n", 2, 17,
     r"not a pinned requirement: 'nvidia-cuda-runtime-cu12>=12'"),
    # PEP 508 as packaging reads it: a version that is no version is not a pin (a regular expression let it by).
    ("not-a-version", "runtimes:\n  cu12: {wheel: 'nvidia-cuda-runtime-cu12==12.9..79'}\ndrivers: [host]\n", 2, 17,
     r"not a pinned requirement: 'nvidia-cuda-runtime-cu12==12\.9\.\.79'"),
    ("duplicate-case", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true]}\n  - {name: a, argv: [false]}\n",
     6, 12, r"duplicate case name 'a' \(first defined on line 5\)"),
    ("duplicate-workload", RT + "drivers: [host]\nbuilds: ['13.0']\nvariants: [loop]\nworkloads:\n"
     "  - {name: w, direction: d2h, block_bytes: 4096, blocks: 4}\n"
     "  - {name: w, direction: h2d, block_bytes: 4096, blocks: 4}\n", 8, 12, r"duplicate workload name 'w'"),
    ("duplicate-yaml-key", RT + "drivers: [host]\ndrivers: [host]\n", 4, 1, r"duplicate key 'drivers'"),
    ("duplicate-runtime-key", ("runtimes:\n  a: {wheel: nvidia-cuda-runtime==13.0.96}\n"
                               "  a: {wheel: nvidia-cuda-runtime==13.0.96}\ndrivers: [host]\n"), 3, 3, r"duplicate key 'a'"),
    ("exclude-empties", RT + "drivers: [host]\nexclude: [{runtime: cu12.9}]\n", 4, 11, r"exclude removes every cell"),
    ("expect-selects-nothing", RT + "drivers: [host]\nexpect:\n  - {runtime: cu12.8, outcome: ok}\n", 5, 5,
     r"expect selects no cell: \{runtime: cu12\.8\} \(runtime 'cu12\.8' is not in the matrix \(did you mean 'cu12\.9'\?\)"),
    ("bad-outcome-word", RT + "drivers: [host]\nexpect:\n  - {runtime: cu12.9, outcome: segfault}\n", 5, 32,
     r"'segfault' is not an outcome"),
    ("missing-drivers", RT, 1, 1, r"missing required key 'drivers'"),
    ("allow-runtime-relative", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true], allow_runtime: [lib/libcudart.so.13]}\n",
     5, 45, (r"cases\[0\]\.allow_runtime\[0\]: expected an absolute path or glob \(starting with /, no NUL bytes\), "
             r"got str 'lib/libcudart\.so\.13'")),
    ("allow-runtime-directory", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true], allow_runtime: [/usr/local/cuda-13.0/lib64/]}\n",
     5, 45, r"allow_runtime: '/usr/local/cuda-13\.0/lib64/' is a directory; name the runtime file"),
    ("allow-runtime-dotdot", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true], allow_runtime: [/opt/x/../cuda/libcudart.so.13]}\n",
     5, 45, r"is not a plain path \(write it as '/opt/cuda/libcudart\.so\.13'\)"),
    ("allow-runtime-not-a-list", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true], allow_runtime: /usr/lib/libcudart.so.13}\n",
     5, 44, r"allow_runtime: expected a list of absolute paths or globs of runtime files"),
    ("runtime-leak-relative", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true]}\nexpect:\n  - {case: a, outcome: 'runtime-leak:x'}\n",
     7, 24, r"'runtime-leak:x' is not an outcome"),
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
    assert re.search(rf"^{where}.*{message}", proc.stderr, re.MULTILINE), proc.stderr
    for ln in proc.stderr.strip().splitlines():  # every line is a located problem
        assert ln.startswith(f"{f}:"), ln


def test_allow_runtime_and_runtime_leak_outcomes_are_read() -> None:
    m = M.loads(RT + "drivers: [host]\ncases:\n  - name: a\n    argv: [true]\n"
                "    allow_runtime: [/usr/local/cuda-13.0/lib64/libcudart.so.13, '/opt/cuda-*/lib*/libcudart.so.*']\n"
                "expect:\n  - {case: a, outcome: 'runtime-leak:/usr/lib/x86_64-linux-gnu/libcudart.so.13', reason: known}\n",
                "m.yaml")
    assert m.cases[0].allow_runtime == ("/usr/local/cuda-13.0/lib64/libcudart.so.13", "/opt/cuda-*/lib*/libcudart.so.*")
    assert m.expect[0].outcomes == {"runtime-leak:/usr/lib/x86_64-linux-gnu/libcudart.so.13"}


def test_every_problem_reported_at_once() -> None:
    text = RT + "drivers: [host, hots]\ncases:\n  - {name: a, argv: [true], timeuot: 3}\nexlude: []\n"
    with pytest.raises(ConfigError) as ei:
        M.loads(text, "m.yaml")
    msgs = [str(p) for p in ei.value.problems]
    assert any(m.startswith("m.yaml:3:17: drivers: unknown driver 'hots'") for m in msgs), msgs
    assert any(m.startswith("m.yaml:5:29: cases[0]: unknown key 'timeuot' (did you mean 'timeout'?)") for m in msgs), msgs
    assert any(m.startswith("m.yaml:6:1: matrix: unknown key 'exlude' (did you mean 'exclude'?)") for m in msgs), msgs


def test_unreadable_file_exits_2(tmp_path: Path, cli) -> None:
    proc = cli("validate", tmp_path / "nope.yaml")
    assert proc.returncode == 2
    assert "nope.yaml" in proc.stderr
    assert "Traceback" not in proc.stderr


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
    assert m.cases[1].argv == ("sh", "-c", "exit 0")
    assert m.cases[1].timeout == 5.0


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


# --------------------------------------------------------------------------- hostile input

CASE = RT + "drivers: [host]\ncases:\n  - "


def _at(text: str, needle: str) -> tuple[int, int]:
    """1-based line and column of the first ``needle`` in ``text``."""
    i = text.index(needle)
    return text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1


# (name, matrix text, text at the reported place, message regex)
HOSTILE = [
    ("timeout-nan", CASE + "{name: a, argv: [true], timeout: .nan}\n", ".nan",
     r"cases\[0\]\.timeout: expected seconds > 0 and at most 604800 \(a week\), got float \.nan"),
    ("timeout-inf", CASE + "{name: a, argv: [true], timeout: .inf}\n", ".inf", r"got float \.inf"),
    ("timeout-negative", CASE + "{name: a, argv: [true], timeout: -5}\n", "-5", r"got int -5"),
    ("timeout-zero", CASE + "{name: a, argv: [true], timeout: 0}\n", "0}", r"got int 0"),
    ("nul-in-argv", CASE + '{name: a, argv: [echo, "x\\0y"]}\n', '"x', r"cases\[0\]\.argv\[1\]: .*without NUL bytes"),
    ("nul-in-argv-string", CASE + '{name: a, argv: "echo x\\0y"}\n', '"echo', r"cases\[0\]\.argv: .*NUL"),
    ("nul-in-env-value", CASE + '{name: a, argv: [true], env: {A: "x\\0"}}\n', '"x', r"cases\[0\]\.env\.A: .*NUL"),
    ("equals-in-env-key", CASE + '{name: a, argv: [true], env: {"A=B": x}}\n', '"A=B"',
     r"cases\[0\]\.env: key 'A=B': expected a variable name without '=' or NUL"),
    ("nul-in-env-key", CASE + '{name: a, argv: [true], env: {"A\\0": x}}\n', '"A', r"key 'A\\x00'"),
    ("nested-600", RT + "drivers: [host]\ncases: " + "[" * 600 + "]" * 600 + "\n", "[" * 537 + "]",
     r"nested deeper than 64 levels"),
    ("control-character", RT + "drivers: [host]\ncases:\n  - {name: a, argv: [ec\x01ho]}\n", "\x01",
     r"control character U\+0001"),
    ("name-ending-newline", CASE + '{name: "a\\n", argv: [true]}\n', '"a', r"cases\[0\]\.name: expected a name"),
    ("name-with-slash", CASE + "{name: a/b, argv: [true]}\n", "a/b", r"cases\[0\]\.name: expected a name"),
    ("name-with-tab", CASE + '{name: "a\\tb", argv: [true]}\n', '"a', r"cases\[0\]\.name: expected a name"),
    ("runtime-name-slash", "runtimes:\n  cu/12: {wheel: nvidia-cuda-runtime-cu12==12.9.79}\ndrivers: [host]\n",
     "cu/12", r"runtimes: key 'cu/12': expected a name"),
    ("build-99", RT + "drivers: [host]\nbuilds: ['99.0']\nvariants: [loop]\n"
     "workloads: [{name: w, direction: d2h, block_bytes: 4096, blocks: 4}]\n", "'99.0'",
     r"builds: no CUDA 99\.0 headers.*known: 12\.0, 12\.4, 12\.8, 12\.9, 13\.0, 13\.5"),
    ("build-11", RT + "drivers: [host]\nbuilds: ['11.0']\nvariants: [loop]\n"
     "workloads: [{name: w, direction: d2h, block_bytes: 4096, blocks: 4}]\n", "'11.0'",
     r"builds: no CUDA 11\.0 headers.*known: 12\.0"),
    ("build-integer", RT + "drivers: [host]\nbuilds: [12]\nvariants: [loop]\n"
     "workloads: [{name: w, direction: d2h, block_bytes: 4096, blocks: 4}]\n", "12]",
     r"builds\[0\]: not a CUDA version .*'12'"),
    ("huge-integer", CASE + "{name: a, argv: [true], timeout: " + "9" * 5000 + "}\n", "9999",
     r"cannot read '9+' as int"),
    ("second-document", RT + "drivers: [host]\n---\nx: 1\n", "---", r"a second YAML document"),
    ("alias-bomb", "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(6)),
     "*e", r"aliases expand the document past"),
    ("not-utf8", RT + "drivers: [host]\n# caf\xe9\n", "caf", r"not UTF-8 text: byte 0xe9"),
    ("alias-undefined", RT + "drivers: *nope\n", "*nope", r"alias \*nope names no anchor defined before it"),
    ("alias-cycle", RT + "drivers: [host]\ncases: &c [{name: a, argv: *c}]\n", "*c",
     r"alias \*c refers to a collection that contains it"),
    ("alias-as-key", RT + "drivers: &d [host]\n? *d\n: 1\n", "*d", r"mapping keys must be plain names \(not an alias\)"),
    ("scalar-alias-as-key", RT + "drivers: [&d host]\n*d : 1\n", "*d :", r"mapping keys must be plain names \(not an alias\)"),
    ("mapping-as-key", RT + "drivers: [host]\n? {a: 1}\n: 1\n", "{a: 1}", r"mapping keys must be plain names, not lists"),
    ("anchor-defined-twice", RT + "drivers: &d [host]\nbuilds: &d ['12.8']\n", "&d ['12.8']",
     r"anchor &d is defined twice \(first on line 3\)"),
    ("aliased-bad-value", RT + "x: &bad {name: a, argv: [true], timeout: soon}\ndrivers: [host]\ncases:\n  - *bad\n",
     "*bad", r"cases\[0\]\.timeout: expected seconds > 0"),
    ("aliased-duplicate-name", RT + "drivers: [&h host, *h]\n", "*h", r"duplicate driver name 'host'"),
    ("merge-key", RT + "drivers: [host]\nx: &x {argv: [true]}\ncases:\n  - <<: *x\n    name: a\n", "<<",
     r"cases\[0\]: unknown key '<<'"),
    ("python-tag", RT + "drivers: !!python/object:os.system [host]\n", "!!python", r"unsupported YAML tag"),
]


@pytest.mark.parametrize(("text", "needle", "message"), [h[1:] for h in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_input_is_a_located_validation_error(tmp_path: Path, cli, text: str, needle: str,
                                                     message: str) -> None:
    f = tmp_path / "m.yaml"
    if needle == "caf":
        f.write_bytes(text.encode("latin-1"))
        line, col = _at(text, needle)
        col += 3  # the byte after "caf"
    else:
        f.write_text(text)
        line, col = _at(text, needle)
    proc = cli("validate", f)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert re.search(rf"^{re.escape(str(f))}:{line}:{col}: .*{message}", proc.stderr, re.MULTILINE), proc.stderr


def test_c_loader_is_used_where_pyyaml_has_it() -> None:
    import yaml

    from cumatrix.load import yamldoc

    if not getattr(yaml, "__with_libyaml__", False):
        pytest.skip("this PyYAML was built without libyaml")
    assert yamldoc.Loader is yaml.CSafeLoader


def test_aliases_expand_to_their_anchors_value() -> None:
    text = (RT + "drivers: &d [host, emulated-12.4]\ncases:\n  - &c {name: a, argv: [echo, &w hi]}\n"
            "  - {name: b, argv: [*w, *w]}\nexpect:\n  - {driver: host, case: a, outcome: &ok [ok, 'exit:1']}\n"
            "  - {driver: emulated-12.4, case: b, outcome: *ok}\n")
    m = M.loads(text, "m.yaml")
    assert [d.name for d in m.drivers] == ["host", "emulated-12.4"]
    assert m.cases[1].argv == ("hi", "hi")
    assert m.expect[1].outcomes == {"ok", "exit:1"}


def test_a_large_document_with_aliases_is_not_a_bomb() -> None:
    # Every value counts once where it is written and again for each alias that repeats it:
    # 10,000 cases that share their argv stay far below the limit.
    text = (RT + "drivers: [host]\nprobe: false\ncases:\n  - {name: c0, argv: &argv [python3, -c, pass]}\n"
            + "".join(f"  - {{name: c{i}, argv: *argv}}\n" for i in range(1, 10_000)))
    m = M.loads(text, "m.yaml")
    assert len(m.cases) == 10_000
    assert m.cases[-1].argv == ("python3", "-c", "pass")


def test_load_parses_once_per_content(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text(FULL)
    first = M.load(f)
    assert M.load(f) is first  # same bytes: no second parse
    f.write_text(FULL.replace("blocks: 1024", "blocks: 512"))
    changed = M.load(f)
    assert changed is not first
    assert changed.workloads[0].blocks == 512


def test_integral_floats_are_integers() -> None:
    m = M.loads(RT + "drivers: [host]\nbuilds: ['12.8']\nvariants: [loop]\n"
                "workloads: [{name: w, direction: d2h, block_bytes: 4096.0, blocks: 4.0, layers: 2.0}]\n", "m.yaml")
    w = m.workloads[0]
    assert (w.block_bytes, w.blocks, w.layers) == (4096, 4, 2)
    assert all(type(v) is int for v in (w.block_bytes, w.blocks, w.layers))


def test_values_keep_their_written_text() -> None:
    m = M.loads(RT + "drivers: [host]\nbuilds: [12.8]\nvariants: [loop]\n"
                "workloads: [{name: w, direction: d2h, block_bytes: 16KiB, blocks: 4}]\n"
                "cases:\n  - {name: c, argv: [sleep, 1], env: {N: 4}}\n"
                "exclude: [{build: 12.8, variant: loop, family: driver}]\n", "m.yaml")
    assert [str(b) for b in m.builds] == ["12.8"]
    assert m.cases[0].argv == ("sleep", "1")
    assert m.cases[0].env == (("N", "4"),)
    assert m.workloads[0].block_bytes == 16384
    assert m.exclude[0].values == (("build", "12.8"), ("variant", "loop"), ("family", "driver"))


@pytest.mark.parametrize(("fn", "value"), [(M.check_timeout, "nan"), (M.check_timeout, "-5"), (M.check_timeout, "0"),
                                           (M.check_timeout, "inf"), (M.check_timeout, "soon"),
                                           (M.check_name, "a\n"), (M.check_name, "a/b"),
                                           (M.check_env_name, "A=B"), (M.check_env_name, "A\0")])
def test_option_validators_refuse_what_the_loader_refuses(fn, value: str) -> None:
    with pytest.raises(ConfigError) as e:
        fn(value, "--opt")
    assert e.value.exit_code == 2
    assert str(e.value).startswith("--opt: ")


def test_option_validators_pass_good_values() -> None:
    assert M.check_timeout("2.5") == 2.5
    assert M.check_name("cu12.9", "--host") == "cu12.9"
    assert M.check_env_name("CUDA_VISIBLE_DEVICES") == "CUDA_VISIBLE_DEVICES"


@pytest.mark.parametrize(("value", "mode"), [("false", "off"), ("true", "auto"), ("off", "off"),
                                             ("required", "on"), ("auto", "auto")])
def test_a_matrix_may_say_whether_its_cells_are_sandboxed(value: str, mode: str) -> None:
    base = RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true]}\n"
    assert M.loads(base, "m.yaml").sandbox is None  # the run's default
    assert M.loads(base + f"sandbox: {value}\n", "m.yaml").sandbox == mode


def test_a_bad_sandbox_setting_is_bad_input_at_its_place() -> None:
    with pytest.raises(ConfigError) as ei:
        M.loads(RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true]}\nsandbox: maybe\n", "m.yaml")
    assert str(ei.value.problems[0]).startswith("m.yaml:6:10: sandbox: ")
    assert "one of True, False, auto, required" in str(ei.value.problems[0])


def test_a_cases_cwd_is_read_from_the_matrix_files_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "project" / "tools").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    f = tmp_path / "project" / "m.yaml"
    f.write_text(RT + "drivers: [host]\ncases:\n  - {name: a, argv: [true], cwd: tools}\n"
                 "  - {name: b, argv: [true], cwd: ../elsewhere/}\n"
                 f"  - {{name: c, argv: [true], cwd: '{tmp_path}'}}\n  - {{name: d, argv: [true]}}\n")
    m = M.load(f)
    # A case that names none starts in the file's directory too.
    assert [c.cwd for c in m.cases] == [str(tmp_path / "project" / "tools"), str(tmp_path / "elsewhere"),
                                        str(tmp_path), str(tmp_path / "project")]
    # The same file named by a relative path, from another directory: the same directories.
    monkeypatch.chdir(tmp_path)
    M._CACHE.clear()
    assert M.load("project/m.yaml").cases == m.cases
    monkeypatch.chdir(tmp_path / "elsewhere")
    M._CACHE.clear()
    assert M.load("../project/m.yaml").cases == m.cases


def test_only_the_bundled_matrix_and_text_from_no_file_start_where_the_run_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundled = workdir.bundled()
    assert bundled is not None
    cases = M.load(bundled).cases
    assert cases
    assert all(c.cwd is None for c in cases)
    text = bundled.read_text()
    assert all(c.cwd is None for c in M.loads(text).cases)
    # The same text in a file of one's own: that file's directory.
    (tmp_path / "copy.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert {c.cwd for c in M.load("copy.yaml").cases} == {str(tmp_path)}


@pytest.mark.parametrize(("cwd", "why"), [
    ("missing", r"'missing' does not exist \(.*/missing; a relative path is read from the matrix file's directory\)"),
    ("afile", r"'afile' is not a directory \(.*/afile\)"),
    ("''", r"cases\[0\]\.cwd: .*"),
])
def test_a_cases_cwd_that_is_no_directory_is_bad_input_at_its_place(tmp_path: Path, cli, cwd: str, why: str) -> None:
    (tmp_path / "afile").write_text("")
    f = tmp_path / "m.yaml"
    f.write_text(RT + f"drivers: [host]\ncases:\n  - {{name: a, argv: [true], cwd: {cwd}}}\n")
    proc = cli("validate", f)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert re.search(rf"^{re.escape(str(f))}:5:\d+: .*{why}", proc.stderr, re.MULTILINE), proc.stderr
