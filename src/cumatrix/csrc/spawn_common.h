/* spawn_common.h: what every unit of cumatrix-spawn includes: the system headers and the
 * numbers the seccomp filter and the tracer share (SECCOMP_RET_DATA of the filter's stops).
 * It promises nothing else: each unit's own header says what that unit gives the others. */
#ifndef CUMATRIX_SPAWN_COMMON_H
#define CUMATRIX_SPAWN_COMMON_H
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
#include <stdint.h>
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

/* The native ABI's audit architecture, as a seccomp filter and the tracer compare it (0: none
 * this helper knows). */
#if defined(__x86_64__)
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define NATIVE_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#define NATIVE_AUDIT_ARCH 0
#endif

/* SECCOMP_RET_DATA of the filter's stops: an execve (or another ABI's call), an executable mapping. */
#define EXEC_STOP 0
#define MMAP_EXEC 1
#define MPROTECT_EXEC 2

#endif
