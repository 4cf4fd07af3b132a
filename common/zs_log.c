/*
 * zs_log.c - stderr logger behind zs_log.h. No allocation.
 */
#include "zs_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static char g_tag[48] = "zs";
static int g_level = -1; /* -1: not read from the environment yet */

void zs_log_set_tag(const char *tag)
{
    snprintf(g_tag, sizeof g_tag, "%s", tag);
}

void zs_log_set_level(zs_log_level_t level)
{
    g_level = (int)level;
}

static int current_level(void)
{
    if (g_level < 0) {
        const char *s = getenv("ZS_LOG_LEVEL");
        g_level = ZS_LOG_INFO;
        if (s && !strcasecmp(s, "debug"))
            g_level = ZS_LOG_DEBUG;
        else if (s && !strcasecmp(s, "warn"))
            g_level = ZS_LOG_WARN;
        else if (s && !strcasecmp(s, "error"))
            g_level = ZS_LOG_ERROR;
    }
    return g_level;
}

void zs_log(zs_log_level_t level, const char *fmt, ...)
{
    static const char *names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
    if ((int)level < current_level())
        return;
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, g_tag, names[level & 3]);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
