/* spawn_files.h: what the tracer reads of a file a traced process maps executable, at the
 * moment it does (the seccomp stop of its mmap, or of the mprotect that adds PROT_EXEC).
 *
 * mapping_made(), protection_made()  write an "M" line for each file PID is mapping
 *                executable; a file with no name on disk (a memfd, a removed file) is read
 *                then: its DT_SONAME ("s") and the SHA-256 of its first DIGEST_LIMIT bytes ("h"). */
#ifndef CUMATRIX_SPAWN_FILES_H
#define CUMATRIX_SPAWN_FILES_H
void mapping_made(pid_t pid);
void protection_made(pid_t pid);
#endif
