/* spawn_trace.h: the tracer (--trace, --trace-record): ptrace of a cell's whole tree and its
 * record.
 *
 * trace_tree()   follows every process of the tree rooted at LEADER (seized with trace_options)
 *                until not one is left, writing what each mapped executable, its images and
 *                its exit as lines (see spawn.c); returns the leader's wait status, -1 if the
 *                leader was never seen to end.  The record's last line ("z") is written only
 *                then.
 * out_line(), out_flush()  a line of the record, buffered; the buffer written to trace_fd (or,
 *                in record_mode, kept in memory for emit_record()).
 * seen_before()  whether (pid, device, inode, path) was written already (each once).
 * emit_record()  --trace-record: the record between the secret's two lines, on stderr. */
#ifndef CUMATRIX_SPAWN_TRACE_H
#define CUMATRIX_SPAWN_TRACE_H
extern int trace_fd;
extern int record_mode;
extern char secret[128];
extern char *audit_log;
extern int trace_options;
void out_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void out_flush(void);
int seen_before(int pid, unsigned long long dev, unsigned long long ino, const char *path);
int trace_tree(pid_t leader);
void emit_record(void);
#endif
