/*
 * zs_gpt_ops_prof.h - a profiling wrapper around a GPT op table
 * (zs_gpt_ops_prof.c): per op name and shape, calls and wall time with the
 * stream waited for after each op. zs_gpt.c uses it when ZS_GPT_PROFILE=1.
 * Not part of the model's contract; a measuring tool (bench_gpt).
 */
#ifndef ZS_GPT_OPS_PROF_H
#define ZS_GPT_OPS_PROF_H

#include <stdio.h>

#include "zs_gpt_ops_table.h"

/* A table that runs `in`'s entries and times each (its name: "prof:" and
 * in's). Takes ownership of `in` (destroyed with the wrapper, or at once
 * on failure). The wrapper's destroy prints the rows to stderr first.
 * ZS_ERR_NOMEM. */
int zs_gpt_ops_prof_wrap(zs_gpt_ops_t *in, zs_gpt_ops_t **out, zs_err_t *err);

/* Print the rows so far, largest total first, as a markdown table. A table
 * that is not a profiling wrapper prints nothing. */
void zs_gpt_ops_prof_report(const zs_gpt_ops_t *ops, FILE *f);

#endif
