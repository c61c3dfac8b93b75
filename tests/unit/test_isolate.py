"""The local backend's child runner and classifier, on real child processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cumatrix.core.jobs import Job
from cumatrix.core.options import sandbox_policy
from cumatrix.execute import sandbox
from cumatrix.execute.local import KEEP_HEAD, KEEP_TAIL, run_local
from cumatrix.execute.protocol import parse
from cumatrix.execute.sandbox import Policy, child_env
from cumatrix.judge.classify import classify
from helpers.procs import gone

PY = sys.executable
#: Child code that hands a verdict over the private channel, as the harness's own children do.
EMIT = "from cumatrix.execute import protocol\nprotocol.emit({verdict})\n"
TAG_LINE = "CUMATRIX-RESULT {\"outcome\": \"ok\", \"path\": \"batch\"}"


def _run(code: str, *, kind: str = "probe", timeout: float = 30.0, env: tuple[tuple[str, str], ...] = ()):
    res = run_local(Job(cell_id="t", kind=kind, argv=(PY, "-c", code), timeout=timeout, env=env,
                        reports_verdict=kind != "command"))
    return res, classify(res, kind=kind)


def test_verdict_over_the_channel_is_the_outcome() -> None:
    res, obs = _run("print('log')\n" + EMIT.format(verdict='{"outcome": "ok", "path": "batch", "data": {"x": 1}}'))
    assert obs.outcome == "ok"
    assert obs.path == "batch"
    assert obs.data["x"] == 1
    assert res.verdict_error is None


def test_a_verdict_line_on_stdout_is_only_log() -> None:
    # A harness child that prints the tag instead of using its channel reached no verdict.
    res, obs = _run(f"print({TAG_LINE!r})")
    assert obs.outcome == "harness-error"
    assert "without a verdict" in obs.detail
    assert TAG_LINE in res.stdout_tail


def test_forged_verdict_then_segfault_is_a_crash() -> None:
    _, obs = _run(f"import os, signal\nprint({TAG_LINE!r}, flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)",
                  kind="command")
    assert obs.outcome == "crash:SIGSEGV"


def test_program_that_logs_a_verdict_line_and_exits_0_is_ok() -> None:
    _, obs = _run(f"print({TAG_LINE!r})", kind="command")
    assert obs.outcome == "ok"
    assert obs.path == "n/a"
    _, obs = _run(f"import sys\nprint({TAG_LINE!r})\nsys.exit(3)", kind="command")
    assert obs.outcome == "exit:3"


def test_a_command_gets_no_channel_even_if_the_harness_had_one() -> None:
    env = (("CUMATRIX_VERDICT_FD", "1"), ("CUMATRIX_VERDICT_FILE", "/tmp/x"))
    res, obs = _run("import os\nprint(os.environ.get('CUMATRIX_VERDICT_FD'), os.environ.get('CUMATRIX_VERDICT_FILE'))",
                    kind="command", env=env)
    assert res.stdout_tail.strip() == "None None"
    assert obs.outcome == "ok"


def test_malformed_verdict_is_harness_error() -> None:
    _, obs = _run("import os\nos.write(int(os.environ['CUMATRIX_VERDICT_FD']), b'CUMATRIX-RESULT {not json')")
    assert obs.outcome == "harness-error"
    assert obs.detail.startswith("malformed verdict: verdict line is not JSON")


def test_two_verdict_lines_are_malformed() -> None:
    _, obs = _run("import os\nfd = int(os.environ['CUMATRIX_VERDICT_FD'])\n"
                  "os.write(fd, b'CUMATRIX-RESULT {\"outcome\": \"ok\"}\\n' * 2)")
    assert obs.outcome == "harness-error"
    assert "2 verdict lines" in obs.detail


def test_verdict_with_invalid_outcome() -> None:
    _, obs = _run(EMIT.format(verdict='{"outcome": "fine"}'))
    assert obs.outcome == "harness-error"
    assert "no valid 'outcome': 'fine'" in obs.detail


def test_parse_rejects_non_objects() -> None:
    assert parse(b"CUMATRIX-RESULT [1]")[1] is not None
    assert parse(b"") == (None, None)
    assert parse(b"x" * (2 << 20))[1] is not None


def test_no_verdict_from_harness_child_is_harness_error() -> None:
    _, obs = _run("print('nothing to say')")
    assert obs.outcome == "harness-error"
    assert "without a verdict" in obs.detail


def test_uncaught_exception_in_case_child_keeps_traceback() -> None:
    # The harness's own child code fails before it can reach a verdict.
    job = Job(cell_id="t", kind="probe", argv=(PY, "-m", "cumatrix.child.case", "{not a spec"), timeout=30,
              env=(("PYTHONPATH", os.pathsep.join(sys.path)),), reports_verdict=True)
    res = run_local(job)
    obs = classify(res, kind="probe")
    assert obs.outcome == "harness-error"
    assert "Traceback (most recent call last)" in res.stderr_tail
    assert "JSONDecodeError" in res.stderr_tail
    assert "JSONDecodeError" in obs.detail


def test_exception_inside_the_probe_is_caught_with_traceback() -> None:
    spec = json.dumps({"kind": "probe", "libcudart": 5})  # ctypes.CDLL(5): TypeError inside the probe
    job = Job(cell_id="t", kind="probe", argv=(PY, "-m", "cumatrix.child.case", spec), timeout=30,
              env=(("PYTHONPATH", os.pathsep.join(sys.path)),), reports_verdict=True)
    res = run_local(job)
    obs = classify(res, kind="probe")
    assert obs.outcome == "harness-error"
    assert "TypeError" in obs.detail
    assert "Traceback (most recent call last)" in res.stderr_tail


def test_signals_are_crashes() -> None:
    _, obs = _run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", kind="command")
    assert obs.outcome == "crash:SIGSEGV"
    assert obs.exit_status == -11
    assert "Segmentation fault" in obs.detail  # faulthandler is on in the child
    _, obs = _run("import os; os.abort()", kind="command")
    assert obs.outcome == "crash:SIGABRT"


def test_a_verdict_from_a_child_a_signal_ended_is_not_taken() -> None:
    # Whoever can signal a harness child may have written its verdict for it: the crash counts.
    _, obs = _run(EMIT.format(verdict='{"outcome": "ok"}') + "import os\nos.abort()")
    assert obs.outcome == "crash:SIGABRT"
    assert "its verdict (ok) is not taken" in obs.detail


def test_exit_status_of_a_command() -> None:
    _, obs = _run("import sys; sys.stderr.write('bad thing\\n'); sys.exit(7)", kind="command")
    assert obs.outcome == "exit:7"
    assert "bad thing" in obs.detail
    _, obs = _run("pass", kind="command")
    assert obs.outcome == "ok"
    assert obs.path == "n/a"


def test_command_that_cannot_start() -> None:
    res = run_local(Job(cell_id="t", kind="command", argv=("/nonexistent/cumatrix-nothing",), timeout=5))
    assert classify(res, kind="command").outcome == "exit:127"


def test_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    code = (f"import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
            f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(300)")
    t0 = time.monotonic()
    res, obs = _run(code, kind="command", timeout=1.5)
    assert time.monotonic() - t0 < 10
    assert obs.outcome == "timeout"
    assert res.timed_out
    assert gone(int(pidfile.read_text())), "the grandchild sleep outlived the timeout"


def test_twenty_megabytes_of_stdout_do_not_stall() -> None:
    code = ("import sys\nfor _ in range(20): sys.stdout.buffer.write(b'x' * (1 << 20))\n"
            "sys.stderr.write('e' * (5 << 20))\n" + EMIT.format(verdict='{"outcome": "ok"}'))
    t0 = time.monotonic()
    res, obs = _run(code, timeout=60)
    assert time.monotonic() - t0 < 10
    assert obs.outcome == "ok"  # the verdict at the very end is still found
    assert len(res.stdout_tail) <= KEEP_HEAD + KEEP_TAIL + 100
    assert len(res.stderr_tail) <= KEEP_HEAD + KEEP_TAIL + 100
    assert "bytes not kept" in res.stdout_tail


def test_library_path_goes_first(tmp_path: Path) -> None:
    job = Job(cell_id="t", kind="command", lib_path=(str(tmp_path),), timeout=10,
              argv=(PY, "-c", "import os; print(os.environ['LD_LIBRARY_PATH'])"))
    res = run_local(job, base_env={**os.environ, "LD_LIBRARY_PATH": "/opt/old"})
    assert res.stdout_tail.strip() == f"{tmp_path}{os.pathsep}/opt/old"


def test_child_dies_with_a_killed_harness(tmp_path: Path) -> None:
    # A SIGKILLed harness runs no `finally`; the child (in its own session) must not outlive it.
    pidfile = tmp_path / "child"
    code = (
        "import sys\n"
        "from cumatrix.execute.local import Job, run_local\n"
        f"run_local(Job(cell_id='t', kind='command', timeout=300, argv=('sh', '-c', 'echo $$ > {pidfile}; exec sleep 300')))\n"
    )
    harness = subprocess.Popen([PY, "-c", code], env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        end = time.monotonic() + 20
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < end:
            time.sleep(0.05)
        child = int(pidfile.read_text())
        assert not gone(child, within=0.2)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        assert gone(child), "the cell's child outlived its SIGKILLed harness"
    finally:
        harness.kill()
        harness.wait()


# ------------------------------------------------------------------------ what a cell's child sees

HARNESS_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "LANG": "C.UTF-8", "LC_ALL": "C",
               "CUDA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute",
               "NVIDIA_API_KEY": "nvapi-x", "CUDA_AUTH_TOKEN": "t", "AWS_SECRET_ACCESS_KEY": "s",
               "GITHUB_TOKEN": "g", "PYTHONPATH": "/harness/site", "VIRTUAL_ENV": "/venv",
               "KVSWAP_CALIBRATION": "/c.json", "CUMATRIX_KEEP_CONTAINERS": "1", "MYAPP_MODE": "fast"}


def test_command_env_is_an_allowlist() -> None:
    job = Job(cell_id="t", kind="command", argv=("true",), env=(("CUMATRIX_CELL", "t"), ("MINE", "1")))
    env = child_env(job, base_env=HARNESS_ENV)
    assert set(env) == {"PATH", "HOME", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                        "CUMATRIX_CELL", "MINE", "PYTHONFAULTHANDLER"}


def test_pass_env_adds_a_name_or_a_pattern() -> None:
    job = Job(cell_id="t", kind="command", argv=("true",))
    env = child_env(job, base_env=HARNESS_ENV, policy=Policy(pass_env=("GITHUB_TOKEN", "MYAPP_*")))
    assert env["GITHUB_TOKEN"] == "g"
    assert env["MYAPP_MODE"] == "fast"
    assert "AWS_SECRET_ACCESS_KEY" not in env


def test_harness_children_keep_their_knobs_and_path_commands_do_not() -> None:
    own = str(Path(sandbox.__file__).resolve().parents[2])
    for kind in ("probe", "swap"):
        env = child_env(Job(cell_id="t", kind=kind, argv=("x",), env=(("PYTHONPATH", own),)), base_env=HARNESS_ENV)
        assert env["PYTHONPATH"] == own
        assert env["KVSWAP_CALIBRATION"] == "/c.json"
        assert "NVIDIA_API_KEY" not in env
        assert "GITHUB_TOKEN" not in env
    # The session gives every job the harness's package dir; a command cell loses it, keeps its own.
    cmd = Job(cell_id="t", kind="command", argv=("x",), env=(("PYTHONPATH", f"{own}{os.pathsep}/cell/site"),))
    env = child_env(cmd, base_env=HARNESS_ENV)
    assert env["PYTHONPATH"] == "/cell/site"
    assert "KVSWAP_CALIBRATION" not in env
    assert "PYTHONPATH" not in child_env(Job(cell_id="t", kind="command", argv=("x",), env=(("PYTHONPATH", own),)),
                                         base_env=HARNESS_ENV)


def test_bwrap_binds_only_what_the_cell_names_and_no_host_socket_directory(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    log = tmp_path / "audit" / "log"
    log.parent.mkdir()
    log.touch()
    job = Job(cell_id="t", kind="swap", argv=(PY, "-m", "cumatrix.child.case"), lib_path=(str(lib),),
              mounts=(str(tmp_path),), writable=(str(log),))
    argv = sandbox.bwrap_argv("bwrap", job, {"PYTHONPATH": "/usr/lib/site:/run/user/0/x"}, str(tmp_path))
    text = " ".join(argv)
    assert "--unshare-net" in argv
    assert "--die-with-parent" in argv
    assert "--share-net" not in argv
    assert "--unshare-cgroup" in argv or "--unshare-cgroup-try" in argv
    assert "--ro-bind / /" not in text
    assert " /run" not in text
    assert "--ro-bind /proc/sys /proc/sys" in text
    assert "--remount-ro /dev" in text
    assert f"--size {sandbox_policy().write_limit} --tmpfs /tmp" in text
    # The outermost directory is bound once, read-only; what lies inside it comes along.
    assert f"--ro-bind {tmp_path} {tmp_path}" in text
    assert f"--ro-bind {lib} {lib}" not in text
    assert f"--bind {log} {log}" in text
    assert f"--bind {log.parent} " not in text
    tail = argv[argv.index("--") + 1:]
    if os.geteuid() == 0:  # a root harness's cell becomes an unprivileged uid, capabilities gone
        assert tail[0].endswith("setpriv")
        assert f"--reuid={sandbox.NOBODY}" in tail
        assert "--no-new-privs" in tail
        tail = tail[tail.index("--") + 1:]
    else:
        assert "--unshare-user" in argv
        assert "--disable-userns" in argv
    assert tail == list(job.argv)


def test_gpu_device_nodes_are_found_as_the_driver_makes_them(tmp_path: Path) -> None:
    # Character devices cannot be made without privileges; the listing only looks at names.
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "null"):
        (tmp_path / name).touch()
    (tmp_path / "nvidia-caps").mkdir()
    (tmp_path / "dri").mkdir()
    got = sandbox.gpu_nodes(tmp_path)
    assert got == [str(tmp_path / n) for n in ("nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl")] + \
        [str(tmp_path / "nvidia-caps"), str(tmp_path / "dri")]


def test_result_says_how_the_tree_was_contained() -> None:
    res = run_local(Job(cell_id="t", kind="command", argv=("true",), timeout=10))
    assert res.extra["containment"] in ("cgroup-v2", "subreaper")
    assert res.extra["containment"] == sandbox.containment().mode


def test_the_harness_environment_is_read_again_when_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every cell's environment comes from the harness's; a variable set, changed or removed
    # between two cells (by a hook, a plugin, the user's conftest) is what the next cell sees.
    job = Job(cell_id="t", kind="command", argv=("true",))
    monkeypatch.setenv("LANG", "C.UTF-8")
    assert child_env(job)["LANG"] == "C.UTF-8"
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    assert child_env(job)["LANG"] == "de_DE.UTF-8"
    monkeypatch.delenv("LANG")
    assert "LANG" not in child_env(job)
    monkeypatch.setenv("NVIDIA_API_KEY", "secret")  # a new variable is filtered like the others
    env = child_env(job)
    assert "NVIDIA_API_KEY" not in env
    env["MINE"] = "1"  # what a caller does to its copy is not what the next cell gets
    assert "MINE" not in child_env(job)
    # pytest rewrites PYTEST_CURRENT_TEST at every phase; a cell gets it only when asked for.
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "a (call)")
    assert "PYTEST_CURRENT_TEST" not in child_env(job)
    asked = Policy(pass_env=("PYTEST_CURRENT_TEST",))
    assert child_env(job, policy=asked)["PYTEST_CURRENT_TEST"] == "a (call)"
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "b (call)")
    assert child_env(job, policy=asked)["PYTEST_CURRENT_TEST"] == "b (call)"


def test_a_bind_is_made_from_where_its_path_leads_and_refused_where_that_is_hidden(tmp_path: Path) -> None:
    # A mount follows its source's links on the host: the view binds the resolved path (checked)
    # at the path as written, and refuses one that leads into /run or the host's root.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "runlink").symlink_to("/run")
    (tmp_path / "rootlink").symlink_to("/")
    ok = Job(cell_id="t", kind="command", argv=("true",), mounts=(str(tmp_path / "link"),))
    argv = sandbox.bwrap_argv("bwrap", ok, {}, "/")
    assert f"--ro-bind {real} {tmp_path / 'link'}" in " ".join(argv)
    for name, leads in (("runlink", "/run"), ("rootlink", "/")):
        bad = Job(cell_id="t", kind="command", argv=("true",), mounts=(str(tmp_path / name),))
        with pytest.raises(sandbox.Refused, match=f"symbolic link {tmp_path / name} \\(-> {leads}\\)"):
            sandbox.bwrap_argv("bwrap", bad, {}, "/")
    # The same place written another way, no link on the way (POSIX keeps a path's two leading
    # slashes): refused, and the message names no link that is not there.
    doubled = Job(cell_id="t", kind="command", argv=("true",), mounts=("//run",))
    with pytest.raises(sandbox.Refused, match=r"^//run is /run: ") as refused:
        sandbox.bwrap_argv("bwrap", doubled, {}, "/")
    assert "symbolic link" not in str(refused.value)


def test_a_file_named_in_tmp_is_bound_alone_never_the_hosts_tmp(tmp_path: Path) -> None:
    script = Path("/tmp") / f"cumatrix-unit-{os.getpid()}.py"
    script.write_text("pass")
    try:
        job = Job(cell_id="t", kind="command", argv=("python3", script.name))
        text = " ".join(sandbox.bwrap_argv("bwrap", job, {}, "/tmp"))
    finally:
        script.unlink()
    assert f"--ro-bind {script} {script}" in text
    assert "--ro-bind /tmp /tmp" not in text


def test_an_earlier_runs_out_is_masked_by_what_the_run_wrote_never_the_directory(tmp_path: Path) -> None:
    # `--out .` once: the project is an earlier run's directory; its next cells still see the
    # project (their working directory), less the run's records and reports.
    from cumatrix.results import store

    assert {store.JSONL, store.PREVIOUS, store.LOCK, *store.REPORTS} <= set(sandbox.RUN_FILES)
    (tmp_path / "results.jsonl").write_text("{}\n")
    (tmp_path / "summary.md").write_text("# run\n")
    (tmp_path / "script.py").write_text("pass\n")
    points, masks, refused = sandbox._points_and_masks((str(tmp_path),), (), (str(tmp_path),))
    assert refused is None
    assert (str(tmp_path), str(tmp_path)) in points
    assert sorted(at for at, _ in masks) == [str(tmp_path / "results.jsonl"), str(tmp_path / "summary.md")]


def test_the_verdict_tag_is_the_childs_own_read_by_the_harness(tmp_path: Path) -> None:
    """The tag is defined once, in the child's module; the harness reads that definition. A
    child that runs with no harness on its path (its module copied alone, as a cell holds it)
    writes a line the harness's parser accepts, and the harness names no tag of its own."""
    import ast

    from cumatrix.child import channel
    from cumatrix.execute import protocol

    assert protocol.TAG is channel.TAG
    tree = ast.parse(Path(protocol.__file__).read_text())
    own = [t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
           if isinstance(t, ast.Name) and t.id == "TAG"]
    assert own == [], "execute/protocol.py defines a verdict tag of its own"
    alone = tmp_path / "channel.py"
    alone.write_bytes(Path(channel.__file__).read_bytes())
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import channel; "
            "sys.stdout.buffer.write(channel.encode({'outcome': 'ok', 'path': 'batch'}))")
    out = subprocess.run([PY, "-I", "-c", code, str(tmp_path)], capture_output=True, check=True, cwd=tmp_path).stdout
    verdict, problem = parse(out)
    assert problem is None
    assert verdict is not None
    assert verdict.outcome == "ok"
