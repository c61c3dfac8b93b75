#include "spawn_common.h"
#include "spawn_files.h"
#include "spawn_record.h"
#include "spawn_trace.h"

/* ------------------------------------------------------------------ the tracer (--trace) */

/* The kernel's PROCMAP_QUERY (Linux 6.11): one VMA of a process at a time, by address, with its
 * permissions, device, inode and path; its struct is the kernel's ABI (uapi/linux/fs.h), named
 * here for the C libraries whose headers predate it. */
struct maps_query {
    unsigned long long size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size,
        vma_offset, inode;
    unsigned int dev_major, dev_minor, vma_name_size, build_id_size;
    unsigned long long vma_name_addr, build_id_addr;
};
#define MAPS_QUERY _IOWR('f', 17, struct maps_query)
#define MAPS_QUERY_EXECUTABLE 0x04
#define MAPS_QUERY_COVERING_OR_NEXT 0x10
#define MAPS_QUERY_FILE_BACKED 0x20

/* One executable mapping's line, unless (pid, file) was written already: PATH as the text of
 * /proc/PID/maps shows it (a newline in a file's name as \012). */
static void mapped_line(pid_t pid, unsigned int major, unsigned int minor, unsigned long long ino, const char *path) {
    if (!path[0] || path[0] == '[' || (ino == 0 && path[0] != '/')) return;
    unsigned long long dev = ((unsigned long long)major << 20) | minor;  /* the kernel's MKDEV */
    if (seen_before((int)pid, dev, ino, path)) return;
    out_line("m\t%d\t%02x:%02x\t%llu\t%s\n", (int)pid, major, minor, ino, path);
}

static int no_maps_query;  /* the kernel has no PROCMAP_QUERY: the text is read */

/* snapshot() by PROCMAP_QUERY: the kernel is asked for each executable file-backed mapping
 * alone, no text made for the rest (a small Python process maps tens of areas, a handful of
 * them code; a CUDA program thousands).  0: done (the process may have ended meanwhile); -1:
 * read the text. */
static int snapshot_by_query(int fd, pid_t pid) {
    static char name[PATH_MAX], shown[4 * PATH_MAX];
    unsigned long long addr = 0;
    for (;;) {
        struct maps_query q;
        memset(&q, 0, sizeof q);
        q.size = sizeof q;
        q.query_flags = MAPS_QUERY_COVERING_OR_NEXT | MAPS_QUERY_EXECUTABLE | MAPS_QUERY_FILE_BACKED;
        q.query_addr = addr;
        q.vma_name_addr = (unsigned long long)(uintptr_t)name;
        q.vma_name_size = sizeof name;
        if (ioctl(fd, MAPS_QUERY, &q) != 0) {
            if (errno == ENOENT || errno == ESRCH) return 0;  /* no mapping past ADDR; the process is gone */
            if (errno == ENOTTY || errno == EINVAL) no_maps_query = 1;
            return -1;
        }
        if (q.vma_end <= addr) return -1;  /* never: the next area starts past the last */
        addr = q.vma_end;
        name[sizeof name - 1] = 0;
        if (!q.vma_name_size) name[0] = 0;
        size_t k = 0;
        for (const char *c = name; *c && k + 5 < sizeof shown; c++) {
            if (*c == '\n') { memcpy(shown + k, "\\012", 4); k += 4; }
            else shown[k++] = *c;
        }
        shown[k] = 0;
        mapped_line(pid, q.dev_major, q.dev_minor, q.inode, shown);
    }
}

/* Every file PID mapped executable (anonymous memory, [heap], [stack], the vDSO left out):
 * a file mapped as data (mmap PROT_READ of a runtime, a font, a locale archive) was not
 * loaded and never ran, so it is not what the process used. */
static void snapshot(pid_t pid) {
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/maps", (int)pid);
    int fd = open(name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    if (!no_maps_query && snapshot_by_query(fd, pid) == 0) {
        close(fd);
        return;
    }
    FILE *f = fdopen(fd, "re");
    if (!f) {
        close(fd);
        return;
    }
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
        mapped_line(pid, major, minor, ino, path);
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

/* No PTRACE_O_TRACEEXEC: under PTRACE_SEIZE an exec then stops nothing, and every stop costs
 * the traced process a round trip through this one (on a busy machine, a wait for a CPU).
 * The seccomp stop before each execve and the exit stop see everything an exec stop did. */
int trace_options = PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACECLONE |
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
static struct pid_note {
    pid_t pid;
    unsigned char exec_pending, maybe_thread, helper_image;
    unsigned long old_exe;
} notes[PID_SLOTS];

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
    if (hash_text(exe) == n->old_exe) return;  /* the execve failed: the image is the one it had */
    n->helper_image = 0;
    out_line("e\t%d\t%s\n", (int)pid, exe);
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
char *audit_log;

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
int trace_tree(pid_t leader) {
    const unsigned int native_arch = NATIVE_AUDIT_ARCH;
    int leader_status = -1, leader_execd = 0, leader_gone = 0, killed = 0, leader_stops_at_exit = 1;
    char exe[4096], leader_exe[4096] = "";
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
            if (gone) gone->exec_pending = gone->maybe_thread = gone->helper_image = 0;  /* the pid may come back */
            if (pid == leader) {
                leader_status = st;
                leader_gone = 1;
                if (!leader_stops_at_exit) out_line("x\t%d\t%d\t%s\n", (int)pid, st, leader_exe);
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
            /* The leader that never exec'd (a served cell's init) is this program's own image,
             * nothing of the cell's: the process it forked read the same before its exec. */
            int own_image = (pid == leader && !leader_execd) || (n && n->helper_image);
            if (!own_image && !(n && n->maybe_thread && sibling_of_live_leader(pid))) snapshot(pid);
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
            struct pid_note *n = note_of(pid, 1);
            if ((pid != leader || leader_execd) && !(n && n->helper_image)) snapshot(pid);
            leader_execd |= pid == leader;
            if (n) { n->exec_pending = 1; n->old_exe = hash_text(exe); }
        } else if (pid == leader && !leader_execd && (event == PTRACE_EVENT_FORK || event == PTRACE_EVENT_VFORK)) {
            /* A served cell's init forking its program: the program took its options with it;
             * the init's own exit needs no stop (its image is this program's, nothing to read):
             * its "x" line is written from its wait status. */
            exe_of(pid, leader_exe, sizeof leader_exe);
            unsigned long child = 0;  /* the program's process, this program's image until its exec */
            struct pid_note *n = ptrace(PTRACE_GETEVENTMSG, pid, 0, &child) == 0 ? note_of((pid_t)child, 1) : NULL;
            if (n) n->helper_image = 1;
            if (ptrace(PTRACE_SETOPTIONS, pid, 0, (void *)(long)(trace_options & ~PTRACE_O_TRACEEXIT)) == 0)
                leader_stops_at_exit = 0;
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
        out_flush_if_half();
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
