/*
 * zs_dev.c - the dispatching half of the device interface (see zs_dev.h).
 *
 * What it does: the non-inline zs_dev_* calls on streams and events find
 * their device through the common header (struct zs_stream / zs_event, the
 * first member of every implementation's object) and call its table; plus
 * the names of memory spaces and categories. What it does not do: any work
 * itself; argument checks specific to an implementation live there (the
 * NULL checks here only keep a bad call from dereferencing NULL).
 */
#include "zs_dev.h"

static const char *const memcat_names[ZS_MEM_NCATS] = {
    "params", "grads", "optimizer", "gathered", "comm", "activations", "scratch", "hpz",
};

static const char *const space_names[ZS_NSPACES] = {"device", "pinned", "host"};

/* Name of a memory category, "?" when out of range. Static storage. */
const char *zs_memcat_name(int cat)
{
    return cat >= 0 && cat < ZS_MEM_NCATS ? memcat_names[cat] : "?";
}

/* Name of a memory space, "?" when out of range. Static storage. */
const char *zs_space_name(int space)
{
    return space >= 0 && space < ZS_NSPACES ? space_names[space] : "?";
}

#define NEED(p, what)                                                                              \
    do {                                                                                           \
        if (!(p))                                                                                  \
            return zs_err_set(err, ZS_ERR_INVALID, "%s: %s is NULL", __func__, what);              \
    } while (0)

int zs_dev_stream_sync(zs_stream_t *s, zs_err_t *err)
{
    NEED(s, "stream");
    return s->dev->vt->stream_sync(s, err);
}

void zs_dev_stream_destroy(zs_stream_t *s)
{
    if (s)
        s->dev->vt->stream_destroy(s);
}

int zs_dev_event_create(zs_dev_t *d, zs_event_t **out, zs_err_t *err)
{
    NEED(d, "device");
    NEED(out, "out");
    return d->vt->event_create(d, out, err);
}

void zs_dev_event_destroy(zs_event_t *e)
{
    if (e)
        e->dev->vt->event_destroy(e);
}

int zs_dev_event_record(zs_event_t *e, zs_stream_t *s, zs_err_t *err)
{
    NEED(e, "event");
    NEED(s, "stream");
    if (e->dev != s->dev)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_dev_event_record: event and stream belong to different devices");
    return s->dev->vt->event_record(e, s, err);
}

int zs_dev_stream_wait(zs_stream_t *s, zs_event_t *e, zs_err_t *err)
{
    NEED(s, "stream");
    NEED(e, "event");
    if (e->dev != s->dev)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_dev_stream_wait: event and stream belong to different devices");
    return s->dev->vt->stream_wait(s, e, err);
}

int zs_dev_event_query(zs_event_t *e)
{
    return e ? e->dev->vt->event_query(e) : 1;
}

int zs_dev_event_sync(zs_event_t *e, zs_err_t *err)
{
    NEED(e, "event");
    return e->dev->vt->event_sync(e, err);
}

int zs_dev_memcpy(zs_stream_t *s, void *dst, const void *src, size_t bytes, zs_err_t *err)
{
    NEED(s, "stream");
    return s->dev->vt->memcpy_async(s, dst, src, bytes, err);
}

int zs_dev_memset(zs_stream_t *s, void *dst, int byte, size_t bytes, zs_err_t *err)
{
    NEED(s, "stream");
    return s->dev->vt->memset_async(s, dst, byte, bytes, err);
}

int zs_dev_host_fn(zs_stream_t *s, zs_host_fn_t fn, const void *args, size_t argbytes,
                   zs_err_t *err)
{
    NEED(s, "stream");
    return s->dev->vt->host_fn(s, fn, args, argbytes, err);
}

int zs_dev_cast(zs_stream_t *s, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                size_t n, zs_err_t *err)
{
    NEED(s, "stream");
    return s->dev->vt->cast(s, dst, ddt, src, sdt, n, err);
}

int zs_dev_cast_rows(zs_stream_t *s, float *dst, const void *src, zs_dtype_t sdt,
                     const int32_t *idx, size_t n, int32_t lo, int32_t hi, size_t width,
                     zs_err_t *err)
{
    NEED(s, "stream");
    if (sdt != ZS_DTYPE_F32 && sdt != ZS_DTYPE_BF16 && sdt != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: source dtype %d is not fp32, bf16 or fp16",
                          __func__, sdt);
    if (lo < 0 || hi < lo)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: bad row range [%d, %d)", __func__, lo, hi);
    if (n == 0 || width == 0 || hi == lo)
        return ZS_OK;
    if (width > SIZE_MAX / 4 / n || width > SIZE_MAX / 4 / (size_t)(hi - lo))
        return zs_err_set(err, ZS_ERR_RANGE, "%s: %zu rows of %zu elements overflow", __func__, n,
                          width);
    NEED(dst, "dst");
    NEED(src, "src");
    NEED(idx, "idx");
    return s->dev->vt->cast_rows(s, dst, src, sdt, idx, n, lo, hi, width, err);
}

int zs_dev_round(zs_stream_t *s, float *x, void *h, zs_dtype_t dt, size_t n, zs_err_t *err)
{
    NEED(s, "stream");
    if (dt != ZS_DTYPE_BF16 && dt != ZS_DTYPE_F16)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: dtype %d is not bf16 or fp16", __func__, dt);
    if (n > SIZE_MAX / 4)
        return zs_err_set(err, ZS_ERR_RANGE, "%s: %zu elements overflow the address space",
                          __func__, n);
    if (n == 0)
        return ZS_OK;
    NEED(x, "x");
    NEED(h, "h");
    uintptr_t x0 = (uintptr_t)x, x1 = x0 + n * 4, h0 = (uintptr_t)h, h1 = h0 + n * 2;
    if (x0 < h1 && h0 < x1)
        return zs_err_set(err, ZS_ERR_INVALID, "%s: x and h overlap", __func__);
    return s->dev->vt->round(s, x, h, dt, n, err);
}

int zs_dev_accumulate(zs_stream_t *s, void *dst, zs_dtype_t ddt, const void *src, zs_dtype_t sdt,
                      size_t n, zs_err_t *err)
{
    NEED(s, "stream");
    return s->dev->vt->accumulate(s, dst, ddt, src, sdt, n, err);
}

int zs_dev_scale(zs_stream_t *s, void *x, zs_dtype_t dt, float alpha, size_t n, zs_err_t *err)
{
    NEED(s, "stream");
    return s->dev->vt->scale(s, x, dt, alpha, n, err);
}

int zs_dev_sumsq(zs_stream_t *s, const void *x, zs_dtype_t dt, size_t n, double *acc, zs_err_t *err)
{
    NEED(s, "stream");
    return s->dev->vt->sumsq(s, x, dt, n, acc, err);
}

int zs_dev_adamw(zs_stream_t *s, const zs_adam_hparams_t *hp, const zs_adam_step_t *st, float *p,
                 float *m, float *v, const void *grad, zs_dtype_t gdt, void *out, zs_dtype_t odt,
                 size_t n, zs_err_t *err)
{
    NEED(s, "stream");
    return s->dev->vt->adamw(s, hp, st, p, m, v, grad, gdt, out, odt, n, err);
}

int zs_dev_host_register(zs_dev_t *d, void *p, size_t bytes, int cat, zs_err_t *err)
{
    NEED(d, "device");
    NEED(p, "memory");
    if (bytes == 0 || cat < 0 || cat >= ZS_MEM_NCATS)
        return zs_err_set(err, ZS_ERR_INVALID,
                          "zs_dev_host_register: %zu bytes of category %d (want > 0 bytes of one "
                          "of 0..%d)",
                          bytes, cat, ZS_MEM_NCATS - 1);
    if (!d->vt->host_register)
        return zs_err_set(err, ZS_ERR_UNIMPLEMENTED,
                          "zs_dev_host_register: device \"%s\" cannot use caller memory as pinned",
                          d->desc);
    return d->vt->host_register(d, p, bytes, cat, err);
}

void zs_dev_host_unregister(zs_dev_t *d, void *p)
{
    if (d && p && d->vt->host_unregister)
        d->vt->host_unregister(d, p);
}

zs_dev_t *zs_dev_of_stream(const zs_stream_t *s)
{
    return s ? s->dev : NULL;
}
