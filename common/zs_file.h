/*
 * zs_file.h - small file helpers shared by the command-line programs.
 */
#ifndef ZS_FILE_H
#define ZS_FILE_H

#include <stddef.h>

/* Read a small text file (a token, a PEM certificate) of at most max_bytes
 * into a malloc'd NUL-terminated string; with `trim`, trailing newlines,
 * carriage returns and spaces are removed (tokens). The caller frees it.
 * NULL if it cannot be read or is larger than max_bytes. */
char *zs_file_read_text(const char *path, size_t max_bytes, int trim);

#endif
