#!/usr/bin/env python3
"""adam_torch.py - PyTorch reference for tests/test_adam.c.

Usage: adam_torch.py DIR

DIR/cases.txt has one line per case:
    name mode gdtype n steps lr beta1 beta2 eps weight_decay grad_scale clip_coef
(mode: adamw | adam; gdtype: fp32 | bf16 | fp16; floats as C99 hex, "%a").
For each case it reads DIR/<name>_p0.bin (n fp32) and DIR/<name>_grads.bin
(steps * n elements of gdtype), runs `steps` steps of torch.optim.AdamW or
torch.optim.Adam (foreach=False) with p.grad = (grad.float() * grad_scale) *
clip_coef, and writes DIR/<name>_out.bin (p, exp_avg, exp_avg_sq: 3n fp32) and
DIR/<name>_out16.bin (p cast to gdtype when that is 16-bit).

The hyperparameters are the exact float32 values the C side uses, so torch's
double scalar arithmetic sees the same inputs. Exits 2 if torch is missing.
It does not compare anything: the C test does.
"""
import sys

try:
    import torch
except ImportError:
    sys.stderr.write("adam_torch.py: cannot import torch; run deploy/install-deps.sh\n")
    sys.exit(2)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load(path, dtype, count):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    t = torch.frombuffer(data, dtype=dtype).clone()
    if t.numel() != count:
        raise SystemExit("%s: %d elements, expected %d" % (path, t.numel(), count))
    return t


def run_case(d, fields):
    name, mode, gdtype = fields[0], fields[1], fields[2]
    n, steps = int(fields[3]), int(fields[4])
    lr, b1, b2, eps, wd, gscale, clip = (float.fromhex(x) for x in fields[5:12])
    dtype = DTYPES[gdtype]

    p = torch.nn.Parameter(load("%s/%s_p0.bin" % (d, name), torch.float32, n))
    grads = load("%s/%s_grads.bin" % (d, name), dtype, steps * n).view(steps, n)
    cls = torch.optim.AdamW if mode == "adamw" else torch.optim.Adam
    opt = cls([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, foreach=False)
    for s in range(steps):
        p.grad = (grads[s].float() * gscale) * clip
        opt.step()
    st = opt.state[p]
    out = torch.cat([p.detach(), st["exp_avg"], st["exp_avg_sq"]])
    with open("%s/%s_out.bin" % (d, name), "wb") as f:
        f.write(out.numpy().tobytes())
    if dtype != torch.float32:
        with open("%s/%s_out16.bin" % (d, name), "wb") as f:
            f.write(p.detach().to(dtype).view(torch.int16).numpy().tobytes())


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    d = sys.argv[1]
    with open(d + "/cases.txt") as f:
        for line in f:
            if line.strip():
                run_case(d, line.split())


if __name__ == "__main__":
    main()
