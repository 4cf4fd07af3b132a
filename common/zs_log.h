/*
 * zs_log.h - one-line event logging to stderr.
 *
 * Format: "2026-11-23T10:00:00.123Z zs-server[1] INFO  message". The tag
 * ("zs-server[1]", "rank 3") is set once per process with zs_log_set_tag.
 * Thread-safe (one fprintf per line). Level from ZS_LOG_LEVEL
 * (debug|info|warn|error), default info.
 */
#ifndef ZS_LOG_H
#define ZS_LOG_H

typedef enum {
    ZS_LOG_DEBUG = 0,
    ZS_LOG_INFO = 1,
    ZS_LOG_WARN = 2,
    ZS_LOG_ERROR = 3
} zs_log_level_t;

/* Set the process tag shown on every line (copied; at most 47 chars). */
void zs_log_set_tag(const char *tag);

/* Set the minimum level printed (overrides ZS_LOG_LEVEL). */
void zs_log_set_level(zs_log_level_t level);

void zs_log(zs_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define ZS_DEBUG(...) zs_log(ZS_LOG_DEBUG, __VA_ARGS__)
#define ZS_INFO(...)  zs_log(ZS_LOG_INFO, __VA_ARGS__)
#define ZS_WARN(...)  zs_log(ZS_LOG_WARN, __VA_ARGS__)
#define ZS_ERROR(...) zs_log(ZS_LOG_ERROR, __VA_ARGS__)

#endif
