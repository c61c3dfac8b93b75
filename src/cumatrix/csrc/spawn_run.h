/* spawn_run.h: one program's run, as the helper's main and the fork server's tracers start it.
 *
 * start_in_cgroup()  the program's process started in the cgroup whose cgroup.procs is PROCS
 *                (clone3 CLONE_INTO_CGROUP, in the served cell's namespaces where it has them):
 *                0 in the child, its pid in the parent, -1 (errno set) where the kernel or a
 *                seccomp filter refuses; PARENT_DEATH: the pid whose end kills it.
 * mirror()       waits for PID and ends as it ended (its exit status, or its signal raised
 *                again with core dumps off); a served cell's tracer reports it instead ("z").
 * traced_main()  runs the program of ARGV (PARENT_PID CGROUP_PROCS LIMITS -- PROGRAM...) traced,
 *                its record to FD; a served cell's program is first cloned into the cell's
 *                namespaces and built there (cell_init).  Returns (or ends) as the program ended. */
#ifndef CUMATRIX_SPAWN_RUN_H
#define CUMATRIX_SPAWN_RUN_H
pid_t start_in_cgroup(const char *procs, pid_t parent_death);
int mirror(pid_t pid);
int traced_main(int fd, int argc, char **argv);
#endif
