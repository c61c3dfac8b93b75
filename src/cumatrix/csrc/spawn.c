/* cumatrix-spawn: the few steps a cell's process takes between fork and exec.
 *
 * Python's subprocess can only run code in the child through ``preexec_fn``, which forces
 * a full fork() with the interpreter running in the child: the spawn then costs time that
 * grows with the harness's memory.  Without ``preexec_fn`` subprocess uses vfork(), and
 * this program does the child's part instead, in C, then execs the cell:
 *
 *   cumatrix-spawn PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM [ARGS...]
 *
 * PARENT_PID    die with this process (PR_SET_PDEATHSIG, SIGKILL); 0: no death signal.
 * CGROUP_PROCS  a cgroup v2 ``cgroup.procs`` file to join before exec, or "-".
 * LIMITS        "name=soft:hard,..." resource limits (core, cpu, nofile, nproc), or "-".
 *
 * A PROGRAM that cannot be executed exits 127 (not found) or 126, as a shell does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

static int fail(const char *what, const char *arg) {
    fprintf(stderr, "cumatrix-spawn: %s %s: %s\n", what, arg, strerror(errno));
    return 126;
}

static int limit_resource(const char *name) {
    if (!strcmp(name, "core")) return RLIMIT_CORE;
    if (!strcmp(name, "cpu")) return RLIMIT_CPU;
    if (!strcmp(name, "nofile")) return RLIMIT_NOFILE;
    if (!strcmp(name, "nproc")) return RLIMIT_NPROC;
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

int main(int argc, char **argv) {
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
        int fd = open(argv[2], O_WRONLY | O_CLOEXEC);
        if (fd < 0) return fail("open", argv[2]);
        if (write(fd, "0\n", 2) != 2) return fail("join cgroup", argv[2]);
        close(fd);
    }
    if (strcmp(argv[3], "-") != 0 && set_limits(argv[3]) != 0) return 126;
    execvp(argv[5], &argv[5]);
    int err = errno;
    fprintf(stderr, "cannot start '%s': %s\n", argv[5], strerror(err));
    return err == ENOENT ? 127 : 126;
}
