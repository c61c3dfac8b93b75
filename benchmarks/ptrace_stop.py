"""What one stop of the kernel tracer costs on this machine: a traced process makes a system call
that its seccomp filter hands to the tracer (``SECCOMP_RET_TRACE``, as the spawn helper's filter
does for each ``execve`` and executable mapping), N times; the time a call takes is one stop's
round trip (the process stops, its tracer wakes and continues it).

    python benchmarks/ptrace_stop.py [-N 2000] [--reps 3] [--gap-us 0 200 1000]

Measured twice: tracer and process free to run on any CPU (as cells are), and both pinned to one
CPU (no wake-up of another CPU).  On a virtual machine whose idle CPUs sleep, the first is several
times the second.  ``--gap-us``: the process works (spins) that long between two calls, as a
program does between its stops (a library loaded, then another): the tracer's CPU has gone idle
by then, and each stop wakes it; the figure is the time a call adds beyond the gap.  The probe is
compiled here (gcc).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
#define _GNU_SOURCE
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    double gap = argc > 2 ? atof(argv[2]) * 1e-6 : 0;
    pid_t pid = fork();
    if (pid == 0) {
        raise(SIGSTOP);
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_getppid, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
        struct sock_fprog prog = {4, f};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog)) _exit(2);
        double t0 = now();
        for (int i = 0; i < n; i++) {
            if (gap > 0) for (double until = now() + gap; now() < until;) {}  /* none back to back */
            syscall(SYS_getppid);
        }
        printf("%.2f\n", ((now() - t0) / n - gap) * 1e6);
        fflush(stdout);
        _exit(0);
    }
    int st;
    if (ptrace(PTRACE_SEIZE, pid, 0, PTRACE_O_TRACESECCOMP) != 0) { perror("ptrace"); return 1; }
    waitpid(pid, &st, 0);
    kill(pid, SIGCONT);
    ptrace(PTRACE_CONT, pid, 0, 0);
    while (waitpid(pid, &st, __WALL) > 0 && !WIFEXITED(st) && !WIFSIGNALED(st)) {
        int sig = WIFSTOPPED(st) && (st >> 16) == 0 ? WSTOPSIG(st) : 0;
        if (sig == SIGSTOP || sig == SIGCONT) sig = 0;
        ptrace(PTRACE_CONT, pid, 0, sig);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-N", type=int, default=2000, help="stops per measurement")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gap-us", type=float, nargs="+", default=[0.0],
                    help="the process's own work between two stops, microseconds (one measurement each)")
    a = ap.parse_args()
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        sys.exit("ptrace_stop.py compiles its probe: install gcc")
    cpus = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="cumatrix-stop-") as tmp:
        src, probe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        src.write_text(PROBE)
        subprocess.run([cc, "-O2", "-o", str(probe), str(src)], check=True)
        got: dict[tuple[float, str], list[float]] = {
            (gap, where): [] for gap in a.gap_us for where in ("any CPU", f"one CPU ({cpus[0]})")}
        for _ in range(a.reps):
            for gap, where in got:
                pin = (lambda: os.sched_setaffinity(0, {cpus[0]})) if where != "any CPU" else None
                out = subprocess.run([str(probe), str(a.N), str(gap)], capture_output=True, text=True, check=True,
                                     preexec_fn=pin)  # noqa: PLW1509 - a benchmark's own child
                got[gap, where].append(float(out.stdout))
    print(f"one tracer stop (a seccomp-traced getppid), {a.N} a run, median of {a.reps}, {os.cpu_count()} CPUs:")
    for (gap, where), runs in got.items():
        label = f"{where}, {gap:g} us apart" if gap else where
        print(f"  {label:28} {statistics.median(runs):7.2f} us  (runs: {', '.join(f'{r:.2f}' for r in runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
