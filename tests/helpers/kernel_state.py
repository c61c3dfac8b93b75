"""Two sandboxed cells, one after the other or side by side, and what the second finds of the
first in the kernel's state: a port left in ``TIME_WAIT``, keys, message queues, System V
IPC, inotify instances, processes counted against ``RLIMIT_NPROC``.

Run as ``python -m helpers.kernel_state SCENARIO`` (``tests`` on ``PYTHONPATH``), by the harness's
own user, root or not: it prints one JSON object, what each cell saw and how it was held.
The tests (``tests/integration/test_cell_kernel_state.py``) run it as root and as a second
local user, so that both kinds of harness are attacked the same way.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cumatrix.core.jobs import Job
from cumatrix.execute.local import run_local, start_local
from cumatrix.execute.sandbox import Policy

#: The cells' interpreter: the system's where there is one (the harness's may live where its
#: second user may not look, e.g. under /root), the harness's otherwise.
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
ON = Policy(sandbox="on")

#: What each cell's program starts with: the key calls (the standard library has none), and
#: the wait of a cell that holds something while a second cell looks for it.
PRELUDE = r"""
import ctypes, errno, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_add_key, SYS_keyctl = 248, 250
KEYCTL_SEARCH = 10
USER, SESSION = -4, -3
def add_key(ring, desc):
    r = libc.syscall(SYS_add_key, b"user", desc.encode(), b"secret", 6, ring)
    return r if r >= 0 else -ctypes.get_errno()
def search(ring, desc):
    r = libc.syscall(SYS_keyctl, KEYCTL_SEARCH, ring, b"user", desc.encode(), 0)
    return r if r >= 0 else -ctypes.get_errno()
def hold(flag):
    open(flag, "w").write("up")
    deadline = time.monotonic() + 30
    while open(flag).read() != "go" and time.monotonic() < deadline:
        time.sleep(0.02)
"""

TIME_WAIT = PRELUDE + r"""
import socket
port = int(sys.argv[1])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port)); srv.listen()
cli = socket.create_connection(("127.0.0.1", port))
conn, _ = srv.accept()
conn.close()  # the accepting side closes first: its end of the connection waits in TIME_WAIT
time.sleep(0.2)
cli.close(); srv.close()
tw = [l for l in open("/proc/net/tcp").read().splitlines()[1:] if l.split()[3] == "06"]
print("time-wait", len(tw))
"""

BIND = PRELUDE + r"""
import socket
s = socket.socket()  # no SO_REUSEADDR: a plain bind, as most servers' first one
try:
    s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); print("bound")
except OSError as e:
    print("bind failed", e.errno)
print("sockets", sum(len(open(f"/proc/net/{t}").read().splitlines()) - 1 for t in ("tcp", "tcp6", "udp", "udp6")))
"""

ADD_KEYS = PRELUDE + r"""
desc = sys.argv[1]
print("user", add_key(USER, desc + "-u"), "session", add_key(SESSION, desc + "-s"))
if len(sys.argv) > 2:
    hold(sys.argv[2])
"""

FIND_KEYS = PRELUDE + r"""
desc = sys.argv[1]
print("user", search(USER, desc + "-u"), "session", search(SESSION, desc + "-s"))
print("listed", desc in open("/proc/keys").read())
"""

MQUEUE = PRELUDE + r"""
libc.mq_open.restype = ctypes.c_int
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
name = ("/" + sys.argv[1]).encode()
if sys.argv[2] == "make":
    q = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o666, None)
    print("made", q >= 0, ctypes.get_errno())
    hold(sys.argv[3])
else:
    q = libc.mq_open(name, os.O_RDWR, 0, None)
    print("opened" if q >= 0 else f"not found {ctypes.get_errno()}")
"""

SYSV = PRELUDE + r"""
key = int(sys.argv[1])
libc.shmget.restype = ctypes.c_int
libc.semget.restype = ctypes.c_int
libc.msgget.restype = ctypes.c_int
IPC_CREAT = 0o1000
if sys.argv[2] == "make":
    print("made", libc.shmget(key, 4096, IPC_CREAT | 0o666) >= 0, libc.semget(key, 1, IPC_CREAT | 0o666) >= 0,
          libc.msgget(key, IPC_CREAT | 0o666) >= 0)
    hold(sys.argv[3])
else:
    print("found", libc.shmget(key, 0, 0o666) >= 0, libc.semget(key, 0, 0o666) >= 0, libc.msgget(key, 0o666) >= 0)
"""

#: keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING) by each ABI's road into the kernel: the
#: native number, x32's (bit 30 set) and i386's (int 0x80 from this 64-bit process, in a child:
#: a kernel without ia32 emulation ends it with a signal).  Each prints its result or -errno.
KEY_ROADS = PRELUDE + r"""
import mmap
def native():
    return search_id(SYS_keyctl)
def x32():
    return search_id(0x40000000 | SYS_keyctl)
def search_id(nr):
    r = libc.syscall(nr, 0, USER, 0)
    return r if r >= 0 else -ctypes.get_errno()
def i386():
    # push rbx; mov eax, 288 (i386 keyctl); xor ebx, ebx; mov ecx, -4; xor edx, edx; int 0x80; pop rbx; ret
    code = bytes.fromhex("53b82001000031dbb9fcffffff31d2cd805bc3")
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(code)
    fn = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, str(fn()).encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 64).decode()
    _, st = os.waitpid(pid, 0)
    return int(got) if got else f"signal{os.WTERMSIG(st)}"
print("native", native(), "x32", x32(), "i386", i386())
"""

INOTIFY = PRELUDE + r"""
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
print("instances", len(fds))
if sys.argv[1] == "hold":
    hold(sys.argv[2])
"""

NPROC = PRELUDE + r"""
import resource, signal
soft = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NPROC, (soft, resource.getrlimit(resource.RLIMIT_NPROC)[1]))
kids, err = [], 0
for _ in range(int(sys.argv[2])):
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
print("forked", len(kids), "error", err)
if len(sys.argv) > 3:
    hold(sys.argv[3])
for k in kids:
    os.kill(k, signal.SIGKILL)
"""


def fields(out: str) -> dict[str, str]:
    """``"native -38 x32 -38"`` -> ``{"native": "-38", "x32": "-38"}`` (what :data:`KEY_ROADS` prints)."""
    words = out.split()
    return dict(zip(words[::2], words[1::2], strict=True))


def cell(code: str, *args: str, flag: Path | None = None) -> Job:
    return Job(cell_id="k", kind="command", timeout=60, argv=(PY, "-c", code, *args),
               writable=(str(flag),) if flag else ())


def run(code: str, *args: str, policy: Policy = ON) -> dict[str, object]:
    res = run_local(cell(code, *args), policy=policy, cwd="/")
    return {"rc": res.returncode, "out": res.stdout_tail.strip(), "err": res.stderr_tail.strip()[-400:],
            "sandbox": res.extra.get("sandbox"), "traced": bool(res.trace and res.trace.complete),
            "exe": res.trace.processes[0].exe if res.trace and res.trace.processes else None}


def side_by_side(holder_code: str, holder_args: tuple[str, ...], probe: Callable[[], dict[str, object]]
                 ) -> dict[str, object]:
    """The first cell holds what it made while the second (``probe``) runs, then ends."""
    with tempfile.TemporaryDirectory() as tmp:
        flag = Path(tmp) / "flag"
        flag.touch()
        flag.chmod(0o666)
        Path(tmp).chmod(0o755)
        first = start_local(cell(holder_code, *holder_args, str(flag), flag=flag), policy=ON, cwd="/")
        deadline = time.monotonic() + 30
        while flag.read_text() != "up" and time.monotonic() < deadline:
            time.sleep(0.02)
        second = probe()
        flag.write_text("go")
        res = first.wait()
    return {"first": {"rc": res.returncode, "out": res.stdout_tail.strip(), "err": res.stderr_tail.strip()[-400:],
                      "sandbox": res.extra.get("sandbox")}, "second": second}


def scenario(name: str) -> dict[str, object]:
    tag = f"cmx{os.getpid()}"
    port = str(20000 + os.getpid() % 20000)
    if name == "time-wait":
        first = run(TIME_WAIT, port)
        time.sleep(1)  # a later cell: the first one's processes, and its tracer, long gone
        return {"first": first, "second": run(BIND, port)}
    if name == "keys":
        # A cell looks for the keys of a cell alive beside it, then a later cell for them.
        got = side_by_side(ADD_KEYS, (tag,), lambda: run(FIND_KEYS, tag))
        got["later"] = run(FIND_KEYS, tag)
        got["harness"] = _harness_session_has(tag + "-s")
        return got
    if name == "key-roads":
        return {"first": run(KEY_ROADS), "second": run(KEY_ROADS),
                "unsandboxed": run(KEY_ROADS, policy=Policy(sandbox="off"))}
    if name == "mqueue":
        return side_by_side(MQUEUE, (tag, "make"), lambda: run(MQUEUE, tag, "open"))
    if name == "sysv":
        key = str(0x434D0000 + os.getpid() % 0xFFFF)
        return side_by_side(SYSV, (key, "make"), lambda: run(SYSV, key, "find"))
    if name == "inotify":
        return side_by_side(INOTIFY, ("hold",), lambda: run(INOTIFY, "once"))
    if name == "nproc":
        return side_by_side(NPROC, ("40", "30"), lambda: run(NPROC, "15", "10"))
    raise SystemExit(f"no scenario {name}")


def _harness_session_has(desc: str) -> bool:
    """Whether a key a cell added to its session keyring is in this process's own."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(250, 10, -3, b"user", desc.encode(), 0) >= 0


if __name__ == "__main__":
    print(json.dumps(scenario(sys.argv[1])))
