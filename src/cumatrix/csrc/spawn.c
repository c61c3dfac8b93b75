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
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <linux/capability.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <stdarg.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/ptrace.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <limits.h>
#include <sys/syscall.h>
#include <sys/time.h>
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

/* --serve: the namespaces each cell's first process is cloned into, the sandbox it builds
 * (bubblewrap's operations), the uid its program runs as, where its end is reported. */
static unsigned long long clone_ns_flags;
static char **serve_ops;
static int serve_nops;
static long serve_uid = -1;
static int serve_status_fd = -1;
static int serve_status_sent;
/* The cell's host uid (kernel uid, seen as SERVE_UID inside the cell's own user namespace):
 * one of the reserved range no other cell holds while this one lives (--serve BASE:COUNT, a
 * root server), the server's own uid in its user namespace (--serve --userns: 0), or -1 (the
 * program runs as SERVE_UID itself, sharing that uid's kernel state with every other cell). */
static long serve_host_uid = -1;
static long uid_base = -1, uid_count;
static int serve_userns;  /* the server made its own user namespace (a non-root harness) */
static int serve_idmap_fd = -1;  /* a user namespace mapping the harness's files to the cell's uid */
static int serve_hold_fd = -1;  /* a held cell: its program starts at a byte on this pipe */
/* The cell's mount namespace, held by its tracer: the last reference taken down (its mounts
 * unmounted, an expedited RCU grace period waited for) after the cell's pipes are closed, so
 * that the harness, told the cell ended, need not wait for it. */
static int serve_mnt_ns = -1;

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


/* ------------------------------------------------------------------ the tracer (--trace) */

static int trace_fd = -1;
static char out_buf[1 << 16];
static size_t out_len;

/* --trace-record: the record, in memory until the tree is gone. */
#define RECORD_MAX (16u << 20)
static int record_mode;
static char *record;
static size_t record_len, record_cap;
static char secret[128];

static void write_all(int fd, const char *buf, size_t len) {
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, buf + off, len - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        off += (size_t)w;
    }
}

static void out_flush(void) {
    if (record_mode) {
        if (record_len + out_len > record_cap && record_len + out_len <= RECORD_MAX) {
            size_t cap = record_cap ? record_cap : (1u << 20);
            while (cap < record_len + out_len) cap *= 2;
            char *grown = realloc(record, cap);
            if (grown) { record = grown; record_cap = cap; }
        }
        if (record_len + out_len <= record_cap) {  /* past the cap the rest is dropped: no "z" line */
            memcpy(record + record_len, out_buf, out_len);
            record_len += out_len;
        }
        out_len = 0;
        return;
    }
    size_t off = 0;
    while (off < out_len) {
        ssize_t w = write(trace_fd, out_buf + off, out_len - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            break;  /* the harness is gone: nothing to tell */
        }
        off += (size_t)w;
    }
    out_len = 0;
}

static void out_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out_line(const char *fmt, ...) {
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line) { n = sizeof line - 1; line[n - 1] = '\n'; }
    if (out_len + (size_t)n > sizeof out_buf) out_flush();
    memcpy(out_buf + out_len, line, (size_t)n);
    out_len += (size_t)n;
}

/* (pid, dev, inode) already written: a process's objects are listed once, however often
 * its maps are read.  Open addressing; a full table only means repeated lines. */
#define SEEN_SLOTS 65536
static struct seen { int pid; unsigned long long dev, ino; unsigned long hash; } seen[SEEN_SLOTS];

static int seen_before(int pid, unsigned long long dev, unsigned long long ino, const char *path) {
    unsigned long h = 1469598103934665603UL;
    for (const char *c = path; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211UL;
    unsigned long k = (h ^ (unsigned long)pid * 2654435761UL ^ ino * 40503UL ^ dev) % SEEN_SLOTS;
    for (int probes = 0; probes < 64; probes++, k = (k + 1) % SEEN_SLOTS) {
        if (seen[k].pid == 0) {
            seen[k].pid = pid; seen[k].dev = dev; seen[k].ino = ino; seen[k].hash = h;
            return 0;
        }
        if (seen[k].pid == pid && seen[k].dev == dev && seen[k].ino == ino && seen[k].hash == h) return 1;
    }
    return 0;
}

/* Every file PID mapped executable (anonymous memory, [heap], [stack], the vDSO left out):
 * a file mapped as data (mmap PROT_READ of a runtime, a font, a locale archive) was not
 * loaded and never ran, so it is not what the process used. */
static void snapshot(pid_t pid) {
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(name, "re");
    if (!f) return;
    static char buf[1 << 17];  /* a large process's maps in a few reads, not one per 4 KiB */
    setvbuf(f, buf, _IOFBF, sizeof buf);
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        /* start-end perms offset MAJ:MIN inode   path */
        unsigned int major, minor;
        unsigned long long ino;
        char perms[8] = "";
        int at = 0;
        if (sscanf(line, "%*s %7s %*s %x:%x %llu %n", perms, &major, &minor, &ino, &at) < 4 || at == 0) continue;
        if (perms[2] != 'x') continue;  /* r-xp: loaded; r--p alone: read as data */
        char *path = line + at;
        while (*path == ' ') path++;
        size_t n = strlen(path);
        if (n && path[n - 1] == '\n') path[--n] = 0;
        if (!n || path[0] == '[' || (ino == 0 && path[0] != '/')) continue;
        unsigned long long dev = ((unsigned long long)major << 20) | minor;  /* the kernel's MKDEV */
        if (seen_before((int)pid, dev, ino, path)) continue;
        out_line("m\t%d\t%02x:%02x\t%llu\t%s\n", (int)pid, major, minor, ino, path);
    }
    fclose(f);
}

static void exe_of(pid_t pid, char *buf, size_t size) {
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/exe", (int)pid);
    ssize_t n = readlink(name, buf, size - 1);
    if (n < 0) n = 0;
    buf[n] = 0;
    for (char *c = buf; *c; c++) if (*c == '\n' || *c == '\t') *c = '?';
}

/* SECCOMP_RET_DATA of the filter's stops: an execve (or another ABI's call), an executable mapping. */
#define EXEC_STOP 0
#define MMAP_EXEC 1
#define MPROTECT_EXEC 2

/* The most bytes of a nameless file hashed at its stop (a libcudart is about 1 MiB, the
 * largest CUDA library some hundreds): a bound on the time a process waits. */
#define DIGEST_LIMIT (512ULL << 20)

/* SHA-256 (FIPS 180-4), for the digest of a nameless file's bytes: the harness cannot read
 * them once the process is gone, and this helper links nothing but the C library. */
static const unsigned int sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(unsigned int h[8], const unsigned char *b) {
    unsigned int w[64], a[8];
    for (int i = 0; i < 16; i++)
        w[i] = (unsigned)b[4 * i] << 24 | (unsigned)b[4 * i + 1] << 16 | (unsigned)b[4 * i + 2] << 8 | b[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        unsigned int s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        unsigned int s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(a, h, sizeof a);
    for (int i = 0; i < 64; i++) {
        unsigned int t1 = a[7] + (ROR(a[4], 6) ^ ROR(a[4], 11) ^ ROR(a[4], 25)) + ((a[4] & a[5]) ^ (~a[4] & a[6])) + sha_k[i] + w[i];
        unsigned int t2 = (ROR(a[0], 2) ^ ROR(a[0], 13) ^ ROR(a[0], 22)) + ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof a[0]);
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) h[i] += a[i];
}

/* The SHA-256 of FD's first DIGEST_LIMIT bytes, as hex into OUT (65 bytes); its length read
 * (0 and OUT empty: nothing could be read). */
static unsigned long long sha256_of(int fd, char out[65]) {
    unsigned int h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    static unsigned char buf[1 << 16];
    unsigned long long total = 0;
    size_t have = 0;
    out[0] = 0;
    for (;;) {
        size_t want = sizeof buf - have;
        if (total + have + want > DIGEST_LIMIT) want = (size_t)(DIGEST_LIMIT - total - have);
        if (want == 0 && have < 64) break;
        ssize_t n = want ? pread(fd, buf + have, want, (off_t)(total + have)) : 0;
        if (n < 0) return 0;
        have += (size_t)n;
        size_t whole = have / 64 * 64;
        for (size_t i = 0; i < whole; i += 64) sha_block(h, buf + i);
        total += whole;
        memmove(buf, buf + whole, have - whole);
        have -= whole;
        if (n == 0) break;
    }
    unsigned long long bits = (total + have) * 8;
    if (bits == 0) return 0;
    buf[have++] = 0x80;
    if (have > 56) { memset(buf + have, 0, 64 - have); sha_block(h, buf); have = 0; }
    memset(buf + have, 0, 56 - have);
    for (int i = 0; i < 8; i++) buf[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    sha_block(h, buf);
    for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", h[i]);
    return bits / 8;
}

/* DT_SONAME of the 64-bit little-endian ELF file open as FD, into OUT (empty: none read).
 * Read from the bytes themselves, for a file that has no name on disk (a memfd, a file
 * removed since): the harness can read nothing of it once the process is gone. */
static void soname_of(int fd, char *out, size_t size) {
    out[0] = 0;
    unsigned char eh[64];
    if (pread(fd, eh, sizeof eh, 0) != (ssize_t)sizeof eh || memcmp(eh, "\177ELF", 4) != 0 || eh[4] != 2 || eh[5] != 1)
        return;
    unsigned long long phoff;
    unsigned short phentsize, phnum;
    memcpy(&phoff, eh + 0x20, 8);
    memcpy(&phentsize, eh + 0x36, 2);
    memcpy(&phnum, eh + 0x38, 2);
    if (phentsize < 56 || phnum == 0 || phnum > 256) return;
    unsigned long long dyn_off = 0, dyn_size = 0, load_vaddr[16], load_off[16], load_size[16];
    int loads = 0;
    for (unsigned i = 0; i < phnum; i++) {
        unsigned char ph[56];
        if (pread(fd, ph, sizeof ph, (off_t)(phoff + (unsigned long long)i * phentsize)) != (ssize_t)sizeof ph) return;
        unsigned int type;
        unsigned long long off, vaddr, filesz;
        memcpy(&type, ph, 4);
        memcpy(&off, ph + 8, 8);
        memcpy(&vaddr, ph + 16, 8);
        memcpy(&filesz, ph + 32, 8);
        if (type == 2) { dyn_off = off; dyn_size = filesz; }
        else if (type == 1 && loads < 16) { load_vaddr[loads] = vaddr; load_off[loads] = off; load_size[loads] = filesz; loads++; }
    }
    unsigned long long strtab = 0, soname = (unsigned long long)-1;
    for (unsigned long long at = 0; at + 16 <= dyn_size && at < (1u << 20); at += 16) {
        long long tag;
        unsigned long long val;
        unsigned char d[16];
        if (pread(fd, d, sizeof d, (off_t)(dyn_off + at)) != (ssize_t)sizeof d) return;
        memcpy(&tag, d, 8);
        memcpy(&val, d + 8, 8);
        if (tag == 0) break;
        if (tag == 5) strtab = val;       /* DT_STRTAB (an address) */
        else if (tag == 14) soname = val; /* DT_SONAME (an offset in it) */
    }
    if (soname == (unsigned long long)-1) return;
    for (int i = 0; i < loads; i++)
        if (strtab >= load_vaddr[i] && strtab < load_vaddr[i] + load_size[i]) {
            ssize_t n = pread(fd, out, size - 1, (off_t)(strtab - load_vaddr[i] + load_off[i] + soname));
            if (n <= 0) { out[0] = 0; return; }
            out[n] = 0;
            for (char *c = out; *c; c++)
                if ((unsigned char)*c < 0x21 || *c == 0x7f) { out[0] = 0; return; }  /* a name, or nothing */
            return;
        }
}

/* A descriptor of PID's open on the file (MAJ:MNR, INO), found among /proc/PID/fd, into LINK:
 * the way to a nameless file's bytes where /proc/PID/map_files is closed (it asks for
 * CAP_SYS_ADMIN).  0: none. */
static int fd_link_of(pid_t pid, unsigned int maj, unsigned int mnr, unsigned long long ino, char *link, size_t size) {
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int found = 0;
    while (!found && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(link, size, "%s/%s", dir, e->d_name);
        struct stat st;
        found = stat(link, &st) == 0 && S_ISREG(st.st_mode) && st.st_ino == ino &&
                major(st.st_dev) == maj && minor(st.st_dev) == mnr;
    }
    closedir(d);
    return found;
}

/* A file PID maps executable, at the moment it does (its mmap, or the mprotect that adds
 * PROT_EXEC): written as an "M" line.  A file with no name on disk (a memfd, a removed file)
 * is read then, through LINK (a /proc link to the open file; NULL: looked for among the
 * process's descriptors): its SONAME ("s") and the SHA-256 of its bytes ("h"). */
static void exec_file_seen(pid_t pid, unsigned int maj, unsigned int mnr, unsigned long long ino, char *path,
                           const char *link) {
    for (char *c = path; *c; c++) if (*c == '\n' || *c == '\t') *c = '?';
    unsigned long long dev = ((unsigned long long)maj << 20) | mnr;  /* the kernel's MKDEV */
    /* Its own line ("M") and its own entries in the table (-pid): the maps read later still
     * list every object in their order, and those lines alone keep the record's order as it
     * was; what only this stop saw (unloaded since, a memfd) comes after them. */
    if (seen_before(-(int)pid, dev, ino, path)) return;
    out_line("M\t%d\t%02x:%02x\t%llu\t%s\n", (int)pid, maj, mnr, ino, path);
    size_t len = strlen(path);
    if (len <= 10 || strcmp(path + len - 10, " (deleted)") != 0) return;
    char found[320];
    if (!link) {
        if (!fd_link_of(pid, maj, mnr, ino, found, sizeof found)) return;
        link = found;
    }
    /* Reopened without waiting (O_NONBLOCK), and read only where it is the same regular file. */
    int rfd = open(link, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (rfd < 0 && link != found && fd_link_of(pid, maj, mnr, ino, found, sizeof found))
        rfd = open(found, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (rfd < 0) return;
    struct stat st;
    if (fstat(rfd, &st) == 0 && S_ISREG(st.st_mode) && st.st_ino == ino && major(st.st_dev) == maj &&
        minor(st.st_dev) == mnr) {
        char so[256], digest[65];
        soname_of(rfd, so, sizeof so);
        if (so[0]) out_line("s\t%02x:%02x\t%llu\t%s\n", maj, mnr, ino, so);
        unsigned long long n = sha256_of(rfd, digest);
        if (n) out_line("h\t%02x:%02x\t%llu\t%s\t%llu\n", maj, mnr, ino, digest, n);
    }
    close(rfd);
}

/* The file PID is about to map executable (the mmap's descriptor, read at the call's entry
 * while the process waits). */
static void mapping_made(pid_t pid) {
#ifdef PTRACE_GET_SYSCALL_INFO
    struct __ptrace_syscall_info info;
    memset(&info, 0, sizeof info);
    if (ptrace(PTRACE_GET_SYSCALL_INFO, pid, (void *)sizeof info, &info) <= 0 || info.op != PTRACE_SYSCALL_INFO_SECCOMP)
        return;
    int fd = (int)info.seccomp.args[4];
    char name[64], path[4096];
    snprintf(name, sizeof name, "/proc/%d/fd/%d", (int)pid, fd);
    struct stat st;
    ssize_t n = readlink(name, path, sizeof path - 1);
    if (n <= 0 || stat(name, &st) != 0) return;  /* stat of the link: the open file itself, no path walked */
    path[n] = 0;
    exec_file_seen(pid, major(st.st_dev), minor(st.st_dev), (unsigned long long)st.st_ino, path, name);
#else
    (void)pid;
#endif
}

/* PID is about to make [addr, addr+len) executable (mprotect or pkey_mprotect with
 * PROT_EXEC, read at the call's entry): each file mapped in that range is written as if
 * mapped executable now.  Anonymous memory (a JIT's code) is most of these calls: the maps
 * are read only up to the range's end, and nothing else is done for it. */
static void protection_made(pid_t pid) {
#ifdef PTRACE_GET_SYSCALL_INFO
    struct __ptrace_syscall_info info;
    memset(&info, 0, sizeof info);
    if (ptrace(PTRACE_GET_SYSCALL_INFO, pid, (void *)sizeof info, &info) <= 0 || info.op != PTRACE_SYSCALL_INFO_SECCOMP)
        return;
    unsigned long long lo = info.seccomp.args[0], hi = lo + info.seccomp.args[1];
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(name, "re");
    if (!f) return;
    static char buf[1 << 17];
    setvbuf(f, buf, _IOFBF, sizeof buf);
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        unsigned long long start, end, ino;
        unsigned int maj, mnr;
        int at = 0;
        if (sscanf(line, "%llx-%llx %*s %*s %x:%x %llu %n", &start, &end, &maj, &mnr, &ino, &at) < 5 || at == 0)
            continue;
        if (start >= hi) break;  /* the maps are in address order */
        if (end <= lo || ino == 0) continue;  /* before the range; anonymous */
        char *path = line + at;
        while (*path == ' ') path++;
        size_t n = strlen(path);
        if (n && path[n - 1] == '\n') path[--n] = 0;
        if (!n || path[0] != '/') continue;
        char link[96];
        snprintf(link, sizeof link, "/proc/%d/map_files/%llx-%llx", (int)pid, start, end);
        exec_file_seen(pid, maj, mnr, ino, path, link);
    }
    fclose(f);
#else
    (void)pid;
#endif
}

/* A process of another ABI (a 32-bit program; x32) stops the tracer at each of its system
 * calls (the filter cannot tell its numbers apart): its clone with CLONE_UNTRACED, or its
 * clone3, would make a process no tracer hears of.  The process is killed at that stop
 * (the call never runs) and the attempt is written as a "u" line.  1: killed. */
static int refused_other_abi(pid_t pid, unsigned int native) {
#ifdef PTRACE_GET_SYSCALL_INFO
    struct __ptrace_syscall_info info;
    memset(&info, 0, sizeof info);
    if (ptrace(PTRACE_GET_SYSCALL_INFO, pid, (void *)sizeof info, &info) <= 0 || info.op != PTRACE_SYSCALL_INFO_SECCOMP)
        return 0;
    unsigned long long nr = info.seccomp.nr, flags = info.seccomp.args[0];
    int clone = 0, clone3 = 0;
#if defined(__x86_64__)
    if (info.arch == AUDIT_ARCH_I386) { clone = nr == 120; clone3 = nr == 435; }
    else if (info.arch == native && nr >= 0x40000000) { clone = nr == 0x40000000 + 56; clone3 = nr == 0x40000000 + 435; }
#else
    (void)native; (void)nr;
#endif
    if (!(clone3 || (clone && (flags & CLONE_UNTRACED)))) return 0;
    kill(pid, SIGKILL);  /* a pending SIGKILL: the call is skipped when the stop ends */
    out_line("u\t%d\t%s of another ABI: the process was killed\n", (int)pid,
             clone3 ? "clone3" : "clone with CLONE_UNTRACED");
    return 1;
#else
    (void)pid; (void)native;
    return 0;
#endif
}

/* The filter every traced process carries: execve and execveat stop in the tracer first
 * (SECCOMP_RET_TRACE), while the old image is still mapped.  Another ABI's system calls
 * (a 32-bit program on a 64-bit kernel) all ask the tracer: its numbers differ. */
static int install_exec_filter(void) {
#if defined(__x86_64__)
    const unsigned int arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
    const unsigned int arch = AUDIT_ARCH_AARCH64;
#else
    const unsigned int arch = 0;
#endif
    if (arch == 0) { errno = ENOSYS; return -1; }
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#if defined(__x86_64__)
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1),  /* x32 */
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
#endif
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_execve, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_execveat, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE),
        /* clone3 passes its flags in memory, which a filter cannot read: "not implemented",
         * and the C library falls back to clone (glibc since 2.34, as under docker's default
         * profile), whose flags it can. */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        /* CLONE_UNTRACED makes a process no tracer is told of (no clone event, no exit stop):
         * refused, so that every process of the tree is traced from its first instruction. */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),  /* the flags' low word */
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_UNTRACED, 0, 7),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        /* A file mapped executable (prot has PROT_EXEC, fd is not -1) asks the tracer first,
         * which records the file then: a library unloaded before any maps are read is on the
         * record too.  Anonymous executable memory (a JIT's) stops nothing; any other call
         * goes on to the mprotect check. */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 0, 6),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[4])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffffu, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE | MMAP_EXEC),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* A mapping made executable later (mprotect, pkey_mprotect adding PROT_EXEC: a file
         * mapped as data, then its text made executable) asks the tracer too; any other
         * mprotect, and every call but these, stops nothing. */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_pkey_mprotect, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[2])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRACE | MPROTECT_EXEC),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog fprog = {(unsigned short)(sizeof prog / sizeof prog[0]), prog};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog);
}

/* The traced program's side before its exec: wait until the tracer has seized it (one byte,
 * or EOF: tracing was refused), then put the exec filter in place where it is traced. */
static void traced_child_setup(int go_fd) {
    char c = 0;
    ssize_t n;
    do n = read(go_fd, &c, 1); while (n < 0 && errno == EINTR);
    close(go_fd);
    if (n == 1 && c == 'T' && install_exec_filter() != 0)
        out_line("n\texec filter refused (%s): images before an execve are read at exit only\n", strerror(errno));
    out_flush();
}

/* No PTRACE_O_TRACEEXEC: under PTRACE_SEIZE an exec then stops nothing, and every stop costs
 * the traced process a round trip through this one (on a busy machine, a wait for a CPU).
 * The seccomp stop before each execve and the exit stop see everything an exec stop did. */
static int options = PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACECLONE |
                     PTRACE_O_TRACEEXIT | PTRACE_O_TRACESECCOMP;

/* The process PID is a thread of (its thread group's id); -1 where it is gone. */
static long tgid_of(pid_t pid) {
    char name[64], line[256];
    snprintf(name, sizeof name, "/proc/%d/status", (int)pid);
    FILE *f = fopen(name, "re");
    if (!f) return -1;
    long tgid = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Tgid:", 5)) { tgid = atol(line + 5); break; }
    fclose(f);
    return tgid;
}

/* Whether PID is a thread (not the first) of a process whose first thread still runs. */
static int sibling_of_live_leader(pid_t pid) {
    char name[64], line[256];
    snprintf(name, sizeof name, "/proc/%d/status", (int)pid);
    FILE *f = fopen(name, "re");
    if (!f) return 0;
    long tgid = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "Tgid:", 5)) { tgid = atol(line + 5); break; }
    fclose(f);
    if (tgid <= 0 || tgid == pid) return 0;
    snprintf(name, sizeof name, "/proc/%ld/stat", tgid);
    f = fopen(name, "re");
    if (!f) return 0;
    char state = 'X';
    if (fgets(line, sizeof line, f)) {
        char *close = strrchr(line, ')');
        if (close && close[1] == ' ') state = close[2];
    }
    fclose(f);
    return state != 'Z' && state != 'X';  /* a zombie leader's threads carry the address space on */
}

/* The traced processes alive (some slots 0): read once more when the leader ends. */
#define MAX_LIVE 65536
static pid_t live[MAX_LIVE];
static int n_live;

static int live_lost;  /* a process past MAX_LIVE: not killed when the leader's grace ends */

static void live_add(pid_t pid) {
    for (int i = 0; i < n_live; i++) if (live[i] == pid) return;
    for (int i = 0; i < n_live; i++) if (live[i] == 0) { live[i] = pid; return; }
    if (n_live < MAX_LIVE) live[n_live++] = pid;
    else live_lost = 1;
}

/* After the leader ends, what it left runs on, traced, for LEFT_GRACE_MS (the harness gave
 * such processes as long before it killed them); then it is killed, and followed to its end. */
#define LEFT_GRACE_MS 500
static volatile sig_atomic_t grace_over;
static void on_grace_alarm(int sig) { (void)sig; grace_over = 1; }

static void start_grace(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_grace_alarm;  /* no SA_RESTART: waitpid returns EINTR */
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval t;
    memset(&t, 0, sizeof t);
    t.it_value.tv_usec = LEFT_GRACE_MS * 1000;
    setitimer(ITIMER_REAL, &t, NULL);
}

static void live_drop(pid_t pid) {
    for (int i = 0; i < n_live; i++) if (live[i] == pid) live[i] = 0;
}

/* What is known of a traced pid: an execve it entered (the image it had then, by hash: the
 * new one is written at its next stop), and whether it may be a thread (a clone event made
 * it; fork and vfork make processes).  Open addressing; a full table only costs reads. */
#define PID_SLOTS 8192
static struct pid_note { pid_t pid; unsigned char exec_pending, maybe_thread; unsigned long old_exe; } notes[PID_SLOTS];

static struct pid_note *note_of(pid_t pid, int create) {
    unsigned long k = ((unsigned long)pid * 2654435761UL) % PID_SLOTS;
    for (int probes = 0; probes < 64; probes++, k = (k + 1) % PID_SLOTS) {
        if (notes[k].pid == pid) return &notes[k];
        if (notes[k].pid == 0) {
            if (!create) return NULL;
            memset(&notes[k], 0, sizeof notes[k]);
            notes[k].pid = pid;
            return &notes[k];
        }
    }
    return NULL;
}

static unsigned long hash_text(const char *t) {
    unsigned long h = 1469598103934665603UL;
    for (; *t; t++) h = (h ^ (unsigned char)*t) * 1099511628211UL;
    return h;
}

/* The "e" line of an execve PID entered, now that it stopped again: written where its image
 * changed (an execve that failed leaves it as it was). */
static void exec_done(pid_t pid, const char *exe) {
    struct pid_note *n = note_of(pid, 0);
    if (!n || !n->exec_pending) return;
    n->exec_pending = 0;
    if (hash_text(exe) != n->old_exe) out_line("e\t%d\t%s\n", (int)pid, exe);
}

/* --trace-record: kill what the leader left and wait until no traced process is left, so that
 * none is alive when the record is written (a child forked meanwhile is attached, and killed). */
static void drain_tree(void) {
    for (int i = 0; i < n_live; i++)
        if (live[i] > 0) kill(live[i], SIGKILL);
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, __WALL);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;  /* ECHILD: not one traced process is left */
        }
        if (WIFSTOPPED(st)) {
            if (((unsigned)st >> 16) != PTRACE_EVENT_EXIT) kill(pid, SIGKILL);
            ptrace(PTRACE_CONT, pid, 0, 0);
        }
    }
}

/* --trace-record: each path the audit log says was opened, resolved in the container ("r"
 * lines, then "c"), so that the harness can match it to what the kernel names.  Nothing of
 * the cell is alive: the file system is as the cell left it. */
#define LOG_MAX (4u << 20)
#define CLAIMS_MAX 8192
static char *audit_log;

static void resolve_claims(void) {
    if (!audit_log) return;
    int fd = open(audit_log, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return;
    struct stat st;
    char *text = NULL;
    size_t len = 0;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (text = malloc(LOG_MAX + 1)) != NULL) {
        ssize_t n;
        while (len < LOG_MAX && ((n = read(fd, text + len, LOG_MAX - len)) > 0 || (n < 0 && errno == EINTR)))
            if (n > 0) len += (size_t)n;
    }
    close(fd);
    if (!text) return;
    text[len] = 0;
    int count = 0;
    char real[PATH_MAX];
    for (char *line = text, *next; line && *line && count < CLAIMS_MAX; line = next) {
        next = strchr(line, '\n');
        if (!next) break;  /* a torn last line */
        *next++ = 0;
        if (strncmp(line, "o\t", 2) != 0) continue;
        char *path = strrchr(line, '\t');
        if (!path || path[1] != '/') continue;
        path++;
        if (!realpath(path, real) || strcmp(real, path) == 0 || strpbrk(real, "\t\n")) continue;
        out_line("r\t%s\t%s\n", path, real);
        count++;
    }
    free(text);
    out_line("c\t%d\n", count);
}

/* Trace the tree rooted at LEADER until the leader ends; its wait status. */
static int trace_tree(pid_t leader) {
#if defined(__x86_64__)
    const unsigned int native_arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
    const unsigned int native_arch = AUDIT_ARCH_AARCH64;
#else
    const unsigned int native_arch = 0;
#endif
    int leader_status = -1, leader_execd = 0, leader_gone = 0, killed = 0;
    char exe[4096];
    for (;;) {
        if (grace_over && !killed) {
            /* What the leader left has had its time: killed, each still followed to its exit. */
            killed = 1;
            for (int i = 0; i < n_live; i++)
                if (live[i] > 0) kill(live[i], SIGKILL);
        }
        int st;
        pid_t pid = waitpid(-1, &st, __WALL);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;  /* ECHILD: not one traced process is left */
        }
        if (WIFEXITED(st) || WIFSIGNALED(st)) {
            live_drop(pid);
            struct pid_note *gone = note_of(pid, 0);
            if (gone) gone->exec_pending = gone->maybe_thread = 0;  /* the pid may come back as another */
            if (pid == leader) {
                leader_status = st;
                leader_gone = 1;
                /* What it left is read now (it may be killed before its own exit is seen
                 * whole), then followed until it ends. */
                int left = 0;
                for (int i = 0; i < n_live; i++)
                    if (live[i] > 0) {
                        exe_of(live[i], exe, sizeof exe);
                        exec_done(live[i], exe);  /* an image it exec'd since its last stop */
                        snapshot(live[i]);
                        left += tgid_of(live[i]) == live[i];
                    }
                out_line("l\t%d\t%d\n", st, left);
                out_flush();
                if (record_mode) grace_over = 1;  /* a container's tracer kills them at once, as before */
                else start_grace();
            }
            continue;
        }
        live_add(pid);
        if (!WIFSTOPPED(st)) continue;
        int sig = WSTOPSIG(st), event = (unsigned)st >> 16, deliver = 0;
        unsigned long msg = EXEC_STOP;
        /* Once what the leader left has been killed, a process attached since (a fork's child
         * whose first stop came after that round) is killed too, at its first stop. */
        if (killed && event != PTRACE_EVENT_EXIT) kill(pid, SIGKILL);
        if (event == PTRACE_EVENT_EXIT) {
            unsigned long how = 0;
            ptrace(PTRACE_GETEVENTMSG, pid, 0, &how);
            exe_of(pid, exe, sizeof exe);
            exec_done(pid, exe);
            /* A thread shares its process's address space: read it only where no other thread
             * of the process will (the group leader is gone), not at each of a CUDA program's
             * threads' exits.  A pid no clone event made is a process: nothing to ask. */
            struct pid_note *n = note_of(pid, 0);
            if (!(n && n->maybe_thread && sibling_of_live_leader(pid))) snapshot(pid);
            out_line("x\t%d\t%lu\t%s\n", (int)pid, how, exe);
        } else if (event == PTRACE_EVENT_SECCOMP && (ptrace(PTRACE_GETEVENTMSG, pid, 0, &msg), msg == MMAP_EXEC)) {
            mapping_made(pid);
        } else if (event == PTRACE_EVENT_SECCOMP && msg == MPROTECT_EXEC) {
            protection_made(pid);
        } else if (event == PTRACE_EVENT_SECCOMP && refused_other_abi(pid, native_arch)) {
            /* killed: its exit stop follows */
        } else if (event == PTRACE_EVENT_SECCOMP) {
            /* An execve's entry: the old image's last moment (the leader's first is this
             * program's own code, nothing of the cell's).  The new image is written at the
             * process's next stop: another execve, or its exit (which comes even after SIGKILL). */
            exe_of(pid, exe, sizeof exe);
            exec_done(pid, exe);
            if (pid != leader || leader_execd) snapshot(pid);
            leader_execd |= pid == leader;
            struct pid_note *n = note_of(pid, 1);
            if (n) { n->exec_pending = 1; n->old_exe = hash_text(exe); }
        } else if (event == PTRACE_EVENT_CLONE) {
            unsigned long tid = 0;
            if (ptrace(PTRACE_GETEVENTMSG, pid, 0, &tid) == 0) {
                struct pid_note *n = note_of((pid_t)tid, 1);
                if (n) n->maybe_thread = 1;
            }
        } else if (event == PTRACE_EVENT_STOP) {
            if (sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU) {
                ptrace(PTRACE_LISTEN, pid, 0, 0);  /* a group stop: stay stopped until SIGCONT */
                continue;
            }
        } else if (event == 0) {
            deliver = sig;  /* a signal on its way to the process: let it through */
        }
        ptrace(PTRACE_CONT, pid, 0, deliver);
        if (out_len > sizeof out_buf / 2) out_flush();
    }
    /* Every traced process has ended (waitpid: no child, no tracee left). */
    if (!leader_gone) return -1;
    if (live_lost)
        out_line("n\tmore processes than the tracer follows (%d): some were not killed when the leader's grace ended\n", MAX_LIVE);
    if (record_mode) {
        drain_tree();  /* nothing is left; kept for a tracee the kernel still reports */
        resolve_claims();
    }
    out_line("z\t%d\n", leader_status);
    out_flush();
    return leader_status;
}

/* --trace-record: the record, between the secret's lines, on stderr (nothing traced is alive). */
static void emit_record(void) {
    if (!record_mode) return;
    out_flush();
    char line[256];
    int k = snprintf(line, sizeof line, "\n\036cumatrix-trace %s begin\n", secret);
    write_all(2, line, (size_t)k);
    if (record_len) write_all(2, record, record_len);
    k = snprintf(line, sizeof line, "\036cumatrix-trace %s end\n", secret);
    write_all(2, line, (size_t)k);
}

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
 * Then this process forks the program's process, which leaves root (uid and gid SERVE_UID in
 * a user namespace of its own whose only id is the cell's host uid, no groups, no capability in
 * any set, no_new_privs, a session keyring of its own), and waits as its init: it ends as the
 * program ended (128+N for a signal N, as bubblewrap reports it); its end ends the namespace
 * and every process left in it. */


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

static int write_text(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n;
    int err = errno;
    close(fd);
    errno = err;
    return ok ? 0 : -1;
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

static int cell_init(char *limits, char **argv) {
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
    if (serve_hold_fd >= 0) {
        /* A held cell: its sandbox is ready; the program starts when the harness says so (the
         * cell before it has ended).  EOF, or anything but the word: the cell was dropped. */
        char word = 0;
        ssize_t n;
        do n = read(serve_hold_fd, &word, 1); while (n < 0 && errno == EINTR);
        close(serve_hold_fd);
        if (n != 1 || word != 'g') return 125;
    }
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
        _exit(run_program(limits, argv));
    }
    for (;;) {  /* the namespace's init: reaps what is orphaned, ends with the program */
        int st;
        pid_t got = waitpid(-1, &st, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return fail("waitpid", "program");
        if (got != program) continue;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
}

/* The program's wait status (untraced: ptrace was refused); -1 on failure. */
static int mirror_status(pid_t pid) {
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return status;
}

static int traced_main(int fd, int argc, char **argv) {
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
    if (ptrace(PTRACE_SEIZE, pid, 0, (void *)(long)options) != 0) {
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

static int serve(int sock, pid_t parent, const char *how) {
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

int main(int argc, char **argv) {
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
