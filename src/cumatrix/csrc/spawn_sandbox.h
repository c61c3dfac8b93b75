/* spawn_sandbox.h: a served cell's sandbox, built by its first process (pid 1 of its own pid
 * namespace, in its own mount, IPC, UTS, network and cgroup namespaces).
 *
 * cell_init()  builds the view bubblewrap would build from the server's operations (serve_ops),
 *              detaches the host's root, waits for a held cell's word, forks the program
 *              (nobody inside a user namespace of its own, no capability, no group,
 *              no_new_privs, a session keyring of its own, no keyring call) and stays as the namespace's init;
 *              returns as the program ended (128+N for signal N).  A sandbox that cannot be
 *              built is said on the status pipe ("h") and returns 126 before any program runs. */
#ifndef CUMATRIX_SPAWN_SANDBOX_H
#define CUMATRIX_SPAWN_SANDBOX_H
int cell_init(char *limits, char **argv);
#endif
