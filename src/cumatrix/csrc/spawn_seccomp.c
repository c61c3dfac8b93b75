#include "spawn_common.h"
#include "spawn_seccomp.h"
#include "spawn_trace.h"

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
void traced_child_setup(int go_fd) {
    char c = 0;
    ssize_t n;
    do n = read(go_fd, &c, 1); while (n < 0 && errno == EINTR);
    close(go_fd);
    if (n == 1 && c == 'T' && install_exec_filter() != 0)
        out_line("n\texec filter refused (%s): images before an execve are read at exit only\n", strerror(errno));
    out_flush();
}

