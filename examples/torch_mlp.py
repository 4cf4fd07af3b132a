#!/usr/bin/env python3
"""torch_mlp.py - train a small PyTorch MLP with its AdamW on zeroshard's
shard servers (zeroshard.torch.ShardOptimizer), on the CPU.

    zs-server --listen 127.0.0.1:7070 --data s0 &
    zs-server --listen 127.0.0.1:7071 --data s1 &
    PYTHONPATH=build/python python3 examples/torch_mlp.py \\
        --servers 127.0.0.1:7070,127.0.0.1:7071 --steps 300

The task: regress the outputs of a fixed random "teacher" MLP from its
inputs; the loss falls steadily. Every --ckpt-every steps it checkpoints on
every server; run it again and it resumes from the newest checkpoint (pass
--fresh to start over; --stop-after N stops early, as if interrupted). A cosine LR schedule shows that torch's schedulers
drive the servers' learning rate. Prints one line per --log-every steps and
"final loss X" at the end.
"""
import argparse
import math
import time

import torch

from zeroshard.torch import ShardOptimizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", required=True, help="host:port,host:port")
    ap.add_argument("--model-name", default="example-mlp")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop after this many steps of this run (as if interrupted)")
    ap.add_argument("--fresh", action="store_true", help="start over (deletes checkpoints)")
    ap.add_argument("--token", default=None)
    a = ap.parse_args()

    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, 8))
    model = torch.nn.Sequential(torch.nn.Linear(32, a.hidden), torch.nn.GELU(),
                                torch.nn.Linear(a.hidden, a.hidden), torch.nn.GELU(),
                                torch.nn.Linear(a.hidden, 8))
    opt = ShardOptimizer(model.named_parameters(), servers=a.servers.split(","),
                         model_name=a.model_name, lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                         weight_decay=0.01, token=a.token, resume=not a.fresh,
                         max_grad_norm=1.0)
    start = opt.step_count
    # last_epoch resumes the schedule where the checkpoint left it
    for g in opt.param_groups:
        g.setdefault("initial_lr", a.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps)),
        last_epoch=start - 1)
    print("model %s: %d parameters on %d servers (%s), from step %d"
          % (a.model_name, sum(p.numel() for p in model.parameters()),
             len(a.servers.split(",")), ", ".join(t for t, _ in opt.transports()), start))
    t0, loss = time.time(), float("nan")
    end = a.steps if a.stop_after <= 0 else min(a.steps, start + a.stop_after)
    for step in range(start + 1, end + 1):
        g = torch.Generator().manual_seed(step)  # the same batch for a step, resumed or not
        x = torch.randn(64, 32, generator=g)
        with torch.no_grad():
            y = teacher(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        loss = loss.item()
        if step % a.log_every == 0:
            print("step %5d  loss %.6f  lr %.2e  %.1f ms/step"
                  % (step, loss, opt.param_groups[0]["lr"],
                     1000 * (time.time() - t0) / (step - start)))
        if step % a.ckpt_every == 0:
            opt.checkpoint()
    print("final loss %.6f" % loss)
    opt.close()


if __name__ == "__main__":
    main()
