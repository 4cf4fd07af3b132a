/*
 * zs_store_recover.c - a store that survives a full disk (zs_store.h,
 * "Degraded").
 *
 * Why. When a flush fails (ENOSPC), RocksDB 7.8 stops accepting writes until
 * its own recovery resumes it, and that recovery only runs once the disk has
 * the largest memtable free (64 MiB here) and retries every 5 s: with 40 MiB
 * free, room for a 12 MiB checkpoint, every later write and delete kept
 * failing while the process ran. Closing and reopening the DB clears the
 * stopped state whatever caused it; the open's cleanup then drops the chunks
 * of the failed write.
 *
 * What. A write, delete or prune that fails with an I/O or no-space error
 * marks the store degraded (zs__store_failed). The next such call first
 * checks the free space (statvfs of the store's directory): too little and it
 * is refused at once, without touching RocksDB; enough and the DB is reopened
 * (zs__store_recover). A reopen that fails leaves the DB closed: reads report
 * that (zs__store_closed) and the next write tries again.
 *
 * Does not: watch the disk in the background, or retry a failed operation by
 * itself; the caller's next request is the retry.
 */
#include "zs_store_internal.h"

#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "zs_log.h"

/* Bytes available to this process under `path` (or its parent while the
 * directory does not exist yet); 0 and *ok = 0 if it cannot tell. */
static uint64_t avail_bytes(const char *path, int *ok)
{
    struct statvfs v;
    *ok = 1;
    if (statvfs(path, &v) == 0)
        return (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", path);
    if (statvfs(dirname(parent), &v) == 0)
        return (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    *ok = 0;
    return 0;
}

/* See zs_store_internal.h. */
int zs__store_check_space(const zs_store_t *st, uint64_t need, const char *what, zs_err_t *err)
{
    int ok;
    uint64_t avail = avail_bytes(st->path, &ok);
    if (!ok || avail >= need + ZS__STORE_MIN_FREE)
        return ZS_OK;
    return zs_err_set(err, ZS_ERR_NOMEM,
                      "store %s: disk full: %.1f MiB free, %s needs %.1f MiB; free disk space "
                      "and retry",
                      st->dir, (double)avail / (1 << 20), what,
                      (double)(need + ZS__STORE_MIN_FREE) / (1 << 20));
}

/* See zs_store_internal.h. */
int zs__store_failed(zs_store_t *st, int rc, const zs_err_t *err)
{
    if (rc != ZS_ERR_IO && rc != ZS_ERR_NOMEM)
        return rc;
    if (!st->degraded)
        ZS_WARN("store %s: degraded until a write succeeds: %s", st->dir,
                err ? err->msg : "(no message)");
    st->degraded = 1;
    snprintf(st->why, sizeof st->why, "%s", err ? err->msg : "a write failed");
    return rc;
}

/* See zs_store_internal.h. */
int zs__store_closed(const zs_store_t *st, zs_err_t *err)
{
    return zs_err_set(err, ZS_ERR_IO,
                      "store %s is closed: reopening it after a failed write failed (%s); the "
                      "next checkpoint or delete tries again",
                      st->dir, st->why);
}

/* See zs_store_internal.h. */
int zs__store_recover(zs_store_t *st, uint64_t need, zs_err_t *err)
{
    if (!st->degraded)
        return ZS_OK;
    int rc = zs__store_check_space(st, need, "this write", err);
    if (rc) {
        char msg[ZS_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", err->msg);
        return zs_err_set(err, rc, "%s (degraded since: %s)", msg, st->why);
    }
    ZS_INFO("store %s: degraded (%s); reopening it", st->dir, st->why);
    zs__store_close_db(st);
    rc = zs__store_open_db(st, err);
    if (rc) {
        snprintf(st->why, sizeof st->why, "%s", err->msg);
        ZS_ERROR("store %s: reopen failed, store closed until the next write: %s", st->dir,
                 err->msg);
        return rc;
    }
    st->degraded = 0;
    st->why[0] = '\0';
    ZS_INFO("store %s: reopened; writes resume", st->dir);
    return ZS_OK;
}

/* See zs_store.h. */
int zs_store_health(const zs_store_t *st, char *why, size_t cap)
{
    if (why && cap)
        snprintf(why, cap, "%s", st->degraded ? st->why : "");
    return st->degraded;
}
