#include "spawn_common.h"
#include "spawn_cell.h"

/* --serve: the namespaces each cell's first process is cloned into, the sandbox it builds
 * (bubblewrap's operations), the uid its program runs as, where its end is reported. */
unsigned long long clone_ns_flags;
char **serve_ops;
int serve_nops;
long serve_uid = -1;
int serve_status_fd = -1;
int serve_status_sent;
/* The cell's host uid (kernel uid, seen as SERVE_UID inside the cell's own user namespace):
 * one of the reserved range no other cell holds while this one lives (--serve BASE:COUNT, a
 * root server), the server's own uid in its user namespace (--serve --userns: 0), or -1 (the
 * program runs as SERVE_UID itself, sharing that uid's kernel state with every other cell). */
long serve_host_uid = -1;
int serve_userns;  /* the server made its own user namespace (a non-root harness) */
int serve_idmap_fd = -1;  /* a user namespace mapping the harness's files to the cell's uid */
int serve_hold_fd = -1;  /* a held cell: its program's exec waits for a byte on this pipe */
/* The cell's mount namespace, held by its tracer: the last reference taken down (its mounts
 * unmounted, an expedited RCU grace period waited for) after the cell's pipes are closed, so
 * that the harness, told the cell ended, need not wait for it. */
int serve_mnt_ns = -1;
