/* spawn_cell.h: one served cell's settings, set by the fork server in the cell's tracer before
 * the cell's first process is cloned, and read there and in that process (spawn_run.c,
 * spawn_sandbox.c).  Nothing but the variables: the server, the tracer and the sandbox all
 * read them, and none of them is below another. */
#ifndef CUMATRIX_SPAWN_CELL_H
#define CUMATRIX_SPAWN_CELL_H
extern unsigned long long clone_ns_flags;
extern char **serve_ops;
extern int serve_nops;
extern long serve_uid;
extern int serve_status_fd;
extern int serve_status_sent;
extern long serve_host_uid;
extern int serve_userns;
extern int serve_idmap_fd;
extern int serve_hold_fd;
extern int serve_mnt_ns;
#endif
