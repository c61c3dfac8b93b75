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
#include "spawn_sandbox.h"
#include "spawn_seccomp.h"
#include "spawn_server.h"
#include "spawn_trace.h"
#include "spawn_util.h"

/* Signals this process ignores while it waits; the program gets them at their defaults. */
static const int passed_on[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM,
                                SIGTSTP, SIGTTIN, SIGTTOU};
#define N_PASSED (sizeof passed_on / sizeof passed_on[0])
static struct sigaction inherited[N_PASSED];

/* Start the program in the cgroup whose cgroup.procs is PROCS; -1 (errno set) where the
 * kernel or a seccomp filter refuses clone3 or CLONE_INTO_CGROUP. */
static pid_t start_in_cgroup(const char *procs, pid_t parent_death) {
    char dir[4096];
    size_t n = strlen(procs);
    const char *suffix = "/cgroup.procs";
    size_t k = strlen(suffix);
    if (n <= k || n - k >= sizeof dir || strcmp(procs + n - k, suffix) != 0) { errno = EINVAL; return -1; }
    memcpy(dir, procs, n - k);
    dir[n - k] = 0;
    int cfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cfd < 0) return -1;
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_INTO_CGROUP | clone_ns_flags;
    args.exit_signal = SIGCHLD;
    args.cgroup = (unsigned long long)cfd;
    /* Ignored from before the clone, so no signal to the group can end this process first;
     * the program gets back what this process inherited. */
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    for (size_t i = 0; i < N_PASSED; i++) sigaction(passed_on[i], &ign, &inherited[i]);
    long pid = syscall(SYS_clone3, &args, sizeof args);
    int err = errno;
    if (pid == 0) {
        for (size_t i = 0; i < N_PASSED; i++) sigaction(passed_on[i], &inherited[i], NULL);
        /* In a new pid namespace the parent is outside it: getppid() says 0. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 ||
            (!(clone_ns_flags & CLONE_NEWPID) && getppid() != parent_death)) _exit(128 + SIGKILL);
        return 0;
    }
    close(cfd);
    if (pid < 0)
        for (size_t i = 0; i < N_PASSED; i++) sigaction(passed_on[i], &inherited[i], NULL);
    errno = err;
    return (pid_t)pid;
}

/* Wait for the program and end as it ended. */
static int end_as(int status) {
    if (serve_status_fd >= 0) {  /* a served cell: the harness is not this process's parent */
        char line[32];
        int n = snprintf(line, sizeof line, "z\t%d\n", status);
        while (write(serve_status_fd, line, (size_t)n) < 0 && errno == EINTR) {}
        serve_status_sent = 1;
        if (serve_mnt_ns >= 0) {
            /* Every pipe the harness reads (status, trace, output, verdict) ends here; the
             * namespace goes with this process's exit, after them. */
            int ns = serve_mnt_ns;
            if (syscall(SYS_close_range, 0U, (unsigned)ns - 1, 0U) != 0 ||
                syscall(SYS_close_range, (unsigned)ns + 1, ~0U, 0U) != 0)
                for (int fd = 0; fd < 1024; fd++)  /* no close_range (Linux < 5.9) */
                    if (fd != ns) close(fd);
            serve_status_fd = -1;
        }
        return 0;
    }
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    int sig = WTERMSIG(status);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    return 128 + sig;  /* a signal whose default is not to terminate */
}

static int mirror(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return fail("waitpid", "program");
    }
    return end_as(status);
}


/* The program's wait status (untraced: ptrace was refused); -1 on failure. */
static int mirror_status(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return status;
}

int traced_main(int fd, int argc, char **argv) {
    (void)argc;
    trace_fd = fd;
    /* Not dumpable: processes of the same user (the cell's) cannot open /proc/PID/fd of this
     * one, read its memory or attach to it. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (!record_mode && fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return fail("trace fd", argv[0]);
    pid_t parent = (pid_t)atol(argv[0]);
    if (parent > 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) return fail("prctl", "PR_SET_PDEATHSIG");
        if (getppid() != parent) return 128 + SIGKILL;
    }
    int go[2];
    if (pipe2(go, O_CLOEXEC) != 0) return fail("pipe", "");
    int ready[2] = {-1, -1};
    /* The program's process makes itself traceable first where this one may not seize a
     * process that is not (record_mode, serve_userns: below). */
    int says_ready = record_mode || serve_userns;
    if (says_ready && pipe2(ready, O_CLOEXEC) != 0) return fail("pipe", "");
    pid_t pid = -1;
    if (strcmp(argv[1], "-") != 0) pid = start_in_cgroup(argv[1], getpid());
    if (pid < 0) {
        int joined = 1;
        if (strcmp(argv[1], "-") != 0) {  /* no clone3: this process joins the cgroup, its child with it */
            int cfd = open(argv[1], O_WRONLY | O_CLOEXEC);
            joined = cfd >= 0 && write(cfd, "0\n", 2) == 2;
            if (cfd >= 0) close(cfd);
            if (!joined) return fail("join cgroup", argv[1]);
        }
        struct sigaction ign;
        memset(&ign, 0, sizeof ign);
        ign.sa_handler = SIG_IGN;
        for (size_t i = 0; i < N_PASSED; i++) sigaction(passed_on[i], &ign, &inherited[i]);
        /* The program's process alone in the new namespaces (a clone, not an unshare here): this
         * process reads /proc as the host sees it, and a root the cell's process pivots to in
         * a mount namespace this one shared would be its root too. */
        pid = clone_ns_flags ? (pid_t)syscall(SYS_clone, (unsigned long)clone_ns_flags | SIGCHLD, NULL, NULL, NULL, NULL)
                             : fork();
        if (pid == 0) {
            for (size_t i = 0; i < N_PASSED; i++) sigaction(passed_on[i], &inherited[i], NULL);
            if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) _exit(128 + SIGKILL);
        } else if (pid < 0) {
            return fail("fork", "program");
        }
    }
    if (pid == 0) {
        close(go[1]);
        if (says_ready) {
            /* A process of this non-dumpable one is not dumpable either, and a tracer without
             * CAP_SYS_PTRACE where the process's memory was made (a container's user; a
             * non-root server, whose memory is of the host's user namespace) may not seize it:
             * the program's process says it may be traced (it forgets the secret first; nothing
             * of the cell runs yet).  A served cell's program still cannot reach it: it is in a
             * user namespace below, with no capability (and Yama's ptrace_scope, where set). */
            memset(secret, 0, sizeof secret);
            prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
            close(ready[0]);
            while (write(ready[1], "r", 1) < 0 && errno == EINTR) {}
            close(ready[1]);
        }
        traced_child_setup(go[0]);
        if (serve_ops) _exit(cell_init(argv[2], &argv[4]));  /* never back into the server's code */
        return run_program(argv[2], &argv[4]);
    }
    close(go[0]);
    if (serve_status_fd >= 0) {
        /* The cell's first process (its namespace's init): the harness ends the cell by it where
         * the cell has no cgroup (a non-root harness). */
        char line[32];
        int n = snprintf(line, sizeof line, "p\t%d\n", (int)pid);
        while (write(serve_status_fd, line, (size_t)n) < 0 && errno == EINTR) {}
    }
    if (serve_hold_fd >= 0) close(serve_hold_fd);  /* the cell's init alone waits on it */
    if (serve_ops) {
        char ns[64];
        snprintf(ns, sizeof ns, "/proc/%d/ns/mnt", (int)pid);
        serve_mnt_ns = open(ns, O_RDONLY | O_CLOEXEC);  /* -1: the namespace goes with its init */
    }
    if (says_ready) {
        char r;
        close(ready[1]);
        while (read(ready[0], &r, 1) < 0 && errno == EINTR) {}
        close(ready[0]);
    }
    char word = 'T';
    if (ptrace(PTRACE_SEIZE, pid, 0, (void *)(long)trace_options) != 0) {
        out_line("n\tptrace refused (%s): the program runs untraced\n", strerror(errno));
        word = 'U';
    } else {
        out_line("t\t%d\n", (int)getpid());
    }
    out_flush();
    while (write(go[1], &word, 1) < 0 && errno == EINTR) {}
    close(go[1]);
    if (word == 'U') {
        int rc = mirror_status(pid);
        if (rc < 0) return fail("waitpid", "program");
        out_line("z\t%d\n", rc);
        emit_record();
        return end_as(rc);
    }
    int st = trace_tree(pid);
    if (st < 0) return fail("waitpid", "program");
    emit_record();
    return end_as(st);
}

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
