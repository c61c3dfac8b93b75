/* spawn_server.h: the fork server (--serve) and the state it hands each cell's tracer.
 *
 * serve()  reads cells from SOCK (one SOCK_SEQPACKET message each, with its descriptors) until
 *          its EOF; for each, forks a tracer that runs the cell in new namespaces, built by
 *          cell_init(), and writes "p <pid>", then "z <wait status>" on the cell's status pipe.
 *          HOW: NULL, "BASE:COUNT" (the range a root server's cells take their host uids from,
 *          one no other live cell holds) or "--userns" (the server first makes a user namespace
 *          of its own, where its uid is root).
 *          The cell's settings it hands that tracer: spawn_cell.h. */
#ifndef CUMATRIX_SPAWN_SERVER_H
#define CUMATRIX_SPAWN_SERVER_H
int serve(int sock, pid_t parent, const char *how);
#endif
