/* cumatrix rtld-audit library: observe (and optionally steer) what a process tree maps.
 *
 * Loaded through LD_AUDIT (see rtld-audit(7)); LD_AUDIT is inherited, so every process
 * of a cell's tree runs it.  Configured by the environment, read once in la_version:
 *
 *   CUMATRIX_AUDIT_LOG      file to append one line per event to (without it the
 *                           library does nothing).
 *   CUMATRIX_AUDIT_ENFORCE  SONAME=PATH[:SONAME=PATH...]: a request for a library whose
 *                           base name is SONAME (by name, or by an absolute path such as
 *                           a bundled copy's) is answered with PATH.  Unset: observe only.
 *
 * Why la_objsearch and not LD_PRELOAD: the loader reuses an already-loaded SONAME only
 * for requests by that bare name; a dlopen of a bundled copy by absolute path (how
 * torch, CuPy and JAX find the runtime their wheels carry) would map a second runtime.
 * la_objsearch sees every request first, whatever its form.
 *
 * Lines (tab-separated; the path is last so it may hold anything but a newline):
 *   o <pid> <soname> <path>         an object was mapped (la_objopen); soname may be empty
 *   r <pid> <requested> <path>      a request was answered with PATH (la_objsearch)
 *   q <pid> <requester> <name>      a CUDA library (libcu*, libnv*, libnccl*, libnpp*) was
 *                                   requested by NAME on behalf of the object REQUESTER
 *                                   (its path; empty: the main program)
 *   s <pid> <step> <path>           the loader tried PATH for that request, found through
 *                                   STEP: rpath (DT_RPATH/DT_RUNPATH), ld_library_path,
 *                                   ld.so.cache, default, secure
 *
 * The q and s lines say how the loader found a CUDA library: the o line that follows names
 * the candidate that opened.  Only CUDA names are followed: a Python process requests
 * thousands of objects, and tracing each search step of each would cost more than the cell.
 *
 * Each line is one write(2) on an O_APPEND descriptor: lines of concurrent processes do
 * not interleave, and a process that crashes has already left every line it wrote.
 *
 * No C library: an audit library is loaded into a link-map namespace of its own, where every
 * library it needs is loaded again, a second libc (about 0.2 ms of every process's start).
 * On x86-64 and AArch64 it is built with -nostdlib and makes its few system calls itself
 * (openat, write, fstat, getpid); its environment is the one the loader hands its
 * constructor (argc, argv, envp, as glibc calls every constructor).  So it also loads under
 * any glibc of the same architecture (a container's too).  Elsewhere it calls syscall(2).
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#if defined(__x86_64__)
static long sys4(long n, long a, long b, long c, long d) {
    long r;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}
#elif defined(__aarch64__)
static long sys4(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory", "cc");
    return x0;
}
#else
#include <unistd.h>
static long sys4(long n, long a, long b, long c, long d) {
    long r = syscall(n, a, b, c, d);
    return r < 0 ? -errno : r;
}
#endif

/* The string functions it needs, its own. */
static size_t slen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}
static int scmp(const char *a, const char *b) {
    while (*a && *a == *b) { a++; b++; }
    return (unsigned char)*a - (unsigned char)*b;
}
static char *schr(const char *s, int c) {
    for (;; s++) {
        if (*s == (char)c) return (char *)s;
        if (!*s) return NULL;
    }
}
static char *srchr(const char *s, int c) {
    const char *last = NULL;
    for (;; s++) {
        if (*s == (char)c) last = s;
        if (!*s) return (char *)last;
    }
}

/* The process's environment, as the loader hands it to this library's constructor. */
static char **environment;
__attribute__((constructor)) static void take_environment(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    environment = envp;
}
static const char *env(const char *name) {
    size_t n = slen(name);
    for (char **e = environment; e && *e; e++) {
        size_t i = 0;
        while (i < n && (*e)[i] == name[i]) i++;
        if (i == n && (*e)[n] == '=') return *e + n + 1;
    }
    return NULL;
}

#define MAX_RULES 16
#define LINE_BYTES 4096

static int log_fd = -1;
static const char *log_path;
static dev_t log_dev;
static ino_t log_ino;
static pid_t pid_cached;
static char pid_text[24];
static int n_rules;
static const char *rule_soname[MAX_RULES];
static const char *rule_path[MAX_RULES];
/* The rules point into this copy of CUMATRIX_AUDIT_ENFORCE. */
static char enforce_buf[8192];
/* Whether the request being searched in this process is a CUDA library (its steps are
 * logged).  The loader holds its lock through a search, so one request at a time. */
static int tracing;

static void refresh_pid(void) {
    pid_t now = (pid_t)sys4(SYS_getpid, 0, 0, 0, 0);
    if (now == pid_cached && pid_text[0]) return;  /* a forked child has another pid */
    pid_cached = now;
    char tmp[24];
    int n = 0;
    unsigned long v = (unsigned long)now;
    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v && n < 23);
    for (int i = 0; i < n; i++) pid_text[i] = tmp[n - 1 - i];
    pid_text[n] = 0;
}

static size_t put(char *buf, size_t at, const char *s) {
    while (*s && at < LINE_BYTES - 4) buf[at++] = *s++;  /* room for separators and \n */
    return at;
}

static int same_file(int fd) {
    struct stat st;
    if (sys4(SYS_fstat, fd, (long)&st, 0, 0) != 0) return 0;
    return st.st_dev == log_dev && st.st_ino == log_ino;
}

static void open_log(void) {
    long fd = sys4(SYS_openat, AT_FDCWD, (long)log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    log_fd = fd < 0 ? -1 : (int)fd;
    struct stat st;
    if (log_fd >= 0 && sys4(SYS_fstat, log_fd, (long)&st, 0, 0) == 0) {
        log_dev = st.st_dev;
        log_ino = st.st_ino;
    }
}

static void emit(char kind, const char *a, const char *path) {
    if (log_path == NULL) return;
    /* A program may close every descriptor and open its own files (daemons do): the number
     * could then name one of its files, which must never receive these lines. */
    if (log_fd < 0 || !same_file(log_fd)) open_log();
    if (log_fd < 0) return;
    refresh_pid();
    char line[LINE_BYTES];
    size_t at = 0;
    line[at++] = kind;
    line[at++] = '\t';
    at = put(line, at, pid_text);
    line[at++] = '\t';
    at = put(line, at, a);
    line[at++] = '\t';
    at = put(line, at, path);
    line[at++] = '\n';
    long rc;
    do { rc = sys4(SYS_write, log_fd, (long)line, (long)at, 0); } while (rc == -EINTR);
}

static void parse_rules(const char *spec) {
    size_t n = 0;
    while (spec[n] && n < sizeof enforce_buf - 1) { enforce_buf[n] = spec[n]; n++; }
    enforce_buf[n] = 0;
    char *p = enforce_buf;
    while (*p && n_rules < MAX_RULES) {
        char *end = schr(p, ':');
        if (end) *end = 0;
        char *eq = schr(p, '=');
        if (eq && eq != p && eq[1] == '/') {  /* only absolute targets: never a search */
            *eq = 0;
            rule_soname[n_rules] = p;
            rule_path[n_rules] = eq + 1;
            n_rules++;
        }
        if (!end) break;
        p = end + 1;
    }
}

unsigned int la_version(unsigned int version) {
    const char *log = env("CUMATRIX_AUDIT_LOG");
    if (log && *log) {
        log_path = log;
        open_log();
    }
    const char *spec = env("CUMATRIX_AUDIT_ENFORCE");
    if (spec && *spec) parse_rules(spec);
    /* Only version-1 hooks are used: accept what an older glibc offers, so a library built
     * against newer headers still loads in an older container. */
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

/* A prefix test. */
static int starts(const char *s, const char *prefix) {
    while (*prefix && *s == *prefix) { s++; prefix++; }
    return *prefix == 0;
}

static int traced_name(const char *base) {
    return starts(base, "libcu") || starts(base, "libnv") || starts(base, "libnccl") || starts(base, "libnpp");
}

static const char *step_name(unsigned int flag) {
    switch (flag) {
    case LA_SER_RUNPATH: return "rpath";
    case LA_SER_LIBPATH: return "ld_library_path";
    case LA_SER_CONFIG: return "ld.so.cache";
    case LA_SER_DEFAULT: return "default";
    case LA_SER_SECURE: return "secure";
    default: return "other";
    }
}

char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag) {
    if (name == NULL) return (char *)name;
    if (flag != LA_SER_ORIG) {
        if (tracing) emit('s', step_name(flag), name);
        return (char *)name;
    }
    const char *slash = srchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    tracing = log_path != NULL && traced_name(base);
    if (tracing) {
        /* The cookie is the requesting object's link_map: la_objopen leaves glibc's default. */
        const struct link_map *by = cookie ? (const struct link_map *)*cookie : NULL;
        emit('q', by && by->l_name ? by->l_name : "", name);
    }
    if (n_rules == 0) return (char *)name;
    for (int i = 0; i < n_rules; i++) {
        if (scmp(base, rule_soname[i]) == 0) {
            if (scmp(name, rule_path[i]) != 0) emit('r', name, rule_path[i]);
            return (char *)rule_path[i];
        }
    }
    return (char *)name;
}

/* DT_SONAME of a mapped object, read from its dynamic section in memory (the file may not
 * be reachable from the parent, e.g. inside a container image). */
static const char *soname_of(const struct link_map *map) {
    const ElfW(Dyn) *d = map->l_ld;
    if (d == NULL) return "";
    ElfW(Addr) strtab = 0;
    ElfW(Addr) soname = 0;
    int have_soname = 0;
    for (; d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_STRTAB) strtab = d->d_un.d_ptr;
        else if (d->d_tag == DT_SONAME) { soname = d->d_un.d_val; have_soname = 1; }
    }
    if (!have_soname || strtab == 0) return "";
    /* The loader relocates the dynamic section in place, except where it is read-only
     * (the vDSO): there the address is still relative to the load base. */
    if (strtab < map->l_addr) strtab += map->l_addr;
    return (const char *)(strtab + soname);
}

unsigned int la_objopen(struct link_map *map, Lmid_t lmid, uintptr_t *cookie) {
    (void)lmid;
    (void)cookie;
    if (map->l_name && map->l_name[0]) emit('o', soname_of(map), map->l_name);
    return 0;  /* no symbol-binding hooks: they would cost on every call */
}
