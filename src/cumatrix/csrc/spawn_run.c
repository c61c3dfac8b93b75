#include "spawn_common.h"
#include "spawn_cell.h"
#include "spawn_record.h"
#include "spawn_run.h"
#include "spawn_sandbox.h"
#include "spawn_seccomp.h"
#include "spawn_trace.h"
#include "spawn_util.h"

/* ------------------------------------------------------------------ one program's run
 *
 * The program's process started (in its cgroup, in a served cell's namespaces), traced or not,
 * and this process ending as it ended. */

/* Signals this process ignores while it waits; the program gets them at their defaults. */
static const int passed_on[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM,
                                SIGTSTP, SIGTTIN, SIGTTOU};
#define N_PASSED (sizeof passed_on / sizeof passed_on[0])
static struct sigaction inherited[N_PASSED];

/* Start the program in the cgroup whose cgroup.procs is PROCS; -1 (errno set) where the
 * kernel or a seccomp filter refuses clone3 or CLONE_INTO_CGROUP. */
pid_t start_in_cgroup(const char *procs, pid_t parent_death) {
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

int mirror(pid_t pid) {
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
    if (serve_hold_fd >= 0) close(serve_hold_fd);  /* the cell's program alone waits on it */
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
