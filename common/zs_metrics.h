/*
 * zs_metrics.h - Prometheus metrics: a registry of counters and gauges with
 * labels, rendered in the text exposition format 0.0.4 (HELP and TYPE line
 * per family, one sample line per series), and an HTTP endpoint (one
 * libmicrohttpd thread) that serves GET /metrics and answers 404 to every
 * other path.
 *
 * Families and series. A family has a name, a type, a help sentence and
 * 0..ZS_METRICS_MAX_LABELS label names; a series is one combination of label
 * values and holds one double. A series exists from its first lookup
 * (zs_metric_series) and lives as long as the registry, so callers look it
 * up once and then set or add without any lock: values are atomics. Names
 * follow Prometheus' conventions, checked at registration: metric names
 * [a-zA-Z_:][a-zA-Z0-9_:]*, counters end in "_total", label names
 * [a-zA-Z_][a-zA-Z0-9_]* and not "__"-prefixed. Label values are any bytes
 * (escaped when rendered).
 *
 * Collection. Values that another component already counts (a server's
 * counters, a budget) are best copied at scrape time: zs_metrics_on_scrape
 * registers a function that runs before every render, on the thread that
 * renders (the HTTP thread for a scrape).
 *
 * Does not: histograms or summaries, timestamps on samples, TLS or
 * authentication on the endpoint (bind it to a trusted network), push.
 * Thread-safe: one mutex guards the family and series lists (lookup,
 * registration, render); set and add take no lock.
 */
#ifndef ZS_METRICS_H
#define ZS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "zs_status.h"

#define ZS_METRICS_MAX_LABELS 4
#define ZS_METRICS_NAME_MAX   128 /* bytes of a metric or label name */

typedef enum { ZS_METRIC_COUNTER = 0, ZS_METRIC_GAUGE = 1 } zs_metric_type_t;

typedef struct zs_metrics zs_metrics_t;      /* the registry (and its endpoint) */
typedef struct zs_metric zs_metric_t;        /* a family */
typedef struct zs_metric_series zs_series_t; /* one labelled value */

/* An empty registry; free with zs_metrics_destroy. */
int zs_metrics_create(zs_metrics_t **out, zs_err_t *err);

/* Stop the endpoint (if serving; waits for its thread) and free everything,
 * families and series included. NULL is a no-op. */
void zs_metrics_destroy(zs_metrics_t *m);

/* Register a family. `labels` holds nlabels names (NULL when 0). ZS_ERR_INVALID
 * for a bad name, a counter not ending in "_total", a bad or repeated label
 * name or too many labels; ZS_ERR_EXISTS when the name is taken. *out (may be
 * NULL) is owned by the registry. `help` is one sentence (copied). */
int zs_metrics_add(zs_metrics_t *m, const char *name, zs_metric_type_t type, const char *help,
                   int nlabels, const char *const *labels, zs_metric_t **out, zs_err_t *err);

/* The series of `f` with these label values (f's nlabels strings, copied;
 * NULL for a family without labels), created at value 0 on first use.
 * Returns NULL only when out of memory. The pointer stays valid until the
 * registry is destroyed. Takes the registry lock: look up once, keep it. */
zs_series_t *zs_metric_series(zs_metric_t *f, const char *const *values);

/* Set a gauge (or a counter copied from elsewhere) to v. Lock-free. */
void zs_series_set(zs_series_t *s, double v);

/* Add v to a series (v >= 0 for counters; not checked). Lock-free. */
void zs_series_add(zs_series_t *s, double v);

/* The current value. */
double zs_series_get(const zs_series_t *s);

/* Lookup and set in one call (takes the lock): for values set at scrape
 * time. ZS_ERR_NOMEM if the series cannot be made. */
int zs_metric_set(zs_metric_t *f, const char *const *values, double v);

/* Run fn(ud) before every render (one function; NULL removes it). fn may
 * look up and set series; it must not register families or call render. */
void zs_metrics_on_scrape(zs_metrics_t *m, void (*fn)(void *ud), void *ud);

/* Register <prefix>_start_time_seconds (Unix time this call was made),
 * <prefix>_uptime_seconds and <prefix>_resident_memory_bytes (from
 * /proc/self/statm), refreshed at every render. */
int zs_metrics_add_process(zs_metrics_t *m, const char *prefix, zs_err_t *err);

/* Render every family in registration order, series in creation order, as
 * text format 0.0.4: "# HELP", "# TYPE", then `name{l="v",...} value`
 * lines. Families without series get their HELP and TYPE lines only.
 * *text is malloc'd and NUL-terminated (caller frees); *len excludes the
 * NUL. Runs the scrape function first. */
int zs_metrics_render(zs_metrics_t *m, char **text, size_t *len, zs_err_t *err);

/* Serve the registry on http://HOST:PORT/metrics from one thread.
 * `hostport` is "HOST:PORT" (an IPv4 address, a name, or "[v6]"; port 0
 * picks a free one). ZS_ERR_INVALID for a malformed address,
 * ZS_ERR_UNAVAILABLE when it cannot be bound, ZS_ERR_STATE when already
 * serving. At most one endpoint per registry. */
int zs_metrics_serve(zs_metrics_t *m, const char *hostport, zs_err_t *err);

/* The bound address as "HOST:PORT" (HOST as given to zs_metrics_serve,
 * PORT the one bound) into buf; "" when not serving. */
void zs_metrics_address(const zs_metrics_t *m, char *buf, size_t cap);

/* Write the bound address and a newline to `path` atomically (a temporary
 * file renamed over it), for scripts and tests that wait for the endpoint. */
int zs_metrics_write_address(const zs_metrics_t *m, const char *path, zs_err_t *err);

#endif
