/* spawn_trace.h: the tracer (--trace, --trace-record): ptrace of a cell's whole tree.
 *
 * trace_tree()   follows every process of the tree rooted at LEADER (seized with trace_options)
 *                until not one is left, writing what each mapped executable, its images and
 *                its exit as lines of the record (spawn_record.h; see spawn.c); returns the
 *                leader's wait status, -1 if the leader was never seen to end.  The record's
 *                last line ("z") is written only then.
 * audit_log      --trace-record: the rtld-audit log whose claims the record answers. */
#ifndef CUMATRIX_SPAWN_TRACE_H
#define CUMATRIX_SPAWN_TRACE_H
extern char *audit_log;
extern int trace_options;
int trace_tree(pid_t leader);
#endif
