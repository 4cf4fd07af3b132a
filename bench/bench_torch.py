#!/usr/bin/env python3
"""bench_torch.py - optimizer step time of zeroshard.torch.ShardOptimizer
against torch.optim.AdamW (foreach) on the same model, same run, on the CPU.

Usage (bench/bench_torch.sh starts the servers): bench_torch.py SERVERS
PARAMS STEPS. The model is a stack of Linear(2048, 2048) layers with at least
PARAMS parameters, fp32; its gradients are fixed random values. Each timing
is the median of STEPS optimizer steps (after one warm-up step): for
ShardOptimizer the whole step (gradients to the flat buffer, push, AdamW on
the servers, pull into the parameters), for torch.optim.AdamW its step().
Forward and backward are not timed (they are the same for both). Prints
the transports, then
    TORCH-RESULT params=N zs_step_ms=X torch_step_ms=Y ratio=Z
with Z = X / Y.
"""
import statistics
import sys
import time

import torch

from zeroshard.torch import ShardOptimizer

servers, want, steps = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
W = 2048
layers = max(1, -(-want // (W * W + W)))
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(W, W) for _ in range(layers)])
P = sum(p.numel() for p in model.parameters())
for p in model.parameters():
    p.grad = torch.randn_like(p) * 1e-3


def timed(opt):
    t = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        opt.step()
        t.append(time.perf_counter() - t0)
    return 1000 * statistics.median(t[1:])


zs = ShardOptimizer(model.named_parameters(), servers=servers, model_name="bench-torch",
                    lr=1e-4, resume=False)
print("params %d (%d x Linear(%d, %d)); transports %s; torch threads %d"
      % (P, layers, W, W, [t for t, _ in zs.transports()], torch.get_num_threads()), flush=True)
zs_ms = timed(zs)
zs.close()
ref = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
torch_ms = timed(ref)
print("TORCH-RESULT params=%d zs_step_ms=%.1f torch_step_ms=%.1f ratio=%.2f"
      % (P, zs_ms, torch_ms, zs_ms / torch_ms))
