/*
 * zs_bench.h - the one benchmark harness: timing, medians, and one table
 * format for every benchmark in bench/.
 *
 * A benchmark measures a case and its baseline in the same run, several times
 * each (the machines are shared and noisy), and prints one row per case:
 *
 *   | case | size | GB/s (median) | min..max | baseline GB/s | ratio |
 *
 * The same rows go to stdout as Markdown, so bench/RESULTS.md can quote them.
 * Nothing here asserts a speed.
 */
#ifndef ZS_BENCH_H
#define ZS_BENCH_H

#include <stddef.h>
#include <stdint.h>

#define ZS_BENCH_MAX_REPS 64

/* Monotonic seconds. */
double zs_bench_now(void);

/* Median of n doubles (n <= ZS_BENCH_MAX_REPS; the array is not changed). */
double zs_bench_median(const double *x, int n);

/* Repetitions from ZS_BENCH_REPS (default `dflt`, clamped to 1..64). */
int zs_bench_reps(int dflt);

/* n pseudo-random token ids in [0, V) from a fixed seed: in[i] and the next
 * token tg[i] = in[i + 1] (a shifted stream, like a language-model batch).
 * The same ids on every call. */
void zs_bench_tokens(int n, int V, int32_t *in, int32_t *tg);

/* Print the table header once: title line then the Markdown header. */
void zs_bench_header(const char *title, const char *unit);

/* Print one row: rates are per-repetition throughputs in `unit` (e.g. GB/s);
 * base is the baseline's per-repetition rates (may be NULL, then no ratio). */
void zs_bench_row(const char *name, const char *size, const double *rates, int n,
                  const double *base, int nbase);

#endif
