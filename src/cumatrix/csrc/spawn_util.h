/* spawn_util.h: the shared utilities of cumatrix-spawn.
 *
 * fail()        says what failed (and errno) on stderr, one line; returns 126, a shell's
 *               "cannot execute".
 * run_program() the program's side of a spawn: its resource limits, no keyring call where
 *               no_keyrings is set (spawn_seccomp.h), then its exec; it returns only on failure,
 *               with the exit code to use (127: not found, 126: otherwise).
 * run_program_held() the same, and where HOLD_FD is a descriptor (a held served cell), the
 *               exec waits, last, for the harness's word on it ("g"; 125 without it).
 * no_keyrings   set by "--no-keys" (a cell bubblewrap holds) and in a served cell.
 * write_text()  writes a short text to a file whole (a /proc map); -1 (errno set) otherwise. */
#ifndef CUMATRIX_SPAWN_UTIL_H
#define CUMATRIX_SPAWN_UTIL_H
int fail(const char *what, const char *arg);
extern int no_keyrings;
int run_program(char *limits, char **argv);
int run_program_held(char *limits, char **argv, int hold_fd);
int write_text(const char *path, const char *text);
#endif
