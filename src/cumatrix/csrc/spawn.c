/* cumatrix-spawn: the few steps a cell's process takes between fork and exec.
 *
 * Python's subprocess can only run code in the child through ``preexec_fn``, which forces
 * a full fork() with the interpreter running in the child: the spawn then costs time that
 * grows with the harness's memory.  Without ``preexec_fn`` subprocess uses vfork(), and
 * this program does the child's part instead, in C, then runs the cell:
 *
 *   cumatrix-spawn PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM [ARGS...]
 *
 * PARENT_PID    die with this process (PR_SET_PDEATHSIG, SIGKILL); 0: no death signal.
 * CGROUP_PROCS  a cgroup v2 ``cgroup.procs`` file: the program starts in that cgroup; "-": none.
 * LIMITS        "name=soft:hard,..." resource limits (core, cpu, nofile, nproc, fsize), or "-".
 *
 * Joining a cgroup by writing to ``cgroup.procs`` takes the kernel's cgroup threadgroup
 * lock for writing, which waits for an RCU grace period: 10 to 20 ms a cell on a quiet
 * machine, as long as a trivial program's whole run.  So where the kernel has clone3's
 * CLONE_INTO_CGROUP (Linux 5.7), the program is started in its cgroup directly and this
 * process stays as its parent: it waits for it and ends the same way (its exit status, or
 * the signal that killed it, raised again here with core dumps off), ignoring the signals
 * a terminal or a ``kill 0`` sends its process group so that only the program decides.
 * Elsewhere it joins the cgroup by the write and execs the program in place.
 *
 * A PROGRAM that cannot be executed exits 127 (not found) or 126, as a shell does.
 *
 *   cumatrix-spawn --no-keys ...
 *
 * Before either form (this one or --trace's): the program's process puts in place the filter
 * that refuses the kernel's keyrings just before its exec (spawn_seccomp.h), inherited by all
 * it starts: a cell bubblewrap holds, as the fork server's cells are.
 *
 *   cumatrix-spawn --trace FD PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM [ARGS...]
 *
 * The same, and this process traces the program's whole tree (ptrace, PTRACE_SEIZE with
 * fork, vfork, clone and exit events): at each process's exit (a signal's included),
 * before each execve (a seccomp filter that asks the tracer, inherited by every process and
 * impossible to remove) and, for those still running, when the first process ends, it reads
 * /proc/PID/maps and writes every file mapped executable (device, inode, path) to FD, which no process
 * of the tree inherits.  The same filter refuses clone(CLONE_UNTRACED) (EPERM: a process no
 * tracer hears of) and clone3 (ENOSYS: its flags are out of a filter's reach; the C library
 * falls back to clone), and stops each mmap of a file with PROT_EXEC, and each mprotect or
 * pkey_mprotect that adds PROT_EXEC, whose file is written then (a library unloaded before exit,
 * or mapped as data and made executable later, is on the record).  Processes that outlive the first are followed: they run on, traced,
 * for LEFT_GRACE_MS, then are killed, and the record ends only when no traced process is
 * left.  What a cell's
 * processes mapped then comes from the kernel, read by a process the cell cannot write to:
 * this one is not dumpable (its /proc files are root's), a traced process cannot be traced
 * again, and the dynamic loader's environment (LD_AUDIT, LD_PRELOAD) plays no part.  Lines:
 *
 *   t <tracer pid>                     tracing started
 *   n <reason>                         not traced (ptrace refused): the program runs untraced
 *   e <pid> <exe>                      the process's image after an execve (written at its next
 *                                      execve or its exit: no stop is spent on the exec itself)
 *   m <pid> <dev> <inode> <path>       a file the process mapped (each (pid, dev, inode) once)
 *   M <pid> <dev> <inode> <path>       a file the process is mapping executable, at its mmap
 *                                      (or at the mprotect that makes a mapping of it executable)
 *   s <dev> <inode> <soname>           the DT_SONAME of a file mapped executable that had no
 *                                      name on disk (a memfd, a removed file), read from its bytes
 *   h <dev> <inode> <sha256> <bytes>   the SHA-256 of such a file's first <bytes> bytes (all of
 *                                      it up to DIGEST_LIMIT), read at the same moment
 *   x <pid> <wait status> <exe>        the process ended (its status as waitpid reports it)
 *   u <pid> <what>                     an attempt to make an untraced process (another ABI's
 *                                      clone): the process was killed before the call ran
 *   l <leader's wait status> <n>       the first process ended, leaving n processes (followed on)
 *   z <leader's wait status>           the end: every process of the tree has ended, and
 *                                      every line before it is complete
 *
 * Fields are separated by tabs; paths end at the newline (a path holding one is escaped
 * by the kernel as \012).
 *
 *   cumatrix-spawn --trace-record NONCE_FILE PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM [ARGS...]
 *
 * The same tracing where no descriptor can come from the harness (a container's entry).  The
 * record is kept in memory; NONCE_FILE (a secret of the harness's) is read and removed before
 * the program starts.  When the program ends, what it left is read and killed, and only once
 * no process of the tree is left (waitpid reports none) is the record written to stderr
 * between two lines holding the secret:
 *
 *   \036cumatrix-trace <secret> begin ... \036cumatrix-trace <secret> end
 *
 * No traced process knows the secret (the file was gone before the first one ran, and this
 * process is not dumpable) and none is alive when the record is written, so nothing of the
 * cell can write a record the harness would take, before or after this one.
 *
 * The harness cannot resolve a path inside the container (/lib is a link to usr/lib in most
 * images), so where $CUMATRIX_AUDIT_LOG names the cell's rtld-audit log, each path it says
 * was opened is resolved here, once the tree is gone, in the container's own file system:
 *
 *   r <path as the log spells it> <the path it resolves to>   (only where they differ)
 *   c <how many paths were resolved>                            the log's paths were resolved here
 *
 * The log is the cell's: it is read as a regular file only (no link followed, no FIFO waited
 * on), at most LOG_MAX bytes; a resolved path names a file only, never reads it.
 *
 *   cumatrix-spawn --watch PROGRAM [ARGS...]
 *
 * The harness's watcher, as it waits: what it is told on stdin is kept in memory (a memfd)
 * until EOF (the harness has died), then PROGRAM runs with all of it as its stdin to clean up.
 * A Python interpreter would hold 10 MB for the whole run only to wait.
 */
#include "spawn_common.h"
#include "spawn.h"
#include "spawn_run.h"
#include "spawn_server.h"
#include "spawn_record.h"
#include "spawn_trace.h"
#include "spawn_util.h"

/* --trace-record: read the secret and remove its file, before any process of the cell exists. */
static int record_main(char **argv, int argc) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);  /* first: the secret is about to be in this memory */
    int fd = open(argv[0], O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return fail("open", argv[0]);
    ssize_t n = read(fd, secret, sizeof secret - 1);
    close(fd);
    if (unlink(argv[0]) != 0) return fail("unlink", argv[0]);
    while (n > 0 && (secret[n - 1] == '\n' || secret[n - 1] == ' ')) n--;
    if (n < 16) { errno = EINVAL; return fail("secret too short in", argv[0]); }
    secret[n] = 0;
    for (ssize_t i = 0; i < n; i++)
        if (secret[i] < '0' || secret[i] > 'z') { errno = EINVAL; return fail("bad secret in", argv[0]); }
    record_mode = 1;
    const char *log = getenv("CUMATRIX_AUDIT_LOG");  /* this process's own environment: the cell's cannot change it */
    if (log && log[0] == '/') audit_log = strdup(log);
    return traced_main(-1, argc - 1, &argv[1]);
}

static int watch(char **argv) {
    signal(SIGINT, SIG_IGN);  /* only the harness's death (EOF) ends the watch */
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    int mem = memfd_create("cumatrix-watch", MFD_CLOEXEC);
    if (mem >= 0) {
        char buf[65536];
        for (;;) {
            ssize_t n = read(0, buf, sizeof buf);
            if (n == 0) break;
            if (n < 0) {
                if (errno == EINTR) continue;
                break;
            }
            for (ssize_t off = 0; off < n;) {
                ssize_t w = write(mem, buf + off, (size_t)(n - off));
                if (w < 0) {
                    if (errno == EINTR) continue;
                    break;
                }
                off += w;
            }
        }
        if (lseek(mem, 0, SEEK_SET) == 0) dup2(mem, 0);  /* dup2 clears close-on-exec */
    }  /* no memfd: PROGRAM reads the pipe itself */
    execvp(argv[0], argv);
    return 127;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--no-keys") == 0) {  /* the program makes no keyring call */
        no_keyrings = 1;
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "--serve") == 0)
        return serve(atoi(argv[2]), (pid_t)atol(argv[3]), argc == 5 ? argv[4] : NULL);
    if (argc >= 3 && strcmp(argv[1], "--watch") == 0) return watch(&argv[2]);
    if (argc >= 8 && strcmp(argv[1], "--trace") == 0 && strcmp(argv[6], "--") == 0)
        return traced_main(atoi(argv[2]), argc - 3, &argv[3]);
    if (argc >= 8 && strcmp(argv[1], "--trace-record") == 0 && strcmp(argv[6], "--") == 0)
        return record_main(&argv[2], argc - 2);
    if (argc < 6 || strcmp(argv[4], "--") != 0) {
        fprintf(stderr, "usage: cumatrix-spawn PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM [ARGS...]\n");
        return 126;
    }
    /* Not dumpable, first: a harness child's verdict pipe passes through this process, whose
     * /proc/PID/fd other processes of the same user could otherwise open. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    pid_t parent = (pid_t)atol(argv[1]);
    if (parent > 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) return fail("prctl", "PR_SET_PDEATHSIG");
        if (getppid() != parent) return 128 + SIGKILL; /* the harness died before prctl took effect */
    }
    if (strcmp(argv[2], "-") != 0) {
        pid_t pid = start_in_cgroup(argv[2], getpid());
        if (pid == 0) return run_program(argv[3], &argv[5]);
        if (pid > 0) return mirror(pid);
        int fd = open(argv[2], O_WRONLY | O_CLOEXEC);
        if (fd < 0) return fail("open", argv[2]);
        if (write(fd, "0\n", 2) != 2) return fail("join cgroup", argv[2]);
        close(fd);
    }
    return run_program(argv[3], &argv[5]);
}
