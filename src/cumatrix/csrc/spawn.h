/* spawn.h: the program's own entry points that the server calls back.
 *
 * traced_main()  runs the program of ARGV (PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM...) traced,
 *                its record to FD; a served cell's program is first cloned into the cell's
 *                namespaces and built there (cell_init).  Returns (or ends) as the program ended. */
#ifndef CUMATRIX_SPAWN_H
#define CUMATRIX_SPAWN_H
int traced_main(int fd, int argc, char **argv);
#endif
