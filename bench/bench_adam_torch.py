#!/usr/bin/env python3
"""bench_adam_torch.py - times torch.optim.AdamW steps for bench/bench_adam.c.

Usage: bench_adam_torch.py --sizes 10000000,100000000 --threads 1,2 --reps 3

For every size it builds one fp32 parameter of that many elements with a
gradient; for every thread count (torch.set_num_threads) and variant it makes
a fresh optimizer, runs one untimed step (which creates exp_avg /
exp_avg_sq), then times `reps` single steps of
torch.optim.AdamW(lr=1e-3, weight_decay=0.01) for each variant:

    foreach=False   the single-tensor loop (what foreach=None, the default,
                    resolves to on CPU in torch 1.13)
    foreach=True    the multi-tensor (_foreach_*) implementation

and prints one line per case that bench_adam parses:

    ROW <variant> <threads> <n> <Mparams/s of each rep...>

It measures nothing else and asserts nothing. Exits 2 if torch is missing.
"""
import argparse
import sys
import time

try:
    import torch
except ImportError:
    sys.stderr.write("bench_adam_torch.py: cannot import torch\n")
    sys.exit(2)

VARIANTS = (("foreach=False", False), ("foreach=True", True))


def bench(p, reps, foreach):
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                            foreach=foreach)
    opt.step()  # allocates the state; not timed
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        rates.append(p.numel() / (time.perf_counter() - t0) / 1e6)
    return rates


def cpu_capability():
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage" in line:
            return line.split(":", 1)[1].strip()
    return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000000")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    print("INFO torch %s, CPU capability %s" % (torch.__version__, cpu_capability()))
    for n in (int(x) for x in a.sizes.split(",")):
        g = torch.Generator().manual_seed(1)
        p = torch.nn.Parameter(torch.rand(n, generator=g) - 0.5)
        p.grad = torch.rand(n, generator=g) - 0.5
        for t in (int(x) for x in a.threads.split(",")):
            torch.set_num_threads(t)
            for name, foreach in VARIANTS:
                rates = bench(p, a.reps, foreach)
                print("ROW %s %d %d %s" % (name, t, n, " ".join("%.3f" % r for r in rates)))
                sys.stdout.flush()
        del p, g


if __name__ == "__main__":
    main()
