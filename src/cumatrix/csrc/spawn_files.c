#include "spawn_common.h"
#include "spawn_files.h"
#include "spawn_record.h"

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

#ifdef PTRACE_GET_SYSCALL_INFO
/* The call PID stopped at (a seccomp stop): 0, or -1 where the kernel says it is no such stop. */
static int seccomp_stop_info(pid_t pid, struct __ptrace_syscall_info *info) {
    memset(info, 0, sizeof *info);
    if (ptrace(PTRACE_GET_SYSCALL_INFO, pid, (void *)sizeof *info, info) <= 0 || info->op != PTRACE_SYSCALL_INFO_SECCOMP)
        return -1;
    return 0;
}
#endif

/* The file PID is about to map executable (the mmap's descriptor, read at the call's entry
 * while the process waits). */
void mapping_made(pid_t pid) {
#ifdef PTRACE_GET_SYSCALL_INFO
    struct __ptrace_syscall_info info;
    if (seccomp_stop_info(pid, &info) != 0) return;
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
void protection_made(pid_t pid) {
#ifdef PTRACE_GET_SYSCALL_INFO
    struct __ptrace_syscall_info info;
    if (seccomp_stop_info(pid, &info) != 0) return;
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

