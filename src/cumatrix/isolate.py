"""Run one cell in its own process and classify what it did.

The child protocol (pathfinder's ``subprocess_protocol`` is the model): a child prints
exactly one line ``CUMATRIX-RESULT {json}`` when it reaches a verdict; everything else is
log.  No verdict line means the parent classifies from the exit status and stderr.
Timeout, signal, missing verdict and malformed verdict are distinct outcomes.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .model import OUTCOME_RE, Observed

VERDICT_TAG = "CUMATRIX-RESULT "
#: Bytes kept of each stream: the head (first lines often say what went wrong) and the
#: tail.  A child writing megabytes must neither stall on a full pipe nor bloat the run.
KEEP_HEAD = 8 * 1024
KEEP_TAIL = 32 * 1024

_UNDEFINED_RE = re.compile(r"undefined symbol: ([A-Za-z_][A-Za-z0-9_]*)")
_REFUSED_RE = re.compile(r"unsatisfied condition: (cuda[^\s,;\"]*)")


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
    writable: tuple[str, ...] = ()  # host paths the child writes (docker mounts them read-write)
    runtime_name: str = ""
    image: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildResult:
    returncode: int | None
    signal: int | None
    timed_out: bool
    stdout_tail: str
    stderr_tail: str
    verdict: dict[str, object] | None
    verdict_error: str | None
    duration_s: float
    oom_killed: bool = False
    extra: dict[str, object] = field(default_factory=dict)


class _Capture:
    """Bounded capture of one stream: head + tail + any verdict lines seen."""

    def __init__(self, scan_verdict: bool) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0
        self.scan = scan_verdict
        self.partial = b""
        self.verdicts: list[bytes] = []

    def feed(self, chunk: bytes) -> None:
        if self.scan:
            data = self.partial + chunk
            lines = data.split(b"\n")
            self.partial = lines.pop()
            if len(self.partial) > 1 << 20:  # a 1 MiB line is no verdict
                self.partial = b""
            self.verdicts.extend(ln for ln in lines if ln.startswith(VERDICT_TAG.encode()))
        room = KEEP_HEAD - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > KEEP_TAIL:
            cut = len(self.tail) - KEEP_TAIL
            self.dropped += cut
            del self.tail[:cut]

    def finish(self) -> None:
        if self.scan and self.partial.startswith(VERDICT_TAG.encode()):
            self.verdicts.append(self.partial)

    def text(self) -> str:
        body = self.head.decode(errors="replace")
        if self.dropped:
            body += f"\n[... {self.dropped} bytes not kept ...]\n"
        return body + self.tail.decode(errors="replace")


def scan_verdict(lines: Sequence[bytes | str]) -> tuple[dict[str, object] | None, str | None]:
    """Parse the verdict lines of a child: (verdict, None) or (None, why it is malformed)."""
    if not lines:
        return None, None
    if len(lines) > 1:
        return None, f"{len(lines)} verdict lines (the protocol allows exactly one)"
    raw = lines[0]
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    body = text[len(VERDICT_TAG):].strip()
    try:
        verdict = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"verdict line is not JSON ({e.msg} at column {e.colno}): {body[:200]!r}"
    if not isinstance(verdict, dict):
        return None, f"verdict is not an object: {body[:200]!r}"
    outcome = verdict.get("outcome")
    if not isinstance(outcome, str) or not OUTCOME_RE.match(outcome):
        return None, f"verdict has no valid 'outcome': {outcome!r}"
    return verdict, None


def verdicts_in(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(VERDICT_TAG)]


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
    start = time.monotonic()
    try:
        proc = subprocess.Popen(job.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True,
                                preexec_fn=_die_with_parent())
    except OSError as e:
        # A command that cannot even start is what a shell reports as 126/127.
        code = 127 if isinstance(e, FileNotFoundError) else 126
        return ChildResult(returncode=code, signal=None, timed_out=False, stdout_tail="",
                           stderr_tail=f"cannot start {job.argv[0]!r}: {e.strerror}", verdict=None,
                           verdict_error=None, duration_s=time.monotonic() - start)
    out, err = _Capture(True), _Capture(False)
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
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
    rc = proc.wait()
    out.finish()
    verdict, verr = scan_verdict(out.verdicts)
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


def signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"SIG{num}"


def classify(res: ChildResult, *, kind: str) -> Observed:
    """Turn a finished child into an outcome (DESIGN.md's words)."""
    tail = res.stderr_tail[-600:].strip()
    refused = res.extra.get("refused")
    if isinstance(refused, str):
        return Observed(outcome="refused", detail=refused)
    if res.timed_out:
        return Observed(outcome="timeout", detail=f"no result after {res.duration_s:.1f} s; process group killed")
    if res.verdict is not None:
        v = res.verdict
        detail = str(v.get("detail") or "")
        if res.signal is not None:  # a verdict, then a crash on the way out: the crash is real
            detail = f"{detail}; then killed by {signal_name(res.signal)} on exit".strip("; ")
        data = {k: val for k, val in v.items() if k not in ("outcome", "path", "error_name", "detail")}
        return Observed(outcome=str(v["outcome"]), path=_opt_str(v.get("path")),
                        error_name=_opt_str(v.get("error_name")), detail=detail,
                        exit_status=res.returncode if res.signal is None else -res.signal, data=data)
    if res.signal is not None:
        name = signal_name(res.signal)
        detail = "OOM-killed (memory limit reached)" if res.oom_killed else tail
        return Observed(outcome=f"crash:{name}", detail=detail, exit_status=-res.signal)
    m = _UNDEFINED_RE.search(res.stderr_tail)
    if m and res.returncode != 0:
        return Observed(outcome=f"undefined-symbol:{m.group(1)}", detail=_line_with(res.stderr_tail, m.group(0)),
                        exit_status=res.returncode)
    if res.verdict_error:
        return Observed(outcome="harness-error", detail=f"malformed verdict: {res.verdict_error}",
                        exit_status=res.returncode)
    if kind == "command":
        if res.returncode == 0:
            return Observed(outcome="ok", path="n/a", exit_status=0)
        return Observed(outcome=f"exit:{res.returncode}", detail=tail, exit_status=res.returncode)
    # A harness child that ended without a verdict: its own code failed.
    why = "exited 0 without a verdict line" if res.returncode == 0 else f"exited {res.returncode} without a verdict"
    return Observed(outcome="harness-error", detail=f"{why}: {tail}", exit_status=res.returncode)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _line_with(text: str, needle: str) -> str:
    for line in text.splitlines():
        if needle in line:
            return line.strip()
    return needle
