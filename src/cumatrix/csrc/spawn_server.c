#include "spawn_common.h"
#include "spawn_cell.h"
#include "spawn_run.h"
#include "spawn_server.h"
#include "spawn_util.h"

/* --serve SOCKET_FD PARENT_PID [BASE:COUNT | --userns]: the fork server.  BASE:COUNT (a root
 * server): each cell's host uid is one of that range that no other cell holds (take_uid);
 * --userns (anyone else's): the server first makes a user namespace of its own, where its uid
 * is root, and each cell's host uid is that one.  Each message on the socket (SOCK_SEQPACKET,
 * one message a cell) is a cell: NUL-separated strings
 *
 *   cumatrix-cell-2  CGROUP_PROCS  LIMITS  UID  N_OPS  N_ARGV  N_ENV  TARGETS  HOLD
 *   OPS...  ARGV...  ENV...
 *
 * with descriptors (SCM_RIGHTS): the cell's stdout, stderr, its status pipe, its trace pipe,
 * where HOLD is 1 a hold pipe, then one for each comma-separated number in TARGETS (dup2'ed
 * to that number in the program: a harness child's verdict channel).  A held cell is made
 * ready (its tracer, namespaces, cgroup and root) and its program forked only once the byte
 * 'g' comes on the hold pipe: the harness readies the next cell while one runs, and starts
 * it the moment that one has ended.  For each, a process is forked that does what
 * --trace does (the tracer), with the program's first process cloned into new mount, pid,
 * IPC, UTS and network namespaces and there building its sandbox (cell_init).  The tracer
 * writes "p <pid>" on the status pipe when that first process exists (the harness ends a cell
 * without a cgroup by it) and, where a --trace run ends as its program did, "z <wait status>"
 * (no "z": the cell was lost).  The server itself is not dumpable, dies with
 * PARENT_PID (where one is given) and ends at the socket's EOF; it reaps its children as
 * each message comes. */
#define SERVE_MAX_FDS 8
#define SERVE_MAX_MSG (1 << 20)

static long uid_base = -1, uid_count;  /* --serve BASE:COUNT */

/* The cell's host uid, from the reserved range BASE:COUNT: one that no other cell of any
 * server holds now.  A uid is held by binding an abstract socket named after it in the
 * server's network namespace (the host's), which the kernel lets one socket hold at a time
 * and frees when its last holder ends: this tracer, which ends only once no process of its
 * cell is left.  The search starts at a place of this process's own, so that servers side by
 * side seldom try the same uid.  -1 (errno EAGAIN): every uid of the range is held. */
static long take_uid(void) {
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    long start = (long)getpid() % uid_count;
    for (long i = 0; i < uid_count; i++) {
        long uid = uid_base + (start + i) % uid_count;
        struct sockaddr_un a;
        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "cumatrix-cell-uid-%ld", uid);
        if (bind(s, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)) == 0)
            return uid;  /* S stays open (close-on-exec) for this process's life */
        if (errno != EADDRINUSE) break;
    }
    close(s);
    errno = EAGAIN;
    return -1;
}

/* A user namespace whose only mapping is FROM (inside) to TO (outside), for an idmapped
 * mount: files of the harness's uid FROM shown as the cell's TO.  Made by a child cloned into
 * it, mapped from here (root in the namespace above) and let go once its descriptor is open;
 * -1 on failure. */
static int idmap_userns(long from, long to) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return -1;
    pid_t child = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, NULL);
    if (child == 0) {
        char c;
        close(p[1]);
        while (read(p[0], &c, 1) < 0 && errno == EINTR) {}
        _exit(0);
    }
    close(p[0]);
    int fd = -1;
    if (child > 0) {
        char path[64], map[64];
        snprintf(map, sizeof map, "%ld %ld 1\n", from, to);
        snprintf(path, sizeof path, "/proc/%d/uid_map", (int)child);
        int ok = write_text(path, map) == 0;
        snprintf(path, sizeof path, "/proc/%d/gid_map", (int)child);
        ok = ok && write_text(path, map) == 0;
        snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
        if (ok) fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    close(p[1]);
    if (child > 0) while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {}
    return fd;
}

static char **split_fields(char *buf, size_t len, int *count) {
    int n = 0;
    for (size_t i = 0; i < len; i++) n += buf[i] == 0;
    char **out = calloc((size_t)n + 1, sizeof *out);
    if (!out) return NULL;
    int k = 0;
    for (size_t i = 0; i < len && k < n; k++) {
        out[k] = buf + i;
        i += strlen(buf + i) + 1;
    }
    *count = k;
    return out;
}

static void serve_cell(char **f, int nf, int *fds, int nfds, pid_t server) {
    /* f: magic procs limits uid n_ops n_argv n_env targets hold ops... argv... env... */
    int n_ops = atoi(f[4]), n_argv = atoi(f[5]), n_env = atoi(f[6]), hold = !strcmp(f[8], "1");
    if (n_ops < 0 || n_argv < 1 || n_env < 0 || 9 + n_ops + n_argv + n_env > nf || nfds < 4 + hold) _exit(125);
    /* Out of the way of the numbers the program's descriptors go to (0-2 and TARGETS). */
    for (int i = 0; i < nfds; i++) {
        int high = fcntl(fds[i], F_DUPFD_CLOEXEC, 256);
        if (high < 0) _exit(125);
        close(fds[i]);
        fds[i] = high;
    }
    serve_status_fd = fds[2];
    /* The server's dispositions are not the cell's: children waited for, ^C at its default. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL);
    setsid();
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0 || dup2(fds[0], 1) < 0 || dup2(fds[1], 2) < 0) _exit(125);
    /* The verdict channel's descriptors at the numbers the cell's environment names. */
    if (hold) serve_hold_fd = fds[4];
    char *targets = f[7], *save = NULL;
    int k = 4 + hold;
    for (char *t = strtok_r(targets, ",", &save); t; t = strtok_r(NULL, ",", &save), k++) {
        if (k >= nfds) _exit(125);
        int want = atoi(t);
        if (want < 3 || dup2(fds[k], want) < 0) _exit(125);
    }
    serve_ops = &f[9];
    serve_nops = n_ops;
    serve_uid = strcmp(f[3], "-") ? atol(f[3]) : -1;
    /* A network namespace of its own, made new: nothing of a cell before it (a socket in
     * TIME_WAIT on a port, a route, a conntrack entry) is there; it goes with the cell. */
    clone_ns_flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET;
    if (serve_uid >= 0 && serve_userns) serve_host_uid = 0;  /* the server's own uid, as its namespace names it */
    if (serve_uid >= 0 && uid_base >= 0 && (serve_host_uid = take_uid()) < 0) {
        fprintf(stderr, "cumatrix-spawn: no uid of the cells' range %ld-%ld is free (%ld cells hold them)\n",
                uid_base, uid_base + uid_count - 1, uid_count);
        _exit(0);  /* no status: a harness error */
    }
    int wants_idmap = 0;
    for (int i = 0; i < n_ops; i++) wants_idmap |= !strcmp(f[9 + i], "--ro-bind-idmap");
    if (wants_idmap && serve_host_uid >= 0 && !serve_userns &&
        (serve_idmap_fd = idmap_userns((long)geteuid(), serve_host_uid)) < 0) {
        fprintf(stderr, "cumatrix-spawn: no user namespace for an idmapped mount: %s\n", strerror(errno));
        _exit(0);
    }
    char **env = calloc((size_t)n_env + 1, sizeof *env);
    if (!env) _exit(125);
    for (int i = 0; i < n_env; i++) env[i] = f[9 + n_ops + n_argv + i];
    environ = env;
    char parent[24];
    snprintf(parent, sizeof parent, "%d", (int)server);
    char **args = calloc((size_t)n_argv + 5, sizeof *args);
    if (!args) _exit(125);
    args[0] = parent;
    args[1] = f[1];
    args[2] = f[2];
    args[3] = "--";
    for (int i = 0; i < n_argv; i++) args[4 + i] = f[9 + n_ops + i];
    int rc = traced_main(fds[3], n_argv + 4, args);
    if (!serve_status_sent) {  /* it failed before the program ran: as --trace would have exited */
        char line[32];
        int n = snprintf(line, sizeof line, "z\t%d\n", (rc & 0xff) << 8);
        while (write(serve_status_fd, line, (size_t)n) < 0 && errno == EINTR) {}
    }
    _exit(0);
}

/* --serve ... --userns: the server in a user namespace of its own, made once for the run,
 * its uid and gid mapped to root there (a non-root harness: the only ids it may map), so that
 * it may make each cell's namespaces and mounts as a root server does. */
static int enter_server_userns(void) {
    char uid_map[64], gid_map[64];
    snprintf(uid_map, sizeof uid_map, "0 %ld 1\n", (long)geteuid());
    snprintf(gid_map, sizeof gid_map, "0 %ld 1\n", (long)getegid());
    if (unshare(CLONE_NEWUSER) != 0) return fail("unshare", "user namespace");
    if (write_text("/proc/self/setgroups", "deny") != 0) return fail("write", "/proc/self/setgroups");
    if (write_text("/proc/self/uid_map", uid_map) != 0) return fail("write", "/proc/self/uid_map");
    if (write_text("/proc/self/gid_map", gid_map) != 0) return fail("write", "/proc/self/gid_map");
    serve_userns = 1;
    return 0;
}

int serve(int sock, pid_t parent, const char *how) {
    /* Before it is made non-dumpable: its /proc/self maps are then root's to write. */
    if (how && !strcmp(how, "--userns") && enter_server_userns() != 0) return 125;
    if (how && how[0] >= '0' && how[0] <= '9') {
        char *end = NULL;
        uid_base = strtol(how, &end, 10);
        uid_count = end && *end == ':' ? strtol(end + 1, NULL, 10) : 0;
        if (uid_base <= 0 || uid_count <= 0) { errno = EINVAL; return fail("bad uid range", how); }
    }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (parent > 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) return fail("prctl", "PR_SET_PDEATHSIG");
        if (getppid() != parent) return 128 + SIGKILL;
    }
    signal(SIGINT, SIG_IGN);  /* a terminal's ^C is the harness's to act on */
    char *buf = malloc(SERVE_MAX_MSG);
    if (!buf) return fail("malloc", "");
    pid_t self = getpid();
    for (;;) {
        char control[CMSG_SPACE(sizeof(int) * SERVE_MAX_FDS)];
        struct iovec iov = {buf, SERVE_MAX_MSG - 1};
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;  /* the harness closed its end (or is gone) */
        int fds[SERVE_MAX_FDS], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            int got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < got && nfds < SERVE_MAX_FDS; i++) memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
        buf[n] = 0;
        int nf = 0;
        char **f = (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ? NULL : split_fields(buf, (size_t)n, &nf);
        if (f && nf >= 9 && !strcmp(f[0], "cumatrix-cell-2")) {
            pid_t pid = fork();
            if (pid == 0) {
                close(sock);
                serve_cell(f, nf, fds, nfds, self);
            }
        }
        /* A malformed message: its status pipe closes unwritten, and the harness says so. */
        free(f);
        for (int i = 0; i < nfds; i++) close(fds[i]);
    }
}

