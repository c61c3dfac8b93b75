"""What a cell of a default ``cumatrix run`` is shown is decided by where each path leads, what
the harness keeps stays masked wherever it lies, and the cell's own ``/tmp`` stays its own.

Each attack is a hostile cell of a real ``cumatrix run`` (real bubblewrap or the fork server,
real sockets under the host's ``/run``): before, a link inside the project (``cwd: runlink``, a
``PATH`` entry, an ``argv`` path through it) bound the host's ``/run`` and the cell connected
to a socket there; a ``--history FILE`` inside the project was readable; a matrix kept in
``/tmp`` covered the cell's private ``/tmp`` with the host's, read-only.  Skipped where
bubblewrap cannot run (unless ``CUMATRIX_REQUIRE_BWRAP=1``).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cumatrix.execute.sandbox import SANDBOXED
from helpers.sandbox import CONNECT, HOLDERS, hold_with, require_bwrap, socket_under_run
from helpers.users import local_user

CU129 = "nvidia-cuda-runtime-cu12==12.9.79"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.network  # the cells provision a real runtime wheel (cached after the first)

@pytest.fixture(autouse=True, params=HOLDERS)
def holder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every view here is built both ways: by the fork server and by bubblewrap per cell."""
    require_bwrap()
    return hold_with(request.param, monkeypatch)


@pytest.fixture
def run_socket() -> Iterator[Path]:
    with socket_under_run() as where:
        yield where


def _project(tmp_path: Path) -> Path:
    """A project as a checkout is (pytest makes tmp_path 0700; a root harness's cells run as
    nobody, which must enter it) holding ``runlink``, a link to the host's ``/run``, and
    ``work``, a directory a case may start in."""
    tmp_path.chmod(0o755)
    (tmp_path / "runlink").symlink_to("/run")
    (tmp_path / "work").mkdir(mode=0o755)  # a case's cwd: other than the project, whose bind would show the link as one
    return tmp_path


def _run(cli: Any, matrix: Path, out: Path, *args: str, cwd: Path) -> tuple[Any, dict[str, Any]]:
    """A default (sandboxed) run of ``matrix``; its exit and the record of its one case."""
    proc = cli("run", matrix, "--out", out, "-q", *args, cwd=cwd, timeout=180)
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    cells = [r for r in recs if r.get("type") == "cell"]
    assert len(cells) == 1, proc.stdout + proc.stderr
    assert recs[0]["sandbox"] in SANDBOXED, recs[0]
    return proc, cells[0]


def _matrix(where: Path, case: str, name: str = "m.yaml") -> Path:
    m = where / name
    m.write_text(textwrap.dedent(f"""
        runtimes: {{cu12.9: {{wheel: {CU129}}}}}
        drivers: [host]
        probe: false
        cases:
        """).lstrip("\n") + textwrap.indent(textwrap.dedent(case).strip("\n"), "  ") + "\n")
    m.chmod(0o644)
    return m


def _refused(proc: Any, rec: dict[str, Any], link: Path) -> None:
    """The cell never ran, and the run says which link led where."""
    said = proc.stdout + proc.stderr
    assert "connected" not in said + rec.get("stdout_tail", ""), said
    assert rec["observed"]["outcome"] == "harness-error", rec["observed"]
    detail = rec["observed"]["detail"] + rec.get("stderr_tail", "")
    assert f"symbolic link {link} (-> /run)" in detail, detail
    assert proc.returncode == 1, said


def test_a_cwd_through_a_link_to_run_is_refused_naming_the_link(tmp_path: Path, cli: Any, wheel_cache: Path,
                                                                run_socket: Path) -> None:
    """``cwd: runlink``: before, the sandbox bound the host's ``/run`` at the project's
    ``runlink`` and the cell connected to the socket there (``ok``, exit 0)."""
    proj = _project(tmp_path)
    m = _matrix(proj, f"""
        - name: attack
          cwd: runlink
          argv: [python3, -c, {json.dumps(CONNECT)}, {run_socket.name}/sock]
        """)
    proc, rec = _run(cli, m, proj / "out", cwd=proj)
    _refused(proc, rec, proj / "runlink")


def test_a_path_entry_through_a_link_to_run_is_refused(tmp_path: Path, cli: Any, wheel_cache: Path,
                                                       run_socket: Path) -> None:
    """A ``PATH`` entry through the link (the socket's path reaches the cell in a variable no
    bind reads): before, the entry's directory was bound and the cell connected."""
    proj = _project(tmp_path)
    through = proj / "runlink" / run_socket.name
    m = _matrix(proj, f"""
        - name: attack
          cwd: work
          argv: [python3, -c, {json.dumps(CONNECT)}]
          env: {{PATH: "{through}:/usr/local/bin:/usr/bin:/bin", SOCK: "{through}/sock"}}
        """)
    proc, rec = _run(cli, m, proj / "out", cwd=proj)
    _refused(proc, rec, proj / "runlink")


def test_an_absolute_argv_path_through_a_link_to_run_is_refused(tmp_path: Path, cli: Any, wheel_cache: Path,
                                                                run_socket: Path) -> None:
    """``argv: [python3, PROJECT/runlink/.../connect.py]``: before, the script's directory (the
    socket's) was bound, the script ran and connected."""
    proj = _project(tmp_path)
    m = _matrix(proj, f"""
        - name: attack
          cwd: work
          argv: [python3, {proj / 'runlink' / run_socket.name / 'connect.py'}]
        """)
    proc, rec = _run(cli, m, proj / "out", cwd=proj)
    _refused(proc, rec, proj / "runlink")


def test_a_socket_under_run_is_out_of_reach_of_a_default_runs_cell(tmp_path: Path, cli: Any, wheel_cache: Path,
                                                                   run_socket: Path) -> None:
    """The same socket named directly: the cell runs (``ok``) and cannot connect."""
    tmp_path.chmod(0o755)
    m = _matrix(tmp_path, f"""
        - name: attack
          argv: [python3, -c, {json.dumps(CONNECT)}, {run_socket / 'sock'}]
        """)
    _, rec = _run(cli, m, tmp_path / "out", cwd=tmp_path)
    assert rec["observed"]["outcome"] == "ok", rec["observed"]
    assert "refused" in rec["stdout_tail"], rec["stdout_tail"]
    assert "connected" not in rec["stdout_tail"]


READ_KEPT = r"""
import os, sys
for path in sys.argv[1:]:
    try:
        with open(path, "rb") as f:
            data = f.read()
        print("read", path, len(data), data[:16])
    except OSError as e:
        print("refused", path, e.errno)
"""


def test_the_history_and_this_and_earlier_runs_out_inside_the_project_are_masked(tmp_path: Path, cli: Any,
                                                                                 wheel_cache: Path) -> None:
    """``--history ./hist.sqlite --out ./out``, inside the project the cell starts in, and
    ``./earlier``, the ``--out`` of a run before: before, the cell read the history
    (``SQLite format 3``) and the earlier run's records; this run's records are masked too."""
    tmp_path.chmod(0o755)
    m = _matrix(tmp_path, f"""
        - name: attack
          argv: [python3, -c, {json.dumps(READ_KEPT)}, hist.sqlite, out/results.jsonl, earlier/results.jsonl]
        """)
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    first = cli("run", m, "--out", "earlier", "--history", "hist.sqlite", "-q", cwd=tmp_path, env=env, timeout=180)
    assert (tmp_path / "hist.sqlite").read_bytes().startswith(b"SQLite format 3"), first.stdout + first.stderr
    assert (tmp_path / "earlier" / "results.jsonl").is_file()
    proc = cli("run", m, "--out", "out", "--history", "hist.sqlite", "-q", cwd=tmp_path, env=env, timeout=180)
    rec = next(json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()
               if json.loads(line).get("type") == "cell")
    said = rec["stdout_tail"]
    assert "read" not in said, said
    assert "SQLite" not in said
    assert said.count("refused") == 3, (said, proc.stdout + proc.stderr)


#: Writes where programs keep their temporary files and caches (CuPy: ``$HOME/.cupy``; JAX:
#: ``/tmp/tempfile-*``), and reads a file of its directory.
WRITES = r"""
import os, tempfile
open(os.path.join("/tmp", os.environ["WRITTEN"]), "w").write("x")
os.makedirs(os.path.join(os.environ["HOME"], ".cache"), exist_ok=True)
open(os.path.join(os.environ["HOME"], ".cache", "x"), "w").write("x")
with tempfile.NamedTemporaryFile(dir=os.environ["TMPDIR"]) as f:
    f.write(b"x")
os.makedirs("/dev/shm/x", exist_ok=True)
print("wrote", os.getcwd(), open(os.environ["NEIGHBOUR"]).read())
"""


@pytest.fixture
def in_tmp() -> Iterator[str]:
    """A unique name for files put directly in the host's ``/tmp`` (removed after)."""
    name = f"cumatrix-test-{secrets.token_hex(6)}"
    yield name
    for p in Path("/tmp").glob(f"{name}*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def test_a_matrix_kept_directly_in_tmp_leaves_the_cell_its_own_writable_tmp(in_tmp: str, tmp_path: Path,
                                                                           cli: Any, wheel_cache: Path) -> None:
    """The matrix file itself in ``/tmp`` (its cases start there): before, the host's ``/tmp``
    was bound read-only over the cell's own and every write failed (``EROFS``)."""
    tmp_path.chmod(0o755)
    script = Path("/tmp") / f"{in_tmp}.py"
    script.write_text(WRITES)
    script.chmod(0o644)
    neighbour = Path("/tmp") / f"{in_tmp}.txt"
    neighbour.write_text("neighbour")
    neighbour.chmod(0o644)
    m = _matrix(Path("/tmp"), f"""
        - name: writes
          argv: [python3, {script.name}, {neighbour.name}]
          env: {{NEIGHBOUR: {neighbour.name}, WRITTEN: {in_tmp}-written}}
        """, name=f"{in_tmp}.yaml")
    proc, rec = _run(cli, m, tmp_path / "out", cwd=tmp_path)
    assert rec["observed"]["outcome"] == "ok", (rec["observed"], rec.get("stderr_tail"))
    assert "wrote /tmp neighbour" in rec["stdout_tail"]
    assert not Path(f"/tmp/{in_tmp}-written").exists()  # the cell's /tmp was its own
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_matrix_under_tmp_leaves_the_cell_its_own_writable_tmp(in_tmp: str, tmp_path: Path, cli: Any,
                                                                 wheel_cache: Path) -> None:
    where = Path("/tmp") / in_tmp / "some" / "dir"
    where.mkdir(parents=True)
    for d in (where, where.parent, where.parent.parent):
        d.chmod(0o755)
    (where / "writes.py").write_text(WRITES)
    (where / "neighbour.txt").write_text("neighbour")
    m = _matrix(where, """
        - name: writes
          argv: [python3, writes.py]
          env: {NEIGHBOUR: neighbour.txt, WRITTEN: x}
        """)
    _, rec = _run(cli, m, tmp_path / "out", cwd=tmp_path)
    assert rec["observed"]["outcome"] == "ok", (rec["observed"], rec.get("stderr_tail"))
    assert f"wrote {where} neighbour" in rec["stdout_tail"]
    assert not (where / "x").exists()


#: Run as an ordinary user (the non-root harness: bubblewrap per cell, in a user namespace).
AS_USER = r"""
import json, sys
from cumatrix.core.jobs import Job
from cumatrix.execute.local import HARNESS_PROBLEM, run_local
from cumatrix.execute.sandbox import Policy
out = {}
for name, cwd, code in json.loads(sys.argv[1]):
    res = run_local(Job(cell_id=name, kind="command", timeout=60, argv=("python3", "-c", code)),
                    policy=Policy(sandbox="on"), cwd=cwd)
    out[name] = {"rc": res.returncode, "out": res.stdout_tail, "err": res.stderr_tail,
                 "sandbox": res.extra.get("sandbox"), "problem": res.extra.get(HARNESS_PROBLEM)}
print(json.dumps(out))
"""


@pytest.mark.parametrize("holder", ["bubblewrap"], indirect=True)  # how an ordinary user's cells are held
def test_an_ordinary_users_cells_get_the_same_view(in_tmp: str, run_socket: Path, holder: str) -> None:
    """The non-root harness (bubblewrap per cell as a second local user): a working directory
    through the link is refused naming it; one that is ``/tmp`` leaves the cell its own."""
    user = local_user("cmxother")
    proj = Path("/tmp") / in_tmp  # a project that user may enter (pytest's tmp_path is 0700)
    proj.mkdir(mode=0o755)
    (proj / "runlink").symlink_to("/run")
    home = proj / "home"
    home.mkdir()
    os.chown(home, user.pw_uid, user.pw_gid)
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 an ordinary user may run")
    jobs = [("link", str(proj / "runlink"), CONNECT.replace('sys.argv[1] if len(sys.argv) > 1 else '
                                                                'os.environ["SOCK"]', f"{run_socket.name!r} + '/sock'")),
            ("tmp", "/tmp", "open('/tmp/x', 'w').write('x'); import os; print('wrote', os.getcwd())")]
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"), "PATH": "/usr/local/bin:/usr/bin:/bin",
           "PYTHONPATH": str(REPO / "src"), "CUMATRIX_FORK_SERVER": "off"}
    proc = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
                           python, "-c", AS_USER, json.dumps(jobs)], capture_output=True, text=True, env=env,
                          cwd=str(home), timeout=300, check=False)
    if proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr:
        pytest.skip(f"the system python3 lacks what cumatrix needs: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if got["tmp"]["sandbox"] != "bubblewrap":
        pytest.skip(f"an ordinary user cannot sandbox here: {got['tmp']['sandbox']}")
    assert "connected" not in got["link"]["out"], got["link"]
    assert got["link"]["rc"] is None, got["link"]
    assert f"symbolic link {proj / 'runlink'} (-> /run)" in got["link"]["problem"], got["link"]
    assert got["tmp"]["rc"] == 0, got["tmp"]
    assert "wrote /tmp" in got["tmp"]["out"]
