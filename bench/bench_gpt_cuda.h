/*
 * bench_gpt_cuda.h - bench_gpt --device cuda (bench_gpt_cuda.c): the GPT
 * train step on one GPU. bench_gpt.c's main hands its arguments over.
 */
#ifndef BENCH_GPT_CUDA_H
#define BENCH_GPT_CUDA_H

/* Runs the CUDA benchmark with bench_gpt's argv (it initialises and
 * finalises MPI itself). Returns the process exit status: 0, 2 for a bad
 * command line, 77 when no GPU is usable or CUDA is not built (printed as
 * "SKIPPED: <reason>"), 1 on failure. */
int zs__bench_gpt_cuda(int argc, char **argv);

#endif
