"""Run one cell in its own process and classify what it did.

Only a harness-owned child (``Job.reports_verdict``) is given the private verdict channel of
:mod:`cumatrix.protocol`; everything any child prints is log.  Timeout, signal, missing
verdict and malformed verdict are distinct outcomes.
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .protocol import PipeChannel, Verdict, parse
#: Bytes kept of each stream: the head (first lines often say what went wrong) and the
#: tail.  A child writing megabytes must neither stall on a full pipe nor bloat the run.
KEEP_HEAD = 8 * 1024
KEEP_TAIL = 32 * 1024



@dataclass(frozen=True, kw_only=True, slots=True)
class Job:
    """Everything a backend needs to run one cell's child."""

    cell_id: str
    kind: str  # probe | command | swap
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    lib_path: tuple[str, ...] = ()  # prepended to LD_LIBRARY_PATH, in order
    timeout: float = 120.0
    mounts: tuple[str, ...] = ()  # host paths the child reads (docker mounts them read-only)
    runtime_name: str = ""
    image: str | None = None
    #: A harness-owned child (probe, swap): it alone gets the private verdict channel.
    reports_verdict: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildResult:
    returncode: int | None
    signal: int | None
    timed_out: bool
    stdout_tail: str
    stderr_tail: str
    verdict: Verdict | None
    verdict_error: str | None
    duration_s: float
    oom_killed: bool = False
    extra: dict[str, object] = field(default_factory=dict)


class _Capture:
    """Bounded capture of one stream: its head and its tail."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = KEEP_HEAD - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > KEEP_TAIL:
            cut = len(self.tail) - KEEP_TAIL
            self.dropped += cut
            del self.tail[:cut]

    def text(self) -> str:
        body = self.head.decode(errors="replace")
        if self.dropped:
            body += f"\n[... {self.dropped} bytes not kept ...]\n"
        return body + self.tail.decode(errors="replace")


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child die with the harness (Linux ``PR_SET_PDEATHSIG``).

    Children run in their own session, so a SIGKILL of the harness (which runs no
    ``finally``) would otherwise leave a cell running with nobody to time it out.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the harness died before prctl took effect
            os._exit(128 + int(signal.SIGKILL))

    return preexec


def run_local(job: Job, *, base_env: Mapping[str, str] | None = None, cwd: str | None = None) -> ChildResult:
    """Run ``job.argv`` as a child in its own process group, bounded in time and output."""
    env = dict(os.environ if base_env is None else base_env)
    env.update(job.env)
    if job.lib_path:
        old = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*job.lib_path, *([old] if old else [])])
    env.setdefault("PYTHONFAULTHANDLER", "1")
    # A program's own output can never carry a verdict: only a harness child gets a channel.
    chan = PipeChannel() if job.reports_verdict else None
    if chan is None:
        for name in ("CUMATRIX_VERDICT_FD", "CUMATRIX_VERDICT_FILE"):
            env.pop(name, None)
    else:
        env.update(chan.env())
    start = time.monotonic()
    try:
        proc = subprocess.Popen(job.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True,
                                pass_fds=(chan.write_fd,) if chan else (), preexec_fn=_die_with_parent())
    except OSError as e:
        if chan:
            chan.close()
        # A command that cannot even start is what a shell reports as 126/127.
        code = 127 if isinstance(e, FileNotFoundError) else 126
        return ChildResult(returncode=code, signal=None, timed_out=False, stdout_tail="",
                           stderr_tail=f"cannot start {job.argv[0]!r}: {e.strerror}", verdict=None,
                           verdict_error=None, duration_s=time.monotonic() - start)
    out, err = _Capture(), _Capture()
    sel = selectors.DefaultSelector()
    if proc.stdout is None or proc.stderr is None:
        raise RuntimeError("Popen gave no pipes")
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    if chan:
        chan.after_spawn()
        sel.register(chan.read_fd, selectors.EVENT_READ, chan)
    deadline = start + job.timeout
    timed_out = False
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(remaining, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.feed(chunk)
        if not timed_out:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        if timed_out or proc.poll() is None:
            _kill_group(proc)
        # The group may hold children that outlive the leader; end them too.
        _kill_group(proc, quiet=True)
        sel.close()
        proc.stdout.close()
        proc.stderr.close()
        if chan:
            chan.close()
    rc = proc.wait()
    verdict, verr = parse(chan.raw()) if chan else (None, None)
    return ChildResult(returncode=None if rc < 0 else rc, signal=-rc if rc < 0 else None,
                       timed_out=timed_out, stdout_tail=out.text(), stderr_tail=err.text(),
                       verdict=verdict, verdict_error=verr, duration_s=time.monotonic() - start)


def _kill_group(proc: subprocess.Popen[bytes], *, quiet: bool = False) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    except PermissionError:
        if not quiet:
            proc.kill()
    if not quiet:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
