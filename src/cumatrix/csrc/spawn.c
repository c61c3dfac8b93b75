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
 *   cumatrix-spawn --watch PROGRAM [ARGS...]
 *
 * The harness's watcher, as it waits: what it is told on stdin is kept in memory (a memfd)
 * until EOF (the harness has died), then PROGRAM runs with all of it as its stdin to clean up.
 * A Python interpreter would hold 10 MB for the whole run only to wait.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

/* Signals this process ignores while it waits; the program gets them at their defaults. */
static const int passed_on[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM,
                                SIGTSTP, SIGTTIN, SIGTTOU};
#define N_PASSED (sizeof passed_on / sizeof passed_on[0])
static struct sigaction inherited[N_PASSED];

static int fail(const char *what, const char *arg) {
    fprintf(stderr, "cumatrix-spawn: %s %s: %s\n", what, arg, strerror(errno));
    return 126;
}

static int limit_resource(const char *name) {
    if (!strcmp(name, "core")) return RLIMIT_CORE;
    if (!strcmp(name, "cpu")) return RLIMIT_CPU;
    if (!strcmp(name, "nofile")) return RLIMIT_NOFILE;
    if (!strcmp(name, "nproc")) return RLIMIT_NPROC;
    if (!strcmp(name, "fsize")) return RLIMIT_FSIZE;
    return -1;
}

static int set_limits(char *spec) {
    char *save = NULL;
    for (char *item = strtok_r(spec, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '='), *colon = eq ? strchr(eq, ':') : NULL;
        if (!eq || !colon) { errno = EINVAL; return fail("bad limit", item); }
        *eq = 0;
        int res = limit_resource(item);
        if (res < 0) { errno = EINVAL; return fail("unknown limit", item); }
        struct rlimit rl;
        rl.rlim_cur = strtoull(eq + 1, NULL, 10);
        rl.rlim_max = strtoull(colon + 1, NULL, 10);
        if (setrlimit(res, &rl) != 0) return fail("setrlimit", item);
    }
    return 0;
}

/* The program's side: limits, then exec; returns only on failure (the exit code to use). */
static int run_program(char *limits, char **argv) {
    if (strcmp(limits, "-") != 0 && set_limits(limits) != 0) return 126;
    execvp(argv[0], argv);
    int err = errno;
    fprintf(stderr, "cannot start '%s': %s\n", argv[0], strerror(err));
    return err == ENOENT ? 127 : 126;
}

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
    args.flags = CLONE_INTO_CGROUP;
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
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 || getppid() != parent_death) _exit(128 + SIGKILL);
        return 0;
    }
    close(cfd);
    if (pid < 0)
        for (size_t i = 0; i < N_PASSED; i++) sigaction(passed_on[i], &inherited[i], NULL);
    errno = err;
    return (pid_t)pid;
}

/* Wait for the program and end as it ended. */
static int mirror(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) return fail("waitpid", "program");
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
    if (argc >= 3 && strcmp(argv[1], "--watch") == 0) return watch(&argv[2]);
    if (argc < 6 || strcmp(argv[4], "--") != 0) {
        fprintf(stderr, "usage: cumatrix-spawn PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM [ARGS...]\n");
        return 126;
    }
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
