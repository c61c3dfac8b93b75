#include "spawn_common.h"
#include "spawn_seccomp.h"
#include "spawn_record.h"

/* The kernel's keyrings, refused to a served cell (ENOSYS, "this kernel has no keyrings", which
 * programs already expect: CONFIG_KEYS may be off).  A key is owned by a host uid and shown to
 * every process of that uid (/proc/keys, keyctl by serial number), whatever user namespace it
 * is in, until the kernel's collector frees it a moment after its keyring is gone: the cells of
 * an ordinary user's harness are all that user's uid, and the host uid a root harness gives a
 * live cell is given again once it ends.  A key would be a channel between two such cells.
 * Docker's default profile refuses the same three calls for the same reason.  Every ABI the
 * kernel runs is filtered by its own numbers: the native one (and x32's, the native number with
 * bit 30 set), and i386's (int 0x80) or 32-bit ARM's. */
#if defined(__x86_64__)
#define COMPAT_ARCH AUDIT_ARCH_I386
#define COMPAT_ADD_KEY 286  /* i386: add_key, request_key, keyctl */
#define NATIVE_MASK (~0x40000000u)
#elif defined(__aarch64__)
#define COMPAT_ARCH AUDIT_ARCH_ARM
#define COMPAT_ADD_KEY 309  /* arm: add_key, request_key, keyctl */
#define NATIVE_MASK (~0u)
#endif

int refuse_keyrings(void) {
#if defined(COMPAT_ARCH)
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NATIVE_AUDIT_ARCH, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, COMPAT_ARCH, 8, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        /* native (x32 too, its numbers are the native ones with bit 30 set) */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_STMT(BPF_ALU | BPF_AND | BPF_K, NATIVE_MASK),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_add_key, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_request_key, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_keyctl, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        /* the 32-bit ABI: its three numbers follow each other */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, COMPAT_ADD_KEY, 0, 2),
        BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, COMPAT_ADD_KEY + 2, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog fprog = {(unsigned short)(sizeof prog / sizeof prog[0]), prog};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) == 0) return 0;
    /* Without CAP_SYS_ADMIN the kernel takes a filter only under no_new_privs (root keeps its
     * privileges: bubblewrap's and setpriv's changes of uid still work under it). */
    if (errno != EACCES || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog);
#else
    errno = ENOSYS;
    return -1;
#endif
}

/* The filter every traced process carries: execve and execveat stop in the tracer first
 * (SECCOMP_RET_TRACE), while the old image is still mapped.  Another ABI's system calls
 * (a 32-bit program on a 64-bit kernel) all ask the tracer: its numbers differ. */
static int install_exec_filter(void) {
    const unsigned int arch = NATIVE_AUDIT_ARCH;
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
void traced_child_setup(int go_fd) {
    char c = 0;
    ssize_t n;
    do n = read(go_fd, &c, 1); while (n < 0 && errno == EINTR);
    close(go_fd);
    if (n == 1 && c == 'T' && install_exec_filter() != 0)
        out_line("n\texec filter refused (%s): images before an execve are read at exit only\n", strerror(errno));
    out_flush();
}

