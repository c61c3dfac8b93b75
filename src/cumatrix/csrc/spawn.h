/* spawn.h: the program cumatrix-spawn, its command lines (spawn.c's opening comment is their
 * reference, with the trace record's lines):
 *
 *   cumatrix-spawn [--no-keys] PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM [ARGS...]
 *   cumatrix-spawn [--no-keys] --trace FD PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM [ARGS...]
 *   cumatrix-spawn --trace-record NONCE_FILE PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM [ARGS...]
 *   cumatrix-spawn --serve SOCKET_FD PARENT_PID [BASE:COUNT | --userns]
 *   cumatrix-spawn --watch PROGRAM [ARGS...]
 *
 * Nothing else of spawn.c is called from another unit: it reads its command line and hands
 * the work to spawn_run.c (a program's run), spawn_server.c (the fork server) or the watcher. */
#ifndef CUMATRIX_SPAWN_H
#define CUMATRIX_SPAWN_H
#endif
