/*
 * zs_file.h - small file helpers shared by the programs: text files, whole
 * writes, and the process's own resident set from /proc.
 */
#ifndef ZS_FILE_H
#define ZS_FILE_H

#include <stddef.h>
#include <stdint.h>

/* Read a small text file (a token, a PEM certificate) of at most max_bytes
 * into a malloc'd NUL-terminated string; with `trim`, trailing newlines,
 * carriage returns and spaces are removed (tokens). The caller frees it.
 * NULL if it cannot be read or is larger than max_bytes. */
char *zs_file_read_text(const char *path, size_t max_bytes, int trim);

/* Write all n bytes of p to fd, retrying short writes and EINTR. 0, or -1
 * with errno set. */
int zs_file_write_all(int fd, const void *p, size_t n);

/* Resident set of this process in bytes (/proc/self/statm), 0 if unknown. */
uint64_t zs_file_self_rss(void);

#endif
