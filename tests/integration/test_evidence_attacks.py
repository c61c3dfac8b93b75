"""Verdicts from evidence the code under test cannot touch: each attack that once worked, tried
for real against `cumatrix run` (real processes, real runtime wheels, gcc-built ELF files).

The threat model (docs/threat-model.md) names the test of each attack class.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cumatrix.core import witness
from cumatrix.provision import runtimes as R
from helpers.build import gcc
from helpers.procs import run_unstalled
from helpers.results import read_cells_by_case
from helpers.sandbox import require_bwrap
from helpers.users import local_user

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"
CU130 = "nvidia-cuda-runtime==13.0.96"
PY = sys.executable

pytestmark = pytest.mark.network  # the cells provision real runtime wheels (cached after the first)


def _run(cli: Any, d: Path, body: str, *args: str, timeout: float = 180) -> tuple[Any, dict[str, dict[str, Any]]]:
    m = d / "m.yaml"
    m.write_text(textwrap.dedent(body).lstrip("\n"))
    out = d / "out"
    proc = cli("run", m, "--out", out, "-q", *args, cwd=d, timeout=timeout)
    assert (out / "results.jsonl").exists(), proc.stderr
    return proc, read_cells_by_case(out)


@pytest.fixture(scope="module")
def cu13(wheel_cache: Path) -> Path:
    return R.from_wheel("cu13.0", CU130).libcudart


# --------------------------------------------------------------------------- the audit log is not evidence


def test_a_forged_audit_line_does_not_skip_a_failing_cell(tmp_path: Path, cli: Any, wheel_cache: Path) -> None:
    """Attack: write one line to $CUMATRIX_AUDIT_LOG claiming a CUDA 13 runtime, then exit 1.
    Before: ``skipped:runtime-not-used`` and the run exited 0.  Now the kernel's record (which
    never saw that file) decides: ``exit:1``, the claim named as not backed."""
    gcc()
    forge = r'printf "o\t$$\tlibcudart.so.13\t/opt/fake/libcudart.so.13\n" >> "$CUMATRIX_AUDIT_LOG"; exit 1'
    proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: forge, argv: [sh, -c, '{forge}']}}
        """)
    rec = got["forge"]
    assert rec["observed"]["outcome"] == "exit:1", rec["observed"]
    assert proc.returncode == 1, proc.stderr
    fp = rec["fingerprint"]
    assert fp["mappings_from"] == "kernel"
    assert "/opt/fake/libcudart.so.13" in fp["audit_claims_not_backed"]
    assert fp["trace"]["traced"]
    assert fp["trace"]["complete"]


def test_a_child_without_ld_audit_is_still_seen(tmp_path: Path, cli: Any, cu13: Path) -> None:
    """Attack: a child started with ``env -u LD_AUDIT`` loads libcudart.so.13 in a cu12.9 cell.
    Before: unobserved, the cell passed under the cu12.9 name.  Now the kernel saw the mapping:
    the cell did not run its runtime."""
    gcc()
    script = tmp_path / "hide.sh"
    script.write_text("env -u LD_AUDIT \"$1\" -c \"import ctypes, sys; ctypes.CDLL(sys.argv[1])\" \"$2\"\n")
    # The interpreter and the library named in argv: what a sandboxed cell (the default) sees.
    _proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: hide, argv: [sh, {script}, {PY}, {cu13}]}}
        """)
    rec = got["hide"]
    assert rec["observed"]["outcome"] == "skipped:runtime-not-used", rec["observed"]
    assert "libcudart.so.13" in rec["observed"]["detail"]
    libs = [lib["path"] for lib in rec["fingerprint"]["libraries"]]
    assert any(Path(p).samefile(cu13) for p in libs if Path(p).exists()), libs


def test_a_static_program_and_a_setuid_one_cannot_hide_their_mappings(tmp_path: Path) -> None:
    """A statically linked executable has no loader (LD_AUDIT never runs); the kernel still
    reports its image.  The tracer reads /proc/PID/maps at exit, from outside the process."""
    cc = gcc()
    src = tmp_path / "s.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "static-prog"
    if subprocess.run([cc, "-static", "-o", str(exe), str(src)], capture_output=True, check=False).returncode != 0:
        pytest.skip("no static C library here (libc.a)")
    from cumatrix.execute.local import Job, run_local

    res = run_local(Job(cell_id="t", kind="command", argv=(str(exe),), timeout=30))
    assert res.returncode == 0, res
    assert res.trace is not None, res
    assert res.trace.traced, res
    assert any(o.path == str(exe) for o in res.trace.objects), res.trace.objects


def test_a_fifo_for_a_log_does_not_block_the_harness(tmp_path: Path, cli_env: Any, wheel_cache: Path) -> None:
    """Attack: replace the audit log with a FIFO.  Before: the harness blocked for good.  Now it
    is opened without blocking, refused as not a regular file, and the cell's record says so."""
    gcc()
    fifo = 'rm -f "$CUMATRIX_AUDIT_LOG"; mkfifo "$CUMATRIX_AUDIT_LOG"; exit 0'
    m = tmp_path / "m.yaml"
    m.write_text(textwrap.dedent(f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: fifo, argv: [env, -u, LD_AUDIT, sh, -c, '{fifo}']}}
        """).lstrip("\n"))
    # The harness is watched for the wait itself (a thread in a FIFO's open), not timed: how
    # long a loaded machine takes to run a cell is no measure of a wait that has no end.
    # --no-sandbox: sandboxed (the default), the log is a bind the cell cannot replace.
    rc, err, stalled = run_unstalled([PY, "-m", "cumatrix", "run", str(m), "--out", str(tmp_path / "out"), "-q",
                                      "--no-sandbox"], env=cli_env(), cwd=tmp_path, timeout=600)
    assert not stalled, "the harness waited on the FIFO"
    rec = read_cells_by_case(tmp_path / "out")["fifo"]
    assert rec["observed"]["outcome"] == "ok", err
    assert rc == 0, err
    assert "not a regular file" in rec["fingerprint"]["mappings_note"]


def test_read_cell_file_refuses_links_and_fifos(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text("x")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")
    # O_NOFOLLOW's refusal (ELOOP): its text is the C library's, so no match on it.
    with pytest.raises(OSError):  # noqa: PT011
        witness.read_cell_file(tmp_path / "link")
    with pytest.raises(witness.UnsafeFile):
        witness.read_cell_file(tmp_path / "fifo")
    assert witness.read_cell_file(target) == b"x"


def test_under_the_sandbox_a_cell_cannot_write_the_next_cells_log(tmp_path: Path, cli: Any,
                                                                   wheel_cache: Path) -> None:
    """Attack: a cell writes a forged line into every audit log it can find (the next cell's
    is prepared ahead).  Each cell has a private directory with an unpredictable name, a
    sandboxed cell sees only its own, and a forged line is not evidence anyway."""
    gcc()
    require_bwrap()
    forge = (r'for f in /tmp/cumatrix-*/*.log /tmp/cumatrix-*/*/*.log; do '
             r'printf "o\t1\tlibcudart.so.13\t/opt/fake/libcudart.so.13\n" >> "$f" 2>/dev/null; done; exit 0')
    proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: a-forger, argv: [sh, -c, '{forge}']}}
          - {{name: b-victim, argv: ["true"]}}
        """, "--sandbox")
    assert got["b-victim"]["observed"]["outcome"] == "ok", got["b-victim"]["observed"]
    assert not got["b-victim"]["fingerprint"].get("audit_claims_not_backed")
    assert got["a-forger"]["observed"]["outcome"] == "ok"
    assert got["b-victim"]["fingerprint"]["mappings_from"] == "kernel"
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- loader outcomes


def test_a_shell_printing_a_loader_line_is_its_exit_status(tmp_path: Path, cli: Any, wheel_cache: Path) -> None:
    """Attack: ``echo '... undefined symbol: cuMemcpyBatchAsync' >&2; exit 3`` in a cell that
    expects that loader outcome.  Before: it passed.  Now only the loader's own failure counts."""
    gcc()
    say = "echo \"./app: symbol lookup error: ./app: undefined symbol: cuMemcpyBatchAsync\" >&2; exit 3"
    say127 = say.replace("exit 3", "exit 127")
    proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: liar, argv: [sh, -c, '{say}']}}
          - {{name: liar127, argv: [sh, -c, '{say127}']}}
        expect:
          - {{case: liar, outcome: "undefined-symbol:cuMemcpyBatchAsync"}}
          - {{case: liar127, outcome: "undefined-symbol:cuMemcpyBatchAsync"}}
        """)
    assert got["liar"]["observed"]["outcome"] == "exit:3"
    # exit 127 too: no process of the cell had ./app mapped when it ended
    assert got["liar127"]["observed"]["outcome"] == "exit:127"
    assert {r["status"] for r in got.values()} == {"fail"}
    assert proc.returncode == 1


def test_the_loaders_own_failures_still_count(tmp_path: Path) -> None:
    """ld.so at start (exit 127, the object mapped) and Python's ctypes/import refusing a
    library with an undefined symbol (the interpreter's traceback) are the loader's outcomes."""
    cc = gcc()
    from cumatrix.execute.local import Job, run_local
    from cumatrix.judge.classify import classify

    (tmp_path / "lib.c").write_text("int missing_fn(void);\nint f(void) { return missing_fn(); }\n")
    (tmp_path / "main.c").write_text("int f(void);\nint main(void) { return f(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libund.so"), str(tmp_path / "lib.c")], check=True)
    subprocess.run([cc, "-o", str(tmp_path / "app"), str(tmp_path / "main.c"), f"-L{tmp_path}", "-lund",
                    f"-Wl,-rpath,{tmp_path}", "-Wl,--allow-shlib-undefined"], check=True)
    res = run_local(Job(cell_id="t", kind="command", argv=(str(tmp_path / "app"),), timeout=30,
                        env=(("LD_BIND_NOW", "1"),)))
    assert classify(res, kind="command").outcome == "undefined-symbol:missing_fn", res.stderr_tail
    res = run_local(Job(cell_id="t", kind="command", timeout=30,
                        argv=(PY, "-c", f"import ctypes; ctypes.CDLL('{tmp_path / 'libund.so'}')")))
    obs = classify(res, kind="command")
    assert obs.outcome == "undefined-symbol:missing_fn", res.stderr_tail
    assert "Python" in obs.detail


# --------------------------------------------------------------------------- harness channels


def test_a_harness_child_is_not_dumpable(tmp_path: Path) -> None:
    """The probe's process hides its /proc/PID/fd (the verdict pipe) and environ from processes
    of the same user: run as an unprivileged user, a peer of that user cannot open them."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the probe and its peer as another user")
    user = _second_user()
    import pwd

    pw = pwd.getpwnam(user)
    py = shutil.which("python3", path="/usr/bin:/bin")
    if py is None:
        pytest.skip("no system python3 that the second user can run")
    import tempfile

    # The harness child's own code, where the second user can read it.
    shared = Path(tempfile.mkdtemp(prefix="cumatrix-peer-"))
    shared.chmod(0o755)
    shutil.copytree(Path(__file__).resolve().parents[2] / "src" / "cumatrix", shared / "cumatrix",
                    ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(shared)], check=True)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(shared), "PYTHONDONTWRITEBYTECODE": "1"}
    # The probe's own start (make_private first), then a wait with the verdict pipe open.
    script = "import time, cumatrix.child.case as c; c.make_private(); r, w = __import__('os').pipe(); time.sleep(30)"
    probe = subprocess.Popen([py, "-c", script], env=env, user=pw.pw_uid, group=pw.pw_gid,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(1.5)
        assert probe.poll() is None, probe.stderr.read() if probe.stderr else ""
        peer = subprocess.run([py, "-c", f"import os; os.listdir('/proc/{probe.pid}/fd')"], env=env,
                              user=pw.pw_uid, group=pw.pw_gid, capture_output=True, text=True, timeout=30, check=False)
        assert peer.returncode != 0, peer.stderr
        assert "PermissionError" in peer.stderr, peer.stderr
        peer = subprocess.run([py, "-c", f"open('/proc/{probe.pid}/environ').read()"], env=env,
                              user=pw.pw_uid, group=pw.pw_gid, capture_output=True, text=True, timeout=30, check=False)
        assert peer.returncode != 0, peer.stderr
        assert "PermissionError" in peer.stderr, peer.stderr
        # the same peer reads a process of its user that did not make itself private
        plain = subprocess.Popen([py, "-c", "import time; time.sleep(30)"], env=env, user=pw.pw_uid, group=pw.pw_gid)
        try:
            time.sleep(0.5)
            peer = subprocess.run([py, "-c", f"import os; os.listdir('/proc/{plain.pid}/fd')"], env=env,
                                  user=pw.pw_uid, group=pw.pw_gid, capture_output=True, text=True, timeout=30,
                                  check=False)
            assert peer.returncode == 0, peer.stderr
        finally:
            plain.kill()
            plain.wait()
    finally:
        probe.kill()
        probe.communicate()
        shutil.rmtree(shared, ignore_errors=True)


def _second_user() -> str:
    return local_user("cumatrixpeer", shell="/usr/sbin/nologin", system=False).pw_name


def test_a_library_planted_by_another_user_is_not_loaded(tmp_path: Path, wheel_cache: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack: another local user plants ``$TMPDIR/cumatrix-audit-lib-<uid>-<digest>/libcumatrix_audit.so``
    (a name anyone can work out) before the harness runs docker cells.  The harness takes that
    directory only when it is its own and no one else may write it; else it makes one of its
    own under a name no one can guess."""
    gcc()
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second local user")
    user = _second_user()
    import pwd
    import tempfile

    from cumatrix.execute import observe
    from cumatrix.execute.cellaudit import CellAuditor
    from cumatrix.load.matrix import load as load_matrix
    from cumatrix.provision.cell import Provisioner, Settings

    shared_tmp = Path(tempfile.mkdtemp(prefix="cumatrix-shared-tmp-"))
    shared_tmp.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    built = observe.build_audit_library()
    planted_dir = shared_tmp / f"cumatrix-audit-lib-{os.geteuid()}-{built.parent.name}"
    pw = pwd.getpwnam(user)
    try:
        subprocess.run(["install", "-d", "-m", "0755", "-o", user, str(planted_dir)], check=True)
        subprocess.run(["tee", str(planted_dir / built.name)], input=b"planted", stdout=subprocess.DEVNULL,
                       check=True, user=pw.pw_uid, group=pw.pw_gid)
        m = tmp_path / "m.yaml"
        m.write_text(f"runtimes: {{cu12.9: {{wheel: {CU129}}}}}\ndrivers: [host]\n")
        prov = Provisioner(settings=Settings(matrix=load_matrix(m), backend="docker"))
        lib = CellAuditor(provisioner=prov, backend="docker")._container_audit_library()
        assert lib.parent != planted_dir
        st = lib.parent.stat()
        assert st.st_uid == os.geteuid()
        assert not st.st_mode & 0o022
        assert lib.read_bytes() == built.read_bytes()
        assert (planted_dir / built.name).read_bytes() == b"planted"  # left alone, never used
    finally:
        shutil.rmtree(shared_tmp, ignore_errors=True)
        tempfile.tempdir = None


# --------------------------------------------------------------------------- the driver rule where the driver was used


def test_a_driver_rule_holds_only_where_the_driver_was_mapped(tmp_path: Path, wheel_cache: Path) -> None:
    """A CUDA 13 runtime on a 12.8 driver: a program that only loads the runtime never opens the
    driver and exits 0 (FACTS: libcuda.so.1 is not even mapped), so it is judged by its exit
    status; one that maps libcuda.so.1 falls under NVIDIA's rule (expected to fail)."""
    cc = gcc()
    from cumatrix.load.matrix import cells as matrix_cells
    from cumatrix.load.matrix import load as load_matrix
    from cumatrix.orchestrate import Orchestrator

    d = tmp_path / "driver"
    d.mkdir()
    stand_in = Path(__file__).resolve().parents[1] / "stand_ins" / "libcuda_stand_in.c"
    subprocess.run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(d / "libcuda.so.1"),
                    str(stand_in)], check=True)
    load_rt = "import ctypes, os; ctypes.CDLL(os.environ['CUMATRIX_CUDART'])"
    m = tmp_path / "m.yaml"
    m.write_text(textwrap.dedent(f"""
        runtimes: {{cu13.0: {{wheel: {CU130}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: runtime-only, argv: [{PY}, -c, "{load_rt}"]}}
          - {{name: with-driver, argv: [{PY}, -c, "{load_rt}; ctypes.CDLL('{d / 'libcuda.so.1'}')"]}}
        """).lstrip())
    orch = Orchestrator(matrix=load_matrix(m))
    orch._host_fp = {"driver_version": 12080}  # a 12.8 host, as the fingerprint would report it
    got = {}
    try:
        for cell in matrix_cells(orch.matrix):
            got[cell.case.name] = orch.run(cell).record
    finally:
        orch.close()
    only = got["runtime-only"]
    assert only.observed.outcome == "ok", only.expected
    assert only.status == "pass", only.expected
    assert only.expected.rule == "command-default"
    assert only.fingerprint["driver_mapped"] is False
    assert only.fingerprint["runtime_version"] == 13000
    used = got["with-driver"]
    assert used.fingerprint["driver_mapped"] is True
    assert used.expected.rule == "program-major-newer-than-driver"
    assert used.expected.outcomes == {"fails"}
    assert used.status == "fail"  # it exited 0 where the rule predicts a failure: the stand-in is no real driver


def test_a_static_runtime_in_a_mapped_object_is_the_runtime_recorded(tmp_path: Path, wheel_cache: Path,
                                                                     cli: Any) -> None:
    """A module carrying a statically linked runtime (cuda-bindings' runtime module, CuPy) maps no
    libcudart: the cell records that module's runtime, found with the gate's detector, its
    version from the module's own function names."""
    cc = gcc()
    from cumatrix.audit.static import runtime_introductions

    intros = runtime_introductions()
    if not intros:
        pytest.skip("no runtime wheel headers to date runtime functions from")
    thirteen = sorted(n for n, v in intros.items() if v // 1000 == 13)[:5]
    twelve = sorted(n for n, v in intros.items() if v // 1000 == 12)[:20]
    assert len(thirteen) >= 3
    names = ", ".join(f'"{n}"' for n in [*twelve, *thirteen])
    src = tmp_path / "fake_bindings.c"
    src.write_text(textwrap.dedent(f"""
        /* A stand-in for a module with a static CUDA 13 runtime: its object-name marker and
           its table of runtime function names, as nvcc's libcudart_static leaves them. */
        const char *const cumatrix_marker = "libcudart_static_0123456789abcdef0123456789abcdef01234567";
        const char *const cumatrix_names[] = {{{names}, "cudaErrorCudartUnloading"}};
        int bindings_ready(void) {{ return (int)(sizeof cumatrix_names / sizeof cumatrix_names[0]); }}
        """))
    lib = tmp_path / "runtime.cpython-fake.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-o", str(lib), str(src)], check=True)
    _proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu13.0: {{wheel: {CU130}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: bindings, argv: [{PY}, -c, "import ctypes; ctypes.CDLL('{lib}').bindings_ready()"]}}
        """)
    fp = got["bindings"]["fingerprint"]
    assert fp["runtime_file"] == str(lib), fp
    want = max(intros[n] for n in thirteen)
    assert fp["runtime_version"] == want
    assert fp["static_runtimes"][0]["major"] == 13
    assert "libcudart_static_" in fp["runtime_evidence"]
    assert got["bindings"]["observed"]["outcome"] == "ok"


# --------------------------------------------------------------------------- resume keeps only what the harness wrote


def test_resume_reruns_a_record_edited_by_hand(tmp_path: Path, cli: Any, wheel_cache: Path) -> None:
    """Attack: edit a finished record from fail to pass, then --resume.  Before: kept.  Now the
    record's signature (HMAC-SHA256, the user's key outside --out) no longer matches: the cell
    runs again, and the run says so."""
    body = f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: bad, argv: [sh, -c, "exit 4"]}}
          - {{name: good, argv: ["true"]}}
        """
    proc, got = _run(cli, tmp_path, body)
    assert got["bad"]["status"] == "fail"
    assert proc.returncode == 1
    jsonl = tmp_path / "out" / "results.jsonl"
    lines = []
    for line in jsonl.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "cell" and rec["id"].endswith("/bad"):
            rec["status"], rec["observed"]["outcome"], rec["mismatch"] = "pass", "ok", None
        lines.append(json.dumps(rec))
    jsonl.write_text("\n".join(lines) + "\n")
    proc = cli("run", tmp_path / "m.yaml", "--out", tmp_path / "out", "--resume", "-q", cwd=tmp_path, timeout=180)
    assert proc.returncode == 1, proc.stderr
    said = proc.stdout + proc.stderr
    assert "no valid signature" in said, said
    assert "cu12.9/host/bad" in said, said
    got = read_cells_by_case(tmp_path / "out")
    assert got["bad"]["status"] == "fail"
    assert got["bad"]["observed"]["outcome"] == "exit:4"
    assert got["good"]["status"] == "pass"


def test_resume_refuses_a_fifo_for_results(tmp_path: Path, cli: Any, wheel_cache: Path) -> None:
    """Attack: results.jsonl made a FIFO.  Before: --resume blocked.  Now it is refused (exit 2)."""
    (tmp_path / "out").mkdir()
    os.mkfifo(tmp_path / "out" / "results.jsonl")
    m = tmp_path / "m.yaml"
    m.write_text(f"runtimes: {{cu12.9: {{wheel: {CU129}}}}}\ndrivers: [host]\nprobe: false\n"
                 "cases:\n  - {name: a, argv: [\"true\"]}\n")
    t0 = time.monotonic()
    proc = cli("run", m, "--out", tmp_path / "out", "--resume", "-q", cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "not a regular file" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 60


def test_the_signing_key_is_private_and_refused_otherwise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cumatrix.results import recordkey

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    recordkey._KEYS.clear()
    rec = recordkey.sign({"type": "cell", "id": "x", "status": "fail"})
    key = tmp_path / "state" / "cumatrix" / "key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert recordkey.signed(rec)
    assert not recordkey.signed({**rec, "status": "pass"})
    recordkey._KEYS.clear()
    key.chmod(0o644)
    with pytest.raises(recordkey.KeyProblem, match="mode 0600"):
        recordkey.record_key()
    recordkey._KEYS.clear()



def test_resume_reruns_a_cell_whose_runtime_wheel_changed_under_its_name(tmp_path: Path, cli: Any,
                                                                        wheel_cache: Path) -> None:
    """Attack: replace the runtime wheel's bytes under the same name and version.  Before: the
    pass was kept.  Now a cell's inputs include the wheel's sha256: it runs again."""
    import zipfile

    from cumatrix.provision.runtimes import fetch_wheel

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    shutil.copy(fetch_wheel(CU129), wheels)
    body = f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: a, argv: ["true"]}}
        """
    proc, got = _run(cli, tmp_path, body, "--wheel-dir", str(wheels))
    assert proc.returncode == 0, proc.stderr
    assert got["a"]["status"] == "pass", proc.stderr
    before = got["a"]["started"]
    again = cli("run", tmp_path / "m.yaml", "--out", tmp_path / "out", "--resume", "-q", "--wheel-dir", str(wheels),
                cwd=tmp_path, timeout=180)
    assert read_cells_by_case(tmp_path / "out")["a"]["started"] == before, again.stdout  # unchanged: kept
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel, "a") as zf:  # the same name and version, other bytes
        zf.writestr("nvidia/extra.txt", "changed\n")
    again = cli("run", tmp_path / "m.yaml", "--out", tmp_path / "out", "--resume", "-q", "--wheel-dir", str(wheels),
                cwd=tmp_path, timeout=180)
    said = again.stdout + again.stderr
    assert "changed since they ran" in said, said
    assert read_cells_by_case(tmp_path / "out")["a"]["started"] != before


# --------------------------------------------------------------------------- counts a reader can check


def test_the_headline_counts_a_probe_that_ran_and_then_skipped(tmp_path: Path, cli: Any, wheel_cache: Path) -> None:
    """A probe on a host without a driver loads its runtime (its process ran) and then skips its
    GPU part: it ran, but tested nothing; the headline counts it as skipped, not tested.
    Without a driver here, the probe skips; with one, it passes: the counts add up either way."""
    proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        cases:
          - {{name: fine, argv: ["true"]}}
        """)
    probe = got["probe"]
    said = proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    counts = doc["counts"]
    assert counts["ran"] == 2
    assert counts["total"] == 2
    if probe["status"] == "skip":
        assert counts["skipped_after_running"] == 1
        assert counts["tested"] == 1
        assert "1 of 2 cells tested: all met expectations; 1 skipped (1 skipped:no-cuda-driver" in said, said
    else:
        assert "2 of 2 cells tested: all met expectations; 0 skipped; 0 not run" in said, said


def _pure_wheel(directory: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    """A real pure-Python wheel (METADATA, WHEEL and a RECORD with every file's hash)."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    members = dict(files)
    members[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    members[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for member, text in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(text.encode())}")
    members[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for member, text in members.items():
            zf.writestr(member, text)
    return wheel


def test_an_environment_is_keyed_by_the_wheels_it_resolves_to(tmp_path: Path, cli: Any, wheel_cache: Path) -> None:
    """Attack: an environment runtime was keyed by its requirement text (and then by the wheels
    its requirements name): a second wheel directory holding other bytes under the same name and
    version, here of a dependency no requirement names, got the first environment, and --resume
    kept its records.  Now requirements are resolved first (dependencies included), the
    environment is keyed by the sha256 of every wheel resolved into it, a cell's inputs hold
    them, and the cell runs again in an environment holding the second directory's bytes."""
    from cumatrix.provision import environments as E
    from cumatrix.provision.runtimes import fetch_wheel

    runtime = fetch_wheel(CU129)
    dirs = []
    for value in (11, 12):  # the dependency's bytes differ, nothing else does
        d = tmp_path / f"wheels{value}"
        d.mkdir()
        shutil.copy(runtime, d)
        _pure_wheel(d, "demo_pkg", "1.0", {"demo_pkg/__init__.py": "from dep_pkg import VALUE\n"},
                    requires=("dep_pkg>=1",))
        _pure_wheel(d, "dep_pkg", "1.0", {"dep_pkg/__init__.py": f"VALUE = {value}\n"})
        dirs.append(d)
    reqs = ("demo-pkg==1.0", CU129)
    resolved = [{w.path.name for w in E.resolve_wheels(reqs, d)} for d in dirs]
    assert resolved[0] == resolved[1] == {runtime.name, "demo_pkg-1.0-py3-none-any.whl",
                                          "dep_pkg-1.0-py3-none-any.whl"}
    assert E.environment_hash(reqs, wheel_dir=dirs[0]) != E.environment_hash(reqs, wheel_dir=dirs[1])
    body = f"""
        runtimes: {{env: {{requirements: [demo-pkg==1.0, {CU129}]}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: value, argv: [python, -c, "import demo_pkg; raise SystemExit(demo_pkg.VALUE)"]}}
        """
    _, got = _run(cli, tmp_path, body, "--wheel-dir", str(dirs[0]))
    assert got["value"]["observed"]["outcome"] == "exit:11", got["value"]["observed"]
    started = got["value"]["started"]
    again = cli("run", tmp_path / "m.yaml", "--out", tmp_path / "out", "--resume", "-q", "--wheel-dir", str(dirs[0]),
                cwd=tmp_path, timeout=180)
    assert read_cells_by_case(tmp_path / "out")["value"]["started"] == started, again.stdout  # the same bytes: kept
    again = cli("run", tmp_path / "m.yaml", "--out", tmp_path / "out", "--resume", "-q", "--wheel-dir", str(dirs[1]),
                cwd=tmp_path, timeout=180)
    said = again.stdout + again.stderr
    assert "changed since they ran" in said, said
    rec = read_cells_by_case(tmp_path / "out")["value"]
    assert rec["started"] != started
    assert rec["observed"]["outcome"] == "exit:12", rec["observed"]


# --------------------------------------------------------------------------- where ptrace is refused


def test_where_ptrace_is_refused_the_cell_runs_untraced_and_says_so(tmp_path: Path) -> None:
    """A harness inside a container whose seccomp profile refuses ptrace (CAP_SYS_PTRACE missing
    on an old profile): the spawn helper says so and runs the program untraced, whose exit
    status is kept; the record then names the audit log as its only evidence."""
    gcc()
    client = None
    try:
        import docker

        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as e:  # noqa: BLE001 - any failure to reach the daemon means: no docker here
        if client is not None:
            client.close()  # its socket, left open, fails a later test as an unraisable warning
        pytest.skip(f"no Docker daemon answers ({type(e).__name__})")
    repo = Path(__file__).resolve().parents[2]
    built = subprocess.run(["bash", str(repo / "containers" / "build-base.sh")], capture_output=True, text=True,
                           timeout=900, check=False)
    if built.returncode != 0:
        pytest.skip(f"containers/build-base.sh failed: {built.stderr.strip()[-300:]}")
    base = built.stdout.strip().splitlines()[-1]
    from cumatrix.execute import sandbox

    shim = sandbox.spawn_shim()
    assert shim is not None
    profile = {"defaultAction": "SCMP_ACT_ALLOW",
               "syscalls": [{"names": ["ptrace"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}
    script = "/shim --trace 3 0 - - -- /bin/sh -c 'exit 5' 3>/out/trace; echo rc=$?"
    out = tmp_path / "out"
    out.mkdir()
    try:
        logs = client.containers.run(
            base, ["/bin/sh", "-c", script], remove=True, network_disabled=True,
            security_opt=[f"seccomp={json.dumps(profile)}"],
            volumes={str(shim): {"bind": "/shim", "mode": "ro"}, str(out): {"bind": "/out", "mode": "rw"}},
            labels={"cumatrix.test": "1"})
    finally:
        client.close()
    assert b"rc=5" in logs, logs
    trace = witness.parse_trace((out / "trace").read_bytes())
    assert not trace.traced, trace
    assert trace.note is not None, trace
    assert "ptrace refused" in trace.note, trace
    # What the harness makes of such a record: the audit log, named as the only evidence.
    from cumatrix.execute import observe

    plan = observe.audit_plan(tmp_path / "cell" / "audit.log")
    seen = observe.conclude(plan, None, trace=trace)
    assert seen.source == "rtld-audit"
    assert seen.source_note is not None
    assert "ptrace refused" in seen.source_note


def test_a_cell_that_kills_its_tracer_is_a_crash(tmp_path: Path) -> None:
    """Attack: the cell kills the spawn helper that traces it (its parent, same user), then does
    what it wants untraced.  The helper is the process the harness waits for: the cell is a
    crash, and its record says the trace is incomplete."""
    gcc()
    from cumatrix.execute.local import Job, run_local
    from cumatrix.judge.classify import classify

    res = run_local(Job(cell_id="t", kind="command", timeout=30,
                        argv=("sh", "-c", "kill -9 $PPID; sleep 0.2; exit 0")))
    assert res.trace is not None, res.trace
    assert res.trace.traced, res.trace
    assert not res.trace.complete, res.trace
    assert classify(res, kind="command").outcome == "crash:SIGKILL"


def test_a_containers_verdict_file_cannot_be_found_by_another_user(tmp_path: Path) -> None:
    """The directory a container writes its verdict into is shared with the container's user,
    so other local users may create files there too: they cannot list it, and the verdict's
    name is random, known only to that child's environment."""
    from cumatrix.execute.protocol import FileChannel

    chan = FileChannel()
    try:
        assert chan.mount_dir.stat().st_mode & 0o7777 == 0o1733
        (name,) = [v.rsplit("/", 1)[1] for k, v in chan.env()]
        other = FileChannel()
        other.close()
        assert name.startswith("verdict-")
        assert len(name) > 30
        assert name != other.name
        if os.geteuid() == 0 and shutil.which("useradd") is not None:
            import pwd

            pw = pwd.getpwnam(_second_user())
            peer = subprocess.run(["ls", str(chan.mount_dir)], user=pw.pw_uid, group=pw.pw_gid,
                                  capture_output=True, text=True, check=False)
            assert peer.returncode != 0
            assert "Permission denied" in peer.stderr
    finally:
        chan.close()


def test_a_link_named_like_a_runtime_does_not_rename_what_was_mapped(tmp_path: Path, cli: Any,
                                                                     wheel_cache: Path) -> None:
    """Attack: make a link named libcudart.so.13 to the C library, log it as opened (with a
    SONAME to match) and exit 1.  The kernel saw the C library under its own name: the log's
    spelling and SONAME are not taken, and the cell is exit:1, not skipped."""
    gcc()
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                            "/lib64/libc.so.6", "/usr/lib64/libc.so.6") if Path(p).exists())
    link = tmp_path / "fake" / "libcudart.so.13"
    link.parent.mkdir()
    link.symlink_to(libc)
    forge = rf'printf "o\t$$\tlibcudart.so.13\t{link}\n" >> "$CUMATRIX_AUDIT_LOG"; exit 1'
    _proc, got = _run(cli, tmp_path, f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
          - {{name: rename, argv: [sh, -c, '{forge}']}}
        """)
    rec = got["rename"]
    assert rec["observed"]["outcome"] == "exit:1", rec["observed"]
    assert rec["fingerprint"]["runtime_file"] is None
    assert rec["fingerprint"]["libraries"] == []
