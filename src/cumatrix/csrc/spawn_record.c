#include "spawn_common.h"
#include "spawn_record.h"

/* ------------------------------------------------------------------ the tracer's record */

int trace_fd = -1;
static char out_buf[1 << 16];
static size_t out_len;

/* --trace-record: the record, in memory until the tree is gone. */
#define RECORD_MAX (16u << 20)
int record_mode;
static char *record;
static size_t record_len, record_cap;
char secret[128];

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

void out_flush(void) {
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

void out_line(const char *fmt, ...) {
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

int seen_before(int pid, unsigned long long dev, unsigned long long ino, const char *path) {
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

/* Half the buffer used: written now (a long trace's lines reach the harness as it goes). */
void out_flush_if_half(void) {
    if (out_len > sizeof out_buf / 2) out_flush();
}

/* --trace-record: the record, between the secret's lines, on stderr (nothing traced is alive). */
void emit_record(void) {
    if (!record_mode) return;
    out_flush();
    char line[256];
    int k = snprintf(line, sizeof line, "\n\036cumatrix-trace %s begin\n", secret);
    write_all(2, line, (size_t)k);
    if (record_len) write_all(2, record, record_len);
    k = snprintf(line, sizeof line, "\036cumatrix-trace %s end\n", secret);
    write_all(2, line, (size_t)k);
}
