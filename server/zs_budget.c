/*
 * zs_budget.c - the memory budget (see zs_budget.h).
 */
#include "zs_budget.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void zs_budget_init(zs_budget_t *b, uint64_t limit)
{
    pthread_mutex_init(&b->mu, NULL);
    b->limit = limit;
    b->used = 0;
}

void zs_budget_deinit(zs_budget_t *b)
{
    pthread_mutex_destroy(&b->mu);
}

int zs_budget_take(zs_budget_t *b, uint64_t bytes, const char *what, zs_err_t *err)
{
    return zs_budget_take_spare(b, bytes, 0, what, err);
}

/* "N bytes" below 1 MiB, else "X.Y MiB". */
static void fmt_bytes(char *out, size_t cap, uint64_t bytes)
{
    if (bytes < (1u << 20))
        snprintf(out, cap, "%llu bytes", (unsigned long long)bytes);
    else
        snprintf(out, cap, "%.1f MiB", (double)bytes / (1 << 20));
}

int zs_budget_take_spare(zs_budget_t *b, uint64_t bytes, uint64_t spare, const char *what,
                         zs_err_t *err)
{
    if (bytes == 0)
        return ZS_OK;
    pthread_mutex_lock(&b->mu);
    uint64_t used = b->used, limit = b->limit;
    /* used + bytes + spare <= limit, without overflow */
    int ok = bytes <= limit && spare <= limit - bytes && used <= limit - bytes - spare;
    if (ok)
        b->used += bytes;
    pthread_mutex_unlock(&b->mu);
    if (ok)
        return ZS_OK;
    char need[32], kept[48] = "";
    fmt_bytes(need, sizeof need, bytes);
    if (spare) {
        char sp[32];
        fmt_bytes(sp, sizeof sp, spare);
        snprintf(kept, sizeof kept, " beside %s kept free", sp);
    }
    return zs_err_set(err, ZS_ERR_NOMEM,
                      "memory budget: %s needs %s%s; %.1f MiB of the %.1f MiB budget are "
                      "reserved (--mem-budget)",
                      what, need, kept, (double)used / (1 << 20), (double)limit / (1 << 20));
}

void zs_budget_give(zs_budget_t *b, uint64_t bytes)
{
    if (bytes == 0)
        return;
    pthread_mutex_lock(&b->mu);
    b->used = bytes <= b->used ? b->used - bytes : 0;
    pthread_mutex_unlock(&b->mu);
}

void zs_budget_get(zs_budget_t *b, uint64_t *used, uint64_t *limit)
{
    pthread_mutex_lock(&b->mu);
    *used = b->used;
    *limit = b->limit;
    pthread_mutex_unlock(&b->mu);
}

/* A number from a one-line file; 0 if absent or not a number ("max"). */
static uint64_t read_u64(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    unsigned long long v = 0;
    if (fscanf(f, "%llu", &v) != 1)
        v = 0;
    fclose(f);
    return (uint64_t)v;
}

uint64_t zs_budget_default(uint64_t *ram)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGE_SIZE);
    uint64_t mem = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 4ull << 30;
    uint64_t cg = read_u64("/sys/fs/cgroup/memory.max");
    if (!cg)
        cg = read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (cg && cg < mem) /* v1 reports "no limit" as a huge number: then mem wins */
        mem = cg;
    if (ram)
        *ram = mem;
    return mem / 5 * 4;
}

int zs_budget_parse(const char *s, uint64_t *bytes)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0) || !isfinite(v))
        return -1;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        mul = 1024.0;
        break;
    case 'M':
        mul = 1024.0 * 1024;
        break;
    case 'G':
        mul = 1024.0 * 1024 * 1024;
        break;
    case 'T':
        mul = 1024.0 * 1024 * 1024 * 1024;
        break;
    case '\0':
    case 'B':
        break;
    default:
        return -1;
    }
    if (mul > 1)
        end++;
    if (toupper((unsigned char)*end) == 'I' && mul > 1)
        end++;
    if (toupper((unsigned char)*end) == 'B')
        end++;
    if (*end)
        return -1;
    double b = v * mul;
    if (b < 1 || b > 1.8e19)
        return -1;
    *bytes = (uint64_t)b;
    return 0;
}
