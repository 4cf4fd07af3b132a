#!/usr/bin/env python3
"""torch_gpt.py - a small causal transformer language model (PyTorch's
nn.TransformerEncoder with a causal mask) trained on bytes with its AdamW on
zeroshard's shard servers (zeroshard.torch.ShardOptimizer), on the CPU.

    zs-server --listen 127.0.0.1:7070 --data s0 &
    zs-server --listen 127.0.0.1:7071 --data s1 &
    PYTHONPATH=build/python python3 examples/torch_gpt.py \\
        --servers 127.0.0.1:7070,127.0.0.1:7071 --steps 200

The corpus is the quickstart's: every file of /usr/share/common-licenses,
sorted, as bytes (a vocabulary of 256, no tokenizer needed; --text FILE...
for others). Batches are drawn with a generator seeded by the step, so a
resumed run (run it again: the newest checkpoint) sees the batches an
uninterrupted one would. Weight decay 0.1 on the matrices (embeddings
included), none on biases and norms (a second param group). Warm-up then
cosine LR, gradient clipping at 1.0,
a checkpoint every --ckpt-every steps. Prints the loss (nats per byte)
every --log-every steps, "final loss X" at the end, and a greedy sample.
"""
import argparse
import glob
import math
import os
import time

import torch

from zeroshard.torch import ShardOptimizer


class ByteLM(torch.nn.Module):
    def __init__(self, ctx, width, layers, heads):
        super().__init__()
        self.tok = torch.nn.Embedding(256, width)
        self.pos = torch.nn.Embedding(ctx, width)
        layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                                 activation="gelu", batch_first=True,
                                                 norm_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, 256, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), 1))

    def forward(self, x):
        T = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(T))
        h = self.blocks(h, mask=self.mask[:T, :T])
        return self.head(self.norm(h))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--servers", required=True, help="host:port,host:port")
    ap.add_argument("--model-name", default="example-byte-gpt")
    ap.add_argument("--text", nargs="*", default=None)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--stop-after", type=int, default=0,
                    help="stop after this many steps of this run (as if interrupted)")
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--fresh", action="store_true", help="start over (deletes checkpoints)")
    a = ap.parse_args()

    files = a.text or sorted(f for f in glob.glob("/usr/share/common-licenses/*")
                             if os.path.isfile(f))
    data = torch.tensor(list(b"".join(open(f, "rb").read() for f in files)), dtype=torch.long)
    torch.manual_seed(0)
    model = ByteLM(a.ctx, a.width, a.layers, a.heads)
    # AdamW's weight decay on the matrices only (as nanoGPT and llm.c): biases,
    # norms' gains and biases in a group without it.
    named = list(model.named_parameters())
    groups = [{"params": [(n, p) for n, p in named if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [(n, p) for n, p in named if p.dim() < 2], "weight_decay": 0.0}]
    opt = ShardOptimizer(groups, servers=a.servers.split(","),
                         model_name=a.model_name, lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                         weight_decay=0.1, resume=not a.fresh, max_grad_norm=1.0)
    start = opt.step_count
    for g in opt.param_groups:
        g.setdefault("initial_lr", a.lr)

    def lr_at(s):
        if s < a.warmup:
            return (s + 1) / a.warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - a.warmup) /
                                                               max(1, a.steps - a.warmup))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at, last_epoch=start - 1)
    print("%d bytes of text; %d parameters on %d servers (%s); from step %d"
          % (len(data), sum(p.numel() for p in model.parameters()), len(a.servers.split(",")),
             ", ".join(t for t, _ in opt.transports()), start))
    end = a.steps if a.stop_after <= 0 else min(a.steps, start + a.stop_after)
    t0, loss = time.time(), float("nan")
    for step in range(start + 1, end + 1):
        g = torch.Generator().manual_seed(step)
        ix = torch.randint(0, len(data) - a.ctx - 1, (a.batch,), generator=g)
        x = torch.stack([data[i:i + a.ctx] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + a.ctx] for i in ix])
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        loss = loss.item()
        if step % a.log_every == 0:
            print("step %5d  loss %.4f  lr %.2e  %.0f ms/step"
                  % (step, loss, opt.param_groups[0]["lr"],
                     1000 * (time.time() - t0) / (step - start)))
        if step % a.ckpt_every == 0:
            opt.checkpoint()
    print("final loss %.6f" % loss)
    with torch.no_grad():  # a greedy sample from the licence text's first bytes
        x = data[:16].unsqueeze(0)
        for _ in range(48):
            nxt = model(x[:, -a.ctx:])[0, -1].argmax()
            x = torch.cat([x, nxt.view(1, 1)], 1)
    print("sample: %r" % bytes(x[0].tolist()).decode("latin-1"))
    opt.close()


if __name__ == "__main__":
    main()
