"""The tracer reads what a process mapped executable from the kernel's PROCMAP_QUERY (Linux
6.11), one code mapping at a time, and from the text of ``/proc/PID/maps`` where the kernel has
no such query: both readings write the same record, line for line, for what real programs map
(a Python interpreter's extension modules, a library whose file was removed, one loaded from a
memfd, a path with a newline and a tab in it).  The older kernel is a real seccomp filter that
answers the query as such a kernel does (ENOTTY), under the real helper; gcc builds the rest."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from cumatrix.execute.spawn import SPAWN_CFLAGS, spawn_sources
from helpers.build import run_gcc, shared_library

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"),
                                reason="the older kernel's filter names x86-64's and AArch64's ioctl number")

#: A program run as a kernel without PROCMAP_QUERY answers it: ioctl(fd, PROCMAP_QUERY, ...)
#: fails with ENOTTY, every other call is let through; then it execs its arguments.
OLDER_KERNEL = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#define PROCMAP_QUERY 0xc0686611u /* _IOWR('f', 17, struct procmap_query), 104 bytes */
int main(int argc, char **argv) {
    (void)argc;
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PROCMAP_QUERY, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOTTY),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog fprog = {sizeof prog / sizeof prog[0], prog};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog)) {
        perror("seccomp");
        return 125;
    }
    execv(argv[1], argv + 1);
    perror("execv");
    return 126;
}
"""

#: A program that loads its library from LIB, from a memfd, and from a file it then removes.
LOADER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
static int copy(const char *from, int to) {
    char buf[65536];
    int in = open(from, O_RDONLY);
    ssize_t n;
    if (in < 0) return -1;
    while ((n = read(in, buf, sizeof buf)) > 0) if (write(to, buf, (size_t)n) != n) return -1;
    close(in);
    return 0;
}
int main(int argc, char **argv) {
    if (argc < 3 || !dlopen(argv[1], RTLD_NOW)) return 2;
    int m = memfd_create("runtime", 0);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", m);
    if (m < 0 || copy(argv[1], m) != 0 || !dlopen(path, RTLD_NOW)) return 3;
    int g = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0755);
    if (g < 0 || copy(argv[1], g) != 0 || close(g) != 0 || !dlopen(argv[2], RTLD_NOW)) return 4;
    return unlink(argv[2]) == 0 ? 0 : 5;
}
"""


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("maps") / "we ird\ndir"  # the record shows this newline as \012
    d.mkdir()
    (d / "older.c").write_text(OLDER_KERNEL)
    run_gcc("-O1", "-o", d / "older", d / "older.c")
    (d / "loader.c").write_text(LOADER)
    run_gcc("-O1", "-o", d / "pr\tog", d / "loader.c", "-ldl")
    shared_library(d / "libpart.so", "int part(void) { return 7; }\n")
    run_gcc(*SPAWN_CFLAGS, "-o", d / "spawn", *spawn_sources())
    return {"dir": d, "older": d / "older", "loader": d / "pr\tog", "lib": d / "libpart.so", "spawn": d / "spawn"}


def _record(tools: dict[str, Path], argv: list[str], *, older: bool) -> list[str]:
    """The tracer's lines for ``argv``: each line's pid left out (two runs, two pids), and the
    inode of a file each run makes anew (a memfd, a removed file) shown as ``*``."""
    r, w = os.pipe()
    front = [str(tools["older"])] if older else []
    proc = subprocess.run([*front, str(tools["spawn"]), "--trace", str(w), "0", "-", "-", "--", *argv],
                          capture_output=True, timeout=60, pass_fds=(w,), check=False)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        raw = f.read().decode()
    assert proc.returncode == 0, proc.stderr.decode()
    lines = raw.splitlines()
    assert lines[0].startswith("t\t"), raw[:300]  # traced: ptrace is allowed here
    return sorted({_canonical(line) for line in lines if line[:2] in ("m\t", "M\t", "e\t", "s\t")})


def _canonical(line: str) -> str:
    fields = line.split("\t")
    if fields[0] == "s":  # s DEV INODE SONAME: a file with no name on disk, made by this run
        return "\t".join([*fields[:2], "*", *fields[3:]])
    fields = [fields[0], *fields[2:]]  # the pid left out
    # A file each run makes (the memfd; removed.so, named at its mmap before it is removed):
    # its inode is a new one each time.
    if fields[0] in ("m", "M") and (fields[-1].endswith(" (deleted)") or fields[-1].endswith("/removed.so")):
        fields[2] = "*"
    return "\t".join(fields)


def _mapped(record: list[str]) -> list[str]:
    return [line for line in record if line.startswith("m\t")]


def test_a_python_interpreter_s_record_is_the_same_read_either_way(tools: dict[str, Path]) -> None:
    argv = [sys.executable, "-c", "import ctypes, ssl, json"]
    by_query, by_text = _record(tools, argv, older=False), _record(tools, argv, older=True)
    assert by_query == by_text
    # The interpreter's extension modules, each from the maps it left: on the record either way.
    assert any("_ctypes" in line for line in _mapped(by_query)), by_query
    assert any("_ssl" in line for line in _mapped(by_query)), by_query


def test_removed_memfd_and_oddly_named_files_are_written_alike(tools: dict[str, Path]) -> None:
    gone = tools["dir"] / "removed.so"
    argv = [str(tools["loader"]), str(tools["lib"]), str(gone)]
    by_query = _record(tools, argv, older=False)
    (tools["dir"] / "spacer").write_text("")  # takes the inode the removed file freed, as a busy disk would
    by_text = _record(tools, argv, older=True)
    assert by_query == by_text
    mapped = _mapped(by_query)
    shown = str(tools["dir"]).replace("\n", "\\012")
    assert any(line.endswith(f"{shown}/pr\tog") for line in mapped), mapped  # the program, \012 and tab
    assert any(line.endswith(f"{shown}/libpart.so") for line in mapped), mapped
    assert any(line.endswith(f"{shown}/removed.so (deleted)") for line in mapped), mapped
    assert any("/memfd:runtime (deleted)" in line for line in mapped), mapped


def test_the_older_kernel_answers_the_query_as_one_without_it(tools: dict[str, Path]) -> None:
    """The stand-in for the older kernel refuses the query itself (not something else): a
    process under it that asks gets ENOTTY, a kernel with the query answers."""
    probe = tools["dir"] / "probe.c"
    probe.write_text(r"""
        #include <errno.h>
        #include <fcntl.h>
        #include <stdio.h>
        #include <string.h>
        #include <sys/ioctl.h>
        int main(void) {
            unsigned long long q[13];
            memset(q, 0, sizeof q);
            q[0] = sizeof q; q[1] = 0x10; /* the first area at or past address 0 */
            int fd = open("/proc/self/maps", O_RDONLY);
            int rc = ioctl(fd, 0xc0686611u, q);
            printf("%s\n", rc == 0 ? "answered" : errno == ENOTTY ? "ENOTTY" : strerror(errno));
            return 0;
        }
    """)
    run_gcc("-O1", "-o", tools["dir"] / "probe", probe)
    under = subprocess.run([str(tools["older"]), str(tools["dir"] / "probe")], capture_output=True, text=True,
                           timeout=30, check=True).stdout.strip()
    assert under == "ENOTTY"
    here = subprocess.run([str(tools["dir"] / "probe")], capture_output=True, text=True, timeout=30,
                          check=True).stdout.strip()
    if here != "answered":
        pytest.skip(f"this kernel ({platform.release()}) has no PROCMAP_QUERY ({here}): both records read the text")
