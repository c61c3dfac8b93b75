#include "spawn_common.h"
#include "spawn_sandbox.h"
#include "spawn_cell.h"
#include "spawn_util.h"

/* ------------------------------------------------------------------ the served sandbox (--serve)
 *
 * A cell's first process (pid 1 of its own pid namespace, in its own mount, IPC, UTS and
 * network namespaces, already in its cgroup) builds the view bubblewrap would build from the
 * same operations: a tmpfs for the cell's root, assembled from the host's paths, then made the
 * root and the host's root detached (build_root).  A bind is recursive and its mounts are made read-only, nosuid
 * and nodev (a --dev-bind keeps devices) at once with mount_setattr.  The operations are the
 * subset of bubblewrap's options that the harness writes (cumatrix.execute.sandbox), and one
 * of its own (--ro-bind-idmap: read-only, the harness's files shown as the cell's own):
 *   --ro-bind --ro-bind-idmap --bind --dev-bind SRC DEST   --symlink TARGET DEST   --dir DEST
 *   --tmpfs DEST   --dev DEST   --proc DEST   --remount-ro DEST   --perms MODE   --size BYTES
 *   --chdir DIR
 * Then this process forks the program's process (before the cell's turn, for a held cell: it
 * waits for the harness's word last, just before its exec), which leaves root (uid and gid SERVE_UID in
 * a user namespace of its own whose only id is the cell's host uid, no groups, no capability in
 * any set, no_new_privs, a session keyring of its own, then no keyring call at all), and waits
 * as its init: it ends as the program ended (128+N for a signal N, as bubblewrap reports it);
 * its end ends the namespace and every process left in it. */


#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x00000001
#define MOUNT_ATTR_NOSUID 0x00000002
#define MOUNT_ATTR_NODEV 0x00000004
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif

struct mount_attr_v0 { unsigned long long attr_set, attr_clr, propagation, userns_fd; };

static int set_attrs(const char *path, unsigned long long attrs, int recursive) {
    struct mount_attr_v0 a;
    memset(&a, 0, sizeof a);
    a.attr_set = attrs;
    return (int)syscall(SYS_mount_setattr, AT_FDCWD, path, recursive ? AT_RECURSIVE : 0, &a, sizeof a);
}

static int mkdir_p(char *path, mode_t mode) {
    for (char *s = path + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        int r = mkdir(path, 0755);
        *s = '/';
        if (r != 0 && errno != EEXIST) return -1;
    }
    if (mkdir(path, mode) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* The parent directories of PATH, made. */
static int parents_of(const char *path) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf) return 0;
    *slash = 0;
    return mkdir_p(buf, 0755);
}

/* Where a mount of SRC goes: a directory for a directory, an empty file for anything else. */
static int mount_point_for(const char *src, const char *dest) {
    struct stat st;
    if (stat(src, &st) != 0) return -1;
    if (S_ISDIR(st.st_mode)) {
        char buf[PATH_MAX];
        snprintf(buf, sizeof buf, "%s", dest);
        return mkdir_p(buf, 0755);
    }
    struct stat there;
    if (lstat(dest, &there) == 0) return 0;  /* shown already (a file of a directory bound read-only) */
    if (parents_of(dest) != 0) return -1;
    int fd = open(dest, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY, 0444);
    if (fd < 0 && errno != EEXIST && errno != EISDIR) return -1;
    if (fd >= 0) close(fd);
    return 0;
}

static int bind_into(const char *src, const char *dest, unsigned long long attrs) {
    if (mount_point_for(src, dest) != 0) return fail("mount point for", dest);
    if (mount(src, dest, NULL, MS_BIND | MS_REC, NULL) != 0) return fail("bind", src);
    if (set_attrs(dest, attrs, 1) != 0) return fail("mount_setattr", dest);
    return 0;
}

#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#ifndef MOUNT_ATTR_IDMAP
#define MOUNT_ATTR_IDMAP 0x00100000
#endif

/* --ro-bind-idmap: SRC read-only, its files of the harness's uid and gid shown as the cell's
 * (an idmapped mount, Linux 5.12; ext4, xfs, btrfs, tmpfs since 6.3; not an overlayfs mount):
 * a private project (a 0700 directory) is readable by the cell, and nothing of the host's
 * permissions changes.  Recursive where every file system below SRC allows it, else SRC's
 * own mount alone; where SRC's refuses, one line says so and the cell does not start. */
static int idmapped_bind(const char *src, const char *dest) {
    if (mount_point_for(src, dest) != 0) return fail("mount point for", dest);
    struct mount_attr_v0 a;
    memset(&a, 0, sizeof a);
    a.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    a.userns_fd = (unsigned long long)serve_idmap_fd;
    int tree = -1, err = 0;
    for (int rec = 1; rec >= 0 && tree < 0; rec--) {
        int t = (int)syscall(SYS_open_tree, AT_FDCWD, src, OPEN_TREE_CLONE | O_CLOEXEC | (rec ? AT_RECURSIVE : 0));
        if (t < 0) return fail("open_tree", src);
        if (syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH | (rec ? AT_RECURSIVE : 0), &a, sizeof a) == 0) tree = t;
        else { err = errno; close(t); }
    }
    if (tree < 0) {
        fprintf(stderr, "cumatrix-spawn: %s cannot be shown to the cell's uid: its file system refuses an idmapped "
                "mount (%s); let others read it (chmod o+rx), or --no-sandbox\n", src, strerror(err));
        return 126;
    }
    int r = (int)syscall(SYS_move_mount, tree, "", AT_FDCWD, dest, MOVE_MOUNT_F_EMPTY_PATH);
    err = errno;
    close(tree);
    errno = err;
    return r == 0 ? 0 : fail("move_mount", dest);
}

static int tmpfs_at(const char *dest, unsigned int perms, unsigned long long size) {
    char buf[PATH_MAX], opts[96];
    snprintf(buf, sizeof buf, "%s", dest);
    if (mkdir_p(buf, 0755) != 0) return fail("mkdir", dest);
    if (size) snprintf(opts, sizeof opts, "mode=0%o,size=%llu", perms, size);
    else snprintf(opts, sizeof opts, "mode=0%o", perms);
    if (mount("tmpfs", dest, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) return fail("tmpfs", dest);
    return 0;
}

/* bubblewrap's --dev: a tmpfs with the harmless devices bound from the host, the standard
 * links, its own devpts and an empty shm. */
static int dev_at(const char *dest) {
    static const char *const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
    char a[PATH_MAX], b[PATH_MAX + 64];
    if (tmpfs_at(dest, 0755, 0) != 0) return -1;
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
        /* A device node on a fresh tmpfs: its mount point made directly, the node bound alone
         * (it holds no mount), with the host /dev's flags (devices allowed; nosuid means
         * nothing to a node, which no one executes). */
        snprintf(a, sizeof a, "/dev/%s", nodes[i]);
        snprintf(b, sizeof b, "%s/%s", dest, nodes[i]);
        int fd = open(b, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY, 0444);
        if (fd < 0) return fail("mount point for", b);
        close(fd);
        if (mount(a, b, NULL, MS_BIND, NULL) != 0) return fail("bind", a);
    }
    static const char *const links[][2] = {{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
                                           {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
                                           {"/proc/kcore", "core"}, {"pts/ptmx", "ptmx"}};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        snprintf(b, sizeof b, "%s/%s", dest, links[i][1]);
        if (symlink(links[i][0], b) != 0) return fail("symlink", b);
    }
    snprintf(b, sizeof b, "%s/shm", dest);
    if (mkdir(b, 0755) != 0) return fail("mkdir", b);
    snprintf(b, sizeof b, "%s/pts", dest);
    if (mkdir(b, 0755) != 0) return fail("mkdir", b);
    if (mount("devpts", b, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620") != 0)
        return fail("devpts", b);
    return 0;
}

/* bubblewrap's --proc: this pid namespace's proc, its kernel knobs read-only. */
static int proc_at(const char *dest) {
    char buf[PATH_MAX + 64];
    snprintf(buf, sizeof buf, "%s", dest);
    if (mkdir_p(buf, 0755) != 0) return fail("mkdir", dest);
    if (mount("proc", dest, "proc", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL) != 0) return fail("proc", dest);
    static const char *const covered[] = {"sys", "sysrq-trigger", "irq", "bus"};
    for (size_t i = 0; i < sizeof covered / sizeof covered[0]; i++) {
        snprintf(buf, sizeof buf, "%s/%s", dest, covered[i]);
        if (access(buf, F_OK) != 0) continue;
        if (bind_into(buf, buf, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV) != 0) return -1;
    }
    return 0;
}

static int loopback_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return fail("socket", "lo");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    int ok = ioctl(s, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    ok = ok && ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
    close(s);
    return ok ? 0 : fail("ioctl", "lo up");
}

/* The cell's root is a tmpfs mounted, in the cell's own mount namespace, over the host's
 * /dev/shm: a directory every host has and that no operation reads from (the harness binds
 * nothing of /dev but the GPU's nodes and the few devices below), so every source stays the
 * host's own path.  The tree is built there, then made the root (pivot_root with the old root
 * stacked over it, and that detached: one pass, one wait for the kernel's unmount). */
#define CELL_BASE "/dev/shm"

static int build_root(char **chdir_to) {
    char dest[PATH_MAX];
    if (mount(NULL, "/", NULL, MS_SLAVE | MS_REC, NULL) != 0) return fail("mount", "/ slave");
    if (mount("tmpfs", CELL_BASE, "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755") != 0) return fail("tmpfs", "root");
    unsigned int perms = 0755;
    unsigned long long size = 0;
    for (int i = 0; i < serve_nops; i++) {
        const char *op = serve_ops[i];
        const char *a = i + 1 < serve_nops ? serve_ops[i + 1] : NULL;
        const char *b = i + 2 < serve_nops ? serve_ops[i + 2] : NULL;
        int idmap = !strcmp(op, "--ro-bind-idmap");
        int two = !strcmp(op, "--ro-bind") || !strcmp(op, "--bind") || !strcmp(op, "--dev-bind") ||
                  !strcmp(op, "--symlink") || idmap;
        if (!a || (two && !b)) { errno = EINVAL; return fail("operation without its arguments", op); }
        if (strlen(a) + 16 >= PATH_MAX || (b && strlen(b) + 16 >= PATH_MAX)) {
            errno = ENAMETOOLONG;
            return fail("path", a);
        }
        if (two) {
            snprintf(dest, sizeof dest, CELL_BASE "%s", b);
            if (!strcmp(op, "--symlink")) {
                if (parents_of(dest) != 0 || (symlink(a, dest) != 0 && errno != EEXIST)) return fail("symlink", b);
            } else {
                if (!strncmp(a, CELL_BASE "/", sizeof CELL_BASE) || !strcmp(a, CELL_BASE)) {
                    errno = EINVAL;
                    return fail("a source under the cell's root", a);
                }
                unsigned long long attrs = MOUNT_ATTR_NOSUID;
                if (strcmp(op, "--dev-bind") != 0) attrs |= MOUNT_ATTR_NODEV;
                if (!strcmp(op, "--ro-bind") || idmap) attrs |= MOUNT_ATTR_RDONLY;
                /* No cell uid of its own to map to (a non-root server's cells are its uid): a bind. */
                int r = idmap && serve_idmap_fd >= 0 ? idmapped_bind(a, dest) : bind_into(a, dest, attrs);
                if (r != 0) return r;
            }
            i += 2;
            continue;
        }
        i += 1;
        if (!strcmp(op, "--perms")) { perms = (unsigned int)strtoul(a, NULL, 8); continue; }
        if (!strcmp(op, "--size")) { size = strtoull(a, NULL, 10); continue; }
        if (!strcmp(op, "--chdir")) { *chdir_to = (char *)a; continue; }
        snprintf(dest, sizeof dest, CELL_BASE "%s", a);
        int r;
        if (!strcmp(op, "--dir")) {
            r = mkdir_p(dest, perms) == 0 && chmod(dest, perms) == 0 ? 0 : fail("mkdir", a);
        } else if (!strcmp(op, "--tmpfs")) {
            r = tmpfs_at(dest, perms, size);
        } else if (!strcmp(op, "--dev")) {
            r = dev_at(dest);
        } else if (!strcmp(op, "--proc")) {
            r = proc_at(dest);
        } else if (!strcmp(op, "--remount-ro")) {
            r = set_attrs(dest, MOUNT_ATTR_RDONLY, 0) == 0 ? 0 : fail("remount read-only", a);
        } else {
            errno = EINVAL;
            r = fail("unknown operation", op);
        }
        if (r != 0) return r;
        perms = 0755;  /* --perms and --size apply to the next operation only */
        size = 0;
    }
    if (chdir(CELL_BASE) != 0) return fail("chdir", "root");
    if (syscall(SYS_pivot_root, ".", ".") != 0) return fail("pivot_root", "root");
    if (umount2(".", MNT_DETACH) != 0) return fail("umount", "host root");
    if (chdir("/") != 0) return fail("chdir", "/");
    return 0;
}

/* Into a user namespace of the program's own, as UID there and HOST (the cell's uid in the
 * namespace above) outside: its user keyring and user-session keyring are that namespace's,
 * made empty and gone with it, whatever uid a cell before it had.  The namespace is owned by
 * HOST, so what the kernel counts per uid (processes for RLIMIT_NPROC, inotify instances and
 * watches, message queue bytes, locked memory, key quota) is counted against HOST above it.
 * A root server becomes HOST first keeping its permitted set (the namespace is then made with
 * CAP_SYS_ADMIN: no restriction on unprivileged user namespaces applies). */
static int own_userns(long uid, long host) {
    if (geteuid() != (uid_t)host) {
        if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) return fail("prctl", "keep capabilities");
        if (setresgid((gid_t)host, (gid_t)host, (gid_t)host) != 0) return fail("setresgid", "");
        if (setresuid((uid_t)host, (uid_t)host, (uid_t)host) != 0) return fail("setresuid", "");
        struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
        struct __user_cap_data_struct keep[2];
        memset(keep, 0, sizeof keep);
        keep[0].effective = keep[0].permitted = 1u << CAP_SYS_ADMIN;
        syscall(SYS_capset, &hdr, keep);  /* refused: the namespace is made unprivileged */
    }
    if (unshare(CLONE_NEWUSER) != 0) return fail("unshare", "the cell's user namespace");
    /* A change of uid made it not dumpable, and its /proc files root's: its maps are its own to
     * write.  It holds nothing the program it becomes will not (no other process has its uid). */
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) return fail("prctl", "dumpable");
    char map[64];
    snprintf(map, sizeof map, "%ld %ld 1\n", uid, host);
    if (write_text("/proc/self/setgroups", "deny") != 0) return fail("write", "/proc/self/setgroups");
    if (write_text("/proc/self/uid_map", map) != 0) return fail("write", "/proc/self/uid_map");
    if (write_text("/proc/self/gid_map", map) != 0) return fail("write", "/proc/self/gid_map");
    return 0;
}

/* Leave root for SERVE_UID with nothing left: no capability in any set (bounding and
 * ambient included), no supplementary group, no way to gain privileges.  Where the cell has a
 * host uid of its own (serve_host_uid), SERVE_UID is its uid inside a user namespace of its own
 * (own_userns).  A non-root server's supplementary groups cannot be dropped (setgroups is
 * denied in its namespace, as under bubblewrap): they show as the overflow group. */
static int drop_root(long uid) {
    if (!serve_userns && setgroups(0, NULL) != 0) return fail("setgroups", "");
    if (serve_host_uid >= 0 && own_userns(uid, serve_host_uid) != 0) return -1;
    for (int cap = 0; cap <= 63; cap++)
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) return fail("drop capability", "bounding set");
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if (serve_host_uid < 0) {
        if (setresgid((gid_t)uid, (gid_t)uid, (gid_t)uid) != 0) return fail("setresgid", "");
        if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) return fail("setresuid", "");
    }
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2];
    memset(none, 0, sizeof none);
    if (syscall(SYS_capset, &hdr, none) != 0) return fail("capset", "");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("prctl", "no_new_privs");
    return 0;
}

int cell_init(char *limits, char **argv) {
    char *chdir_to = NULL;
    if (unshare(CLONE_NEWCGROUP) != 0) return fail("unshare", "cgroup namespace");
    if (build_root(&chdir_to) != 0 || loopback_up() != 0) {
        /* Nothing of the program ran: the harness's failure, not the cell's (its stderr says
         * which step); the status pipe says so before the status. */
        static const char line[] = "h\tthe cell's sandbox could not be built\n";
        if (serve_status_fd >= 0) while (write(serve_status_fd, line, sizeof line - 1) < 0 && errno == EINTR) {}
        return 126;
    }
    if (serve_idmap_fd >= 0) close(serve_idmap_fd);
    /* The program's process is made whole before the cell's turn (a held cell: its root left,
     * its user namespace, keyring, limits and filter in place) and waits, last, for the
     * harness's word before its exec, so that what is left between two cells is the exec. */
    pid_t program = fork();
    if (program < 0) return fail("fork", "program");
    if (program == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) _exit(128 + SIGKILL);
        if (chdir_to && chdir(chdir_to) != 0) _exit(fail("chdir", chdir_to));
        if (serve_uid >= 0 && drop_root(serve_uid) != 0) _exit(126);
        /* A session keyring of its own: the one inherited is the harness's, and a process
         * possesses its session keyring whatever its uid.  (No keyrings in the kernel: none
         * to share.) */
        if (syscall(SYS_keyctl, 1 /* KEYCTL_JOIN_SESSION_KEYRING */, NULL) < 0 && errno != ENOSYS)
            _exit(fail("keyctl", "join session keyring"));
        no_keyrings = 1;  /* then no keyring at all (run_program) */
        _exit(run_program_held(limits, argv, serve_hold_fd));
    }
    if (serve_hold_fd >= 0) close(serve_hold_fd);  /* the program's process alone waits on it */
    /* Its children's ends come by waitpid alone: SIGCHLD blocked, no signal to stop the
     * tracer for (a traced process's signal stops it even where ignored). */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    for (;;) {  /* the namespace's init: reaps what is orphaned, ends with the program */
        int st;
        pid_t got = waitpid(-1, &st, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return fail("waitpid", "program");
        if (got != program) continue;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
}

