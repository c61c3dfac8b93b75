/* spawn_seccomp.h: the filter every traced process carries (inherited, impossible to remove).
 *
 * traced_child_setup()  the traced program's side before its exec: it waits until the tracer
 *                has seized it (one byte on GO_FD: 'T'; EOF: tracing was refused), then puts
 *                in place the filter that stops each execve in the tracer, refuses
 *                clone(CLONE_UNTRACED) (EPERM) and clone3 (ENOSYS), and stops each mmap of a file
 *                with PROT_EXEC and each mprotect/pkey_mprotect adding PROT_EXEC; another ABI's
 *                calls all stop.  A filter refused is said on the record ("n").
 * refuse_keyrings()  puts in place the filter of a served cell's program: add_key, request_key
 *                and keyctl fail with ENOSYS, by every ABI's numbers (native, x32, i386 or
 *                32-bit ARM); sets no_new_privs where the kernel asks for it (no CAP_SYS_ADMIN).
 *                0, or -1 with errno. */
#ifndef CUMATRIX_SPAWN_SECCOMP_H
#define CUMATRIX_SPAWN_SECCOMP_H
void traced_child_setup(int go_fd);
int refuse_keyrings(void);
#endif
