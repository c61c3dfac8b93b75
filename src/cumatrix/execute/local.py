"""Run one cell in its own process and classify what it did.

Only a harness-owned child (``Job.reports_verdict``) is given the private verdict channel of
:mod:`cumatrix.execute.protocol`; everything any child prints is log.  Timeout, signal, missing
verdict and malformed verdict are distinct outcomes.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

from cumatrix.core.jobs import ChildResult, Job, Verdict
from cumatrix.core.witness import UNTRACED, KernelTrace, TraceChannel
from cumatrix.execute import forkserver, sandbox
from cumatrix.execute.containment import containment
from cumatrix.execute.protocol import ENV_FD, ENV_FILE, PipeChannel, parse

__all__ = ["DEBUGGER_EVIDENCE", "ChildResult", "Job", "ReadyChild", "SpawnMode", "ready_local", "run_local", "start_local"]

#: How a child is spawned.  ``cell``: under the kernel tracer (where it is enabled), whose
#: record is the evidence of what the tree ran and mapped.  ``debugger``: a debugger (gdb)
#: leads the tree and traces it itself; a process has one tracer, so the kernel tracer stays
#: out, and the result says its evidence is the debugger's run.  Both get the same
#: environment, limits, sandbox, timeout and containment (the process group and whatever
#: left it end with the child).
SpawnMode = Literal["cell", "debugger"]
#: ``ChildResult.extra`` key of why the harness could not start the child at all (a sandbox asked
#: for and missing, its launcher gone): a fact of this stage; the judge names the outcome.
HARNESS_PROBLEM = "harness_error"
#: What a debugger run's result says of its evidence (``ChildResult.extra["evidence"]``).
DEBUGGER_EVIDENCE = "the debugger's run, not kernel-traced: the debugger is the tree's tracer"

#: Bytes kept of each stream: the head (first lines often say what went wrong) and the
#: tail.  A child writing megabytes must neither stall on a full pipe nor bloat the run.
KEEP_HEAD = 8 * 1024
KEEP_TAIL = 32 * 1024

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


def run_local(job: Job, *, base_env: Mapping[str, str] | None = None, cwd: str | None = None,
              policy: sandbox.Policy | None = None, mode: SpawnMode = "cell") -> ChildResult:
    """Run ``job.argv`` as a child in its own process group, bounded in time and output.

    :func:`cumatrix.execute.sandbox.prepare` decides what the child sees (its environment, limits,
    bubblewrap per ``policy``); every process the child starts ends with the cell.  A
    program's own output can never carry a verdict: only a harness child
    (``Job.reports_verdict``) gets the private channel of :mod:`cumatrix.execute.protocol`.
    """
    return start_local(job, base_env=base_env, cwd=cwd, policy=policy, mode=mode).wait()


def start_local(job: Job, *, base_env: Mapping[str, str] | None = None, cwd: str | None = None,
                policy: sandbox.Policy | None = None, mode: SpawnMode = "cell", serve: bool = True) -> LocalChild:
    """Start ``job``'s child and return at once; :meth:`LocalChild.wait` finishes it.

    A child that cannot start (no such program, a sandbox that was asked for and is missing)
    comes back already finished.  Until ``wait`` reads them, the child's output waits in its
    pipes (a child that fills one waits too); its timeout counts from here.
    """
    return ready_local(job, base_env=base_env, cwd=cwd, policy=policy, mode=mode, serve=serve, now=True).go()


def ready_local(job: Job, *, base_env: Mapping[str, str] | None = None, cwd: str | None = None,
                policy: sandbox.Policy | None = None, mode: SpawnMode = "cell", serve: bool = True,
                now: bool = False) -> ReadyChild:
    """Make ``job``'s child ready to start, without starting its program: :meth:`ReadyChild.go`
    starts it (or :meth:`ReadyChild.cancel` drops it).

    Made ready while another cell runs, the next cell's cost moves out of the time between the
    two: its environment, sandbox plan and cgroup are made here, and a cell the fork server
    holds also gets its tracer, namespaces and root here, its program waiting for ``go``.  The
    program never runs before ``go``, and its timeout counts from there.  Where the harness
    has no cgroups (the subreaper's sweep counts the cells open at once), nothing is made
    before ``go``.  ``now``: ``go`` follows at once (:func:`start_local`).
    """
    # A cell the fork server holds is made ready ahead without a cgroup too: its processes are
    # in a pid namespace of its own, which ends them, and no sweep counts it.
    ahead = containment().group is not None or (serve and mode == "cell" and sandbox.served_without_cgroup(policy))
    if not ahead and not now:
        return ReadyChild(lambda: ready_local(job, base_env=base_env, cwd=cwd, policy=policy, mode=mode,
                                              serve=serve, now=True).go())
    plan, scope = sandbox.prepare(job, base_env=base_env, cwd=cwd, policy=policy, trace=mode == "cell", serve=serve)
    if mode == "debugger":
        plan.extra.update(spawn_mode="debugger", evidence=DEBUGGER_EVIDENCE)
    if plan.problem is not None:
        scope.end()
        problem = plan.problem
        done = ChildResult(returncode=None, signal=None, timed_out=False, stdout_tail="", stderr_tail=problem,
                           verdict=None, verdict_error=None, duration_s=0.0,
                           extra={**plan.extra, HARNESS_PROBLEM: problem})
        return ReadyChild(lambda: LocalChild(job, plan, scope, time.monotonic(), done=done))
    env, plan, chan = _with_channel(job, plan)
    if plan.served is not None:
        served = _start_served(job, plan, scope, time.monotonic(), env, chan)
        if isinstance(served, LocalChild):
            return ReadyChild(held=served)
        # The server cannot take this cell (too large a message, a server that cannot start):
        # bubblewrap holds it, and its record says so and why.
        ready = ready_local(job, base_env=base_env, cwd=cwd, policy=policy, mode=mode, serve=False, now=now)
        ready.extra["fork_server_refused"] = served
        return ready
    return ReadyChild(lambda: _popen(job, plan, scope, env, chan, cwd), undo=lambda: _undo(scope, chan, plan))


def _undo(scope: sandbox.Scope, chan: PipeChannel | None, plan: sandbox.Plan) -> None:
    scope.end()
    if chan:
        chan.close()
    if plan.trace:
        plan.trace.close()


def _popen(job: Job, plan: sandbox.Plan, scope: sandbox.Scope, env: dict[str, str], chan: PipeChannel | None,
           cwd: str | None) -> LocalChild:
    start = time.monotonic()
    try:
        # No preexec_fn where the spawn shim exists: subprocess then uses vfork, not fork.
        proc = subprocess.Popen(plan.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True,
                                pass_fds=plan.pass_fds,
                                preexec_fn=plan.preexec_fn)  # noqa: PLW1509 - only without the C helper
    except (OSError, subprocess.SubprocessError) as e:
        _undo(scope, chan, plan)
        why = e.strerror if isinstance(e, OSError) else str(e)
        if isinstance(e, OSError) and plan.argv[0] != job.argv[0] and not Path(plan.argv[0]).exists():
            # The harness's own launcher (the spawn helper in the cache, or bubblewrap) is gone,
            # not the cell's program: the cell never ran, and the harness says so.
            sandbox.forget_shim()
            detail = (f"cannot start the cell: the harness's launcher {plan.argv[0]} is gone ({why}); "
                      "was the cache removed during the run?")
            return LocalChild(job, plan, scope, start, done=ChildResult(
                returncode=None, signal=None, timed_out=False, stdout_tail="", stderr_tail=detail,
                verdict=None, verdict_error=None, duration_s=time.monotonic() - start,
                extra={**plan.extra, HARNESS_PROBLEM: detail}))
        # A command that cannot even start is what a shell reports as 126/127.
        code = 127 if isinstance(e, FileNotFoundError) else 126
        return LocalChild(job, plan, scope, start, done=ChildResult(
            returncode=code, signal=None, timed_out=False, stdout_tail="",
            stderr_tail=f"cannot start {job.argv[0]!r}: {why}", verdict=None, verdict_error=None,
            duration_s=time.monotonic() - start, extra=plan.extra))
    scope.started(proc.pid)
    if chan:
        chan.after_spawn()
    if plan.trace:
        plan.trace.after_spawn()
    return LocalChild(job, plan, scope, start, proc=proc, chan=chan)


def _start_served(job: Job, plan: sandbox.Plan, scope: sandbox.Scope, start: float, env: dict[str, str],
                  chan: PipeChannel | None) -> LocalChild | str:
    """Hand the cell to the fork server, held (:mod:`cumatrix.execute.forkserver`); why not where
    it cannot take it (everything made for it undone)."""
    assert plan.served is not None
    assert plan.trace is not None
    helper = sandbox.spawn_shim()
    try:
        if helper is None:
            raise forkserver.ServerGone("the spawn helper is gone")
        proc = forkserver.start(plan.served, helper, list(plan.argv), env, plan.trace.write_fd,
                                [chan.write_fd] if chan else [], hold=True)
    except forkserver.ServerGone as e:
        _undo(scope, chan, plan)
        return str(e)
    if chan:
        chan.after_spawn()
    plan.trace.after_spawn()
    scope.served = scope.cgroup is None
    return LocalChild(job, plan, scope, start, proc=proc, chan=chan)


class ReadyChild:
    """A job's child made ready (:func:`ready_local`): :meth:`go` starts its program, once."""

    def __init__(self, start: Callable[[], LocalChild] | None = None, *, held: LocalChild | None = None,
                 undo: Callable[[], None] | None = None) -> None:
        self._start, self._held, self._undo = start, held, undo
        #: Facts for the child's record, known before it started (``fork_server_refused``).
        self.extra: dict[str, object] = {}

    def go(self) -> LocalChild:
        """Start the program now; its clock (and timeout) starts here."""
        if self._held is not None:
            child, self._held = self._held, None
            assert isinstance(child.proc, forkserver.Served)
            child.start = time.monotonic()
            child.proc.release()
        else:
            assert self._start is not None, "a ready child starts once"
            child, self._start, self._undo = self._start(), None, None
        child.plan.extra.update(self.extra)
        return child

    def cancel(self) -> None:
        """Drop it unstarted: what was made for it is undone."""
        if self._held is not None:
            self._held.cancel()
            self._held = None
        elif self._undo is not None:
            self._undo()
        self._start = self._undo = None


class LocalChild:
    """A job's child from its start to its end: :meth:`wait` for its result, or :meth:`cancel`."""

    def __init__(self, job: Job, plan: sandbox.Plan, scope: sandbox.Scope, start: float, *,
                 proc: subprocess.Popen[bytes] | forkserver.Served | None = None, chan: PipeChannel | None = None,
                 done: ChildResult | None = None) -> None:
        self.job, self.plan, self.scope, self.start = job, plan, scope, start
        self.proc, self.chan, self.done = proc, chan, done
        self._trace: KernelTrace = UNTRACED

    def wait(self, *, gone: Callable[[], None] | None = None) -> ChildResult:
        """Read the child's streams until it ends (or its timeout kills it); its result.

        ``gone`` is called once the child's processes are all gone, before its result is put
        together (the next cell's program starts there, beside this one's bookkeeping)."""
        if self.done is not None:
            if gone is not None:
                gone()
            return self.done
        proc, chan, scope = self.proc, self.chan, self.scope
        assert proc is not None
        out, err = _Capture(), _Capture()
        sel = self._selector(out, err)
        timed_out = False
        try:
            timed_out = _pump(sel, proc, scope, self.start + self.job.timeout)
        finally:
            sel.close()
            self._end(kill=timed_out or proc.poll() is None, gone=gone)
        verdict, verr = parse(chan.raw()) if chan else (None, None)
        trace = self._trace
        rc = proc.wait()
        lost = self._lost(out, err) if isinstance(proc, forkserver.Served) and not timed_out else None
        self.done = lost or _result(rc, self.plan, scope, timed_out=timed_out, out=out, err=err, verdict=verdict,
                                    verr=verr, start=self.start, trace=trace)
        return self.done

    def _selector(self, out: _Capture, err: _Capture) -> selectors.BaseSelector:
        """A selector over what the child writes: its streams, its verdict channel, its trace."""
        proc = self.proc
        assert proc is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        if self.chan:
            sel.register(self.chan.read_fd, selectors.EVENT_READ, self.chan)
        if self.plan.trace:
            sel.register(self.plan.trace.read_fd, selectors.EVENT_READ, self.plan.trace)
        return sel

    def _lost(self, out: _Capture, err: _Capture) -> ChildResult | None:
        """The result of a served cell whose tracer ended without its status, or whose sandbox
        was not built: no outcome, a harness problem (None: the cell has its status)."""
        proc = self.proc
        assert isinstance(proc, forkserver.Served)
        if not (proc.lost or proc.setup_failed):
            return None
        detail = "the fork server's tracer of this cell ended without its status: the cell has no outcome"
        if proc.setup_failed:
            last = err.text().strip().splitlines()
            detail = f"{proc.setup_failed}: {last[-1] if last else 'no message'}"
        return ChildResult(returncode=None, signal=None, timed_out=False, stdout_tail=out.text(),
                           stderr_tail=err.text(), verdict=None, verdict_error=None,
                           duration_s=time.monotonic() - self.start,
                           extra={**self.plan.extra, HARNESS_PROBLEM: detail})

    def cancel(self) -> None:
        """End the child and everything it started, unread (a cell that will not be reported)."""
        if self.done is None and self.proc is not None:
            self._end(kill=True)
            self.proc.wait()
        self.done = self.done or ChildResult(returncode=None, signal=None, timed_out=False, stdout_tail="",
                                             stderr_tail="", verdict=None, verdict_error="cancelled",
                                             duration_s=0.0)

    def _end(self, *, kill: bool, gone: Callable[[], None] | None = None) -> None:
        proc = self.proc
        assert proc is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            if kill:
                _kill_group(proc)
            # The group may hold children that outlive the leader; end them too, and then
            # whatever left the group (setsid daemons): the cell's cgroup, or the sweep.
            _kill_group(proc, quiet=True)
            if gone is not None and _all_gone(proc):
                gone()  # the next cell's program starts now, its cgroup's removal beside it
                gone = None
            self.scope.end()
            if gone is not None:
                gone()
        finally:
            proc.stdout.close()
            proc.stderr.close()
            if self.chan:
                self.chan.close()
            if self.plan.trace:
                self._trace = _drain_trace(self.plan.trace)


def _all_gone(proc: subprocess.Popen[bytes] | forkserver.Served) -> bool:
    """Whether every process of the cell has ended, by its tracer's word: a served cell's
    status came (the tracer writes it once no process it traced is left, its init reaped, and
    its pid namespace with it)."""
    return isinstance(proc, forkserver.Served) and proc.returncode is not None and not proc.lost


def _drain_trace(chan: TraceChannel) -> KernelTrace:
    """What the tracer wrote that is still in its pipe (it is gone: the pipe ends), then its record."""
    try:
        os.set_blocking(chan.read_fd, False)
        while True:
            try:
                chunk = os.read(chan.read_fd, 65536)
            except BlockingIOError:
                break  # a process the cell left holds no copy; only a live tracer would: not waited for
            if not chunk:
                break
            chan.feed(chunk)
    except OSError:
        pass
    finally:
        got = chan.result()
        chan.close()
    return got


def _result(rc: int, plan: sandbox.Plan, scope: sandbox.Scope, *, timed_out: bool, out: _Capture, err: _Capture,
            verdict: Verdict | None, verr: str | None, start: float, trace: KernelTrace | None = None) -> ChildResult:
    extra = dict(plan.extra)
    # Processes the cell left running, killed with it: by the harness, or followed to their end
    # by the tracer (which kills them once its grace ends).
    left = scope.killed + (trace.left if trace is not None and plan.trace is not None else 0)
    if left:
        extra["killed_after"] = left
    sig = -rc if rc < 0 else None
    if plan.signal_in_exit and sig is None and 128 < rc < 128 + 65:
        extra["exit_code_raw"] = rc  # bubblewrap reports a child killed by signal N as 128+N
        sig = rc - 128
    return ChildResult(returncode=None if sig is not None else rc, signal=sig,
                       timed_out=timed_out, stdout_tail=out.text(), stderr_tail=err.text(),
                       verdict=verdict, verdict_error=verr, duration_s=time.monotonic() - start, extra=extra,
                       trace=trace if plan.trace is not None else None)


def _with_channel(job: Job, plan: sandbox.Plan) -> tuple[dict[str, str], sandbox.Plan, PipeChannel | None]:
    """The child's environment and fds: a harness child gets the verdict socket, nobody else does."""
    env = {k: v for k, v in plan.env.items() if k not in (ENV_FD, ENV_FILE)}
    if not job.reports_verdict:
        return env, plan, None
    chan = PipeChannel()
    env.update(chan.env())
    return env, replace(plan, pass_fds=(*plan.pass_fds, chan.write_fd)), chan


def _pump(sel: selectors.BaseSelector, proc: subprocess.Popen[bytes] | forkserver.Served, scope: sandbox.Scope,
          deadline: float) -> bool:
    """Read the child's streams until they close; True when the deadline passed first.

    Once a served cell's program has closed its output and only the tracer's record is still
    to come (its end, a fraction of a millisecond away), the streams are polled, not waited on,
    for up to :data:`END_POLL_S`: an idle CPU's wake-up would cost about as much again."""
    ending = _Ending(proc)
    while sel.get_map():
        now = time.monotonic()
        remaining = deadline - now
        if remaining <= 0:
            return True
        timeout = ending.timeout(sel, now, remaining)
        events = sel.select(timeout=timeout)
        if not events and timeout and proc.poll() is not None:
            # The cell's process is done and its pipes are quiet: whatever still holds
            # them open (a daemon it left) is killed, which closes them.
            scope.end()
        for key, _ in events:
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            key.data.feed(chunk)
    try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return True
    return False


#: How long a served cell's end is polled for once only its record is left to come (:func:`_pump`).
END_POLL_S = 0.002


class _Ending:
    """How long :func:`_pump` waits for the child's streams: up to half a second at a time,
    and not at all (a poll) for :data:`END_POLL_S` from when a served cell's program closed its
    output and only its tracer's record is left to come."""

    def __init__(self, proc: subprocess.Popen[bytes] | forkserver.Served) -> None:
        self.served = isinstance(proc, forkserver.Served)
        self.since = 0.0

    def timeout(self, sel: selectors.BaseSelector, now: float, remaining: float) -> float:
        if self.served and not self.since and all(isinstance(k.data, TraceChannel) for k in sel.get_map().values()):
            self.since = now
        return 0.0 if self.since and now - self.since < END_POLL_S else min(remaining, 0.5)


def _kill_group(proc: subprocess.Popen[bytes] | forkserver.Served, *, quiet: bool = False) -> None:
    if isinstance(proc, forkserver.Served):  # not this process's child: its cgroup is the handle
        if quiet:
            return  # what is left of the cell goes with its cgroup, next (scope.end)
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    except PermissionError:
        if not quiet:
            proc.kill()
    if not quiet:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
