#include "spawn_common.h"
#include "spawn_util.h"
#include "spawn_seccomp.h"

int fail(const char *what, const char *arg) {
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

int no_keyrings;

/* The program's side: limits, the keyring filter, then exec; returns only on failure (the exit
 * code to use). */
int run_program(char *limits, char **argv) { return run_program_held(limits, argv, -1); }

int run_program_held(char *limits, char **argv, int hold_fd) {
    if (strcmp(limits, "-") != 0 && set_limits(limits) != 0) return 126;
    /* What a key holds outlives the cell (spawn_seccomp.c): no keyring call from here on. */
    if (no_keyrings && refuse_keyrings() != 0) return fail("seccomp", "refuse the kernel's keyrings");
    if (hold_fd >= 0) {
        /* A held cell: everything but the exec is done; the program starts when the harness
         * says so (the cell before it has ended).  EOF, or anything but the word: dropped. */
        char word = 0;
        ssize_t n;
        do n = read(hold_fd, &word, 1); while (n < 0 && errno == EINTR);
        close(hold_fd);
        if (n != 1 || word != 'g') return 125;
    }
    execvp(argv[0], argv);
    int err = errno;
    fprintf(stderr, "cannot start '%s': %s\n", argv[0], strerror(err));
    return err == ENOENT ? 127 : 126;
}

int write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n;
    int err = errno;
    close(fd);
    errno = err;
    return ok ? 0 : -1;
}

