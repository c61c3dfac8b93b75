/* spawn_record.h: the tracer's record, the lines it writes (see spawn.c for their words).
 *
 * out_line(), out_flush()  a line of the record, buffered; the buffer written to trace_fd (or,
 *                in record_mode, kept in memory for emit_record()).  out_flush_if_half()
 *                writes it once half full.
 * seen_before()  whether (pid, device, inode, path) was written already (each once).
 * emit_record()  --trace-record: the record between the secret's two lines, on stderr. */
#ifndef CUMATRIX_SPAWN_RECORD_H
#define CUMATRIX_SPAWN_RECORD_H
extern int trace_fd;
extern int record_mode;
extern char secret[128];
void out_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void out_flush(void);
void out_flush_if_half(void);
int seen_before(int pid, unsigned long long dev, unsigned long long ino, const char *path);
void emit_record(void);
#endif
