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
 * Only open/write/getenv/getpid/syscall and string functions are used, so the library
 * built on one glibc loads under any glibc of the same architecture (a container's too).
 */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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
    pid_t now = getpid();
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
    size_t n = strlen(s);
    if (at + n > LINE_BYTES - 4) n = LINE_BYTES - 4 - at;  /* room for separators and \n */
    memcpy(buf + at, s, n);
    return at + n;
}

/* fstat through syscall(2): the fstat symbol exists only from glibc 2.33, and the library
 * must load under older ones too. */
static int same_file(int fd) {
    struct stat st;
    if (syscall(SYS_fstat, fd, &st) != 0) return 0;
    return st.st_dev == log_dev && st.st_ino == log_ino;
}

static void open_log(void) {
    log_fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    struct stat st;
    if (log_fd >= 0 && syscall(SYS_fstat, log_fd, &st) == 0) {
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
    ssize_t rc;
    do { rc = write(log_fd, line, at); } while (rc < 0 && errno == EINTR);
}

static void parse_rules(const char *spec) {
    size_t n = strlen(spec);
    if (n >= sizeof enforce_buf) n = sizeof enforce_buf - 1;
    memcpy(enforce_buf, spec, n);
    enforce_buf[n] = 0;
    char *p = enforce_buf;
    while (*p && n_rules < MAX_RULES) {
        char *end = strchr(p, ':');
        if (end) *end = 0;
        char *eq = strchr(p, '=');
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
    const char *log = getenv("CUMATRIX_AUDIT_LOG");
    if (log && *log) {
        log_path = log;
        open_log();
    }
    const char *spec = getenv("CUMATRIX_AUDIT_ENFORCE");
    if (spec && *spec) parse_rules(spec);
    /* Only version-1 hooks are used: accept what an older glibc offers, so a library built
     * against newer headers still loads in an older container. */
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

/* A prefix test of its own: strncmp would add a symbol to the few this library imports. */
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
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    tracing = log_path != NULL && traced_name(base);
    if (tracing) {
        /* The cookie is the requesting object's link_map: la_objopen leaves glibc's default. */
        const struct link_map *by = cookie ? (const struct link_map *)*cookie : NULL;
        emit('q', by && by->l_name ? by->l_name : "", name);
    }
    if (n_rules == 0) return (char *)name;
    for (int i = 0; i < n_rules; i++) {
        if (strcmp(base, rule_soname[i]) == 0) {
            if (strcmp(name, rule_path[i]) != 0) emit('r', name, rule_path[i]);
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
