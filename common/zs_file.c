/*
 * zs_file.c - small file helpers (see zs_file.h).
 */
#include "zs_file.h"

#include <stdio.h>
#include <stdlib.h>

char *zs_file_read_text(const char *path, size_t max_bytes, int trim)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(max_bytes + 1);
    size_t n = buf ? fread(buf, 1, max_bytes + 1, f) : 0;
    int bad = ferror(f) || n > max_bytes;
    fclose(f);
    if (!buf || bad) {
        free(buf);
        return NULL;
    }
    while (trim && n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        n--;
    buf[n] = '\0';
    return buf;
}
